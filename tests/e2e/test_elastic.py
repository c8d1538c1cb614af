"""A run's numbers do not depend on how many processes produce them: eval_subset_num_batches is a global amount
(batches of the eval batch size, split over the ranks), so the val loss of given weights is the same at 1 and 2
processes."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import (
    ACROSS_PROCESS_COUNTS,
    SMALL,
    assert_same_losses,
    losses_by_batch,
    read_jsonl,
    run_train,
    shakespeare_tokens,
    succeeded,
    train_main,
    write_bin,
)
from pilegpt.checkpoint import load_model
from pilegpt.data import read_windows, window_starts


@pytest.mark.parametrize("nproc", [0, 2])
def test_the_val_loss_is_over_the_same_samples_at_any_process_count(tmp_path, nproc, monkeypatch):
    tokens = shakespeare_tokens()
    write_bin(tmp_path / "data", tokens[:20_000])  # 2,000 val tokens: 62 windows of 32
    # 3 batches of 3 windows = the first 9 windows, split 5 + 4 over 2 ranks (Composer drops the sampler's padding)
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", "--max_duration=2ba", "--eval_interval=2ba",
            "--eval_subset_num_batches=3", "--device_eval_batch_size=3", "--progress_bar=False", "--save_folder=run",
            "--sample_length=0", "--device=cpu"]
    if nproc:  # `composer -n 2`: two ranks split the 9 windows
        succeeded(run_train(args, tmp_path, nproc=nproc))
    else:  # one process: this one
        monkeypatch.chdir(tmp_path)
        train_main(args)
    row = read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]

    model = load_model(str(tmp_path / "run" / "model.pt"))  # the weights evaluated at batch 2
    val = np.fromfile(tmp_path / "data" / "val.bin", dtype=np.uint16)
    x, y = read_windows(val, window_starts(len(val), 32)[:9], 32)
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).double(), torch.from_numpy(y.reshape(-1).astype(
        np.int64)))
    assert math.isclose(row["val_loss"], float(loss), rel_tol=1e-5), (row["val_loss"], float(loss))


def test_a_bin_run_resumed_at_other_process_counts_keeps_its_global_batches(tmp_path, monkeypatch, capsys):
    """Checkpointed at batch 3 by 1 process, continued by 2 to batch 6, then by 1 again to batch 8 (1 -> 2 -> 1): the
    same global batches in the same order as a run that never changed size, so the same losses (within float32
    rounding: ACROSS_PROCESS_COUNTS)."""
    write_bin(tmp_path / "data", shakespeare_tokens()[:20_000])
    # a constant learning rate after warmup (min_lr = learning_rate), so that where a run stops changes no schedule
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", "--min_lr=3e-3", "--save_interval=3ba", "--eval_interval=100ba",
            "--progress_bar=False", "--sample_length=0", "--device=cpu", "--global_batch_size=8",
            "--device_train_microbatch_size=4", "--run_name=el", "--save_folder=run"]
    (tmp_path / "whole").mkdir()
    (tmp_path / "resized").mkdir()
    monkeypatch.chdir(tmp_path / "whole")
    train_main([*args, "--max_duration=8ba"])  # the run that never changed size; 1 process, this one
    monkeypatch.chdir(tmp_path / "resized")
    train_main([*args, "--max_duration=3ba"])
    for nproc, start, end in ((2, 3, 6), (0, 6, 8)):
        resumed = [*args, f"--max_duration={end}ba", "--autoresume=True"]
        if nproc:  # `composer -n 2`
            out = succeeded(run_train(resumed, tmp_path / "resized", nproc=nproc))
        else:
            capsys.readouterr()
            train_main(resumed)
            out = capsys.readouterr().out
        assert f"resuming from the checkpoint at batch {start} " in out and f"done: {end - start} batches" in out
    whole = losses_by_batch(tmp_path / "whole" / "run")
    resized = losses_by_batch(tmp_path / "resized" / "run")
    assert sorted(resized) == list(range(1, 9))
    assert_same_losses(resized, whole, range(1, 9), atol=ACROSS_PROCESS_COUNTS)
