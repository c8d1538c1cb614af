"""fsdp=True on CPU (Composer's FSDP2 over gloo, pilegpt/train/fsdp.py), through `composer -n 2 train.py`: AdamW (its
gradient clipping active, its Blocks recomputed by activation_checkpointing) and config/nanochat.py's Muon train as
DDP does with the same global batch, loss for loss;
checkpoints are sharded folders; a SIGTERMed run autoresumes loss for loss, on 2 processes, then on 1 from a
2-process checkpoint and on 2 from a 1-process one; changing fsdp on autoresume is one line; eval.py scores the run's
folder as it scores the DDP run's."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import train
from e2e.test_preemption import SLOW, started, stopped_batch
from helpers import (
    ACROSS_PROCESS_COUNTS,
    REPO,
    SMALL,
    assert_same_losses,
    finish,
    losses_by_batch,
    main_error,
    read_jsonl,
    run_command,
    run_train,
    succeeded,
    wait_until,
)
from pilegpt.checkpoint import LATEST_CHECKPOINT, load_model_file
from pilegpt.train.run.preemption import PREEMPTED

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = str(REPO / "config" / "tiny.py")
ARGS = [*SMALL, "--device=cpu", "--sample_length=0", "--progress_bar=False", "--eval_interval=100ba",
        "--save_interval=3ba", "--max_duration=6ba", "--run_name=f"]
RECIPES = {  # grad_clip=0.05 clips every batch: gradients N times too large (gloo's sum) would clip to other losses
    "adamw": [TINY, "--grad_clip=0.05"],
    "nanochat": [TINY, str(REPO / "config" / "nanochat.py"), "--warmup=2ba", "--muon_momentum_warmup=2"],
}
# Like with like: both runs on 2 processes, one reducing gradients with DDP's all-reduce, the other with FSDP's
# reduce-scatter. Measured: 0.0 to 1.9e-6 over 12 batches of config/nanochat.py; 0.0 over these 6 for both recipes
# (PILEGPT_DRIFT_LOG). Longer, with clipping switching on and off, the two clip norms' float32 rounding shows:
# config/tiny.py reaches 1.1e-5 by batch 17 (docs/clusters.md#fsdp). ACROSS_PROCESS_COUNTS: 1e-5.
FSDP_VS_DDP = ACROSS_PROCESS_COUNTS


@pytest.fixture(scope="module")
def ddp(shakespeare_bin, tmp_path_factory):
    """ddp(recipe): the run folder of the recipe's 2-process DDP run (made once per recipe in this module)."""
    runs = {}

    def folder(recipe: str) -> Path:
        if recipe not in runs:
            runs[recipe] = tmp_path_factory.mktemp(f"ddp-{recipe}") / "run"
            succeeded(run_train([*RECIPES[recipe], f"--data_dir={shakespeare_bin}", *ARGS,
                                 f"--save_folder={runs[recipe]}"], runs[recipe].parent, nproc=2))
        return runs[recipe]

    return folder


@pytest.mark.parametrize("recipe", RECIPES)
def test_fsdp_trains_as_ddp_does_loss_for_loss(recipe, shakespeare_bin, tmp_path, ddp):
    run = tmp_path / "run"
    # AdamW's run recomputes its Blocks in the backward pass too: the losses stay DDP's
    recompute = ["--activation_checkpointing=True"] if recipe == "adamw" else []
    out = succeeded(run_train([*RECIPES[recipe], f"--data_dir={shakespeare_bin}", *ARGS, "--fsdp=True", *recompute,
                               f"--save_folder={run}"], tmp_path, nproc=2))
    if recipe == "nanochat":  # each rank orthogonalises its share, each matrix gathered whole on its rank alone
        assert "muon: this rank orthogonalises 5 of 9 matrices (5 shapes)\n" in out
    sharded, whole = losses_by_batch(run), losses_by_batch(ddp(recipe))
    assert sorted(sharded) == list(range(1, 7)) and sharded[6] < sharded[1] - 0.1  # it learns
    assert_same_losses(sharded, whole, range(1, 7), atol=FSDP_VS_DDP)
    for batch in (3, 6):  # each rank wrote its part of every checkpoint; no whole checkpoint file
        assert sorted(p.name for p in (run / f"ep0-ba{batch}").iterdir()) == [".metadata", "__0_0.distcp",
                                                                               "__1_0.distcp"]
    assert sorted(p.name for p in run.glob("*.pt")) == [LATEST_CHECKPOINT, "model.pt"]
    assert (run / LATEST_CHECKPOINT).resolve() == (run / "ep0-ba6").resolve()
    # sample.py, eval.py and export_hf.py read a sharded checkpoint's folder too (weights-only, in one process): the
    # weights of model.pt, written with it, bit for bit
    from_shards, export = load_model_file(str(run / "ep0-ba6")), load_model_file(str(run / "model.pt"))
    assert all(torch.equal(a, b) for a, b in zip(from_shards.state_dict().values(), export.state_dict().values()))
    assert from_shards.config == export.config
    # model.pt holds the whole weights (gathered from the shards): the DDP run's, within 1% of each tensor's largest
    # value (measured: 0.3%, nanochat's backout_lambda, which scalar_lr=0.5 moved from 0.2 to -0.64 in 6 batches)
    mine, theirs = load_model_file(str(run / "model.pt")), load_model_file(str(ddp(recipe) / "model.pt"))
    for (name, p), q in zip(mine.named_parameters(), theirs.parameters()):
        assert p.shape == q.shape and (p - q).abs().max() <= 1e-2 * q.abs().max() + 1e-6, name


def crash_to(run: Path, batch: int) -> None:
    """Make a sharded run folder look like its run died after its checkpoint at `batch`: the later ones gone."""
    for folder in run.glob("ep0-ba*"):
        if int(folder.name.split("-ba")[1]) > batch:
            shutil.rmtree(folder)
    (run / LATEST_CHECKPOINT).unlink()
    (run / LATEST_CHECKPOINT).symlink_to(f"ep0-ba{batch}")


def test_a_sigtermed_fsdp_run_resumes_loss_for_loss_on_two_processes_then_one_then_two(shakespeare_bin, tmp_path,
                                                                                       ddp, capsys):
    args = [*RECIPES["adamw"], f"--data_dir={shakespeare_bin}", *ARGS, "--fsdp=True", "--max_duration=9ba"]
    whole = tmp_path / "whole" / "runs" / "f"
    (tmp_path / "whole").mkdir()
    succeeded(run_train(args, tmp_path / "whole", nproc=2))
    want = losses_by_batch(whole)

    (tmp_path / "cut").mkdir()
    run = tmp_path / "cut" / "runs" / "f"
    proc = started(args, tmp_path / "cut", 2, SLOW)
    wait_until(lambda: (run / "metrics.jsonl").is_file() and any(r["batch"] >= 2 for r in read_jsonl(
        run / "metrics.jsonl")), proc, "batch 2")
    proc.send_signal(15)
    code, out = finish(proc, timeout=240)
    assert code == PREEMPTED, out[-4000:]
    stop = stopped_batch(out)
    assert 2 <= stop < 9 and (run / f"ep0-ba{stop}" / ".metadata").is_file(), out[-4000:]
    out = succeeded(run_train([*args, "--autoresume=True"], tmp_path / "cut", nproc=2))
    assert f"resuming from the checkpoint at batch {stop} " in out
    assert [r["batch"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r] == list(range(1, 10))
    assert_same_losses(losses_by_batch(run), want, range(1, 10), atol=1e-6)  # 2 processes as 2

    # fsdp=False cannot read sharded checkpoints: one line, before training
    save = [f"--save_folder={run}", "--autoresume=True"]
    line = main_error(train.main, [*args, *save, "--fsdp=False"], capsys, alone=False)
    assert "fsdp=False (the run has True)" in line and "another checkpoint format" in line, line

    crash_to(run, 3)  # a 2-process checkpoint, resumed by 1 process (its own: FSDP sets up torch.distributed)
    succeeded(run_train([*args, "--autoresume=True"], tmp_path / "cut"))
    assert_same_losses(losses_by_batch(run), want, range(4, 10), atol=ACROSS_PROCESS_COUNTS)
    assert sorted(p.name for p in (run / "ep0-ba6").iterdir()) == [".metadata", "__0_0.distcp"]
    crash_to(run, 6)  # a 1-process checkpoint, resumed by 2
    succeeded(run_train([*args, "--autoresume=True"], tmp_path / "cut", nproc=2))
    assert_same_losses(losses_by_batch(run), want, range(7, 10), atol=ACROSS_PROCESS_COUNTS)


def test_eval_py_scores_an_fsdp_run_folder_as_the_ddp_runs(shakespeare_bin, tmp_path, ddp):
    run = tmp_path / "run"
    succeeded(run_train([*RECIPES["adamw"], f"--data_dir={shakespeare_bin}", *ARGS, "--fsdp=True",
                         f"--save_folder={run}"], tmp_path, nproc=2))
    scores = []
    for folder in (run, ddp("adamw")):
        out = tmp_path / f"{folder.parent.name}.json"
        succeeded(run_command([sys.executable, REPO / "eval.py", folder, "--task", "hellaswag", "--data",
                               REPO / "tests" / "fixtures" / "hellaswag_tiny.jsonl", "--out", out], tmp_path))
        scores.append(json.loads(out.read_text()))
    fsdp_run, ddp_run = scores
    assert fsdp_run["task"] == "hellaswag" and fsdp_run["n"] == ddp_run["n"] > 0
    for key in ("acc", "acc_norm"):
        assert fsdp_run[key] == ddp_run[key], (key, scores)
