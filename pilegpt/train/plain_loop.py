"""The plain PyTorch loop that computes what train.py's Composer Trainer computes, batch for batch: model.py's GPT,
AdamW over its two parameter groups (or Muon and AdamW, optimizer="muon"), gradient clipping, the cosine schedule
with warmup, train.py's data order.

tests/e2e/test_bench_train.py pins its losses to train.py's; bench/bench_train.py times train.py against it.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from model import GPT
from pilegpt.common import UserError
from pilegpt.train.config import TrainConfig
from pilegpt.train.loaders import build_dataloaders
from pilegpt.train.muon import build_muon
from pilegpt.train.part_rates import part_peak, with_part_rates
from pilegpt.train.schedule import wsd_decay


def batches(duration: str, name: str) -> int:
    """'250ba' -> 250: this loop counts in batches only."""
    if not duration.endswith("ba") or not duration[:-2].isdigit():
        raise UserError(f"the plain loop counts in batches: {name}={duration!r} must be like '100ba'")
    return int(duration[:-2])


def learning_rate(cfg: TrainConfig, it: int, max_batches: int, warmup: int) -> float:
    """train.py's schedule at batch `it` (pilegpt/train/schedule.py). cosine: Composer's
    CosineAnnealingWithWarmupScheduler, linear warmup, then cosine decay to min_lr. wsd: the same warmup times a
    factor that stays 1 until the last `warmdown` of the run, then falls linearly to min_lr."""
    if cfg.lr_schedule == "wsd":
        warm = min(1.0, it / warmup) if warmup else 1.0
        decay = wsd_decay(it / max_batches, cfg.warmdown)
        return warm * (cfg.min_lr + (cfg.learning_rate - cfg.min_lr) * decay)
    if it < warmup:
        return cfg.learning_rate * it / warmup
    decay = 0.5 * (1 + math.cos(math.pi * (it - warmup) / max(1, max_batches - warmup)))  # 1 -> 0
    return cfg.min_lr + (cfg.learning_rate - cfg.min_lr) * decay


def group_lr(cfg: TrainConfig, group: dict, lr: float) -> float:
    """A parameter group's rate where learning_rate's curve is at `lr`: Muon's scaled to peak at muon_lr, a part's
    (part_rates.py) at its own rate, AdamW's others at adamw_lr()."""
    if group.get("muon"):
        return lr * cfg.muon_lr / cfg.learning_rate
    if (peak := part_peak(cfg, group)) is not None:
        return lr * peak / cfg.learning_rate
    return lr * cfg.width_scale()


def build_model(cfg: TrainConfig) -> GPT:
    """cfg's model with train.py's initial weights (its reproducibility.seed_all seeds torch the same way)."""
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config())
    if cfg.weight_init == "nanochat":
        model.nanochat_init()
    if cfg.zero_init_proj:
        model.zero_output_projections()
    return model


def train(cfg: TrainConfig, model: GPT | None = None) -> Iterator[tuple[int, int, float]]:
    """Train cfg's model (build_model's, or `model` as it comes) in one process on the CPU for max_duration batches;
    yields (batch, tokens so far, loss) after each optimizer step. One forward and backward pass per batch:
    Composer's microbatches (when device_train_microbatch_size is smaller) add up to the same gradient."""
    model = build_model(cfg) if model is None else model
    if cfg.optimizer == "muon":  # Muon for the blocks' 2-D weights, AdamW for embeddings, biases and LayerNorm gains
        optimizer = build_muon(model, cfg)
    else:  # weight decay on the 2-D weights only (matmuls, embeddings), not on biases and LayerNorm gains
        optimizer = torch.optim.AdamW(with_part_rates(model.optim_groups(cfg.weight_decay), model, cfg),
                                      lr=cfg.adamw_lr(), betas=(cfg.beta1, cfg.beta2))
    # train.py's own loader: non-overlapping windows in the order its seeded sampler gives, epoch after epoch
    loader = build_dataloaders(cfg, 1, 0, pin_memory=False)[0].dataloader
    max_batches, warmup = batches(cfg.max_duration, "max_duration"), batches(cfg.warmup, "warmup")
    tokens = 0
    for it, batch in enumerate(loader):
        if it == max_batches:
            break
        # ---- one training step: docs/training.md shows these lines, and which Composer event runs each ----------
        x, y = batch["x"], batch["y"]  # (B, T) token ids; y is x shifted left by one token
        # Composer sets lr(0) at the start, then steps its scheduler after each batch before the batch count moves
        # on: batch `it` (from 0) trains at lr(it - 1), the first two at lr(0)
        for group in optimizer.param_groups:  # the same curve for all, scaled to each group's peak
            group["lr"] = group_lr(cfg, group, learning_rate(cfg, max(0, it - 1), max_batches, warmup))
        _, loss = model(x, targets=y)  # logits (B, T, vocab_size); loss: the mean cross-entropy of the B*T targets
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:  # Composer's GradientClipping(clipping_type="norm"): the global norm of all gradients
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        # ---- end of the step ------------------------------------------------------------------------------------
        tokens += x.numel()
        yield it + 1, tokens, loss.item()
