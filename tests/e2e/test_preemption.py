"""Preemption: a scheduler's SIGTERM to `python train.py`, or to the launcher of `composer -n 2`
(pilegpt/launch.py), stops every rank after the same batch with a checkpoint of it (with an s3:// save_folder,
uploaded before the exit: test_multinode.py's preemption, resumed from the bucket alone), exit status 143 and
one line; --autoresume=True then continues loss for loss with a run that was never interrupted: no batch lost or
repeated.

The grace period: a second SIGTERM (more than 2 s after the first), or the SIGKILL that ends a grace period, landing
while the preemption checkpoint is half written (faults.SlowPreemptionCheckpoint holds the write open) ends the
process at once with that signal, without a traceback; the last periodic checkpoint stays whole and `latest`, the
cut one is set aside by autoresume, which continues from the periodic one loss for loss. A SIGKILLed launcher takes
its ranks with it (pilegpt.launch.die_with_launcher), and a rank ended by a second SIGTERM makes the launcher exit
143, not Composer's 241 (sys.exit(-15))."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from helpers import REPO, SMALL, checkpoint_state, losses_by_batch, read_jsonl, run, write_random_bin
from pilegpt.checkpoint import LATEST_CHECKPOINT, load_model_file
from pilegpt.train.preemption import PREEMPTED, REPEAT_S
from pilegpt.train.resume import is_whole_checkpoint, set_aside_broken_checkpoints

pytestmark = pytest.mark.slow
ARGS = [*SMALL, "--device=cpu", "--sample_length=0", "--eval_interval=3ba", "--eval_subset_num_batches=1",
        "--progress_bar=False", "--save_interval=3ba", "--max_duration=12ba", "--run_name=pre"]
SLOW = {"faults:SlowBatches": {"seconds": 0.3}}  # tests/faults.py: time to signal mid-run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_random_bin(tmp_path_factory.mktemp("data") / "d")


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
    """losses(nproc): the per-batch losses of the run never interrupted, trained once per process count."""
    done = {}

    def losses(nproc: int) -> dict[int, float]:
        if nproc not in done:
            cwd = tmp_path_factory.mktemp(f"whole{nproc}")
            run([*ARGS, f"--data_dir={data_dir}"], cwd, nproc=nproc)
            done[nproc] = losses_by_batch(cwd / "runs" / "pre")
        return done[nproc]

    return losses


@contextlib.contextmanager
def started(args: list, cwd: Path, nproc: int, env: dict, callbacks: dict = SLOW):
    """train.py (through pilegpt.launch with nproc) with fault callbacks, output to cwd/out.txt; on the way out,
    whatever of it still runs (the process, its children) is killed, so that a failed test leaves nothing behind."""
    launcher = [sys.executable, "-m", "pilegpt.launch", "-n", str(nproc)] if nproc else [sys.executable]
    env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{REPO}"}
    with open(cwd / "out.txt", "w") as out:
        proc = subprocess.Popen([*launcher, str(REPO / "train.py"), *args, f"--callbacks={callbacks!r}"], cwd=cwd,
                                env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc
    finally:
        kill_all(psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else [])
        proc.kill()  # nothing, if it has ended
        proc.wait()


def kill_all(processes: list) -> None:
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def wait_until(proc: subprocess.Popen, done, what: str, seconds: float = 240) -> None:
    """Poll done() while proc runs; fails the test if proc ends first or `seconds` (a generous bound) pass."""
    deadline = time.monotonic() + seconds
    while not done():
        assert proc.poll() is None and time.monotonic() < deadline, f"no {what}: exit {proc.returncode}"
        time.sleep(0.05)


def sigterm_after(proc: subprocess.Popen, cwd: Path, after_batch: int = 3) -> float:
    """Send SIGTERM once metrics.jsonl shows `after_batch`; returns when (time.monotonic())."""
    metrics = cwd / "runs" / "pre" / "metrics.jsonl"
    wait_until(proc, lambda: metrics.is_file() and any(r["batch"] >= after_batch for r in read_jsonl(metrics)),
               f"batch {after_batch}")
    proc.send_signal(signal.SIGTERM)
    return time.monotonic()


def finish(proc: subprocess.Popen, cwd: Path, seconds: float = 240) -> tuple[int, str]:
    """proc's exit status and output, waiting at most `seconds` (then the test fails, and `started` kills it)."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {seconds} s later: {(cwd / 'out.txt').read_text()[-3000:]}")
    return proc.returncode, (cwd / "out.txt").read_text()


def signalled_run(args: list, cwd: Path, nproc: int, env: dict, after_batch: int = 3) -> tuple[int, str]:
    """train.py (through pilegpt.launch with nproc) sent SIGTERM once metrics.jsonl shows `after_batch`."""
    with started(args, cwd, nproc, env) as proc:
        sigterm_after(proc, cwd, after_batch)
        return finish(proc, cwd)


def stopped_batch(out: str) -> int:
    lines = [line for line in out.splitlines() if "stopped by SIGTERM after batch" in line]
    assert len(lines) == 1, out[-4000:]
    assert "--autoresume=True" in lines[0]
    return int(lines[0].split("after batch ")[1].split(",")[0])


@pytest.mark.parametrize("nproc", [0, 2])
def test_sigterm_checkpoints_the_current_batch_and_autoresume_continues_loss_for_loss(data_dir, tmp_path, nproc,
                                                                                     uninterrupted):
    args = [*ARGS, f"--data_dir={data_dir}"]
    whole = uninterrupted(nproc)

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


CUT = {**SLOW, "faults:SlowPreemptionCheckpoint": {"marker": "writing"}}  # the marker: relative to the run's cwd


def check_cut_folder(saved: Path, cut: str) -> int:
    """What a kill during the write of checkpoint `cut` leaves: the periodic checkpoints before it whole (the
    newest is `latest`), `cut` truncated, model.pt whole. Returns the batch of the last periodic checkpoint."""
    stop = int(cut.split("-ba")[1].split("-")[0])
    periodic = list(range(3, stop, 3))  # save_interval=3ba
    assert sorted(p.name for p in saved.glob("ep*.pt")) == sorted([f"ep0-ba{b}-rank0.pt" for b in periodic] + [cut])
    for b in periodic:
        assert is_whole_checkpoint(saved / f"ep0-ba{b}-rank0.pt")
        assert checkpoint_state(saved / f"ep0-ba{b}-rank0.pt")["timestamp"]["Timestamp"]["batch"] == b
    assert not is_whole_checkpoint(saved / cut)
    assert os.readlink(saved / LATEST_CHECKPOINT) == f"ep0-ba{periodic[-1]}-rank0.pt"
    assert load_model_file(saved / "model.pt").config.n_layer == 2  # the export is written atomically
    return periodic[-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["second_SIGTERM", "SIGKILL"])
def test_a_signal_during_the_preemption_checkpoint_ends_the_run_and_autoresume_continues_from_the_periodic_one(
        data_dir, tmp_path, sig, uninterrupted):
    args = [*ARGS, f"--data_dir={data_dir}"]
    marker = tmp_path / "writing"
    with started(args, tmp_path, 0, dict(os.environ), CUT) as proc:
        first = sigterm_after(proc, tmp_path, after_batch=4)  # a checkpoint at batch 3 is complete by then
        wait_until(proc, marker.is_file, "preemption checkpoint")
        if sig == signal.SIGTERM:  # one sooner would count as the same notice (preemption.REPEAT_S)
            time.sleep(max(0.0, first + REPEAT_S + 0.5 - time.monotonic()))
        proc.send_signal(sig)
        code, out = finish(proc, tmp_path, seconds=60)  # the fault holds the write open for 600 s
    assert code == -sig, out[-4000:]  # ended by that signal: no exit 143, no traceback, no "stopped by" line
    assert "Traceback" not in out and "stopped by SIGTERM" not in out, out[-4000:]
    saved = tmp_path / "runs" / "pre"
    cut = marker.read_text()
    last = check_cut_folder(saved, cut)

    resumed = run([*args, "--autoresume=True"], tmp_path)
    set_aside = "pre: checkpoints set aside as *.broken-"  # resume.set_aside_broken_checkpoints' line
    assert set_aside in resumed and f": {cut}; resuming from ep0-ba{last}-rank0.pt" in resumed, resumed[-3000:]
    assert f"resuming from the checkpoint at batch {last} " in resumed and f"done: {12 - last} batches" in resumed
    assert [p.name.split(".broken-")[0] for p in saved.glob("*.broken-*")] == [cut]
    assert all(is_whole_checkpoint(p) for p in saved.glob("ep*.pt"))
    both, whole = losses_by_batch(saved), uninterrupted(0)
    assert sorted(both) == list(range(1, 13))
    assert np.allclose([both[b] for b in range(1, 13)], [whole[b] for b in range(1, 13)], rtol=0, atol=1e-6)


def test_sigkill_to_the_launcher_during_the_preemption_checkpoint_leaves_no_rank_running(data_dir, tmp_path):
    marker = tmp_path / "writing"
    with started([*ARGS, f"--data_dir={data_dir}"], tmp_path, 2, dict(os.environ), CUT) as proc:
        sigterm_after(proc, tmp_path, after_batch=4)  # pilegpt.launch forwards it to both ranks
        wait_until(proc, marker.is_file, "preemption checkpoint")
        ranks = psutil.Process(proc.pid).children(recursive=True)
        assert len(ranks) == 2
        proc.send_signal(signal.SIGKILL)  # the grace period is over; the ranks get nothing from the launcher
        code, _ = finish(proc, tmp_path, seconds=60)
        try:
            _, alive = psutil.wait_procs(ranks, timeout=60)  # a generous bound: they go at once
        finally:
            kill_all(ranks)
    assert code == -signal.SIGKILL and alive == []
    saved = tmp_path / "runs" / "pre"
    cut = marker.read_text()
    last = check_cut_folder(saved, cut)
    note = set_aside_broken_checkpoints(str(saved))  # autoresume's first step; the resume: the test above
    assert note is not None and note.endswith(f": {cut}; resuming from ep0-ba{last}-rank0.pt")
    assert os.readlink(saved / LATEST_CHECKPOINT) == f"ep0-ba{last}-rank0.pt"


def test_a_rank_ended_by_a_second_sigterm_makes_the_launcher_exit_143(tmp_path):
    script = tmp_path / "rank.py"  # a rank that dies of SIGTERM, as train.py does on a second one
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    proc = subprocess.run([sys.executable, "-m", "pilegpt.launch", "-n", "1", str(script)], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM == PREEMPTED, proc.stderr[-2000:]
