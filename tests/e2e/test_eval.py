"""eval.py across processes and through its command line: 2 processes (`composer -n 2`) count what 1 counts, no
data offline is one line; training reports val bpb, named eval sets and HellaSwag as eval.py scores them; the
lm-evaluation-harness agrees with eval.py on every example. The scoring itself: tests/unit/test_eval.py."""

import json
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eval as eval_script
from helpers import (
    HELLASWAG_TINY,
    REPO,
    SMALL,
    failed_with_one_line,
    free_port,
    offline_hf_export,
    read_jsonl,
    run_command,
    shakespeare_tokens,
    succeeded,
    train_main,
    write_bin,
    write_core_bundle,
)
from pilegpt.checkpoint import load_model
from pilegpt.data import read_windows, window_starts
from pilegpt.tokenizer import gpt2


@pytest.mark.parametrize("task", ["hellaswag", "core"])
def test_two_processes_count_what_one_counts(model_file, tmp_path, capsys, task):
    """The items split over 2 ranks (every world-th) and gathered: the same predictions, in the same order, as one
    process, and so the same accuracy (HellaSwag) or CORE."""
    outs = {}
    data = ["--data", HELLASWAG_TINY, "--limit", "30"] if task == "hellaswag" else [
        "--data", write_core_bundle(tmp_path / "bundle"), "--max-per-task", "5"]
    args = [model_file, "--task", task, *data]
    assert eval_script.main([*map(str, args), "--out", str(tmp_path / "r1.json")]) == 0  # 1: this process
    succeeded(run_command([sys.executable, "-m", "composer.cli.launcher", "-n", "2", REPO / "eval.py", *args, "--out",
                           tmp_path / "r2.json"], tmp_path))
    for n in (1, 2):
        outs[n] = json.loads((tmp_path / f"r{n}.json").read_text())
    assert outs[1]["n"] == outs[2]["n"] == (30 if task == "hellaswag" else 5 + 5 + 5 + 4)  # CORE_BUNDLE: lm has 4 rows
    assert outs[1]["predictions"] == outs[2]["predictions"]
    if task == "core":
        assert outs[1]["core"] == outs[2]["core"] and outs[1]["tasks"] == outs[2]["tasks"]


def test_a_bad_line_only_rank_1_reads_exits_2_on_every_rank(model_file, tmp_path):
    """Pile document 3 is rank 1's (of 2) alone: every rank reads every line before scoring and they agree, so each
    exits 2 with the line's error; not the 143 (a preemption's status) of rank 0 ended by the launcher's SIGTERM.
    Under Composer's launcher, where the 143 was seen; pilegpt.launch gives the first failing rank's status
    (test_launch_status.py), so every rank's 2 is 2 there too."""
    lines = [json.dumps({"text": f"document {i}", "meta": {"pile_set_name": "A"}}) for i in range(6)]
    lines[3] = "{not json"
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    code, out = run_command([sys.executable, "-m", "composer.cli.launcher", "-n", "2", REPO / "eval.py", model_file,
                             "--task", "pile", "--data", tmp_path / "bad.jsonl"], tmp_path, env)
    assert code == 2, out[-3000:]
    errors = {line for line in out.splitlines() if line.startswith("error: ")}
    assert errors == {f"error: {tmp_path / 'bad.jsonl'}:4: not a JSON object (Expecting property name enclosed in "
                      "double quotes: line 1 column 2 (char 1)); each line of a Pile file is one document"}, out[-3000:]
    assert "Traceback" not in out


def test_offline_without_data_is_one_line_naming_the_fix(model_file, tmp_path):
    result = run_command([sys.executable, REPO / "eval.py", model_file, "--task", "hellaswag", "--url",
                          f"http://127.0.0.1:{free_port()}/hellaswag_val.jsonl"],
                         env={**os.environ, "PILE_GPT_CACHE": str(tmp_path)}, timeout=120)
    error = failed_with_one_line(result, alone=True)
    assert error.startswith("error: cannot download HellaSwag from http://127.0.0.1:") and "--data FILE" in error


def test_training_reports_bpb_named_eval_sets_and_hellaswag_as_eval_py_scores_it(tmp_path, monkeypatch, capsys):
    """One tiny run (in this process): val_bpb equals an independent computation over the same val windows, a named
    eval set gets its own figures (one of <|endoftext|> only: its loss, and no bpb: null, none), and the in-training
    HellaSwag and CORE figures equal eval.py's on the exported weights; report.md shows the run's CORE."""
    tokens = shakespeare_tokens()
    bundle = write_core_bundle(tmp_path / "bundle")
    write_bin(tmp_path / "data", tokens[:20_000])
    write_bin(tmp_path / "other", tokens[100_000:110_000])
    write_bin(tmp_path / "blank", {"train": tokens[:2_000], "val": np.full(200, gpt2().eot_token)})  # no bytes
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    train_main([*SMALL, f"--data_dir={tmp_path / 'data'}", "--max_duration=4ba", "--eval_interval=4ba",
                "--eval_subset_num_batches=-1", "--progress_bar=False", "--save_folder=run", "--sample_length=0",
                f"--eval_data={{'other': {str(tmp_path / 'other')!r}, 'blank': {str(tmp_path / 'blank')!r}}}",
                "--hellaswag_examples=20",
                f"--hellaswag_data={HELLASWAG_TINY}", "--core_examples=4", f"--core_data={bundle}"])
    out = capsys.readouterr().out
    row = read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]
    assert {"val_loss", "val_bpb", "other_loss", "other_bpb", "hellaswag_acc", "hellaswag_acc_norm", "core"} <= set(row)
    assert f"hellaswag acc {row['hellaswag_acc']:.4f}" in out and f"other loss {row['other_loss']:.4f}" in out
    assert f"core {row['core']:.4f}" in out
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"| this run, batch 4 (the first 4 of each task, in training) | {row['core']:.4f} |" in report
    # an eval set of <|endoftext|> only stands for no bytes: no bpb (null, none), never 0.0000
    assert row["blank_bpb"] is None and '"blank_bpb": null' in (tmp_path / "run" / "metrics.jsonl").read_text()
    assert f"blank loss {row['blank_loss']:.4f} bpb none" in out
    assert f"| blank | {row['blank_loss']:.4f} | none (no bytes) | 4 |" in report

    model = load_model(str(tmp_path / "run" / "model.pt"))
    enc = gpt2()
    for label, folder in (("val", "data"), ("other", "other"), ("blank", "blank")):
        val = np.fromfile(tmp_path / folder / "val.bin", dtype=np.uint16)
        x, y = read_windows(val, window_starts(len(val), 32), 32)
        with torch.no_grad():
            logits, _ = model(torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))
        losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)).double(), torch.from_numpy(
            y.reshape(-1).astype(np.int64)), reduction="none")
        nbytes = torch.tensor([0 if t == enc.eot_token else len(enc.decode_single_token_bytes(int(t)))
                               for t in y.reshape(-1)])
        assert math.isclose(row[f"{label}_loss"], float(losses.mean()), rel_tol=1e-5)
        if label == "blank":
            assert nbytes.sum() == 0 and row["blank_bpb"] is None
            continue
        bpb = float(losses[nbytes > 0].sum() / math.log(2) / nbytes.sum())
        assert math.isclose(row[f"{label}_bpb"], bpb, rel_tol=1e-5), (label, row[f"{label}_bpb"], bpb)

    assert eval_script.main([str(tmp_path / "run" / "model.pt"), "--task", "hellaswag", "--data", str(HELLASWAG_TINY),
                             "--limit", "20", "--out", str(tmp_path / "h.json")]) == 0
    scored = json.loads((tmp_path / "h.json").read_text())
    assert (scored["acc"], scored["acc_norm"]) == (row["hellaswag_acc"], row["hellaswag_acc_norm"])
    assert eval_script.main([str(tmp_path / "run" / "model.pt"), "--task", "core", "--data", str(bundle),
                             "--max-per-task", "4", "--out", str(tmp_path / "c.json")]) == 0
    assert math.isclose(json.loads((tmp_path / "c.json").read_text())["core"], row["core"], rel_tol=1e-12)


def test_lm_evaluation_harness_agrees_with_eval_py_on_every_example(tmp_path, monkeypatch):
    """lm-eval (requirements-eval.txt) through its Python API, offline, on the export_hf folder, with a local task in
    HellaSwag's format rendered as ours (context, then " " + ending): its acc is ours, example by example."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    offline_hf_export(tmp_path, monkeypatch, seed=5, block_size=128)
    data = tmp_path / "task" / "data.jsonl"
    data.parent.mkdir()
    data.write_text("\n".join(HELLASWAG_TINY.read_text().splitlines()[:24]) + "\n")
    (tmp_path / "task" / "tiny_hellaswag.yaml").write_text(
        "task: tiny_hellaswag\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{{{ctx}}}}\"\n"
        "doc_to_target: \"{{label}}\"\ndoc_to_choice: \"{{endings}}\"\ntarget_delimiter: \" \"\n"
        "metric_list:\n  - metric: acc\n")
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'hf'}", tasks=["tiny_hellaswag"],
                                      task_manager=TaskManager(include_path=str(tmp_path / "task")), log_samples=True,
                                      batch_size=4, device="cpu")
    theirs = {s["doc_id"]: s["acc"] for s in results["samples"]["tiny_hellaswag"]}
    assert eval_script.main([str(tmp_path / "model.pt"), "--task", "hellaswag", "--data", str(data), "--out",
                             str(tmp_path / "ours.json")]) == 0
    ours = {p["ind"]: float(p["pred"] == p["label"]) for p in json.loads((tmp_path / "ours.json").read_text())[
        "predictions"]}
    assert len(ours) == 24 and theirs == ours
