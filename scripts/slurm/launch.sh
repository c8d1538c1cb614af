#!/usr/bin/env bash
# One node's launcher of a Slurm job (train.sbatch runs it once per node with srun): Slurm's variables become
# Composer's launcher arguments, then train.py runs with the arguments given here.
#   SLURM_JOB_NODELIST -> --master_addr (the first host of `scontrol show hostnames`; MASTER_ADDR overrides)
#   SLURM_NODEID       -> --node_rank        SLURM_NNODES -> --world_size (x processes per node)
#   SLURM_GPUS_ON_NODE -> --nproc (NPROC_PER_NODE overrides; 1 when neither is set)
# pilegpt.launch is Composer's launcher passing SIGTERM on to train.py (docs/clusters.md, "Preemption").
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # pilegpt, from any working folder
nodes=${SLURM_NNODES:?launch.sh runs inside a Slurm job (SLURM_NNODES is not set)}
node_rank=${SLURM_NODEID:?launch.sh runs inside a Slurm job step (SLURM_NODEID is not set)}
nproc=${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}
master_addr=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)}
# One port per job, the same on every node, below Linux's ephemeral range (32768-60999), where the kernel picks the
# ports of outgoing connections; train.sbatch asks for whole nodes (--exclusive), so no other job's master shares it.
master_port=${MASTER_PORT:-$((10000 + ${SLURM_JOB_ID:-0} % 20000))}
if [ "$node_rank" -eq 0 ] && (exec 3<>"/dev/tcp/127.0.0.1/$master_port") 2>/dev/null; then
    echo "launch.sh: port $master_port is already in use on $(hostname) (another job on this node?): set" \
         "MASTER_PORT to a free port, or run on whole nodes (sbatch --exclusive)" >&2
    exit 2
fi
exec python -m pilegpt.launch --world_size "$((nodes * nproc))" --nproc "$nproc" --node_rank "$node_rank" \
    --master_addr "$master_addr" --master_port "$master_port" "$repo/train.py" "$@"
