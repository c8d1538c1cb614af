"""The pipeline on the torch installed here, each stage through its command line, with a kill in the middle: text ->
prepare_data.py -> to_mds.py -> `composer -n 2 train.py` SIGKILLed halfway through its checkpoint of batch 6 -> the
same command with --autoresume=True, from batch 3's, as if on another torch (config.json's record changed) ->
eval.py on the export. .ci/run also runs it in its second environment (Python 3.12, the newest torch, make
install-keep-torch), where the torch differs from 2.7.0."""

import json
import math

import numpy as np

from helpers import (
    HELLASWAG_TINY,
    REPO,
    SMALL,
    assert_same_losses,
    read_jsonl,
    run_command,
    run_train,
    script,
    shakespeare_docs,
    succeeded,
    write_jsonl,
)

RESUME_ATOL = 1e-6  # the same 2 processes before and after the kill: the same sums (test_preemption measures 0.0)


def test_text_to_mds_to_two_processes_killed_and_resumed_to_eval(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", shakespeare_docs(1500))
    tokens, mds, run_dir = tmp_path / "tokens", tmp_path / "mds", tmp_path / "run"
    succeeded(run_command(script("prepare_data.py", "--input", corpus, "--out-dir", tokens, "--val-fraction", 0.1)))
    meta = json.loads((tokens / "meta.json").read_text())
    succeeded(run_command(script("to_mds.py", "--bin", tokens, "--out", mds, "--block-size", 32)))
    n_train = (meta["splits"]["train"]["tokens"] - 1) // 32
    index = json.loads((mds / "train" / "index.json").read_text())
    assert sum(shard["samples"] for shard in index["shards"]) == n_train > 9 * 4

    args = [REPO / "config" / "tiny.py", f"--data_dir={mds}", *SMALL, "--max_duration=9ba", "--save_interval=3ba",
            "--eval_interval=9ba", "--eval_subset_num_batches=2", f"--save_folder={run_dir}", "--device=cpu",
            "--sample_length=0", "--progress_bar=False", f"--hellaswag_data={HELLASWAG_TINY}",
            "--hellaswag_examples=16"]
    code, out = run_train([*args, "--callbacks={'faults:KillDuringCheckpoint': {'batch': 6}}"], tmp_path, nproc=2)
    assert code != 0 and "Rank 0 crashed with exit code -9" in out, out[-4000:]
    before = read_jsonl(run_dir / "metrics.jsonl")
    first = {r["batch"]: r["loss"] for r in before if "loss" in r}
    assert sorted(first) == [1, 2, 3, 4, 5], out[-4000:]  # batch 6's row follows its checkpoint, cut by the kill

    record = json.loads((run_dir / "config.json").read_text())  # as if the run had begun on another torch
    (run_dir / "config.json").write_text(json.dumps({**record, "torch": "2.6.0+before"}))

    out = succeeded(run_train([*args, "--autoresume=True"], tmp_path, nproc=2))
    assert "resuming from the checkpoint at batch 3 " in out and "done: 6 batches" in out
    assert out.count(f"resuming on torch {record['torch']}; the run trained so far on torch 2.6.0+before") == 1
    assert json.loads((run_dir / "config.json").read_text())["torch_earlier"] == ["2.6.0+before"]
    report = (run_dir / "report.md").read_text()
    assert f"| torch | {record['torch']} |\n| other torch this run trained on | 2.6.0+before |" in report
    rows = read_jsonl(run_dir / "metrics.jsonl")
    resumed = {r["batch"]: r["loss"] for r in rows[len(before):] if "loss" in r}
    assert sorted(resumed) == [4, 5, 6, 7, 8, 9]
    assert_same_losses(resumed, first, [4, 5], atol=RESUME_ATOL)  # the kill changed nothing
    assert all(math.isfinite(v) for v in resumed.values()) and resumed[9] < first[1]
    assert rows[-1]["tokens"] == 9 * 4 * 32 and 0 < rows[-1]["val_loss"] < math.log(50257)
    assert json.loads((run_dir / "config.json").read_text())["world_size"] == 2

    # eval.py scores the export as training scored it at batch 9 (the same 16 examples, the same weights)
    scores = tmp_path / "hellaswag.json"
    succeeded(run_command(script("eval.py", run_dir / "model.pt", "--task", "hellaswag", "--data", HELLASWAG_TINY,
                                 "--limit", 16, "--device", "cpu", "--out", scores)))
    scored = json.loads(scores.read_text())
    assert (scored["acc"], scored["acc_norm"]) == (rows[-1]["hellaswag_acc"], rows[-1]["hellaswag_acc_norm"])
    assert np.isclose(scored["acc"] * 16, round(scored["acc"] * 16))
