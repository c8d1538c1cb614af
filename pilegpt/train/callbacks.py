"""What runs beside the training loop: train.py's Composer callbacks and loggers (docs/training.md).

SampleText, ExportModel (model.pt), HellaSwagEval, CoreEval, StopOnNonFinite, GradNorm (the gradient norm, an
algorithm), MetricsLog (metrics.jsonl, the step log) and build_loggers (W&B, TensorBoard, MLflow). Composer's own, by
name, and the user's are extensions.py's.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Optional

import torch
from composer.core import Algorithm, Callback, Event, State
from composer.core.precision import get_precision_context
from composer.loggers import Logger, LoggerDestination, WandBLogger
from composer.models import ComposerModel
from composer.utils import create_interval_scheduler, dist, model_eval_mode

from model import GPT, sample_next
from pilegpt import compat, model_contract
from pilegpt.checkpoint import EXPORT_NAME, save_export
from pilegpt.common import UserError
from pilegpt.train.optim.split import is_sharded, local_shard


def composer_model(state: State) -> ComposerModel:
    """The ComposerModel inside the trainer's model (DistributedDataParallel wraps it on several ranks)."""
    model = state.model
    while not isinstance(model, ComposerModel):
        model = model.module
    return model


def use_ema_weights(state: State) -> None:
    """Swap Composer EMA's averaged weights into the model (on every rank), if an EMA has started and they are not
    in yet. Composer itself swaps them in at each checkpoint (algorithms run before callbacks, and the checkpoint
    and the export share save_interval); this covers the end of a run stopped early (early_stopper), where no
    checkpoint is due. The next batch swaps the training weights back, as after a checkpoint."""
    from composer.algorithms import EMA

    for algorithm in state.algorithms:
        if isinstance(algorithm, EMA) and algorithm.ema_started and not algorithm.ema_weights_active:
            compat.activate_ema_weights(algorithm, state)


class OncePerBatch:
    """A callback's work done at most once a batch, however many of its events come at that batch (an evaluation
    and the end of the run, a checkpoint and the end)."""

    def __init__(self):
        self.last = -1

    def new_batch(self, state: State) -> Optional[int]:
        """The batch, the first time it is asked at this batch; None after that."""
        batch = int(state.timestamp.batch)
        if batch == self.last:
            return None
        self.last = batch
        return batch


class SampleText(Callback):
    """Generates a short text from the model after each evaluation and at the end of training (printed by rank 0)."""

    def __init__(self, prompt: str, max_new_tokens: int, block_size: int, temperature: float = 0.8, top_k: int = 200,
                 seed: int = 0):
        from pilegpt.tokenizer import EOT_ID, gpt2

        self.enc, self.prompt_ids = gpt2(), gpt2().encode_ordinary(prompt) or [EOT_ID]
        self.max_new_tokens, self.block_size = max_new_tokens, block_size
        self.temperature, self.top_k, self.seed = temperature, top_k, seed
        self.once = OncePerBatch()

    def eval_after_all(self, state: State, logger: Logger) -> None:
        self._sample(state, logger)

    def fit_end(self, state: State, logger: Logger) -> None:
        self._sample(state, logger)

    @torch.no_grad()
    def _sample(self, state: State, logger: Logger) -> None:
        batch = self.once.new_batch(state)
        if batch is None:
            return
        wrapper = composer_model(state)
        if not state.fsdp_enabled and dist.get_global_rank() != 0:
            return  # under FSDP every rank must run the forward passes together
        gpt = wrapper.model  # the GPT, or its FSDP wrapper (which all-gathers the weights)
        device = next(wrapper.parameters()).device
        idx = torch.tensor([self.prompt_ids], dtype=torch.long, device=device)
        devices = [device] if device.type == "cuda" else []
        # A private RNG stream: sampling must not change the training run's random state.
        with torch.random.fork_rng(devices=devices), model_eval_mode(wrapper), get_precision_context(state.precision):
            torch.manual_seed(self.seed + batch)
            for _ in range(self.max_new_tokens):
                logits, _ = gpt(idx[:, -self.block_size:])
                logits = logits[:, -1, :].float()  # (1, V)
                if not torch.isfinite(logits).all():  # a diverging model: say so, do not crash the run
                    if dist.get_global_rank() == 0:
                        print(f"sample at batch {batch}: none (the model's outputs are not finite)", flush=True)
                    return
                idx = torch.cat((idx, sample_next(logits, self.temperature, self.top_k)), dim=1)
        if dist.get_global_rank() == 0:
            text = self.enc.decode([t for t in idx[0].tolist() if t < self.enc.n_vocab])
            print(f"sample at batch {batch}: {text!r}", flush=True)
            logger.log_table(columns=["batch", "sample"], rows=[[batch, text]], name="samples")


class ExportModel(Callback):
    """Writes model.pt (checkpoint.save_export: weights only, for sample.py) every save_interval and at the end.

    With Composer's EMA algorithm on, model.pt holds the EMA weights, not the raw training weights: they are the
    weights Composer evaluates (the val loss in metrics.jsonl is theirs) and saves as the model in its checkpoints,
    and a smoother model for inference is why one turns EMA on. The raw weights stay in the Composer checkpoint
    (in EMA's state), for resuming."""

    def __init__(self, save_interval: str, local_dir: str, remote_name: Optional[str]):
        self.should_export = create_interval_scheduler(save_interval)
        self.local_path = os.path.join(local_dir, EXPORT_NAME)
        self.remote_name = remote_name  # object key under the S3 bucket, or None for a local save_folder
        self.once = OncePerBatch()

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event in (Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT) and self.should_export(state, event):
            self.export(state, logger)
        elif event == Event.FIT_END:
            self.export(state, logger)

    def export(self, state: State, logger: Logger) -> None:
        batch = self.once.new_batch(state)
        if batch is None:
            return
        use_ema_weights(state)
        wrapper = composer_model(state)
        spec = getattr(wrapper, "spec", None)  # a custom model's ModelSpec (train.ComposerGPT), else None: a GPT
        if state.fsdp_enabled:  # gather the full weights on rank 0 (every rank takes part), then copy them
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            weights = get_model_state_dict(wrapper.model, options=StateDictOptions(full_state_dict=True,
                                                                                   cpu_offload=True))
            if dist.get_global_rank() != 0:
                return
            gpt = GPT(wrapper.model.config) if spec is None else model_contract.build(spec)
            gpt.load_state_dict(weights)
        else:
            if dist.get_global_rank() != 0:
                return
            gpt = wrapper.model
        save_export(gpt, self.local_path, spec)
        if self.remote_name:
            logger.upload_file(self.remote_name, self.local_path, overwrite=True)


class HellaSwagEval(Callback):
    """After each evaluation, scores the first `count` HellaSwag examples with eval.py's scoring (pilegpt/hellaswag.py),
    split across the ranks, and logs hellaswag/acc and hellaswag/acc_norm: the same figures eval.py gives for the
    same weights and examples."""

    def __init__(self, count: int, data: Optional[str], batch_size: int):
        from pilegpt import hellaswag

        self.examples = hellaswag.load_examples(data, limit=count if count > 0 else None)
        self.batch_size, self.once = batch_size, OncePerBatch()

    def eval_after_all(self, state: State, logger: Logger) -> None:
        from pilegpt import hellaswag
        from pilegpt.tokenizer import gpt2

        batch = self.once.new_batch(state)
        if batch is None:
            return
        world, rank = dist.get_world_size(), dist.get_global_rank()
        mine = self.examples[rank::world]
        padding = -(-len(self.examples) // world) - len(mine)  # every rank runs as many forward passes (FSDP)
        wrapper = composer_model(state)
        device = next(wrapper.parameters()).device
        dtype = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(str(state.precision.value))
        with model_eval_mode(wrapper):
            predictions = hellaswag.evaluate(wrapper.model, mine + self.examples[:padding], gpt2(), device,
                                             self.batch_size, dtype)[:len(mine)]
        counts = torch.tensor([sum(p.pred == p.label for p in predictions),
                               sum(p.pred_norm == p.label for p in predictions), len(predictions)],
                              dtype=torch.float64, device=device)
        dist.all_reduce(counts, reduce_operation="SUM")
        logger.log_metrics({"hellaswag/acc": float(counts[0] / counts[2]),
                            "hellaswag/acc_norm": float(counts[1] / counts[2])})


class CoreEval(Callback):
    """After each evaluation, scores CORE on the first `count` rows of each task with eval.py's scoring
    (pilegpt/core_eval.py), split across the ranks, and logs core/score: the figure `eval.py --task core
    --max-per-task count` gives for the same weights."""

    def __init__(self, count: int, data: Optional[str], batch_size: int):
        from pilegpt import core_eval

        self.tasks, self.kept = core_eval.load(data or core_eval.download(), count if count > 0 else None,
                                               ("core_data", "core_examples"))
        self.batch_size, self.once = batch_size, OncePerBatch()

    def eval_after_all(self, state: State, logger: Logger) -> None:
        from pilegpt import core_eval
        from pilegpt.model_contract import context_length
        from pilegpt.tokenizer import gpt2

        if self.once.new_batch(state) is None:
            return
        world, rank = dist.get_world_size(), dist.get_global_rank()
        wrapper = composer_model(state)
        device = next(wrapper.parameters()).device
        dtype = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(str(state.precision.value))
        stream = core_eval.items(self.tasks, self.kept, gpt2(), context_length(wrapper.model) or 1,
                                 keep=lambda n: n % world == rank)
        with model_eval_mode(wrapper):
            results, passes = core_eval.evaluate(wrapper.model, stream, device, self.batch_size, dtype)
            most = torch.tensor([passes], device=device)
            dist.all_reduce(most, reduce_operation="MAX")
            core_eval.idle_passes(wrapper.model, int(most) - passes, device, dtype)  # as many passes on every rank
        counts = torch.zeros((len(self.tasks), 2), dtype=torch.float64, device=device)
        for r in results:
            counts[r.task] += torch.tensor([float(r.correct), 1.0], dtype=torch.float64, device=device)
        dist.all_reduce(counts, reduce_operation="SUM")
        centered = [core_eval.centered(float(c / n), t.baseline) for (c, n), t in zip(counts.tolist(), self.tasks)]
        logger.log_metrics({"core/score": sum(centered) / len(centered)})


class StopOnNonFinite(Callback):
    """Ends the run at the first NaN or infinity (on any rank) in the training loss, the validation loss, or the
    weights about to be checkpointed or exported: the last checkpoint and model.pt on disk stay good ones.

    Its cost does not grow with the model: each batch it reads the loss Composer has already all-reduced to a
    Python float (state.total_loss_dict, the same on every rank; no kernel, collective or host sync). The weights
    are checked once, fused (one inf-norm over all of them, all-reduced), right before each checkpoint and export
    (save_interval's schedule, and the end of the run): it must come before ExportModel in the callbacks, and
    Composer runs its CheckpointSaver after every callback. Weights that overflow between two checkpoints make the
    next batch's loss non-finite, which stops the run there."""

    def __init__(self, causes: str, save_interval: str):
        self.causes = causes  # the settings to change, as train.py names them: "lower --learning_rate (now 0.003)"
        self.should_check = create_interval_scheduler(save_interval)  # the CheckpointSaver's and ExportModel's
        self.once = OncePerBatch()

    def batch_end(self, state: State, logger: Logger) -> None:  # after the optimizer step, before evaluation
        loss = state.total_loss_dict.get("loss/train/total") if state.total_loss_dict else None
        if loss is not None and not math.isfinite(loss):
            self.stop("training loss", state)

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        super().run_event(event, state, logger)
        due = event in (Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT) and self.should_check(state, event)
        if (due or event == Event.FIT_END) and self.once.new_batch(state) is not None:
            params = [t for p in composer_model(state).parameters() if (t := local_shard(p.detach())).numel()]
            largest = (torch.nn.utils.get_total_norm(params, norm_type=math.inf).float().reshape(1) if params
                       else torch.zeros(1))  # NaN if any; FSDP: this rank's shards (a small one may have none)
            bad = (~torch.isfinite(largest)).float()
            dist.all_reduce(bad, reduce_operation="MAX")  # every rank stops together
            if bad.item():
                self.stop("weights", state)

    def eval_after_all(self, state: State, logger: Logger) -> None:  # weights so large that outputs overflow
        value = state.eval_metric_values.get("LanguageCrossEntropy")
        if value is not None and not torch.isfinite(torch.as_tensor(value)).all():
            self.stop("validation loss", state)

    def stop(self, what: str, state: State) -> None:
        raise UserError(f"the {what} went NaN or infinite at batch {int(state.timestamp.batch)}, so the run "
                        f"stopped before saving it: {self.causes}, then continue from the last good checkpoint "
                        "with --autoresume=True")


def logged_batch(batch: int, log_interval: int) -> bool:
    """Whether the step line (and metrics.jsonl's grad_norm) is written at this batch: the first, then every
    log_interval-th."""
    return batch % log_interval == 0 or batch == 1


def global_grad_norm(parameters) -> torch.Tensor:
    """The L2 norm of all the gradients of `parameters`, as one device tensor (no host sync): what
    torch.nn.utils.clip_grad_norm_ returns. FSDP's gradients are DTensors, each rank holding a block of rows: their
    ranks' sums of squares are all-reduced (every rank calls this together); plain gradients (DDP's are already
    the same on every rank) count once."""
    grads = [p.grad for p in parameters if p.grad is not None]
    sharded = [t for g in grads if is_sharded(g) and (t := local_shard(g)).numel()]
    whole = [g for g in grads if not is_sharded(g) and g.numel()]
    device = grads[0].device if grads else torch.device("cpu")
    squares = [torch.nn.utils.get_total_norm(ts, 2.0).float() ** 2 if ts else torch.zeros((), device=device)
               for ts in (sharded, whole)]
    if any(is_sharded(g) for g in grads):
        squares[0] = squares[0].reshape(1)
        dist.all_reduce(squares[0], reduce_operation="SUM")  # every rank's rows of every matrix
        squares[0] = squares[0].reshape(())
    return (squares[0] + squares[1]).sqrt()


class GradNorm(Algorithm):
    """The gradients' global norm before clipping, after every microbatch of the batch (and, on N processes, every
    rank's part) is in: logged as grad_norm (metrics.jsonl, the step line, the trackers) at every batch the step line
    is written at.

    It is an algorithm, not a callback, because it must see the gradients before GradientClipping (an algorithm at
    AFTER_TRAIN_BATCH, where callbacks run after every algorithm) or a user's algorithm changes them: Composer runs
    the algorithms of an after_* event in the reverse of their list order (composer.core.passes.set_filo_order), so
    train.py lists it last. The norm stays a device tensor each batch; .item() reads it at a logged batch only."""

    def __init__(self, log_interval: int):
        self.log_interval = log_interval
        self.norm: Optional[torch.Tensor] = None  # this batch's, on the device

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.AFTER_TRAIN_BATCH, Event.BATCH_END)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.AFTER_TRAIN_BATCH:  # the gradients of the whole batch, unscaled, not yet clipped
            self.norm = global_grad_norm(state.model.parameters())
        elif self.norm is not None and logged_batch(batch := int(state.timestamp.batch), self.log_interval):
            # BATCH_END: the batch count has moved on; the trackers' step is the loss's (Composer logs a batch's
            # loss before the count moves on)
            logger.log_metrics({"grad_norm": self.norm.item()}, step=batch - 1)


def ends_with_newline(path: str) -> bool:
    """Whether the non-empty file `path` ends with a newline."""
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class MetricsLog(LoggerDestination):
    """Collects what Composer logs for each batch into one JSON line of metrics.jsonl (rank 0); prints
    a one-line summary every log_interval batches when the progress bar is off, and every evaluation."""

    KEYS = {"loss/train/total": "loss", "throughput/tokens_per_sec": "tokens_per_sec",
            "throughput/device/mfu": "mfu",
            # lr: learning_rate's curve, AdamW's first group (muon_groups puts Muon's matrices first, AdamW's next)
            "lr-AdamW/group0": "lr", "lr-Muon/group1": "lr", "lr-Muon/group0": "muon_lr",
            "grad_norm": "grad_norm",  # GradNorm: the gradients' global norm before clipping
            "time/remaining_estimate": "eta_s",  # RuntimeEstimator(time_unit="seconds")
            "memory/peak_allocated_mem": "peak_mem_gb",  # MemoryMonitor (GPU only), in GB
            "hellaswag/acc": "hellaswag_acc", "hellaswag/acc_norm": "hellaswag_acc_norm",  # HellaSwagEval
            "core/score": "core"}  # CoreEval
    EVAL_METRICS = {"LanguageCrossEntropy": "loss", "LanguagePerplexity": "ppl", "BitsPerByte": "bpb"}  # per set

    def __init__(self, path: str, log_interval: int, print_steps: bool, remote_name: Optional[str] = None,
                 compiled: bool = False):
        self.path, self.log_interval, self.print_steps = path, log_interval, print_steps
        self.compiled = compiled  # say what compiling cost, at the first batch this process trains
        self.remote_name = remote_name  # object key to upload the file to at the end (S3 save_folder)
        self.row: dict[str, Any] = {}
        self.last_eval: dict[str, float] = {}  # the latest figure of each eval set (val_loss, owt_bpb, ...)
        self.t0 = time.time()
        self.first_write = True  # the file may end in a line a killed run cut short

    def fit_end(self, state: State, logger: Logger) -> None:
        if self.remote_name and dist.get_global_rank() == 0 and os.path.isfile(self.path):
            logger.upload_file(self.remote_name, self.path, overwrite=True)

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        for key, value in metrics.items():
            if key in self.KEYS:
                self.row[self.KEYS[key]] = float(value)
            elif key.startswith("metrics/") and key.count("/") == 2:  # metrics/{eval set}/{metric}: val_loss, owt_bpb
                _, label, metric = key.split("/")
                if label != "train" and metric in self.EVAL_METRICS:
                    figure = float(value)
                    if metric == "BitsPerByte" and math.isnan(figure):  # no bytes under it (BitsPerByte): no figure
                        figure = None
                    self.row[f"{label}_{self.EVAL_METRICS[metric]}"] = figure
                    self.last_eval[f"{label}_{self.EVAL_METRICS[metric]}"] = figure

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        # After BATCH_END and the evaluations of this batch: the row is complete.
        if dist.get_global_rank() != 0:
            return
        batch, total = int(state.timestamp.batch), state.max_duration
        row = {"batch": batch, "tokens": int(state.timestamp.token), "time_s": round(time.time() - self.t0, 3),
               **self.row}
        self.row = {}
        with open(self.path, "ab") as f:
            if self.first_write and f.tell() and not ends_with_newline(self.path):  # a line cut by a kill
                f.write(b"\n")  # stays apart from this run's rows; each row after it ends with one itself
            if self.first_write and self.compiled:
                print(f"compile: batch {batch} ended {row['time_s']:.1f} s after the Trainer's set-up began, "
                      "torch.compile's first graphs included (--compile=False trains eager)", flush=True)
            self.first_write = False
            f.write(json.dumps(row).encode() + b"\n")
        if self.print_steps and logged_batch(batch, self.log_interval) and "loss" in row:
            tps = f"{row['tokens_per_sec'] / 1000:.1f}k tok/s" if "tokens_per_sec" in row else "- tok/s"
            mfu = f" | mfu {100 * row['mfu']:.1f}%" if "mfu" in row else ""
            eta = f" | eta {int(row['eta_s']) // 3600}h{int(row['eta_s']) % 3600 // 60:02d}m" if "eta_s" in row else ""
            norm = f" | grad norm {row['grad_norm']:.4f}" if "grad_norm" in row else ""
            print(f"step {batch}/{total} | loss {row['loss']:.4f}{norm} | lr {row.get('lr', 0):.2e} | {tps}{mfu}{eta}",
                  flush=True)
        evals = [(k[:-len("_loss")], v) for k, v in row.items() if k.endswith("_loss")]
        if evals or "hellaswag_acc" in row or "core" in row:
            parts = [f"{label} loss {loss:.4f}" + (f" bpb {figure(row[label + '_bpb'])}" if label + "_bpb" in row
                                                   else "") for label, loss in evals]
            if "hellaswag_acc" in row:
                parts.append(f"hellaswag acc {row['hellaswag_acc']:.4f} acc_norm {row['hellaswag_acc_norm']:.4f}")
            if "core" in row:
                parts.append(f"core {row['core']:.4f}")
            print(f"step {batch}/{total} | " + " | ".join(parts), flush=True)


def figure(value: Optional[float]) -> str:
    """A logged figure as the step log and the last line print it: none where there is none (a bpb of no bytes)."""
    return "none" if value is None else f"{value:.4f}"


class RunWandB(WandBLogger):
    """Composer's WandBLogger without its checkpoint downloads. When save_folder holds no checkpoint (a run's first
    start with autoresume=True, as config/pile*.py set it), Composer's autoresume asks every logger for one, and this
    one asked W&B's API for an artifact: offline, or without an API key, the run failed at start. A run's checkpoints
    are in its save_folder alone."""

    def download_file(self, remote_file_name: str, destination: str, overwrite: bool = False,
                      progress_bar: bool = True):
        raise NotImplementedError("train.py keeps its checkpoints in save_folder, not in W&B")  # Composer goes on


def build_loggers(cfg, wandb_id: Optional[str] = None) -> list:
    """The optional experiment trackers a TrainConfig turns on; W&B's run is `wandb_id`, continued where it exists
    (resume="allow": lifecycle.wandb_run_id keeps one per run folder)."""
    loggers = []
    try:
        if cfg.wandb_log:
            loggers.append(RunWandB(project=cfg.wandb_project, name=cfg.run_name,
                                       init_kwargs={"id": wandb_id, "resume": "allow"} if wandb_id else None))
        if cfg.tensorboard_log:
            from composer.loggers import TensorboardLogger
            loggers.append(TensorboardLogger(log_dir=cfg.tensorboard_dir.format(run_name=cfg.run_name)))
        if cfg.mlflow_log:
            from composer.loggers import MLFlowLogger
            loggers.append(MLFlowLogger(experiment_name=cfg.mlflow_experiment, run_name=cfg.run_name))
    except ImportError as e:  # Composer raises MissingConditionalImportError (an ImportError) for these
        raise UserError(f"a logger's package is not installed: {str(e).splitlines()[0]} (all of them: "
                        "pip install -r requirements-loggers.txt)") from None
    return loggers

