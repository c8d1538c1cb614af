"""The plain PyTorch loop that computes what train.py's Composer Trainer computes, batch for batch: model.py's GPT,
AdamW over its two parameter groups (or Muon and AdamW, optimizer="muon"), gradient clipping, the cosine schedule
with warmup, train.py's data order.

tests/e2e/test_bench_train.py pins its losses to train.py's; bench/bench_train.py times train.py against it.
"""

from __future__ import annotations

from typing import Iterator

import torch

from model import GPT
from pilegpt.common import UserError
from pilegpt.train.config import TrainConfig
from pilegpt.train.data.loaders import build_dataloaders
from pilegpt.train.optim.groups import build_optimizer, group_peak
from pilegpt.train.optim.schedule import build_scheduler, factor_at


def batches(duration: str, name: str) -> int:
    """'250ba' -> 250: this loop counts in batches only."""
    if not duration.endswith("ba") or not duration[:-2].isdigit():
        raise UserError(f"the plain loop counts in batches: {name}={duration!r} must be like '100ba'")
    return int(duration[:-2])


def build_model(cfg: TrainConfig) -> GPT:
    """cfg's model with train.py's initial weights (its reproducibility.seed_all seeds torch the same way)."""
    torch.manual_seed(cfg.seed)
    return cfg.initial_gpt()


def train(cfg: TrainConfig, model: GPT | None = None) -> Iterator[tuple[int, int, float]]:
    """Train cfg's model (build_model's, or `model` as it comes) in one process on the CPU for max_duration batches;
    yields (batch, tokens so far, loss) after each optimizer step. One forward and backward pass per batch:
    Composer's microbatches (when device_train_microbatch_size is smaller) add up to the same gradient."""
    model = build_model(cfg) if model is None else model
    optimizer = build_optimizer(model, cfg)  # train.py's groups and optimizer (pilegpt/train/optim/groups.py)
    # train.py's own loader: non-overlapping windows in the order its seeded sampler gives, epoch after epoch
    loader = build_dataloaders(cfg, 1, 0, pin_memory=False)[0].dataloader
    max_batches, schedule = batches(cfg.max_duration, "max_duration"), build_scheduler(cfg)  # train.py's schedule
    tokens = 0
    for it, batch in enumerate(loader):
        if it == max_batches:
            break
        # ---- one training step: docs/training.md shows these lines, and which Composer event runs each ----------
        x, y = batch["x"], batch["y"]  # (B, T) token ids; y is x shifted left by one token
        # Composer sets lr(0) at the start, then steps its scheduler after each batch before the batch count moves
        # on: batch `it` (from 0) trains at lr(it - 1), the first two at lr(0)
        for group in optimizer.param_groups:  # one factor for all, times each group's peak
            group["lr"] = group_peak(cfg, group) * factor_at(schedule, max(0, it - 1), max_batches)
        _, loss = model(x, targets=y)  # logits (B, T, vocab_size); loss: the mean cross-entropy of the B*T targets
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:  # Composer's GradientClipping(clipping_type="norm"): the global norm of all gradients
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        # ---- end of the step ------------------------------------------------------------------------------------
        tokens += x.numel()
        yield it + 1, tokens, loss.item()
