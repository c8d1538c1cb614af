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

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

import train
from helpers import (
    REPO,
    SMALL,
    assert_same_losses,
    checkpoint_state,
    finish,
    losses_by_batch,
    read_jsonl,
    run_command,
    run_train,
    start_train,
    succeeded,
    train_main,
    wait_until,
)
from pilegpt.checkpoint import LATEST_CHECKPOINT, load_model_file
from pilegpt.train.run.preemption import PREEMPTED, REPEAT_S
from pilegpt.train.run.resume import is_whole_checkpoint, set_aside_broken_checkpoints

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ARGS = [*SMALL, "--device=cpu", "--sample_length=0", "--eval_interval=3ba", "--eval_subset_num_batches=1",
        "--progress_bar=False", "--save_interval=3ba", "--max_duration=12ba", "--run_name=pre"]
SLOW = {"faults:SlowBatches": {"seconds": 0.3}}  # tests/faults.py: time to signal mid-run


@pytest.fixture(scope="module")
def uninterrupted(random_bin, tmp_path_factory):
    """uninterrupted(nproc): the per-batch losses of the run never interrupted, on the same process count as the runs
    compared with it (trained once per count in this module). Like with like: 2 processes sum their gradients in
    another order than 1 does, so their curves differ by ~1e-6 (9.5e-7 at batch 1), the tolerance below."""
    runs = {}

    def losses(nproc: int) -> dict[int, float]:
        if nproc not in runs:
            cwd = tmp_path_factory.mktemp(f"whole{nproc}")
            args = [*ARGS, f"--data_dir={random_bin}"]
            if nproc:  # the launcher the runs compared with use: pilegpt.launch, `composer -n 2`
                succeeded(run_train(args, cwd, nproc=nproc, launcher="pilegpt"))
            else:  # this process, one torch thread (train_main), as train_env gives a one-process subprocess
                train_main([*args, f"--save_folder={cwd / 'runs' / 'pre'}"])
            runs[nproc] = losses_by_batch(cwd / "runs" / "pre")
        return runs[nproc]

    return losses


def started(args: list, cwd: Path, nproc: int, callbacks: dict = SLOW):
    """train.py (through pilegpt.launch with nproc) with fault callbacks, in its own process group, output to a file
    (conftest kills whatever of it a failed test leaves running)."""
    return start_train([*args, f"--callbacks={callbacks!r}"], cwd, nproc, launcher="pilegpt")


def sigterm_after(proc, cwd: Path, after_batch: int = 3) -> float:
    """Send SIGTERM once metrics.jsonl shows `after_batch`; returns when (time.monotonic())."""
    metrics = cwd / "runs" / "pre" / "metrics.jsonl"
    wait_until(lambda: metrics.is_file() and any(r["batch"] >= after_batch for r in read_jsonl(metrics)), proc,
               f"batch {after_batch}")
    proc.send_signal(signal.SIGTERM)
    return time.monotonic()


def resume_here(args: list, cwd: Path, monkeypatch, capsys) -> str:
    """The same run continued with --autoresume=True in this process, from its working folder; its output."""
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    train.main([*args, "--autoresume=True"])
    return capsys.readouterr().out


def stopped_batch(out: str) -> int:
    lines = [line for line in out.splitlines() if "stopped by SIGTERM after batch" in line]
    assert len(lines) == 1, out[-4000:]
    assert "--autoresume=True" in lines[0]
    return int(lines[0].split("after batch ")[1].split(",")[0])


@pytest.mark.parametrize("nproc", [0, 2])
def test_sigterm_checkpoints_the_current_batch_and_autoresume_continues_loss_for_loss(random_bin, tmp_path, nproc,
                                                                                     uninterrupted, monkeypatch,
                                                                                     capsys):
    args = [*ARGS, f"--data_dir={random_bin}"]
    whole = uninterrupted(nproc)

    (tmp_path / "cut").mkdir()
    proc = started(args, tmp_path / "cut", nproc)
    sigterm_after(proc, tmp_path / "cut")
    code, out = finish(proc, timeout=240)
    assert code == PREEMPTED, out[-4000:]
    stop = stopped_batch(out)
    assert 3 <= stop < 12 and "Traceback" not in out, out[-4000:]
    saved = tmp_path / "cut" / "runs" / "pre"
    assert (saved / f"ep0-ba{stop}-rank0.pt").is_file()  # the batch it stopped after, not the last periodic one
    first = losses_by_batch(saved)
    assert sorted(first) == list(range(1, stop + 1))

    if nproc:  # the same command: `composer -n 2`
        resumed = succeeded(run_train([*args, "--autoresume=True"], tmp_path / "cut", nproc=nproc))
    else:
        resumed = resume_here(args, tmp_path / "cut", monkeypatch, capsys)
    assert f"resuming from the checkpoint at batch {stop} " in resumed
    assert f"done: {12 - stop} batches" in resumed
    rows = [r["batch"] for r in read_jsonl(saved / "metrics.jsonl") if "loss" in r]
    assert rows == list(range(1, 13))  # no batch lost or repeated
    both = losses_by_batch(saved)
    assert_same_losses(both, whole, range(1, 13), atol=1e-6)


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
        random_bin, tmp_path, sig, uninterrupted, monkeypatch, capsys):
    args = [*ARGS, f"--data_dir={random_bin}"]
    marker = tmp_path / "writing"
    proc = started(args, tmp_path, 0, CUT)
    first = sigterm_after(proc, tmp_path, after_batch=4)  # a checkpoint at batch 3 is complete by then
    wait_until(marker.is_file, proc, "preemption checkpoint")
    if sig == signal.SIGTERM:  # one sooner would count as the same notice (preemption.REPEAT_S)
        time.sleep(max(0.0, first + REPEAT_S + 0.5 - time.monotonic()))
    proc.send_signal(sig)
    code, out = finish(proc, timeout=60)  # the fault holds the write open for 600 s
    assert code == -sig, out[-4000:]  # ended by that signal: no exit 143, no traceback, no "stopped by" line
    assert "Traceback" not in out and "stopped by SIGTERM" not in out, out[-4000:]
    saved = tmp_path / "runs" / "pre"
    cut = marker.read_text()
    last = check_cut_folder(saved, cut)

    resumed = resume_here(args, tmp_path, monkeypatch, capsys)
    set_aside = "pre: checkpoints set aside as *.broken-"  # resume.set_aside_broken_checkpoints' line
    assert set_aside in resumed and f": {cut}; resuming from ep0-ba{last}-rank0.pt" in resumed, resumed[-3000:]
    assert f"resuming from the checkpoint at batch {last} " in resumed and f"done: {12 - last} batches" in resumed
    assert [p.name.split(".broken-")[0] for p in saved.glob("*.broken-*")] == [cut]
    assert all(is_whole_checkpoint(p) for p in saved.glob("ep*.pt"))
    both, whole = losses_by_batch(saved), uninterrupted(0)
    assert sorted(both) == list(range(1, 13))
    assert_same_losses(both, whole, range(1, 13), atol=1e-6)


def test_sigkill_to_the_launcher_during_the_preemption_checkpoint_leaves_no_rank_running(random_bin, tmp_path):
    marker = tmp_path / "writing"
    proc = started([*ARGS, f"--data_dir={random_bin}"], tmp_path, 2, CUT)
    sigterm_after(proc, tmp_path, after_batch=4)  # pilegpt.launch forwards it to both ranks
    wait_until(marker.is_file, proc, "preemption checkpoint")
    ranks = psutil.Process(proc.pid).children(recursive=True)
    assert len(ranks) == 2
    proc.send_signal(signal.SIGKILL)  # the grace period is over; the ranks get nothing from the launcher
    code, _ = finish(proc, timeout=60)
    _, alive = psutil.wait_procs(ranks, timeout=60)  # a generous bound: they go at once (else conftest kills them)
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
    code, out = run_command([sys.executable, "-m", "pilegpt.launch", "-n", "1", script], tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert code == 128 + signal.SIGTERM == PREEMPTED, out[-2000:]
