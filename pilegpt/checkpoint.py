"""Trained weights in files: the model.pt export, Composer checkpoints, Hugging Face GPT-2 weights, and finding
them (local or s3://).

    save_export(gpt, "runs/x/model.pt")                 # weights-only export, written atomically
    gpt = load_model("runs/x")                          # model.pt or latest-rank0.pt of a run folder
    gpt = load_model("s3://bucket/runs/x/ep0-ba100-rank0.pt")
    existing_checkpoints("runs/x")                      # Composer checkpoint files already there
    gpt, origin = load_pretrained("gpt2")               # train.py's init_from: hub name, HF folder or any of the above
    hf = to_hf(gpt)                                     # a transformers GPT2LMHeadModel (export_hf.py saves it)

The export (`EXPORT_NAME`) is a dict {"format": EXPORT_FORMAT, "model_args": {GPTConfig fields}, "model":
GPT state dict with GPT-2 names}. Every file is read with torch.load(weights_only=True); a Composer
checkpoint also needs a short allow-list of the plain data types it holds (COMPOSER_SAFE_GLOBALS).
Nothing in a file can run code while it is read. Hugging Face weights are read by `transformers` (safetensors, or
its weights-only torch.load of pytorch_model.bin); `transformers` is imported only when they are used.
"""

from __future__ import annotations

import datetime
import os
import re
import tempfile
import time
import zipfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn as nn

from model import GPT, GPTConfig
from pilegpt.common import UserError, atomic_path
from pilegpt.tokenizer import EOT_ID, GPT2_VOCAB_SIZE

EXPORT_NAME = "model.pt"  # file name of the weights-only export train.py writes into its save folder
EXPORT_FORMAT = "pile-gpt-export-v1"  # tag inside the export file, checked on load
LATEST_CHECKPOINT = "latest-rank0.pt"  # Composer's name for the newest checkpoint (rank 0)
CHECKPOINT_PATTERN = re.compile(r"(^|/)(ep\d+-ba\d+-rank\d+\.pt|latest-rank\d+\.pt(\.symlink)?)$")
CHECKPOINT_FILE = re.compile(r"ep\d+-ba(?P<batch>\d+)-rank(?P<rank>\d+)\.pt")  # one Composer checkpoint file
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


def save_export(model: GPT, path: str | os.PathLike) -> None:
    """Write the weights-only export of `model` (a GPT, possibly wrapped by torch.compile or DDP) to path.

    Written under a temporary name and renamed, so readers never see a partial file. Under FSDP, gather
    a full state dict first; this function expects whole tensors.
    """
    gpt = unwrap(model)
    if not isinstance(gpt, GPT):
        raise TypeError(f"save_export needs a GPT, got {type(gpt).__name__}")
    state = {k: v.detach().cpu() for k, v in gpt.state_dict().items()}
    with atomic_path(path) as tmp:
        torch.save({"format": EXPORT_FORMAT, "model_args": asdict(gpt.config), "model": state}, tmp)


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
    found = re.search(r"WeightsUnpickler error: ([^\n]+)", text)
    if found:
        return found.group(1).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def gpt_from_weights(model_args: dict, state_dict: dict, source: str = "checkpoint") -> GPT:
    """A GPT built from GPTConfig fields and loaded with a GPT-2-named state dict, in eval mode.

    Raises ValueError naming `source` when the args are bad or the weights do not fit them.
    """
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


def load_export(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> GPT:
    """Read a file written by save_export and return the GPT (in eval mode) on map_location.

    A file holding anything but tensors and plain containers is refused before any of its code can run.
    Raises FileNotFoundError or ValueError naming the file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # pickle.UnpicklingError for disallowed objects, RuntimeError for non-zip files...
        raise ValueError(f"{path} is not a weights-only model export: {load_error_reason(e)}") from None
    if not isinstance(payload, dict) or payload.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path} is not a model export written by checkpoint.save_export (no format tag "
                         f"{EXPORT_FORMAT!r})")
    return gpt_from_weights(payload["model_args"], payload["model"], source=path).to(map_location)


# ----------------------------------------------------------------------------------------------------------
# Composer checkpoints

def safe_load(path: str) -> object:
    """torch.load with weights_only=True, plus the allow-list of plain types Composer checkpoints hold."""
    try:
        with torch.serialization.safe_globals(COMPOSER_SAFE_GLOBALS):
            # mmap: tensors are paged in from the file, not read whole (a checkpoint holds optimizer state)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # UnpicklingError for a refused object, RuntimeError for a non-torch file...
        raise UserError(f"{path} is not a model export or Composer checkpoint that can be read safely: "
                        f"{load_error_reason(e)}") from None


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
    """GPTConfig fields from the weights' shapes; only n_head cannot be seen in them."""
    if n_head is None:
        raise UserError(f"{source} does not store its model_args (train.py's ComposerGPT saves them as its extra "
                        f"state): pass --n-head N, or sample from the run's {EXPORT_NAME}")
    vocab_size, n_embd = state["transformer.wte.weight"].shape
    layers = {int(m.group(1)) for k in state if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    return dict(block_size=state["transformer.wpe.weight"].shape[0], vocab_size=vocab_size,
                n_layer=len(layers), n_head=n_head, n_embd=n_embd, dropout=0.0,
                bias="transformer.ln_f.bias" in state)


def load_model_file(path: str, n_head: Optional[int] = None, source: Optional[str] = None) -> GPT:
    """The GPT in a model.pt export or a Composer checkpoint file, on the CPU, in eval mode."""
    source = source or path
    payload = safe_load(path)
    try:
        if isinstance(payload, dict) and payload.get("format") == EXPORT_FORMAT:
            return gpt_from_weights(payload["model_args"], payload["model"], source)
        if isinstance(payload, dict) and isinstance(payload.get("state"), dict) \
                and isinstance(payload["state"].get("model"), dict):
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
# Finding the file: a checkpoint file or a run folder, local or s3://

def resolve_local(spec: str) -> str:
    """The file to load for a local path: the file itself, or a run folder's export / latest checkpoint."""
    path = Path(spec)
    if path.is_dir():
        for name in (EXPORT_NAME, LATEST_CHECKPOINT):
            if (path / name).is_file():
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
    from pilegpt import storage

    bucket, key = storage.parse_s3_url(spec)
    if key.endswith(".symlink"):
        candidates = [key]
    elif key.endswith(".pt"):
        candidates = [key, key + ".symlink"]
    else:  # a run folder
        prefix = f"{key}/" if key else ""
        candidates = [prefix + EXPORT_NAME, prefix + LATEST_CHECKPOINT, prefix + LATEST_CHECKPOINT + ".symlink"]
    try:
        root = storage.S3Dir(f"s3://{bucket}", storage.make_client(storage.endpoint_url(endpoint_url)))
        found = next((k for k in candidates if root.exists(k)), None)
        if found is None:
            raise UserError(f"checkpoint {spec} not found (looked for "
                            f"{', '.join(f's3://{bucket}/{k}' for k in candidates)})")
        if found.endswith(".symlink"):
            target = root.read(found).decode().strip()
            found = target[len(f"s3://{bucket}/"):] if target.startswith("s3://") else target
        local = os.path.join(tmpdir, os.path.basename(found) or "checkpoint.pt")
        root.download(found, local)
    except UserError as e:
        raise UserError(f"cannot read {spec}: {e}") from None
    return local


def load_model(spec: str, n_head: Optional[int] = None, endpoint_url: Optional[str] = None) -> GPT:
    """The GPT (CPU, eval mode) of a model.pt, a Composer checkpoint or a run folder, local or s3://."""
    if not spec.startswith("s3://"):
        return load_model_file(resolve_local(spec), n_head)
    with tempfile.TemporaryDirectory(prefix="checkpoint-") as tmpdir:
        return load_model_file(download_s3(spec, tmpdir, endpoint_url), n_head, source=spec)


def existing_checkpoints(save_folder: str) -> list[str]:
    """Composer checkpoint files already in save_folder (local or s3://; other stores: none known)."""
    if "://" not in save_folder:
        folder = Path(save_folder)
        return sorted(p.name for p in folder.iterdir() if CHECKPOINT_PATTERN.search(p.name)) if folder.is_dir() else []
    if not save_folder.startswith("s3://"):
        return []
    from pilegpt import storage

    return sorted(n for n in storage.S3Dir(save_folder).names() if CHECKPOINT_PATTERN.search(n))


# ----------------------------------------------------------------------------------------------------------
# Hugging Face GPT-2 weights, in and out (transformers' GPT2LMHeadModel has our parameter names)

HF_GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's GPT-2 on the Hugging Face hub
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json")  # what makes a folder a save_pretrained folder
# GPT-2 stores these matmuls as Conv1D, whose weight is (in, out): the transpose of nn.Linear's (out, in).
HF_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
LAYER_BIASES = {"ln_1.bias": 1, "attn.c_attn.bias": 3, "attn.c_proj.bias": 1, "ln_2.bias": 1, "mlp.c_fc.bias": 4,
                "mlp.c_proj.bias": 1}  # a block's biases, as multiples of n_embd (HF GPT-2 always has them)


def hf_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, but read now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def from_hf(hf_model: nn.Module, source: str) -> GPT:
    """Our GPT (CPU, fp32, eval mode) with the weights of a transformers GPT2LMHeadModel.

    Settings of its GPT2Config that our GPT does not implement are a UserError naming the setting.
    """
    c = hf_model.config
    unsupported = [f"{name}={value!r}" for name, value, ok in (
        ("model_type", c.model_type, c.model_type == "gpt2"),
        ("activation_function", c.activation_function, c.activation_function in ("gelu_new", "gelu_pytorch_tanh")),
        ("n_inner", c.n_inner, c.n_inner in (None, 4 * c.n_embd)),
        ("layer_norm_epsilon", c.layer_norm_epsilon, c.layer_norm_epsilon == 1e-5),
        ("scale_attn_weights", c.scale_attn_weights, c.scale_attn_weights),
        ("scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx, not c.scale_attn_by_inverse_layer_idx),
        ("add_cross_attention", c.add_cross_attention, not c.add_cross_attention),
        ("tie_word_embeddings", c.tie_word_embeddings, c.tie_word_embeddings)) if not ok]
    if unsupported:
        raise UserError(f"{source}: {', '.join(unsupported)} is not a GPT-2 that model.py implements (GPT-2's tanh "
                        "GELU, 4*n_embd MLP, LayerNorm eps 1e-5, tied embeddings)")
    model_args = dict(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                      n_embd=c.n_embd, dropout=0.0, bias=True)
    state = {k: (v.t() if k.endswith(HF_CONV1D) else v).float() for k, v in hf_model.state_dict().items()}
    try:
        return gpt_from_weights(model_args, state, source)
    except ValueError as e:
        raise UserError(str(e)) from None


def to_hf(model: GPT):
    """A transformers GPT2LMHeadModel (CPU, fp32, eval mode) that computes what `model` computes.

    Conv1D weights are transposed; bias=False becomes zero biases (the same function); a vocabulary padded past
    GPT-2's 50,257 tokens (e.g. 50304) is cut back to them: the extra rows are never a real token.
    """
    cfg = unwrap(model).config
    if cfg.vocab_size < GPT2_VOCAB_SIZE:
        raise UserError(f"the model's vocabulary has {cfg.vocab_size} tokens, fewer than GPT-2's {GPT2_VOCAB_SIZE}: "
                        "a Hugging Face GPT-2 export needs a model trained on GPT-2 tokens")
    from transformers import GPT2Config, GPT2LMHeadModel

    state = {}
    for k, v in unwrap(model).state_dict().items():
        v = v.detach().cpu().float()
        if k.endswith(HF_CONV1D):
            v = v.t()
        elif k in ("transformer.wte.weight", "lm_head.weight"):  # one tied matrix, (vocab_size, n_embd)
            v = v[:GPT2_VOCAB_SIZE]
        state[k] = v.contiguous()
    if not cfg.bias:
        for i in range(cfg.n_layer):
            state.update({f"transformer.h.{i}.{name}": torch.zeros(m * cfg.n_embd) for name, m in LAYER_BIASES.items()})
        state["transformer.ln_f.bias"] = torch.zeros(cfg.n_embd)
    config = GPT2Config(vocab_size=GPT2_VOCAB_SIZE, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                        n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=None, activation_function="gelu_new",
                        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                        layer_norm_epsilon=1e-5, bos_token_id=EOT_ID, eos_token_id=EOT_ID,
                        tie_word_embeddings=True, architectures=["GPT2LMHeadModel"])
    hf_model = GPT2LMHeadModel(config)
    hf_model.load_state_dict(state, strict=True)
    return hf_model.eval()


def load_hf(spec: str) -> GPT:
    """OpenAI's GPT-2 by hub name (downloaded once into the Hugging Face cache) or a local save_pretrained folder."""
    try:
        from transformers import AutoConfig, GPT2LMHeadModel
    except ImportError:
        raise UserError(f"init_from={spec} needs the transformers package: pip install transformers") from None
    local = os.path.isdir(spec)
    offline = local or hf_offline()
    try:
        config = AutoConfig.from_pretrained(spec, local_files_only=offline)
        if config.model_type != "gpt2":
            raise UserError(f"init_from={spec} is a {config.model_type!r} model: model.py is GPT-2 only")
        hf_model = GPT2LMHeadModel.from_pretrained(spec, config=config, local_files_only=offline)
    except OSError as e:  # transformers' error for missing files and for a hub it cannot reach
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        if local:
            raise UserError(f"init_from={spec}: cannot read this Hugging Face folder ({reason})") from None
        raise UserError(f"init_from={spec}: OpenAI's {spec} weights are not in the Hugging Face cache and the hub "
                        f"cannot be reached{' (HF_HUB_OFFLINE is set)' if hf_offline() else ''} ({reason}): download "
                        f"them once with network, or pass a local folder written by save_pretrained") from None
    return from_hf(hf_model, spec)


def is_hf_folder(spec: str) -> bool:
    return os.path.isfile(os.path.join(spec, "config.json")) and any(
        os.path.isfile(os.path.join(spec, name)) for name in HF_WEIGHT_FILES)


def load_pretrained(spec: str, endpoint_url: Optional[str] = None) -> tuple[GPT, str]:
    """The GPT (CPU, eval mode) that train.py's init_from names, and where it came from, in words.

    spec: a GPT-2 hub name (HF_GPT2_NAMES), a local Hugging Face GPT-2 folder, or a pile-gpt model.pt / Composer
    checkpoint / run folder, local or s3://. UserError (one line) when it cannot be found or read.
    """
    if spec in HF_GPT2_NAMES and not os.path.exists(spec):
        return load_hf(spec), f"OpenAI's {spec} (Hugging Face hub)"
    if is_hf_folder(spec):
        return load_hf(spec), f"the Hugging Face GPT-2 folder {spec}"
    if spec.startswith("s3://"):
        return load_model(spec, endpoint_url=endpoint_url), f"the pile-gpt checkpoint {spec}"
    if not os.path.exists(spec):
        raise UserError(f"init_from={spec} not found: pass scratch, one of {', '.join(HF_GPT2_NAMES)}, a Hugging "
                        f"Face GPT-2 folder, or a pile-gpt {EXPORT_NAME} / Composer checkpoint / run folder")
    path = resolve_local(spec)
    return load_model_file(path), f"the pile-gpt checkpoint {path}"


def set_aside_broken_checkpoints(save_folder: str) -> Optional[str]:
    """Make a local save_folder safe for Composer's autoresume after a crash; returns a line saying what changed.

    Composer writes checkpoints in place, so a kill during a write leaves a truncated file: autoresume then
    either fails to read it (when latest-rank0.pt points at it) or refuses to overwrite it later. Checkpoint
    files (newest first) are checked until one is whole (every zip record passes its CRC); those that are not
    are renamed `<name>.broken-<time>` (set aside, never deleted), and latest-rank0.pt is pointed at the newest
    whole one. Checkpoints on S3 are uploaded whole or not at all, but the `latest` pointer is uploaded after
    its checkpoint: see point_latest_at_newest_s3.
    """
    if save_folder.startswith("s3://"):
        return point_latest_at_newest_s3(save_folder)
    folder = Path(save_folder)
    if "://" in save_folder or not folder.is_dir():
        return None
    by_batch: dict[int, list[Path]] = {}
    for p in folder.iterdir():
        m = CHECKPOINT_FILE.fullmatch(p.name)
        if m:
            by_batch.setdefault(int(m["batch"]), []).append(p)
    broken, good = [], None
    for batch in sorted(by_batch, reverse=True):
        rank0 = [p for p in by_batch[batch] if p.name.endswith("-rank0.pt")]
        if rank0 and is_whole_checkpoint(rank0[0]):
            good = rank0[0]
            break
        broken += by_batch[batch]
    latest = folder / LATEST_CHECKPOINT
    points_at = os.readlink(latest) if latest.is_symlink() else None
    if not broken and (good is None or points_at == good.name):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for p in broken:
        os.rename(p, p.with_name(f"{p.name}.broken-{stamp}"))
    if latest.is_symlink() or latest.exists():
        latest.unlink()  # a symlink (Composer's), re-made below when a whole checkpoint is left
    if good is not None:
        os.symlink(good.name, latest)
    names = ", ".join(p.name for p in broken) or "none"
    return (f"checkpoints set aside as *.broken-{stamp} (truncated or damaged): {names}; "
            + (f"resuming from {good.name}" if good else "no whole checkpoint is left: starting from scratch"))


def point_latest_at_newest_s3(save_folder: str) -> Optional[str]:
    """Point the `latest-rank0.pt.symlink` object of an s3:// save_folder at the newest checkpoint in it.

    Composer's autoresume follows that pointer, which is uploaded after its checkpoint: a run stopped between
    the two (S3 lost, a kill) leaves it missing or at an older checkpoint, and the resumed run would retrain
    from there (or from scratch) and then refuse to overwrite the newer checkpoint. S3 objects appear whole or
    not at all, so the newest one listed is safe to resume from. Returns a line saying what changed, or None."""
    from pilegpt import storage

    folder = storage.S3Dir(save_folder)
    names = folder.names()
    by_batch = {int(m["batch"]): n for n in names if (m := CHECKPOINT_FILE.fullmatch(n)) and m["rank"] == "0"}
    if not by_batch:
        return None
    newest = by_batch[max(by_batch)]
    pointer = f"{LATEST_CHECKPOINT}.symlink"
    current = folder.read(pointer).decode().strip() if pointer in names else None
    if current == folder.key(newest):
        return None
    with folder.errors():
        folder.client.put_object(Bucket=folder.bucket, Key=folder.key(pointer), Body=folder.key(newest).encode())
    was = f"at {current.rsplit('/', 1)[-1]}" if current else "missing"
    return f"{pointer} was {was} (the run stopped before uploading it): resuming from {newest}, the newest checkpoint"


def is_whole_checkpoint(path: Path) -> bool:
    """Whether a torch.save zip file is complete and undamaged (reads it once; no unpickling)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False
