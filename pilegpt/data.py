"""The data contract between the stages: what prepare_data.py writes, to_mds.py converts and train.py reads.

One definition of each thing two stages must agree on:
- `Meta` (meta.json): the record beside train.bin / val.bin: tokenizer, vocab, EOT id, token dtype and the
  token count of each split. `Meta.read` validates it; `write_token_files` writes a .bin dataset with it.
- The window: sample i of a .bin is tokens[i*T : i*T+T+1], x = its first T tokens, y = its last T
  (`window_starts`, `read_windows`). Non-overlapping, so every token is predicted once per epoch.
- The MDS layout: columns x and y (`mds_columns`), `INDEX_NAME` (Streaming's index, written last) and
  `TO_MDS_META` (how to_mds made the dataset), one dataset per split folder (`SPLITS`).
- The datasets train.py loads: `BinDataset` + `ResumableSampler` for .bin, `StreamingDataset` for MDS,
  batches {"x": LongTensor (B, T), "y": LongTensor (B, T)} (`build_dataloaders`).

numpy only at import: torch, Composer and Streaming are imported where they are used.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from pilegpt.common import UserError, atomic_write_text

META_NAME = "meta.json"  # beside train.bin / val.bin
META_VERSION = 2  # of the .bin format: bump when the tokens written for the same input change (2: blank docs skipped)
SPLITS = ("train", "val")  # the splits of a dataset, in order
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")  # integer dtypes of a .bin (and of MDS ndarray columns)
INDEX_NAME = "index.json"  # Streaming's MDS index: lists every shard, so it is written (and uploaded) last
TO_MDS_META = "to_mds.json"  # to_mds's record of how an MDS dataset was made (block_size, sampling, source)


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
    return Meta(tokenizer="gpt2", vocab_size=50257, eot_token=50256, dtype="uint16", splits=splits,
                tool="nanoGPT prepare.py")


def write_token_files(folder: str | os.PathLike, splits: dict[str, np.ndarray], tokenizer: str = "gpt2",
                      vocab_size: int = 50257, eot_token: int = 50256, dtype: str = "uint16", **info) -> Meta:
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


def check_token_range(x: np.ndarray, y: np.ndarray, starts: np.ndarray, path, vocab_size: int) -> None:
    """UserError naming the first token id outside [0, vocab_size) in these windows (x, plus y's last token)."""
    for arr, shift in ((x, 0), (y[:, -1:], x.shape[1])):
        bad = (arr >= vocab_size) | (arr < 0) if arr.dtype.kind == "i" else arr >= vocab_size
        if bad.any():
            k, j = np.argwhere(bad)[0]
            raise UserError(f"{path}: token id {arr[k, j]} at position {starts[k] + j + shift} is out of range "
                            f"for vocab_size {vocab_size}; was the .bin written with another tokenizer? re-run "
                            f"prepare_data.py (or pass the right --vocab-size for a bare .bin)")


def mds_columns(dtype: str, block_size: int) -> dict[str, str]:
    """The MDS columns of a dataset of T-token samples: x and y, fixed-size arrays of the .bin's dtype."""
    return {"x": f"ndarray:{dtype}:{block_size}", "y": f"ndarray:{dtype}:{block_size}"}


# ----------------------------------------------------------------------------------------------------------
# Datasets and loaders for train.py

class BinDataset:
    """The windows of a .bin file as a map-style dataset: item i = {"x": (T,), "y": (T,)} LongTensors.

    state_dict/load_state_dict let Composer resume mid-epoch without re-reading the data (ResumableSampler).
    """

    def __init__(self, path: str, block_size: int, dtype: str = "uint16", num_tokens: Optional[int] = None,
                 vocab_size: Optional[int] = None):
        self.path, self.block_size, self.dtype, self.vocab_size = path, block_size, np.dtype(dtype), vocab_size
        self.num_tokens = os.path.getsize(path) // self.dtype.itemsize if num_tokens is None else num_tokens
        self.tokens = None  # opened lazily, once per DataLoader worker
        self.resume_samples = 0  # global samples of the current epoch already trained (set by load_state_dict)

    def __len__(self) -> int:
        return num_windows(self.num_tokens, self.block_size)

    def __getitem__(self, i: int) -> dict:
        import torch

        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        starts = np.array([i * self.block_size])
        x, y = read_windows(self.tokens, starts, self.block_size)
        if self.vocab_size is not None:
            check_token_range(x, y, starts, self.path, self.vocab_size)
        return {"x": torch.from_numpy(x[0].astype(np.int64)), "y": torch.from_numpy(y[0].astype(np.int64))}

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        return {"sample_in_epoch": int(num_samples)}

    def load_state_dict(self, state: dict) -> None:
        self.resume_samples = int(state["sample_in_epoch"])


def _mix(x: np.ndarray, key: int) -> np.ndarray:
    """A 64-bit hash of each x (splitmix64's finalizer over x + key): the round function of the permutation."""
    with np.errstate(over="ignore"):
        z = (x + np.uint64(key)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def permute(positions: np.ndarray, n: int, key: int) -> np.ndarray:
    """The images of `positions` under a pseudo-random permutation of range(n) chosen by `key`.

    A bijection computed one index at a time, so shuffling n windows needs no n-long array: a balanced
    Feistel network over the smallest even number of bits that holds n (4 rounds of _mix), with
    cycle-walking (apply it again until the value falls inside range(n); on average < 4 times).
    """
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = [int(_mix(np.array([key + r], dtype=np.uint64), 0x5EED)[0]) for r in range(4)]
    x = positions.astype(np.uint64)
    todo = np.ones(len(x), dtype=bool)
    while todo.any():
        left, right = x[todo] >> np.uint64(half), x[todo] & mask
        for k in keys:
            left, right = right, left ^ (_mix(right, k) & mask)
        x[todo] = (left << np.uint64(half)) | right
        todo = x >= np.uint64(n)
    return x.astype(np.int64)


def resumable_sampler(dataset: BinDataset, world_size: int, rank: int, seed: int):
    """The training order of a BinDataset: a new shuffle every epoch, each window once per epoch, ranks
    disjoint (rank r takes every world_size-th position), and an exact resume mid-epoch.

    Memory and start-up do not grow with the dataset: positions map to windows through `permute`, computed
    in chunks as the DataLoader asks for them (the Pile's ~300M windows of 1024 tokens need no index list).
    Composer sets the epoch (set_epoch, as for any DistributedSampler) and calls BinDataset.load_state_dict
    on resume; the order is a function of (seed, epoch) only, so skipping each rank's first
    sample_in_epoch / world_size positions restores the exact data position of the interrupted run.
    """
    from torch.utils.data import DistributedSampler

    class PermutationSampler(DistributedSampler):
        chunk = 1 << 16  # positions computed at a time

        def __iter__(self):
            skip = self.dataset.resume_samples // self.num_replicas
            self.dataset.resume_samples = 0
            n, key = len(self.dataset), (self.seed << 20) + self.epoch
            for start in range(skip, self.num_samples, self.chunk):
                j = np.arange(start, min(start + self.chunk, self.num_samples), dtype=np.int64)
                yield from permute(j * self.num_replicas + self.rank, n, key).tolist()

    return PermutationSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)


def collate_mds(samples: list[dict], vocab_size: Optional[int] = None) -> dict:
    """MDS samples (numpy x, y of any integer dtype) -> {"x": LongTensor (B, T), "y": LongTensor (B, T)};
    with vocab_size, an id outside the vocabulary is a UserError (not an IndexError deep in the model)."""
    import torch

    x, y = (np.stack([s[k] for s in samples]) for k in ("x", "y"))
    if vocab_size is not None:
        for arr in (x, y):
            if arr.size and (arr.max() >= vocab_size or arr.min() < 0):
                bad = arr.max() if arr.max() >= vocab_size else arr.min()
                raise UserError(f"the MDS data holds token id {bad}, outside the model's vocab_size {vocab_size}: "
                                "was it made with another tokenizer? pass the right --vocab_size or re-run to_mds.py")
    return {"x": torch.from_numpy(x.astype(np.int64)), "y": torch.from_numpy(y.astype(np.int64))}


def detect_format(data_dir: str, data_format: str) -> str:
    """"bin" or "mds": what data_dir holds (prepare_data's train.bin or to_mds's train/index.json)."""
    root = Path(data_dir)
    if not root.is_dir():
        raise UserError(f"data_dir {root} not found: make it with prepare_data.py --out-dir {root} (.bin) or "
                        f"to_mds.py --out {root} (MDS), or pass --data_dir=FOLDER")
    has_bin, has_mds = (root / "train.bin").is_file(), (root / "train" / INDEX_NAME).is_file()
    if data_format == "bin" or (data_format == "auto" and has_bin):
        if not has_bin:
            raise UserError(f"{root / 'train.bin'} not found: run prepare_data.py --out-dir {root}")
        return "bin"
    if data_format == "mds" or (data_format == "auto" and has_mds):
        if not has_mds:
            raise UserError(f"{root / 'train' / INDEX_NAME} not found: run to_mds.py --out {root}")
        return "mds"
    raise UserError(f"data_dir {root} holds neither train.bin (prepare_data.py) nor train/{INDEX_NAME} "
                    f"(to_mds.py)")


def bin_split(data_dir: str, meta: Meta, split: str, block_size: int) -> Optional[BinDataset]:
    """The BinDataset of one split, or None when the dataset has no such split."""
    if split not in meta.splits:
        return None
    n = meta.token_count(data_dir, split)
    dataset = BinDataset(str(Path(data_dir) / meta.splits[split].file), block_size, meta.dtype, num_tokens=n,
                         vocab_size=meta.vocab_size)
    if len(dataset) == 0:
        raise UserError(f"{dataset.path} has {n} tokens, fewer than one sample of block_size+1 = "
                        f"{block_size + 1}: use more data or a smaller --block_size")
    return dataset


def mds_roots(cfg) -> list[str]:
    if cfg.data_remote is None:
        return [cfg.data_dir]
    return [cfg.data_remote] if isinstance(cfg.data_remote, str) else list(cfg.data_remote)


def mds_cache_dir(data_local: str, root: str, split: str) -> str:
    """A local cache folder of its own for each remote root and split (Streaming needs distinct ones)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", root.split("://", 1)[-1]).strip("_")
    return os.path.join(data_local, slug, split)


def read_split_file(root: str, split: str, name: str) -> Optional[bytes]:
    """The bytes of root/split/name (local path or s3://), or None when it is missing (other stores: None)."""
    if "://" not in root:
        path = Path(root) / split / name
        return path.read_bytes() if path.is_file() else None
    if not root.startswith("s3://"):
        return None
    from pilegpt import storage

    folder = storage.S3Dir(f"{root.rstrip('/')}/{split}")
    return folder.read(name) if folder.exists(name) else None


def describe_read_failure(e: BaseException, where: str) -> Optional[str]:
    """One line for a failure while reading MDS shards (checksum, lost connection), or None if unknown."""
    text = str(e)
    if isinstance(e, ValueError) and text.startswith("Checksum failure: "):
        cached = text.partition(": ")[2]
        Path(cached).unlink(missing_ok=True)  # a cache file: the next run downloads it again
        return (f"shard {Path(cached).name} of {where} does not match the checksum in its {INDEX_NAME}: the dataset "
                f"is damaged; rebuild it with to_mds.py --overwrite (or upload it again)")
    from pilegpt import storage

    return storage.lost_connection(e, f"while reading {where}")


def __getattr__(name: str):
    """CheckedStreamingDataset, made on first use: Streaming is slow to import and only train.py needs it."""
    if name != "CheckedStreamingDataset":
        raise AttributeError(name)
    from streaming import StreamingDataset

    class CheckedStreamingDataset(StreamingDataset):
        """StreamingDataset whose download failures end the run with one line naming the cause.

        Streaming downloads and checks shards in background threads; when one fails, the reader only
        learns "Background thread failed". This keeps the first failure and raises it as a UserError.
        """
        failure: Optional[BaseException] = None

        def on_exception(self, future) -> None:  # a background thread's task ended
            if future.exception() is not None:  # keep it for __iter__ (Streaming's own re-raise only logs it)
                self.failure = self.failure or future.exception()
                self._event.set()

        def __iter__(self):
            try:
                yield from super().__iter__()
            except (RuntimeError, ValueError) as e:
                where = ", ".join(s.remote or s.local for s in self.streams)
                message = describe_read_failure(self.failure or e, where)
                if message is None:
                    raise
                raise UserError(message) from None

    CheckedStreamingDataset.__module__ = __name__
    globals()[name] = CheckedStreamingDataset
    return CheckedStreamingDataset


def mds_split(cfg, split: str, batch_size: int, shuffle: bool):
    """A StreamingDataset over split/ of every MDS root (several roots: several streams), or None.

    Every root, local or remote, is read through a cache under data_local: Streaming decompresses shards
    where it reads them, and a dataset folder must stay exactly as to_mds wrote it. Shard checksums are
    validated as shards enter the cache (xxh64 when the index has it), so a corrupt shard is refused.
    """
    from streaming import Stream

    roots = mds_roots(cfg)
    indexes = [read_split_file(r, split, INDEX_NAME) for r in roots]
    # whether root/split exists (on stores other than S3 it cannot be checked here: Streaming will tell)
    present = [i is not None or ("://" in r and not r.startswith("s3://")) for r, i in zip(roots, indexes)]
    if not any(present):
        return None
    if not all(present):
        missing = [r for r, ok in zip(roots, present) if not ok]
        raise UserError(f"MDS split {split}/ is missing under {missing} but present under the other roots")
    streams = []
    for root, index in zip(roots, indexes):
        made = read_split_file(root, split, TO_MDS_META)
        vocab = json.loads(made).get("vocab_size") if made else None
        if vocab is not None and vocab > cfg.vocab_size:
            raise UserError(f"{root}/{split} was made with a vocabulary of {vocab} tokens but vocab_size is "
                            f"{cfg.vocab_size}: pass --vocab_size={vocab}")
        try:
            hashes = set(json.loads(index)["shards"][0].get("hashes") or []) if index else set()
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise UserError(f"{root}/{split}/{INDEX_NAME} is not a valid MDS index: re-run to_mds.py") from None
        check = "xxh64" if "xxh64" in hashes else min(hashes, default=None)  # xxh64: the fastest
        streams.append(Stream(remote=f"{root.rstrip('/')}/{split}", local=mds_cache_dir(cfg.data_local, root, split),
                              validate_hash=check))
    try:
        return __getattr__("CheckedStreamingDataset")(streams=streams, batch_size=batch_size, shuffle=shuffle,
                                                      shuffle_seed=cfg.seed)
    except (FileNotFoundError, ValueError) as e:
        raise UserError(f"cannot open MDS split {split}/ of {roots}: {e}") from None


def check_sample_length(dataset, block_size: int, what: str) -> None:
    try:
        length = len(dataset[0]["x"])
    except (RuntimeError, ValueError) as e:
        raise UserError(describe_read_failure(e, what) or f"cannot read the first sample of {what}: {e}") from None
    if length != block_size:
        raise UserError(f"{what} holds samples of {length} tokens but block_size is {block_size}: pass "
                        f"--block_size={length} or re-run to_mds.py --block-size {block_size}")


def build_dataloaders(cfg, world_size: int, rank: int, pin_memory: bool):
    """(train DataSpec, val DataSpec or None) for this rank, from a TrainConfig's data and batch settings."""
    from composer.core import DataSpec
    from composer.utils import dist
    from torch.utils.data import DataLoader

    per_rank = cfg.global_batch_size // world_size
    mb = cfg.device_train_microbatch_size
    eval_bs = cfg.device_eval_batch_size or (mb if isinstance(mb, int) else 8)
    loader_args = dict(num_workers=cfg.num_workers, pin_memory=pin_memory, persistent_workers=cfg.num_workers > 0)
    if cfg.data_remote is None and detect_format(cfg.data_dir, cfg.data_format) == "bin":
        if (Path(cfg.data_dir) / META_NAME).is_file():
            meta = Meta.read(cfg.data_dir)
        else:
            meta = nanogpt_meta(cfg.data_dir)
            if rank == 0:
                print(f"note: {cfg.data_dir} has no {META_NAME}: reading its .bin files as nanoGPT's (uint16 GPT-2 "
                      f"tokens, vocab 50257)", flush=True)
        if meta.vocab_size > cfg.vocab_size:
            raise UserError(f"{cfg.data_dir} uses a vocabulary of {meta.vocab_size} tokens but vocab_size is "
                            f"{cfg.vocab_size}: pass --vocab_size={meta.vocab_size}")
        train_set = bin_split(cfg.data_dir, meta, "train", cfg.block_size)
        val_set = bin_split(cfg.data_dir, meta, "val", cfg.block_size)
        if train_set is None:
            raise UserError(f"{Path(cfg.data_dir) / META_NAME} lists no train split: run prepare_data.py")
        if len(train_set) < cfg.global_batch_size:
            raise UserError(f"train.bin has {len(train_set)} samples of {cfg.block_size} tokens, fewer than one "
                            f"global batch ({cfg.global_batch_size}): lower --global_batch_size or --block_size")
        sampler = resumable_sampler(train_set, world_size, rank, cfg.seed)
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
            raise UserError(f"no MDS train split: expected train/{INDEX_NAME} under {mds_roots(cfg)} "
                            f"(to_mds.py --out ROOT writes ROOT/train)")
        check_sample_length(train_set, cfg.block_size, f"MDS {mds_roots(cfg)}")
        collate = functools.partial(collate_mds, vocab_size=cfg.vocab_size)
        train = DataLoader(train_set, batch_size=per_rank, collate_fn=collate, drop_last=True, **loader_args)
        val_set = mds_split(cfg, "val", eval_bs, shuffle=False)
        val = None if val_set is None else DataLoader(val_set, batch_size=eval_bs, collate_fn=collate, **loader_args)

    def spec(loader):
        return DataSpec(loader, get_num_tokens_in_batch=lambda b: int(b["x"].numel()),
                        get_num_samples_in_batch=lambda b: int(b["x"].shape[0]))

    return spec(train), (spec(val) if val is not None else None)
