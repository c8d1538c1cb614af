"""Tokenize The Pile (or any Hugging Face dataset, or local text) with GPT-2 BPE into flat numpy memmap files
train.bin / val.bin.

Usage:
    python prepare_data.py                                  # The Pile from the HF Hub, streamed, into data/pile
    python prepare_data.py --max-tokens 1000000000 --out-dir data/pile_1b     # a 1B-token slice
    python prepare_data.py --exclude-subset "Books3" --exclude-subset "Github"  # drop Pile subsets
    python prepare_data.py --dataset HuggingFaceFW/fineweb --dataset-config sample-10BT --out-dir data/fineweb
    python prepare_data.py --input ~/pile/train/00.jsonl.zst ~/pile/val.jsonl.zst --out-dir data/pile00
    python prepare_data.py --input tests/fixtures/tinyshakespeare.txt --out-dir data/shakespeare
    python prepare_data.py --shard-index 3 --num-shards 8 --out-dir data/pile/part-03   # one of 8 jobs

Output (in --out-dir):
    train.bin, val.bin   every document as tiktoken `encode_ordinary(text) + [EOT]`, concatenated, as a
                         flat array (uint16 for GPT-2): np.memmap("train.bin", dtype=np.uint16, mode="r")
    meta.json            tokenizer, vocab size, EOT id, dtype, token and document counts per split, sources

Sources: `--dataset` takes a Hugging Face Hub dataset name (default: The Pile mirror
monology/pile-uncopyrighted), an fsspec URL (s3://, file://) or a local folder. A dataset made of .jsonl.zst /
.jsonl / .jsonl.gz / .txt files (the Pile's layout) is read file by file; any other (Parquet: FineWeb and most
of the Hub) goes through `datasets.load_dataset(..., streaming=True)` split by split, with --dataset-config
for its configuration and --text-column for its column. Both stream: no Arrow cache is written. `--input`
reads local paths, globs or folders of .jsonl.zst / .jsonl / .jsonl.gz files (one JSON object per line with a
text field) and .txt files (one file = one document; --text-suffix .py reads other files as plain text too).

Documents: an empty or whitespace-only text (`str.isspace`) is skipped and counted (meta.json
"empty_documents"): it would only add an EOT. A corpus without a single token is an error.

Splits: a file named like val.jsonl.zst / validation.* / dev.* (or under a val/ folder), or a `datasets`
split named so, is validation data; test files and splits are skipped; the rest is train. Inputs without
their own validation data get a deterministic --val-fraction of documents (chosen by a hash of each
document's text, so the split does not depend on file order or --num-proc).

A run is resumable: stop it any way (Ctrl-C, kill -9, a full disk, a bad line, a dropped connection) and run
the same command again: it continues from its last record of progress and ends byte-identical to an
uninterrupted run. Progress is recorded about once a second, at a document boundary, after the tokens are
on disk: within a JSONL file a resumed run skips the bytes already tokenized (decompressing them again,
which is fast, but re-downloading them for a remote file); a .txt document starts over; a `datasets` split
re-reads the rows already tokenized (re-downloading them for a Hub dataset) without tokenizing them. Files
not read yet may change between the runs (e.g. a truncated file downloaded again); a file that changed after
it was partly read is read again from its start. Until the run finishes, the folder holds only
train.bin.partial / val.bin.partial and a state file, never a train.bin; with --overwrite the old dataset
stays until the new one replaces it.
"""

from __future__ import annotations

import argparse
import codecs
import copy
import errno
import glob
import gzip
import hashlib
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import tempfile
import time
from collections import deque
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional, Sequence

import numpy as np
import orjson

from pilegpt.common import UserError, atomic_write_text, run_main
from pilegpt.data import META_NAME, META_VERSION, Meta
from pilegpt.tokenizer import get_encoding

DEFAULT_DATASET = "monology/pile-uncopyrighted"  # the maintained Pile mirror: train/NN.jsonl.zst, val, test
DEFAULT_OUT_DIR = "data/pile"
DEFAULT_VAL_FRACTION = 0.0005  # used only when the input has no validation files of its own
CHUNK_BYTES = 1 << 20  # raw text per task sent to a tokenizer process
ROWS_PER_READ = 1000  # rows per batch read from a `datasets` stream
STATE_NAME = ".prepare_state.json"  # progress of an unfinished run; removed when the run finishes
STATE_VERSION = 2  # of the state file: a state of another version is not resumed
COMMIT_SECONDS = 1.0  # record progress (after an fsync of the outputs) at most this often
PARTIAL = {"train": "train.bin.partial", "val": "val.bin.partial"}  # the outputs while the run is unfinished
OUR_FILES = {STATE_NAME, *PARTIAL.values()}
# common.atomic_path's temporary names for the state and meta.json, left behind only by a kill -9
TEMP_NAME = re.compile(r"\.(?:%s|%s)\.tmp\d+" % (re.escape(STATE_NAME), re.escape(META_NAME)))
COUNTERS = ("tokens", "documents", "bad_lines", "filtered", "empty")  # the counts a state records
SPLIT_WORDS = {"val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test", "train": "train"}
JSONL_SUFFIXES = (".jsonl.zst", ".jsonl.zstd", ".jsonl.gz", ".jsonl", ".json.zst", ".json.gz")
COMPRESSED_SUFFIXES = {".zst": "zstd", ".zstd": "zstd", ".gz": "gzip"}
TEXT_SUFFIXES = (".txt",)


@dataclass
class SourceFile:
    """One input file (or one split of a `datasets` dataset): the unit of work and of resumption."""

    url: str  # local path, fsspec URL (hf://, s3://, file://), or for kind "rows" the --dataset argument
    name: str  # shown to the user and recorded in meta.json (relative to the input root when possible)
    split: str  # "train" | "val" | "test"
    size: Optional[int]  # bytes, recorded so a resumed run notices a changed input (None: unknown)
    kind: str  # "jsonl" (one JSON object per line) | "text" (the whole file is one document) | "rows"
    stream: Any = None  # kind "rows": the split as a streaming datasets.IterableDataset


class BadInput(Exception):
    """Raised in a tokenizer process for input the user must fix; carries a one-line message."""


class OutputError(UserError):
    """Writing the output failed (a full disk, a read-only folder): names --out-dir and the cause, not the input."""


class Task(NamedTuple):
    """A piece of work for a tokenizer process (about CHUNK_BYTES of text)."""

    kind: str  # "jsonl": whole lines (bytes) | "rows": [(text, subset)] | "text": a piece of one document (str)
    payload: Any
    name: str  # the file (or split), for messages
    first_line: int  # the line (jsonl) or row (rows) number of the payload's first record, from 1
    split: str  # "train" | "val"
    doc_start: bool  # kind "text": this piece starts the document (records are always whole)
    doc_end: bool  # kind "text": this piece ends the document
    resume_at: Optional[tuple]  # (offset, line) to read on from once this task is written; None: not a boundary


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


def local_dataset_path(dataset: str) -> Optional[str]:
    """The local folder a --dataset names (a path or a file:// URL), or None for a Hub name or remote URL."""
    path = dataset[len("file://"):] if dataset.startswith("file://") else dataset
    if "://" in path or not os.path.exists(os.path.expanduser(path)):
        return None
    return os.path.abspath(os.path.expanduser(path))


def list_dataset_files(dataset: str, text_suffixes: Sequence[str]) -> list[SourceFile]:
    """The .jsonl*/.txt files of a HF Hub dataset (or any fsspec URL or local folder), read without `datasets`
    so nothing is cached; [] when it has none (then it is read through `datasets`)."""
    import fsspec

    local = local_dataset_path(dataset)
    url = f"file://{local}" if local else dataset if "://" in dataset else f"hf://datasets/{dataset}"
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
    return files


def list_dataset_splits(dataset: str, config: Optional[str], text_column: str, cache_dir: str,
                        shard_index: int, num_shards: int) -> tuple[list[SourceFile], int]:
    """The splits of any `datasets` dataset, streamed (no Arrow cache; `datasets` gets a temporary cache_dir
    for its lock files). --num-shards splits each split's rows between the jobs. Returns (splits, test
    splits skipped)."""
    try:
        import datasets
        from datasets.distributed import split_dataset_by_node
    except ImportError:
        raise UserError(f"--dataset {dataset} has no .jsonl/.txt files; reading it (e.g. Parquet) needs the "
                        "`datasets` package: pip install datasets") from None
    try:
        splits = datasets.load_dataset(local_dataset_path(dataset) or dataset, name=config, streaming=True,
                                       cache_dir=cache_dir)
    except FileNotFoundError as e:
        raise UserError(f"--dataset {dataset}: not found ({one_line(e)}); check the name or path") from None
    except ValueError as e:  # an unknown configuration, an unsupported layout
        raise UserError(f"--dataset {dataset}: {one_line(e)} (--dataset-config picks a configuration)") from None
    except Exception as e:  # the Hub client raises many types for network and auth failures
        raise UserError(f"--dataset {dataset}: cannot open it ({type(e).__name__}: {one_line(e)}); check the "
                        "network, or HF_TOKEN for a gated dataset") from None
    files, n_test = [], 0
    for name in sorted(splits):
        stream = splits[name]
        if split_of(name) == "test":
            n_test += 1
            continue
        columns = stream.column_names
        if columns is not None and text_column not in columns:
            raise UserError(f"--dataset {dataset}: split '{name}' has no column '{text_column}' (columns: "
                            f"{', '.join(columns)}); set --text-column")
        if num_shards > 1:
            stream = split_dataset_by_node(stream, rank=shard_index, world_size=num_shards)
        files.append(SourceFile(dataset, name, split_of(name), None, "rows", stream))
    if not files:
        raise UserError(f"--dataset {dataset}: no train or validation split (splits: {', '.join(sorted(splits))})")
    return files, n_test


def plan_files(files: list[SourceFile], shard_index: int, num_shards: int) -> tuple[list[SourceFile], int]:
    """Order the work: validation files first (so a --max-tokens slice still has them), then train.

    With --num-shards, file k of the sorted list goes to shard k % num_shards: the shards together hold every
    file exactly once (`datasets` splits are sharded by rows instead). Returns (files to read, test files
    skipped).
    """
    files = sorted(files, key=lambda f: f.name)
    files = [f for k, f in enumerate(files) if f.kind == "rows" or k % num_shards == shard_index]
    n_test = sum(f.split == "test" for f in files)
    kept = [f for f in files if f.split == "val"] + [f for f in files if f.split == "train"]
    for f in kept:
        fmt = next((v for k, v in COMPRESSED_SUFFIXES.items() if f.name.lower().endswith(k)), None)
        if fmt and f.size == 0:
            raise UserError(f"{f.name}: empty file (0 bytes), not {fmt} data: the download or copy was cut off; "
                            "download it again")
    return kept, n_test


# ----------------------------------------------------------------------------------------------------
# reading files as chunks of raw text (in the main process)


def open_binary(src: SourceFile):
    """A binary stream of the file's decompressed bytes (read(n) gives up to n bytes, b"" at the end)."""
    if "://" in src.url:
        import fsspec

        raw = fsspec.open(src.url, "rb").open()
    else:
        raw = open(src.url, "rb")
    lower = src.name.lower()
    if lower.endswith((".zst", ".zstd")):
        return ZstdReader(raw)
    if lower.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


class ZstdReader:
    """Decompress a stream of zstd frames; raise on an empty file or a truncated last frame (zstandard's own
    stream_reader just ends early there, which would silently drop the rest of a cut-off download).
    read(n) returns up to n bytes, b"" at the end, without the copies of an io.BufferedReader."""

    def __init__(self, raw):
        import zstandard

        self.raw, self.zstd = raw, zstandard
        self.obj, self.fed, self.buf, self.pos, self.empty = self._new(), False, b"", 0, True

    def _new(self):
        return self.zstd.ZstdDecompressor(max_window_size=2**31).decompressobj()

    def read(self, n: int) -> bytes:
        while self.pos == len(self.buf):
            data = self.raw.read(CHUNK_BYTES)
            if not data:
                if self.empty:
                    raise self.zstd.ZstdError("the file is empty (0 bytes)")
                if self.fed and not self.obj.eof:
                    raise self.zstd.ZstdError("the stream ends inside a zstd frame (truncated file)")
                return b""
            self.empty = False
            parts = []
            while data:
                parts.append(self.obj.decompress(data))
                self.fed = True
                if self.obj.eof:  # a frame ended: the next one starts in unused_data
                    data, self.obj, self.fed = self.obj.unused_data, self._new(), False
                else:
                    data = b""
            self.buf, self.pos = b"".join(parts), 0
        out = self.buf[self.pos:self.pos + n] if self.pos or n < len(self.buf) else self.buf
        self.pos += len(out)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()


def read_tasks(src: SourceFile, start: tuple, text_column: str, with_subsets: bool) -> Iterator[Task]:
    """Cut a file into tasks of about CHUNK_BYTES, from position `start` = (offset, line): JSONL in whole lines
    from a byte offset, `datasets` rows from a row, text (always from its start) at BPE-safe cuts."""
    if src.kind == "rows":
        yield from read_rows(src, start[0], text_column, with_subsets)
        return
    with open_binary(src) as f:
        if src.kind == "jsonl":
            offset, line = start
            skip_bytes(f, offset, src)
            carry = b""
            while True:
                block = f.read(CHUNK_BYTES)
                data = carry + block if carry else block
                cut = data.rfind(b"\n") + 1 if block else len(data)  # whole lines only, until the end
                if cut:
                    chunk = data[:cut]
                    lines = chunk.count(b"\n") + (not chunk.endswith(b"\n"))
                    offset += cut
                    yield Task("jsonl", chunk, src.name, line, src.split, True, True, (offset, line + lines))
                    line += lines
                carry = data[cut:]
                if not block:
                    return
        # One text file is one document. Its text goes out in pieces cut right after a newline that is
        # followed by a non-space character: GPT-2's pre-tokenizer never joins text across such a point,
        # so encoding the pieces one by one gives exactly the tokens of encoding the whole text.
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        pending, first = "", True
        while True:
            block = f.read(CHUNK_BYTES)
            try:
                pending += decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise BadInput(f"{src.name}: invalid UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
            if not block:
                yield Task("text", pending, src.name, 1, src.split, first, True, None)
                return
            cut = safe_cut(pending)
            if cut > 0:
                yield Task("text", pending[:cut], src.name, 1, src.split, first, False, None)
                pending, first = pending[cut:], False


def skip_bytes(f, n: int, src: SourceFile) -> None:
    """Read past the first n bytes (what a resumed run already tokenized)."""
    while n > 0:
        got = f.read(min(n, 8 * CHUNK_BYTES))
        if not got:
            raise UserError(f"{src.name} is shorter than when the interrupted run read it; it changed: pass "
                            "--overwrite to start over")
        n -= len(got)


def read_rows(src: SourceFile, start_row: int, text_column: str, with_subsets: bool) -> Iterator[Task]:
    """A `datasets` split as tasks of [(text, subset)], from row start_row (skipped rows are read, not tokenized)."""
    stream = src.stream.skip(start_row) if start_row else src.stream
    rows, size, first, row = [], 0, start_row + 1, start_row
    for batch in stream.iter(batch_size=ROWS_PER_READ):
        if text_column not in batch:
            raise UserError(f"{src.url} [{src.name}]: no column '{text_column}' (columns: {', '.join(batch)}); "
                            "set --text-column")
        texts = batch[text_column]
        metas = batch.get("meta") if with_subsets else None
        for k, text in enumerate(texts):
            rows.append((text, pile_set_name(metas[k]) if metas else None))
            size += len(text) if isinstance(text, str) else 0
            if size >= CHUNK_BYTES:
                row += len(rows)
                yield Task("rows", rows, src.name, first, src.split, True, True, (row, row + 1))
                rows, size, first = [], 0, row + 1
    if rows:
        row += len(rows)
        yield Task("rows", rows, src.name, first, src.split, True, True, (row, row + 1))


def pile_set_name(meta) -> Optional[str]:
    """The Pile's subset name in a record's "meta" field, or None."""
    return meta.get("pile_set_name") if isinstance(meta, dict) else None


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


def is_empty(text: str) -> bool:
    """The rule for documents that are skipped (and counted): no characters, or only whitespace."""
    return not text or text.isspace()


class TokenizerFailure(Exception):
    """The tokenizer itself failed on a document (a broken vocabulary): the caller adds where."""


def encode(text: str) -> np.ndarray:
    """`encode_ordinary(text)` as a uint32 array (tiktoken fills the array itself: no Python list of ints)."""
    enc = _W["enc"]
    try:
        try:
            return enc.encode_to_numpy(text, disallowed_special=())  # the same ids as encode_ordinary
        except UnicodeEncodeError:  # lone surrogates: encode_ordinary replaces them, as tiktoken always does
            return np.array(enc.encode_ordinary(text), dtype=np.uint32)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a tokenizer's Rust panic is a BaseException: one line, not a dead process
        raise TokenizerFailure(f"the tokenizer --encoding {_W['encoding']} failed on this document "
                               f"({type(e).__name__}: {one_line(e)}); the tokenizer is broken, use another "
                               "--encoding") from None


def tokenize_task(task: Task) -> dict:
    """Tokenize one task. Returns token arrays (the output dtype) for train and val, and the counts."""
    out = {split: buffer.clear() for split, buffer in _W["buffers"].items()}
    docs = {"train": 0, "val": 0}
    bad = filtered = empty = 0
    fraction = _W["val_fraction"] if task.split == "train" else 0.0
    at = ":" if task.kind == "jsonl" else " row "  # messages name bad.jsonl:4 or train row 4

    def emit(text: str, key: bytes, line: Optional[int], doc_end: bool = True) -> None:
        dest = "val" if task.split == "val" or (fraction and goes_to_val(key, fraction)) else "train"
        try:
            ids = encode(text)
        except TokenizerFailure as e:
            raise BadInput(f"{task.name}{'' if line is None else f'{at}{line}'}: {e}") from None
        out[dest].add(ids, doc_end)
        docs[dest] += doc_end

    if task.kind == "text":
        if task.doc_start and task.doc_end and is_empty(task.payload):
            empty += 1
        else:
            emit(task.payload, task.name.encode(), None, task.doc_end)
    else:
        column, include, exclude, skip_bad = _W["text_column"], _W["include"], _W["exclude"], _W["skip_bad_lines"]
        for k, (text, subset, problem) in enumerate(records(task, column, include or exclude)):
            if problem:
                if skip_bad:
                    bad += 1
                    continue
                raise BadInput(f"{task.name}{at}{task.first_line + k}: {problem}; fix it or pass --skip-bad-lines "
                               "to skip such records")
            if text is None:  # a blank line
                continue
            if (include and subset not in include) or (exclude and subset in exclude):
                filtered += 1
            elif is_empty(text):
                empty += 1
            else:
                emit(text, text.encode("utf-8", "surrogatepass") if fraction else b"", task.first_line + k)
    return {"train": to_output(out["train"].ids(), task), "val": to_output(out["val"].ids(), task),
            "docs": docs, "bad": bad, "filtered": filtered, "empty": empty}


def records(task: Task, column: str, with_subsets: bool) -> Iterator[tuple]:
    """(text, subset, problem) per line or row of a task; text None for a blank line, problem None if fine."""
    if task.kind == "rows":
        for text, subset in task.payload:
            ok = type(text) is str
            yield (text if ok else "", subset, None if ok else f"no string in column '{column}' (set --text-column)")
        return
    for line in task.payload.split(b"\n"):
        if not line or line.isspace():
            yield None, None, None
            continue
        rec, problem = parse_json(line)
        if problem is None and (type(rec) is not dict or type(rec.get(column)) is not str):
            problem = f"no string field '{column}' (set --text-column)"
        if problem:
            yield "", None, problem
        else:
            yield rec[column], pile_set_name(rec.get("meta")) if with_subsets else None, None


def parse_json(line: bytes) -> tuple:
    """(record, None) or (None, problem), as json.loads(line) decides. orjson reads nearly every line (the
    bench: 0.35 s per 100 MB against 0.54 s for decoding the chunk and json's own C scanner); what it refuses
    (NaN, lone surrogates, a BOM, out-of-range numbers, and invalid JSON) goes to json.loads, whose decision
    and message count. Where both accept a line, every string in the record is the same (the text and the
    meta fields read here); only integers beyond 64 bits come back from orjson as floats."""
    try:
        return orjson.loads(line), None
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(line), None
    except UnicodeDecodeError:
        return None, "invalid UTF-8"
    except ValueError as e:
        return None, f"malformed JSON ({e.msg})"


class TokenBuffer:
    """A task's token ids of one split, appended document by document into one uint32 array that the tokenizer
    process reuses from task to task (warm memory, and no array per document to concatenate)."""

    def __init__(self):
        self.buf, self.n = np.empty(1 << 18, np.uint32), 0

    def clear(self) -> "TokenBuffer":
        self.n = 0
        return self

    def add(self, ids: np.ndarray, doc_end: bool) -> None:
        n, buf = self.n, self.buf
        end = n + len(ids)
        if end >= len(buf):  # room for the ids and an EOT
            buf = self.buf = np.concatenate([buf[:n], np.empty(max(end + 1, 2 * len(buf)) - n, np.uint32)])
        buf[n:end] = ids
        if doc_end:
            buf[end] = _W["eot"]
            end += 1
        self.n = end

    def ids(self) -> np.ndarray:
        return self.buf[:self.n]


def to_output(ids: np.ndarray, task: Task) -> np.ndarray:
    """A copy in the output dtype; an error (never a silent wrap-around) for an id outside the vocabulary."""
    top = int(ids.max()) if len(ids) else 0
    if top >= _W["n_vocab"]:
        raise BadInput(f"{task.name}: the tokenizer --encoding {_W['encoding']} returned token id {top}, outside "
                       f"its vocabulary [0, {_W['n_vocab']}); the tokenizer is broken, use another --encoding")
    return ids.astype(_W["dtype"])  # a copy: the buffer is reused by the next task


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


# ----------------------------------------------------------------------------------------------------
# the output folder: fresh, resumed, or refused


def state_fingerprint(args, files: list[SourceFile], settings: dict) -> dict:
    """Everything that decides the output bytes (file sizes apart, see size_change); a resumed run must
    match it."""
    return {
        "state": STATE_VERSION,
        "version": META_VERSION,
        "files": [[f.name, f.split, f.kind] + ([f.url] if f.kind == "rows" else []) for f in files],
        "settings": {k: v for k, v in settings.items() if not k.startswith("_")},
        "max_tokens": args.max_tokens,
    }


def fingerprint_change(saved: dict, fingerprint: dict) -> Optional[str]:
    """What differs between a saved run's fingerprint and this one, or None when this run may resume it."""
    saved = copy.deepcopy(saved)
    if fingerprint["settings"].get("skip_bad_lines") and isinstance(saved.get("settings"), dict) \
            and saved["settings"].get("skip_bad_lines") is False:
        saved["settings"]["skip_bad_lines"] = True  # a run that never skipped a line read every line the same
    if saved == fingerprint:
        return None
    if saved.get("state") != fingerprint["state"] or saved.get("version") != fingerprint["version"]:
        return "from another version of prepare_data"
    if saved.get("files") != fingerprint["files"]:
        return "with other input files"
    if saved.get("max_tokens") != fingerprint["max_tokens"]:
        return f"with --max-tokens {saved.get('max_tokens')}"
    return "with other settings"


def size_change(state: dict, files: list[SourceFile]) -> Optional[str]:
    """A file the saved run read completely that changed size since (its tokens would be stale), or None."""
    for f, old in zip(files[:state["files_done"]], state["sizes"]):
        if f.size != old:
            return f"{f.name} changed since it was read ({old} -> {f.size} bytes)"
    return None


def resume_progress(state: dict, files: list[SourceFile]) -> dict:
    """The saved progress; a file changed since it was partly read is read again from its start."""
    progress = {k: v for k, v in state.items() if k not in ("fingerprint", "sizes")}
    i = progress["files_done"]
    if i < len(files) and progress["position"][0] and files[i].size != state["sizes"][i]:
        print(f"note: {files[i].name} changed since the interrupted run read part of it; reading it again from "
              "its start", file=sys.stderr)
        progress.update(copy.deepcopy(progress["file_start"]), position=[0, 1])
    return progress


def fresh_progress() -> dict:
    zero = {"tokens": {"train": 0, "val": 0}, "documents": {"train": 0, "val": 0}, "bad_lines": 0, "filtered": 0,
            "empty": 0}
    return {"files_done": 0, "position": [0, 1], **copy.deepcopy(zero), "file_start": zero}


def read_state(out_dir: Path, overwrite: bool) -> Optional[dict]:
    """The saved state of an unfinished run, or None; a damaged one is an error (ignored with --overwrite)."""
    path = out_dir / STATE_NAME
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or not isinstance(state.get("fingerprint"), dict):
            raise ValueError("not a state record")
        return state
    except (ValueError, OSError) as e:
        if overwrite:
            return None
        raise UserError(f"--out-dir {out_dir}: cannot read {STATE_NAME} ({one_line(e)}); pass --overwrite to "
                        "start over") from None


def check_out_dir(out_dir: Path, fingerprint: dict, files: list[SourceFile], overwrite: bool) -> Optional[dict]:
    """Return the saved state to resume, or None for a fresh run. Refuse a folder that holds other data.

    The saved state is checked first: it is this command's own, whatever else the folder holds (an
    interrupted --overwrite run sits beside the dataset it replaces, an interrupted publish beside half the
    renamed files).
    """
    if not out_dir.exists():
        for parent in out_dir.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise UserError(f"--out-dir {out_dir}: {parent} is a file, not a folder; choose another --out-dir")
                break
        return None
    if not out_dir.is_dir():
        raise UserError(f"--out-dir {out_dir} is a file; choose a folder")
    try:
        entries = {p.name for p in out_dir.iterdir()}
    except OSError as e:
        raise UserError(f"--out-dir {out_dir}: cannot list it ({e.strerror}); choose another --out-dir") from None
    others = {n for n in entries - OUR_FILES if not TEMP_NAME.fullmatch(n)}
    state = read_state(out_dir, overwrite)
    if state is not None:
        change = fingerprint_change(state["fingerprint"], fingerprint) or size_change(state, files)
        if change is None:
            if state.get("publish") or not others or overwrite:
                return state
            raise UserError(f"--out-dir {out_dir} holds a finished dataset and an unfinished --overwrite run of "
                            "this command; pass --overwrite to resume it")
        if not overwrite:
            raise UserError(f"--out-dir {out_dir} holds an unfinished run {change}; re-run that command to resume "
                            "it, or pass --overwrite to start over")
        return None
    if others and not overwrite:
        what = "a finished dataset" if META_NAME in others else "other files"
        raise UserError(f"--out-dir {out_dir} already holds {what}; pass --overwrite to replace it "
                        "or choose another folder")
    return None


OUTPUT_FIXES = {
    errno.ENOSPC: "free space on that disk",
    errno.EDQUOT: "free space within your disk quota",
    errno.EFBIG: "raise the file size limit (ulimit -f) or use a filesystem that allows larger files",
    errno.EROFS: "choose an --out-dir on a writable filesystem",
    errno.EACCES: "choose an --out-dir you can write to",
    errno.EPERM: "choose an --out-dir you can write to",
}


@contextmanager
def output_errors(out_dir: Path, doing: str):
    """Turn a filesystem error while writing the output into a one-line OutputError naming the real cause."""
    try:
        yield
    except OSError as e:
        code = errno.errorcode.get(e.errno, "")
        fix = OUTPUT_FIXES.get(e.errno, "check that folder")
        raise OutputError(f"--out-dir {out_dir}: {e.strerror or one_line(e)}{f' ({code})' if code else ''} while "
                          f"{doing}; {fix}") from None


class Writer:
    """Appends tokens to train.bin.partial / val.bin.partial and records progress that a re-run resumes.

    Three copies of the progress: `pending` (all tokens written so far), `done` (at the last document
    boundary that a resumed run can read on from: the end of a task of whole records, or of a file) and
    `committed` (on disk). A commit makes the files durable first and only then records `done`, so the state
    never claims more than the files hold; a resumed run truncates the files to the committed counts.
    """

    def __init__(self, out_dir: Path, fingerprint: dict, sizes: list, progress: dict, dtype: np.dtype):
        self.out_dir, self.fingerprint, self.sizes, self.dtype = out_dir, fingerprint, sizes, dtype
        self.done, self.fds = progress, {}
        try:
            with output_errors(out_dir, "opening the .partial files"):
                for split, name in PARTIAL.items():
                    self.fds[split] = os.open(out_dir / name, os.O_RDWR | os.O_CREAT, 0o644)
                    if os.fstat(self.fds[split]).st_size < progress["tokens"][split] * dtype.itemsize:
                        raise UserError(f"--out-dir {out_dir}: {name} is shorter than {STATE_NAME} records (the "
                                        "files were changed by hand?); pass --overwrite to start over")
                self.rollback()
            self.commit()  # a state from the start: a run killed in its first file is recognized and resumed
        except BaseException:
            self.close()
            raise

    def write(self, result: dict, max_train: Optional[int]) -> bool:
        """Append one task's tokens; return True when --max-tokens is reached."""
        p = self.pending
        reached = False
        for split in ("train", "val"):
            arr = result[split]
            if split == "train" and max_train is not None and p["tokens"]["train"] + len(arr) >= max_train:
                arr = arr[: max_train - p["tokens"]["train"]]
                reached = True
            with output_errors(self.out_dir, f"writing {PARTIAL[split]}"):
                view = memoryview(arr).cast("B")
                while view:  # os.write may write less than asked (a disk filling up)
                    view = view[os.write(self.fds[split], view):]
            p["tokens"][split] += len(arr)
            p["documents"][split] += result["docs"][split]
        for key in ("bad", "filtered", "empty"):
            p["bad_lines" if key == "bad" else key] += result[key]
        return reached

    def mark(self, resume_at: tuple) -> None:
        """Everything up to resume_at = (offset, line) of the current file is written."""
        self.pending["position"] = list(resume_at)
        self.done = copy.deepcopy(self.pending)
        self.commit_if_due()

    def file_done(self) -> None:
        p = self.pending
        p["files_done"] += 1
        p["position"] = [0, 1]
        p["file_start"] = {k: copy.deepcopy(p[k]) for k in COUNTERS}
        self.done = copy.deepcopy(p)
        self.commit_if_due()

    def commit_if_due(self) -> None:
        if time.monotonic() - self.last_commit >= COMMIT_SECONDS:
            self.commit()

    def commit(self) -> None:
        with output_errors(self.out_dir, "writing train.bin.partial / val.bin.partial"):
            for fd in self.fds.values():
                os.fsync(fd)
        state = {"fingerprint": self.fingerprint, "sizes": self.sizes, **self.done}
        with output_errors(self.out_dir, f"writing {STATE_NAME}"):
            atomic_write_text(self.out_dir / STATE_NAME, json.dumps(state))
        self.committed = copy.deepcopy(self.done)
        self.last_commit = time.monotonic()

    def save_progress(self) -> None:
        """After an error: record `done` if it is ahead of the last commit (the disk may refuse: then the last
        commit stands, which is consistent too)."""
        if self.done != self.committed:
            try:
                self.commit()
            except OutputError:
                pass

    def rollback(self) -> None:
        """Back to `done` (at start, or when reading a file failed midway through a text document)."""
        self.pending = copy.deepcopy(self.done)
        for split, fd in self.fds.items():
            os.ftruncate(fd, self.done["tokens"][split] * self.dtype.itemsize)
            os.lseek(fd, 0, os.SEEK_END)

    def finish(self, meta: Meta) -> dict:
        """Record the finished run (its meta.json included) so that publish can complete even after a kill."""
        self.done = copy.deepcopy(self.pending)
        self.done["publish"] = meta.to_json()
        self.commit()
        self.close()
        return self.done

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = {}


def publish(out_dir: Path, state: dict) -> None:
    """The .partial files become train.bin / val.bin, then meta.json (the mark of a finished set). Each step can
    be repeated, so a run killed halfway through completes when run again."""
    with output_errors(out_dir, "publishing the finished dataset"):
        (out_dir / META_NAME).unlink(missing_ok=True)  # an old finished set (with --overwrite) is no longer one
        for split, name in PARTIAL.items():
            if state["tokens"][split]:
                if (out_dir / name).exists():
                    os.replace(out_dir / name, out_dir / f"{split}.bin")
            else:
                (out_dir / name).unlink(missing_ok=True)
                (out_dir / f"{split}.bin").unlink(missing_ok=True)
        atomic_write_text(out_dir / META_NAME, state["publish"])
        (out_dir / STATE_NAME).unlink()


def discard(out_dir: Path, created: bool) -> None:
    """Remove this run's own unfinished files (and the folder if this run made it)."""
    try:
        for p in out_dir.iterdir():
            if p.name in OUR_FILES or TEMP_NAME.fullmatch(p.name):
                p.unlink(missing_ok=True)
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
    except OSError:
        pass


# ----------------------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring (python -c 'import prepare_data; "
                                       "help(prepare_data)') for examples.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dataset", default=None,
                     help=f"HF Hub dataset name, fsspec URL or local folder (default {DEFAULT_DATASET} when no "
                          "--input)")
    src.add_argument("--input", nargs="+", metavar="PATH_OR_GLOB", help="local files, globs or folders")
    p.add_argument("--dataset-config", default=None, metavar="NAME",
                   help="the configuration of a --dataset read through `datasets` (e.g. sample-10BT for FineWeb)")
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help=f"output folder (default {DEFAULT_OUT_DIR})")
    p.add_argument("--num-proc", type=int, default=os.cpu_count() or 1, help="tokenizer processes (default: all cores)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help=f"fraction of documents for validation when the input has no validation files "
                        f"(default {DEFAULT_VAL_FRACTION}; 0 = no validation split)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many train tokens")
    p.add_argument("--text-column", default="text",
                   help="JSON field or dataset column that holds the text (default: text)")
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
                                                              "round-robin by sorted name; the rows of a "
                                                              "`datasets` split are divided)")
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
    if args.dataset_config and args.input:
        raise UserError("--dataset-config goes with --dataset, not --input")
    return args


def is_remote(src: SourceFile) -> bool:
    """Whether reading src goes over the network (then a failure is worth retrying)."""
    if src.kind == "rows":
        return local_dataset_path(src.url) is None
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
        self.queue: deque = deque()  # (file index, task's resume_at, AsyncResult | result | None at a file's end)

    def submit(self, file_index: int, task: Optional[Task]) -> None:
        if task is None:
            self.queue.append((file_index, None, None))
        elif self.pool is None:
            self.queue.append((file_index, task.resume_at, tokenize_task(task)))
        else:
            self.queue.append((file_index, task.resume_at, self.pool.apply_async(tokenize_task, (task,))))

    def full(self) -> bool:
        return len(self.queue) >= self.max_in_flight

    def pop(self):
        """The oldest entry: (file index, resume_at, result or None at a file's end). Raises the task's error."""
        file_index, resume_at, item = self.queue.popleft()
        if item is not None and not isinstance(item, dict):
            item = item.get()
        return file_index, resume_at, item

    def close(self, terminate: bool = False) -> None:
        if self.pool is not None:
            if terminate:
                self.pool.terminate()
            else:
                self.pool.close()
            self.pool.join()
            self.pool = None


def init_worker(settings: dict, ignore_sigint: bool = True) -> None:
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    _W.clear()
    _W.update(settings)
    _W["enc"] = get_encoding(settings["encoding"])
    _W["dtype"] = np.dtype(settings["dtype"])
    _W["buffers"] = {"train": TokenBuffer(), "val": TokenBuffer()}


def tokenize(files: list[SourceFile], writer: Writer, pipeline: Pipeline, max_tokens: Optional[int],
             progress, settings: dict) -> bool:
    """Tokenize from writer.done's position to the end, in order. Returns True if stopped at --max-tokens."""

    def handle(file_index: int, resume_at: Optional[tuple], result: Optional[dict]) -> bool:
        if result is None:
            writer.file_done()
            progress.set_postfix_str(f"files {writer.done['files_done']}/{len(files)} "
                                     f"docs {sum(writer.pending['documents'].values()):,}", refresh=False)
            return False
        reached = writer.write(result, max_tokens)
        progress.update(len(result["train"]) + len(result["val"]))
        if resume_at is not None and not reached:
            writer.mark(resume_at)
        return reached

    with_subsets = bool(settings["include"] or settings["exclude"])
    for i in range(writer.done["files_done"], len(files)):
        src = files[i]
        for attempt in range(1, 4):
            start = tuple(writer.done["position"]) if writer.done["files_done"] == i else (0, 1)
            try:
                for task in read_tasks(src, start, settings["text_column"], with_subsets):
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
                    raise UserError(f"{src.name}: reading failed 3 times ({type(e).__name__}: {one_line(e)}); "
                                    "check the connection and run the same command again to resume") from None
                # A dropped connection: keep every task already read, forget a text document's first pieces,
                # and read on from the last boundary.
                while pipeline.queue:
                    if handle(*pipeline.pop()):
                        return True
                writer.rollback()
                print(f"\n{src.name}: {type(e).__name__}: {one_line(e)}; reading on (attempt {attempt + 1}/3)",
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
        return UserError(f"{src.name}: truncated or corrupt zstd data ({one_line(e)}); download the file again")
    if isinstance(e, (EOFError, gzip.BadGzipFile)):
        return UserError(f"{src.name}: truncated or corrupt gzip data ({one_line(e)}); download the file again")
    if isinstance(e, FileNotFoundError) and not is_remote(src):
        return UserError(f"{src.name}: file disappeared while reading ({one_line(e)}); check the input")
    if not is_remote(src):
        return UserError(f"{src.name}: cannot read ({type(e).__name__}: {one_line(e)}); check the file")
    return None


def load_encoding(name: str):
    try:
        return get_encoding(name)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a broken vocabulary can panic in tiktoken's Rust code (a BaseException)
        raise UserError(f"--encoding {name}: cannot load the tiktoken vocabulary ({type(e).__name__}: "
                        f"{one_line(e)}); gpt2 ships with this repo, other encodings are downloaded once by "
                        f"tiktoken (check the network or set TIKTOKEN_CACHE_DIR)") from None


def report(out_dir: Path, meta: dict, seconds: float, new_tokens: int) -> None:
    splits = meta["splits"]
    val = splits.get("val", {"tokens": 0, "documents": 0})
    print(f"prepare_data: {splits['train']['tokens']:,} train tokens ({splits['train']['documents']:,} docs), "
          f"{val['tokens']:,} val tokens ({val['documents']:,} docs) from {len(meta['sources']['files'])} files "
          f"-> {out_dir} in {seconds:.1f}s ({new_tokens / max(seconds, 1e-9):,.0f} tok/s)"
          + (f"; skipped {meta['skipped_bad_lines']} bad lines" if meta["skipped_bad_lines"] else "")
          + (f"; filtered {meta['filtered_documents']} docs" if meta["filtered_documents"] else "")
          + (f"; skipped {meta['empty_documents']} empty docs" if meta["empty_documents"] else ""))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    with ExitStack() as cleanup:
        return prepare(args, cleanup)


def prepare(args: argparse.Namespace, cleanup: ExitStack) -> int:
    from tqdm import tqdm

    t0 = time.time()
    enc = load_encoding(args.encoding)
    dtype = np.dtype(np.uint16 if enc.n_vocab <= 2**16 else np.uint32)  # uint16 holds ids 0..65535
    text_suffixes = TEXT_SUFFIXES + tuple(s if s.startswith(".") else "." + s for s in args.text_suffix)

    n_test = 0
    if args.input:
        files = list_local_inputs(args.input, text_suffixes)
        sources = {"input": args.input}
    else:
        dataset = args.dataset or DEFAULT_DATASET
        sources = {"dataset": dataset, **({"config": args.dataset_config} if args.dataset_config else {})}
        files = [] if args.dataset_config else list_dataset_files(dataset, text_suffixes)
        if not files:  # not the Pile's layout: any dataset `datasets` can stream (Parquet, ...)
            cache_dir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="prepare_data_hf_"))
            files, n_test = list_dataset_splits(dataset, args.dataset_config, args.text_column, cache_dir,
                                                args.shard_index, args.num_shards)
    files, n_test_files = plan_files(files, args.shard_index, args.num_shards)
    n_test += n_test_files
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
        "encoding": args.encoding, "eot": enc.eot_token, "n_vocab": enc.n_vocab, "dtype": dtype.name,
        "val_fraction": val_fraction, "text_column": args.text_column, "include": sorted(set(args.include_subset)),
        "exclude": sorted(set(args.exclude_subset)), "skip_bad_lines": args.skip_bad_lines,
        "dataset_config": args.dataset_config,
    }
    fingerprint = state_fingerprint(args, files, settings)
    sizes = [f.size for f in files]
    out_dir = Path(args.out_dir)
    state = check_out_dir(out_dir, fingerprint, files, args.overwrite)
    if state is not None and state.get("publish"):  # killed while publishing: finish that
        publish(out_dir, state)
        report(out_dir, json.loads(state["publish"]), time.time() - t0, 0)
        return 0

    created = not out_dir.exists()
    try:
        with output_errors(out_dir, "creating the folder"):
            out_dir.mkdir(parents=True, exist_ok=True)
            # A fresh run first removes an old unfinished run's files (its state first: a kill in between leaves
            # files that are plainly this run's own), and any temporary file a kill -9 left behind.
            stale = [STATE_NAME, *PARTIAL.values()] if state is None else []
            for name in stale + [n for n in os.listdir(out_dir) if TEMP_NAME.fullmatch(n)]:
                (out_dir / name).unlink(missing_ok=True)
        writer = Writer(out_dir, fingerprint, sizes, resume_progress(state, files) if state else fresh_progress(),
                        dtype)
    except UserError:
        if state is None:
            discard(out_dir, created)
        raise
    resumed = copy.deepcopy(writer.done)
    if state:
        i, (offset, line) = resumed["files_done"], resumed["position"]
        where = f", {files[i].name} from {'row' if files[i].kind == 'rows' else 'line'} {line}" if offset else ""
        print(f"resuming: {i} of {len(files)} files already done{where} "
              f"({resumed['tokens']['train']:,} train tokens)", file=sys.stderr)
    progress = tqdm(total=args.max_tokens, initial=sum(resumed["tokens"].values()), unit="tok",
                    unit_scale=True, desc="tokenizing", dynamic_ncols=True, file=sys.stderr,
                    mininterval=0.5 if sys.stderr.isatty() else 30)  # a log file gets a line per 30 s
    pipeline = Pipeline(min(args.num_proc, 64), settings)
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)  # preemption: stop as cleanly as Ctrl-C
    try:
        reached = tokenize(files, writer, pipeline, args.max_tokens, progress, settings)
    except BaseException as e:
        pipeline.close(terminate=True)
        progress.close()
        writer.save_progress()  # keep every finished document for the next run
        writer.close()
        kept = writer.committed["files_done"] or writer.committed["position"][0]
        if not kept:
            discard(out_dir, created)  # nothing worth resuming: leave the folder as it was
        where = (f"{writer.committed['files_done']} of {len(files)} files done; run the same command again to "
                 "resume" if kept else "nothing written")
        if isinstance(e, BadInput):
            raise UserError(f"{e} ({where})") from None
        if isinstance(e, UserError):
            raise type(e)(f"{e} ({where})") from None
        if isinstance(e, KeyboardInterrupt):
            print(f"interrupted: {writer.committed['files_done']} of {len(files)} files done; run the same "
                  "command again to resume", file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    pipeline.close(terminate=reached)
    progress.close()

    totals = writer.pending
    if totals["tokens"]["train"] == 0:
        writer.close()
        discard(out_dir, created)
        what = ", ".join(sources.get("input") or [sources["dataset"]])
        raise UserError(f"empty corpus: no text in {what} (documents empty or whitespace-only: {totals['empty']}, "
                        f"filtered out: {totals['filtered']}, bad lines: {totals['bad_lines']}); check the input, "
                        "--text-column and the subset filters")
    splits = {s: {"file": f"{s}.bin", "tokens": totals["tokens"][s], "documents": totals["documents"][s]}
              for s in ("train", "val") if totals["tokens"][s]}
    meta = Meta(tokenizer=args.encoding, vocab_size=enc.n_vocab, eot_token=enc.eot_token, dtype=dtype.name,
                splits=splits, info={
        "sources": {**sources, "files": [f.name for f in files[: totals["files_done"] + (1 if reached else 0)]],
                    "test_files_skipped": n_test},
        "val_split": "the dataset's validation files" if has_own_val else
                     (f"hash of each document, fraction {val_fraction}" if val_fraction else "none"),
        "text_column": args.text_column, "include_subsets": settings["include"],
        "exclude_subsets": settings["exclude"], "max_tokens": args.max_tokens, "stopped_at_max_tokens": reached,
        "shard": {"index": args.shard_index, "count": args.num_shards},
        "skipped_bad_lines": totals["bad_lines"], "filtered_documents": totals["filtered"],
        "empty_documents": totals["empty"],
    })
    try:
        publish(out_dir, writer.finish(meta))
    except OutputError as e:
        raise OutputError(f"{e} (every file is tokenized; run the same command again to finish)") from None
    if val_fraction and not totals["tokens"]["val"]:
        print(f"note: --val-fraction {val_fraction} picked none of the {totals['documents']['train']:,} documents "
              "(a .txt file is one document), so there is no val.bin; use more documents or a larger fraction",
              file=sys.stderr)
    report(out_dir, json.loads(meta.to_json()), time.time() - t0,
           sum(totals["tokens"].values()) - sum(resumed["tokens"].values()))
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    run_main(main)
