"""scripts/slurm/launch.sh, the per-node launch logic of scripts/slurm/train.sbatch, run with the variables Slurm
sets for a job of 2 nodes, both on 127.0.0.1 (`scontrol` is a stub that names the host): each "node" in its own
folder with its own copy of the data, as on a cluster, and a save_folder on a filesystem both nodes see (a shared
folder is accepted; test_multinode.py shows an unshared one refused). The two launchers form one job of 2
processes that trains every batch; that two nodes give the losses of one node of 2 processes is
test_multinode.py's. (The batch script's srun and requeue run on a real one-node Slurm in test_slurm_real.py.)"""

import os
import sys

import numpy as np

from helpers import (
    REPO,
    SMALL,
    finish_all,
    free_port,
    interpreter_bin,
    losses_by_batch,
    run_command,
    shakespeare_tokens,
    start,
    succeeded,
    train_env,
    write_bin,
)


def test_two_slurm_nodes_on_one_host_form_one_job_that_trains_every_batch(tmp_path):
    args = [*SMALL, "--max_duration=4ba", "--eval_interval=100ba", "--save_interval=100ba", "--progress_bar=False",
            "--sample_length=0", "--device=cpu"]
    stub = interpreter_bin(tmp_path / "bin")  # launch.sh's bare `python` is this interpreter, with its packages
    assert succeeded(run_command([stub / "python", "-c", "import sys; print(sys.prefix)"])).strip() == sys.prefix
    (stub / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\necho 127.0.0.1\n")  # show hostnames: both nodes
    (stub / "scontrol").chmod(0o755)
    port = free_port()
    procs = []
    for node in (0, 1):
        folder = tmp_path / f"node{node}"
        write_bin(folder / "data", shakespeare_tokens()[:20_000])  # each node its own copy
        env = {**os.environ, "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}", "SLURM_NNODES": "2",
               "SLURM_NODEID": str(node), "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_JOB_ID": "7",
               "NPROC_PER_NODE": "1", "MASTER_PORT": str(port)}
        procs.append(start(["bash", REPO / "scripts" / "slurm" / "launch.sh", *args, f"--data_dir={folder / 'data'}",
                            f"--save_folder={tmp_path / 'shared'}"], folder, train_env(env), folder / "launch.log"))
    codes, outs = zip(*finish_all(procs))
    assert list(codes) == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert "2 process(es)" in outs[0]  # one job: the launchers met at the master address and port launch.sh gave
    assert not [p.name for p in (tmp_path / "shared").iterdir() if p.name.startswith(".node0-")]  # marker removed
    two_nodes = losses_by_batch(tmp_path / "shared")
    assert sorted(two_nodes) == [1, 2, 3, 4] and all(np.isfinite(list(two_nodes.values())))
    assert list((tmp_path / "shared" / "logs").glob("*-rank1.txt"))  # node 1's process wrote its log there too
