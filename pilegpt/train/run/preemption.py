"""Preemption: a scheduler's SIGTERM (Slurm's --signal, Kubernetes before terminationGracePeriodSeconds) becomes a
checkpoint at the end of the current batch and a distinct exit status, instead of a run that loses everything since
its last periodic save (docs/clusters.md).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Optional

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist

# The exit status of a preempted run: 128 + SIGTERM, what a process killed by SIGTERM reports, so schedulers and
# wrappers read it as "terminated", not as a failure of the program; the line before it and the checkpoint at that
# batch tell it from a plain kill.
PREEMPTED = 143
SAVE_FLOOR_S = 0.05  # a checkpoint event shorter than this wrote nothing (no save was due): not timed
REPEAT_S = 2.0  # SIGTERMs this close to the first are the same notice (see StopOnSignal.on_signal)


class StopOnSignal(Callback):
    """Stops training on every rank after the batch during which any rank received SIGTERM.

    The first SIGTERM sets a flag; at the end of every batch the ranks agree (an all-reduce of the flag), so all of
    them stop after the same batch, and `State.stop_training()` makes that batch the end of training: Composer's
    CheckpointSaver and ExportModel save at the end of training, and FIT_END waits for the uploads. A second SIGTERM
    (more than REPEAT_S after the first) ends the process at once; the checkpoints already written stay whole (a
    file cut mid-write is set aside by autoresume: resume.py)."""

    def __init__(self) -> None:
        self.received, self.received_at = False, 0.0
        self.stopped_at: Optional[int] = None  # the batch training stopped after, once it has

    def fit_start(self, state: State, logger: Logger) -> None:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            signal.signal(signal.SIGTERM, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        # One notice can arrive twice within a moment: to the process group (Slurm, a terminal) and forwarded by
        # pilegpt.launch. A SIGTERM more than REPEAT_S seconds after the first: no more grace, the process ends
        # as SIGTERM ends it.
        if self.received and time.monotonic() - self.received_at > REPEAT_S:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)
        if not self.received:
            self.received, self.received_at = True, time.monotonic()

    def batch_end(self, state: State, logger: Logger) -> None:  # after the optimizer and scheduler steps
        flag = state.device.tensor_to_device(torch.tensor([float(self.received)]))
        dist.all_reduce(flag, reduce_operation="MAX")  # every rank stops after the same batch
        if flag.item() and self.stopped_at is None:
            self.stopped_at = int(state.timestamp.batch)
            state.stop_training()  # this batch becomes the end of training: checkpoint, export, uploads

    def seconds_since_notice(self) -> float:
        """Seconds from the SIGTERM to now (the preemption checkpoint and its upload are done by then)."""
        return time.monotonic() - self.received_at if self.received else 0.0

    def finish(self) -> None:
        """After the checkpoint is complete on every rank: a later SIGTERM (a launcher's clean-up) is ignored, so
        the process exits with PREEMPTED."""
        dist.barrier()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


class CheckpointClock(Callback):
    """Times each checkpoint from the start of its write to the end of its upload (an s3:// run's uploads), and
    warns once when one took more than half the preemption grace period: the notice must leave time for a batch,
    that checkpoint and its upload before the scheduler's SIGKILL."""

    def __init__(self, grace_s: float, uploads=None) -> None:
        self.grace_s, self.uploads = grace_s, uploads
        self.started: Optional[tuple] = None  # (batch, time, the uploads it submits) at BATCH_CHECKPOINT
        self.warned = False

    def batch_checkpoint(self, state: State, logger: Logger) -> None:  # Composer's CheckpointSaver runs after this
        watcher = self.uploads.watch_uploads() if self.uploads is not None else None
        self.started = (int(state.timestamp.batch), time.monotonic(), watcher)

    def batch_start(self, state: State, logger: Logger) -> None:
        self.measure()

    def fit_end(self, state: State, logger: Logger) -> None:
        self.measure()

    def measure(self) -> None:
        if self.started is None:
            return
        batch, t0, watcher = self.started
        self.started = None
        new = self.uploads.unwatch_uploads(watcher) if watcher is not None else []
        if not new:
            self.check(batch, time.monotonic() - t0, "write")
            return
        left = [len(new)]

        def done(_future) -> None:  # on an upload thread, when the checkpoint's last file is in the bucket
            left[0] -= 1
            if left[0] == 0:
                self.check(batch, time.monotonic() - t0, "write and upload")

        for future in new:
            future.add_done_callback(done)

    def check(self, batch: int, seconds: float, what: str) -> None:
        if seconds <= SAVE_FLOOR_S or self.warned or dist.get_global_rank() != 0:
            return
        if seconds > self.grace_s / 2:
            self.warned = True
            print(f"warning: the checkpoint of batch {batch} took {seconds:.1f} s to {what}, more than half the "
                  f"preemption grace period (preemption_grace_s={self.grace_s:g} s): after a SIGTERM a batch, its "
                  "checkpoint and the upload may not fit before the SIGKILL; give the job a longer grace "
                  "(sbatch --signal=TERM@SECONDS) and set preemption_grace_s to it", flush=True)
