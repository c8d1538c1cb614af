"""to_mds.py --verify: check an MDS dataset (a folder or an s3:// prefix) against its .bin, every shard's size and
checksum and every token of every sample, read back with StreamingDataset. Every failure is one UserError
naming the file and the fix. Details: docs/mds-and-s3.md."""

from __future__ import annotations

import functools
import json
import os
import tempfile
from typing import Optional

import numpy as np

from pilegpt import compat, storage
from pilegpt.common import UserError
from pilegpt.data import (
    INDEX_NAME,
    TO_MDS_META,
    check_shards_present,
    num_windows,
    read_windows,
    validation_hash,
)
from pilegpt.mds.write import SplitJob, chunks, spec_starts
from pilegpt.removed import removed_setting_error

REBUILD = "re-run to_mds.py with --overwrite to rebuild the dataset"


def load_spec(source: str, client, block_size: Optional[int], job: SplitJob, dtype: np.dtype) -> dict:
    """to_mds.json of the dataset at `source` (or, for one made elsewhere, a sequential spec from --block-size),
    checked against --block-size (None: not given) and the .bin of `job`."""
    folder = storage.folder(source, client)
    if not folder.exists(INDEX_NAME):
        raise UserError(f"{source} has no {INDEX_NAME}: not an MDS dataset; convert it first (without --verify "
                        f"on an existing folder, or with --overwrite)")
    record = folder.get(TO_MDS_META)
    if record is not None:
        where = storage.join(source, TO_MDS_META)
        try:
            spec = json.loads(record)
        except ValueError as e:
            raise UserError(f"{where} is not valid JSON ({e}); {REBUILD}") from None
        if isinstance(spec, dict) and spec.get("sampling") == "doc_aligned":  # to_mds.py up to ac879ff wrote these
            raise removed_setting_error("doc_aligned", f"{where} records --sampling doc_aligned rows",
                                        "re-run to_mds.py without --sampling doc_aligned, or verify it with")
        if not (isinstance(spec, dict) and isinstance(spec.get("block_size"), int)
                and spec.get("sampling") in ("sequential", "random") and isinstance(spec.get("source"), dict)
                and isinstance(spec["source"].get("tokens"), int)):
            raise UserError(f"{where} lacks block_size, sampling or source.tokens, so it was not written by "
                            f"to_mds.py; {REBUILD}")
    elif block_size is None:
        raise UserError(f"{source} has no {TO_MDS_META}; pass --block-size to verify it")
    else:  # an MDS folder some other tool wrote: assume to_mds's default windows
        spec = {"block_size": block_size, "sampling": "sequential", "dtype": dtype.name,
                "num_samples": num_windows(job.n_tokens, block_size), "source": {"tokens": job.n_tokens}}
    if block_size is not None and block_size != spec["block_size"]:
        raise UserError(f"--block-size {block_size} differs from {source} (block_size "
                        f"{spec['block_size']}); drop the flag, or use --overwrite to rebuild")
    if spec["source"]["tokens"] != job.n_tokens:
        raise UserError(f"{source} was made from {spec['source']['tokens']} tokens but {job.bin_path} now holds "
                        f"{job.n_tokens}; re-run with --overwrite")
    return spec


def check_shard_files(source: str, client) -> Optional[str]:
    """Check that index.json of the dataset at `source` is an MDS index and that every shard file it lists is
    there with its size, before reading anything; return the checksum to validate the shards with (None: none)."""
    folder = storage.folder(source, client)
    text = folder.get(INDEX_NAME)
    check_shards_present(text, folder.sizes(), functools.partial(storage.join, source), REBUILD)
    return validation_hash(text)


def verify_split(source: str, job: SplitJob, spec: dict, dtype: np.dtype, client) -> int:
    """Read the dataset at `source` (folder or s3://) with StreamingDataset; compare every sample with the .bin.

    Shards are copied into a fresh temporary cache, so the dataset folder itself is never modified (with
    remote=None, Streaming would decompress shards inside it) and the cache's shared memory names are unique.
    """
    tokens = np.memmap(job.bin_path, dtype=dtype, mode="r")
    starts = spec_starts(spec, job.n_tokens)
    check = check_shard_files(source, client)
    with tempfile.TemporaryDirectory(prefix="to_mds_verify_") as cache:
        ds = open_dataset(source, cache, check)
        try:
            problem = first_difference(ds, source, tokens, starts, spec["block_size"], job, cache)
        finally:
            del ds  # the dataset lets go of the cache before the cache is removed
    if problem is not None:
        raise UserError(f"verify failed: {problem}; re-run with --overwrite")
    return len(starts)


def open_dataset(source: str, cache: str, validate_hash: Optional[str]):
    """A StreamingDataset over `source` in order, copying shards into `cache`."""
    from streaming import StreamingDataset

    try:
        with compat.streaming_start_lock():  # a training run may be starting on this machine
            return StreamingDataset(remote=source, local=cache, shuffle=False, batch_size=1,
                                    validate_hash=validate_hash)
    except (KeyError, ValueError, TypeError) as e:  # an index.json with shard entries Streaming cannot use
        raise UserError(f"{storage.join(source, INDEX_NAME)} is not an MDS index Streaming can read "
                        f"({type(e).__name__}: {e}); {REBUILD}") from None


def first_difference(ds, source: str, tokens: np.ndarray, starts: np.ndarray, T: int, job: SplitJob,
                     cache: str = "") -> Optional[str]:
    """Compare every sample of `ds` (the dataset at `source`, its shards copied into `cache`) with its window of
    `tokens`, in order: the first difference, or None when every token matches."""
    from tqdm import tqdm

    if ds.num_samples != len(starts):
        return f"{source} holds {ds.num_samples} samples, expected {len(starts)} from {job.bin_path}"
    i = 0
    with tqdm(total=len(starts), unit="sample", unit_scale=True, desc=f"verify {job.name}", disable=None) as bar:
        for part in chunks(starts, T):
            x, y = read_windows(tokens, part, T)
            for k in range(len(part)):
                try:
                    sample = ds[i]
                except ValueError as e:  # Streaming: checksum failure
                    return failed_read(e, source, cache)
                column = differing_column(sample, x[k], y[k])
                if column is not None:
                    return f"{source} sample {i} column {column} differs from {job.bin_path}"
                i += 1
            bar.update(len(part))
    return None


def failed_read(e: ValueError, source: str, cache: str) -> str:
    """What a failed read of the dataset at `source` says: a shard that fails its checksum named as the user's shard
    under `source`, not by its copy in the verifier's temporary `cache` (gone by the time the line is read)."""
    text = str(e)
    if not text.startswith("Checksum failure: "):
        return f"{source}: {e}"
    name = os.path.relpath(text.partition(": ")[2], cache)
    if name.startswith(".."):  # not a copy in the cache: the shard's own path
        return f"{source}: {e}"
    return (f"{storage.join(source, name.replace(os.sep, '/'))} does not match the checksum in "
            f"{storage.join(source, INDEX_NAME)}: the shard is damaged")


def differing_column(sample: dict, x: np.ndarray, y: np.ndarray) -> Optional[str]:
    for column, want in (("x", x), ("y", y)):
        got = np.asarray(sample[column])
        if got.shape != want.shape or not np.array_equal(got, want):
            return column
    return None
