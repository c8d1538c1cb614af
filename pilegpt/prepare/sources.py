"""prepare_data's inputs: finding the files (local paths and globs, a Hub dataset's or fsspec URL's .jsonl*/.txt
files, or the splits `datasets` streams), each with its split by name and dealt out to --num-shards jobs, and
reading them as Tasks of about CHUNK_BYTES of whole records (a text file at BPE-safe cuts), each carrying the
position a resumed run reads on from. fsspec, zstandard and datasets are imported only where needed.
Details: docs/prepare.md."""

from __future__ import annotations

import codecs
import glob
import gzip
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional, Sequence

from pilegpt import storage
from pilegpt.common import UserError, one_line
from pilegpt.zstd_reader import ZstdReader

DEFAULT_DATASET = "monology/pile-uncopyrighted"  # the maintained Pile mirror: train/NN.jsonl.zst, val, test
DEFAULT_SUBSET_FIELD = "meta.pile_set_name"  # where a Pile record names its component
CHUNK_BYTES = 1 << 20  # raw text per task sent to a tokenizer process
ROWS_PER_READ = 1000  # rows per batch read from a `datasets` stream
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


class BadInput(Exception):
    """Input the user must fix, found while reading a file or in a tokenizer process; carries a one-line message."""


def subset_path(field: str) -> tuple[str, ...]:
    """--subset-field as the keys to follow: "meta.pile_set_name" -> ("meta", "pile_set_name")."""
    path = tuple(field.split("."))
    if not all(path):
        raise UserError(f"--subset-field {field!r}: write a field name or a dotted path, e.g. {DEFAULT_SUBSET_FIELD}")
    return path


def subset_of(record, path: tuple[str, ...]) -> Optional[str]:
    """The subset name at `path` in a record (the Pile's meta.pile_set_name by default), or None if not a string."""
    for key in path:
        if not isinstance(record, dict):
            return None
        record = record.get(key)
    return record if isinstance(record, str) else None


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


def files_under(root: str) -> list[Path]:
    """Every file in folder root and its subfolders (symlinked folders are not entered). A folder that cannot be
    listed or a link to nothing is a UserError: a corpus with files silently left out is worse than none."""
    def fail(e: OSError) -> None:
        raise UserError(f"--input {root}: cannot read {e.filename} ({e.strerror}): fix its permissions, or move it "
                        "out of the folder")

    found = []
    for folder, _, names in os.walk(root, onerror=fail):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not os.path.exists(path):
                raise UserError(f"--input {root}: {path} is a link to nothing ({os.readlink(path)}): remove it or "
                                "restore its target")
            if os.path.isfile(path):
                found.append(Path(path))
    return found


def list_local_inputs(patterns: Sequence[str], text_suffixes: Sequence[str]) -> list[SourceFile]:
    files: dict[str, SourceFile] = {}
    for pattern in patterns:
        pattern = os.path.expanduser(pattern)
        if os.path.isdir(pattern):
            root = Path(pattern)
            found = sorted(p for p in files_under(pattern) if kind_of(p.name, text_suffixes))
            if not found:
                raise UserError(f"--input {pattern}: folder holds no .jsonl.zst/.jsonl/.jsonl.gz/"
                                f"{'/'.join(text_suffixes)} files")
            for p in found:
                rel = p.relative_to(root).as_posix()
                files[str(p.resolve())] = SourceFile(str(p), rel, split_of(rel), p.stat().st_size,
                                                     kind_of(p.name, text_suffixes))
            continue
        if os.path.isfile(pattern) or not glob.has_magic(pattern):  # an existing name is never a pattern
            matches = [pattern]
        else:
            matches = sorted(glob.glob(pattern, recursive=True))
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
    path = storage.local_path(dataset)
    if storage.is_remote(dataset) or not os.path.exists(os.path.expanduser(path)):
        return None
    return os.path.abspath(os.path.expanduser(path))


def list_dataset_files(dataset: str, text_suffixes: Sequence[str]) -> list[SourceFile]:
    """The .jsonl*/.txt files of a HF Hub dataset (or any fsspec URL or local folder), read without `datasets`
    so nothing is cached; [] when it has none (then it is read through `datasets`)."""
    import fsspec

    local = local_dataset_path(dataset)
    url = f"file://{local}" if local else dataset if storage.scheme(dataset) else f"hf://datasets/{dataset}"
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
    if storage.scheme(src.url):  # a URL, file:// included, is opened through fsspec
        import fsspec

        raw = fsspec.open(src.url, "rb").open()
    else:
        raw = open(src.url, "rb")
    lower = src.name.lower()
    if lower.endswith((".zst", ".zstd")):
        return ZstdReader(raw, CHUNK_BYTES)
    if lower.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def read_tasks(src: SourceFile, start: tuple, text_column: str,
               subsets: Optional[tuple[str, ...]]) -> Iterator[Task]:
    """Cut a file into tasks of about CHUNK_BYTES, from position `start` = (offset, line): JSONL in whole lines
    from a byte offset, `datasets` rows from a row, text (always from its start) at BPE-safe cuts."""
    if src.kind == "rows":
        yield from read_rows(src, start[0], text_column, subsets)
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


def read_rows(src: SourceFile, start_row: int, text_column: str,
              subsets: Optional[tuple[str, ...]]) -> Iterator[Task]:
    """A `datasets` split as tasks of [(text, subset)], from row start_row (skipped rows are read, not tokenized);
    `subsets`: the path of the subset field (subset_path), or None when no subset is needed."""
    stream = src.stream.skip(start_row) if start_row else src.stream
    rows, size, first, row = [], 0, start_row + 1, start_row
    for batch in stream.iter(batch_size=ROWS_PER_READ):
        if text_column not in batch:
            raise UserError(f"{src.url} [{src.name}]: no column '{text_column}' (columns: {', '.join(batch)}); "
                            "set --text-column")
        texts = batch[text_column]
        column = batch.get(subsets[0]) if subsets else None
        for k, text in enumerate(texts):
            rows.append((text, subset_of({subsets[0]: column[k]}, subsets) if column else None))
            size += len(text) if isinstance(text, str) else 0
            if size >= CHUNK_BYTES:
                row += len(rows)
                yield Task("rows", rows, src.name, first, src.split, True, True, (row, row + 1))
                rows, size, first = [], 0, row + 1
    if rows:
        row += len(rows)
        yield Task("rows", rows, src.name, first, src.split, True, True, (row, row + 1))


_SAFE_CUT = re.compile(r"(?<=\S)\n(?=\S)")


def safe_cut(text: str) -> int:
    """The last index i with text[i-1] == '\\n' and text[i-2], text[i] not whitespace, or 0 if none."""
    cut = 0
    for m in _SAFE_CUT.finditer(text, max(0, len(text) - CHUNK_BYTES // 4)):
        cut = m.end()
    return cut


def is_remote(src: SourceFile) -> bool:
    """Whether reading src goes over the network (then a failure is worth retrying)."""
    if src.kind == "rows":
        return local_dataset_path(src.url) is None
    return storage.is_remote(src.url)


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
