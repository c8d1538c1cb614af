"""Test-only Composer callbacks that inject faults into a real train.py run, passed by import path:

    --callbacks="{'faults:KillDuringCheckpoint': {'batch': 6}}"     (with tests/ on PYTHONPATH)
    --callbacks="{'faults:InfiniteWeight': {'batch': 6}}"
    --callbacks="{'faults:SlowPreemptionCheckpoint': {'marker': '/tmp/x/writing'}}"
"""

import io
import os
import re
import signal
import time
from pathlib import Path

import torch
from composer.core import Callback, State
from composer.loggers import Logger

CHECKPOINT_FILE = re.compile(r"ep\d+-ba\d+-rank\d+\.pt$")  # a Composer checkpoint's file name (save_filename)


class KillDuringCheckpoint(Callback):
    """SIGKILLs this process halfway through writing the Composer checkpoint of `batch`: half of the file's
    bytes are on disk, as after a preemption or an OOM kill in the middle of a save."""

    def __init__(self, batch: int):
        self.batch = batch

    def fit_start(self, state: State, logger: Logger) -> None:
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            name = getattr(f, "name", f if isinstance(f, (str, os.PathLike)) else "")
            if re.search(rf"ep\d+-ba{self.batch}-rank0\.pt$", str(name)) and hasattr(f, "write"):
                buffer = io.BytesIO()
                real_save(obj, buffer, *args, **kwargs)
                f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                f.flush()
                os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            return real_save(obj, f, *args, **kwargs)

        torch.save = save


class SlowPreemptionCheckpoint(Callback):
    """After this process received SIGTERM (train.py's StopOnSignal saw it), the next Composer checkpoint it writes,
    the preemption one, stops halfway: half its bytes are on disk, `marker` is written (holding the checkpoint's
    file name), and the write waits `seconds` before finishing. A test that waits for the marker sends its second
    SIGTERM or SIGKILL inside that window, deterministically."""

    def __init__(self, marker: str, seconds: float = 600):
        self.marker, self.seconds = Path(marker), seconds

    def fit_start(self, state: State, logger: Logger) -> None:
        from pilegpt.train.run.preemption import StopOnSignal

        stopper = next(c for c in state.callbacks if isinstance(c, StopOnSignal))
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            name = str(getattr(f, "name", ""))
            if not (stopper.received and CHECKPOINT_FILE.search(name) and hasattr(f, "write")):
                return real_save(obj, f, *args, **kwargs)
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            whole = buffer.getvalue()
            f.write(whole[: len(whole) // 2])
            f.flush()
            os.fsync(f.fileno())
            self.marker.with_suffix(".tmp").write_text(Path(name).name)
            os.replace(self.marker.with_suffix(".tmp"), self.marker)  # whole, or not there
            time.sleep(self.seconds)
            f.write(whole[len(whole) // 2:])

        torch.save = save


class FailAtBatch(Callback):
    """Raises RuntimeError at the end of `batch`: a run that fails after some checkpoints were saved."""

    def __init__(self, batch: int):
        self.batch = batch

    def batch_end(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) == self.batch:
            raise RuntimeError(f"injected failure at batch {self.batch}")


class InfiniteWeight(Callback):
    """Sets one weight to +inf after the optimizer step of `batch` (at BATCH_END, after train.py's own callbacks'
    BATCH_END): the loss of that batch was finite, and the weights about to be checkpointed are not."""

    def __init__(self, batch: int):
        self.batch = batch

    def batch_end(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) == self.batch:
            with torch.no_grad():
                next(state.model.parameters()).view(-1)[0] = float("inf")


class SlowBatches(Callback):
    """Sleeps `seconds` after every batch, so that a test can signal a run of a few tiny batches mid-run."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def batch_end(self, state: State, logger: Logger) -> None:
        time.sleep(self.seconds)


class SlowSaves(Callback):
    """Every Composer checkpoint this process writes takes `seconds` longer (a slow disk), whatever the machine's
    speed: a test of the checkpoint clock does not hang on how fast a tiny model saves."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def fit_start(self, state: State, logger: Logger) -> None:
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if CHECKPOINT_FILE.search(str(getattr(f, "name", f))):
                time.sleep(self.seconds)
            return real_save(obj, f, *args, **kwargs)

        torch.save = save


class SlowStart(Callback):
    """Holds the Trainer's start-up (Event.INIT, inside Trainer(...)) for `seconds`, writing `marker` first: a
    window in which a signal lands after the config print and before training starts."""

    def __init__(self, marker: str, seconds: float = 30.0):
        self.marker, self.seconds = marker, seconds

    def init(self, state: State, logger: Logger) -> None:
        Path(self.marker).write_text("starting")
        time.sleep(self.seconds)
