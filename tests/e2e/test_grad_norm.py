"""grad_norm (callbacks.GradNorm): the gradients' global norm before clipping, in metrics.jsonl at every logged batch
and in the step line. It is the total norm torch.nn.utils.clip_grad_norm_ returns in the plain loop
(pilegpt/train/plain_loop.py) on the same batch, with the clipping active (so a norm read after the clipping would
be grad_clip itself), microbatches accumulated; and the same on 1 and 2 processes and under fsdp=True."""

import re

import numpy as np
import pytest
import torch

from helpers import (
    ACROSS_PROCESS_COUNTS,
    REPO,
    SMALL,
    read_jsonl,
    run_train,
    succeeded,
    train_main,
    train_output,
)
from pilegpt.train import plain_loop
from pilegpt.train.config_load import make_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = str(REPO / "config" / "tiny.py")
CLIP = 0.05  # clips every batch of these runs (their norms: 0.3 to 2)
ARGS = [TINY, *SMALL, "--device=cpu", "--sample_length=0", "--eval_interval=100ba", "--max_duration=5ba",
        f"--grad_clip={CLIP}", "--log_interval=1", "--progress_bar=False", "--run_name=g"]


def grad_norms(run) -> dict[int, float]:
    return {r["batch"]: r["grad_norm"] for r in read_jsonl(run / "metrics.jsonl") if "grad_norm" in r}


def plain_loop_norms(args: list, monkeypatch) -> list[float]:
    """What clip_grad_norm_ returns at each batch of the plain loop with the same settings: the norm before it
    clips."""
    from pilegpt.train.config_load import config_values

    seen, clip = [], torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: seen.append(float(clip(*a, **k))))
    cfg = make_config({k: v for k, v in config_values([str(a) for a in args]).items()})
    assert [b for b, _, _ in plain_loop.train(cfg)] == [1, 2, 3, 4, 5]
    return seen


# the clipping by grad_clip, or by the user's own Composer algorithm (it too runs at AFTER_TRAIN_BATCH)
USERS_CLIPPING = ["--grad_clip=0", "--algorithms={'gradient_clipping': {'clipping_type': 'norm', "
                  f"'clipping_threshold': {CLIP}}}}}"]


@pytest.mark.parametrize("microbatch, clipping", [(4, []), (2, []), (4, USERS_CLIPPING)])
def test_grad_norm_is_clip_grad_norms_total_before_clipping_on_the_plain_loop(microbatch, clipping, shakespeare_bin,
                                                                             tmp_path, monkeypatch, capsys):
    args = [*ARGS, f"--data_dir={shakespeare_bin}", f"--device_train_microbatch_size={microbatch}"]
    out = train_output([*args, *clipping, f"--save_folder={tmp_path / 'run'}"], capsys)
    got = grad_norms(tmp_path / "run")
    want = plain_loop_norms(args, monkeypatch)  # clipped by grad_clip
    assert sorted(got) == [1, 2, 3, 4, 5] and min(got.values()) > 5 * CLIP  # unclipped: clipping cut every one
    # one batch of 4 (the plain loop's) against 2 microbatches of 2 added up: float32 rounding apart (measured:
    # 0 at 4, at most 4e-7 relative at 2)
    np.testing.assert_allclose([got[b] for b in range(1, 6)], want, rtol=1e-5)
    printed = {int(b): float(v) for b, v in re.findall(r"^step (\d+)/5ba \| loss \S+ \| grad norm (\S+) \|", out,
                                                      re.M)}
    assert printed == {b: round(v, 4) for b, v in got.items()}
    top = max(got, key=got.get)  # report.md's line, from the rows
    assert (f"- gradient norm before clipping: {got[5]:.4f} at batch 5, the largest {got[top]:.4f} at batch {top} "
            "(of 5 logged batches)") in (tmp_path / "run" / "report.md").read_text()


def test_grad_norm_is_written_at_logged_batches_only(shakespeare_bin, tmp_path):
    run = tmp_path / "run"
    train_main([*ARGS, f"--data_dir={shakespeare_bin}", "--log_interval=2", "--grad_clip=0", f"--save_folder={run}"])
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["batch"] for r in rows] == [1, 2, 3, 4, 5]  # a row every batch, its norm at the step line's batches
    assert [r["batch"] for r in rows if "grad_norm" in r] == [1, 2, 4]
    assert all(r["grad_norm"] > 0 for r in rows if "grad_norm" in r)


# DDP's gradients are 1 process's, bit for bit (the mean of two halves; measured: 0.0 at every batch). FSDP's
# reduce-scatter gives gradients float32 rounding apart (measured: 1.7e-6 relative at batches 1-2, where the warmup's
# lr 0 leaves the initial weights; the norm computed as torch's own DTensor norm agrees with it exactly), and AdamW's
# first steps move the near-zero weights by lr whichever way the rounding turns them, so the weights part: at most
# 3.5e-5 by batch 5. A norm left unreduced (one rank's rows) or gloo's sum (gradients twice the mean) is off by 30%
# or more.
DDP_NORM, FSDP_NORM = 1e-6, 1e-4


@pytest.mark.slow
def test_grad_norm_is_the_same_on_one_and_two_processes_and_under_fsdp(shakespeare_bin, tmp_path):
    args = [*ARGS, f"--data_dir={shakespeare_bin}", "--device_train_microbatch_size=2"]
    train_main([*args, f"--save_folder={tmp_path / 'one'}"])
    one = grad_norms(tmp_path / "one")
    for name, extra, rtol in (("ddp", [], DDP_NORM), ("fsdp", ["--fsdp=True"], FSDP_NORM)):
        succeeded(run_train([*args, *extra, f"--save_folder={tmp_path / name}"], tmp_path, nproc=2))
        two = grad_norms(tmp_path / name)
        assert sorted(two) == sorted(one) == [1, 2, 3, 4, 5]
        np.testing.assert_allclose([two[b] for b in one], list(one.values()), rtol=rtol)
        np.testing.assert_allclose([two[1], two[2]], [one[1], one[2]], rtol=ACROSS_PROCESS_COUNTS)  # same weights
