"""Tokenize The Pile (or local text) with GPT-2 BPE into flat numpy memmap files train.bin / val.bin.

Usage:
    python prepare_data.py                                  # The Pile from the HF Hub, streamed, into data/pile
    python prepare_data.py --max-tokens 1000000000 --out-dir data/pile_1b     # a 1B-token slice
    python prepare_data.py --exclude-subset "Books3" --exclude-subset "Github"  # drop Pile subsets
    python prepare_data.py --input ~/pile/train/00.jsonl.zst ~/pile/val.jsonl.zst --out-dir data/pile00
    python prepare_data.py --input ../shared/data/tinyshakespeare/input.txt --out-dir data/shakespeare
    python prepare_data.py --shard-index 3 --num-shards 8 --out-dir data/pile/part-03   # one of 8 jobs

Output (in --out-dir):
    train.bin, val.bin   every document as tiktoken `encode_ordinary(text) + [EOT]`, concatenated, as a
                         flat array (uint16 for GPT-2): np.memmap("train.bin", dtype=np.uint16, mode="r")
    meta.json            tokenizer, vocab size, EOT id, dtype, token and document counts per split, sources

Sources: `--dataset` reads a Hugging Face Hub dataset's files (default: The Pile mirror
monology/pile-uncopyrighted) or any fsspec URL (s3://, file://) file by file, streaming, so no Arrow cache
is ever written. `--input` reads local paths, globs or folders of .jsonl.zst / .jsonl / .jsonl.gz files
(one JSON object per line with a text field) and .txt files (one file = one document; --text-suffix .py
reads other files as plain text too).

Splits: a file named like val.jsonl.zst / validation.* / dev.* (or under a val/ folder) is validation data,
test.* files are skipped, the rest is train. Inputs without their own validation files get a deterministic
--val-fraction of documents (chosen by a hash of each document's text, so the split does not depend on
file order or --num-proc).

A run is resumable: interrupt it (Ctrl-C, kill, a dropped connection) and run the same command again: it
continues after the last finished input file and ends byte-identical to an uninterrupted run. Until it
finishes, the folder holds only train.bin.partial / val.bin.partial and a state file, never a train.bin.
"""

from __future__ import annotations

import argparse
import codecs
import copy
import glob
import gzip
import hashlib
import io
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from common import META_NAME, UserError, atomic_write_text, run_main

VERSION = 1  # of the output format: bump when the tokens written for the same input change
DEFAULT_DATASET = "monology/pile-uncopyrighted"  # the maintained Pile mirror: train/NN.jsonl.zst, val, test
DEFAULT_OUT_DIR = "data/pile"
DEFAULT_VAL_FRACTION = 0.0005  # used only when the input has no validation files of its own
CHUNK_BYTES = 1 << 20  # raw text per task sent to a tokenizer process
STATE_NAME = ".prepare_state.json"  # progress of an unfinished run; removed when the run finishes
COMMIT_SECONDS = 1.0  # at a file's end, fsync the outputs and record progress if this long has passed
SPLIT_WORDS = {"val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test", "train": "train"}
JSONL_SUFFIXES = (".jsonl.zst", ".jsonl.zstd", ".jsonl.gz", ".jsonl", ".json.zst", ".json.gz")
TEXT_SUFFIXES = (".txt",)


@dataclass
class SourceFile:
    """One input file: the unit of work and of resumption."""

    url: str  # local path, or an fsspec URL (hf://, s3://, file://)
    name: str  # shown to the user and recorded in meta.json (relative to the input root when possible)
    split: str  # "train" | "val" | "test"
    size: Optional[int]  # bytes, recorded so a resumed run notices a changed input
    kind: str  # "jsonl" (one JSON object per line) | "text" (the whole file is one document)


class BadInput(Exception):
    """Raised in a tokenizer process for input the user must fix; carries a one-line message."""


# ----------------------------------------------------------------------------------------------------
# finding the input files


def split_of(rel_name: str) -> str:
    """The split a file belongs to by its name: val.jsonl.zst -> val, val/01.jsonl -> val, else train."""
    parts = Path(rel_name).parts
    stem = parts[-1].split(".")[0].lower()
    for word in [stem] + [p.lower() for p in parts[:-1]]:
        if word in SPLIT_WORDS:
            return SPLIT_WORDS[word]
    return "train"


def kind_of(name: str, text_suffixes: Sequence[str]) -> Optional[str]:
    """'jsonl', 'text', or None for a file type prepare_data does not read."""
    lower = name.lower()
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(tuple(text_suffixes)):
        return "text"
    return None


def list_local_inputs(patterns: Sequence[str], text_suffixes: Sequence[str]) -> list[SourceFile]:
    files: dict[str, SourceFile] = {}
    for pattern in patterns:
        pattern = os.path.expanduser(pattern)
        if os.path.isdir(pattern):
            root = Path(pattern)
            found = sorted(p for p in root.rglob("*") if p.is_file() and kind_of(p.name, text_suffixes))
            if not found:
                raise UserError(f"--input {pattern}: folder holds no .jsonl.zst/.jsonl/.jsonl.gz/"
                                f"{'/'.join(text_suffixes)} files")
            for p in found:
                rel = p.relative_to(root).as_posix()
                files[str(p.resolve())] = SourceFile(str(p), rel, split_of(rel), p.stat().st_size,
                                                     kind_of(p.name, text_suffixes))
            continue
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise UserError(f"--input {pattern}: no files matched; check the path or quote the glob")
        for m in matches:
            kind = kind_of(m, text_suffixes)
            if kind is None:
                raise UserError(f"--input {m}: unsupported file type; use .jsonl.zst, .jsonl, .jsonl.gz or .txt "
                                "(or --text-suffix to read other files as plain text)")
            name = os.path.basename(m)
            files[str(Path(m).resolve())] = SourceFile(m, name, split_of(name), os.path.getsize(m), kind)
    return list(files.values())


def list_dataset_files(dataset: str, text_suffixes: Sequence[str]) -> list[SourceFile]:
    """The files of a HF Hub dataset (or any fsspec URL), read without `datasets` so nothing is cached."""
    import fsspec

    url = dataset if "://" in dataset else f"hf://datasets/{dataset}"
    try:
        fs, root = fsspec.core.url_to_fs(url)
        listing = fs.find(root, detail=True)
    except FileNotFoundError:
        raise UserError(f"--dataset {dataset}: not found; check the name (e.g. {DEFAULT_DATASET})") from None
    except Exception as e:  # the Hub client raises many types for network and auth failures
        raise UserError(f"--dataset {dataset}: cannot list files ({type(e).__name__}: {e}); check the network, "
                        "or HF_TOKEN for a gated dataset, or download the files and use --input") from None
    root = root.rstrip("/")
    files = []
    for path, info in sorted(listing.items()):
        rel = path[len(root):].lstrip("/")
        if info.get("type", "file") == "file" and kind_of(rel, text_suffixes):
            files.append(SourceFile(fs.unstrip_protocol(path), rel, split_of(rel), info.get("size"),
                                    kind_of(rel, text_suffixes)))
    if not files:
        raise UserError(f"--dataset {dataset}: no .jsonl.zst/.jsonl/.jsonl.gz/.txt files found in it")
    return files


def plan_files(files: list[SourceFile], shard_index: int, num_shards: int) -> tuple[list[SourceFile], int]:
    """Order the work: validation files first (so a --max-tokens slice still has them), then train.

    With --num-shards, file k of the sorted list goes to shard k % num_shards: the shards together hold every
    file exactly once. Returns (files to read, number of test files skipped).
    """
    files = sorted(files, key=lambda f: f.name)
    files = [f for k, f in enumerate(files) if k % num_shards == shard_index]
    n_test = sum(f.split == "test" for f in files)
    kept = [f for f in files if f.split == "val"] + [f for f in files if f.split == "train"]
    return kept, n_test


# ----------------------------------------------------------------------------------------------------
# reading files as chunks of raw text (in the main process)


def open_binary(src: SourceFile):
    """A binary stream of the file's decompressed bytes."""
    if "://" in src.url:
        import fsspec

        raw = fsspec.open(src.url, "rb").open()
    else:
        raw = open(src.url, "rb")
    lower = src.name.lower()
    if lower.endswith((".zst", ".zstd")):
        return io.BufferedReader(ZstdReader(raw), buffer_size=CHUNK_BYTES)
    if lower.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


class ZstdReader(io.RawIOBase):
    """Decompress a stream of zstd frames, and raise on a truncated last frame (zstandard's own
    stream_reader just ends early there, which would silently drop the rest of a cut-off download)."""

    def __init__(self, raw):
        import zstandard

        self.raw, self.zstd = raw, zstandard
        self.obj, self.fed, self.buf, self.pos = self._new(), False, b"", 0

    def _new(self):
        return self.zstd.ZstdDecompressor(max_window_size=2**31).decompressobj()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self.buf:
            data = self.raw.read(CHUNK_BYTES)
            if not data:
                if self.fed and not self.obj.eof:
                    raise self.zstd.ZstdError("the stream ends inside a zstd frame (truncated file)")
                return 0
            while data:
                out = self.obj.decompress(data)
                self.buf += out
                self.fed = True
                if self.obj.eof:  # a frame ended: the next one starts in unused_data
                    data, self.obj, self.fed = self.obj.unused_data, self._new(), False
                else:
                    data = b""
        n = min(len(b), len(self.buf) - self.pos)
        b[:n] = self.buf[self.pos:self.pos + n]
        self.pos += n
        if self.pos == len(self.buf):
            self.buf, self.pos = b"", 0
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


# A task for a tokenizer process: (kind, payload, file name, first line number, split, end_of_document)
Task = tuple


def read_tasks(src: SourceFile) -> Iterator[Task]:
    """Cut a file into tasks of about CHUNK_BYTES. JSONL: whole lines. Text: cuts that keep BPE unchanged."""
    with open_binary(src) as f:
        if src.kind == "jsonl":
            lines, size, first = [], 0, 1
            for lineno, line in enumerate(f, start=1):
                lines.append(line)
                size += len(line)
                if size >= CHUNK_BYTES:
                    yield ("jsonl", b"".join(lines), src.name, first, src.split, True)
                    lines, size, first = [], 0, lineno + 1
            if lines:
                yield ("jsonl", b"".join(lines), src.name, first, src.split, True)
            return
        # One text file is one document. Its text goes out in pieces cut right after a newline that is
        # followed by a non-space character: GPT-2's pre-tokenizer never joins text across such a point,
        # so encoding the pieces one by one gives exactly the tokens of encoding the whole text.
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        pending = ""
        while True:
            block = f.read(CHUNK_BYTES)
            try:
                pending += decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise BadInput(f"{src.name}: invalid UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
            if not block:
                yield ("text", pending, src.name, 1, src.split, True)
                return
            cut = safe_cut(pending)
            if cut > 0:
                yield ("text", pending[:cut], src.name, 1, src.split, False)
                pending = pending[cut:]


_SAFE_CUT = re.compile(r"(?<=\S)\n(?=\S)")


def safe_cut(text: str) -> int:
    """The last index i with text[i-1] == '\\n' and text[i-2], text[i] not whitespace, or 0 if none."""
    cut = 0
    for m in _SAFE_CUT.finditer(text, max(0, len(text) - CHUNK_BYTES // 4)):
        cut = m.end()
    return cut


# ----------------------------------------------------------------------------------------------------
# tokenizing (in the tokenizer processes)

_W: dict = {}  # per-process settings and the tokenizer, set by init_worker


def goes_to_val(key: bytes, fraction: float) -> bool:
    """Deterministic per-document split: a hash of the document, not its position or the process."""
    if fraction <= 0:
        return False
    h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return h < fraction * 2**64


def tokenize_task(task: Task) -> dict:
    """Tokenize one task. Returns token arrays for train and val and the counts."""
    kind, payload, name, first_line, split, end_of_doc = task
    enc, eot, dtype = _W["enc"], _W["eot"], _W["dtype"]
    out = {"train": [], "val": []}
    docs = {"train": 0, "val": 0}
    bad = filtered = empty = 0
    route_by_hash = split == "train" and _W["val_fraction"] > 0

    def emit(text: str, key: bytes, count_doc: bool) -> None:
        dest = "val" if split == "val" or (route_by_hash and goes_to_val(key, _W["val_fraction"])) else "train"
        ids = enc.encode_ordinary(text)
        if count_doc:
            ids.append(eot)
            docs[dest] += 1
        out[dest].extend(ids)

    if kind == "text":
        emit(payload, name.encode(), end_of_doc)
    else:
        column, include, exclude = _W["text_column"], _W["include"], _W["exclude"]
        for offset, line in enumerate(payload.splitlines()):
            if not line.strip():
                continue
            where = f"{name}:{first_line + offset}"
            try:
                rec = json.loads(line)
            except UnicodeDecodeError:
                problem = "invalid UTF-8"
            except ValueError as e:
                problem = f"malformed JSON ({e.msg})"
            else:
                if not isinstance(rec, dict) or not isinstance(rec.get(column), str):
                    problem = f"no string field '{column}' (set --text-column)"
                else:
                    problem = None
            if problem:
                if _W["skip_bad_lines"]:
                    bad += 1
                    continue
                raise BadInput(f"{where}: {problem}; fix the line or pass --skip-bad-lines to skip such lines")
            if include or exclude:
                subset = (rec.get("meta") or {}).get("pile_set_name") if isinstance(rec.get("meta"), dict) else None
                if (include and subset not in include) or (exclude and subset in exclude):
                    filtered += 1
                    continue
            text = rec[column]
            if not text:
                empty += 1
                continue
            emit(text, text.encode("utf-8", "surrogatepass"), True)
    return {
        "train": np.array(out["train"], dtype=dtype),
        "val": np.array(out["val"], dtype=dtype),
        "docs": docs, "bad": bad, "filtered": filtered, "empty": empty,
    }


# ----------------------------------------------------------------------------------------------------
# the output folder: fresh, resumed, or refused


def state_fingerprint(args, files: list[SourceFile], settings: dict) -> dict:
    """Everything that decides the output bytes; a resumed run must match it exactly."""
    return {
        "version": VERSION,
        "files": [[f.name, f.split, f.size, f.kind] for f in files],
        "settings": {k: v for k, v in settings.items() if not k.startswith("_")},
        "max_tokens": args.max_tokens,
    }


def check_out_dir(out_dir: Path, fingerprint: dict, overwrite: bool) -> Optional[dict]:
    """Return the saved state to resume, or None for a fresh run. Refuse a folder that holds other data."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise UserError(f"--out-dir {out_dir} is a file; choose a folder")
    ours = {STATE_NAME, "train.bin.partial", "val.bin.partial"}
    entries = {p.name for p in out_dir.iterdir()}
    state_path = out_dir / STATE_NAME
    if entries and entries <= ours and state_path.exists():
        state = json.loads(state_path.read_text())
        if state.get("fingerprint") == fingerprint:
            return state
        if not overwrite:
            raise UserError(f"--out-dir {out_dir} holds an unfinished run with other inputs or settings; "
                            "re-run that command to resume it, or pass --overwrite to start over")
        return None
    if entries and not overwrite:
        what = "a finished dataset" if (out_dir / META_NAME).exists() else "other files"
        raise UserError(f"--out-dir {out_dir} already holds {what}; pass --overwrite to replace it "
                        "or choose another folder")
    return None


class Writer:
    """Appends tokens to train.bin.partial / val.bin.partial and records progress that a re-run resumes.

    Three copies of the counters: `pending` (all tokens written so far), `done` (at the end of the last
    finished input file) and, on disk, the committed state. A commit makes the files durable first and only
    then records `done`, so the state never claims more than the files hold; a resumed run truncates the
    files to the committed counts, which drops the tokens of a file that was being read.
    """

    def __init__(self, out_dir: Path, fingerprint: dict, state: Optional[dict], dtype: np.dtype):
        self.out_dir, self.dtype = out_dir, dtype
        self.done = state or {"fingerprint": fingerprint, "files_done": 0,
                              "tokens": {"train": 0, "val": 0}, "documents": {"train": 0, "val": 0},
                              "bad_lines": 0, "filtered": 0, "empty": 0}
        self.files = {}
        for split in ("train", "val"):
            path = out_dir / f"{split}.bin.partial"
            self.files[split] = open(path, "r+b" if path.exists() else "w+b")
        self.rollback()
        self.last_commit = time.monotonic()

    def write(self, result: dict, max_train: Optional[int]) -> bool:
        """Append one task's tokens; return True when --max-tokens is reached."""
        p = self.pending
        reached = False
        for split in ("train", "val"):
            arr = result[split]
            if split == "train" and max_train is not None and p["tokens"]["train"] + len(arr) >= max_train:
                arr = arr[: max_train - p["tokens"]["train"]]
                reached = True
            self.files[split].write(arr.tobytes())
            p["tokens"][split] += len(arr)
            p["documents"][split] += result["docs"][split]
        for key in ("bad", "filtered", "empty"):
            p["bad_lines" if key == "bad" else key] += result[key]
        return reached

    def file_done(self) -> None:
        self.pending["files_done"] += 1
        self.done = copy.deepcopy(self.pending)
        if time.monotonic() - self.last_commit >= COMMIT_SECONDS:
            self.commit()

    def commit(self) -> None:
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
        atomic_write_text(self.out_dir / STATE_NAME, json.dumps(self.done))
        self.last_commit = time.monotonic()

    def rollback(self) -> None:
        """Back to the end of the last finished file (at start, or when reading a file failed midway)."""
        self.pending = copy.deepcopy(self.done)
        for split, f in self.files.items():
            f.flush()
            f.truncate(self.done["tokens"][split] * self.dtype.itemsize)
            f.seek(0, io.SEEK_END)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


# ----------------------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring (python -c 'import prepare_data; "
                                       "help(prepare_data)') for examples.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dataset", default=None,
                     help=f"HF Hub dataset name or fsspec URL (default {DEFAULT_DATASET} when no --input)")
    src.add_argument("--input", nargs="+", metavar="PATH_OR_GLOB", help="local files, globs or folders")
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help=f"output folder (default {DEFAULT_OUT_DIR})")
    p.add_argument("--num-proc", type=int, default=os.cpu_count() or 1, help="tokenizer processes (default: all cores)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help=f"fraction of documents for validation when the input has no validation files "
                        f"(default {DEFAULT_VAL_FRACTION}; 0 = no validation split)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many train tokens")
    p.add_argument("--text-column", default="text", help="JSON field that holds the text (default: text)")
    p.add_argument("--include-subset", action="append", default=[], metavar="NAME",
                   help="keep only documents whose meta.pile_set_name is NAME (repeatable)")
    p.add_argument("--exclude-subset", action="append", default=[], metavar="NAME",
                   help="drop documents whose meta.pile_set_name is NAME (repeatable), e.g. 'Books3'")
    p.add_argument("--text-suffix", action="append", default=[], metavar="SUFFIX",
                   help="also read files ending in SUFFIX as plain text, one file = one document "
                        "(repeatable), e.g. --text-suffix .py")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip malformed JSON lines / invalid UTF-8 / missing text fields and count them")
    p.add_argument("--encoding", default="gpt2", help="tiktoken encoding (default gpt2)")
    p.add_argument("--shard-index", type=int, default=0, help="this job's index when the input is split "
                                                               "across --num-shards parallel jobs")
    p.add_argument("--num-shards", type=int, default=1, help="number of parallel jobs (files assigned "
                                                              "round-robin by sorted name)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished dataset in --out-dir")
    args = p.parse_args(argv)
    if args.num_proc < 1:
        raise UserError(f"--num-proc {args.num_proc}: must be at least 1")
    if args.val_fraction is not None and not 0 <= args.val_fraction < 1:
        raise UserError(f"--val-fraction {args.val_fraction}: must be in [0, 1)")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UserError(f"--max-tokens {args.max_tokens}: must be positive")
    if not 0 <= args.shard_index < args.num_shards:
        raise UserError(f"--shard-index {args.shard_index}: must be in [0, --num-shards={args.num_shards})")
    return args


def is_remote(src: SourceFile) -> bool:
    return "://" in src.url and not src.url.startswith("file://")


class Pipeline:
    """Tasks go to `num_proc` tokenizer processes and come back in order, at most 2 per process in flight
    (so memory stays bounded however large the input is); with num_proc == 1 everything runs in-process.
    The order of the output never depends on the number of processes."""

    def __init__(self, num_proc: int, settings: dict):
        self.pool = None
        if num_proc > 1:
            self.pool = mp.get_context("spawn").Pool(num_proc, init_worker, (settings,))
        else:
            init_worker(settings, ignore_sigint=False)
        self.max_in_flight = 2 * num_proc
        self.queue: deque = deque()  # (file index, AsyncResult | result dict | None for "file ends")

    def submit(self, file_index: int, task) -> None:
        if task is None:
            self.queue.append((file_index, None))
        elif self.pool is None:
            self.queue.append((file_index, tokenize_task(task)))
        else:
            self.queue.append((file_index, self.pool.apply_async(tokenize_task, (task,))))

    def full(self) -> bool:
        return len(self.queue) >= self.max_in_flight

    def pop(self):
        """The oldest entry: (file index, result dict or None at a file's end). Raises the task's error."""
        file_index, item = self.queue.popleft()
        if item is not None and not isinstance(item, dict):
            item = item.get()
        return file_index, item

    def close(self, terminate: bool = False) -> None:
        if self.pool is not None:
            if terminate:
                self.pool.terminate()
            else:
                self.pool.close()
            self.pool.join()
            self.pool = None


def get_encoding(name: str):
    """tiktoken's encoding `name`. "gpt2" loads as "r50k_base": the same vocabulary, merges, pattern and
    special tokens (so the same tokens), from a file that parses in 0.3 s instead of 1.7 s per process."""
    import tiktoken

    return tiktoken.get_encoding("r50k_base" if name == "gpt2" else name)


def init_worker(settings: dict, ignore_sigint: bool = True) -> None:
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    _W.clear()
    _W.update(settings)
    _W["enc"] = get_encoding(settings["encoding"])
    _W["dtype"] = np.dtype(settings["dtype"])


def tokenize(files: list[SourceFile], writer: Writer, pipeline: Pipeline, max_tokens: Optional[int],
             progress) -> bool:
    """Tokenize files[writer.done['files_done']:] in order. Returns True if stopped at --max-tokens."""

    def handle(file_index: int, result: Optional[dict]) -> bool:
        if result is None:
            writer.file_done()
            progress.set_postfix_str(f"files {writer.done['files_done']}/{len(files)} "
                                     f"docs {sum(writer.pending['documents'].values()):,}", refresh=False)
            return False
        reached = writer.write(result, max_tokens)
        progress.update(len(result["train"]) + len(result["val"]))
        return reached

    for i in range(writer.done["files_done"], len(files)):
        src = files[i]
        for attempt in range(1, 4):
            tasks = read_tasks(src)
            try:
                while True:
                    try:
                        task = next(tasks)
                    except StopIteration:
                        break
                    pipeline.submit(i, task)
                    while pipeline.full():
                        if handle(*pipeline.pop()):
                            return True
            except (BadInput, UserError, KeyboardInterrupt):
                raise
            except Exception as e:  # reading the file failed (tokenizer errors come from pop(), not here)
                error = classify_read_error(src, e)
                if error is not None:
                    raise error from None
                if attempt == 3:
                    raise UserError(f"{src.name}: reading failed 3 times ({type(e).__name__}: {e}); check the "
                                    "connection and run the same command again to resume") from None
                # A dropped connection: finish the earlier files, forget this file's tokens, read it again.
                while pipeline.queue and pipeline.queue[0][0] < i:
                    if handle(*pipeline.pop()):
                        return True
                while pipeline.queue:
                    pipeline.pop()
                writer.rollback()
                print(f"\n{src.name}: {type(e).__name__}: {e}; reading it again (attempt {attempt + 1}/3)",
                      file=sys.stderr)
                time.sleep(2 ** attempt)
                continue
            pipeline.submit(i, None)
            break
    while pipeline.queue:
        if handle(*pipeline.pop()):
            return True
    return False


def classify_read_error(src: SourceFile, e: Exception) -> Optional[UserError]:
    """A UserError for a bad file, or None for a failure worth retrying (a remote read that broke off)."""
    import zstandard

    if isinstance(e, zstandard.ZstdError) or "zstd" in type(e).__name__.lower():
        return UserError(f"{src.name}: truncated or corrupt zstd data ({e}); download the file again")
    if isinstance(e, (EOFError, gzip.BadGzipFile)):
        return UserError(f"{src.name}: truncated or corrupt gzip data ({e}); download the file again")
    if isinstance(e, FileNotFoundError) and not is_remote(src):
        return UserError(f"{src.name}: file disappeared while reading ({e}); check the input")
    if not is_remote(src):
        return UserError(f"{src.name}: cannot read ({type(e).__name__}: {e}); check the file")
    return None


def finish(out_dir: Path, writer: Writer, meta: dict) -> None:
    """Publish: the .partial files become train.bin / val.bin, then meta.json (the mark of a finished set)."""
    writer.done = writer.pending
    writer.commit()
    writer.close()
    (out_dir / META_NAME).unlink(missing_ok=True)  # an old finished set (with --overwrite) is no longer one
    os.replace(out_dir / "train.bin.partial", out_dir / "train.bin")
    if writer.done["tokens"]["val"]:
        os.replace(out_dir / "val.bin.partial", out_dir / "val.bin")
    else:
        (out_dir / "val.bin.partial").unlink()
        (out_dir / "val.bin").unlink(missing_ok=True)
    atomic_write_text(out_dir / META_NAME, json.dumps(meta, indent=2) + "\n")
    (out_dir / STATE_NAME).unlink()


def discard(out_dir: Path, created: bool) -> None:
    """Remove this run's own unfinished files (and the folder if this run made it)."""
    for name in (STATE_NAME, "train.bin.partial", "val.bin.partial"):
        (out_dir / name).unlink(missing_ok=True)
    if created and not any(out_dir.iterdir()):
        out_dir.rmdir()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    try:
        enc = get_encoding(args.encoding)
    except Exception as e:
        raise UserError(f"--encoding {args.encoding}: cannot load the tiktoken vocabulary ({type(e).__name__}); "
                        "it is downloaded once, so check the network or set TIKTOKEN_CACHE_DIR") from None
    dtype = np.dtype(np.uint16 if enc.n_vocab <= 2**16 else np.uint32)
    text_suffixes = TEXT_SUFFIXES + tuple(s if s.startswith(".") else "." + s for s in args.text_suffix)

    if args.input:
        files = list_local_inputs(args.input, text_suffixes)
        sources = {"input": args.input}
    else:
        dataset = args.dataset or DEFAULT_DATASET
        files = list_dataset_files(dataset, text_suffixes)
        sources = {"dataset": dataset}
    files, n_test = plan_files(files, args.shard_index, args.num_shards)
    if not files:
        raise UserError(f"shard {args.shard_index} of {args.num_shards} gets no train or validation files "
                        f"(the input has fewer files than --num-shards); use fewer shards")
    has_own_val = any(f.split == "val" for f in files)
    if has_own_val:
        if args.val_fraction:
            print(f"note: the input has validation files ({', '.join(f.name for f in files if f.split == 'val')}); "
                  "--val-fraction is ignored", file=sys.stderr)
        val_fraction = 0.0
    else:
        val_fraction = DEFAULT_VAL_FRACTION if args.val_fraction is None else args.val_fraction
    settings = {
        "encoding": args.encoding, "eot": enc.eot_token, "dtype": dtype.name, "val_fraction": val_fraction,
        "text_column": args.text_column, "include": sorted(set(args.include_subset)),
        "exclude": sorted(set(args.exclude_subset)), "skip_bad_lines": args.skip_bad_lines,
    }
    fingerprint = state_fingerprint(args, files, settings)
    out_dir = Path(args.out_dir)
    state = check_out_dir(out_dir, fingerprint, args.overwrite)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)

    writer = Writer(out_dir, fingerprint, state, dtype)
    resumed = writer.done["files_done"]
    if resumed:
        print(f"resuming: {resumed} of {len(files)} files already done "
              f"({writer.done['tokens']['train']:,} train tokens)", file=sys.stderr)
    t0 = time.time()
    progress = tqdm(total=args.max_tokens, initial=sum(writer.done["tokens"].values()), unit="tok",
                    unit_scale=True, desc="tokenizing", dynamic_ncols=True, file=sys.stderr,
                    mininterval=0.5 if sys.stderr.isatty() else 30)  # a log file gets a line per 30 s
    pipeline = Pipeline(min(args.num_proc, 64), settings)
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)  # preemption: stop as cleanly as Ctrl-C
    try:
        reached = tokenize(files, writer, pipeline, args.max_tokens, progress)
    except BaseException as e:
        pipeline.close(terminate=True)
        progress.close()
        done = writer.done["files_done"]
        if done > resumed:
            writer.commit()  # keep every finished file for the next run
        writer.close()
        if done == 0:
            discard(out_dir, created)  # nothing worth resuming: leave the folder as it was
        if isinstance(e, BadInput):
            raise UserError(f"{e} ({done} of {len(files)} files done; re-run to resume)") from None
        if isinstance(e, UserError):
            raise UserError(f"{e} ({done} of {len(files)} files done)") from None
        if isinstance(e, KeyboardInterrupt):
            print(f"interrupted: {done} of {len(files)} files done; run the same command again to resume",
                  file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    pipeline.close(terminate=reached)
    progress.close()

    totals = writer.pending
    if totals["tokens"]["train"] == 0:
        writer.close()
        discard(out_dir, created)
        raise UserError(f"empty corpus: no text in {', '.join(sources.get('input') or [sources.get('dataset')])} "
                        f"(documents empty: {totals['empty']}, filtered out: {totals['filtered']}, bad lines: "
                        f"{totals['bad_lines']}); check --text-column and the subset filters")
    splits = {s: {"file": f"{s}.bin", "tokens": totals["tokens"][s], "documents": totals["documents"][s]}
              for s in ("train", "val") if totals["tokens"][s]}
    meta = {
        "version": VERSION, "tool": "prepare_data.py", "tokenizer": args.encoding, "vocab_size": enc.n_vocab,
        "eot_token": enc.eot_token, "dtype": dtype.name, "splits": splits,
        "sources": {**sources, "files": [f.name for f in files[: totals["files_done"] + (1 if reached else 0)]],
                    "test_files_skipped": n_test},
        "val_split": "the dataset's validation files" if has_own_val else
                     (f"hash of each document, fraction {val_fraction}" if val_fraction else "none"),
        "text_column": args.text_column, "include_subsets": settings["include"],
        "exclude_subsets": settings["exclude"], "max_tokens": args.max_tokens, "stopped_at_max_tokens": reached,
        "shard": {"index": args.shard_index, "count": args.num_shards},
        "skipped_bad_lines": totals["bad_lines"], "filtered_documents": totals["filtered"],
        "empty_documents": totals["empty"],
    }
    finish(out_dir, writer, meta)
    if val_fraction and not totals["tokens"]["val"]:
        print(f"note: --val-fraction {val_fraction} picked none of the {totals['documents']['train']:,} documents "
              "(a .txt file is one document), so there is no val.bin; use more documents or a larger fraction",
              file=sys.stderr)
    seconds = time.time() - t0
    new_tokens = sum(totals["tokens"].values()) - sum(state["tokens"].values() if state else [0])
    val = splits.get("val", {"tokens": 0, "documents": 0})
    print(f"prepare_data: {splits['train']['tokens']:,} train tokens ({splits['train']['documents']:,} docs), "
          f"{val['tokens']:,} val tokens ({val['documents']:,} docs) from {len(meta['sources']['files'])} files "
          f"-> {out_dir} in {seconds:.1f}s ({new_tokens / max(seconds, 1e-9):,.0f} tok/s)"
          + (f"; skipped {totals['bad_lines']} bad lines" if totals["bad_lines"] else "")
          + (f"; filtered {totals['filtered']} docs" if totals["filtered"] else ""))
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    run_main(main)
