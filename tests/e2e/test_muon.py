"""train.py with optimizer="muon" on CPU: interrupted and resumed, in one process and in two (`composer -n 2`), it
gives the losses of the run that was never interrupted, batch for batch, so Muon's momentum (and its warmup's step
count) travels in the checkpoint and every rank takes the same step; the plain reference loop gives them too.
Muon's parts: tests/unit/test_muon.py."""

import numpy as np
import pytest

import train
from e2e.test_train import assert_resumed_where_it_stopped, callbacks, simulate_crash_after
from helpers import (
    ACROSS_PROCESS_COUNTS,
    REPO,
    SMALL,
    assert_same_losses,
    checkpoint_state,
    losses_by_batch,
    read_jsonl,
    run_train,
    succeeded,
)
from pilegpt.checkpoint import load_model_file
from pilegpt.train import plain_loop
from pilegpt.train.config_load import load_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the runs in this process, as train_env's subprocesses


def test_a_muon_run_resumes_loss_for_loss_in_one_process_and_in_two(shakespeare_bin, tmp_path, capsys):
    run_dir = tmp_path / "run"
    # with the options of the 2026 recipes on (docs/performance.md#recipes) and the parts' own AdamW rates, cut in the
    # middle of the warmup
    args = [str(REPO / "config" / "tiny.py"), f"--data_dir={shakespeare_bin}", *SMALL, "--optimizer=muon",
            "--muon_momentum_warmup=4", "--muon_cautious_wd=True", "--muon_normuon=True",
            "--x0_scalars=True", "--tie_embeddings=False", "--embedding_lr=0.01", "--head_lr=0.006",
            "--max_duration=6ba", "--save_interval=3ba", "--eval_interval=100ba", "--sample_length=0",
            "--progress_bar=False", f"--save_folder={run_dir}", "--device=cpu", callbacks(run_dir)]
    train.main(args)  # the run that is never interrupted: 1 process, this one
    assert "muon: this rank orthogonalises 8 of 8 matrices (4 shapes)\n" in capsys.readouterr().out
    whole = losses_by_batch(run_dir)
    assert sorted(whole) == [1, 2, 3, 4, 5, 6] and whole[6] < whole[1] - 0.1  # it learns
    # the step lines' lr is learning_rate's curve (AdamW's groups; the first is the gains' here, as the parts emptied
    # the 2-D one), muon_lr Muon's: after 2 warmup batches, the peaks
    row = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("batch") == 3][0]
    assert row["lr"] == pytest.approx(3e-3) and row["muon_lr"] == pytest.approx(0.02)
    state = checkpoint_state(run_dir / "ep0-ba3-rank0.pt")["optimizers"]["Muon"]
    assert sum("momentum_buffer" in s for s in state["state"].values()) == 8  # 2 layers x 4 matrices
    assert sorted(s["step"].item() for s in state["state"].values() if "momentum_buffer" in s) == [3] * 8  # warmup's
    assert sum("neuron_sq" in s for s in state["state"].values()) == 8  # NorMuon's second moments
    # the plain reference loop (docs/training.md) follows optimizer="muon" too: train.py's losses
    plain = [loss for _, _, loss in plain_loop.train(load_config(args))]
    np.testing.assert_allclose(plain, [whole[b] for b in range(1, 7)], rtol=1e-5)

    simulate_crash_after(run_dir, keep_batch=3)  # 1 process resumes: its batches 4-6 are the whole run's
    capsys.readouterr()
    train.main([*args, "--autoresume=True"])
    assert_resumed_where_it_stopped(run_dir, capsys.readouterr().out, keep_batch=3, last_batch=6)

    simulate_crash_after(run_dir, keep_batch=3)  # 2 processes resume: each half of every global batch
    out = succeeded(run_train([*args, "--autoresume=True"], tmp_path, nproc=2))
    assert "resuming from the checkpoint at batch 3 " in out and "done: 3 batches" in out
    # rank 0 (the launcher shows its output) orthogonalises half of the matrices, one of each of the 4 shapes, and
    # gathers the other half from rank 1: the losses below are those of the run that did all of them in 1 process
    assert "muon: this rank orthogonalises 4 of 8 matrices (4 shapes)\n" in out
    two = losses_by_batch(run_dir)  # the last run's rows win
    assert_same_losses(two, whole, (4, 5, 6), atol=ACROSS_PROCESS_COUNTS)


def test_config_nanochat_trains_evaluates_and_resumes_loss_for_loss(shakespeare_bin, tmp_path, capsys):
    """config/nanochat.py after a size preset, through train.py: it learns, evaluates, resumes batch for batch (Muon's
    weight-decay cosine, momentum warmup and warmdown count steps in the checkpoint: the momentum rises over batches
    1-2 and falls over 3-6, across the resume), and the plain loop that docs/performance.md's fidelity runs use gives
    train.py's losses."""
    run_dir = tmp_path / "run"
    args = [str(REPO / "config" / "tiny.py"), str(REPO / "config" / "nanochat.py"), f"--data_dir={shakespeare_bin}",
            *SMALL, "--warmup=2ba", "--muon_momentum_warmup=2", "--max_duration=6ba", "--save_interval=3ba",
            "--eval_interval=3ba", "--sample_length=0", "--progress_bar=False", f"--save_folder={run_dir}",
            "--device=cpu", callbacks(run_dir)]
    train.main(args)
    whole = losses_by_batch(run_dir)
    assert sorted(whole) == [1, 2, 3, 4, 5, 6] and whole[6] < whole[1] - 0.1  # it learns
    val = [r["val_loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "val_loss" in r]
    assert len(val) == 2 and val[1] < val[0]
    config = load_model_file(str(run_dir / "model.pt")).config
    assert (config.norm, config.smear, config.backout, config.qk_scale) == ("rmsnorm_free", True, True, 1.2)
    plain = [loss for _, _, loss in plain_loop.train(load_config(args))]
    np.testing.assert_allclose(plain, [whole[b] for b in range(1, 7)], rtol=1e-5)
    simulate_crash_after(run_dir, keep_batch=3)
    capsys.readouterr()
    train.main([*args, "--autoresume=True"])
    out = capsys.readouterr().out
    assert_resumed_where_it_stopped(run_dir, out, keep_batch=3, last_batch=6)
    assert "autoresume: this run's" not in out  # the checkpoint's groups are the run's settings, the warmdown's too
    muon = checkpoint_state(run_dir / "ep0-ba6-rank0.pt")["optimizers"]["Muon"]["param_groups"][0]
    assert (muon["momentum"], muon["momentum_warmup"], muon["momentum_warmdown"]) == (0.97, 2, [0.9, 2, 6])


def test_a_fresh_two_process_run_of_config_nanochat_gives_one_process_losses(shakespeare_bin, tmp_path):
    """config/nanochat.py (shape shrunk by config/tiny.py and the command line) from its first batch on 2 processes
    (`composer -n 2`): each rank orthogonalises half of Muon's matrices and gathers the rest, and the losses are
    those of 1 process, batch for batch (issue 65: only its resumes were tested on 2)."""
    args = [str(REPO / "config" / "tiny.py"), str(REPO / "config" / "nanochat.py"), f"--data_dir={shakespeare_bin}",
            *SMALL, "--warmup=2ba", "--muon_momentum_warmup=2", "--max_duration=4ba", "--save_interval=4ba",
            "--eval_interval=100ba", "--sample_length=0", "--progress_bar=False", "--device=cpu"]
    one, two = tmp_path / "one", tmp_path / "two"
    succeeded(run_train([*args, f"--save_folder={one}"], tmp_path))
    out = succeeded(run_train([*args, f"--save_folder={two}"], tmp_path, nproc=2))
    assert "2 process(es) on cpu" in out and "muon: this rank orthogonalises" in out
    whole, split = losses_by_batch(one), losses_by_batch(two)
    assert sorted(split) == [1, 2, 3, 4] and split[4] < split[1]
    assert_same_losses(split, whole, (1, 2, 3, 4), atol=ACROSS_PROCESS_COUNTS)
