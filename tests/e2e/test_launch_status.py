"""The exit status of `python -m pilegpt.launch` is the first failing rank's own, so that a scheduler requeues only
a preemption: 2 for a config error, 137 for a rank SIGKILLed (what the OOM killer sends), never the 143 echo of the
SIGTERM the launcher sends the other ranks after a failure (issue 31, item 2)."""

import os
import signal
import sys

import psutil

from helpers import (
    REPO,
    SMALL,
    failed_with_one_line,
    finish,
    start,
    start_train,
    train_env,
    wait_until,
    write_random_bin,
)
from pilegpt.launch import job_status

ARGS = [*SMALL, "--device=cpu", "--sample_length=0", "--progress_bar=False", "--eval_interval=1000ba",
        "--save_interval=1000ba", "--max_duration=400ba", "--run_name=st"]


def launch(tmp_path, *args, nproc=2, cold=False):
    """train.py through `python -m pilegpt.launch -n NPROC` (helpers.start_train: its own process group)."""
    return start_train(list(args), tmp_path, nproc=nproc, launcher="pilegpt", log=tmp_path / "out.txt", cold=cold)


def test_first_failure_wins_over_the_sigterm_echo():
    assert job_status({"first_failures": {1: 2}}, 143) == 2
    assert job_status({"first_failures": {1: -9}}, 143) == 137
    assert job_status({"first_failures": {0: 143, 1: 143}}, 143) == 143
    assert job_status({}, 0) == 0 and job_status({}, -15) == 143


def test_a_config_error_on_every_rank_exits_2(tmp_path):
    code, out = finish(launch(tmp_path, *ARGS, "--data_dir=nowhere", "--n_layers=3"))
    assert code == 2 and "n_layers" in out, out[-3000:]


def test_a_sigkilled_rank_exits_137_not_143(tmp_path):
    data = write_random_bin(tmp_path / "d")
    # cold (a fresh interpreter): /proc/PID/environ names each rank, and the rank that loses its peer must end as
    # slowly as a real one, whose interpreter is torn down: a warm start (tests/warm.py) ends sooner, within
    # Composer's launcher's 0.1 s poll, which then sees both ranks failed and names rank 0's exit status 2
    proc = launch(tmp_path, *ARGS, f"--data_dir={data}", "--callbacks={'faults:SlowBatches': {'seconds': 0.2}}",
                  cold=True)
    metrics = tmp_path / "runs" / "st" / "metrics.jsonl"
    wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2, proc, "batch 2", seconds=180)
    ranks = {int(p.environ().get("RANK", -1)): p for p in psutil.Process(proc.pid).children()}
    os.kill(ranks[1].pid, signal.SIGKILL)  # the OOM killer's signal, to rank 1 alone
    code, out = finish(proc)
    assert code == 137, out[-3000:]


def test_a_node_whose_peers_never_come_says_so_within_seconds_and_gives_up_in_one_line(tmp_path):
    from helpers import free_port

    port = free_port()  # nobody listens there: node 0 never starts
    # --dist_timeout=10: past cluster.WAITING_NOTE_S (5 s), so the waiting line comes first
    proc = start([sys.executable, "-m", "pilegpt.launch", "--world_size", "2", "--nproc", "1", "--node_rank", "1",
                  "--master_addr", "127.0.0.1", "--master_port", str(port), REPO / "train.py", *ARGS,
                  f"--data_dir={write_random_bin(tmp_path / 'd')}", "--dist_timeout=10"], tmp_path, train_env(nproc=2),
                 log=tmp_path / "out.txt")
    waiting = "rank 1: waiting for 1 more node(s) of the job at 127.0.0.1:"
    wait_until(lambda: waiting in (tmp_path / "out.txt").read_text(), proc, "the waiting line", seconds=90)
    line = failed_with_one_line(finish(proc, timeout=120))
    assert line == (f"error: rank 1: gave up after 10 s waiting for 1 more node(s) of the job at 127.0.0.1:{port}: "
                    "start every node (node_rank 0 to 1) with the same --master_addr and --master_port, or raise "
                    "--dist_timeout")
