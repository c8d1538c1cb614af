"""The ends of a run (issue 31, items 1, 4, 5, 6, 9, 13), through train.py's command line: a checkpoint whose pickle
would run code is refused on autoresume in one line and nothing in it runs; a damaged metrics.jsonl, a stray
hellaswag*.json or a damaged data.json never pass for something else; SIGTERM during start-up is a preemption with
its line, Ctrl-C there is "interrupted"; two s3:// runs of one run_name never share a local folder; checkpoint
times are logged against the preemption grace. The runs that set up a folder, or must succeed, run in this process
(train_here); the refused or signalled runs are the command line, whose exit status and one line are tested."""

import json
import os
import pickle
import re
import shutil
import signal
import zipfile

import pytest

from helpers import (
    SMALL,
    failed_with_one_line,
    finish,
    run_command,
    run_train,
    script,
    start_train,
    train_main,
    train_output,
    wait_until,
    write_random_bin,
)

ARGS = [*SMALL, "--device=cpu", "--sample_length=0", "--progress_bar=False", "--eval_interval=2ba",
        "--eval_subset_num_batches=1", "--save_interval=2ba", "--run_name=ends"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_random_bin(tmp_path_factory.mktemp("data") / "d")


def train_here(args: list, cwd, monkeypatch, capsys) -> str:
    """train.py's main() in this process, from the working folder cwd (a run that sets up or must succeed): its
    output. A failure raises, as the command line's would exit non-zero."""
    monkeypatch.chdir(cwd)
    return train_output(args, capsys)


@pytest.fixture(scope="module")
def two_batch_run(data_dir, tmp_path_factory):
    """A finished 2-batch run (runs/ends under its working folder), trained once: tests copy it."""
    cwd = tmp_path_factory.mktemp("two_batches")
    before = os.getcwd()
    os.chdir(cwd)
    try:
        train_main([*ARGS, f"--data_dir={data_dir}", "--max_duration=2ba"])
    finally:
        os.chdir(before)
    return cwd / "runs" / "ends"


class Payload:
    """Unpickling this runs `touch MARKER` (what a hostile checkpoint in a shared save_folder would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_runs_code_is_refused_on_autoresume_and_never_runs(data_dir, tmp_path, monkeypatch,
                                                                            capsys):
    train_here([*ARGS, f"--data_dir={data_dir}", "--max_duration=4ba"], tmp_path, monkeypatch, capsys)
    folder, marker = tmp_path / "runs" / "ends", tmp_path / "PAYLOAD_RAN"
    latest = folder / os.readlink(folder / "latest-rank0.pt")  # ep0-ba4-rank0.pt
    hostile = tmp_path / "hostile.pt"
    with zipfile.ZipFile(latest) as src, zipfile.ZipFile(hostile, "w") as dst:  # its pickle: one that runs a command
        for item in src.infolist():
            hostile_pickle = pickle.dumps({"state": Payload(marker)}, protocol=2)
            dst.writestr(item, hostile_pickle if item.filename.endswith("data.pkl") else src.read(item))
    hostile.replace(latest)
    before = (folder / "ep0-ba2-rank0.pt").read_bytes()
    line = failed_with_one_line(run_train([*ARGS, f"--data_dir={data_dir}", "--max_duration=6ba",
                                           "--autoresume=True"], tmp_path))
    assert "autoresume refused a checkpoint (nothing in it ran)" in line and "ep0-ba4-rank0.pt" in line
    assert "it holds a posix.system object" in line
    assert not marker.exists()
    assert (folder / "ep0-ba2-rank0.pt").read_bytes() == before  # the run's other checkpoints untouched


def test_a_damaged_metrics_file_and_a_stray_result_leave_the_run_done(data_dir, tmp_path, monkeypatch, capsys):
    train_here([*ARGS, f"--data_dir={data_dir}", "--max_duration=4ba"], tmp_path, monkeypatch, capsys)
    folder = tmp_path / "runs" / "ends"
    with open(folder / "metrics.jsonl", "a") as f:
        f.write("%% garbage %%\n" + '{"batch": 9, "loss": 1.')  # garbage, then a line cut by a kill
    (folder / "hellaswag_old.json").write_text("[1, 2, 3]")
    out = train_here([*ARGS, f"--data_dir={data_dir}", "--max_duration=6ba", "--autoresume=True"], tmp_path,
                     monkeypatch, capsys)
    assert "done: 2 batches" in out and "Traceback" not in out
    report = (folder / "report.md").read_text()
    assert "- 6 batches" in report and "- 2 unreadable line(s) of the metrics skipped" in report
    assert "Not eval.py results, skipped: hellaswag_old.json." in report
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    assert lines[-1].startswith('{"batch": 6') and '{"batch": 9, "loss": 1.' in lines  # the cut line stays apart


@pytest.mark.parametrize("signum, status, line", [
    (signal.SIGTERM, 143, "train.py: stopped by SIGTERM during start-up, before training: no new checkpoint; to "
                          "continue, run the same command with --autoresume=True (exit status 143)"),
    (signal.SIGINT, 130, "interrupted")])
def test_a_signal_during_start_up_is_one_line(data_dir, tmp_path, signum, status, line):
    marker = tmp_path / "starting"
    slow = f"--callbacks={{'faults:SlowStart': {{'marker': '{marker}'}}}}"
    proc = start_train([*ARGS, f"--data_dir={data_dir}", "--max_duration=4ba", slow], tmp_path)
    wait_until(marker.exists, proc, "the start-up window (faults.SlowStart)", seconds=120)
    proc.send_signal(signum)
    code, out = finish(proc, timeout=60)
    assert code == status and line in out.splitlines() and "Traceback" not in out, out[-3000:]
    assert not (tmp_path / "runs" / "ends").exists()  # the folder it made is released and gone: no run started


@pytest.mark.parametrize("damage, says", [("drop vocab_size", "vocab_size missing"), ("cut", "not JSON")])
def test_a_damaged_data_record_is_named_as_damaged_not_as_other_data(data_dir, two_batch_run, tmp_path, damage, says):
    shutil.copytree(two_batch_run, tmp_path / "runs" / "ends", symlinks=True)
    record = tmp_path / "runs" / "ends" / "data.json"
    if damage == "cut":
        record.write_text(record.read_text()[:40])
    else:
        record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "vocab_size"}))
    line = failed_with_one_line(run_train([*ARGS, f"--data_dir={data_dir}", "--max_duration=4ba",
                                           "--autoresume=True"], tmp_path))
    assert line == (f"error: autoresume: runs/ends/data.json is damaged ({says}): it records what the run trained "
                    "on; restore it from a copy, or pass --data_changed_ok=True to continue on the data given and "
                    "record it anew")


def test_two_s3_runs_with_one_run_name_never_share_the_local_folder(data_dir, tmp_path, s3_env, monkeypatch, capsys):
    first, second = f"s3://{s3_env.bucket}/ends/first", f"s3://{s3_env.bucket}/ends/second"
    train_here([*ARGS, f"--data_dir={data_dir}", "--max_duration=2ba", f"--save_folder={first}"], tmp_path,
               monkeypatch, capsys)
    line = failed_with_one_line(run_train([*ARGS, f"--data_dir={data_dir}", "--max_duration=2ba",
                                           f"--save_folder={second}"], tmp_path))
    assert line == (f"error: runs/ends holds the local files of the run in {first} (same run_name): choose another "
                    f"--run_name for {second}, or move runs/ends away")
    assert not s3_env.client().list_objects_v2(Bucket=s3_env.bucket, Prefix="ends/second/").get("Contents")


def test_checkpoint_times_are_logged_and_a_slow_one_is_warned_against(data_dir, tmp_path):
    slow = "--callbacks={'faults:SlowBatches': {'seconds': 0.3}, 'faults:SlowSaves': {'seconds': 0.1}}"
    proc = start_train([*ARGS, f"--data_dir={data_dir}", "--max_duration=40ba", "--preemption_grace_s=0.02", slow],
                       tmp_path)
    metrics = tmp_path / "runs" / "ends" / "metrics.jsonl"
    wait_until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 3, proc, "batch 3", seconds=120)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, timeout=120)
    assert code == 143, out[-3000:]
    lines = out.splitlines()
    # the first save (0.1 s or more with SlowSaves), not a checkpoint event that wrote nothing (under 0.05 s)
    warnings = [line for line in lines if re.match(r"warning: the checkpoint of batch \d+ took ", line)]
    assert len(warnings) == 1 and "to write, more than half the preemption grace period (preemption_grace_s=0.02 s)" \
        in warnings[0], "\n".join(lines[-40:])
    stop = [line for line in lines if "stopped by SIGTERM after batch" in line]
    assert len(stop) == 1 and " s after the notice (grace: preemption_grace_s=0.02 s); to continue" in stop[0]


def test_eval_device_cuda_without_a_gpu_is_one_line_from_the_command_line(tmp_path):
    import torch

    from helpers import FIXTURES
    from model import GPT, GPTConfig
    from pilegpt.checkpoint import save_export

    if torch.cuda.is_available():
        pytest.skip("checks a machine without CUDA")
    save_export(GPT(GPTConfig(block_size=16, vocab_size=50257, n_layer=1, n_head=1, n_embd=8)), tmp_path / "m.pt")
    line = failed_with_one_line(run_command(script("eval.py", tmp_path / "m.pt", "--task", "hellaswag", "--data",
                                                   FIXTURES / "hellaswag_tiny.jsonl", "--device", "cuda")))
    assert line == "error: --device cuda:0: no CUDA GPU is visible here; use --device cpu"
