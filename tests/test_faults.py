"""Faults at the edges of a long run, through train.py's command line: a kill during a checkpoint write, a
truncated checkpoint, a diverging loss, a changed model on resume. Each either resumes or stops with one
line, and what the user already has is kept."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO, start_s3_server, stop
from helpers import SMALL, checkpoint_state, losses_by_batch
from pilegpt.data import write_token_files

pytestmark = pytest.mark.slow
ARGS = [*SMALL, "--device=cpu", "--sample_length=8", "--eval_interval=3ba", "--eval_subset_num_batches=1",
        "--progress_bar=False", "--save_interval=3ba", "--run_name=faults"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("data") / "d"
    write_token_files(folder, {"train": rng.integers(0, 50257, 20_000), "val": rng.integers(0, 50257, 3_000)})
    return folder


def train_py(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO / "tests")}  # for faults.py
    return subprocess.run([sys.executable, str(REPO / "train.py"), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_a_kill_during_a_checkpoint_write_resumes_from_the_previous_checkpoint(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = [f"--data_dir={data_dir}", *ARGS, f"--save_folder={run_dir}", "--max_duration=6ba"]
    killed = train_py(*args, "--callbacks={'faults:KillDuringCheckpoint': {'batch': 6}}", cwd=tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    half = (run_dir / "ep0-ba6-rank0.pt").stat().st_size
    assert os.readlink(run_dir / "latest-rank0.pt") == "ep0-ba3-rank0.pt"  # Composer had not moved it yet

    resumed = train_py(*args, "--autoresume=True", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "set aside" in resumed.stdout and "resuming from ep0-ba3-rank0.pt" in resumed.stdout
    assert "resumed at batch 3" in resumed.stdout
    broken = list(run_dir.glob("ep0-ba6-rank0.pt.broken-*"))
    assert len(broken) == 1 and broken[0].stat().st_size == half  # set aside as it was, not deleted
    assert checkpoint_state(run_dir / "ep0-ba6-rank0.pt")["timestamp"]["Timestamp"]["batch"] == 6


def test_a_truncated_latest_checkpoint_falls_back_to_the_one_before(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = [f"--data_dir={data_dir}", *ARGS, f"--save_folder={run_dir}"]
    assert train_py(*args, "--max_duration=6ba", cwd=tmp_path).returncode == 0
    latest = run_dir / "ep0-ba6-rank0.pt"
    assert os.readlink(run_dir / "latest-rank0.pt") == latest.name
    with open(latest, "r+b") as f:
        f.truncate(latest.stat().st_size // 3)
    resumed = train_py(*args, "--max_duration=9ba", "--autoresume=True", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at batch 3" in resumed.stdout
    assert checkpoint_state(run_dir / "ep0-ba9-rank0.pt")["timestamp"]["Timestamp"]["batch"] == 9


def test_a_diverging_loss_stops_the_run_before_any_bad_checkpoint(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = train_py(f"--data_dir={data_dir}", *ARGS, f"--save_folder={run_dir}", "--max_duration=12ba",
                      "--save_interval=2ba", "--eval_interval=2ba", "--learning_rate=1e6", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(error_lines(result)) == 1 and "went NaN or infinite at batch" in error_lines(result)[0]
    saved = sorted(run_dir.glob("ep0-ba*-rank0.pt"))
    assert saved, "at least the first checkpoint was good"
    for path in saved:  # every checkpoint left holds finite weights
        weights = checkpoint_state(path)["model"]
        assert all(torch.isfinite(w).all() for w in weights.values() if torch.is_tensor(w)), path
    last = max(int(p.name.split("-ba")[1].split("-")[0]) for p in saved)
    assert max(losses_by_batch(run_dir)) <= last + 2  # stopped within a couple of batches of the last save


def test_infinite_weights_are_never_checkpointed_or_exported(data_dir, tmp_path):
    # The loss of batch 6 is finite; the weights after its update are not, and batch 6 is a checkpoint batch
    # (no evaluation there: its loss would stop the run first).
    run_dir = tmp_path / "run"
    result = train_py(f"--data_dir={data_dir}", *ARGS, f"--save_folder={run_dir}", "--max_duration=9ba",
                      "--eval_interval=100ba",
                      "--callbacks={'faults:InfiniteWeight': {'batch': 6}}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert error_lines(result) == [
        "error: the weights went NaN or infinite at batch 6, so the run stopped before saving it: lower "
        "--learning_rate (now 0.003) or raise --warmup, then continue from the last good checkpoint with "
        "--autoresume=True"]
    assert sorted(p.name for p in run_dir.glob("ep0-ba*-rank0.pt")) == ["ep0-ba3-rank0.pt"]
    assert max(losses_by_batch(run_dir)) == 5  # batch 6's row is written at its checkpoint event: none after 5
    exported = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(w).all() for w in exported["model"].values())


def test_resuming_with_another_model_shape_is_one_line(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = [f"--data_dir={data_dir}", *ARGS, f"--save_folder={run_dir}", "--max_duration=3ba"]
    assert train_py(*args, cwd=tmp_path).returncode == 0
    result = train_py(*args, "--max_duration=6ba", "--autoresume=True", "--n_layer=3", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert error_lines(result) == [
        f"error: autoresume: the checkpoints in {run_dir} are of another model: n_layer=3 (the run has 2); resume "
        f"with the run's settings ({run_dir / 'config.json'}) or start a new run with another --run_name"]


@pytest.mark.s3
def test_losing_s3_mid_training_stops_with_one_line_and_resumes_from_the_bucket(data_dir, tmp_path):
    root = tmp_path / "s3"
    server, s3 = start_s3_server(root)
    env = {**os.environ, **s3.env(), "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, str(REPO / "train.py"), *ARGS, f"--data_dir={data_dir}", "--save_interval=2ba",
            f"--save_folder=s3://{s3.bucket}/runs/faults"]
    first = root / s3.bucket / "runs" / "faults" / "ep0-ba2-rank0.pt"
    proc = None
    try:
        proc = subprocess.Popen([*args, "--max_duration=400ba", "--eval_interval=400ba"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        stop(server)  # the store goes away once the first checkpoint reached it
        lost_at = time.time()
        out, err = proc.communicate(timeout=120)  # Composer's own uploader kept polling S3 here for an hour
        seconds = time.time() - lost_at
        assert proc.returncode == 2, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
        assert "failed, training stopped: cannot reach the S3 endpoint" in errors[0], errors[0]
        assert "--autoresume=True" in errors[0] and s3.secret_key not in out + err
        assert seconds < 60, seconds  # storage.py's retry budget (5 attempts), measured ~14 s

        # The store is back (same address, same files); on another machine (no local files), autoresume
        # continues from the last checkpoint that reached the bucket.
        server, s3 = start_s3_server(root, port=int(s3.endpoint_url.rsplit(":", 1)[1]))
        last = max(int(p.name.split("-ba")[1].split("-")[0]) for p in first.parent.glob("ep0-ba*-rank0.pt"))
        fresh = tmp_path / "another_machine"
        fresh.mkdir()
        resumed = subprocess.run([*args, f"--max_duration={last + 4}ba", "--eval_interval=400ba",
                                  "--autoresume=True"], cwd=fresh, env=env, capture_output=True, text=True,
                                 timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"resuming from the checkpoint at batch {last} " in resumed.stdout, resumed.stdout[-2000:]
        assert "done: 4 batches" in resumed.stdout
        assert (first.parent / f"ep0-ba{last + 4}-rank0.pt").is_file()  # and its uploads finished before "done"
        assert (first.parent / "model.pt").is_file() and (first.parent / "latest-rank0.pt.symlink").is_file()
    finally:
        if proc is not None and proc.poll() is None:  # a failed assertion leaves no training process behind
            proc.kill()
            proc.wait()
        stop(server)
