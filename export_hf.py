"""Export a trained GPT as a Hugging Face folder (config.json, model.safetensors, GPT-2's tokenizer files) that
transformers, lm-evaluation-harness and the hub read, offline: GPT2LMHeadModel for GPT-2, LlamaForCausalLM or
Qwen3ForCausalLM for the RoPE + RMSNorm + SwiGLU variants. SRC is what sample.py takes; the folder is
written beside OUT_DIR and renamed into place, and never inside SRC's run folder. Details: docs/huggingface.md.

Usage:
    python export_hf.py runs/pile hf/pile-gpt                       # a run folder: its model.pt, else latest-rank0.pt
    python export_hf.py runs/pile/ep0-ba2000-rank0.pt hf/pile-2000  # a Composer checkpoint
    python export_hf.py s3://bucket/runs/pile/model.pt hf/pile-gpt --overwrite
    python -c 'from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained("hf/pile-gpt")'"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from pilegpt import storage
from pilegpt.checkpoint import add_load_arguments, existing_checkpoints, load_model, unwrap
from pilegpt.common import UserError, check_writable_folder, load_dotenv_file, run_main
from pilegpt.hf import HF_CLASSES, hf_model_type, to_hf
from pilegpt.tokenizer import EOT, EOT_ID, GPT2_VOCAB_SIZE, gpt2


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help with each flag's default, and the docstring's usage lines as they are written."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=HelpFormatter)
    p.add_argument("src", help="model.pt export, Composer checkpoint file, or run folder; local path or s3://bucket/key")
    p.add_argument("out_dir", help="folder to write the Hugging Face model into")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in OUT_DIR (nothing else)")
    add_load_arguments(p)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------------
# GPT-2's tokenizer files, from tiktoken's ranks

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 byte values to printable characters, in which vocab.json and merges.txt are written:
    the printable Latin-1 bytes stand for themselves, the other 68 take the characters from U+0100 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """GPT-2's merge list, in order, from tiktoken's token ranks.

    Token r (r >= 256) is what merge r - 256 made. Its two halves are what byte-level BPE leaves of the token when it
    may use only the merges before r: start from single bytes, and keep merging the adjacent pair whose merged
    token has the lowest rank below r (the standard tiktoken -> Hugging Face conversion).
    """
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            pair_ranks = [ranks.get(a + b, rank) for a, b in zip(parts, parts[1:])]
            best = min(range(len(pair_ranks)), key=pair_ranks.__getitem__)
            if pair_ranks[best] >= rank:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        assert len(parts) == 2, f"token {rank} ({token!r}) is no merge of two earlier tokens"
        merges.append((parts[0], parts[1]))
    return merges


@functools.lru_cache(maxsize=None)
def gpt2_vocab_and_merges() -> tuple[str, str]:
    """The text of GPT-2's vocab.json and merges.txt, made from tokenizer.py's vocabulary (no download)."""
    enc = gpt2()
    ranks = {enc.decode_single_token_bytes(i): i for i in range(enc.n_vocab) if i != EOT_ID}
    assert len(ranks) == GPT2_VOCAB_SIZE - 1 and EOT_ID == len(ranks), "GPT-2: 50,256 BPE tokens, then <|endoftext|>"
    to_text = bytes_to_unicode()
    text = lambda token: "".join(to_text[b] for b in token)
    vocab = {**{text(token): rank for token, rank in ranks.items()}, EOT: EOT_ID}
    merges = [f"{text(a)} {text(b)}" for a, b in recover_merges(ranks)]
    return json.dumps(vocab, ensure_ascii=False), "#version: 0.2\n" + "\n".join(merges) + "\n"


def write_tokenizer(folder: Path, model_max_length: int) -> None:
    """GPT-2's tokenizer files (vocab.json, merges.txt, tokenizer.json, configs) into folder: AutoTokenizer then
    encodes text to the ids that tokenizer.gpt2().encode_ordinary gives."""
    from transformers import GPT2TokenizerFast

    vocab, merges = gpt2_vocab_and_merges()
    (folder / "vocab.json").write_text(vocab, encoding="utf-8")
    (folder / "merges.txt").write_text(merges, encoding="utf-8")
    tokenizer = GPT2TokenizerFast(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"),
                                  model_max_length=model_max_length, add_prefix_space=False)
    tokenizer.save_pretrained(str(folder))  # adds tokenizer.json and the configs (<|endoftext|> as bos/eos/unk)


# ---------------------------------------------------------------------------------------------------------
# The folder

def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# What an export folder holds: --overwrite replaces a folder of these files only (never a run, never anything else).
EXPORT_FILES = frozenset({"config.json", "model.safetensors", "generation_config.json", "vocab.json", "merges.txt",
                          "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})


def refuse_existing(out_dir: Path, overwrite: bool) -> None:
    """UserError unless out_dir is absent, an empty folder, or (with overwrite) an earlier export."""
    if not out_dir.exists() or (out_dir.is_dir() and not any(out_dir.iterdir())):
        return
    if not overwrite:
        raise UserError(f"{out_dir} already exists and is not empty: pass --overwrite to replace it, or another "
                        "OUT_DIR")
    found = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    foreign = [n for n in found if n not in EXPORT_FILES or not (out_dir / n).is_file()]
    if not out_dir.is_dir() or foreign or not {"config.json", "model.safetensors"} <= set(found):
        holds = f"it holds {', '.join(foreign[:3])}" if foreign else "it is no export folder"
        raise UserError(f"{out_dir} is not an earlier export ({holds}): --overwrite replaces only a folder that "
                        "export_hf.py wrote (config.json, model.safetensors, tokenizer files); pass another OUT_DIR")


def refuse_overlap(src: str, out_dir: Path) -> None:
    """UserError when out_dir is, contains or lies inside SRC's run folder (SRC itself, or the folder of a checkpoint
    file when it holds Composer checkpoints), symlinks and relative paths resolved: the export would replace or mix
    with the run's files. Beside a lone model.pt (`export_hf.py model.pt hf`) is fine: nothing there is replaced."""
    source = Path(storage.local_path(src))
    if storage.is_remote(src) or not source.exists():
        return  # an s3:// source shares nothing with a local folder; a missing one is load_model's error
    folder, out = (source if source.is_dir() else source.parent).resolve(), out_dir.resolve()
    inside = source.is_dir() or bool(existing_checkpoints(str(folder)))
    where = "is" if out == folder else "contains" if out in folder.parents else "lies inside" \
        if inside and folder in out.parents else None
    if where:
        what = "the run folder" if source.is_dir() else "the folder of"
        raise UserError(f"OUT_DIR {out_dir} {where} {what} {src} ({folder}): an export there would replace or mix "
                        "with the run's files; pass an OUT_DIR outside it, e.g. hf/NAME")


def write_folder_atomically(out_dir: Path, overwrite: bool, fill: Callable[[Path], None]) -> None:
    """Let fill() write into a temporary folder beside out_dir, then rename it to out_dir (replacing an old one only
    with overwrite). On an error nothing is left behind and an existing out_dir is untouched."""
    refuse_existing(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp", dir=out_dir.parent))
    os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes it private
    try:
        fill(tmp)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old{os.getpid()}")
            os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export(model, out_dir: str | os.PathLike, overwrite: bool = False) -> None:
    """Write `model` (our GPT) to out_dir as a Hugging Face folder (hf.to_hf's class) with GPT-2's tokenizer."""
    from transformers import GenerationConfig

    hf_model = to_hf(model)
    hf_model.generation_config = GenerationConfig(bos_token_id=EOT_ID, eos_token_id=EOT_ID)

    def fill(folder: Path) -> None:
        hf_model.save_pretrained(str(folder), safe_serialization=True)
        write_tokenizer(folder, model_max_length=unwrap(model).config.block_size)
        for path in folder.iterdir():  # safetensors writes its file private; the export is an ordinary folder
            path.chmod(0o666 & ~umask())

    write_folder_atomically(Path(out_dir), overwrite, fill)


def main(argv=None) -> int:
    args = parse_args(argv)
    load_dotenv_file()
    out_dir = Path(args.out_dir)
    refuse_overlap(args.src, out_dir)  # before reading a model that may be gigabytes
    refuse_existing(out_dir, args.overwrite)
    check_writable_folder(out_dir, "OUT_DIR", "choose another OUT_DIR", beside=True)  # the export is staged beside it
    model = load_model(args.src, n_head=args.n_head, endpoint_url=args.endpoint_url,
                       custom_refused="export_hf.py writes Hugging Face GPT-2 from model.py's GPT only")
    export(model, out_dir, overwrite=args.overwrite)
    cfg = model.config
    print(f"exported {args.src} as {HF_CLASSES[hf_model_type(cfg)]} ({model.num_params() / 1e6:.2f}M parameters: "
          f"{cfg.n_layer} layers, {cfg.n_head} heads, {cfg.n_embd} wide, block_size {cfg.block_size}) to {out_dir}: "
          f"AutoModelForCausalLM.from_pretrained({str(out_dir)!r}) loads it")
    return 0


if __name__ == "__main__":
    run_main(main)
