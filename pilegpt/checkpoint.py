"""Trained weights in files: the model.pt export ({"format", "model_args", "model"}) and Composer checkpoints, found
in a file or a run folder (local or s3://) and read with torch.load(weights_only=True), so nothing in a file can
run code while it is read. Hugging Face weights are hf.py's; what autoresume needs, train/resume.py's.
Details: docs/evaluation.md."""

from __future__ import annotations

import datetime
import os
import pickle
import re
import tempfile
import zipfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn as nn

from model import GPT, GPTConfig
from pilegpt import model_contract, s3, storage
from pilegpt.common import UserError, atomic_path
from pilegpt.model_contract import ModelSpec
from pilegpt.removed import drop_removed

EXPORT_NAME = "model.pt"  # file name of the weights-only export train.py writes into its save folder
EXPORT_FORMAT = "pile-gpt-export-v1"  # tag inside the export file, checked on load
LATEST_CHECKPOINT = "latest-rank0.pt"  # Composer's name for the newest checkpoint (rank 0)
# Composer's names: a whole checkpoint's file, a sharded one's (fsdp=True) folder of one __{rank}_0.distcp per rank
# and the .metadata torch.distributed.checkpoint writes last, and the `latest` pointer (a symlink, or an S3 object)
CHECKPOINT_PATTERN = re.compile(r"^(ep\d+-ba\d+-rank\d+\.pt|ep\d+-ba\d+/(\.metadata|__\d+_0\.distcp)|"
                                r"latest-rank\d+\.pt(\.symlink)?)$")
CHECKPOINT_FILE = re.compile(r"ep\d+-ba(?P<batch>\d+)-rank(?P<rank>\d+)\.pt")  # one Composer checkpoint file
SHARDED_CHECKPOINT = re.compile(r"ep\d+-ba(?P<batch>\d+)")  # one sharded checkpoint's folder
SHARDED_COMPLETE = ".metadata"  # in a sharded checkpoint's folder: written once every rank has written its part
# Non-tensor types inside a Composer 0.32 checkpoint (found with torch.serialization.
# get_unsafe_globals_in_checkpoint on a real one): timestamps hold timedeltas, metadata a TorchVersion
# (a str), the RNG state numpy's uint32 Mersenne-Twister key. All are plain data: building them runs no code.
COMPOSER_SAFE_GLOBALS = [datetime.timedelta, torch.torch_version.TorchVersion, np.ndarray, np.dtype,
                         np.dtypes.UInt32DType, np.dtypes.Int64DType, np.dtypes.Float64DType,
                         np.dtypes.Float32DType, np.dtypes.BoolDType]
try:
    from numpy._core.multiarray import _reconstruct  # numpy 2 (ndarray's pickle constructor)
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct
COMPOSER_SAFE_GLOBALS.append(_reconstruct)


# ----------------------------------------------------------------------------------------------------------
# The export

def unwrap(model: nn.Module) -> nn.Module:
    """The GPT inside a torch.compile / DistributedDataParallel wrapper (or the model itself)."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None or not isinstance(inner, nn.Module):
            return model
        model = inner


def save_export(model: nn.Module, path: str | os.PathLike, spec: Optional[ModelSpec] = None) -> None:
    """Write the weights-only export of `model` (a GPT, or the custom model `spec` names; possibly wrapped by
    torch.compile or DDP) to path: {"format", "model_args", "model"}, and "model_class" for a custom model.

    Written under a temporary name and renamed, so readers never see a partial file. Under FSDP, gather
    a full state dict first; this function expects whole tensors.
    """
    gpt = unwrap(model)
    if spec is None and not isinstance(gpt, GPT):
        raise TypeError(f"save_export needs a GPT or a custom model's ModelSpec, got {type(gpt).__name__}")
    state = {k: v.detach().cpu() for k, v in gpt.state_dict().items()}
    shape = {"model_args": asdict(gpt.config)} if spec is None else spec._asdict()
    with atomic_path(path) as tmp:
        torch.save({"format": EXPORT_FORMAT, **shape, "model": state}, tmp)


def config_from_args(model_args: dict) -> GPTConfig:
    """GPTConfig from a dict of its fields; unknown fields or bad values raise ValueError."""
    if not isinstance(model_args, dict):
        raise ValueError(f"model_args must be a dict of GPTConfig fields, got {type(model_args).__name__}")
    known = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(model_args) - known)
    if unknown:
        raise ValueError(f"unknown GPTConfig field(s) {unknown}; known: {sorted(known)}")
    return GPTConfig(**model_args)


def load_error_reason(e: Exception) -> str:
    """One line saying why torch.load(weights_only=True) refused a file (its message is a page long)."""
    text = str(e)
    found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if found:
        return f"it holds a {found.group(1)} object, which a weights-only load refuses"
    found = re.search(r"unsupported GLOBAL (\S+) whose module \S+ is blocked", text)
    if found:
        return f"it holds a {found.group(1)} object, whose module a weights-only load never imports"
    found = re.search(r"WeightsUnpickler error: ([^\n]+)", text)
    if found:
        return found.group(1).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def gpt_from_weights(model_args: dict, state_dict: dict, source: str = "checkpoint") -> GPT:
    """A GPT built from GPTConfig fields and loaded with a GPT-2-named state dict, in eval mode.

    Raises ValueError naming `source` when the args are bad or the weights do not fit them; a GPTConfig field removed
    since (removed.REMOVED_SETTINGS) is left out at its default, and one line when it was on.
    """
    if isinstance(model_args, dict):
        model_args = drop_removed(model_args, source, "its model has {name}={value!r}; load it with")
    try:
        model = GPT(config_from_args(model_args))
    except ValueError as e:
        raise ValueError(f"{source}: bad model_args ({e})") from None
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise ValueError(f"{source}: weights do not match model_args {model_args} ({' '.join(lines[:2])})") from None
    return model.eval()


# ----------------------------------------------------------------------------------------------------------
# Composer checkpoints

def safe_load(path: str, map_location: str = "cpu") -> object:
    """torch.load with weights_only=True, plus the allow-list of plain types Composer checkpoints hold."""
    try:
        with torch.serialization.safe_globals(COMPOSER_SAFE_GLOBALS):
            # mmap: tensors are paged in from the file, not read whole (a checkpoint holds optimizer state)
            return torch.load(path, map_location=map_location, weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # UnpicklingError for a refused object, RuntimeError for a non-torch file...
        raise UserError(f"{path} is not a model export or Composer checkpoint that can be read safely: "
                        f"{load_error_reason(e)}") from None


def load_for_resume(path: str, map_location: str, name: str) -> object:
    """A Composer checkpoint read for autoresume, weights-only (train.py, through compat.checkpoint_loads_through);
    `name` says which file of the save_folder it is (Composer reads a copy). A refused file is one line naming it,
    and nothing in it has run."""
    try:
        return safe_load(path, map_location)
    except UserError as e:
        reason = str(e).split("can be read safely: ", 1)[-1]
        raise UserError(f"autoresume refused a checkpoint (nothing in it ran): {name}: {reason}; if it is not the "
                        "run's own, remove it and resume from the checkpoint before it") from None


def safe_item(stream) -> object:
    """A sharded checkpoint's non-tensor item (the timestamp, the schedulers', callbacks' and data loader's state),
    weights-only with the plain types Composer checkpoints hold, as safe_load reads a whole checkpoint."""
    with torch.serialization.safe_globals(COMPOSER_SAFE_GLOBALS):
        return torch.load(stream, weights_only=True)


class MetadataUnpickler(pickle.Unpickler):
    """torch.distributed.checkpoint's .metadata (which tensor chunk lies where) unpickled with only the classes it
    is made of: its own dataclasses, torch's sizes, dtypes and layouts, and a path; anything else is refused, so a
    planted .metadata runs nothing."""

    MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")

    def find_class(self, module: str, name: str):
        found = super().find_class(module, name) if module in (*self.MODULES, "torch", "pathlib",
                                                                  "torch.serialization") else None
        if (module in self.MODULES and not name.startswith("__")) or (module, name) in (
                ("torch", "Size"), ("pathlib", "PosixPath"), ("torch.serialization", "_get_layout")) or \
                (module == "torch" and isinstance(found, torch.dtype)):
            return found
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def safe_metadata(stream) -> object:
    """A sharded checkpoint's .metadata, read with MetadataUnpickler."""
    return MetadataUnpickler(stream).load()


def sharded_model_state(folder: str) -> dict:
    """A sharded checkpoint's (fsdp=True's) state["model"], as a whole checkpoint holds it: the tensors by name, whole
    (every rank's part put together), and the wrapper's extra state (model_args); read in this process, weights-only
    (safe_item, safe_metadata), the optimizer state never loaded."""
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from pilegpt import compat

    with open(os.path.join(folder, SHARDED_COMPLETE), "rb") as stream:
        metadata = safe_metadata(stream)
    wanted = {fqn: item for fqn, item in metadata.state_dict_metadata.items() if fqn.startswith("state.model.")}
    flat = {fqn: torch.empty(item.size, dtype=item.properties.dtype) if isinstance(item, TensorStorageMetadata)
            else None for fqn, item in wanted.items()}
    with compat.sharded_loads_through(safe_item, safe_metadata):
        load(flat, storage_reader=FileSystemReader(folder), planner=DefaultLoadPlanner(allow_partial_load=True))
    model: dict = {}
    for fqn, value in flat.items():  # ("state", "model", "_extra_state", "model_args", "n_layer") -> nested dicts
        path = metadata.planner_data.get(fqn, tuple(fqn.split(".")))[2:]
        if path and path[0] == "_extra_state":
            node = model.setdefault("_extra_state", {})
            for part in path[1:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
        else:
            model[fqn[len("state.model."):]] = value
    return model


def sharded_refusal(e: Exception, name: str) -> UserError:
    """What autoresume says of a sharded checkpoint it refused to read (nothing in it ran)."""
    return UserError(f"autoresume refused a checkpoint (nothing in it ran): {name}: {load_error_reason(e)}; if it is "
                     "not the run's own, remove it and resume from the checkpoint before it")


def gpt_state_from_composer(model_state: dict, source: str) -> tuple[dict, Optional[dict]]:
    """(GPT state dict, model_args or None) from a Composer checkpoint's state["model"].

    The ComposerModel wrapper prefixes the GPT's names (e.g. "model.transformer.wte.weight"); torch.compile
    and DDP may add "_orig_mod." / "module." inside. The prefix is found from the token embedding's name.
    """
    anchor = "transformer.wte.weight"
    plain = {".".join(part for part in k.split(".") if part not in ("_orig_mod", "module")): v
             for k, v in model_state.items()}
    prefixes = [k[: -len(anchor)] for k in plain if k.endswith(anchor)]
    if len(prefixes) != 1:
        raise UserError(f"{source}: its model state holds {'no' if not prefixes else 'several'} GPT "
                        f"(looked for a key ending in {anchor}): was it written by train.py?")
    prefix = prefixes[0]
    state = {k[len(prefix):]: v for k, v in plain.items() if k.startswith(prefix) and torch.is_tensor(v)}
    model_args = None
    for k, v in plain.items():  # train.py's wrapper keeps {"model_args": {...}} as its extra state
        if k.endswith("_extra_state") and isinstance(v, dict) and isinstance(v.get("model_args"), dict):
            model_args = v["model_args"]
    return state, model_args


def infer_model_args(state: dict, n_head: Optional[int], source: str) -> dict:
    """GPTConfig fields from the weights' shapes, for a checkpoint older than the model_args it stores: a GPT-2
    (learned positions), whose n_head alone cannot be seen in them."""
    if n_head is None:
        raise UserError(f"{source} does not store its model_args (train.py's ComposerGPT saves them as its extra "
                        f"state): pass --n-head N, or sample from the run's {EXPORT_NAME}")
    if "transformer.wpe.weight" not in state:
        raise UserError(f"{source} does not store its model_args and has no position table, so it is no GPT-2 "
                        f"whose shape its weights give: sample from the run's {EXPORT_NAME}")
    vocab_size, n_embd = state["transformer.wte.weight"].shape
    layers = {int(m.group(1)) for k in state if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    return dict(block_size=state["transformer.wpe.weight"].shape[0], vocab_size=vocab_size,
                n_layer=len(layers), n_head=n_head, n_embd=n_embd, dropout=0.0,
                bias="transformer.ln_f.bias" in state)


def load_model_file(path: str, n_head: Optional[int] = None, source: Optional[str] = None,
                    model_class: Optional[str] = None, custom_refused: Optional[str] = None) -> nn.Module:
    """The GPT (or the custom model: custom_model_from_weights) in a model.pt export or a Composer checkpoint file,
    on the CPU, in eval mode."""
    source = source or path
    try:
        payload = {"state": {"model": sharded_model_state(path)}} if os.path.isdir(path) else safe_load(path)
    except UserError:
        raise
    except Exception as e:  # a damaged or planted sharded checkpoint
        raise UserError(f"{path} is a sharded checkpoint that cannot be read safely: {load_error_reason(e)}") from None
    try:
        if isinstance(payload, dict) and payload.get("format") == EXPORT_FORMAT:
            if "model_class" in payload:
                recorded = ModelSpec(payload["model_class"], payload["model_args"])
                return custom_model_from_weights(recorded, payload["model"], source, model_class, custom_refused)
            refuse_model_class(model_class, source)
            return gpt_from_weights(payload["model_args"], payload["model"], source)
        if isinstance(payload, dict) and isinstance(payload.get("state"), dict) \
                and isinstance(payload["state"].get("model"), dict):
            if (recorded := recorded_model_class(payload["state"]["model"])) is not None:
                state = custom_state_from_composer(payload["state"]["model"])
                return custom_model_from_weights(recorded, state, source, model_class, custom_refused)
            refuse_model_class(model_class, source)
            state, model_args = gpt_state_from_composer(payload["state"]["model"], source)
            if model_args is None:
                model_args = infer_model_args(state, n_head, source)
            elif n_head is not None and n_head != model_args.get("n_head"):
                raise UserError(f"--n-head {n_head} contradicts {source}'s model_args (n_head="
                                f"{model_args.get('n_head')}): drop --n-head")
            return gpt_from_weights({**model_args, "dropout": 0.0}, state, source)
    except ValueError as e:
        raise UserError(str(e)) from None
    raise UserError(f"{source} is neither a {EXPORT_NAME} export (checkpoint.save_export) nor a Composer checkpoint")


# ----------------------------------------------------------------------------------------------------------
# A custom model's weights (model_contract.py): rebuilt only with the class the user names

def refuse_model_class(model_class: Optional[str], source: str) -> None:
    """A --model-class given for a file that holds model.py's GPT is a mistake: one line."""
    if model_class is not None:
        raise UserError(f"{source} holds model.py's GPT, not {model_class}: drop --model-class")


def recorded_model_class(model_state: dict) -> Optional[ModelSpec]:
    """The custom model a Composer checkpoint's model state records (train.ComposerGPT's extra state), or None."""
    for k, v in model_state.items():
        if k.endswith("_extra_state") and isinstance(v, dict) and isinstance(v.get("model_class"), str):
            return ModelSpec(v["model_class"], v.get("model_args") or {})
    return None


def custom_state_from_composer(model_state: dict) -> dict:
    """The custom module's state dict: the wrapper's "model." prefix (and torch.compile's and DDP's) taken off."""
    plain = {".".join(part for part in k.split(".") if part not in ("_orig_mod", "module")): v
             for k, v in model_state.items()}
    return {k[len("model."):]: v for k, v in plain.items() if k.startswith("model.") and torch.is_tensor(v)}


def custom_model_from_weights(recorded: ModelSpec, state: dict, source: str, model_class: Optional[str],
                              custom_refused: Optional[str]) -> nn.Module:
    """The custom model a file records, built from the class the user named (model_class, which must be the one
    recorded: the recorded name itself is never imported) and loaded with its weights, in eval mode."""
    if custom_refused is not None:
        raise UserError(f"{source} holds your own model {recorded.model_class}: {custom_refused}")
    if model_class is None:
        raise UserError(f"{source} holds your own model {recorded.model_class}: pass --model-class "
                        f"{recorded.model_class} to rebuild it (a class named in a file is never imported)")
    if model_class != recorded.model_class:
        raise UserError(f"--model-class {model_class}, but {source} holds {recorded.model_class}: pass that one")
    module = model_contract.build(ModelSpec(model_class, recorded.model_args), "--model-class")
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise UserError(f"{source}: its weights do not fit {model_class}(**{recorded.model_args}) "
                        f"({' '.join(lines[:2])})") from None
    return module.eval()


# ----------------------------------------------------------------------------------------------------------
# Finding the file: a checkpoint file or a run folder, local or s3://

def resolve_local(spec: str) -> str:
    """The file to load for a local path: the file itself, or a run folder's export / latest checkpoint (a sharded
    checkpoint's folder is loaded as a file is)."""
    path = Path(spec)
    if path.is_dir() and (path / SHARDED_COMPLETE).is_file():  # a sharded checkpoint (fsdp=True) itself
        return str(path)
    if path.is_dir():
        for name in (EXPORT_NAME, LATEST_CHECKPOINT):  # the export, or the latest checkpoint (a file or a folder)
            if (path / name).is_file() or (path / name / SHARDED_COMPLETE).is_file():
                return str(path / name)
        raise UserError(f"{spec} holds neither {EXPORT_NAME} nor {LATEST_CHECKPOINT}: "
                        f"pass a checkpoint file, or the save folder of a train.py run")
    if not path.is_file():
        raise UserError(f"checkpoint {spec} not found: pass a {EXPORT_NAME} export, a Composer checkpoint, "
                        f"or a run folder")
    return str(path)


def download_s3(spec: str, tmpdir: str, endpoint_url: Optional[str] = None) -> str:
    """Download an s3:// checkpoint file or run folder's export / latest checkpoint into tmpdir; return the
    local file. Follows Composer's `.symlink` files (they hold the target's object name)."""
    bucket, key = s3.parse_s3_url(spec)
    if key.endswith(".symlink"):
        candidates = [key]
    elif key.endswith(".pt"):
        candidates = [key, key + ".symlink"]
    else:  # a run folder
        prefix = f"{key}/" if key else ""
        candidates = [prefix + EXPORT_NAME, prefix + LATEST_CHECKPOINT, prefix + LATEST_CHECKPOINT + ".symlink"]
    try:
        root = s3.S3Dir(s3.format_url(bucket), s3.make_client(s3.endpoint_url(endpoint_url)))
        found = next((k for k in candidates if root.exists(k)), None)
        if found is None:
            raise UserError(f"checkpoint {spec} not found (looked for "
                            f"{', '.join(s3.format_url(bucket, k) for k in candidates)})")
        if found.endswith(".symlink"):
            target = root.read(found).decode().strip()
            found = s3.parse_s3_url(target)[1] if storage.is_s3(target) else target
        if SHARDED_CHECKPOINT.fullmatch(found.rsplit("/", 1)[-1]):  # fsdp=True's: a folder of parts
            raise UserError(f"{s3.format_url(bucket, found)} is a sharded checkpoint (fsdp=True), read only by "
                            f"train.py's autoresume: pass the run's {EXPORT_NAME}, which train.py writes beside it")
        local = os.path.join(tmpdir, os.path.basename(found) or "checkpoint.pt")
        root.download(found, local)
    except UserError as e:
        raise UserError(f"cannot read {spec}: {e}") from None
    return local


def add_load_arguments(parser) -> None:
    """The flags of a script that reads a model with load_model (sample.py, export_hf.py)."""
    parser.add_argument("--n-head", type=int, default=None,
                        help="attention heads, only for a Composer checkpoint that does not store its model_args")
    parser.add_argument("--endpoint-url", default=None,
                        help="S3-compatible endpoint (default: AWS_ENDPOINT_URL or S3_ENDPOINT_URL)")


def add_model_class_argument(parser) -> None:
    """--model-class: the one way a script (sample.py, eval.py) rebuilds a custom model a checkpoint records."""
    parser.add_argument("--model-class", default=None, metavar="MODULE:CLASS",
                        help="your own model's class, as train.py's model_class named it, for a checkpoint of one "
                             "(the name a file records is never imported)")


def load_model(spec: str, n_head: Optional[int] = None, endpoint_url: Optional[str] = None,
               model_class: Optional[str] = None, custom_refused: Optional[str] = None) -> nn.Module:
    """The GPT (CPU, eval mode) of a model.pt, a Composer checkpoint or a run folder, local or s3://; a custom
    model's only with model_class (load_model_file)."""
    if not storage.is_remote(spec):
        return load_model_file(resolve_local(spec), n_head, None, model_class, custom_refused)
    with tempfile.TemporaryDirectory(prefix="checkpoint-") as tmpdir:
        return load_model_file(download_s3(spec, tmpdir, endpoint_url), n_head, spec, model_class, custom_refused)


def latest_checkpoint_name(save_folder: str) -> str:
    """Where save_folder's `latest` pointer leads (local symlink or S3 `.symlink` object), for messages."""
    if storage.is_remote(save_folder):
        pointer = storage.folder(save_folder).get(f"{LATEST_CHECKPOINT}.symlink")
        target = pointer.decode(errors="replace").strip() if pointer else LATEST_CHECKPOINT
        return f"{storage.join(save_folder, LATEST_CHECKPOINT)} -> {target}"
    path = os.path.join(storage.local_path(save_folder), LATEST_CHECKPOINT)
    return storage.join(save_folder, os.readlink(path) if os.path.islink(path) else LATEST_CHECKPOINT)


def existing_checkpoints(save_folder: str) -> list[str]:
    """Composer checkpoint files already in save_folder (local or s3://; other stores: none known)."""
    return [n for n in storage.folder(save_folder).names() if CHECKPOINT_PATTERN.match(n)]
