"""examples/my_model.py, a model of the user's own, through the whole pipeline: it trains (with evaluation and
HellaSwag), a run SIGKILLed mid-checkpoint resumes loss for loss against one never stopped, and sample.py and eval.py
rebuild it only with --model-class. Two runs of 6 tiny batches, shared by the tests; the killed one is the only
command line (its kill is what is tested), the others run in this process."""

import contextlib
import io
import json
import signal

import pytest

import eval as eval_script
import sample
from helpers import FIXTURES, SMALL, assert_same_losses, losses_by_batch, main_error, read_jsonl, run_train, train_main

MY_GPT = "examples.my_model:MyGPT"
ARGS = [*SMALL, "--device=cpu", "--progress_bar=False", "--eval_interval=3ba", "--eval_subset_num_batches=1",
        "--save_interval=3ba", "--max_duration=6ba", "--run_name=mine", "--hellaswag_examples=4",
        f"--hellaswag_data={FIXTURES / 'hellaswag_tiny.jsonl'}", f"--model_class={MY_GPT}",
        "--model_args={'block_size': 32, 'n_layer': 2, 'n_head': 2, 'n_embd': 32}"]


@pytest.fixture(scope="module")
def runs(random_bin, tmp_path_factory):
    """(the run never stopped, the run killed while writing its batch-6 checkpoint and resumed, the resume's output)."""
    root = tmp_path_factory.mktemp("custom")
    whole, killed = root / "whole", root / "killed"
    train_main([f"--data_dir={random_bin}", *ARGS, f"--save_folder={whole}"])
    args = [f"--data_dir={random_bin}", *ARGS, f"--save_folder={killed}"]
    code, out = run_train([*args, "--callbacks={'faults:KillDuringCheckpoint': {'batch': 6}}"], root)
    assert code == -signal.SIGKILL, out[-3000:]
    assert f"model_class={MY_GPT}: " in out and "it has no flops_per_token(): MFU is not reported" in out
    with contextlib.redirect_stdout(io.StringIO()) as resumed:
        train_main([*args, "--autoresume=True"])
    return whole, killed, resumed.getvalue()


def test_my_model_killed_mid_checkpoint_resumes_loss_for_loss(runs):
    whole, killed, resumed = runs
    assert "resuming from ep0-ba3-rank0.pt" in resumed and "resumed at batch 3" in resumed
    expected, got = losses_by_batch(whole), losses_by_batch(killed)
    assert sorted(got) == sorted(expected) == list(range(1, 7))
    assert_same_losses(got, expected, range(1, 7), atol=1e-6)
    assert expected[6] < expected[1]  # it learns
    record = json.loads((killed / "config.json").read_text())["config"]
    assert record["model_class"] == MY_GPT and record["model_args"]["n_embd"] == 32


def test_sample_py_rebuilds_it_only_with_model_class(runs, capsys):
    whole = runs[0]
    error = main_error(sample.main, ["--checkpoint", whole, "--device", "cpu"], capsys)
    assert error == (f"error: {whole / 'model.pt'} holds your own model {MY_GPT}: pass --model-class {MY_GPT} to "
                     "rebuild it (a class named in a file is never imported)")
    for source in (whole, whole / "ep0-ba6-rank0.pt"):  # the export and the Composer checkpoint: the same text
        assert sample.main(["--checkpoint", str(source), "--model-class", MY_GPT, "--device", "cpu",
                            "--max-new-tokens", "6", "--num-samples", "2", "--top-k", "5"]) == 0
    out = capsys.readouterr().out.split(f"{sample.SEPARATOR}\n")
    assert len(out) == 5 and out[:2] == out[2:4] and out[0] != out[1]


def test_eval_py_scores_it_with_model_class_as_training_did(runs, tmp_path, capsys):
    whole = runs[0]
    row = [r for r in read_jsonl(whole / "metrics.jsonl") if "hellaswag_acc" in r][-1]
    assert eval_script.main([str(whole), "--task", "hellaswag", "--data", str(FIXTURES / "hellaswag_tiny.jsonl"),
                             "--limit", "4", "--device", "cpu", "--model-class", MY_GPT,
                             "--out", str(tmp_path / "h.json")]) == 0
    scored = json.loads((tmp_path / "h.json").read_text())
    assert scored["n"] == 4 and (scored["acc"], scored["acc_norm"]) == (row["hellaswag_acc"], row["hellaswag_acc_norm"])
