"""The ends of a run (issue 31, items 1, 4, 5), through train.py's command line: a checkpoint whose pickle would run
code is refused on autoresume in one line and nothing in it runs; a damaged metrics.jsonl or a stray
hellaswag*.json never changes the run's outcome; SIGTERM during start-up is a preemption with its line, Ctrl-C
there is "interrupted"."""

import os
import pickle
import signal
import subprocess
import sys
import time
import zipfile

import pytest

from helpers import REPO, SMALL, run, write_random_bin

pytestmark = pytest.mark.slow
ARGS = [*SMALL, "--device=cpu", "--sample_length=0", "--progress_bar=False", "--eval_interval=2ba",
        "--eval_subset_num_batches=1", "--save_interval=2ba", "--run_name=ends"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_random_bin(tmp_path_factory.mktemp("data") / "d")


class Payload:
    """Unpickling this runs `touch MARKER` (what a hostile checkpoint in a shared save_folder would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_that_runs_code_is_refused_on_autoresume_and_never_runs(data_dir, tmp_path):
    run([*ARGS, f"--data_dir={data_dir}", "--max_duration=4ba"], tmp_path)
    folder, marker = tmp_path / "runs" / "ends", tmp_path / "PAYLOAD_RAN"
    latest = folder / os.readlink(folder / "latest-rank0.pt")  # ep0-ba4-rank0.pt
    with zipfile.ZipFile(latest, "a") as z:  # the checkpoint's pickle replaced by one that runs a command
        name = next(n for n in z.namelist() if n.endswith("data.pkl"))
    hostile = tmp_path / "hostile.pt"
    with zipfile.ZipFile(latest) as src, zipfile.ZipFile(hostile, "w") as dst:
        for item in src.infolist():
            data = pickle.dumps({"state": Payload(marker)}, protocol=2) if item.filename == name else src.read(item)
            dst.writestr(item, data)
    hostile.replace(latest)
    before = (folder / "ep0-ba2-rank0.pt").read_bytes()
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *ARGS, f"--data_dir={data_dir}",
                           "--max_duration=6ba", "--autoresume=True"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert "autoresume refused a checkpoint (nothing in it ran)" in errors[0] and "ep0-ba4-rank0.pt" in errors[0]
    assert "it holds a posix.system object" in errors[0]
    assert not marker.exists() and "Traceback" not in proc.stderr
    assert (folder / "ep0-ba2-rank0.pt").read_bytes() == before  # the run's other checkpoints untouched


def test_a_damaged_metrics_file_and_a_stray_result_leave_the_run_done(data_dir, tmp_path):
    run([*ARGS, f"--data_dir={data_dir}", "--max_duration=4ba"], tmp_path)
    folder = tmp_path / "runs" / "ends"
    with open(folder / "metrics.jsonl", "a") as f:
        f.write("%% garbage %%\n" + '{"batch": 9, "loss": 1.')  # garbage, then a line cut by a kill
    (folder / "hellaswag_old.json").write_text("[1, 2, 3]")
    out = run([*ARGS, f"--data_dir={data_dir}", "--max_duration=6ba", "--autoresume=True"], tmp_path)
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
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *ARGS, f"--data_dir={data_dir}",
                                 "--max_duration=4ba", slow], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO / "tests"), "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 120
        while not marker.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == status
    finally:
        proc.kill()
    text = (tmp_path / "out.txt").read_text()
    assert line in text.splitlines() and "Traceback" not in text, text[-3000:]
    assert not (tmp_path / "runs" / "ends" / ".lock").exists()  # the folder is released


@pytest.mark.parametrize("damage, says", [("drop vocab_size", "vocab_size missing"), ("cut", "not JSON")])
def test_a_damaged_data_record_is_named_as_damaged_not_as_other_data(data_dir, tmp_path, damage, says):
    import json

    run([*ARGS, f"--data_dir={data_dir}", "--max_duration=2ba"], tmp_path)
    record = tmp_path / "runs" / "ends" / "data.json"
    if damage == "cut":
        record.write_text(record.read_text()[:40])
    else:
        record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "vocab_size"}))
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *ARGS, f"--data_dir={data_dir}",
                           "--max_duration=4ba", "--autoresume=True"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: autoresume: runs/ends/data.json is damaged ({says}): it records what the run trained on; restore it "
        "from a copy, or pass --data_changed_ok=True to continue on the data given and record it anew"], \
        proc.stderr[-2000:]


def test_two_s3_runs_with_one_run_name_never_share_the_local_folder(data_dir, tmp_path, s3_env):
    first, second = f"s3://{s3_env.bucket}/ends/first", f"s3://{s3_env.bucket}/ends/second"
    run([*ARGS, f"--data_dir={data_dir}", "--max_duration=2ba", f"--save_folder={first}"], tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *ARGS, f"--data_dir={data_dir}",
                           "--max_duration=2ba", f"--save_folder={second}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: runs/ends holds the local files of the run in {first} (same run_name): choose another --run_name "
        f"for {second}, or move runs/ends away"], proc.stderr[-2000:]
    assert not s3_env.client().list_objects_v2(Bucket=s3_env.bucket, Prefix="ends/second/").get("Contents")


def test_checkpoint_times_are_logged_and_a_slow_one_is_warned_against(data_dir, tmp_path):
    slow = "--callbacks={'faults:SlowBatches': {'seconds': 0.3}}"
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *ARGS, f"--data_dir={data_dir}",
                                 "--max_duration=40ba", "--preemption_grace_s=0.02", slow], cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO / "tests"), "PYTHONUNBUFFERED": "1"})
    try:
        metrics, deadline = tmp_path / "runs" / "ends" / "metrics.jsonl", time.time() + 120
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 3) and time.time() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        proc.kill()
    lines = (tmp_path / "out.txt").read_text().splitlines()
    warnings = [line for line in lines if line.startswith("warning: the checkpoint of batch 2 took ")]
    assert len(warnings) == 1 and "to write, more than half the preemption grace period (preemption_grace_s=0.02 s)" \
        in warnings[0], "\n".join(lines[-40:])
    stop = [line for line in lines if "stopped by SIGTERM after batch" in line]
    assert len(stop) == 1 and " s after the notice (grace: preemption_grace_s=0.02 s); to continue" in stop[0]
