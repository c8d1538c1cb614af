"""Preemption: a scheduler's SIGTERM to `python train.py`, or to the launcher of `composer -n 2`
(pilegpt/launch.py), stops every rank after the same batch with a checkpoint of it (uploaded, with an s3://
save_folder), exit status 143 and one line; --autoresume=True then continues loss for loss with a run that was
never interrupted: no batch lost or repeated."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, SMALL, losses_by_batch, read_jsonl, run, write_random_bin
from pilegpt.preemption import PREEMPTED

pytestmark = pytest.mark.slow
ARGS = [*SMALL, "--device=cpu", "--sample_length=0", "--eval_interval=3ba", "--eval_subset_num_batches=1",
        "--progress_bar=False", "--save_interval=3ba", "--max_duration=12ba", "--run_name=pre"]
SLOW = "--callbacks={'faults:SlowBatches': {'seconds': 0.3}}"  # tests/faults.py: time to signal mid-run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_random_bin(tmp_path_factory.mktemp("data") / "d")


def signalled_run(args: list, cwd: Path, nproc: int, env: dict, after_batch: int = 3) -> tuple[int, str]:
    """train.py (through pilegpt.launch with nproc) sent SIGTERM once metrics.jsonl shows `after_batch`."""
    launcher = [sys.executable, "-m", "pilegpt.launch", "-n", str(nproc)] if nproc else [sys.executable]
    env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{REPO}"}
    proc = subprocess.Popen([*launcher, str(REPO / "train.py"), *args, SLOW], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = cwd / "runs" / "pre" / "metrics.jsonl"
    try:
        deadline = time.time() + 240
        while proc.poll() is None and time.time() < deadline:
            if metrics.is_file() and any(r["batch"] >= after_batch for r in read_jsonl(metrics)):
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def stopped_batch(out: str) -> int:
    lines = [line for line in out.splitlines() if "stopped by SIGTERM after batch" in line]
    assert len(lines) == 1, out[-4000:]
    assert "--autoresume=True" in lines[0]
    return int(lines[0].split("after batch ")[1].split(",")[0])


@pytest.mark.parametrize("nproc", [0, 2])
def test_sigterm_checkpoints_the_current_batch_and_autoresume_continues_loss_for_loss(data_dir, tmp_path, nproc):
    args = [*ARGS, f"--data_dir={data_dir}"]
    (tmp_path / "whole").mkdir()
    run(args, tmp_path / "whole", nproc=nproc)  # the uninterrupted run
    whole = losses_by_batch(tmp_path / "whole" / "runs" / "pre")

    (tmp_path / "cut").mkdir()
    code, out = signalled_run(args, tmp_path / "cut", nproc, dict(os.environ))
    assert code == PREEMPTED, out[-4000:]
    stop = stopped_batch(out)
    assert 3 <= stop < 12 and "Traceback" not in out, out[-4000:]
    saved = tmp_path / "cut" / "runs" / "pre"
    assert (saved / f"ep0-ba{stop}-rank0.pt").is_file()  # the batch it stopped after, not the last periodic one
    first = losses_by_batch(saved)
    assert sorted(first) == list(range(1, stop + 1))

    resumed = run([*args, "--autoresume=True"], tmp_path / "cut", nproc=nproc)
    assert f"resuming from the checkpoint at batch {stop} " in resumed
    assert f"done: {12 - stop} batches" in resumed
    rows = [r["batch"] for r in read_jsonl(saved / "metrics.jsonl") if "loss" in r]
    assert rows == list(range(1, 13))  # no batch lost or repeated
    both = losses_by_batch(saved)
    assert np.allclose([both[b] for b in range(1, 13)], [whole[b] for b in range(1, 13)], rtol=0, atol=1e-6)


def test_sigterm_with_an_s3_save_folder_uploads_the_checkpoint_before_exiting(data_dir, tmp_path, s3_server):
    args = [*ARGS, f"--data_dir={data_dir}", f"--save_folder=s3://{s3_server.bucket}/runs/pre"]
    (tmp_path / "one").mkdir()
    code, out = signalled_run(args, tmp_path / "one", 0, {**os.environ, **s3_server.env()})
    assert code == PREEMPTED, out[-4000:]
    stop = stopped_batch(out)
    bucket = s3_server.root / s3_server.bucket / "runs" / "pre"
    assert (bucket / f"ep0-ba{stop}-rank0.pt").is_file() and (bucket / "model.pt").is_file()
    assert s3_server.secret_key not in out

    another = tmp_path / "another_machine"  # no local files: the bucket alone continues the run
    another.mkdir()
    env = {**os.environ, **s3_server.env(), "PYTHONUNBUFFERED": "1"}
    resumed = subprocess.run([sys.executable, str(REPO / "train.py"), *args, "--autoresume=True"], cwd=another,
                             env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from the checkpoint at batch {stop} " in resumed.stdout
    assert sorted(losses_by_batch(another / "runs" / "pre")) == list(range(stop + 1, 13))
