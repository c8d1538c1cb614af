"""The run around trainer.fit(): config.json and the trackers before it (the W&B run an autoresume continues), the fit
itself (a lost connection, node or disk is one line), and after it report.md, the uploads and the summary line; a
preemption at any point said as one. train.py calls `fit_and_report` once the Trainer is built, and wraps its
start-up in `preempted_during_start_up`."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import secrets
import subprocess
import time
from typing import NamedTuple, Optional

import numpy as np
import torch
from composer import Trainer

from pilegpt.checkpoint import EXPORT_NAME
from pilegpt.common import UserError, atomic_write_text, failed_write, mask_secrets, one_line
from pilegpt.s3 import lost_connection
from pilegpt.train.callbacks import MetricsLog, figure
from pilegpt.train.config import TrainConfig, used_settings
from pilegpt.train.data.loaders import mix_shares
from pilegpt.train.report import PLOT, REPORT, write_report
from pilegpt.train.run import cluster, data_record
from pilegpt.train.run.cluster import World
from pilegpt.train.run.folder import CONFIG_JSON, RunFolder, torch_history
from pilegpt.train.run.preemption import PREEMPTED, StopOnSignal
from pilegpt.train.run.uploads import S3Uploads

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class LoggersAndCallbacks(NamedTuple):
    """What the Trainer reports to (train.py's build_loggers_and_callbacks), and the parts of it the run's end reads."""
    loggers: list
    callbacks: list
    metrics_log: MetricsLog  # last_eval: the validation figures of the summary line
    preemption: StopOnSignal  # stopped_at: whether SIGTERM ended the run
    uploads: Optional[S3Uploads]  # an s3:// run's uploader (one of the loggers too), else None
    wandb_id: Optional[str] = None  # the run's W&B run (wandb_run_id), recorded in config.json


WANDB_ID = "wandb_id"  # config.json's record of the W&B run the run logs to
W_AND_B_ID = re.compile(r"[a-z0-9_-]{1,64}")  # W&B's run ids: no / \ # ? % : and at most 64 characters


def kept_wandb_id(run_dir: str) -> Optional[str]:
    """The W&B run id the run's config.json keeps, or None (no config.json, or a run that never logged to W&B); a
    damaged one is one line."""
    path = os.path.join(run_dir, CONFIG_JSON)
    try:
        with open(path) as f:
            kept = json.load(f).get(WANDB_ID)
    except (OSError, ValueError, AttributeError):
        return None  # check_same_model refuses a damaged config.json before any resume
    if kept is not None and not (isinstance(kept, str) and W_AND_B_ID.fullmatch(kept)):
        raise UserError(f"{path}: {WANDB_ID}={str(kept)[:80]!r} is not a W&B run id (a-z, 0-9, - and _, at most 64): "
                        f"restore config.json, or delete its {WANDB_ID} to log the resumed run as a new W&B run")
    return kept


def wandb_run_id(cfg: TrainConfig, folder: RunFolder) -> Optional[str]:
    """The W&B run this run logs to: the one config.json keeps when autoresume continues a checkpoint (so a resumed
    run goes on in the same W&B run), else a new id; a run without wandb_log keeps the id it has for a later resume
    that turns W&B back on. A run that starts over (no checkpoint yet, save_overwrite) is a new W&B run: its batches
    start again from 1, where a W&B run takes only steps above its last."""
    kept = kept_wandb_id(folder.run_dir) if folder.resuming else None
    if not cfg.wandb_log:
        return kept
    return kept or secrets.token_hex(4)


@contextlib.contextmanager
def preempted_during_start_up():
    """Before training starts, Composer's own handler turns SIGTERM into sys.exit(143) (StopOnSignal takes over at
    FIT_START, preemption.py): say so in one line, so that a preemption during start-up reads as one."""
    try:
        yield
    except SystemExit as e:
        if e.code == PREEMPTED:
            print("train.py: stopped by SIGTERM during start-up, before training: no new checkpoint; to continue, run "
                  f"the same command with --autoresume=True (exit status {PREEMPTED})", flush=True)
        raise


def fit_and_report(trainer: Trainer, out: LoggersAndCallbacks, cfg: TrainConfig, folder: RunFolder, world: World,
                   device: str, precision: str) -> int:
    """Record the run (config.json), train to max_duration, write the report and the summary; the exit status."""
    try:
        write_run_info(trainer, cfg, folder, world, device, precision, out.wandb_id)
        state = trainer.state
        if state.timestamp.get(state.max_duration.unit) >= state.max_duration:
            if world.rank == 0:
                print(f"{cfg.run_name}: already trained for {state.max_duration} (checkpoint in "
                      f"{folder.save_folder}); nothing to do. Raise --max_duration to train longer.", flush=True)
            trainer.close()
            if out.uploads is not None:
                out.uploads.finish()
            return 0
        start_batch, start_tokens, t0 = int(state.timestamp.batch), int(state.timestamp.token), time.time()
        if start_batch and world.rank == 0:
            print(f"{cfg.run_name}: resuming from the checkpoint at batch {start_batch} ({start_tokens:,} tokens) "
                  f"in {folder.save_folder}, training to {state.max_duration}", flush=True)
        fit(trainer, folder, compiled=cfg.compile is True)
        finish(trainer, out, folder, world)
        if out.preemption.stopped_at is not None:  # SIGTERM: the checkpoint of that batch is written (and uploaded)
            out.preemption.finish()
            if world.rank == 0:
                print(f"{cfg.run_name}: stopped by SIGTERM after batch {out.preemption.stopped_at}, checkpoint saved "
                      f"in {folder.save_folder} {out.preemption.seconds_since_notice():.1f} s after the notice "
                      f"(grace: preemption_grace_s={cfg.preemption_grace_s:g} s); to continue, run the same command "
                      f"with --autoresume=True (exit status {PREEMPTED})", flush=True)
            return PREEMPTED
    finally:
        if out.uploads is not None:  # the local copies go, also when the run fails
            out.uploads.shutdown()
    if world.rank == 0:
        print_summary(state, start_batch, start_tokens, time.time() - t0, out.metrics_log, folder)
    return 0


def run_info(cfg: TrainConfig, world_size: int, device: str, precision: str, data_mix: Optional[dict] = None) -> dict:
    """What produced the run (config.json): the settings, the machine, the library versions, the commit; with a
    data_mix, each component's realised share of an epoch (loaders.mix_shares)."""
    import composer
    import streaming
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=REPO).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"config": used_settings(cfg), "world_size": world_size, "device": device, "precision": precision,
            "gpu": torch.cuda.get_device_name(0) if device == "gpu" else None, "git_commit": commit,
            "python": platform.python_version(), "torch": torch.__version__, "composer": composer.__version__,
            "streaming": streaming.__version__, "numpy": np.__version__, "host": platform.node(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), **({"data_mix": data_mix} if data_mix else {})}


def write_run_info(trainer: Trainer, cfg: TrainConfig, folder: RunFolder, world: World, device: str,
                   precision: str, wandb_id: Optional[str] = None) -> None:
    """data.json and config.json (with the W&B run's id) beside the checkpoints (rank 0), and every setting to the
    trackers (W&B, MLflow, TensorBoard)."""
    if world.rank == 0:
        folder.made.started()  # the run's folders stay from here on, whatever happens
        data_record.write(folder.data, folder.save_folder)  # what it trains on (compared when it resumes)
        path = os.path.join(folder.run_dir, CONFIG_JSON)
        shares = mix_shares(cfg, trainer.state.train_dataloader.dataset)
        info = run_info(cfg, world.size, device, precision, shares)
        earlier = [v for v in torch_history(folder.run_dir) if v != info["torch"]] if folder.resuming else []
        if earlier:  # a run resumed on another torch keeps the record of the ones it trained on before
            info["torch_earlier"] = list(dict.fromkeys(earlier))
        if wandb_id is not None:
            info[WANDB_ID] = wandb_id
        atomic_write_text(path, mask_secrets(json.dumps(info, indent=2)) + "\n")
        if folder.remote:
            trainer.logger.upload_file(folder.remote_name(CONFIG_JSON), path, overwrite=True)
    trainer.logger.log_hyperparameters(used_settings(cfg))


def fit(trainer: Trainer, folder: RunFolder, compiled: bool = False) -> None:
    """trainer.fit(); a lost S3 connection, a lost node, a full disk or a failed torch.compile is one line, not a
    traceback."""
    try:
        trainer.fit()
    except Exception as e:
        if isinstance(e, UserError):
            raise
        if compiled and (line := compile_failure(e)) is not None:
            raise UserError(line) from None
        if (full := failed_write(e, folder.run_dir if folder.remote else folder.save_folder)) is not None:
            raise UserError(f"{full}: free space on that disk (or choose another --save_folder), then re-run "
                            "with --autoresume=True: it continues from the last whole checkpoint") from None
        if (line := cluster.lost_peer(e) or lost_connection(e, "to S3 during training")) is None:
            raise
        raise UserError(line) from None


def compile_failure(e: BaseException) -> Optional[str]:
    """One line for an error raised by torch.compile (TorchDynamo or Inductor, also as the cause of another), naming
    the way around it; None for any other error."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
            return (f"torch.compile failed ({type(e).__name__}: {one_line(e)[:300]}); train without it: "
                    "--compile=False")
        e = e.__cause__ or e.__context__
    return None


def finish(trainer: Trainer, out: LoggersAndCallbacks, folder: RunFolder, world: World) -> None:
    """Close the trainer, write report.md (what a person reads instead of the logs: report.py), and wait until
    every checkpoint, model.pt, log and the report is in the bucket of an s3:// run."""
    trainer.close()
    if world.rank == 0 and write_report_or_say_why(folder.run_dir):
        for name in (REPORT, PLOT) if out.uploads is not None else ():
            out.uploads.upload_file_async(folder.remote_name(name), os.path.join(folder.run_dir, name), overwrite=True)
    if out.uploads is not None:
        out.uploads.finish()


def write_report_or_say_why(run_dir: str) -> bool:
    """report.md and loss.png (report.py); whether they were written. A report that cannot be written (a damaged
    file in the run folder, a full disk) is one line: it never changes the run's outcome or exit status."""
    try:
        write_report(run_dir)
        return True
    except Exception as e:  # the checkpoints and model.pt are written already: the run itself succeeded
        print(f"note: report.md not written ({one_line(e)}); the run's checkpoints are complete; `python report.py "
              f"{run_dir}` writes it once that is fixed", flush=True)
        return False


def print_summary(state, start_batch: int, start_tokens: int, seconds: float, metrics_log: MetricsLog,
                  folder: RunFolder) -> None:
    """The run's last line: what it trained, how fast, its last losses and where its export is."""
    batches, tokens = int(state.timestamp.batch) - start_batch, int(state.timestamp.token) - start_tokens
    loss = state.total_loss_dict.get("loss/train/total", math.nan) if state.total_loss_dict else math.nan
    last = metrics_log.last_eval
    val = "".join(f", {k.replace('_', ' ')} {figure(last[k])}" for k in ("val_loss", "val_bpb") if k in last)
    resumed = f" (resumed at batch {start_batch})" if start_batch else ""
    print(f"done: {batches} batches, {tokens:,} tokens in {seconds:.1f} s ({tokens / max(seconds, 1e-9):,.0f} "
          f"tokens/s){resumed}; train loss {loss:.4f}{val}; export {os.path.join(folder.save_folder, EXPORT_NAME)}",
          flush=True)
