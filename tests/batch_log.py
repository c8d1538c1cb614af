"""Test-only Composer callbacks, passed to train.py by import path through its `callbacks` setting:

    --callbacks="{'batch_log:BatchFingerprints': {'folder': 'runs/x'}}"   (with tests/ on PYTHONPATH)

BatchFingerprints: each rank appends {"rank", "batch", "rows": [hash of each sample]} to FOLDER/batches-rank{R}.jsonl,
so tests can check what data each rank saw and where a resumed run starts. HyperparameterLog and EventCounter: a
user's logger and a user's callback, by import path.
"""

import hashlib
import json
import os

from composer.core import Callback, State
from composer.loggers import Logger, LoggerDestination
from composer.utils import dist


class BatchFingerprints(Callback):
    def __init__(self, folder: str):
        self.path = os.path.join(folder, f"batches-rank{dist.get_global_rank()}.jsonl")

    def after_dataloader(self, state: State, logger: Logger) -> None:
        rows = [hashlib.blake2b(r.cpu().numpy().tobytes(), digest_size=8).hexdigest() for r in state.batch["x"]]
        with open(self.path, "a") as f:
            f.write(json.dumps({"rank": dist.get_global_rank(), "batch": int(state.timestamp.batch) + 1,
                                "rows": rows}) + "\n")


class HyperparameterLog(LoggerDestination):
    """A user's logger by import path: writes the hyperparameters it receives to `path` as JSON."""

    def __init__(self, path: str):
        self.path, self.received = path, {}

    def log_hyperparameters(self, hyperparameters: dict) -> None:  # Composer calls it for its own values too
        self.received.update(hyperparameters)
        with open(self.path, "w") as f:
            json.dump(self.received, f)


class EventCounter(Callback):
    """A user's callback by import path ('batch_log:EventCounter'): counts the events it subscribes to and writes the
    counts to `path` as JSON at the end of training."""

    def __init__(self, path: str):
        self.path, self.counts = path, {}

    def _count(self, event: str) -> None:
        self.counts[event] = self.counts.get(event, 0) + 1

    def fit_start(self, state: State, logger: Logger) -> None:
        self._count("fit_start")

    def batch_end(self, state: State, logger: Logger) -> None:
        self._count("batch_end")

    def eval_end(self, state: State, logger: Logger) -> None:
        self._count("eval_end")

    def fit_end(self, state: State, logger: Logger) -> None:
        self._count("fit_end")
        with open(self.path, "w") as f:
            json.dump(self.counts, f)
