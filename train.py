"""Train a GPT (model.py) with the Composer Trainer, from prepare_data .bin files or MDS shards (local or S3).

Usage:
    python train.py config/tiny.py                                  # one process: CPU, or one GPU
    python train.py config/tiny.py --max_duration=50ba --n_layer=4  # --key=value overrides a config value
    composer -n 8 train.py config/pile.py                           # 8 GPUs of one node, data parallel
    composer -n 2 train.py config/tiny.py                           # 2 CPU processes (gloo), for testing
    python train.py --help                                          # every setting, its default and meaning

Configuration: `TrainConfig` below is the one list of settings (nanoGPT's names). Config files
(config/*.py) are plain Python assignments `name = value`, read with runpy; a file may set
`base = "pile.py"` to start from another file (a path relative to its own folder). Files apply in the
order given, then `--key=value` arguments (setting data_dir drops an earlier data_remote and the other
way round); unknown keys and wrong types are errors. Values are Python literals (`--bias=False`,
`--data_remote="['s3://a/mds', 's3://b/mds']"`, `--run_name=None`); anything that is not a literal stays
a string (`--max_duration=10ba`). `.env` in the working directory is loaded
first, so config files can read S3 settings and paths from the environment.

Data (a batch is {"x": LongTensor (B, T), "y": LongTensor (B, T)}, y = x shifted by one token):
    data_dir=DIR           DIR/train.bin (+ val.bin, meta.json) from prepare_data.py: sample i is the
                           window tokens[i*T : i*T+T+1] (non-overlapping windows, shuffled every epoch by a
                           DistributedSampler, so each token is seen once per epoch and ranks never overlap);
                           or DIR/train/ (+ DIR/val/) MDS folders from to_mds.py.
    data_remote=ROOT       MDS root(s) holding train/ (+ val/): a local folder or s3://bucket/prefix, read by
                           Streaming's StreamingDataset with a local cache under data_local; a list of roots
                           is read as several streams of one dataset.
A missing validation split just means no evaluation.

Outputs (save_folder, local or s3://; default runs/{run_name}):
    ep{E}-ba{B}-rank{R}.pt, latest-rank0.pt   Composer checkpoints (every save_interval and at the end)
    model.pt                                  weights-only export for sample.py (same schedule)
    config.json                               the final config, library versions, git commit
    metrics.jsonl                             one JSON line per batch: loss, lr, tokens, throughput, val loss
    logs/{start time}-rank{R}.txt             Composer's file log, one per process and start
With an s3:// save_folder, config.json, model.pt, metrics.jsonl and the logs are written to runs/{run_name}
locally and uploaded (metrics as logs/{start time}-metrics.jsonl). Re-running with autoresume=True continues
from the last checkpoint, data position included (metrics.jsonl then repeats the batches after it).
"""

from __future__ import annotations

import ast
import ctypes
import dataclasses
import difflib
import hashlib
import inspect
import json
import math
import os
import platform
import re
import runpy
import subprocess
import sys
import time
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
from composer import Trainer
from composer.algorithms import GradientClipping
from composer.callbacks import LRMonitor, MemoryMonitor, RuntimeEstimator, SpeedMonitor
from composer.core import Callback, DataSpec, Evaluator, Event, State, Time, TimeUnit
from composer.core.precision import get_precision_context
from composer.loggers import FileLogger, Logger, LoggerDestination
from composer.metrics.nlp import LanguageCrossEntropy, LanguagePerplexity
from composer.models import ComposerModel
from composer.optim import CosineAnnealingWithWarmupScheduler
from composer.utils import create_interval_scheduler, dist, model_eval_mode, reproducibility
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from common import UserError, atomic_write_text, load_dotenv_file, mask_secrets, read_meta, run_main, s3_endpoint_url
from model import EXPORT_NAME, GPT, Block, GPTConfig, save_export

EOT_TOKEN = 50256  # GPT-2's <|endoftext|>: the sample prompt when sample_prompt is ""
CONFIG_JSON = "config.json"
METRICS_JSONL = "metrics.jsonl"


@dataclass
class TrainConfig:
    # model (GPTConfig)
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # residual stream width; a multiple of n_head
    block_size: int = 1024  # tokens per training sample (context length T)
    vocab_size: int = 50257  # GPT-2 BPE; 50304 (a multiple of 64) runs faster on GPU
    dropout: float = 0.0  # 0.0 for pretraining
    bias: bool = True  # biases in Linear and LayerNorm, like GPT-2
    # data
    data_dir: Optional[str] = None  # local folder: prepare_data's train.bin/val.bin, or MDS train/ and val/
    data_remote: Union[str, list[str], None] = None  # MDS root with train/ (+ val/), local or s3://; a list: streams
    data_local: str = "data/mds_cache"  # local cache of remote MDS shards (one subfolder per root and split)
    data_format: str = "auto"  # "auto" (look inside data_dir), "bin" or "mds"
    num_workers: int = 0  # DataLoader worker processes per rank (0 = load in the training process)
    # batch
    global_batch_size: int = 480  # sequences per optimizer step over all ranks (x block_size tokens)
    device_train_microbatch_size: Union[int, str] = 12  # sequences per forward/backward per device; "auto" (GPU)
    device_eval_batch_size: Optional[int] = None  # eval sequences per batch per device; None = the train microbatch
    # optimizer and schedule
    learning_rate: float = 6e-4  # peak learning rate, reached after warmup
    min_lr: float = 6e-5  # learning rate at the end of the cosine decay
    weight_decay: float = 0.1  # AdamW weight decay on 2-D weights only
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # clip the gradient's global norm to this; 0 = no clipping
    warmup: str = "700ba"  # linear warmup, a Composer time string in max_duration's unit (or "0.01dur")
    max_duration: str = "19073ba"  # training length: "19073ba" batches, "10000000000tok" tokens, "1ep" epochs
    # evaluation
    eval_interval: str = "1000ba"  # evaluate on the val split this often (and at the end)
    eval_subset_num_batches: int = 20  # val batches per evaluation; -1 = the whole val split
    sample_prompt: str = ""  # prompt of the text sample printed at each evaluation; "" = <|endoftext|>
    sample_length: int = 48  # tokens generated for that sample; 0 = no samples
    # system
    device: str = "auto"  # "auto" (GPU when CUDA is available), "gpu" or "cpu"
    precision: str = "auto"  # "auto" (amp_bf16 on GPU, fp32 on CPU), "fp32", "amp_bf16", "amp_fp16"
    compile: bool = False  # torch.compile the model
    fsdp: bool = False  # shard parameters, gradients and optimizer state over GPUs (FSDP FULL_SHARD)
    seed: int = 1337  # seeds model init, data order and dropout
    cpu_malloc_tune: bool = True  # on CPU with glibc: keep big freed blocks for reuse (mallopt), 2-4x faster steps
    # checkpoints and logs
    run_name: Optional[str] = None  # name of the run; None = the last config file's name (e.g. "pile")
    save_folder: str = "runs/{run_name}"  # checkpoints, export, config and logs: local folder or s3://bucket/prefix
    save_interval: str = "1000ba"  # checkpoint (and model.pt export) this often, and at the end
    save_num_checkpoints_to_keep: int = -1  # local checkpoints kept; -1 = all
    save_overwrite: bool = False  # allow a new run to overwrite checkpoints already in save_folder
    autoresume: bool = False  # continue from the last checkpoint in save_folder when there is one
    progress_bar: bool = True  # Composer's progress bar; False prints one line every log_interval batches
    log_interval: int = 10  # batches between one-line progress logs (when progress_bar=False)
    speed_window: int = 50  # batches averaged by SpeedMonitor for tokens/s and MFU
    wandb_log: bool = False  # log to Weights & Biases (pip install wandb; WANDB_API_KEY)
    wandb_project: str = "pile-gpt"  # W&B project
    tensorboard_log: bool = False  # write TensorBoard event files to tensorboard_dir (pip install tensorboard)
    tensorboard_dir: str = "tb_logs/{run_name}"  # TensorBoard folder
    mlflow_log: bool = False  # log to MLflow (pip install mlflow; MLFLOW_TRACKING_URI)
    mlflow_experiment: str = "pile-gpt"  # MLflow experiment name
    debug_batch_log: bool = False  # write each rank's per-batch sample hashes to batches-rank{R}.jsonl (tests)

    def __post_init__(self):
        errors = []
        if self.n_embd % self.n_head:
            errors.append(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "global_batch_size"):
            if getattr(self, name) < 1:
                errors.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            errors.append(f"dropout must be in [0, 1), got {self.dropout}")
        if self.data_format not in ("auto", "bin", "mds"):
            errors.append(f"data_format must be 'auto', 'bin' or 'mds', got {self.data_format!r}")
        if self.data_dir is None and self.data_remote is None:
            errors.append("no data: set data_dir (a prepare_data or to_mds folder) or data_remote (MDS, local or "
                          "s3://)")
        if self.data_dir is not None and self.data_remote is not None:
            errors.append(f"both data_dir ({self.data_dir}) and data_remote are set: pass --data_remote=None "
                          "or --data_dir=None")
        if self.data_dir is not None and "://" in self.data_dir:
            errors.append(f"data_dir must be a local folder, got {self.data_dir}: use data_remote for MDS on S3")
        if self.data_remote is not None and self.data_format == "bin":
            errors.append("data_remote is read as MDS: data_format='bin' only works with data_dir")
        if isinstance(self.data_remote, list) and not self.data_remote:
            errors.append("data_remote is an empty list")
        if self.num_workers < 0:
            errors.append(f"num_workers must be >= 0, got {self.num_workers}")
        mb = self.device_train_microbatch_size
        if isinstance(mb, str) and mb != "auto":
            errors.append(f"device_train_microbatch_size must be an integer or 'auto', got {mb!r}")
        if isinstance(mb, int) and mb < 1:
            errors.append(f"device_train_microbatch_size must be >= 1, got {mb}")
        if self.device_eval_batch_size is not None and self.device_eval_batch_size < 1:
            errors.append(f"device_eval_batch_size must be >= 1, got {self.device_eval_batch_size}")
        # The launcher (composer -n N) sets WORLD_SIZE: one global batch must split evenly over ranks and
        # microbatches, so that 1 or 8 devices train on exactly the same batches. A microbatch larger than
        # the per-process batch just means one microbatch.
        world = int(os.environ.get("WORLD_SIZE", "1"))
        per_rank = self.global_batch_size // world
        if self.global_batch_size % world:
            errors.append(f"global_batch_size ({self.global_batch_size}) must be divisible by the number of "
                          f"processes ({world})")
        elif isinstance(mb, int) and 1 <= mb < per_rank and per_rank % mb:
            fits = [d for d in range(1, mb + 1) if per_rank % d == 0]
            errors.append(f"the per-process batch ({self.global_batch_size} / {world} = {per_rank}) must be a "
                          f"multiple of device_train_microbatch_size ({mb}); e.g. {fits[-1]}")
        if not 0 < self.learning_rate:
            errors.append(f"learning_rate must be > 0, got {self.learning_rate}")
        elif not 0 <= self.min_lr <= self.learning_rate:
            errors.append(f"min_lr must be in [0, learning_rate={self.learning_rate}], got {self.min_lr}")
        if self.grad_clip < 0:
            errors.append(f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}")
        units = {}
        for name in ("warmup", "max_duration", "eval_interval", "save_interval"):
            try:
                units[name] = Time.from_timestring(getattr(self, name)).unit
            except (ValueError, TypeError) as e:
                errors.append(f"{name}={getattr(self, name)!r} is not a Composer time string like '1000ba', "
                              f"'10000000tok', '1ep' or '0.1dur' ({e})")
        if "max_duration" in units and units["max_duration"] == TimeUnit.DURATION:
            errors.append("max_duration cannot be in 'dur' (a fraction of itself)")
        elif "warmup" in units and "max_duration" in units:
            as_batches = {TimeUnit.EPOCH: TimeUnit.BATCH}  # how Composer's scheduler converts epochs
            warm = as_batches.get(units["warmup"], units["warmup"])
            total = as_batches.get(units["max_duration"], units["max_duration"])
            if warm not in (total, TimeUnit.DURATION):
                errors.append(f"warmup ({self.warmup}) must use max_duration's unit ({self.max_duration}) or "
                              f"be a fraction like '0.01dur'")
        if self.eval_subset_num_batches == 0 or self.eval_subset_num_batches < -1:
            errors.append(f"eval_subset_num_batches must be -1 (all) or >= 1, got {self.eval_subset_num_batches}")
        if self.sample_length < 0:
            errors.append(f"sample_length must be >= 0, got {self.sample_length}")
        if self.device not in ("auto", "gpu", "cpu"):
            errors.append(f"device must be 'auto', 'gpu' or 'cpu', got {self.device!r}")
        if self.precision not in ("auto", "fp32", "amp_bf16", "amp_fp16"):
            errors.append(f"precision must be 'auto', 'fp32', 'amp_bf16' or 'amp_fp16', got {self.precision!r}")
        if self.autoresume and not self.run_name:
            errors.append("autoresume needs a run_name: the name that finds the run's checkpoints again")
        if self.log_interval < 1 or self.speed_window < 1:
            errors.append("log_interval and speed_window must be >= 1")
        if errors:
            raise ValueError("; ".join(errors))

    def model_config(self) -> GPTConfig:
        return GPTConfig(block_size=self.block_size, vocab_size=self.vocab_size, n_layer=self.n_layer,
                         n_head=self.n_head, n_embd=self.n_embd, dropout=self.dropout, bias=self.bias)


# ----------------------------------------------------------------------------------------------------------
# Configuration: config files + --key=value, typed by TrainConfig's annotations.

def config_field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig, globalns=globals())


def config_field_comments() -> dict[str, str]:
    """Each field's one-line comment from the source of TrainConfig (for --help)."""
    comments = {}
    for line in inspect.getsource(TrainConfig).splitlines():
        m = re.match(r"\s+(\w+): [^=]+=.*?  # (.*)$", line)
        if m:
            comments[m.group(1)] = m.group(2)
    return comments


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "None"
    if typing.get_origin(tp) is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return tp.__name__


def _matches(value: Any, tp: Any) -> tuple[bool, Any]:
    """Whether value fits type tp (an int fits a float field); returns (ok, converted value)."""
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if tp is str:
        return isinstance(value, str), value
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, (list, tuple)):
            converted = [_matches(v, item) for v in value]
            if all(ok for ok, _ in converted):
                return True, [v for _, v in converted]
        return False, value
    raise TypeError(f"unsupported config type {tp}")


def _alternatives(tp: Any) -> tuple:
    return typing.get_args(tp) if typing.get_origin(tp) is Union else (tp,)


def parse_cli_value(raw: str, tp: Any) -> Any:
    """A --key=value string as the Python value for a field of type tp.

    Python literals (numbers, True/False, None, lists, quoted strings) are parsed; 'true'/'false' work for
    bools; any other text is kept as a string (so '10ba' and 's3://bucket/x' need no quotes).
    """
    alts = _alternatives(tp)
    if bool in alts and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if type(None) in alts and raw in ("None", "none", "null"):
        return None
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw
    if any(_matches(value, a)[0] for a in alts):
        return value
    if str in alts and not isinstance(value, (list, tuple, dict, set)):
        return raw  # e.g. --run_name=123 is the text "123"; a bad list stays a (wrong-typed) list
    return value


def coerce_value(name: str, value: Any, tp: Any, source: str) -> Any:
    for alt in _alternatives(tp):
        ok, converted = _matches(value, alt)
        if ok:
            return converted
    raise UserError(f"{source}: {name} must be {_type_name(tp)}, got {value!r}")


def unknown_key_error(key: str, source: str) -> UserError:
    names = list(config_field_types())
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else "; run `python train.py --help` for the list"
    return UserError(f"{source}: unknown config key {key!r}{hint}")


def read_config_file(path: str, _seen: Optional[list[str]] = None) -> dict[str, Any]:
    """The assignments of a config file (after those of its `base` file, if it sets one)."""
    seen = (_seen or []) + [os.path.realpath(path)]
    if not os.path.isfile(path):
        raise UserError(f"config file {path} not found")
    try:
        namespace = runpy.run_path(path)
    except Exception as e:
        raise UserError(f"config file {path} failed to run: {type(e).__name__}: {e}") from None
    values = {}
    for key, value in namespace.items():
        if key.startswith("_") or isinstance(value, (types.ModuleType, types.FunctionType, type)):
            continue  # imports, helpers, __file__ and friends
        values[key] = value
    base = values.pop("base", None)
    if base is None:
        return values
    if not isinstance(base, str):
        raise UserError(f"config file {path}: base must be a path string, got {base!r}")
    base_path = os.path.join(os.path.dirname(path), base)
    if os.path.realpath(base_path) in seen:
        raise UserError(f"config file {path}: base {base} includes itself (through {' -> '.join(seen)})")
    return {**read_config_file(base_path, seen), **values}


def config_usage() -> str:
    comments = config_field_comments()
    lines = [__doc__.split("\n\n")[1], "", "Settings (--key=value; default, meaning):"]
    for f in dataclasses.fields(TrainConfig):
        lines.append(f"  {f.name} = {f.default!r}  ({_type_name(config_field_types()[f.name])}) "
                     f"{comments.get(f.name, '')}")
    return "\n".join(lines)


def load_config(argv: Sequence[str]) -> TrainConfig:
    """TrainConfig from config files and --key=value arguments, in the order given (later wins)."""
    types_ = config_field_types()
    values: dict[str, Any] = {}
    files = []
    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise UserError(f"argument {arg}: write --key=value (one argument, no space)")
            key, raw = arg[2:].split("=", 1)
            if key not in types_:
                raise unknown_key_error(key, f"argument {arg}")
            source = {key: coerce_value(key, parse_cli_value(raw, types_[key]), types_[key], f"argument {arg}")}
        elif arg.startswith("-"):
            raise UserError(f"unknown option {arg}: settings are --key=value, see `python train.py --help`")
        else:
            files.append(arg)
            source = {}
            for key, value in read_config_file(arg).items():
                if key not in types_:
                    raise unknown_key_error(key, f"config file {arg}")
                source[key] = coerce_value(key, value, types_[key], f"config file {arg}")
        # data_dir and data_remote are two ways to name the data: setting one replaces the other
        for key, other in (("data_dir", "data_remote"), ("data_remote", "data_dir")):
            if key in source and other not in source:
                values.pop(other, None)
        values.update(source)
    if values.get("run_name") is None and files:
        values["run_name"] = Path(files[-1]).stem
    try:
        return TrainConfig(**values)
    except ValueError as e:
        raise UserError(f"bad config: {e}") from None


def config_text(cfg: TrainConfig) -> str:
    width = max(len(f.name) for f in dataclasses.fields(cfg))
    return "\n".join(f"  {k:<{width}} = {v!r}" for k, v in dataclasses.asdict(cfg).items())


# ----------------------------------------------------------------------------------------------------------
# Data

class BinDataset(Dataset):
    """Non-overlapping windows of T+1 tokens of a prepare_data .bin file: sample i = tokens[i*T : i*T+T+1].

    x = window[:-1], y = window[1:]; every token is predicted once per epoch. state_dict/load_state_dict
    let Composer resume mid-epoch without re-reading the data (see ResumableSampler).
    """

    def __init__(self, path: str, block_size: int, dtype: str = "uint16"):
        self.path, self.block_size, self.dtype = path, block_size, np.dtype(dtype)
        self.num_tokens = os.path.getsize(path) // self.dtype.itemsize
        self.tokens = None  # opened lazily, once per DataLoader worker
        self.resume_samples = 0  # global samples of the current epoch already trained (set by load_state_dict)

    def __len__(self) -> int:
        return max(0, (self.num_tokens - 1) // self.block_size)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        T = self.block_size
        window = torch.from_numpy(self.tokens[i * T: i * T + T + 1].astype(np.int64))
        return {"x": window[:-1], "y": window[1:]}

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        return {"sample_in_epoch": int(num_samples)}

    def load_state_dict(self, state: dict) -> None:
        self.resume_samples = int(state["sample_in_epoch"])


class ResumableSampler(DistributedSampler):
    """DistributedSampler that skips the samples a resumed run already trained on in this epoch, once.

    Composer sets the epoch (set_epoch) and calls BinDataset.load_state_dict on resume; the shuffle is a
    function of (seed, epoch) only, so skipping each rank's first sample_in_epoch / world_size indices
    restores the exact data position of the interrupted run.
    """

    def __iter__(self):
        indices = list(super().__iter__())
        skip = self.dataset.resume_samples // self.num_replicas
        self.dataset.resume_samples = 0
        return iter(indices[skip:])


def collate_mds(samples: list[dict]) -> dict[str, torch.Tensor]:
    """MDS samples (numpy x, y of any integer dtype) -> {"x": LongTensor (B, T), "y": LongTensor (B, T)}."""
    return {k: torch.from_numpy(np.stack([s[k] for s in samples]).astype(np.int64)) for k in ("x", "y")}


def num_tokens_in_batch(batch: dict) -> int:
    return int(batch["x"].numel())


def num_samples_in_batch(batch: dict) -> int:
    return int(batch["x"].shape[0])


def detect_format(cfg: TrainConfig) -> str:
    if cfg.data_remote is not None:
        return "mds"
    root = Path(cfg.data_dir)
    if not root.is_dir():
        raise UserError(f"data_dir {root} not found: make it with prepare_data.py --out-dir {root} (.bin) or "
                        f"to_mds.py --out {root} (MDS), or pass --data_dir=FOLDER")
    has_bin, has_mds = (root / "train.bin").is_file(), (root / "train" / "index.json").is_file()
    if cfg.data_format == "bin" or (cfg.data_format == "auto" and has_bin):
        if not has_bin:
            raise UserError(f"{root / 'train.bin'} not found: run prepare_data.py --out-dir {root}")
        return "bin"
    if cfg.data_format == "mds" or (cfg.data_format == "auto" and has_mds):
        if not has_mds:
            raise UserError(f"{root / 'train' / 'index.json'} not found: run to_mds.py --out {root}")
        return "mds"
    raise UserError(f"data_dir {root} holds neither train.bin (prepare_data.py) nor train/index.json "
                    f"(to_mds.py)")


def bin_split(cfg: TrainConfig, meta: dict, split: str) -> Optional[BinDataset]:
    path = Path(cfg.data_dir) / f"{split}.bin"
    if not path.is_file():
        return None
    dataset = BinDataset(str(path), cfg.block_size, meta.get("dtype", "uint16"))
    expected = meta.get("splits", {}).get(split, {}).get("tokens")
    if expected is not None and expected != dataset.num_tokens:
        raise UserError(f"{path} holds {dataset.num_tokens} tokens but meta.json says {expected}: the files "
                        f"do not belong together; re-run prepare_data.py --out-dir {cfg.data_dir}")
    if len(dataset) == 0:
        raise UserError(f"{path} has {dataset.num_tokens} tokens, fewer than one sample of block_size+1 = "
                        f"{cfg.block_size + 1}: use more data or a smaller --block_size")
    return dataset


def mds_roots(cfg: TrainConfig) -> list[str]:
    if cfg.data_remote is None:
        return [cfg.data_dir]
    return [cfg.data_remote] if isinstance(cfg.data_remote, str) else list(cfg.data_remote)


def split_s3_uri(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key.strip("/")


def s3_client():
    import boto3
    return boto3.client("s3", endpoint_url=s3_endpoint_url())


def mds_split_exists(root: str, split: str) -> bool:
    """Whether root/split/index.json exists (local path or s3://; other stores are assumed to have it)."""
    if "://" not in root:
        return (Path(root) / split / "index.json").is_file()
    if not root.startswith("s3://"):
        return True
    import botocore.exceptions
    bucket, prefix = split_s3_uri(root)
    key = "/".join(p for p in (prefix, split, "index.json") if p)
    try:
        s3_client().head_object(Bucket=bucket, Key=key)
        return True
    except botocore.exceptions.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code"))
        if code in ("404", "NoSuchKey", "NotFound"):
            return False
        raise UserError(f"cannot read s3://{bucket}/{key} ({code}): check the S3 credentials (AWS_* in the "
                        f"environment or .env) and S3_ENDPOINT_URL") from None
    except botocore.exceptions.BotoCoreError as e:
        raise UserError(f"cannot reach S3 for {root}: {e}; check AWS credentials and S3_ENDPOINT_URL") from None


def mds_cache_dir(cfg: TrainConfig, root: str, split: str) -> str:
    """A local cache folder of its own for each remote root and split (Streaming needs distinct ones)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", root.split("://", 1)[-1]).strip("_")
    return os.path.join(cfg.data_local, slug, split)


def mds_split(cfg: TrainConfig, split: str, batch_size: int, shuffle: bool):
    from streaming import Stream, StreamingDataset

    roots = mds_roots(cfg)
    present = [mds_split_exists(r, split) for r in roots]
    if not any(present):
        return None
    if not all(present):
        missing = [r for r, ok in zip(roots, present) if not ok]
        raise UserError(f"MDS split {split}/ is missing under {missing} but present under the other roots")
    streams = []
    for root in roots:
        if "://" in root:
            streams.append(Stream(remote=f"{root.rstrip('/')}/{split}", local=mds_cache_dir(cfg, root, split)))
        else:
            streams.append(Stream(local=os.path.join(root, split)))
    try:
        return StreamingDataset(streams=streams, batch_size=batch_size, shuffle=shuffle, shuffle_seed=cfg.seed)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"cannot open MDS split {split}/ of {roots}: {e}") from None


def check_sample_length(dataset, cfg: TrainConfig, what: str) -> None:
    length = len(dataset[0]["x"])
    if length != cfg.block_size:
        raise UserError(f"{what} holds samples of {length} tokens but block_size is {cfg.block_size}: pass "
                        f"--block_size={length} or re-run to_mds.py --block-size {cfg.block_size}")


def build_dataloaders(cfg: TrainConfig, world_size: int, rank: int, pin_memory: bool):
    """(train DataSpec, val DataSpec or None) for this rank."""
    per_rank = cfg.global_batch_size // world_size
    mb = cfg.device_train_microbatch_size
    eval_bs = cfg.device_eval_batch_size or (mb if isinstance(mb, int) else 8)
    loader_args = dict(num_workers=cfg.num_workers, pin_memory=pin_memory,
                       persistent_workers=cfg.num_workers > 0)
    if detect_format(cfg) == "bin":
        meta = read_meta(cfg.data_dir)
        if meta.get("vocab_size", 0) > cfg.vocab_size:
            raise UserError(f"{cfg.data_dir} uses a vocabulary of {meta['vocab_size']} tokens but vocab_size is "
                            f"{cfg.vocab_size}: pass --vocab_size={meta['vocab_size']}")
        train_set, val_set = bin_split(cfg, meta, "train"), bin_split(cfg, meta, "val")
        if train_set is None:
            raise UserError(f"{Path(cfg.data_dir) / 'train.bin'} not found: run prepare_data.py")
        if len(train_set) < cfg.global_batch_size:
            raise UserError(f"train.bin has {len(train_set)} samples of {cfg.block_size} tokens, fewer than one "
                            f"global batch ({cfg.global_batch_size}): lower --global_batch_size or --block_size")
        sampler = ResumableSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed,
                                   drop_last=True)
        train = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=True, **loader_args)
        val = None
        if val_set is not None:
            val_sampler = dist.get_sampler(val_set, shuffle=False, drop_last=False)
            val = DataLoader(val_set, batch_size=eval_bs, sampler=val_sampler, **loader_args)
    else:
        from streaming.base.util import clean_stale_shared_memory
        clean_stale_shared_memory()  # shared memory left by a crashed run breaks the next one
        train_set = mds_split(cfg, "train", per_rank, shuffle=True)
        if train_set is None:
            raise UserError(f"no MDS train split: expected train/index.json under {mds_roots(cfg)} "
                            f"(to_mds.py --out ROOT writes ROOT/train)")
        check_sample_length(train_set, cfg, f"MDS {mds_roots(cfg)}")
        train = DataLoader(train_set, batch_size=per_rank, collate_fn=collate_mds, drop_last=True, **loader_args)
        val_set = mds_split(cfg, "val", eval_bs, shuffle=False)
        val = None if val_set is None else DataLoader(val_set, batch_size=eval_bs, collate_fn=collate_mds,
                                                      **loader_args)
    spec = lambda loader: DataSpec(loader, get_num_tokens_in_batch=num_tokens_in_batch,  # noqa: E731
                                   get_num_samples_in_batch=num_samples_in_batch)
    return spec(train), (spec(val) if val is not None else None)


# ----------------------------------------------------------------------------------------------------------
# The Composer model

class _FromLoss:
    """Cross-entropy metric state (sum of token losses, token count) updated from the loss the forward pass
    already computed, instead of a second cross-entropy over the (B*T, V) logits."""

    def update(self, loss: torch.Tensor, num_tokens: torch.Tensor) -> None:
        self.sum_loss += loss.detach().float() * num_tokens
        self.total_items += num_tokens


class CrossEntropyFromLoss(_FromLoss, LanguageCrossEntropy):
    pass


class PerplexityFromLoss(_FromLoss, LanguagePerplexity):
    pass


class ComposerGPT(ComposerModel):
    """GPT as a ComposerModel: batch {"x", "y"} in, (logits (B, T, V), mean loss) out."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.model = GPT(config)
        # Wrap each transformer block in its own FSDP unit (when FSDP is on); the root unit keeps the
        # embeddings, ln_f and the lm_head tied to wte.
        self.model.fsdp_wrap_fn = lambda module: isinstance(module, Block)
        self._flops_per_token = self.model.flops_per_token()  # before FSDP shards the parameters
        self.train_metrics = {"LanguageCrossEntropy": CrossEntropyFromLoss(ignore_index=-1)}
        self.eval_metrics = {"LanguageCrossEntropy": CrossEntropyFromLoss(ignore_index=-1),
                             "LanguagePerplexity": PerplexityFromLoss(ignore_index=-1)}

    def forward(self, batch: dict):
        return self.model(batch["x"], targets=batch["y"])

    def loss(self, outputs, batch: dict) -> torch.Tensor:
        return outputs[1]

    def get_metrics(self, is_train: bool = False) -> dict:
        return self.train_metrics if is_train else self.eval_metrics

    def update_metric(self, batch: dict, outputs, metric) -> None:
        metric.update(outputs[1], (batch["y"] != -1).sum())

    def flops_per_batch(self, batch: dict) -> int:
        """Training FLOPs (forward + backward) of one batch, for SpeedMonitor's MFU."""
        return self._flops_per_token * batch["x"].numel()


def unwrap_composer_model(state: State) -> ComposerGPT:
    model = state.model
    while not isinstance(model, ComposerGPT):
        model = model.module  # DistributedDataParallel
    return model


# ----------------------------------------------------------------------------------------------------------
# Callbacks and loggers

class SampleText(Callback):
    """Generates a short text from the model after each evaluation and at the end of training (printed by rank 0)."""

    def __init__(self, prompt: str, max_new_tokens: int, block_size: int, temperature: float = 0.8, top_k: int = 200,
                 seed: int = 0):
        self.prompt, self.max_new_tokens, self.block_size = prompt, max_new_tokens, block_size
        self.temperature, self.top_k, self.seed = temperature, top_k, seed
        self.enc = None
        self.last_batch = -1

    def fit_start(self, state: State, logger: Logger) -> None:
        try:
            import tiktoken
            self.enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # no network and no TIKTOKEN_CACHE_DIR: training goes on without samples
            print(f"warning: no text samples, the GPT-2 tokenizer is not available ({type(e).__name__}: {e})")

    def eval_after_all(self, state: State, logger: Logger) -> None:
        self._sample(state, logger)

    def fit_end(self, state: State, logger: Logger) -> None:
        self._sample(state, logger)

    @torch.no_grad()
    def _sample(self, state: State, logger: Logger) -> None:
        batch = int(state.timestamp.batch)
        if self.enc is None or batch == self.last_batch:
            return
        self.last_batch = batch
        composer_model = unwrap_composer_model(state)
        if not state.fsdp_enabled and dist.get_global_rank() != 0:
            return  # under FSDP every rank must run the forward passes together
        gpt = composer_model.model  # the GPT, or its FSDP wrapper (which all-gathers the weights)
        idx = self.enc.encode_ordinary(self.prompt) or [EOT_TOKEN]
        device = next(composer_model.parameters()).device
        idx = torch.tensor([idx], dtype=torch.long, device=device)
        devices = [device] if device.type == "cuda" else []
        # A private RNG stream: sampling must not change the training run's random state.
        with torch.random.fork_rng(devices=devices), model_eval_mode(composer_model), \
                get_precision_context(state.precision):
            torch.manual_seed(self.seed + batch)
            for _ in range(self.max_new_tokens):
                logits, _ = gpt(idx[:, -self.block_size:])
                logits = logits[:, -1, :].float() / self.temperature  # (1, V)
                v, _ = torch.topk(logits, min(self.top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
                idx = torch.cat((idx, torch.multinomial(torch.softmax(logits, dim=-1), 1)), dim=1)
        if dist.get_global_rank() == 0:
            tokens = [t for t in idx[0].tolist() if t < self.enc.n_vocab]
            text = self.enc.decode(tokens)
            print(f"sample at batch {batch}: {text!r}", flush=True)
            logger.log_table(columns=["batch", "sample"], rows=[[batch, text]], name="samples")


class ExportModel(Callback):
    """Writes model.pt (model.save_export: weights only, for sample.py) every save_interval and at the end."""

    def __init__(self, save_interval: str, local_dir: str, remote_name: Optional[str]):
        self.should_export = create_interval_scheduler(save_interval)
        self.local_path = os.path.join(local_dir, EXPORT_NAME)
        self.remote_name = remote_name  # object key under the S3 bucket, or None for a local save_folder
        self.last_batch = -1

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event in (Event.BATCH_CHECKPOINT, Event.EPOCH_CHECKPOINT) and self.should_export(state, event):
            self.export(state, logger)
        elif event == Event.FIT_END:
            self.export(state, logger)

    def export(self, state: State, logger: Logger) -> None:
        batch = int(state.timestamp.batch)
        if batch == self.last_batch:
            return
        self.last_batch = batch
        composer_model = unwrap_composer_model(state)
        if state.fsdp_enabled:  # gather the full weights on rank 0 (every rank takes part), then copy them
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            weights = get_model_state_dict(composer_model.model,
                                           options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if dist.get_global_rank() != 0:
                return
            gpt = GPT(composer_model.model.config)
            gpt.load_state_dict(weights)
        else:
            if dist.get_global_rank() != 0:
                return
            gpt = composer_model.model
        save_export(gpt, self.local_path)
        if self.remote_name:
            logger.upload_file(self.remote_name, self.local_path, overwrite=True)


class MetricsLog(LoggerDestination):
    """Collects what Composer logs for each batch into one JSON line of metrics.jsonl (rank 0); prints
    a one-line summary every log_interval batches when the progress bar is off, and every evaluation."""

    KEYS = {"loss/train/total": "loss", "throughput/tokens_per_sec": "tokens_per_sec",
            "throughput/device/mfu": "mfu", "metrics/val/LanguageCrossEntropy": "val_loss",
            "metrics/val/LanguagePerplexity": "val_ppl", "lr-AdamW/group0": "lr"}

    def __init__(self, path: str, log_interval: int, print_steps: bool, remote_name: Optional[str] = None):
        self.path, self.log_interval, self.print_steps = path, log_interval, print_steps
        self.remote_name = remote_name  # object key to upload the file to at the end (S3 save_folder)
        self.row: dict[str, Any] = {}
        self.t0 = time.time()

    def fit_end(self, state: State, logger: Logger) -> None:
        if self.remote_name and dist.get_global_rank() == 0 and os.path.isfile(self.path):
            logger.upload_file(self.remote_name, self.path, overwrite=True)

    def log_metrics(self, metrics: dict[str, float], step: Optional[int] = None) -> None:
        for key, value in metrics.items():
            if key in self.KEYS:
                self.row[self.KEYS[key]] = float(value)

    def batch_checkpoint(self, state: State, logger: Logger) -> None:
        # After BATCH_END and the evaluations of this batch: the row is complete.
        if dist.get_global_rank() != 0:
            return
        batch, total = int(state.timestamp.batch), state.max_duration
        row = {"batch": batch, "tokens": int(state.timestamp.token), "time_s": round(time.time() - self.t0, 3),
               **self.row}
        self.row = {}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.print_steps and (batch % self.log_interval == 0 or batch == 1) and "loss" in row:
            tps = f"{row['tokens_per_sec'] / 1000:.1f}k tok/s" if "tokens_per_sec" in row else "- tok/s"
            mfu = f" | mfu {100 * row['mfu']:.1f}%" if "mfu" in row else ""
            print(f"step {batch}/{total} | loss {row['loss']:.4f} | lr {row.get('lr', 0):.2e} | {tps}{mfu}",
                  flush=True)
        if "val_loss" in row:
            print(f"step {batch}/{total} | val loss {row['val_loss']:.4f} | val ppl {row['val_ppl']:.2f}",
                  flush=True)


class BatchFingerprints(Callback):
    """Debug aid (debug_batch_log=True): each rank appends {"rank", "batch", "rows": [hash of each sample]}
    to batches-rank{R}.jsonl, so tests can check what data each rank saw and where a resumed run starts."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, f"batches-rank{dist.get_global_rank()}.jsonl")

    def after_dataloader(self, state: State, logger: Logger) -> None:
        rows = [hashlib.blake2b(r.cpu().numpy().tobytes(), digest_size=8).hexdigest() for r in state.batch["x"]]
        with open(self.path, "a") as f:
            f.write(json.dumps({"rank": dist.get_global_rank(), "batch": int(state.timestamp.batch) + 1,
                                "rows": rows}) + "\n")


# ----------------------------------------------------------------------------------------------------------
# Run folder helpers

def tune_glibc_malloc() -> bool:
    """Make glibc's malloc keep large freed blocks instead of returning them to the OS.

    By default glibc serves each allocation above its mmap threshold (at most 32 MB) with a fresh mmap and
    unmaps it on free, so the (B*T, vocab) logits and their gradients are page-faulted (zero-filled) anew
    at every step; on CPU that can cost more than the arithmetic. M_MMAP_MAX=0 serves them from the heap,
    and a 1 GB M_TRIM_THRESHOLD keeps the heap from shrinking between steps: the effect of jemalloc with
    retain:true (bench/bench_train.py measures both). Returns whether it applied.
    """
    if not sys.platform.startswith("linux") or "jemalloc" in os.environ.get("LD_PRELOAD", ""):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False


def existing_checkpoints(save_folder: str) -> list[str]:
    """Checkpoint files already in save_folder (local or s3://)."""
    pattern = re.compile(r"(^|/)(ep\d+-ba\d+-rank\d+\.pt|latest-rank\d+\.pt(\.symlink)?)$")
    if "://" not in save_folder:
        folder = Path(save_folder)
        return sorted(p.name for p in folder.iterdir() if pattern.search(p.name)) if folder.is_dir() else []
    if not save_folder.startswith("s3://"):
        return []
    bucket, prefix = split_s3_uri(save_folder)
    try:
        response = s3_client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "", MaxKeys=1000)
    except Exception as e:
        raise UserError(f"cannot list {save_folder} ({type(e).__name__}: {e}): check the S3 credentials, the "
                        f"bucket name and S3_ENDPOINT_URL") from None
    return sorted(o["Key"] for o in response.get("Contents", []) if pattern.search(o["Key"]))


def run_info(cfg: TrainConfig, world_size: int, device: str, precision: str) -> dict:
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


def build_loggers(cfg: TrainConfig) -> list:
    loggers = []
    try:
        if cfg.wandb_log:
            from composer.loggers import WandBLogger
            loggers.append(WandBLogger(project=cfg.wandb_project, name=cfg.run_name))
        if cfg.tensorboard_log:
            from composer.loggers import TensorboardLogger
            loggers.append(TensorboardLogger(log_dir=cfg.tensorboard_dir.format(run_name=cfg.run_name)))
        if cfg.mlflow_log:
            from composer.loggers import MLFlowLogger
            loggers.append(MLFlowLogger(experiment_name=cfg.mlflow_experiment, run_name=cfg.run_name))
    except ImportError as e:  # Composer raises MissingConditionalImportError (an ImportError) for these
        raise UserError(f"a logger's package is not installed: {str(e).splitlines()[0]}") from None
    return loggers


# ----------------------------------------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(config_usage())
        return 0
    load_dotenv_file()
    cfg = load_config(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_world = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

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

    save_folder = cfg.save_folder.format(run_name=cfg.run_name)
    remote = "://" in save_folder
    if remote:
        _, _, prefix = save_folder.partition("://")[2].partition("/")
        prefix = prefix.strip("/")
        remote_name = lambda name: f"{prefix}/{name}" if prefix else name  # noqa: E731
        run_dir = os.path.join("runs", cfg.run_name or "run")  # local logs and exports of a remote run
    else:
        remote_name = lambda name: None  # noqa: E731
        run_dir = save_folder
    if not cfg.autoresume and not cfg.save_overwrite:
        found = existing_checkpoints(save_folder)
        if found:
            raise UserError(f"{save_folder} already holds checkpoints ({found[0]}...): pass --autoresume=True to "
                            f"continue that run, --save_overwrite=True to start over, or another --run_name/--save_folder")
    if rank == 0:
        print(f"train.py: {world_size} process(es) on {device}, precision {precision}; config:\n"
              + mask_secrets(config_text(cfg)), flush=True)

    reproducibility.seed_all(cfg.seed)  # identical initial weights on every rank
    model = ComposerGPT(cfg.model_config())
    train_spec, val_spec = build_dataloaders(cfg, world_size, rank, pin_memory=device == "gpu")
    evaluators, eval_interval, eval_batches = None, 1, -1  # Composer's defaults: no evaluation at all
    if val_spec is not None:
        evaluators = Evaluator(label="val", dataloader=val_spec,
                               metric_names=["LanguageCrossEntropy", "LanguagePerplexity"])
        eval_interval, eval_batches = cfg.eval_interval, cfg.eval_subset_num_batches
    elif rank == 0:
        print("no validation split in the data: training without evaluation", flush=True)

    optimizer = torch.optim.AdamW(model.model.optim_groups(cfg.weight_decay), lr=cfg.learning_rate,
                                  betas=(cfg.beta1, cfg.beta2), fused=device == "gpu")
    scheduler = CosineAnnealingWithWarmupScheduler(t_warmup=cfg.warmup, alpha_f=cfg.min_lr / cfg.learning_rate)
    algorithms = [GradientClipping(clipping_type="norm", clipping_threshold=cfg.grad_clip)] if cfg.grad_clip else []

    start = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    log_file = os.path.join(run_dir, "logs", f"{start}-rank{{rank}}.txt")
    if remote:  # uploads config.json, model.pt and the logs (Composer's checkpoint saver has its own uploader)
        from composer.loggers import RemoteUploaderDownloader
        bucket_uri = "/".join(save_folder.split("/")[:3])  # scheme://bucket
        loggers_remote = [RemoteUploaderDownloader(bucket_uri=bucket_uri, use_procs=False)]
    else:
        loggers_remote = []
    loggers = [*loggers_remote,
               FileLogger(filename=log_file, remote_file_name=remote_name(f"logs/{start}-rank{{rank}}.txt")
                          if remote else None),
               MetricsLog(os.path.join(run_dir, METRICS_JSONL), cfg.log_interval, print_steps=not cfg.progress_bar,
                          remote_name=remote_name(f"logs/{start}-{METRICS_JSONL}")),
               *build_loggers(cfg)]
    callbacks = [SpeedMonitor(window_size=cfg.speed_window), LRMonitor(), RuntimeEstimator(),
                 ExportModel(cfg.save_interval, run_dir, remote_name(EXPORT_NAME))]
    if device == "gpu":
        callbacks.append(MemoryMonitor())
    if cfg.sample_length:
        callbacks.append(SampleText(cfg.sample_prompt, cfg.sample_length, cfg.block_size, seed=cfg.seed))
    if cfg.debug_batch_log:
        callbacks.append(BatchFingerprints(run_dir))

    microbatch = cfg.device_train_microbatch_size  # at most the per-process batch (one microbatch then)
    if isinstance(microbatch, int):
        microbatch = min(microbatch, cfg.global_batch_size // world_size)
    trainer = Trainer(
        model=model, train_dataloader=train_spec, eval_dataloader=evaluators,
        eval_interval=eval_interval, eval_subset_num_batches=eval_batches,
        max_duration=cfg.max_duration, optimizers=optimizer, schedulers=scheduler, algorithms=algorithms,
        device=device, precision=precision, device_train_microbatch_size=microbatch,
        compile_config={} if cfg.compile else None,
        parallelism_config={"fsdp": {"sharding_strategy": "FULL_SHARD", "mixed_precision": "DEFAULT",
                                     "state_dict_type": "full"}} if cfg.fsdp else None,
        save_folder=save_folder, save_interval=cfg.save_interval, save_overwrite=cfg.save_overwrite,
        save_num_checkpoints_to_keep=cfg.save_num_checkpoints_to_keep,
        autoresume=cfg.autoresume, run_name=cfg.run_name, seed=cfg.seed,
        callbacks=callbacks, loggers=loggers, progress_bar=cfg.progress_bar, log_to_console=False,
    )

    if dist.get_global_rank() == 0:  # the run's config, versions and commit, beside its checkpoints
        config_path = os.path.join(run_dir, CONFIG_JSON)
        atomic_write_text(config_path, mask_secrets(json.dumps(run_info(cfg, world_size, device, precision),
                                                               indent=2)) + "\n")
        if remote:
            trainer.logger.upload_file(remote_name(CONFIG_JSON), config_path, overwrite=True)

    state = trainer.state
    done = state.timestamp.get(state.max_duration.unit)
    if done >= state.max_duration:
        if dist.get_global_rank() == 0:
            print(f"{cfg.run_name}: already trained for {state.max_duration} (checkpoint in {save_folder}); "
                  f"nothing to do. Raise --max_duration to train longer.", flush=True)
        trainer.close()
        return 0
    start_batch, start_tokens, t0 = int(state.timestamp.batch), int(state.timestamp.token), time.time()
    if start_batch and dist.get_global_rank() == 0:
        print(f"{cfg.run_name}: resuming from the checkpoint at batch {start_batch} ({start_tokens:,} tokens) "
              f"in {save_folder}, training to {state.max_duration}", flush=True)
    trainer.fit()
    trainer.close()
    if dist.get_global_rank() == 0:
        seconds = time.time() - t0
        batches, tokens = int(state.timestamp.batch) - start_batch, int(state.timestamp.token) - start_tokens
        loss = state.total_loss_dict.get("loss/train/total", math.nan) if state.total_loss_dict else math.nan
        val = ""
        if state.eval_metric_values.get("LanguageCrossEntropy") is not None:
            val = f", val loss {float(state.eval_metric_values['LanguageCrossEntropy']):.4f}"
        resumed = f" (resumed at batch {start_batch})" if start_batch else ""
        print(f"done: {batches} batches, {tokens:,} tokens in {seconds:.1f} s ({tokens / max(seconds, 1e-9):,.0f} "
              f"tokens/s){resumed}; train loss {loss:.4f}{val}; export {os.path.join(save_folder, EXPORT_NAME)}",
              flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
