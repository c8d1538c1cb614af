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
import train
from helpers import (
    FIXTURES,
    SMALL,
    assert_same_losses,
    failed_with_one_line,
    losses_by_batch,
    main_error,
    read_jsonl,
    run_train,
    succeeded,
    train_main,
    train_output,
)

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


CONTRACT = [*SMALL, "--device=cpu", "--progress_bar=False", "--eval_interval=100ba", "--sample_length=0",
            "--save_interval=2ba", "--run_name=contract"]


def test_model_args_with_a_tuple_resume_as_they_were_saved(random_bin, tmp_path, capsys):
    # config.json holds (16, 16) as [16, 16]: the comparison on resume is in that saved form
    args = [f"--data_dir={random_bin}", *CONTRACT, f"--save_folder={tmp_path / 'run'}",
            "--model_class=contract_models:Widths", "--model_args={'widths': (16, 16)}"]
    train_main([*args, "--max_duration=2ba"])
    out = succeeded(run_train([*args, "--max_duration=4ba", "--autoresume=True"], tmp_path))
    assert "resuming from the checkpoint at batch 2 " in out and "done: 2 batches" in out
    widths = json.loads((tmp_path / "run" / "config.json").read_text())["config"]["model_args"]["widths"]
    assert widths == [16, 16]
    changed = main_error(train.main, [*args[:-1], "--model_args={'widths': (16, 8)}", "--max_duration=6ba",
                                      "--autoresume=True"], capsys, alone=False)  # in this process: one start-up fewer
    assert "are of another model: model_args={'widths': (16, 8)} (the run has {'widths': [16, 16]})" in changed


def test_model_args_that_json_cannot_hold_are_refused_before_anything_is_written(random_bin, tmp_path, capsys):
    run_dir = tmp_path / "run"
    line = main_error(train.main, [f"--data_dir={random_bin}", *CONTRACT, f"--save_folder={run_dir}",
                                   "--max_duration=2ba", "--model_class=contract_models:Widths",
                                   "--model_args={'widths': {16}}"], capsys, alone=False)
    assert line == (
        "error: bad config: model_args={'widths': {16}} cannot be saved in config.json and the checkpoints (Object of "
        "type set is not JSON serializable): use numbers, strings, lists and dicts")
    assert not run_dir.exists()


def test_gpt_settings_beside_a_model_class_are_named_as_unused_and_not_recorded(random_bin, tmp_path, capsys):
    run_dir = tmp_path / "run"
    out = train_output([f"--data_dir={random_bin}", *CONTRACT, f"--save_folder={run_dir}", "--max_duration=1ba",
                        f"--model_class={MY_GPT}", "--n_layer=7", "--qk_norm=True", "--pos_emb=rope"], capsys)
    assert ("note: model_class=examples.my_model:MyGPT: n_layer=7, n_head=2, n_embd=32, pos_emb='rope', qk_norm=True "
            "shape model.py's GPT only and are not used (config.json leaves them out); MyGPT takes n_layer, n_head, "
            "n_embd: set them in model_args") in out.splitlines()
    recorded = json.loads((run_dir / "config.json").read_text())["config"]
    assert not {"n_layer", "n_head", "n_embd", "pos_emb", "qk_norm", "dropout"} & set(recorded)
    assert (recorded["model_class"], recorded["block_size"]) == (MY_GPT, 32)
    assert "  n_layer " not in out and "  model_class " in out  # the start-up list of settings: the same ones


@pytest.mark.parametrize("name, error", [
    ("SixteenPositions", "model_class: contract_models:SixteenPositions.forward(idx, targets) failed on a (1, 32) "
                         "batch: IndexError: index out of range in self (block_size: fix "
                         "contract_models:SixteenPositions.forward for the run's sequences or lower --block_size)"),
    ("LastSixteen", "model_class: contract_models:LastSixteen.forward(idx, targets) must return logits (B, T, V) and "
                    "a scalar loss; on a (1, 32) batch they were (1, 16, 50257) and () (block_size: fix "
                    "contract_models:LastSixteen.forward for the run's sequences or lower --block_size)"),
    ("OneDHidden", "optimizer='muon': OneDHidden.hidden_matrices() must return some of the model's own trainable 2-D "
                   "weights: item 1 is 1-D (16,); fix the method or set optimizer='adamw'"),
    ("ForeignHidden", "optimizer='muon': ForeignHidden.hidden_matrices() must return some of the model's own "
                      "trainable 2-D weights: item 0 is not a trainable parameter of the model; fix the method or "
                      "set optimizer='adamw'"),
    ("NoHidden", "optimizer='muon': NoHidden.hidden_matrices() must return some of the model's own trainable 2-D "
                 "weights: it returned no parameters (Muon would update nothing); fix the method or set "
                 "optimizer='adamw'"),
    ("FailingHidden", "optimizer='muon': FailingHidden.hidden_matrices() failed: AttributeError: 'FailingHidden' "
                      "object has no attribute 'blocks'"),
])
def test_a_model_that_breaks_the_contract_at_block_size_or_in_hidden_matrices_is_one_line(random_bin, tmp_path,
                                                                                          capsys, name, error):
    run_dir = tmp_path / "run"
    args = [f"--data_dir={random_bin}", *CONTRACT, f"--save_folder={run_dir}", "--max_duration=2ba",
            f"--model_class=contract_models:{name}", "--model_args={'widths': (16, 16)}", "--optimizer=muon"]
    if name == "SixteenPositions":  # through the command line once; the others in this process, as it runs them
        assert failed_with_one_line(run_train(args, tmp_path)) == f"error: {error}"
    else:
        assert main_error(train.main, args, capsys, alone=False) == f"error: {error}"
    assert not list(run_dir.glob("ep*"))
