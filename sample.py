"""Generate text from a trained GPT: a model.pt export or a Composer checkpoint, local or on S3.

    python sample.py --checkpoint runs/quickstart --prompt "def main(" --num-samples 3 --max-new-tokens 200
    python sample.py --checkpoint s3://bucket/runs/pile/model.pt --prompt "The meaning of life" --top-k 50
    python sample.py --checkpoint runs/pile/ep0-ba2000-rank0.pt --device cuda --seed 7

--checkpoint takes
- the weights-only export `model.pt` that train.py writes beside its checkpoints (model.save_export);
- a Composer checkpoint file (`ep*-ba*-rank0.pt`, `latest-rank0.pt`, or its `.symlink` on S3);
- a run folder (local or s3://bucket/prefix): its model.pt, else its latest-rank0.pt checkpoint.
Files are read with torch.load(weights_only=True); a Composer checkpoint also needs a short allow-list of
plain data types it holds (COMPOSER_SAFE_GLOBALS). Nothing in a file can run code while it is read.
The GPT's shape comes from the export's model_args, or from the model_args train.py stores in the
Composer checkpoint's model state (`_extra_state`); for a checkpoint without them, pass --n-head.

Samples go to stdout (prompt + continuation), each followed by a line of dashes; progress and the
summary line go to stderr. The same --seed on the same device gives the same text; --top-k 1 is greedy.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

from common import UserError, load_dotenv_file, run_main, s3_endpoint_url
from model import EXPORT_FORMAT, EXPORT_NAME, GPT, gpt_from_weights, load_error_reason

LATEST_CHECKPOINT = "latest-rank0.pt"  # Composer's default name for the newest checkpoint (rank 0)
SEPARATOR = "-" * 40  # printed after each sample
EOT = "<|endoftext|>"  # GPT-2's end-of-text token; the default prompt, i.e. an unconditional sample
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


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="model.pt export, Composer checkpoint file, or run folder; local path or s3://bucket/key")
    p.add_argument("--prompt", default=EOT, help=f"text to continue ({EOT} = start of a new document)")
    p.add_argument("--num-samples", type=int, default=1, help="how many samples (generated as one batch)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate per sample")
    p.add_argument("--temperature", type=float, default=0.8, help="> 0; below 1 is more conservative")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k likeliest tokens; 0 = all; 1 = greedy")
    p.add_argument("--seed", type=int, default=1337, help="random seed (same seed + device = same text)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--n-head", type=int, default=None,
                   help="attention heads, only for a Composer checkpoint that does not store its model_args")
    p.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint (default: AWS_ENDPOINT_URL or "
                                                        "S3_ENDPOINT_URL)")
    args = p.parse_args(argv)
    for name in ("num_samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0 = no limit), got {args.top_k}")
    if not args.temperature > 0:
        raise UserError(f"--temperature must be > 0, got {args.temperature} (use --top-k 1 for greedy decoding)")
    return args


# ---------------------------------------------------------------------------------------------------------
# Finding the file (local or S3)

def resolve_local(spec: str) -> str:
    """The file to load for a local --checkpoint: the file itself, or a run folder's export / latest ckpt."""
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


def download_s3(spec: str, tmpdir: str, endpoint_url: str | None) -> str:
    """Download an s3:// --checkpoint into tmpdir; return the local file. Follows Composer's .symlink files."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    bucket, _, key = spec[len("s3://"):].partition("/")
    if not bucket:
        raise UserError(f"{spec}: expected s3://bucket/key")
    # A fresh session reads the credentials now (boto3.client() would reuse the first ones it saw).
    client = boto3.session.Session().client("s3", endpoint_url=s3_endpoint_url(endpoint_url))

    def exists(k: str) -> bool:
        try:
            client.head_object(Bucket=bucket, Key=k)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def read_symlink(k: str) -> str:  # Composer writes the target's object name into `<name>.symlink`
        target = client.get_object(Bucket=bucket, Key=k)["Body"].read().decode().strip()
        return target[len(f"s3://{bucket}/"):] if target.startswith("s3://") else target

    try:
        if key.endswith(".symlink"):
            candidates = [key]
        elif key.endswith(".pt"):
            candidates = [key, key + ".symlink"]
        else:  # a run folder
            prefix = key.rstrip("/") + "/" if key else ""
            candidates = [prefix + EXPORT_NAME, prefix + LATEST_CHECKPOINT, prefix + LATEST_CHECKPOINT + ".symlink"]
        found = next((k for k in candidates if exists(k)), None)
        if found is None:
            raise UserError(f"checkpoint {spec} not found (looked for "
                            f"{', '.join(f's3://{bucket}/{k}' for k in candidates)})")
        if found.endswith(".symlink"):
            found = read_symlink(found)
        local = os.path.join(tmpdir, os.path.basename(found) or "checkpoint.pt")
        size = client.head_object(Bucket=bucket, Key=found)["ContentLength"]
        from tqdm import tqdm
        with tqdm(total=size, unit="B", unit_scale=True, desc=f"download {os.path.basename(found)}",
                  file=sys.stderr, disable=size < (64 << 20)) as bar:
            client.download_file(bucket, found, local, Callback=bar.update)
        return local
    except NoCredentialsError:
        raise UserError(f"no S3 credentials to read {spec}: set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                        f"(or put them in .env)") from None
    except ClientError as e:
        err = e.response.get("Error", {})
        raise UserError(f"cannot read {spec}: {err.get('Code', '?')} {err.get('Message', '')}".strip()) from None
    except BotoCoreError as e:
        raise UserError(f"cannot read {spec}: {e} (check --endpoint-url / AWS_ENDPOINT_URL)") from None


# ---------------------------------------------------------------------------------------------------------
# Reading the model

def safe_load(path: str) -> object:
    """torch.load with weights_only=True, plus the allow-list of plain types Composer checkpoints hold."""
    try:
        with torch.serialization.safe_globals(COMPOSER_SAFE_GLOBALS):
            # mmap: tensors are paged in from the file, not read whole (a checkpoint holds optimizer state)
            return torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # UnpicklingError for a refused object, RuntimeError for a non-torch file...
        raise UserError(f"{path} is not a model export or Composer checkpoint that can be read safely: "
                        f"{load_error_reason(e)}") from None


def gpt_state_from_composer(model_state: dict, source: str) -> tuple[dict, dict | None]:
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


def infer_model_args(state: dict, n_head: int | None, source: str) -> dict:
    """GPTConfig fields from the weights' shapes; only n_head cannot be seen in them."""
    if n_head is None:
        raise UserError(f"{source} does not store its model_args (train.py's ComposerGPT saves them as its extra "
                        f"state): pass --n-head N, or sample from the run's {EXPORT_NAME}")
    vocab_size, n_embd = state["transformer.wte.weight"].shape
    layers = {int(m.group(1)) for k in state if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    return dict(block_size=state["transformer.wpe.weight"].shape[0], vocab_size=vocab_size,
                n_layer=len(layers), n_head=n_head, n_embd=n_embd, dropout=0.0,
                bias="transformer.ln_f.bias" in state)


def load_model(path: str, n_head: int | None = None, source: str | None = None) -> GPT:
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
            model_args = {**model_args, "dropout": 0.0}
            return gpt_from_weights(model_args, state, source)
    except ValueError as e:
        raise UserError(str(e)) from None
    raise UserError(f"{source} is neither a {EXPORT_NAME} export (model.save_export) nor a Composer checkpoint")


# ---------------------------------------------------------------------------------------------------------
# Sampling

def pick_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device: use cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA GPU is visible here; use --device cpu")
    return device


def encode_prompt(prompt: str, vocab_size: int) -> list[int]:
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    ids = enc.encode(prompt, allowed_special={EOT})
    if not ids:
        ids = [enc.eot_token]  # an empty prompt: start a new document
    if max(ids) >= vocab_size:
        raise UserError(f"the prompt encodes to token {max(ids)}, but the model's vocabulary has only "
                        f"{vocab_size} tokens: was it trained with the GPT-2 tokenizer?")
    return ids


def decode(ids: list[int]) -> str:
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    # A vocabulary padded past GPT-2's 50257 (e.g. 50304) has ids with no text; drop them.
    return enc.decode([i for i in ids if i < enc.n_vocab])


def main(argv=None) -> int:
    args = parse_args(argv)
    load_dotenv_file()
    device = pick_device(args.device)
    with tempfile.TemporaryDirectory(prefix="sample-") as tmpdir:
        if args.checkpoint.startswith("s3://"):
            path = download_s3(args.checkpoint, tmpdir, args.endpoint_url)
        else:
            path = resolve_local(args.checkpoint)
        model = load_model(path, n_head=args.n_head, source=args.checkpoint if path.startswith(tmpdir) else path)
    model.to(device)

    prompt = encode_prompt(args.prompt, model.config.vocab_size)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(args.seed)
    idx = torch.tensor([prompt] * args.num_samples, dtype=torch.long, device=device)  # (N, T)
    top_k = args.top_k or None
    from tqdm import tqdm

    start = time.perf_counter()
    # One token per call so the bar moves; the same RNG draws as one generate(idx, max_new_tokens) call.
    for _ in tqdm(range(args.max_new_tokens), desc="generate", unit="tok", file=sys.stderr, leave=False):
        idx = model.generate(idx, 1, temperature=args.temperature, top_k=top_k)
    seconds = time.perf_counter() - start
    for row in idx.tolist():
        print(decode(row))
        print(SEPARATOR)
    sys.stdout.flush()
    new_tokens = args.num_samples * args.max_new_tokens
    print(f"sampled {args.num_samples} x {args.max_new_tokens} tokens from a {model.num_params() / 1e6:.2f}M-parameter "
          f"model on {device} in {seconds:.1f} s ({new_tokens / max(seconds, 1e-9):.0f} tokens/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
