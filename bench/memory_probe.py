"""MemoryProbe: the Composer callback that bench/bench_fsdp_memory.py adds to train.py (by import path, bench/ on
PYTHONPATH) to measure what one rank holds at one batch: the bytes of its parameters, gradients and optimizer state
(each local shard's numel x element size: DTensor.to_local() under FSDP), the bytes autograd saves for backward in
that batch's forward (a saved_tensors_hooks pack hook, each storage once, parameters left out), and the process's
resident memory (VmRSS, and its peak VmHWM, reset at each phase by /proc/self/clear_refs) before training and in the
forward, backward and optimizer step of each batch up to that one."""

from __future__ import annotations

import json
import re

import torch
from composer.core import Callback, State
from composer.loggers import Logger
from composer.utils import dist
from torch.distributed.tensor import DTensor

PHASES = ("forward", "backward", "step")


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's own part of t: the local shard of a DTensor, t itself otherwise."""
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(t: torch.Tensor) -> int:
    """Bytes of this rank's part of t (its numel x element size: FSDP2's row padding is not counted)."""
    part = local(t)
    return part.numel() * part.element_size()


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Parameters, gradients and optimizer state this rank holds (a tied weight once), and the global count of
    parameters (a DTensor's numel is its whole tensor's)."""
    params = list(model.parameters())  # deduplicated: the tied wte / lm_head weight once
    moments = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return dict(params=sum(nbytes(p) for p in params), grads=sum(nbytes(p.grad) for p in params if p.grad is not None),
                optimizer=sum(nbytes(v) for v in moments), n_params=sum(p.numel() for p in params),
                dtensors=sum(isinstance(p, DTensor) for p in params))


def proc_status_kib(key: str) -> int:
    """A /proc/self/status figure in KiB (VmRSS: resident now, VmHWM: the peak since the last reset)."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1))


def peak_since_reset_kib() -> int:
    """VmHWM, the resident peak since the last reset, then reset it to VmRSS (/proc/self/clear_refs, Linux)."""
    peak = proc_status_kib("VmHWM")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak


class SavedBytes:
    """Counts the bytes autograd saves for backward while active: each storage once (views of one tensor share it),
    the parameters' storages left out (weights are held anyway; under FSDP the gathered ones are freed after the
    Block's forward and gathered again in backward). What is saved between the embeddings' dropout and the final
    norm counts as the Blocks', the rest as outside them (embeddings, the head and the loss). With activation
    checkpointing the checkpoint saves each Block's inputs through this hook and the Block's own saves go to the
    checkpoint's inner hook, which keeps nothing."""

    def __init__(self, gpt: torch.nn.Module):
        self.gpt, self.where, self.seen = gpt, "outside", {}
        gpt.transformer.drop.register_forward_hook(lambda *_: self.enter("blocks"))
        gpt.transformer.ln_f.register_forward_pre_hook(lambda *_: self.enter("outside"))
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def enter(self, where: str) -> None:
        self.where = where

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = local(t).untyped_storage()
        except (RuntimeError, NotImplementedError):  # no storage of its own (nothing to count)
            return t
        ptr = storage.data_ptr()
        if ptr and ptr not in self.seen and ptr not in {local(p).untyped_storage().data_ptr()
                                                        for p in self.gpt.parameters()}:
            self.seen[ptr] = (self.where, storage.nbytes())
        return t

    def start(self) -> None:
        self.seen, self.where = {}, "outside"
        self.hooks.__enter__()

    def stop(self) -> dict:
        self.hooks.__exit__(None, None, None)
        return {where: sum(n for w, n in self.seen.values() if w == where) for where in ("blocks", "outside")}


class MemoryProbe(Callback):
    """At batch `batch` (1-based, one microbatch per batch): the saved bytes of its forward, from BEFORE_FORWARD to
    BEFORE_BACKWARD, and at its end the state bytes; for every batch up to it, the resident memory at its start and
    its peak in each phase: the forward (to AFTER_FORWARD), the loss and backward (to AFTER_BACKWARD) and the rest
    (the optimizer step, to BATCH_END; before any checkpoint is written: Composer saves at BATCH_CHECKPOINT);
    with the resident memory at FIT_START and its peak until then; written to `folder`/memory-rank{R}.json."""

    def __init__(self, folder: str, batch: int = 2):
        self.path = f"{folder}/memory-rank{dist.get_global_rank()}.json"
        self.batch, self.saved, self.row = batch, None, {"phases": []}

    def mine(self, state: State, ended: bool = False) -> bool:
        """Whether the batch in progress (or, ended: the one just done) is the one measured: the timestamp counts the
        batches done, and BATCH_END comes after it counts its own."""
        return int(state.timestamp.batch) + (0 if ended else 1) == self.batch

    def phase(self, state: State, name: str) -> None:
        if int(state.timestamp.batch) < self.batch or (name == "step" and self.mine(state, ended=True)):
            self.row["phases"][-1][name] = peak_since_reset_kib()

    def fit_start(self, state: State, logger: Logger) -> None:  # the model built and wrapped, nothing trained yet
        self.row.update(rss_fit_start_kib=proc_status_kib("VmRSS"), rss_startup_peak_kib=peak_since_reset_kib())

    def before_train_batch(self, state: State, logger: Logger) -> None:
        if int(state.timestamp.batch) < self.batch:
            self.row["phases"].append(dict(batch=int(state.timestamp.batch) + 1, start=proc_status_kib("VmRSS")))

    def before_forward(self, state: State, logger: Logger) -> None:
        if self.mine(state) and "saved" not in self.row:
            gpt = state.model.module.model if hasattr(state.model, "module") else state.model.model  # DDP wraps it
            self.saved = SavedBytes(gpt)
            self.saved.start()

    def after_forward(self, state: State, logger: Logger) -> None:
        self.phase(state, "forward")

    def before_backward(self, state: State, logger: Logger) -> None:
        if self.saved is not None:
            # under FSDP a parameter registered as a plain tensor now is one gathered whole and not resharded after
            # the forward (FSDP2 swaps each unit's registered parameters between the shard and the whole)
            whole = [p for p in self.saved.gpt.parameters() if not isinstance(p, DTensor)]
            self.row["whole_after_forward"] = sum(nbytes(p) for p in whole)
            self.row["saved"], self.saved = self.saved.stop(), None

    def after_backward(self, state: State, logger: Logger) -> None:
        self.phase(state, "backward")

    def batch_end(self, state: State, logger: Logger) -> None:
        self.phase(state, "step")
        if not self.mine(state, ended=True):
            return
        model = state.model.module if hasattr(state.model, "module") else state.model
        peaks = [self.row["rss_startup_peak_kib"], *(p[k] for p in self.row["phases"] for k in PHASES if k in p)]
        self.row.update(state_bytes(model, state.optimizers[0]), rss_end_kib=proc_status_kib("VmRSS"),
                        rss_peak_kib=max(peaks), rank=dist.get_global_rank(), microbatch=list(state.batch["x"].shape))
        with open(self.path, "w") as f:
            json.dump(self.row, f)
