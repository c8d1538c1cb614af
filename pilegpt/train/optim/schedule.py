"""The learning-rate schedules train.py offers (`lr_schedule`), as Composer schedulers: a multiplier of each
parameter group's peak learning rate (AdamW's learning_rate, Muon's muon_lr) at every batch.

- "cosine" (the default, GPT-2's and nanoGPT's): linear warmup over `warmup`, then a cosine decay to min_lr at
  max_duration (Composer's CosineAnnealingWithWarmupScheduler).
- "wsd", warmup-stable-decay (nanochat's and modded-nanogpt's): linear warmup over `warmup`, the peak until the
  last `warmdown` of max_duration, then a straight line down to min_lr at its end.

Both are functions of the batch count alone, so a resumed run continues on its curve; a schedule changed on
autoresume applies from the checkpoint's batch on. pilegpt/train/plain_loop.py evaluates the same scheduler at each
batch (`factor_at`).
"""

from __future__ import annotations

SCHEDULES = ("cosine", "wsd")


def wsd_decay(done: float, warmdown: float) -> float:
    """The stable-then-decay factor at `done` (0 -> 1, the fraction of max_duration trained): 1 until 1 - warmdown,
    then linear to 0 at the end."""
    return min(1.0, max(0.0, (1.0 - done) / warmdown))


def elapsed_fraction(state) -> float:
    """How much of max_duration a Composer State has trained, in its finest unit: batches for an epoch duration
    (Composer's own schedulers convert epochs to batches the same way), else max_duration's unit."""
    from composer.core import TimeUnit

    max_duration = state.max_duration
    if max_duration.unit == TimeUnit.EPOCH and state.dataloader_len is not None:
        return int(state.timestamp.batch) / (int(state.dataloader_len) * max_duration.value)
    return state.timestamp.get(max_duration.unit).value / max_duration.value


class WarmupStableDecay:
    """A Composer scheduler (its ComposerScheduler is a protocol: a callable of the State): Composer's linear warmup
    (ConstantWithWarmupScheduler) times wsd_decay's factor, from 1 down to alpha_f."""

    def __init__(self, t_warmup: str, warmdown: float, alpha_f: float) -> None:
        from composer.optim import ConstantWithWarmupScheduler

        self.warmup = ConstantWithWarmupScheduler(t_warmup=t_warmup)
        self.warmdown, self.alpha_f = warmdown, alpha_f

    def __call__(self, state, ssr: float = 1.0) -> float:
        decay = wsd_decay(elapsed_fraction(state), self.warmdown)
        return self.warmup(state, ssr) * (self.alpha_f + (1 - self.alpha_f) * decay)


def build_scheduler(cfg):
    """cfg.lr_schedule as a Composer scheduler (one multiplier for every group, min_lr / learning_rate at the end)."""
    from composer.optim import CosineAnnealingWithWarmupScheduler

    alpha_f = cfg.min_lr / cfg.learning_rate
    if cfg.lr_schedule == "wsd":
        return WarmupStableDecay(cfg.warmup, cfg.warmdown, alpha_f)
    return CosineAnnealingWithWarmupScheduler(t_warmup=cfg.warmup, alpha_f=alpha_f)


def factor_at(scheduler, batch: int, max_batches: int) -> float:
    """build_scheduler's multiplier at `batch` of a run of max_batches batches, outside a Trainer (the plain loop's):
    the scheduler reads only the State's time, its max_duration and (for epochs) the loader's length."""
    from types import SimpleNamespace

    from composer.core import Time, Timestamp, TimeUnit

    state = SimpleNamespace(timestamp=Timestamp(batch=batch), max_duration=Time(max_batches, TimeUnit.BATCH),
                            dataloader_len=None)
    return scheduler(state)
