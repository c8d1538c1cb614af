"""Checking an MDS dataset that to_mds.py wrote against its .bin: every sample, every token, read by Streaming.

    spec = load_spec("s3://bucket/pile/train", client, block_size=None, job=job, dtype=np.dtype("uint16"))
    n = verify_split("s3://bucket/pile/train", job, spec, np.dtype("uint16"), client)   # samples checked

A dataset is a local folder or an s3:// prefix (storage.folder opens either). `load_spec` reads its to_mds.json
(or, for an MDS folder another tool wrote, assumes to_mds's default windows) and checks it against the flags and
the .bin; `verify_split` checks that every shard its index.json lists is there with its size
(data.check_shards_present), then reads every sample with StreamingDataset, validating each shard's checksum
(data.validation_hash), and compares it with the windows of the .bin. Every failure is one UserError naming the
file and the fix.
"""

from __future__ import annotations

import functools
import json
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
    from streaming import StreamingDataset
    from tqdm import tqdm

    T = spec["block_size"]
    tokens = np.memmap(job.bin_path, dtype=dtype, mode="r")
    starts = spec_starts(spec, job.n_tokens)
    check = check_shard_files(source, client)
    compat.clean_stale_shared_memory()
    with tempfile.TemporaryDirectory(prefix="to_mds_verify_") as cache:
        try:
            ds = StreamingDataset(remote=source, local=cache, shuffle=False, batch_size=1, validate_hash=check)
        except (KeyError, ValueError, TypeError) as e:  # an index.json with shard entries Streaming cannot use
            raise UserError(f"{storage.join(source, INDEX_NAME)} is not an MDS index Streaming can read "
                            f"({type(e).__name__}: {e}); {REBUILD}") from None
        try:
            if ds.num_samples != len(starts):
                raise UserError(f"verify failed: {source} holds {ds.num_samples} samples, expected {len(starts)} "
                                f"from {job.bin_path}; re-run with --overwrite")
            i = 0
            with tqdm(total=len(starts), unit="sample", unit_scale=True, desc=f"verify {job.name}",
                      disable=None) as bar:
                for part in chunks(starts, T):
                    x, y = read_windows(tokens, part, T)
                    for k in range(len(part)):
                        try:
                            sample = ds[i]
                        except ValueError as e:  # Streaming: checksum failure
                            raise UserError(f"verify failed: {source}: {e}; re-run with --overwrite") from None
                        for col, want in (("x", x[k]), ("y", y[k])):
                            got = np.asarray(sample[col])
                            if got.shape != want.shape or not np.array_equal(got, want):
                                raise UserError(f"verify failed: {source} sample {i} column {col} differs from "
                                                f"{job.bin_path}; re-run with --overwrite")
                        i += 1
                    bar.update(len(part))
        finally:
            del ds
    return len(starts)
