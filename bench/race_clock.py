"""bench/bench_gpu.py's race clock: a Composer callback that train.py loads by name
(`--callbacks={'race_clock:RaceClock': {...}}`, with bench/ on PYTHONPATH), so the race runs train.py unchanged.

It keeps the race's clock: training seconds from the end of batch 1 (the compile is behind it), less the time spent
in evaluations (their own compile included), and stops training (state.stop_training: the last batch's evaluation
still runs, at FIT_END, after metrics.jsonl's last row) once `seconds` have passed. At each evaluation of the val
split it appends {"batch", "train_s", "val_loss"} to `path` (JSON lines): the race's curve.

It also times the optimizer step: every `sample_every`-th step from batch `first_timed` on, optimizer.step runs the
microbatches' closure first, then a device sync, the update alone, another sync; each update's milliseconds are
appended to `path` as they are taken ({"batch", "optimizer_ms": [ms]}), so a run cut at its limit keeps them.
Composer calls optimizer.step(closure) with the forward and backward inside the closure, so timing optimizer.step as
it is would time the whole batch. The synced steps are a few in a hundred: the median step time that bench_gpu.py
reports is that of the unsynced ones."""

from __future__ import annotations

import functools
import json
import time

import torch
from composer.core import Callback, State
from composer.loggers import Logger


class RaceClock(Callback):
    def __init__(self, seconds: float, path: str, sample_every: int = 10, first_timed: int = 10,
                 min_batches: int = 0):
        self.seconds, self.path, self.sample_every = float(seconds), path, int(sample_every)
        self.first_timed, self.min_batches = int(first_timed), int(min_batches)  # --smoke: a few, on a busy CPU
        self.t0 = None  # perf_counter at the end of batch 1
        self.eval_s = 0.0  # seconds in evaluations since then
        self.eval_t0 = None
        self.train_s = 0.0  # the race clock at the last batch's end

    def fit_start(self, state: State, logger: Logger) -> None:
        optimizer = state.optimizers[0]
        step = optimizer.step

        @functools.wraps(step)  # keeps the LR scheduler's mark on the step it wrapped
        def timed_step(closure=None):
            batch = int(state.timestamp.batch) + 1
            if closure is None or batch < self.first_timed or batch % self.sample_every:
                return step(closure)
            with torch.enable_grad():
                loss = closure()
            sync()
            t = time.perf_counter()
            step()
            sync()
            self.write({"batch": batch, "optimizer_ms": [round(1000 * (time.perf_counter() - t), 3)]})
            return loss

        optimizer.step = timed_step

    def batch_end(self, state: State, logger: Logger) -> None:
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        self.train_s = now - self.t0 - self.eval_s
        if self.train_s >= self.seconds and int(state.timestamp.batch) >= self.min_batches:
            state.stop_training()

    def eval_start(self, state: State, logger: Logger) -> None:
        self.eval_t0 = time.perf_counter()

    def eval_end(self, state: State, logger: Logger) -> None:
        if self.eval_t0 is not None and self.t0 is not None:
            self.eval_s += time.perf_counter() - self.eval_t0
        self.eval_t0 = None
        loss = state.eval_metric_values.get("LanguageCrossEntropy")  # this evaluation's, computed before EVAL_END
        if state.dataloader_label == "val" and loss is not None:
            self.write({"batch": int(state.timestamp.batch), "train_s": round(self.train_s, 3),
                        "val_loss": float(loss)})

    def write(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
