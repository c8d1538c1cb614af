"""eval.py --task pile against the field's implementation: lm-evaluation-harness, offline, on the export_hf folder,
with local tasks in the pile_* tasks' format (one per component), gives our bits per byte per component. The scoring
itself: tests/unit/test_pile_bpb.py."""

import json

import pytest

import eval as eval_script
from helpers import failed_with_one_line, fake_run_folder, offline_hf_export, run_command, script, succeeded
from tests.unit.test_pile_bpb import pile_documents, write_pile

# lm-eval's pile_* task (lm_eval/tasks/pile/pile_arxiv.yaml, 0.4.13) on a local file instead of EleutherAI/pile.
TASK = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
    aggregation: bits_per_byte
    higher_is_better: false
"""


def test_lm_evaluation_harness_bits_per_byte_equal_eval_py_per_component(tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    offline_hf_export(tmp_path, monkeypatch, seed=6, block_size=64)
    records = [r for r in pile_documents() if r["text"]]  # the harness's json loader has nothing to score in ""
    write_pile(tmp_path / "test.jsonl.zst", records)
    tasks = {}
    (tmp_path / "task").mkdir()
    for name in sorted({r["meta"]["pile_set_name"] for r in records}):
        task = "tiny_pile_" + "".join(c for c in name.lower() if c.isalnum())
        data = tmp_path / "task" / f"{task}.jsonl"
        write_pile(data, [r for r in records if r["meta"]["pile_set_name"] == name])
        (tmp_path / "task" / f"{task}.yaml").write_text(TASK.format(task=task, data=data))
        tasks[task] = name
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'hf'}", tasks=list(tasks),
                                      task_manager=TaskManager(include_path=str(tmp_path / "task")), batch_size=4,
                                      device="cpu")
    assert eval_script.main([str(tmp_path / "model.pt"), "--task", "pile", "--data", str(tmp_path / "test.jsonl.zst"),
                             "--out", str(tmp_path / "ours.json")]) == 0
    ours = json.loads((tmp_path / "ours.json").read_text())
    assert len(tasks) == len(ours["components"]) == 3 and ours["documents"] == len(records)
    for task, name in tasks.items():
        theirs = results["results"][task]["bits_per_byte,none"]
        assert ours["components"][name]["bpb"] == pytest.approx(theirs, rel=1e-4), (name, theirs)


def test_a_component_of_only_empty_documents_has_no_bpb_and_a_lone_surrogate_is_file_and_line(tmp_path):
    """Through the command line: a component whose every document is empty is reported with its count and no bpb
    (not a perfect 0.0), and in report.py's table; a file of only empty documents is one line; a JSON "\\ud800"
    escape in a text is one line naming file:line."""
    import report

    fake_run_folder(tmp_path / "run")
    model = tmp_path / "run" / "model.pt"
    records = [r for r in pile_documents() if r["text"]] + [{"text": "", "meta": {"pile_set_name": "Empty"}}] * 2
    write_pile(tmp_path / "val.jsonl", records)
    out = succeeded(run_command(script("eval.py", model, "--task", "pile", "--data", tmp_path / "val.jsonl",
                                       "--out", tmp_path / "run" / "pile.json")))
    assert "pile: Empty                bpb none   (2 documents, all empty: no bytes to score)" in out
    result = json.loads((tmp_path / "run" / "pile.json").read_text())
    assert result["components"]["Empty"] == {"bpb": None, "documents": 2, "bytes": 0, "tokens": 0}
    assert result["bpb"] > 0 and result["documents"] == len(records)
    report.main([str(tmp_path / "run")])
    assert "| Empty | 2 | none (all empty) |  |  |  |  |" in (tmp_path / "run" / "report.md").read_text()  # not Pile
    write_pile(tmp_path / "empty.jsonl", records[-2:])
    line = failed_with_one_line(run_command(script("eval.py", model, "--task", "pile", "--data",
                                                   tmp_path / "empty.jsonl")))
    assert f"{tmp_path / 'empty.jsonl'}: its 2 documents are all empty, no bytes to score" in line
    (tmp_path / "bad.jsonl").write_text(json.dumps(records[0]) + "\n" + '{"text": "a \\ud800 b", "meta": '
                                        '{"pile_set_name": "ArXiv"}}\n')
    line = failed_with_one_line(run_command(script("eval.py", model, "--task", "pile", "--data",
                                                   tmp_path / "bad.jsonl")))
    assert line == (f"error: {tmp_path / 'bad.jsonl'}:2: the text holds a lone surrogate ('\\ud800' at character 3), "
                    "which is not Unicode text and has no UTF-8 bytes to score; fix or remove that line")
