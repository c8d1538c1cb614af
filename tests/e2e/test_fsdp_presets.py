"""config/pile_1.3b.py + config/modern.py, the preset a 1.3B run starts from (fsdp=True, Muon, the modern model), with
its shape and batch shrunk on the command line and a tests fixture for data, through `composer -n 2 train.py` on CPU:
it trains, writes sharded checkpoints, resumes loss for loss, evaluates in training and by eval.py."""

import json
import shutil
import sys

import pytest
import torch

from e2e.test_fsdp import crash_to
from helpers import REPO, assert_same_losses, losses_by_batch, read_jsonl, run_command, run_train, succeeded
from pilegpt.checkpoint import LATEST_CHECKPOINT, load_model_file
from pilegpt.hellaswag import accuracy, evaluate, load_examples
from pilegpt.tokenizer import gpt2

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PRESET = [str(REPO / "config" / "pile_1.3b.py"), str(REPO / "config" / "modern.py")]
# What only the shape and the machine change; everything else is the preset's (fsdp, Muon and its rates, the modern
# model, vocab_size 50304, grad_clip, autoresume, the schedule's shape)
SHRUNK = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--global_batch_size=4",
          "--device_train_microbatch_size=1", "--device_eval_batch_size=2", "--max_duration=6ba", "--warmup=2ba",
          "--device=cpu", "--num_workers=0", "--hellaswag_examples=0", "--eval_interval=3ba",
          "--eval_subset_num_batches=2", "--save_interval=3ba", "--sample_length=0", "--log_interval=1",
          "--run_name=big"]
HELLASWAG = REPO / "tests" / "fixtures" / "hellaswag_tiny.jsonl"


def test_the_1_3b_preset_with_modern_trains_resumes_and_evaluates_under_fsdp_on_two_processes(shakespeare_mds,
                                                                                                tmp_path):
    run = tmp_path / "run"
    args = [*PRESET, *SHRUNK, f"--data_remote={shakespeare_mds}", f"--data_local={tmp_path / 'cache'}"]
    out = succeeded(run_train([*args, f"--save_folder={run}"], tmp_path, nproc=2))
    config = json.loads((run / "config.json").read_text())["config"]  # the preset's choices, as the run used them
    assert (config["fsdp"], config["optimizer"], config["pos_emb"], config["vocab_size"], config["n_embd"]) == (
        True, "muon", "rope", 50304, 32), config
    assert "muon: this rank orthogonalises" in out  # each rank its share of the matrices, gathered whole alone
    losses = losses_by_batch(run)
    assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1] - 0.1, losses  # it learns
    for batch in (3, 6):  # each rank wrote its part of each checkpoint
        assert sorted(p.name for p in (run / f"ep0-ba{batch}").iterdir()) == [".metadata", "__0_0.distcp",
                                                                               "__1_0.distcp"]
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if "val_loss" in r]
    assert [r["batch"] for r in evals] == [3, 6] and evals[1]["val_loss"] < evals[0]["val_loss"], evals

    resumed = tmp_path / "resumed"  # the run stopped after its checkpoint of batch 3, resumed on 2 processes
    shutil.copytree(run, resumed, symlinks=True)
    crash_to(resumed, 3)
    (resumed / "metrics.jsonl").unlink()
    out = succeeded(run_train([*args, f"--save_folder={resumed}"], tmp_path, nproc=2))  # the preset's autoresume
    assert "resuming from the checkpoint at batch 3 " in out, out[-3000:]
    assert_same_losses(losses_by_batch(resumed), losses, range(4, 7), atol=1e-6)
    assert (resumed / LATEST_CHECKPOINT).resolve() == (resumed / "ep0-ba6").resolve()

    # eval.py scores the run folder (its model.pt, the weights gathered from the shards) as this process scores it
    scores = tmp_path / "hellaswag.json"
    succeeded(run_command([sys.executable, REPO / "eval.py", run, "--task", "hellaswag", "--data", HELLASWAG,
                           "--out", scores, "--device", "cpu"], tmp_path))
    got = json.loads(scores.read_text())
    model = load_model_file(str(run / "model.pt"))
    acc, acc_norm = accuracy(evaluate(model, load_examples(str(HELLASWAG)), gpt2(), torch.device("cpu")))
    assert got["n"] == len(load_examples(str(HELLASWAG))) > 0 and (got["acc"], got["acc_norm"]) == (acc, acc_norm)
