"""Test-only Composer callbacks that inject faults into a real train.py run, passed by import path:

    --callbacks="{'faults:KillDuringCheckpoint': {'batch': 6}}"     (with tests/ on PYTHONPATH)
"""

import io
import os
import re
import signal

import torch
from composer.core import Callback, State
from composer.loggers import Logger


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



class SlowBatches(Callback):
    """Sleeps `seconds` after every batch, so that a test can signal a run of a few tiny batches mid-run."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def batch_end(self, state: State, logger: Logger) -> None:
        import time

        time.sleep(self.seconds)
