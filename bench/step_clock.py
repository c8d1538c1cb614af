"""StepClock: the Composer callback that bench/bench_train.py adds to train.py (by import path, bench/ on PYTHONPATH)
to read each batch's end in wall-clock and process CPU time, the same two clocks its plain loop reads."""

from __future__ import annotations

import json
import time

from composer.core import Callback, State
from composer.loggers import Logger


class StepClock(Callback):
    """At each batch's end (BATCH_CHECKPOINT: after the step, the loss's .item(), evaluation and every callback's
    BATCH_END) records batch, tokens, time_s (wall) and cpu_s (this process); writes them as JSON lines to `path`
    at the end of training, so the timed batches do no file I/O for it."""

    def __init__(self, path: str):
        self.path, self.rows = path, []

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        self.rows.append({"batch": int(state.timestamp.batch), "tokens": int(state.timestamp.token),
                          "time_s": time.time(), "cpu_s": time.process_time()})

    def fit_end(self, state: State, logger: Logger) -> None:
        with open(self.path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in self.rows)
