"""Two nodes on one machine, as on a cluster: two launchers (`python -m pilegpt.launch --world_size 2 --nproc 1
--node_rank 0|1 --master_addr 127.0.0.1`), each in its own working folder with its own data cache and local paths,
sharing nothing but the S3 server that holds the MDS dataset and the checkpoints.

One job's life, checked against one process that is never interrupted (losses batch for batch):
the two nodes train; node 1 is lost (its processes killed) and node 0 stops within a bound with one line; both
are relaunched with --autoresume=True and continue from the last checkpoint in the bucket; a SIGTERM (a
preemption) to both stops them after the same batch with its checkpoint; one node of one process then continues
from exactly that batch (an elastic resume: Streaming's num_canonical_nodes is the run's, recorded in data.json).
A local save_folder that the nodes do not share is refused in one line before training.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import (
    ACROSS_PROCESS_COUNTS,
    REPO,
    SMALL,
    assert_same_losses,
    finish_all,
    free_port,
    losses_by_batch,
    read_jsonl,
    shakespeare_tokens,
    start,
    train_env,
    train_main,
    wait_until,
    write_bin,
    write_mds,
)
from pilegpt.train.run.preemption import PREEMPTED

LOST_NODE_BOUND_S = 60  # node 0 stops this soon after node 1 is gone (gloo sees the closed connection at once)
SLOW = "--callbacks={'faults:SlowBatches': {'seconds': 0.3}}"  # tests/faults.py: time to act mid-run


# A node of its own: Streaming keeps its state in shared memory (/dev/shm) under names that one host's nodes would
# share, and two "nodes" starting at the same moment race for the same name (FileExistsError: '/000000_locals').
# Machines of a cluster each have their own /dev/shm: so does each "node" here, a tmpfs in its own mount namespace.
OWN_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           'mount -t tmpfs -o size=256m tmpfs /dev/shm && exec "$@"', "node"]


@pytest.fixture(scope="module")
def own_shm():
    try:
        subprocess.run([*OWN_SHM, "true"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("needs root to give each node its own /dev/shm (unshare --mount, mount -t tmpfs)")
    return OWN_SHM


def start_nodes(args: list, folders: list[Path], env: dict, nproc: int = 1, wrap: tuple = ()) -> list[subprocess.Popen]:
    """One launcher per folder ("node"), node ranks in order, on 127.0.0.1; each in its own process group (and,
    with wrap=OWN_SHM, its own /dev/shm)."""
    port = free_port()
    procs = []
    for node, folder in enumerate(folders):
        folder.mkdir(parents=True, exist_ok=True)
        procs.append(start(
            [*wrap, sys.executable, "-m", "pilegpt.launch", "--world_size", str(len(folders) * nproc),
             "--nproc", str(nproc), "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
             str(REPO / "train.py"), *args],
            folder, train_env(env, nproc), folder / f"launch{len(list(folder.glob('launch*.log')))}.log"))
    return procs


def wait_for_batch(metrics: Path, batch: int, procs: list[subprocess.Popen]) -> None:
    wait_until(lambda: metrics.is_file() and any(r.get("batch", 0) >= batch for r in read_jsonl(metrics)), procs,
               f"batch {batch}")


def left_behind(folders: list[Path]) -> list[str]:
    """Processes still running in any of the folders (a launcher's orphans)."""
    found = []
    for proc in psutil.process_iter(["pid", "cwd", "cmdline"]):
        try:
            if proc.info["cwd"] and any(Path(proc.info["cwd"]).is_relative_to(f) for f in folders):
                found.append(f"{proc.info['pid']}: {' '.join(proc.info['cmdline'] or [])[:120]}")
        except (psutil.Error, ValueError):
            pass
    return found


def test_a_job_of_two_nodes_survives_a_lost_node_a_preemption_and_a_resume_on_one_node(tmp_path, s3_env, own_shm,
                                                                                       monkeypatch, capsys):
    s3 = s3_env
    bucket = s3.root / s3.bucket
    tokens = shakespeare_tokens()[:40_000]
    write_mds(tmp_path / "mds" / "train", tokens[:36_000], block_size=32, size_limit=1 << 13)
    write_mds(tmp_path / "mds" / "val", tokens[36_000:], block_size=32)
    remote = s3.upload_tree(tmp_path / "mds", "mn")
    # a constant learning rate after warmup, so that where a run stops changes no schedule
    args = [*SMALL, f"--data_remote={remote}", "--min_lr=3e-3", "--sample_length=0", "--device=cpu",
            "--progress_bar=False", "--eval_interval=100ba", "--save_interval=3ba", "--max_duration=9ba",
            "--run_name=mn"]

    # the reference: one process (this one), never interrupted, with the job's sample order (Streaming shuffles
    # for num_canonical_nodes, by default the run's first node count: 1 here, 2 for the job); the same global
    # batches at any process count, as step 3 below relies on too
    (tmp_path / "one_node").mkdir()
    monkeypatch.chdir(tmp_path / "one_node")
    train_main([*args, f"--save_folder=s3://{s3.bucket}/one", "--num_canonical_nodes=2"])
    expected = losses_by_batch(tmp_path / "one_node" / "runs" / "mn")
    assert sorted(expected) == list(range(1, 10))

    job = [*args, f"--save_folder=s3://{s3.bucket}/job", SLOW]
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    metrics = nodes[0] / "runs" / "mn" / "metrics.jsonl"  # rank 0's, on node 0

    # 1. node 1 is lost after the checkpoint of batch 3: node 0 stops within the bound, with one line
    procs = start_nodes(job, nodes, os.environ, wrap=own_shm)
    wait_for_batch(metrics, 4, procs)
    os.killpg(procs[1].pid, signal.SIGKILL)
    lost_at = time.time()
    (code0, out0), _ = finish_all(procs, timeout=LOST_NODE_BOUND_S)
    assert time.time() - lost_at < LOST_NODE_BOUND_S and code0 != 0, out0[-4000:]
    lines = [line for line in out0.splitlines() if "lost contact with another process of the job" in line]
    assert lines and "--autoresume=True" in lines[0], out0[-4000:]
    assert not left_behind(nodes), left_behind(nodes)
    first = losses_by_batch(nodes[0] / "runs" / "mn")
    assert json.loads((bucket / "job" / "data.json").read_text())["num_canonical_nodes"] == 2  # the job's order

    # 2. both relaunched: they continue from the checkpoint of batch 3 in the bucket; then a preemption
    procs = start_nodes([*job, "--autoresume=True"], nodes, os.environ, wrap=own_shm)
    wait_for_batch(metrics, 5, procs)
    for p in procs:  # the scheduler signals every node
        p.send_signal(signal.SIGTERM)
    (code0, out0), (code1, out1) = finish_all(procs)
    assert (code0, code1) == (PREEMPTED, PREEMPTED), out0[-3000:] + out1[-3000:]
    assert "resuming from the checkpoint at batch 3 " in out0
    stop = int(out0.split("stopped by SIGTERM after batch ")[1].split(",")[0])
    assert (bucket / "job" / f"ep0-ba{stop}-rank0.pt").is_file() and (bucket / "job" / "model.pt").is_file()
    assert s3.secret_key not in out0 + out1
    second = losses_by_batch(nodes[0] / "runs" / "mn")  # metrics.jsonl repeats the batches after the resume
    assert list((bucket / "job" / "logs").glob("*-rank1.txt"))  # node 1's log is the job's too: uploaded

    # 3. one node of one process, on another machine (this process, in a working folder of its own), continues
    # from exactly that batch (2 nodes -> 1)
    alone = tmp_path / "alone"
    alone.mkdir()
    monkeypatch.chdir(alone)
    capsys.readouterr()
    train_main([*args, f"--save_folder=s3://{s3.bucket}/job", "--autoresume=True"])
    out = capsys.readouterr().out
    assert f"resuming from the checkpoint at batch {stop} " in out and f"done: {9 - stop} batches" in out
    third = losses_by_batch(alone / "runs" / "mn")
    assert sorted(third) == list(range(stop + 1, 10))  # no batch lost or repeated

    job_losses = {**first, **second, **third}
    assert sorted(job_losses) == list(range(1, 10))
    assert_same_losses(job_losses, expected, range(1, 10), atol=ACROSS_PROCESS_COUNTS)


def test_a_local_save_folder_the_nodes_do_not_share_is_refused_before_training(tmp_path):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for folder in nodes:
        write_bin(folder / "data", shakespeare_tokens()[:20_000])
    args = [*SMALL, "--data_dir=data", "--save_folder=run", "--device=cpu", "--progress_bar=False",
            "--max_duration=2ba", "--sample_length=0"]
    results = finish_all(start_nodes(args, nodes, os.environ))
    for node, (code, out) in enumerate(results):
        assert code != 0, out[-3000:]
        lines = [line for line in out.splitlines() if "is not shared by the job's nodes" in line]
        assert lines and "node(s) 1 do not see node 0's files" in lines[0] and "s3://" in lines[0], out[-3000:]
        assert not (nodes[node] / "run" / "metrics.jsonl").exists()  # refused before training
    assert not [p for p in (nodes[0] / "run").iterdir() if p.name.startswith(".node0-")]  # the marker is gone
    assert not left_behind(nodes)
