"""The data contract between the stages, one definition of each thing two of them must agree on: meta.json (`Meta`)
beside train.bin / val.bin, a dataset prepared by component (`subset_folder`, subsets.json), the x/y window
(sample i = tokens[i*T : i*T+T+1], x its first T, y its last T), and the MDS layout (columns x and y, index.json
written last, to_mds.json, one dataset per split folder, the shard names an index may list). numpy only.
Details: docs/prepare.md and docs/mds-and-s3.md."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

from pilegpt.common import UserError, atomic_write_text
from pilegpt.tokenizer import EOT_ID, GPT2_VOCAB_SIZE

META_NAME = "meta.json"  # beside train.bin / val.bin
META_VERSION = 2  # of the .bin format: bump when the tokens written for the same input change (2: blank docs skipped)
SPLITS = ("train", "val")  # the splits of a dataset, in order
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")  # integer dtypes of a .bin (and of MDS ndarray columns)
INDEX_NAME = "index.json"  # Streaming's MDS index: lists every shard, so it is written (and uploaded) last
TO_MDS_META = "to_mds.json"  # to_mds's record of how an MDS dataset was made (block_size, sampling, source)
SUBSETS_NAME = "subsets.json"  # prepare_data --by-subset's index of its component folders, written last
SUBSETS_VERSION = 1  # of subsets.json


# ----------------------------------------------------------------------------------------------------------
# meta.json

@dataclass
class SplitInfo:
    file: str  # the .bin file name, e.g. "train.bin"
    tokens: int  # tokens in it (its size / dtype size)
    documents: int = 0  # documents in it (each ends with eot_token)


@dataclass
class Meta:
    """meta.json: everything a reader of the .bin files needs to know, plus where they came from."""
    tokenizer: str  # tiktoken encoding name, e.g. "gpt2"
    vocab_size: int  # token ids are in [0, vocab_size)
    eot_token: int  # the id that ends every document
    dtype: str  # numpy dtype of the .bin files, one of TOKEN_DTYPES
    splits: dict[str, SplitInfo]  # "train" (and "val") -> file and counts
    version: int = META_VERSION
    tool: str = "prepare_data.py"
    info: dict = field(default_factory=dict)  # provenance (sources, filters, counts): free-form, saved flat

    def __post_init__(self):
        self.splits = {k: v if isinstance(v, SplitInfo) else SplitInfo(**v) for k, v in self.splits.items()}
        if self.dtype not in TOKEN_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer, got {self.vocab_size!r}")
        if self.vocab_size - 1 > np.iinfo(self.dtype).max:
            raise ValueError(f"vocab_size {self.vocab_size} does not fit in {self.dtype}; use uint32")
        if not 0 <= self.eot_token < self.vocab_size:
            raise ValueError(f"eot_token {self.eot_token} is outside the vocabulary [0, {self.vocab_size})")

    def to_json(self) -> str:
        record = {k: v for k, v in asdict(self).items() if k != "info"}
        return json.dumps({**record, **self.info}, indent=2) + "\n"

    def write(self, folder: str | os.PathLike) -> None:
        atomic_write_text(Path(folder) / META_NAME, self.to_json())

    @classmethod
    def read(cls, folder: str | os.PathLike) -> "Meta":
        """meta.json of `folder`; a UserError naming the file when it is missing or bad."""
        path = Path(folder) / META_NAME
        if not path.is_file():
            raise UserError(f"{path} not found: is {folder} a folder written by prepare_data.py?")
        try:
            record = json.loads(path.read_text())
            known = {k: record.pop(k) for k in ("tokenizer", "vocab_size", "eot_token", "dtype", "splits",
                                                 "version", "tool") if k in record}
            return cls(**known, info=record)
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as e:
            raise UserError(f"{path} is not a valid meta.json ({e}); re-run prepare_data.py to rewrite it") from None

    def token_count(self, folder: str | os.PathLike, split: str) -> int:
        """Tokens in split's .bin, checked against the file size; a UserError when the files disagree."""
        entry = self.splits[split]
        path = Path(folder) / entry.file
        return count_tokens(path, np.dtype(self.dtype), expected=entry.tokens)


def count_tokens(path: Path, dtype: np.dtype, expected: Optional[int] = None) -> int:
    """Tokens in a .bin, from its size; a UserError when it is missing, truncated, or not `expected` long."""
    if not path.is_file():
        raise UserError(f"{path} not found: pass a .bin written by prepare_data.py, or its folder")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise UserError(f"{path} is {size} bytes, not a multiple of {dtype.itemsize} ({dtype.name}): the file is "
                        f"truncated or not {dtype.name} tokens; re-run prepare_data.py or pass the right --dtype")
    n = size // dtype.itemsize
    if expected is not None and int(expected) != n:
        raise UserError(f"{path} holds {n} tokens but {path.parent / META_NAME} says {expected}: the file is "
                        f"truncated or from another run; re-run prepare_data.py")
    return n


def nanogpt_meta(folder: str | os.PathLike) -> Meta:
    """The Meta of a nanoGPT data folder (train.bin + val.bin of uint16 GPT-2 tokens, no meta.json)."""
    splits = {s: SplitInfo(f"{s}.bin", count_tokens(Path(folder) / f"{s}.bin", np.dtype(np.uint16)))
              for s in SPLITS if (Path(folder) / f"{s}.bin").is_file()}
    return Meta(tokenizer="gpt2", vocab_size=GPT2_VOCAB_SIZE, eot_token=EOT_ID, dtype="uint16", splits=splits,
                tool="nanoGPT prepare.py")


def write_token_files(folder: str | os.PathLike, splits: dict[str, np.ndarray], tokenizer: str = "gpt2",
                      vocab_size: int = GPT2_VOCAB_SIZE, eot_token: int = EOT_ID, dtype: str = "uint16",
                      **info) -> Meta:
    """Write token arrays as a .bin dataset (split.bin files + meta.json), e.g. tokens from another tool."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = Meta(tokenizer=tokenizer, vocab_size=vocab_size, eot_token=eot_token, dtype=dtype, info=info, splits={
        name: SplitInfo(f"{name}.bin", len(tokens), int(np.count_nonzero(np.asarray(tokens) == eot_token)))
        for name, tokens in splits.items()})
    for name, tokens in splits.items():
        np.asarray(tokens, dtype=dtype).tofile(folder / f"{name}.bin")
    meta.write(folder)
    return meta


# ----------------------------------------------------------------------------------------------------------
# A dataset by component: OUT/<subset_folder(name)>/ is a prepared folder per subset, OUT/subsets.json the index

_NOT_SAFE = re.compile(r"[^a-z0-9.-]+")
# The names the stages write in a dataset's root (or look for there): a component never takes one as its folder
RESERVED_FOLDERS = frozenset({SUBSETS_NAME, META_NAME, INDEX_NAME, TO_MDS_META, *(f"{s}.bin" for s in SPLITS),
                              *(f"{s}.bin.partial" for s in SPLITS)})
MAX_FOLDER = 200  # characters of a component's folder name: filesystems allow 255 bytes, leave room for suffixes


def subset_folder(name: str) -> str:
    """The folder of a component: its name lower-cased, every run of other characters than a-z, 0-9, "." and "-"
    one "_", none at either end ("Pile-CC" -> "pile-cc", "Gutenberg (PG-19)" -> "gutenberg_pg-19"). The one
    definition: prepare_data writes these folders, train.py's mix and eval.py name components by them.

    Two names that could not be folders get one that no other rule gives (subset_folder_note says why): a name the
    stages write themselves (RESERVED_FOLDERS: "subsets.json" -> "subsets.json_", the only folders ending in "_"),
    and one over MAX_FOLDER characters (its first ones, "-" and 8 hex digits of the name's sha256)."""
    folder = _NOT_SAFE.sub("_", name.lower()).strip("_.")
    if not folder:
        raise UserError(f"subset {name!r} has no letter or digit to name its folder by; rename it in the input or "
                        "leave it out with --exclude-subset")
    if folder in RESERVED_FOLDERS:
        return folder + "_"
    if len(folder) > MAX_FOLDER:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        return folder[:MAX_FOLDER - 9].rstrip("_.") + "-" + digest
    return folder


def subset_folder_note(name: str) -> Optional[str]:
    """Why subset_folder(name) is not the name as it is, when one of its two exceptions applies; else None."""
    folder, plain = subset_folder(name), _NOT_SAFE.sub("_", name.lower()).strip("_.")
    if folder == plain:
        return None
    why = (f"{plain} is a name prepare_data and to_mds write in a dataset's folder" if plain in RESERVED_FOLDERS
           else f"its name has {len(plain)} characters, a folder at most {MAX_FOLDER}")
    return f"note: subset {name[:60]!r}{'...' if len(name) > 60 else ''} goes to the folder {folder} ({why})"


def read_subsets(root: str | os.PathLike) -> Optional[list[dict]]:
    """The components of a dataset prepared by component (subsets.json's "subsets": each {"name", "folder",
    "tokens", "documents"}), or None when `root` has no subsets.json; a UserError when it is damaged."""
    path = Path(root) / SUBSETS_NAME
    if not path.is_file():
        return None
    try:
        subsets = json.loads(path.read_text())["subsets"]
        if not all(isinstance(s["folder"], str) and subset_folder(s["folder"]) == s["folder"] for s in subsets):
            raise ValueError("a folder name that is not subset_folder's")
        return subsets
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a valid {SUBSETS_NAME} ({e}); re-run prepare_data.py --by-subset") from None


# ----------------------------------------------------------------------------------------------------------
# The window: the one definition of "sample i", for to_mds, its --verify, and train.py's .bin reader

def num_windows(n_tokens: int, block_size: int) -> int:
    """Non-overlapping windows of block_size+1 tokens (neighbours share one token) in n_tokens."""
    return max(0, (n_tokens - 1) // block_size)


def window_starts(n_tokens: int, block_size: int, sampling: str = "sequential", num_samples: int = 0,
                  seed: int = 0) -> np.ndarray:
    """Start offset of every sample's (T+1)-token window, in sample order.

    sequential: sample i starts at i*T. random: nanoGPT's `randint(len(data) - T)`, num_samples of them.
    """
    if sampling == "random":
        rng = np.random.default_rng(seed)
        return rng.integers(0, n_tokens - block_size, size=num_samples, dtype=np.int64)
    return np.arange(num_windows(n_tokens, block_size), dtype=np.int64) * block_size


def read_windows(tokens: np.ndarray, starts: np.ndarray, T: int) -> tuple[np.ndarray, np.ndarray]:
    """x, y of the samples that start at `starts`: two (K, T) arrays in the tokens' dtype, y = x shifted by one."""
    if len(starts) and np.all(np.diff(starts) == T):  # consecutive windows: one contiguous read, two views
        block = np.array(tokens[starts[0]:starts[-1] + T + 1])
        return block[:-1].reshape(len(starts), T), block[1:].reshape(len(starts), T)
    w = tokens[starts[:, None] + np.arange(T + 1)]  # (K, T+1)
    return w[:, :-1], w[:, 1:]


def ids_outside(arr: np.ndarray, vocab_size: int) -> Optional[np.ndarray]:
    """The mask of arr's ids outside [0, vocab_size), or None when its dtype holds no such id (e.g. uint16 with
    vocab_size 65536). Never compares an array with a value its dtype cannot hold: numpy 2.1 crashes (SIGSEGV)
    comparing a non-contiguous uint16 view with 65536."""
    info = np.iinfo(arr.dtype)
    below, above = info.min < 0, info.max >= vocab_size
    if not above:
        return (arr < 0) if below else None
    limit = arr.dtype.type(vocab_size)
    return (arr >= limit) | (arr < 0) if below else arr >= limit


def check_token_range(x: np.ndarray, y: np.ndarray, starts: np.ndarray, path, vocab_size: int) -> None:
    """UserError naming the first token id outside [0, vocab_size) in these windows (x, plus y's last token)."""
    for arr, shift in ((x, 0), (y[:, -1:], x.shape[1])):
        bad = ids_outside(arr, vocab_size)
        if bad is not None and bad.any():
            k, j = np.argwhere(bad)[0]
            raise UserError(f"{path}: token id {arr[k, j]} at position {starts[k] + j + shift} is out of range "
                            f"for vocab_size {vocab_size}; was the .bin written with another tokenizer? re-run "
                            f"prepare_data.py (or pass the right --vocab-size for a bare .bin)")


def mds_columns(dtype: str, block_size: int) -> dict[str, str]:
    """The MDS columns of a dataset of T-token samples: x and y, fixed-size arrays of the .bin's dtype."""
    return {"x": f"ndarray:{dtype}:{block_size}", "y": f"ndarray:{dtype}:{block_size}"}


# ----------------------------------------------------------------------------------------------------------
# The MDS index: which shard files a dataset folder holds, as Streaming reads them


def is_plain_name(name: str) -> bool:
    """Whether a file name read from an index stays inside its folder: relative, no "..", "." or empty part, no
    backslash or NUL (Streaming joins it to a cache folder and to the remote URL: "/etc/x" or "../x" escape both)."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\0" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


class ListedShard(NamedTuple):
    """A shard file of an MDS index, in the form Streaming reads it."""
    name: str  # path relative to the index's folder: zip_data's basename when the index lists one, else raw_data's
    size: Optional[int]  # bytes, as the index gives them (None when it does not)


def listed_shards(text: str | bytes, where: str | os.PathLike, hint: str) -> list[ListedShard]:
    """The shard files an MDS index.json (its text) lists, in order, as Streaming reads them: a shard's zip_data
    when the index lists one (the compressed file), else its raw_data. A UserError naming `where` and `hint`
    when the text is not an MDS index, or when a shard name (raw or compressed) is not a plain name inside the
    index's folder (is_plain_name): a hostile or damaged index is refused before any file is opened by its names."""
    try:
        shards = json.loads(text).get("shards")
    except (ValueError, AttributeError) as e:
        raise UserError(f"{where} is not a readable MDS index ({e}); {hint}") from None
    if not isinstance(shards, list) or not shards:
        raise UserError(f"{where} lists no shards, so it is not an MDS index; {hint}")
    found = []
    for shard in shards:
        entry = {}
        for kind in ("raw_data", "zip_data"):
            info = shard.get(kind) if isinstance(shard, dict) else None
            if isinstance(info, dict) and isinstance(info.get("basename"), str):
                if not is_plain_name(info["basename"]):
                    raise UserError(f"{where} lists the shard file {info['basename']!r}, which is not a plain name "
                                    "inside its folder (an absolute path, '..', a backslash or an empty name): the "
                                    f"index is damaged or hostile, nothing was read by that name; {hint}")
                size = info.get("bytes")
                entry[kind] = ListedShard(info["basename"], size if isinstance(size, int) else None)
        if "raw_data" not in entry:
            raise UserError(f"{where} has a shard entry without raw_data, so it is not an MDS index; {hint}")
        found.append(entry.get("zip_data", entry["raw_data"]))
    return found


def check_shards_present(index_text: str | bytes, sizes: dict[str, int], where: Callable[[str], str],
                         hint: str) -> list[ListedShard]:
    """The shards an index lists; a UserError unless each is in `sizes` (file name relative to the index's
    folder -> bytes) with the size the index gives. `where(name)` names a file of the dataset in messages."""
    index = where(INDEX_NAME)
    shards = listed_shards(index_text, index, hint)
    for shard in shards:
        if shard.name not in sizes:
            raise UserError(f"{where(shard.name)} is missing, though {index} lists it: the dataset is incomplete; "
                            f"{hint} (or put the shard back)")
        if shard.size is not None and sizes[shard.name] != shard.size:
            raise UserError(f"{where(shard.name)} is {sizes[shard.name]} bytes but {index} says {shard.size}: the "
                            f"shard is damaged or from another run; {hint}")
    return shards


def validation_hash(index_text: str | bytes) -> Optional[str]:
    """The shard checksum to validate with: xxh64 (the fastest) when the index stores it, else the first of the
    others by name, else None."""
    try:
        hashes = json.loads(index_text)["shards"][0].get("hashes") or []
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    hashes = {h for h in hashes if isinstance(h, str)} if isinstance(hashes, list) else set()
    return "xxh64" if "xxh64" in hashes else min(hashes, default=None)
