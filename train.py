"""Train a GPT (model.py) with the Composer Trainer, from prepare_data .bin files or MDS shards (local or S3).

Usage:
    python train.py config/tiny.py                                  # one process: CPU, or one GPU
    python train.py config/tiny.py --max_duration=50ba --n_layer=4  # --key=value overrides a config value
    composer -n 8 train.py config/pile.py                           # 8 GPUs of one node, data parallel
    composer -n 2 train.py config/tiny.py                           # 2 CPU processes (gloo), for testing
    python train.py --help                                          # every setting, its default and meaning

Configuration: `TrainConfig` (pilegpt/train/config.py) is the one list of settings, with nanoGPT's names. Config
files (config/*.py) are plain Python assignments, applied in the order given, then `--key=value` arguments;
unknown keys and wrong types are errors (see pilegpt/train/config.py). `.env` in the working directory is loaded
first, so config files can read S3 settings and paths from the environment.

Data (a batch is {"x": LongTensor (B, T), "y": LongTensor (B, T)}, y = x shifted by one token):
    data_dir=DIR           DIR/train.bin (+ val.bin, meta.json) from prepare_data.py: sample i is the
                           window tokens[i*T : i*T+T+1] (pilegpt/train/loaders.py: non-overlapping windows,
                           shuffled every epoch, each token seen once per epoch, ranks never overlap);
                           or DIR/train/ (+ DIR/val/) MDS folders from to_mds.py.
    data_remote=ROOT       MDS root(s) holding train/ (+ val/): a local folder or s3://bucket/prefix, read by
                           Streaming's StreamingDataset with a local cache under data_local; a list of roots
                           is read as several streams of one dataset.
A missing validation split just means no evaluation.

Starting weights: init_from=gpt2 (-medium, -large, -xl), a Hugging Face GPT-2 folder, or a pile-gpt model.pt /
checkpoint / run folder (local or s3://) starts from those weights, in their shape (pilegpt/hf.py load_pretrained);
the optimizer and schedule start fresh, and a run that autoresumes keeps its own checkpoint instead.

Extensions: algorithms={"ema": {"half_life": "1000ba"}} and callbacks={"optimizer_monitor": {}, "pkg.mod:Class": {}}
turn on Composer's algorithms and callbacks by name, and callbacks of your own
(pilegpt/train/extensions.py; docs/extending.md). grad_clip's norm clipping is always on unless grad_clip=0.

Outputs (save_folder, local or s3://; default runs/{run_name}):
    ep{E}-ba{B}-rank{R}.pt, latest-rank0.pt   Composer checkpoints (every save_interval and at the end), with
                                              the model's shape (model_args) for sample.py and export_hf.py
    model.pt                                  weights-only export for sample.py (same schedule)
    config.json                               the final config, library versions, git commit
    metrics.jsonl                             one JSON line per batch: loss, lr, tokens, throughput, and at each
                                              evaluation every eval set's loss and bpb (val_loss, val_bpb, ...)
    report.md, loss.png                       the run in one page (report.py), written at the end
    logs/{start time}-rank{R}.txt             Composer's file log, one per process and start
    .lock                                     the run that holds the folder, while it runs (pilegpt/train/lock.py)
    data.json                                 what the run trains on; autoresume refuses other data
                                              (pilegpt/train/data_record.py; data_changed_ok=True if intended)
With an s3:// save_folder, config.json, model.pt, metrics.jsonl, the report and the logs go to runs/{run_name}
locally and uploaded (metrics as logs/{start time}-metrics.jsonl). Re-running with autoresume=True continues
from the last checkpoint, data position included (metrics.jsonl then repeats the batches after it).
SIGTERM (a scheduler's preemption notice): every rank stops after the current batch, which is checkpointed (and
uploaded), and train.py exits with status 143 and one line saying to resume with --autoresume=True
(pilegpt/train/preemption.py; with several processes launch with `python -m pilegpt.launch`, which forwards SIGTERM).
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and any(a in ("-h", "--help") for a in sys.argv[1:]):  # answer before importing torch
    from pilegpt.train.config import usage
    print(usage(__doc__.split("\n\n")[1]))
    sys.exit(0)

import contextlib
import dataclasses
import json
import math
import os
import platform
import subprocess
import time
from typing import Optional, Sequence

import numpy as np
import torch
from composer import Trainer
from composer.callbacks import LRMonitor, MemoryMonitor, RuntimeEstimator, SpeedMonitor
from composer.core import Evaluator
from composer.loggers import FileLogger, LoggerDestination
from composer.models import ComposerModel
from composer.optim import CosineAnnealingWithWarmupScheduler
from composer.utils import dist, reproducibility

from model import GPT, Block, GPTConfig
from pilegpt import compat, storage
from pilegpt.checkpoint import EXPORT_NAME, existing_checkpoints
from pilegpt.common import (
    UserError,
    atomic_write_text,
    check_writable_folder,
    failed_write,
    load_dotenv_file,
    mask_secrets,
    run_main,
    tune_glibc_malloc,
)
from pilegpt.hf import load_pretrained
from pilegpt.launch import die_with_launcher
from pilegpt.s3 import lost_connection
from pilegpt.train import cluster, data_record, lock
from pilegpt.train.callbacks import ExportModel, HellaSwagEval, MetricsLog, SampleText, StopOnNonFinite, build_loggers
from pilegpt.train.config import SHAPE_FIELDS, TrainConfig, config_text, config_values, make_config
from pilegpt.train.extensions import build_algorithms, build_callbacks
from pilegpt.train.loaders import (
    build_dataloaders,
    build_eval_loader,
    data_tokenizer,
    eval_batch_size,
    eval_batches_per_rank,
    refresh_mds_cache,
)
from pilegpt.train.metrics import BitsPerByte, CrossEntropyFromLoss, PerplexityFromLoss, token_bytes
from pilegpt.train.preemption import PREEMPTED, StopOnSignal
from pilegpt.train.report import PLOT, REPORT, write_report
from pilegpt.train.resume import set_aside_broken_checkpoints
from pilegpt.train.run_uploads import S3Uploads, checkpoint_uploads

CONFIG_JSON = "config.json"
METRICS_JSONL = "metrics.jsonl"


# ----------------------------------------------------------------------------------------------------------
# The Composer model: model.py's GPT, its loss and metrics

class ComposerGPT(ComposerModel):
    """GPT as a ComposerModel: batch {"x", "y"} in, (logits (B, T, V), mean loss) out."""

    def __init__(self, config: GPTConfig, tokenizer: str = "gpt2"):
        super().__init__()
        self.model = GPT(config)
        # Wrap each transformer block in its own FSDP unit (when FSDP is on); the root unit keeps the
        # embeddings, ln_f and the lm_head tied to wte.
        self.model.fsdp_wrap_fn = lambda module: isinstance(module, Block)
        self._flops_per_token = self.model.flops_per_token()  # before FSDP shards the parameters
        self.train_metrics = {"LanguageCrossEntropy": CrossEntropyFromLoss(ignore_index=-1)}
        self.eval_metrics = {"LanguageCrossEntropy": CrossEntropyFromLoss(ignore_index=-1),
                             "LanguagePerplexity": PerplexityFromLoss(ignore_index=-1),
                             "BitsPerByte": BitsPerByte(token_bytes(tokenizer, config.vocab_size))}

    def forward(self, batch: dict):
        return self.model(batch["x"], targets=batch["y"])

    def loss(self, outputs, batch: dict) -> torch.Tensor:
        return outputs[1]

    def get_metrics(self, is_train: bool = False) -> dict:
        return self.train_metrics if is_train else self.eval_metrics

    def update_metric(self, batch: dict, outputs, metric) -> None:
        if isinstance(metric, BitsPerByte):  # per-token losses: evaluation only
            metric.update(outputs[0], batch["y"])
        else:
            metric.update(outputs[1], (batch["y"] != -1).sum())

    def flops_per_batch(self, batch: dict) -> int:
        """Training FLOPs (forward + backward) of one batch, for SpeedMonitor's MFU."""
        return self._flops_per_token * batch["x"].numel()

    # The model's shape travels in its Composer checkpoints (state["model"]["_extra_state"]), so that sample.py,
    # export_hf.py and init_from can rebuild the GPT from a checkpoint alone. The GPT's own state dict (model.pt)
    # stays plain tensors.
    def get_extra_state(self) -> dict:
        return {"model_args": dataclasses.asdict(self.model.config)}

    def set_extra_state(self, state) -> None:
        pass  # on resume the shape is already the run's: it was built from the same config


# ----------------------------------------------------------------------------------------------------------

def resolve_system(cfg: TrainConfig, local_world: int) -> tuple[str, str]:
    """(device, precision) from the settings and the machine; CPU set-up on CPU."""
    device = cfg.device if cfg.device != "auto" else ("gpu" if torch.cuda.is_available() else "cpu")
    if device == "gpu" and not torch.cuda.is_available():
        raise UserError("device='gpu' but CUDA is not available: pass --device=cpu")
    precision = cfg.precision if cfg.precision != "auto" else ("amp_bf16" if device == "gpu" else "fp32")
    if device == "cpu":
        if precision != "fp32":
            raise UserError(f"precision={precision} needs a GPU: Composer trains in fp32 on CPU (--precision=auto)")
        if cfg.device_train_microbatch_size == "auto":
            raise UserError("device_train_microbatch_size='auto' works on GPU only: pass an integer on CPU, "
                            "e.g. --device_train_microbatch_size=8")
        if cfg.fsdp:
            raise UserError("fsdp=True needs GPUs: pass --fsdp=False on CPU")
        if cfg.cpu_malloc_tune:
            tune_glibc_malloc()
        if local_world > 1 and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # do not oversubscribe cores
    return device, precision


def run_info(cfg: TrainConfig, world_size: int, device: str, precision: str) -> dict:
    """What produced the run (config.json): the settings, the machine, the library versions, the commit."""
    import composer
    import streaming
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"config": dataclasses.asdict(cfg), "world_size": world_size, "device": device, "precision": precision,
            "gpu": torch.cuda.get_device_name(0) if device == "gpu" else None, "git_commit": commit,
            "python": platform.python_version(), "torch": torch.__version__, "composer": composer.__version__,
            "streaming": streaming.__version__, "numpy": np.__version__, "host": platform.node(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def check_same_model(cfg: TrainConfig, run_dir: str, save_folder: str) -> None:
    """Autoresume loads the checkpoint into this config's model: refuse, in one line, a model of another shape
    than the one the run's config.json records (Composer itself fails with a KeyError deep in the load)."""
    path = os.path.join(run_dir, CONFIG_JSON)
    if not os.path.isfile(path):
        return
    saved = json.loads(open(path).read()).get("config", {})
    changed = [f"{k}={getattr(cfg, k)!r} (the run has {saved[k]!r})" for k in SHAPE_FIELDS
               if k in saved and saved[k] != getattr(cfg, k)]
    if changed:
        raise UserError(f"autoresume: the checkpoints in {save_folder} are of "
                        f"another model: {', '.join(changed)}; resume with the run's settings ({path}) or start a "
                        "new run with another --run_name")


def main(argv: Optional[Sequence[str]] = None) -> int:
    die_with_launcher()  # started by pilegpt.launch: a SIGKILLed launcher leaves no rank training on
    with contextlib.ExitStack() as held:  # what the run holds (its save_folder's lock), released however it ends
        return run(argv, held)


def run(argv: Optional[Sequence[str]], held: contextlib.ExitStack) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    load_dotenv_file()  # before the config files, which may read S3 settings and paths from the environment
    values = config_values(argv)
    # init_from: start from trained weights, in their shape (hf.load_pretrained reads GPT-2 by name, a
    # Hugging Face folder or a pile-gpt run); config values that contradict the shape are an error.
    init_from = values.get("init_from", "scratch")
    source, origin = load_pretrained(init_from) if init_from != "scratch" else (None, "")
    cfg = make_config(values, source.config if source is not None else None)
    # the launcher (composer -n N) sets these for each process
    world_size, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes, per_rank = max(1, world_size // local_world), cfg.per_rank_batch(world_size)
    device, precision = resolve_system(cfg, local_world)

    # Where the run's files go: save_folder holds the checkpoints; run_dir the export, config and logs
    # (the same folder, or a local one that is uploaded beside the checkpoints of an s3:// save_folder).
    save_folder = cfg.save_folder.format(run_name=cfg.run_name)
    remote = storage.folder(save_folder) if storage.is_remote(save_folder) else None  # an s3.S3Dir
    def remote_name(name: str) -> Optional[str]:  # noqa: E306  the object key of a run file, when remote
        return remote.key(name) if remote else None
    run_dir = os.path.join("runs", cfg.run_name or "run") if remote else save_folder
    check_writable_folder(run_dir, "save_folder" if run_dir == save_folder else "the run's local folder",
                          "choose another --save_folder or --run_name" if run_dir == save_folder else
                          "run train.py from a folder you can write in")
    if nodes > 1:  # a local save_folder must be one folder every node sees (rank 0 alone writes it), else refused
        cluster.check_shared_save_folder(save_folder, device, world_size, local_world)
        held.enter_context(compat.node_signal_files_per_node())  # Composer's waits across nodes (compat.py)
    if rank == 0:
        held.enter_context(lock.hold(save_folder, cfg.run_name))  # a second run into save_folder is refused
    if cfg.autoresume:  # a kill during a checkpoint write leaves a truncated file that autoresume trips over
        if rank == 0 and (note := set_aside_broken_checkpoints(save_folder)):
            print(f"{cfg.run_name}: {note}", flush=True)
        if world_size > 1:  # the other ranks wait for rank 0's repair before anyone reads a checkpoint
            dist.initialize_dist(device)
            dist.barrier()
    found = existing_checkpoints(save_folder)  # one listing (a request on S3) serves every check below
    if found and not cfg.autoresume and not cfg.save_overwrite:
        raise UserError(f"{save_folder} already holds checkpoints ({found[0]}...): pass --autoresume=True to "
                        "continue that run, --save_overwrite=True to start over, or another --run_name/--save_folder")
    if found and cfg.autoresume:
        check_same_model(cfg, run_dir, save_folder)
    data = data_record.describe(cfg)  # what the run trains on (MDS: every index read, its shard names checked)
    note = data_record.check_resume(data, save_folder, cfg.data_changed_ok) if found and cfg.autoresume else None
    if data["format"] == "mds":  # the sample order is the run's, on any number of nodes (data_record.py)
        cfg = dataclasses.replace(cfg, num_canonical_nodes=data_record.canonical_nodes(
            cfg, save_folder if found and cfg.autoresume else None, nodes))
        data["num_canonical_nodes"] = cfg.num_canonical_nodes
    if rank == 0:
        if note:
            print(note, flush=True)
        data_record.write(data, save_folder)
    if data["format"] == "mds":  # a cache of an older version of the data is emptied before Streaming reads it
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            for cache in refresh_mds_cache(cfg):
                print(f"note: {cache} held shards of an older version of the data: emptied, to be read again")
        if world_size > 1:
            dist.initialize_dist(device)
            dist.barrier()
    if source is not None and cfg.autoresume and found:  # the checkpoint wins
        source, origin = None, f"not loaded: autoresume continues from the checkpoint in {save_folder}"
    elif source is not None and cfg.block_size < source.config.block_size:
        source.crop_block_size(cfg.block_size)
    if rank == 0:
        print(f"train.py: {world_size} process(es) on {device}, precision {precision}; config:\n"
              + mask_secrets(config_text(cfg)), flush=True)

    # Model, data, optimizer
    reproducibility.seed_all(cfg.seed)  # identical initial weights on every rank
    model = ComposerGPT(cfg.model_config(), data_tokenizer(cfg))
    if source is not None:  # weights only: the optimizer and the schedule start fresh
        model.model.load_state_dict(source.state_dict())
        origin, source = f"{source.num_params() / 1e6:.2f}M weights from {origin}", None
    if cfg.init_from != "scratch" and rank == 0:
        print(f"init_from={cfg.init_from}: {origin}", flush=True)
    train_spec, val_spec = build_dataloaders(cfg, world_size, rank, pin_memory=device == "gpu")
    eval_sets = {"val": val_spec} if val_spec is not None else {}
    eval_sets.update({label: build_eval_loader(cfg, location, world_size, rank, pin_memory=device == "gpu")
                      for label, location in cfg.eval_data.items()})  # named sets: owt_loss, owt_bpb, ...
    evaluators = [Evaluator(label=label, dataloader=spec, metric_names=list(model.eval_metrics),
                            subset_num_batches=eval_batches_per_rank(cfg, spec, world_size))  # a global amount
                  for label, spec in eval_sets.items()] or None
    eval_interval, eval_batches = (cfg.eval_interval, cfg.eval_subset_num_batches) if evaluators else (1, -1)
    if val_spec is None and rank == 0:
        print("no validation split in the data: training without evaluation on it", flush=True)
    optimizer = torch.optim.AdamW(model.model.optim_groups(cfg.weight_decay), lr=cfg.learning_rate,
                                  betas=(cfg.beta1, cfg.beta2), fused=device == "gpu")
    scheduler = CosineAnnealingWithWarmupScheduler(t_warmup=cfg.warmup, alpha_f=cfg.min_lr / cfg.learning_rate)
    algorithms = build_algorithms(cfg, device, precision)  # grad_clip's GradientClipping, then cfg.algorithms

    # Logs and callbacks
    start = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    metrics_log = MetricsLog(os.path.join(run_dir, METRICS_JSONL), cfg.log_interval, print_steps=not cfg.progress_bar,
                             remote_name=remote_name(f"logs/{start}-{METRICS_JSONL}"))
    loggers = [FileLogger(filename=os.path.join(run_dir, "logs", f"{start}-rank{{rank}}.txt"),
                          remote_file_name=remote_name(f"logs/{start}-rank{{rank}}.txt")),
               metrics_log, *build_loggers(cfg)]
    uploads = S3Uploads(remote.bucket) if remote else None  # checkpoints, config, model.pt, logs
    if uploads is not None:
        loggers.insert(0, uploads)
    callbacks = [SpeedMonitor(window_size=cfg.speed_window), LRMonitor(), RuntimeEstimator(time_unit="seconds"),
                 StopOnNonFinite(cfg.learning_rate, cfg.save_interval), preemption := StopOnSignal(),
                 ExportModel(cfg.save_interval, run_dir, remote_name(EXPORT_NAME))]
    if device == "gpu":
        callbacks.append(MemoryMonitor())
    if cfg.hellaswag_examples:
        callbacks.append(HellaSwagEval(cfg.hellaswag_examples, cfg.hellaswag_data, eval_batch_size(cfg)))
    if cfg.sample_length:
        callbacks.append(SampleText(cfg.sample_prompt, cfg.sample_length, cfg.block_size, seed=cfg.seed))
    metrics = {"train": list(model.train_metrics), **{label: list(model.eval_metrics) for label in eval_sets}}
    extra = build_callbacks(cfg.callbacks, device, metrics)  # the metrics early_stopper can watch
    # A Composer callback named in cfg.callbacks (e.g. speed_monitor) replaces the default one of its class above;
    # a user's LoggerDestination joins the loggers (it then receives metrics and hyperparameters too).
    callbacks = [c for c in callbacks if type(c) not in {type(e) for e in extra}]
    callbacks += [c for c in extra if not isinstance(c, LoggerDestination)]
    loggers += [c for c in extra if isinstance(c, LoggerDestination)]
    if not any(getattr(c, "dataloader_label", None) == "train" for c in callbacks):
        model.train_metrics = {}  # no stopper watches them: Composer would update, compute and log them every batch

    with checkpoint_uploads(uploads) if uploads is not None else contextlib.nullcontext():
        trainer = Trainer(
            model=model, train_dataloader=train_spec, eval_dataloader=evaluators,
            eval_interval=eval_interval, eval_subset_num_batches=eval_batches,
            max_duration=cfg.max_duration, optimizers=optimizer, schedulers=scheduler, algorithms=algorithms,
            device=device, precision=precision,
            device_train_microbatch_size=min(cfg.device_train_microbatch_size, per_rank)
            if isinstance(cfg.device_train_microbatch_size, int) else "auto",
            compile_config={} if cfg.compile else None,
            parallelism_config={"fsdp": {"sharding_strategy": "FULL_SHARD", "mixed_precision": "DEFAULT",
                                         "state_dict_type": "full"}} if cfg.fsdp else None,
            save_folder=save_folder, save_interval=cfg.save_interval, save_overwrite=cfg.save_overwrite,
            # an s3:// run keeps no local copies: each checkpoint leaves the saver's folder for the upload (uploads.py)
            save_num_checkpoints_to_keep=cfg.save_num_checkpoints_to_keep if uploads is None else -1,
            autoresume=cfg.autoresume, run_name=cfg.run_name, seed=cfg.seed,
            callbacks=callbacks, loggers=loggers, progress_bar=cfg.progress_bar, log_to_console=False,
        )
    if uploads is not None:
        uploads.take_saver_copies(trainer, remote.prefix)
    try:
        if dist.get_global_rank() == 0:  # the run's config, versions and commit, beside its checkpoints
            config_path = os.path.join(run_dir, CONFIG_JSON)
            atomic_write_text(config_path, mask_secrets(json.dumps(run_info(cfg, world_size, device, precision),
                                                                   indent=2)) + "\n")
            if remote:
                trainer.logger.upload_file(remote_name(CONFIG_JSON), config_path, overwrite=True)
        trainer.logger.log_hyperparameters(dataclasses.asdict(cfg))  # every setting, to W&B / MLflow / TensorBoard

        # Train
        state = trainer.state
        if state.timestamp.get(state.max_duration.unit) >= state.max_duration:
            if dist.get_global_rank() == 0:
                print(f"{cfg.run_name}: already trained for {state.max_duration} (checkpoint in {save_folder}); "
                      f"nothing to do. Raise --max_duration to train longer.", flush=True)
            trainer.close()
            if uploads is not None:
                uploads.finish()
            return 0
        start_batch, start_tokens, t0 = int(state.timestamp.batch), int(state.timestamp.token), time.time()
        if start_batch and dist.get_global_rank() == 0:
            print(f"{cfg.run_name}: resuming from the checkpoint at batch {start_batch} ({start_tokens:,} tokens) "
                  f"in {save_folder}, training to {state.max_duration}", flush=True)
        try:
            trainer.fit()
        except Exception as e:  # a lost S3 connection or a full disk is one line, not a traceback
            if isinstance(e, UserError):
                raise
            if (full := failed_write(e, save_folder if not remote else run_dir)) is not None:
                raise UserError(f"{full}: free space on that disk (or choose another --save_folder), then re-run "
                                "with --autoresume=True: it continues from the last whole checkpoint") from None
            if (line := cluster.lost_peer(e) or lost_connection(e, "to S3 during training")) is None:
                raise
            raise UserError(line) from None
        trainer.close()
        if dist.get_global_rank() == 0:  # report.md: what a person reads instead of the logs (report.py)
            write_report(run_dir)
            for name in (REPORT, PLOT) if uploads is not None else ():
                uploads.upload_file_async(remote_name(name), os.path.join(run_dir, name), overwrite=True)
        if uploads is not None:  # every checkpoint, model.pt, log and the report is in the bucket before "done"
            uploads.finish()
        if preemption.stopped_at is not None:  # SIGTERM: the checkpoint of that batch is written (and uploaded)
            preemption.finish()
            if dist.get_global_rank() == 0:
                print(f"{cfg.run_name}: stopped by SIGTERM after batch {preemption.stopped_at}, checkpoint saved in "
                      f"{save_folder}; to continue, run the same command with --autoresume=True (exit status "
                      f"{PREEMPTED})", flush=True)
            return PREEMPTED
    finally:
        if uploads is not None:  # the local copies go, also when the run fails
            uploads.shutdown()
    if dist.get_global_rank() == 0:
        seconds = time.time() - t0
        batches, tokens = int(state.timestamp.batch) - start_batch, int(state.timestamp.token) - start_tokens
        loss = state.total_loss_dict.get("loss/train/total", math.nan) if state.total_loss_dict else math.nan
        last = metrics_log.last_eval
        val = "".join(f", {k.replace('_', ' ')} {last[k]:.4f}" for k in ("val_loss", "val_bpb") if k in last)
        resumed = f" (resumed at batch {start_batch})" if start_batch else ""
        print(f"done: {batches} batches, {tokens:,} tokens in {seconds:.1f} s ({tokens / max(seconds, 1e-9):,.0f} "
              f"tokens/s){resumed}; train loss {loss:.4f}{val}; export {os.path.join(save_folder, EXPORT_NAME)}",
              flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
