"""Turn prepare_data.py's token .bin files into MosaicML Streaming (MDS) shards of x/y samples.

Each sample has two columns, `x` and `y`, each `block_size` tokens, with y = x shifted by one token (the
autoregressive target). By default the windows are consecutive and non-overlapping: sample i is
tokens[i*T : i*T + T + 1] (x = its first T tokens, y = its last T), so every token of the .bin is an input
exactly once and the last incomplete window is dropped (the count is reported). zstd compression keeps
y almost free (it repeats x one token later), so the shards take about 1.2-2.0 bytes per token of the .bin
(tiny Shakespeare: 1.24; uncompressed x+y would be 4.0 for uint16).

Usage:
    # a prepare_data folder: every split present (train.bin, val.bin) -> OUT/train, OUT/val
    python to_mds.py --bin data/shakespeare --out mds/shakespeare --block-size 256
    # one .bin, written to OUT itself; also uploaded to S3 as it is written, then read back and checked
    python to_mds.py --bin data/pile/train.bin --out mds/pile_train --block-size 1024 \\
        --remote s3://my-bucket/pile/train --verify
    # straight to S3 with little local disk (no --out: shards are staged in a temp folder, then deleted)
    python to_mds.py --bin data/pile --remote s3://my-bucket/pile --block-size 1024
    # nanoGPT-style random windows instead (train split only; val stays sequential)
    python to_mds.py --bin data/shakespeare --out mds/rand --block-size 256 --sampling random \\
        --num-samples 100000 --seed 1337
    # check an existing dataset against its .bin (every sample, every token)
    python to_mds.py --bin data/shakespeare --out mds/shakespeare --verify
    # a bare .bin without meta.json
    python to_mds.py --bin tokens.bin --out mds/tokens --block-size 128 --dtype uint16 --vocab-size 50257

Output: OUT[/split]/index.json + shard.NNNNN.mds.zstd (the MDS dataset) + to_mds.json (how it was made:
block_size, dtype, vocab, sampling, source token count), so --verify needs no other flags later.

Safety: the dataset is written under OUT.tmp-<pid> and renamed into place when complete; an existing
dataset is replaced only with --overwrite, and only after the new one is complete. On S3, index.json is
uploaded after every shard; replacing an S3 dataset stages the new one under <remote>.tmp-<pid> first.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from common import (META_NAME, UserError, load_dotenv_file, read_meta, run_main, s3_endpoint_url,
                    setup_logging)

log = logging.getLogger("to_mds")

INDEX_NAME = "index.json"  # Streaming's index, written last
TO_MDS_META = "to_mds.json"  # how the dataset was made; lets --verify run without flags
SPLITS = ("train", "val")  # the splits of a prepare_data folder, in order
DEFAULT_COMPRESSION = "zstd"  # Streaming's zstd = level 3: ~1.25 bytes/token on text, y nearly free
DEFAULT_HASHES = "sha1,xxh64"  # shard checksums stored in index.json (StreamingDataset validate_hash)
DEFAULT_SIZE_LIMIT = "64mb"  # uncompressed bytes per shard
DEFAULT_SEED = 1337
CHUNK_TOKENS = 1 << 22  # tokens read from the memmap at a time (8 MB of uint16)
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")  # integer dtypes that MDS ndarray columns store


# ----------------------------------------------------------------------------------------------------------
# inputs


@dataclass
class SplitJob:
    """One .bin to convert into one MDS dataset."""
    name: str  # split name: "train", "val", or the .bin's stem
    bin_path: Path
    n_tokens: int
    sub: str  # subfolder of OUT / --remote holding this dataset ("" when OUT is the dataset itself)
    sampling: str  # "sequential" or "random"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="a .bin of tokens, or a prepare_data folder (train.bin, val.bin)")
    p.add_argument("--out", help="local output folder (required unless --remote)")
    p.add_argument("--block-size", type=int, help="tokens per sample T (x and y each hold T tokens)")
    p.add_argument("--remote", help="s3://bucket/prefix: upload shards there as they are written")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (else AWS_ENDPOINT_URL / S3_ENDPOINT_URL)")
    p.add_argument("--compression", default=DEFAULT_COMPRESSION,
                   help="Streaming compression, e.g. zstd, zstd:1 (faster), zstd:9, none (default: zstd)")
    p.add_argument("--hashes", default=DEFAULT_HASHES,
                   help="shard checksums stored in index.json, comma-separated, or none (default: sha1,xxh64)")
    p.add_argument("--size-limit", default=DEFAULT_SIZE_LIMIT, help="max uncompressed shard size (64mb)")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="threads compressing shards (default: CPU count, at most 8); output does not depend on it")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing dataset (once the new one is complete)")
    p.add_argument("--verify", action="store_true",
                   help="read the dataset back with StreamingDataset and compare every token with the .bin; "
                        "on an existing dataset (without --overwrite) only verify")
    p.add_argument("--sampling", choices=("sequential", "random"), default="sequential",
                   help="sequential: consecutive windows covering every token once (default); "
                        "random: nanoGPT-style random offsets (train split only)")
    p.add_argument("--num-samples", type=int, help="number of samples with --sampling random")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of --sampling random")
    p.add_argument("--dtype", help=f"token dtype of a bare .bin without meta.json ({', '.join(TOKEN_DTYPES)})")
    p.add_argument("--vocab-size", type=int, help="vocabulary size of a bare .bin without meta.json")
    return p.parse_args(argv)


def check_flags(args: argparse.Namespace) -> None:
    """Reject impossible flag combinations before touching any file."""
    if not args.out and not args.remote:
        raise UserError("give --out DIR (local dataset) and/or --remote s3://bucket/prefix")
    if args.block_size is not None and args.block_size < 1:
        raise UserError(f"--block-size {args.block_size} must be at least 1")
    if args.sampling == "random":
        if args.num_samples is None or args.num_samples < 1:
            raise UserError("--sampling random needs --num-samples N (N >= 1)")
    elif args.num_samples is not None:
        raise UserError("--num-samples only applies to --sampling random")
    if args.dtype is not None and args.dtype not in TOKEN_DTYPES:
        raise UserError(f"--dtype {args.dtype} is not supported; use one of {', '.join(TOKEN_DTYPES)}")
    if args.workers < 1:
        raise UserError(f"--workers {args.workers} must be at least 1")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise UserError(f"--vocab-size {args.vocab_size} must be at least 1")
    if args.remote:
        parse_s3_url(args.remote)  # raises UserError when malformed


def check_writer_flags(args: argparse.Namespace) -> None:
    """Check --compression, --hashes and --size-limit against Streaming (imported here: it is slow to import)."""
    from streaming.base.compression import get_compressions, is_compression
    from streaming.base.hashing import is_hash
    from streaming.base.util import bytes_to_int

    args.compression = None if args.compression.lower() in ("", "none") else args.compression
    if args.compression and not is_compression(args.compression):
        names = sorted({c.split(":")[0] for c in get_compressions()})
        raise UserError(f"--compression {args.compression} is unknown; use one of {', '.join(names)} "
                        f"(optionally name:level, e.g. zstd:1), or none")
    hashes = [] if args.hashes.lower() in ("", "none") else sorted({h.strip() for h in args.hashes.split(",")})
    for h in hashes:
        if not is_hash(h):
            raise UserError(f"--hashes: {h} is not a hash Streaming knows; try sha1, xxh64, md5")
    args.hashes = hashes
    try:
        args.size_limit_bytes = bytes_to_int(args.size_limit)
    except ValueError:
        raise UserError(f"--size-limit {args.size_limit} is not a size; write e.g. 64mb, 512kb, 1gb") from None
    if not 0 < args.size_limit_bytes < 2 ** 32:
        raise UserError(f"--size-limit {args.size_limit} must be between 1 byte and 4gb")


def token_settings(args: argparse.Namespace, meta: Optional[dict], meta_path: Path) -> tuple[np.dtype, int, dict]:
    """The dtype and vocab size of the tokens, from meta.json or (for a bare .bin) from the flags."""
    if meta is None:
        if args.dtype is None or args.vocab_size is None:
            raise UserError(f"{meta_path} not found: give --dtype (e.g. uint16) and --vocab-size (e.g. 50257) "
                            f"for a .bin that prepare_data.py did not write")
        dtype_name, vocab = args.dtype, args.vocab_size
    else:
        try:
            dtype_name, vocab = str(meta["dtype"]), int(meta["vocab_size"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{meta_path} lacks dtype/vocab_size; re-run prepare_data.py to rewrite it") from None
        for flag, given, known in (("--dtype", args.dtype, dtype_name), ("--vocab-size", args.vocab_size, vocab)):
            if given is not None and given != known:
                raise UserError(f"{flag} {given} disagrees with {meta_path} ({known}); drop the flag")
        if dtype_name not in TOKEN_DTYPES:
            raise UserError(f"{meta_path}: dtype {dtype_name} is not supported ({', '.join(TOKEN_DTYPES)})")
    dtype = np.dtype(dtype_name)
    if vocab - 1 > np.iinfo(dtype).max:
        raise UserError(f"vocab_size {vocab} does not fit in {dtype_name}; use --dtype uint32")
    info = {k: meta[k] for k in ("tokenizer", "eot_token") if meta and k in meta}
    return dtype, vocab, info


def count_tokens(path: Path, dtype: np.dtype, meta: Optional[dict], split: str, meta_path: Path) -> int:
    """Token count of a .bin, checked against its size and against meta.json."""
    if not path.is_file():
        raise UserError(f"{path} not found: pass a .bin written by prepare_data.py, or its folder")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise UserError(f"{path} is {size} bytes, not a multiple of {dtype.itemsize} ({dtype.name}): the file is "
                        f"truncated or not {dtype.name} tokens; re-run prepare_data.py or pass the right --dtype")
    n = size // dtype.itemsize
    expected = ((meta or {}).get("splits") or {}).get(split, {}).get("tokens")
    if expected is not None and int(expected) != n:
        raise UserError(f"{path} holds {n} tokens but {meta_path} says {expected}: the file is truncated or from "
                        f"another run; re-run prepare_data.py")
    return n


def resolve_inputs(args: argparse.Namespace) -> tuple[list[SplitJob], np.dtype, int, dict]:
    """The .bin files to convert (one, or each split of a prepare_data folder) and their token settings."""
    src = Path(args.bin)
    if src.is_dir():
        meta_path = src / META_NAME
        meta = read_meta(src) if meta_path.is_file() else None
        dtype, vocab, info = token_settings(args, meta, meta_path)
        listed = (meta or {}).get("splits") or {}
        jobs = []
        for split in SPLITS:
            path = src / str((listed.get(split) or {}).get("file", f"{split}.bin"))
            if split not in listed and not path.is_file():
                continue
            n = count_tokens(path, dtype, meta, split, meta_path)
            if n == 0:  # e.g. an input without validation documents
                log.warning("%s is empty: no %s dataset written", path, split)
                continue
            jobs.append(SplitJob(split, path, n, split, args.sampling if split == "train" else "sequential"))
        if not jobs:
            raise UserError(f"{src} holds no train.bin or val.bin: is it a folder written by prepare_data.py?")
    else:
        if not src.is_file():
            raise UserError(f"{src} not found: pass a .bin written by prepare_data.py, or its folder")
        meta_path = src.parent / META_NAME
        meta = read_meta(src.parent) if meta_path.is_file() else None
        dtype, vocab, info = token_settings(args, meta, meta_path)
        n = count_tokens(src, dtype, meta, src.stem, meta_path)
        jobs = [SplitJob(src.stem, src, n, "", args.sampling)]
    return jobs, dtype, vocab, info


# ----------------------------------------------------------------------------------------------------------
# windows: the one definition of "sample i", shared by the writer and --verify


def window_starts(spec: dict, n_tokens: int) -> np.ndarray:
    """Start offset of every sample's (T+1)-token window, in sample order."""
    T = spec["block_size"]
    if spec["sampling"] == "random":
        # nanoGPT: ix = randint(len(data) - block_size); x = data[i:i+T], y = data[i+1:i+1+T]
        rng = np.random.default_rng(spec["seed"])
        return rng.integers(0, n_tokens - T, size=spec["num_samples"], dtype=np.int64)
    return np.arange((n_tokens - 1) // T, dtype=np.int64) * T


def read_windows(tokens: np.ndarray, starts: np.ndarray, T: int, sequential: bool) -> tuple[np.ndarray, np.ndarray]:
    """x, y of the samples that start at `starts`: two (K, T) arrays in the .bin's dtype."""
    if sequential:  # consecutive windows: one contiguous read, x and y are two views of it
        block = np.array(tokens[starts[0]:starts[-1] + T + 1])
        return block[:-1].reshape(len(starts), T), block[1:].reshape(len(starts), T)
    w = tokens[starts[:, None] + np.arange(T + 1)]  # (K, T+1)
    return w[:, :-1], w[:, 1:]


def chunks(starts: np.ndarray, T: int):
    """Slices of `starts` holding about CHUNK_TOKENS tokens each."""
    step = max(1, CHUNK_TOKENS // T)
    for i in range(0, len(starts), step):
        yield starts[i:i + step]


# ----------------------------------------------------------------------------------------------------------
# S3


def parse_s3_url(url: str) -> tuple[str, str]:
    """s3://bucket/some/prefix -> ("bucket", "some/prefix")."""
    u = urllib.parse.urlparse(url)
    if u.scheme != "s3" or not u.netloc:
        raise UserError(f"--remote {url} is not an S3 URL; write s3://bucket/prefix")
    return u.netloc, u.path.strip("/")


def join_url(base: str, sub: str) -> str:
    return f"{base.rstrip('/')}/{sub}" if sub else base.rstrip("/")


class S3Dir:
    """The objects under one s3://bucket/prefix, seen as a folder of files."""

    def __init__(self, client, url: str):
        self.client, self.url = client, url.rstrip("/")
        self.bucket, self.prefix = parse_s3_url(url)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(name))
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def read(self, name: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()

    def names(self) -> list[str]:
        """Every object under the prefix, as names relative to it (sub/folders included)."""
        start = f"{self.prefix}/" if self.prefix else ""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
            out += [o["Key"][len(start):] for o in page.get("Contents", [])]
        return out

    def delete(self, names: Sequence[str]) -> None:
        names = list(names)
        for i in range(0, len(names), 1000):
            objs = [{"Key": self.key(n)} for n in names[i:i + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objs, "Quiet": True})

    def copy_from(self, other: "S3Dir", name: str) -> None:
        self.client.copy_object(Bucket=self.bucket, Key=self.key(name),
                                CopySource={"Bucket": other.bucket, "Key": other.key(name)})


def s3_client(endpoint_url: Optional[str], remote: str):
    """A boto3 client for `remote`'s bucket; a UserError when credentials or the bucket are wrong."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    client = boto3.client("s3", endpoint_url=endpoint_url)
    bucket, _ = parse_s3_url(remote)
    try:
        client.head_bucket(Bucket=bucket)
    except NoCredentialsError:
        raise UserError("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or put them "
                        "in .env), or configure an AWS profile") from None
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        raise UserError(f"cannot use bucket {bucket} ({code}): check that it exists, the credentials, and "
                        f"--endpoint-url") from None
    except BotoCoreError as e:
        raise UserError(f"cannot reach S3 for {remote} ({e}); check --endpoint-url and the network") from None
    return client


def remove_stale_shards(target: S3Dir, keep: set[str]) -> None:
    """Delete shard files under `target` that its index does not list (left by an interrupted run)."""
    stale = [n for n in target.names() if "/" not in n and n.startswith("shard.") and n not in keep]
    if stale:
        target.delete(stale)


def promote_remote(staging: S3Dir, final: S3Dir) -> None:
    """Replace the dataset at `final` with the complete one at `staging` (server-side copies).

    The old index.json goes first, so no reader ever pairs an index with shards of another dataset; the new
    index.json comes last, once every file it names is in place.
    """
    names = [n for n in staging.names() if "/" not in n]
    final.delete([INDEX_NAME])
    for name in names:
        if name != INDEX_NAME:
            final.copy_from(staging, name)
    final.copy_from(staging, INDEX_NAME)
    remove_stale_shards(final, set(names))
    staging.delete(names)


# ----------------------------------------------------------------------------------------------------------
# writing


def _writer_class():
    """Streaming's MDSWriter with three changes for fixed-size x/y samples; the files it writes are the same.

    - index.json is written (and uploaded) only after every shard and extra file. Streaming 0.13 waits only
      until its upload queue is empty, so shard uploads still running could land after the index and a
      reader could find an index that names missing shards.
    - Shards are compressed, hashed and written by `workers` threads (zstd and hashlib release the GIL)
      while the next shard is filled; each shard is still compressed alone, so the bytes do not depend on
      the number of workers.
    - Samples are encoded without re-parsing the column encodings each time (3/4 of the run time before).
    """
    from concurrent.futures import FIRST_COMPLETED, wait

    from streaming import MDSWriter

    class PipelinedMDSWriter(MDSWriter):
        def __init__(self, *, extra_files: dict[str, bytes], workers: int, **kwargs):
            super().__init__(**kwargs)
            assert self.column_names == ["x", "y"] and None not in self.column_sizes
            self.extra_files = extra_files
            self.sample_bytes = sum(self.column_sizes)
            self.workers = workers
            self.pool = ThreadPoolExecutor(max_workers=workers)
            self.pending = []  # futures of shards being compressed and written
            self.upload_error: Optional[BaseException] = None

        def exception_callback(self, future) -> None:
            if future.exception() is not None and self.upload_error is None:
                self.upload_error = future.exception()  # the first failure, for the one-line error
            super().exception_callback(future)

        def encode_sample(self, sample: dict) -> bytes:
            # MDSWriter's bytes: columns in sorted order; fixed-size columns need no size header.
            data = sample["x"].tobytes() + sample["y"].tobytes()
            assert len(data) == self.sample_bytes
            return data

        def flush_shard(self) -> None:
            raw_name, zip_name = self._name_next_shard()
            entry = {"samples": len(self.new_samples), **self.get_config()}
            self.shards.append(entry)  # its place (and number) is taken now, its file info comes later
            self.pending.append(self.pool.submit(self._store_shard, entry, self.encode_joint_shard(),
                                                 raw_name, zip_name))
            while len(self.pending) > self.workers:  # bound memory: at most `workers` shards in flight
                done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
                for f in done:
                    f.result()  # raises what the worker raised
                self.pending = [f for f in self.pending if f not in done]

        def _store_shard(self, entry: dict, raw: bytes, raw_name: str, zip_name: Optional[str]) -> None:
            raw_info, zip_info = self._process_file(raw, raw_name, zip_name)
            entry.update(raw_data=raw_info, zip_data=zip_info)
            future = self.executor.submit(self.cloud_writer.upload_file, zip_name or raw_name)
            future.add_done_callback(self.exception_callback)

        def _write_index(self) -> None:
            for f in self.pending:
                f.result()
            self.pool.shutdown(wait=True)
            self.executor.shutdown(wait=True)  # every shard upload finished
            if self.event.is_set():
                raise RuntimeError(f"a shard upload failed: {self.upload_error!r}")
            for name, data in self.extra_files.items():
                Path(self.local, name).write_bytes(data)
                if self.remote:
                    self.cloud_writer.upload_file(name)
            self.executor = ThreadPoolExecutor(max_workers=1)
            super()._write_index()

        def abort(self) -> None:
            """Stop after an error: wait for running threads, start nothing new."""
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.executor.shutdown(wait=True, cancel_futures=True)

    return PipelinedMDSWriter


def write_split(job: SplitJob, spec: dict, local: Path, remote: Optional[str], keep_local: bool,
                args: argparse.Namespace, dtype: np.dtype, vocab: int) -> dict:
    """Write one MDS dataset (x/y samples of job.bin_path) into `local` (and upload it to `remote`)."""
    from tqdm import tqdm

    T = spec["block_size"]
    tokens = np.memmap(job.bin_path, dtype=dtype, mode="r")
    starts = window_starts(spec, job.n_tokens)
    column = f"ndarray:{dtype.name}:{T}"
    meta_bytes = (json.dumps(spec, indent=1, sort_keys=True) + "\n").encode()
    writer = _writer_class()(
        columns={"x": column, "y": column}, out=(str(local), remote) if remote else str(local),
        keep_local=keep_local, compression=args.compression, hashes=args.hashes,
        size_limit=args.size_limit_bytes, extra_files={TO_MDS_META: meta_bytes}, workers=args.workers)
    sample_bytes = 2 * T * dtype.itemsize + writer.extra_bytes_per_sample
    if sample_bytes + writer.extra_bytes_per_shard > args.size_limit_bytes:
        writer.abort()
        raise UserError(f"--size-limit {args.size_limit} is smaller than one sample "
                        f"({sample_bytes + writer.extra_bytes_per_shard} bytes with --block-size {T}); raise it")
    t0 = time.time()
    done = False
    try:
        with tqdm(total=len(starts), unit="sample", unit_scale=True, desc=f"to_mds {job.name}",
                  disable=None) as bar:
            for part in chunks(starts, T):
                x, y = read_windows(tokens, part, T, spec["sampling"] == "sequential")
                check_range(x, y, part, job.bin_path, vocab)
                for k in range(len(part)):
                    writer.write({"x": x[k], "y": y[k]})
                bar.update(len(part))
        writer.finish()
        done = True
    except Exception as e:
        if remote and writer.event.is_set():  # an upload thread failed
            cause = writer.upload_error or e
            raise UserError(f"uploading to {remote} failed ({type(cause).__name__}: {cause}); nothing was "
                            f"published") from None
        raise
    finally:
        if not done:
            writer.abort()
            if remote:  # shards already uploaded are no dataset without index.json; remove them anyway
                from streaming.base.compression import get_compression_extension

                ext = f".{get_compression_extension(args.compression)}" if args.compression else ""
                uploaded = [f"shard.{i:05}.mds{ext}" for i in range(len(writer.shards))]
                try:
                    S3Dir(s3_client(s3_endpoint_url(args.endpoint_url), remote), remote).delete(uploaded)
                except Exception as e:  # best effort; a re-run removes them too
                    log.warning("could not remove partial upload from %s: %s", remote, e)
    shard_bytes = sum((s["zip_data"] or s["raw_data"])["bytes"] for s in writer.shards)
    index_bytes = len(json.dumps({"version": 2, "shards": writer.shards}, sort_keys=True))
    files = {(s["zip_data"] or s["raw_data"])["basename"] for s in writer.shards} | {INDEX_NAME, TO_MDS_META}
    return {"samples": len(starts), "shards": len(writer.shards), "files": files,
            "bytes": shard_bytes + index_bytes + len(meta_bytes), "seconds": time.time() - t0}


def check_range(x: np.ndarray, y: np.ndarray, starts: np.ndarray, path: Path, vocab: int) -> None:
    """UserError naming the first token id outside [0, vocab) in these windows (x, plus y's last token)."""
    for arr, shift in ((x, 0), (y[:, -1:], x.shape[1])):
        bad = (arr >= vocab) | (arr < 0) if arr.dtype.kind == "i" else arr >= vocab
        if bad.any():
            k, j = np.argwhere(bad)[0]
            raise UserError(f"{path}: token id {arr[k, j]} at position {starts[k] + j + shift} is out of range "
                            f"for vocab_size {vocab}; was the .bin written with another tokenizer? re-run "
                            f"prepare_data.py (or pass the right --vocab-size for a bare .bin)")


def make_spec(job: SplitJob, args: argparse.Namespace, dtype: np.dtype, vocab: int, info: dict) -> dict:
    """The contents of to_mds.json: everything --verify needs to recompute every sample."""
    T = args.block_size
    if job.n_tokens < T + 1:
        raise UserError(f"{job.bin_path} holds {job.n_tokens} tokens, too few for --block-size {T} (a sample "
                        f"needs {T + 1}); use a smaller --block-size")
    random = job.sampling == "random"
    n_samples = args.num_samples if random else (job.n_tokens - 1) // T
    return {
        "version": 1, "block_size": T, "dtype": dtype.name, "vocab_size": vocab, **info,
        "columns": {"x": f"ndarray:{dtype.name}:{T}", "y": f"ndarray:{dtype.name}:{T}"},
        "sampling": job.sampling, "num_samples": n_samples, "seed": args.seed if random else None,
        "source": {"file": job.bin_path.name, "tokens": job.n_tokens},
        "dropped_tail_tokens": 0 if random else job.n_tokens - n_samples * T - 1,
    }


# ----------------------------------------------------------------------------------------------------------
# local publish


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_local(out: Path) -> None:
    """Remove OUT.tmp-<pid> folders of runs that died; put back an OUT.old-<pid> a dead run had moved aside."""
    if not out.parent.is_dir():
        return
    for p in sorted(out.parent.glob(f"{out.name}.old-*")) + sorted(out.parent.glob(f"{out.name}.tmp-*")):
        pid = p.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        if p.name.startswith(f"{out.name}.old-") and not out.exists():
            os.rename(p, out)  # killed between moving the old dataset aside and renaming the new one in
            log.warning("restored %s from %s left by an interrupted run", out, p)
        else:
            shutil.rmtree(p, ignore_errors=True)


def is_dataset_dir(path: Path) -> bool:
    """True for a folder to_mds.py (or any MDS writer) produced: index.json in it or in its split folders."""
    return (path / INDEX_NAME).is_file() or (path / TO_MDS_META).is_file() or any(
        (path / s / INDEX_NAME).is_file() for s in SPLITS)


def local_exists(out: Path) -> bool:
    """Whether OUT holds something that --overwrite would replace (an empty folder does not count)."""
    if out.is_file():
        raise UserError(f"--out {out} is a file; give a folder path")
    return out.is_dir() and any(out.iterdir())


def fsync_tree(root: Path) -> None:
    """Flush the files under `root` to disk, so the rename below never publishes empty files after a crash."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish_local(staging: Path, out: Path, overwrite: bool) -> None:
    """Rename the complete dataset `staging` to `out`; an old one there is moved aside, then deleted."""
    fsync_tree(staging)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if out.exists():
        if not overwrite:  # another run published meanwhile
            raise UserError(f"{out} appeared while converting; pass --overwrite to replace it")
        old = out.with_name(f"{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(staging, out)
        shutil.rmtree(old)
    else:
        os.rename(staging, out)


# ----------------------------------------------------------------------------------------------------------
# verify


def read_dataset_file(source: str, name: str, client) -> Optional[bytes]:
    """The bytes of file `name` of the dataset at `source` (folder or s3://), or None when it is missing."""
    if source.startswith("s3://"):
        target = S3Dir(client, source)
        return target.read(name) if target.exists(name) else None
    path = Path(source, name)
    return path.read_bytes() if path.is_file() else None


def load_spec(source: str, client, args: argparse.Namespace, job: SplitJob, dtype: np.dtype) -> dict:
    """to_mds.json of an existing dataset (or, for one made elsewhere, a sequential spec from the flags)."""
    if read_dataset_file(source, INDEX_NAME, client) is None:
        raise UserError(f"{source} has no {INDEX_NAME}: not an MDS dataset; convert it first (without --verify "
                        f"on an existing folder, or with --overwrite)")
    data = read_dataset_file(source, TO_MDS_META, client)
    if data is not None:
        spec = json.loads(data)
    elif args.block_size is None:
        raise UserError(f"{source} has no {TO_MDS_META}; pass --block-size to verify it")
    else:  # an MDS folder some other tool wrote: assume this script's default windows
        spec = {"block_size": args.block_size, "sampling": "sequential", "dtype": dtype.name,
                "num_samples": (job.n_tokens - 1) // args.block_size, "source": {"tokens": job.n_tokens}}
    if args.block_size is not None and args.block_size != spec["block_size"]:
        raise UserError(f"--block-size {args.block_size} differs from {source} (block_size "
                        f"{spec['block_size']}); drop the flag, or use --overwrite to rebuild")
    if spec["source"]["tokens"] != job.n_tokens:
        raise UserError(f"{source} was made from {spec['source']['tokens']} tokens but {job.bin_path} now holds "
                        f"{job.n_tokens}; re-run with --overwrite")
    return spec


def verify_split(source: str, job: SplitJob, spec: dict, dtype: np.dtype, client) -> int:
    """Read the dataset at `source` (folder or s3://) with StreamingDataset; compare every sample with the .bin.

    Shards are copied into a fresh temporary cache, so the dataset folder itself is never modified (with
    remote=None, Streaming would decompress shards inside it) and the cache's shared memory names are unique.
    """
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from tqdm import tqdm

    T = spec["block_size"]
    tokens = np.memmap(job.bin_path, dtype=dtype, mode="r")
    starts = window_starts(spec, job.n_tokens)
    index = json.loads(read_dataset_file(source, INDEX_NAME, client))
    hashes = index["shards"][0].get("hashes") or [] if index["shards"] else []
    clean_stale_shared_memory()
    with tempfile.TemporaryDirectory(prefix="to_mds_verify_") as cache:
        check = "xxh64" if "xxh64" in hashes else (hashes[0] if hashes else None)  # xxh64: the fastest
        ds = StreamingDataset(remote=source, local=cache, shuffle=False, batch_size=1, validate_hash=check)
        try:
            if ds.num_samples != len(starts):
                raise UserError(f"verify failed: {source} holds {ds.num_samples} samples, expected {len(starts)} "
                                f"from {job.bin_path}; re-run with --overwrite")
            i = 0
            with tqdm(total=len(starts), unit="sample", unit_scale=True, desc=f"verify {job.name}",
                      disable=None) as bar:
                for part in chunks(starts, T):
                    x, y = read_windows(tokens, part, T, spec["sampling"] == "sequential")
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


# ----------------------------------------------------------------------------------------------------------
# main


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    setup_logging(logging.WARNING)
    load_dotenv_file()
    check_flags(args)
    jobs, dtype, vocab, info = resolve_inputs(args)
    check_writer_flags(args)
    out = Path(args.out) if args.out else None
    endpoint = s3_endpoint_url(args.endpoint_url)
    if endpoint:  # Streaming's S3 uploader and downloader read S3_ENDPOINT_URL only
        os.environ["S3_ENDPOINT_URL"] = endpoint
    client = s3_client(endpoint, args.remote) if args.remote else None

    if out is not None:
        clean_stale_local(out)
    exists_local = out is not None and local_exists(out)
    exists_remote = client is not None and any(
        S3Dir(client, join_url(args.remote, j.sub)).exists(INDEX_NAME) for j in jobs)
    if exists_local and not is_dataset_dir(out):
        raise UserError(f"--out {out} exists and is not an MDS dataset (no {INDEX_NAME}); choose another folder")
    if (exists_local or exists_remote) and not args.overwrite:
        if not args.verify:
            where = out if exists_local else args.remote
            raise UserError(f"{where} already holds a dataset; pass --overwrite to replace it, or --verify to "
                            f"check it")
        return verify_all(args, jobs, dtype, client, out if exists_local else None,
                          args.remote if exists_remote else None)
    if args.block_size is None:
        raise UserError("--block-size is required to convert (e.g. --block-size 1024)")

    specs = [make_spec(j, args, dtype, vocab, info) for j in jobs]  # validates sizes before writing anything
    pid = os.getpid()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_name(f"{out.name}.tmp-{pid}")
    else:
        staging = Path(tempfile.mkdtemp(prefix="to_mds_stage_"))
    remote_stage = None
    if exists_remote:  # never touch the old S3 dataset before the new one is complete
        bucket, prefix = parse_s3_url(args.remote)
        remote_stage = f"{args.remote.rstrip('/')}.tmp-{pid}" if prefix else f"s3://{bucket}/to_mds.tmp-{pid}"
    published = False
    written = []  # (S3Dir, files) of splits already complete on S3, withdrawn if a later split fails
    try:
        results = []
        for job, spec in zip(jobs, specs):
            remote = join_url(remote_stage or args.remote, job.sub) if args.remote else None
            res = write_split(job, spec, staging / job.sub if job.sub else staging, remote,
                              keep_local=out is not None, args=args, dtype=dtype, vocab=vocab)
            if args.remote and not remote_stage:
                remove_stale_shards(S3Dir(client, remote), res["files"])
                written.append((S3Dir(client, remote), res["files"]))
            results.append(res)
        if remote_stage:
            for job in jobs:
                promote_remote(S3Dir(client, join_url(remote_stage, job.sub)),
                               S3Dir(client, join_url(args.remote, job.sub)))
        if out is not None:
            publish_local(staging, out, args.overwrite)
        published = True
    finally:
        if not published or out is None:
            shutil.rmtree(staging, ignore_errors=True)
        if not published and args.remote:
            try:
                if remote_stage:
                    S3Dir(client, remote_stage).delete(S3Dir(client, remote_stage).names())
                for target, files in written:  # all splits or none: withdraw the index first
                    target.delete([INDEX_NAME])
                    target.delete(sorted(files - {INDEX_NAME}))
            except Exception as e:  # best effort
                log.warning("could not remove the partial upload from %s: %s", args.remote, e)

    for job, spec, res in zip(jobs, specs, results):
        where = " and ".join(str(w) for w in (
            (out / job.sub if job.sub else out) if out is not None else None,
            join_url(args.remote, job.sub) if args.remote else None) if w)
        mb = res["bytes"] / 1e6
        print(f"{job.name}: {res['samples']:,} samples of {spec['block_size']} tokens ({spec['sampling']}) -> "
              f"{res['shards']} shard(s), {mb:.2f} MB, {res['bytes'] / job.n_tokens:.3f} bytes/token of "
              f"{job.bin_path.name} ({job.n_tokens:,} tokens, {spec['dropped_tail_tokens']} tail tokens dropped), "
              f"{job.n_tokens * dtype.itemsize / 1e6 / max(res['seconds'], 1e-9):.1f} MB/s -> {where}")
    if args.verify:
        return verify_all(args, jobs, dtype, client, out, args.remote)
    return 0


def verify_all(args: argparse.Namespace, jobs: list[SplitJob], dtype: np.dtype, client, out: Optional[Path],
               remote: Optional[str]) -> int:
    """--verify: read back each split's dataset (local and/or S3) and compare it with its .bin."""
    for job in jobs:
        sources = []
        if out is not None:
            sources.append(str(out / job.sub if job.sub else out))
        if remote:
            sources.append(join_url(remote, job.sub))
        for source in sources:
            spec = load_spec(source, client, args, job, dtype)
            n = verify_split(source, job, spec, dtype, client)
            print(f"verified {source}: {n:,} samples, every token matches {job.bin_path}")
    return 0


if __name__ == "__main__":
    run_main(main)
