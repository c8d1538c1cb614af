"""prepare_data's tokenizer processes: a sources.Task of raw text in, token arrays for train and val out, in the
order the tasks went in. Each process parses the records, applies the subset filters, skips empty documents,
picks each document's split (a hash of its text) and encodes it as `encode_ordinary(text) + [EOT]`.
Details: docs/prepare.md."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import signal
from collections import deque
from typing import Iterator, Optional

import numpy as np
import orjson

from pilegpt.common import UserError, one_line
from pilegpt.prepare.sources import DEFAULT_SUBSET_FIELD, BadInput, Task, subset_of, subset_path
from pilegpt.tokenizer import get_encoding

_W: dict = {}  # per-process settings and the tokenizer, set by init_worker


def load_encoding(name: str):
    """get_encoding(name) in the main process; a one-line UserError if the vocabulary cannot be loaded."""
    try:
        return get_encoding(name)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a broken vocabulary can panic in tiktoken's Rust code (a BaseException)
        raise UserError(f"--encoding {name}: cannot load the tiktoken vocabulary ({type(e).__name__}: "
                        f"{one_line(e)}); gpt2 ships with this repo, other encodings are downloaded once by "
                        f"tiktoken (check the network or set TIKTOKEN_CACHE_DIR)") from None


class Pipeline:
    """Tasks go to `num_proc` tokenizer processes and come back in order, at most 2 per process in flight
    (so memory stays bounded however large the input is); with num_proc == 1 everything runs in-process.
    The order of the output never depends on the number of processes."""

    def __init__(self, num_proc: int, settings: dict):
        self.pool = None
        if num_proc > 1:
            # spawn: so everything a process runs is a module-level function here, and every payload plain data
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


# ----------------------------------------------------------------------------------------------------
# in the tokenizer processes


def init_worker(settings: dict, ignore_sigint: bool = True) -> None:
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    _W.clear()
    _W.update(settings)
    _W["enc"] = get_encoding(settings["encoding"])
    _W["dtype"] = np.dtype(settings["dtype"])
    _W["buffers"] = {}  # subset (None unless --by-subset) -> {"train", "val"} TokenBuffers
    _W["by_subset"] = settings.get("by_subset", False)
    _W["subset_field"] = settings.get("subset_field", DEFAULT_SUBSET_FIELD)
    needs_subset = _W["by_subset"] or settings["include"] or settings["exclude"]
    _W["subset_path"] = subset_path(_W["subset_field"]) if needs_subset else None


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
    """Tokenize one task. Returns token arrays (the output dtype) for train and val, and the counts; with
    --by-subset, "parts": {subset: {"train", "val", "docs"}} of the subsets in the task instead (train and val
    empty)."""
    parts: dict = {}  # subset (None unless --by-subset) -> its buffers and document counts in this task
    counts = {"bad": 0, "filtered": 0, "empty": 0}
    subsets_filtered: dict[str, int] = {}  # the subsets of the documents the filters left out
    fraction = _W["val_fraction"] if task.split == "train" else 0.0
    at = ":" if task.kind == "jsonl" else " row "  # messages name bad.jsonl:4 or train row 4

    def emit(text: str, key: bytes, line: Optional[int], subset: Optional[str] = None, doc_end: bool = True) -> None:
        dest = "val" if task.split == "val" or (fraction and goes_to_val(key, fraction)) else "train"
        try:
            ids = encode(text)
        except TokenizerFailure as e:
            raise BadInput(f"{task.name}{'' if line is None else f'{at}{line}'}: {e}") from None
        part = parts.get(subset) or open_part(parts, subset)
        part[dest].add(ids, doc_end)
        part["docs"][dest] += doc_end

    if task.kind == "text":
        if task.doc_start and task.doc_end and is_empty(task.payload):
            counts["empty"] += 1
        else:
            emit(task.payload, task.name.encode(), None, None, task.doc_end)
    else:
        for k, (text, subset, problem) in enumerate(records(task, _W["text_column"], _W["subset_path"])):
            kind = document_kind(text, subset, problem, task, at, k)
            if kind == "filtered":
                subsets_filtered[str(subset)] = subsets_filtered.get(str(subset), 0) + 1
            if kind in counts:
                counts[kind] += 1
            elif kind == "keep":
                emit(text, text.encode("utf-8", "surrogatepass") if fraction else b"", task.first_line + k,
                     subset if _W["by_subset"] else None)
    return {**task_output(parts, task), **counts, "subsets_filtered": subsets_filtered}


def document_kind(text: Optional[str], subset: Optional[str], problem: Optional[str], task: Task, at: str,
                  k: int) -> str:
    """What becomes of one record: "keep", "blank" (a blank line), "bad" (skipped with --skip-bad-lines),
    "filtered" or "empty"; a BadInput naming the file and line for a bad record otherwise."""
    if problem is None and text is not None and subset is None and _W["by_subset"]:
        problem = f"no string field '{_W['subset_field']}' to sort it by for --by-subset (set --subset-field)"
    if problem:
        if _W["skip_bad_lines"]:
            return "bad"
        raise BadInput(f"{task.name}{at}{task.first_line + k}: {problem}; fix it or pass --skip-bad-lines "
                       "to skip such records")
    if text is None:
        return "blank"
    include, exclude = _W["include"], _W["exclude"]
    if (include and subset not in include) or (exclude and subset in exclude):
        return "filtered"
    return "empty" if is_empty(text) else "keep"


def open_part(parts: dict, subset: Optional[str]) -> dict:
    """A subset's buffers for this task: the process's own for that subset, reused from task to task, cleared."""
    buffers = _W["buffers"].get(subset)
    if buffers is None:
        buffers = _W["buffers"][subset] = {"train": TokenBuffer(), "val": TokenBuffer()}
    part = parts[subset] = {split: buffer.clear() for split, buffer in buffers.items()}
    part["docs"] = {"train": 0, "val": 0}
    return part


def task_output(parts: dict, task: Task) -> dict:
    """The arrays and document counts of a task: {"train", "val", "docs"}, and "parts" per subset (--by-subset)."""
    arrays = {subset: {"train": to_output(part["train"].ids(), task), "val": to_output(part["val"].ids(), task),
                       "docs": part["docs"]} for subset, part in parts.items()}
    if _W["by_subset"]:
        empty = np.empty(0, _W["dtype"])
        return {"train": empty, "val": empty, "docs": {"train": 0, "val": 0}, "parts": arrays}
    return arrays.get(None) or {"train": np.empty(0, _W["dtype"]), "val": np.empty(0, _W["dtype"]),
                                "docs": {"train": 0, "val": 0}}


def records(task: Task, column: str, subsets: Optional[tuple]) -> Iterator[tuple]:
    """(text, subset, problem) per line or row of a task; text None for a blank line, problem None if fine;
    subset None unless `subsets` (the subset field's path) is given."""
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
            yield rec[column], subset_of(rec, subsets) if subsets else None, None


def parse_json(line: bytes) -> tuple:
    """(record, None) or (None, problem), as json.loads(line) decides. orjson, the faster parser, reads nearly
    every line; what it refuses (NaN, lone surrogates, a BOM, out-of-range numbers, and invalid JSON) goes to
    json.loads, whose decision and message count. Where both accept a line, every string in the record is the
    same (the text and the meta fields read here); only integers beyond 64 bits come back from orjson as
    floats."""
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
