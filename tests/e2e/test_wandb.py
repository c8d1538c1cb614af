"""W&B follows the run: the run's W&B id is kept in its config.json, and autoresume continues the same W&B run
(WandBLogger's init_kwargs id, resume="allow"), with WANDB_MODE=offline (each start an offline run folder named by
the id, as `wandb sync` would send it). Needs wandb: `make install-loggers`."""

import json

import pytest

from helpers import REPO, SMALL, main_error, read_jsonl, train_main
from pilegpt.train.run.lifecycle import WANDB_ID

wandb = pytest.importorskip("wandb", reason="wandb is not installed: make install-loggers (requirements-loggers.txt)")
pytestmark = pytest.mark.usefixtures("one_torch_thread")
ARGS = [str(REPO / "config" / "tiny.py"), *SMALL, "--device=cpu", "--sample_length=0", "--eval_interval=100ba",
        "--save_interval=2ba", "--progress_bar=False", "--wandb_log=True", "--wandb_project=pilegpt-test",
        "--run_name=w", "--log_interval=1"]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """start(argv): train.py's main with W&B offline, nothing leaving the machine; each start's W&B files in a folder
    of its own (offline run folders are named by the second and the id: two starts in one second would share one)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("WANDB_RESUME", raising=False)
    starts = []

    def start(argv: list) -> None:
        starts.append(tmp_path / f"wandb-start{len(starts)}")
        starts[-1].mkdir()
        monkeypatch.setenv("WANDB_DIR", str(starts[-1]))
        try:
            train_main(argv)
        finally:
            wandb.teardown()  # the next start reads the environment afresh, as a new process would

    start.runs = lambda: [run for folder in starts for run in offline_runs(folder / "wandb")]
    start.folders = starts
    return start


def offline_runs(wandb_dir) -> list[str]:
    """The ids of the offline W&B runs in a W&B folder (offline-run-<time>-<id>)."""
    return [p.name.rsplit("-", 1)[1] for p in sorted(wandb_dir.glob("offline-run-*"))]


def history(wandb_dir) -> dict[int, dict]:
    """The metrics the offline W&B run in a start's W&B folder holds, by step: its .wandb file's history records,
    read with wandb's own reader, as `wandb sync` reads them."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    [path] = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    store, steps = datastore.DataStore(), {}
    store.open_for_scan(str(path))
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            steps[row.pop("_step")] = row
    return steps


def kept_id(run) -> str:
    return json.loads((run / "config.json").read_text())[WANDB_ID]


def test_autoresume_continues_the_same_wandb_run(shakespeare_bin, tmp_path, offline_wandb):
    run = tmp_path / "run"
    args = [*ARGS, f"--data_dir={shakespeare_bin}", f"--save_folder={run}", "--autoresume=True"]
    offline_wandb([*args, "--max_duration=2ba"])  # the first start (no checkpoint yet) with autoresume on, as pile's
    first = kept_id(run)
    offline_wandb([*args, "--max_duration=4ba"])
    assert kept_id(run) == first and offline_wandb.runs() == [first, first]
    # the resumed start logged batches 3 and 4 into it: W&B's step is the batch's (from 0, as Composer logs the
    # loss), its figures metrics.jsonl's
    rows = {r["batch"]: r for r in read_jsonl(run / "metrics.jsonl")}
    for folder, batches in zip(offline_wandb.folders, ([1, 2], [3, 4])):
        steps = history(folder)
        assert [s + 1 for s in steps if "loss/train/total" in steps[s]] == batches
        for b in batches:
            assert steps[b - 1]["loss/train/total"] == pytest.approx(rows[b]["loss"], rel=1e-6)
            assert steps[b - 1]["grad_norm"] == pytest.approx(rows[b]["grad_norm"], rel=1e-6)
    # a run that starts over in the folder is a new W&B run, and the folder keeps the new id
    offline_wandb([*args, "--max_duration=2ba", "--autoresume=False", "--save_overwrite=True"])
    assert kept_id(run) != first and offline_wandb.runs() == [first, first, kept_id(run)]


def test_a_resume_without_wandb_keeps_the_id_for_a_later_one_with_it(shakespeare_bin, tmp_path, offline_wandb):
    run = tmp_path / "run"
    args = [*ARGS, f"--data_dir={shakespeare_bin}", f"--save_folder={run}", "--autoresume=True"]
    offline_wandb([*args, "--max_duration=2ba"])
    first = kept_id(run)
    offline_wandb([*args, "--max_duration=4ba", "--wandb_log=False"])
    assert kept_id(run) == first and offline_wandb.runs() == [first]
    offline_wandb([*args, "--max_duration=6ba"])
    assert kept_id(run) == first and offline_wandb.runs() == [first, first]


def test_a_damaged_wandb_id_in_config_json_is_one_line(shakespeare_bin, tmp_path, offline_wandb, capsys):
    import train

    run = tmp_path / "run"
    args = [*ARGS, f"--data_dir={shakespeare_bin}", f"--save_folder={run}", "--autoresume=True"]
    offline_wandb([*args, "--max_duration=2ba"])
    info = json.loads((run / "config.json").read_text())
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.name != "config.json"}
    for damaged in ["", "a/b", "x" * 65, "ABC", "a b", "id?x", 7, ["abc"], {"id": "abc"}, True]:
        (run / "config.json").write_text(json.dumps({**info, WANDB_ID: damaged}))
        line = main_error(train.main, [*args, "--max_duration=4ba"], capsys)
        assert line.endswith(f"config.json: wandb_id={str(damaged)[:80]!r} is not a W&B run id (a-z, 0-9, - and _, "
                             "at most 64): restore config.json, or delete its wandb_id to log the resumed run as a "
                             "new W&B run"), line
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.name != "config.json"} == before
    assert len(offline_wandb.runs()) == 1  # nothing started
    (run / "config.json").write_text(json.dumps({k: v for k, v in info.items() if k != WANDB_ID}))  # as told
    offline_wandb([*args, "--max_duration=4ba"])
    assert kept_id(run) not in (info[WANDB_ID],) and offline_wandb.runs() == [info[WANDB_ID], kept_id(run)]
