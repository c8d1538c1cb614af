"""scripts/slurm/launch.sh, the per-node launch logic of scripts/slurm/train.sbatch, run with the variables Slurm
sets for a job of 2 nodes, both on 127.0.0.1 (`scontrol` is a stub that names the host): each "node" in its own
folder with its own copy of the data, as on a cluster; the losses equal one node with 2 processes. (No slurmctld /
slurmd here: the batch script's srun and requeue run on a real one-node Slurm in test_slurm_real.py.)"""

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO, SMALL, free_port, losses_by_batch, run, shakespeare_tokens, write_bin

pytestmark = pytest.mark.slow


def test_two_slurm_nodes_on_one_host_train_as_one_node_of_two_processes(tmp_path):
    args = [*SMALL, "--max_duration=4ba", "--eval_interval=100ba", "--save_interval=100ba", "--progress_bar=False",
            "--sample_length=0", "--device=cpu", "--save_folder=run"]
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\necho 127.0.0.1\n")  # show hostnames: both nodes
    (stub / "scontrol").chmod(0o755)
    (stub / "python").symlink_to(sys.executable)
    port = free_port()
    procs = []
    for node in (0, 1):
        folder = tmp_path / f"node{node}"
        write_bin(folder / "data", shakespeare_tokens()[:20_000])  # each node its own copy
        env = {**os.environ, "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}", "SLURM_NNODES": "2",
               "SLURM_NODEID": str(node), "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_JOB_ID": "7",
               "NPROC_PER_NODE": "1", "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"}
        procs.append(subprocess.Popen(["bash", str(REPO / "scripts" / "slurm" / "launch.sh"), *args,
                                       f"--data_dir={folder / 'data'}"], cwd=folder, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert "2 process(es)" in outs[0]
    two_nodes = losses_by_batch(tmp_path / "node0" / "run")
    assert not (tmp_path / "node1" / "run" / "metrics.jsonl").exists()  # rank 0 alone writes the run's files

    one_node = tmp_path / "one_node"
    write_bin(one_node / "data", shakespeare_tokens()[:20_000])
    run([*args, f"--data_dir={one_node / 'data'}"], cwd=one_node, nproc=2)
    expected = losses_by_batch(one_node / "run")
    assert sorted(two_nodes) == [1, 2, 3, 4]
    assert np.allclose([two_nodes[b] for b in range(1, 5)], [expected[b] for b in range(1, 5)], rtol=0, atol=1e-5)
