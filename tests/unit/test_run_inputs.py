"""Damaged run files and eval.py's inputs (issue 31): report.py reads what it can of a damaged metrics.jsonl in
bounded memory and skips a stray eval result; eval.py checks --out before scoring, splits JSON lines at \\n only,
names a non-UTF-8 byte by file:line and refuses a label that is not an index, in one line."""

import dataclasses
import json
import tracemalloc

import pytest

import eval as eval_script
import report
from helpers import HELLASWAG_TINY, main_error
from pilegpt import hellaswag, storage
from pilegpt.common import UserError
from pilegpt.train import report as run_report
from pilegpt.train.config import TrainConfig, setting_default, used_settings
from pilegpt.train.run.folder import check_same_model


def write_run(folder, metrics: str):
    config = {"config": {**TrainConfig(data_dir="d").__dict__, "run_name": "r"}, "world_size": 1, "device": "cpu"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.jsonl").write_text(metrics)


def test_report_skips_cut_and_garbage_metrics_lines_and_a_stray_result(tmp_path, capsys):
    rows = [{"batch": b, "tokens": 100 * b, "time_s": b, "loss": 10.0 - b, "tokens_per_sec": 1000.0} for b in (1, 2, 3)]
    text = (json.dumps(rows[0]) + "\n" + "%%garbage%%\n" + json.dumps(rows[1]) + "\n" + '{"batch": "x"}\n'
            + "[1, 2]\n" + json.dumps(rows[2]) + "\n" + '{"batch": 4, "loss": 1.')  # the last line cut by a kill
    write_run(tmp_path / "run", text)
    (tmp_path / "run" / "hellaswag_notes.json").write_text('["not", "a", "result"]')
    assert report.main([str(tmp_path / "run")]) == 0
    md = (tmp_path / "run" / "report.md").read_text()
    assert "- 3 batches, 300 tokens" in md and "train loss: 8.0000 (mean of the last 3 batches)" in md
    assert "- 4 unreadable line(s) of the metrics skipped" in md
    assert "Not eval.py results, skipped: hellaswag_notes.json." in md
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0


def test_report_reads_metrics_in_memory_far_below_the_file(tmp_path):
    rows = "".join(json.dumps({"batch": b, "tokens": 4096 * b, "time_s": 0.1 * b, "loss": 5 + 1 / b, "lr": 6e-4,
                               "tokens_per_sec": 40000.0}) + "\n" for b in range(1, 60_001))
    write_run(tmp_path / "run", rows + rows)  # every batch twice: a resumed run; the later row wins
    size = (tmp_path / "run" / "metrics.jsonl").stat().st_size
    tracemalloc.start()
    try:
        metrics = run_report.read_metrics(storage.folder(str(tmp_path / "run")), ["metrics.jsonl"])
        batches, losses = metrics.train
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(batches) == 60_000 and batches[-1] == 60_000 and losses[0] == 6.0
    assert peak < size / 2, (peak, size)  # 16 bytes a row (+ the sort at the end), not the rows as dicts


def test_a_damaged_config_json_is_one_line(tmp_path, capsys):
    write_run(tmp_path / "run", "")
    (tmp_path / "run" / "config.json").write_text('{"config": ')
    assert "config.json is damaged" in main_error(report.main, [str(tmp_path / "run")], capsys)


@pytest.mark.parametrize("where", ["a_folder", "under_a_file"])
def test_eval_checks_out_before_loading_or_scoring(tmp_path, capsys, where):
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "file").write_text("x")
    out = {"a_folder": tmp_path / "a_folder", "under_a_file": tmp_path / "file" / "r.json"}[where]
    line = main_error(eval_script.main, [tmp_path / "no-such-model.pt", "--task", "hellaswag", "--data", HELLASWAG_TINY,
                                         "--out", out], capsys)
    assert "--out" in line and "no-such-model" not in line  # refused before the model was even looked for


def test_eval_out_into_a_missing_folder_is_made(model_file, tmp_path, capsys):
    out = tmp_path / "results" / "new" / "r.json"
    assert eval_script.main([str(model_file), "--task", "hellaswag", "--data", str(HELLASWAG_TINY), "--limit", "4",
                             "--out", str(out)]) == 0
    assert json.loads(out.read_text())["n"] == 4


def test_a_line_with_u2028_inside_a_string_is_one_example(tmp_path):
    lines = HELLASWAG_TINY.read_text().splitlines()[:3]
    first = json.loads(lines[0])
    first["ctx"] = first["ctx"] + "\u2028 and\u2029 more\u0085"
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join([json.dumps(first, ensure_ascii=False)] + lines[1:]) + "\n", encoding="utf-8")
    examples = hellaswag.read_examples(path)
    assert len(examples) == 3 and examples[0].ctx == first["ctx"]


def test_a_non_utf8_byte_is_named_by_file_and_line(tmp_path):
    lines = HELLASWAG_TINY.read_bytes().split(b"\n")[:3]
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"\n".join([lines[0], lines[1][:10] + b"\xff" + lines[1][10:], lines[2]]))
    with pytest.raises(UserError, match=r"h\.jsonl:2: not UTF-8 text \(byte 11 of the line\)"):
        hellaswag.read_examples(path)


@pytest.mark.parametrize("label", ["\u00b2", "-1", "4", "1.0", True])
def test_a_label_that_is_not_an_ending_index_is_one_line(tmp_path, label):
    record = json.loads(HELLASWAG_TINY.read_text().splitlines()[0])
    record["label"] = label
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"h\.jsonl:1: 'label' must be the index of the right ending"):
        hellaswag.read_examples(path)


def older_run(folder, cfg: TrainConfig, drop: tuple[str, ...]) -> str:
    """A run folder whose config.json is as a train.py from before the settings `drop` existed wrote it."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in used_settings(cfg).items() if k not in drop}
    (folder / "config.json").write_text(json.dumps({"config": settings, "world_size": 1, "device": "cpu"}))
    return str(folder)


@pytest.mark.parametrize("setting", ["value_embeds", "x0_scalars", "optimizer", "smear", "backout"])
def test_a_setting_newer_than_the_run_is_read_as_its_default_on_autoresume(tmp_path, setting):
    """A run begun before a setting existed ran with its default: resumed with it changed, the refusal is one line
    (not a failure later, when the checkpoint's weights do not fit); resumed with the default, nothing is said."""
    cfg = TrainConfig(data_dir="d", run_name="r")
    run_dir = older_run(tmp_path / "run", cfg, drop=(setting,))
    check_same_model(cfg, run_dir, run_dir)  # the default: the same model
    new = {"optimizer": "muon"}.get(setting, True)
    changed = dataclasses.replace(cfg, **{setting: new})
    with pytest.raises(UserError) as e:
        check_same_model(changed, run_dir, run_dir)
    said = "of optimizer adamw; this run asks for muon" if setting == "optimizer" else \
        f"are of another model: {setting}={new} (the run has {setting_default(setting)})"
    assert said in str(e.value) and "\n" not in str(e.value)


REMOVED_ON = {"attn_window": 256, "zero_init_proj": True, "doc_aligned": True}  # removed.REMOVED_SETTINGS, each on


def test_a_run_s_config_json_with_a_removed_setting_resumes_at_its_default_and_is_one_line_when_on(tmp_path):
    """A run begun before a setting was removed (removed.REMOVED_SETTINGS) records it: at its default it resumes as
    before, with nothing said; on (or of another type: attn_window=false is no 0), one line naming it and the commit
    that still has it."""
    from pilegpt.removed import REMOVED_SETTINGS
    from pilegpt.train.run.folder import keep_initial_settings

    cfg = TrainConfig(data_dir="d", run_name="r")
    run_dir = older_run(tmp_path / "run", cfg, drop=())
    path = tmp_path / "run" / "config.json"
    record = json.loads(path.read_text())
    record["config"].update({k: default for k, (default, _) in REMOVED_SETTINGS.items()})
    path.write_text(json.dumps(record))
    check_same_model(cfg, run_dir, run_dir)
    assert keep_initial_settings(cfg, run_dir) == (cfg, None)
    for name, value in [*REMOVED_ON.items(), ("attn_window", False), ("doc_aligned", "yes"), ("attn_window", None)]:
        path.write_text(json.dumps({**record, "config": {**record["config"], name: value}}))
        for check in (check_same_model, lambda c, r, _: keep_initial_settings(c, r)):
            with pytest.raises(UserError) as e:
                check(cfg, run_dir, run_dir)
            assert str(e.value) == (f"{path}: {name} was removed after ac879ff (no preset used it; docs/performance.md "
                                    f"has its measurement): the run has {name}={value!r}; resume it with pile-gpt "
                                    "ac879ff")


def test_a_report_of_a_run_from_before_a_removed_setting_shows_it_when_it_was_on():
    settings = {**TrainConfig(data_dir="d").__dict__, "attn_window": 256, "zero_init_proj": False}
    assert [(k, v, d) for k, v, d in run_report.changed_settings(settings) if k != "data_dir"] == [
        ("attn_window", 256, 0)]


def with_model_args(path, payload: dict, model_args: dict) -> str:
    """The checkpoint file `payload` (an export, or a Composer checkpoint's shape) with these model_args, at path."""
    import torch

    if "state" in payload:
        payload["state"]["model"]["_extra_state"] = {"model_args": model_args}
    else:
        payload["model_args"] = model_args
    torch.save(payload, path)
    return str(path)


def test_a_checkpoint_s_model_args_with_a_removed_setting_load_at_its_default_and_are_one_line_when_on(tmp_path):
    """model_args from before a GPTConfig field was removed (attn_window; removed.REMOVED_SETTINGS): an export or a
    Composer checkpoint (eval.py, sample.py, export_hf.py, init_from) loads at its default, the same weights; on, one
    line naming it."""
    import torch

    from helpers import tiny_export
    from pilegpt.checkpoint import load_model_file

    export = torch.load(tiny_export(tmp_path), weights_only=True)
    args = export["model_args"]
    composer = {"state": {"model": {f"model.{k}": v for k, v in export["model"].items()}}}
    x = torch.randint(0, 50257, (1, 8))
    want = load_model_file(str(tmp_path / "model.pt"))(x)[0]
    for kind, payload in (("export", export), ("composer", composer)):
        old = with_model_args(tmp_path / f"{kind}.pt", payload, {**args, "attn_window": 0})
        torch.testing.assert_close(load_model_file(old)(x)[0], want, rtol=0, atol=0)
        on = with_model_args(tmp_path / f"{kind}_on.pt", payload, {**args, "attn_window": 8})
        with pytest.raises(UserError) as e:
            load_model_file(on)
        assert str(e.value) == (f"{on}: attn_window was removed after ac879ff (no preset used it; docs/performance.md "
                                "has its measurement): its model has attn_window=8; load it with pile-gpt ac879ff")


def test_a_model_class_run_lacks_the_gpts_settings_and_resumes(tmp_path):
    """A model_class run's config.json leaves out the GPT's own settings (used_settings): their absence is no change."""
    cfg = TrainConfig(data_dir="d", run_name="r", model_class="mypkg:Model", value_embeds=True)
    run_dir = older_run(tmp_path / "run", cfg, drop=())
    assert "value_embeds" not in json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    check_same_model(cfg, run_dir, run_dir)
    with pytest.raises(UserError, match="model_class='other:Model' \\(the run has 'mypkg:Model'\\)"):
        check_same_model(dataclasses.replace(cfg, model_class="other:Model"), run_dir, run_dir)


def test_a_resume_on_another_torch_is_said_in_one_line_and_never_refused(tmp_path):
    import torch

    from pilegpt.train.run.folder import other_torch_note, torch_history

    assert other_torch_note(str(tmp_path)) is None and torch_history(str(tmp_path)) == []  # no config.json yet
    record = tmp_path / "config.json"
    record.write_text(json.dumps({"config": {}, "torch": torch.__version__}))
    assert other_torch_note(str(tmp_path)) is None  # the same torch: nothing to say
    record.write_text(json.dumps({"config": {}, "torch": "2.6.0+cu124", "torch_earlier": ["2.5.1"]}))
    assert torch_history(str(tmp_path)) == ["2.5.1", "2.6.0+cu124"]
    note = other_torch_note(str(tmp_path))
    assert note == (f"resuming on torch {torch.__version__}; the run trained so far on torch 2.6.0+cu124 ({record}): "
                    "it goes on, but the numerics may differ from a run on one torch")
    for damaged in ("{", "[]", json.dumps({"torch": 7, "torch_earlier": "x"}), json.dumps({"torch_earlier": 3})):
        record.write_text(damaged)  # not this note's to refuse (check_same_model names a damaged config.json)
        assert other_torch_note(str(tmp_path)) is None


def test_the_report_names_the_torch_a_resumed_run_trained_on_before():
    from pilegpt.train.report import Metrics

    info = {"config": {"run_name": "r"}, "torch": "2.14.1", "torch_earlier": ["2.7.0+cu126"]}
    text = run_report.render(info, Metrics(), {}, {"config": "config.json", "metrics": "metrics.jsonl"}, None)
    assert "| torch | 2.14.1 |\n| other torch this run trained on | 2.7.0+cu126 |" in text
    assert "other torch this run trained on" not in run_report.render({"config": {}, "torch": "2.14.1"}, Metrics(), {},
                                                            {"config": "c", "metrics": "m"}, None)
