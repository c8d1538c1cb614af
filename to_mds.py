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
    # one .bin, written to OUT itself by 16 processes; then uploaded to S3 (index.json last), read back, checked
    python to_mds.py --bin data/pile/train.bin --out mds/pile_train --block-size 1024 --num-proc 16 \\
        --remote s3://my-bucket/pile/train --verify
    # straight to S3 (no --out: written to a temp folder under TMPDIR, uploaded, then deleted)
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
The shards are written by Streaming's MDSWriter; the contracts shared with the other stages (meta.json, the
window, the columns, the names) come from data.py, and every S3 request goes through storage.py.

Parallelism: --num-proc N processes convert one .bin into one dataset. The samples are cut into the shards one
MDSWriter would write (every shard but the last holds size_limit // sample size samples), each process writes
whole shards with an MDSWriter of its own, and the shards are then named and indexed in order: the same files,
byte for byte, for any N (N = 1 converts in this process). The default is the CPU count, at most 8; each
process peaks at about four shards' worth of memory (+270 MB with 64mb shards). --workers, the name of the flag
when shards were compressed on threads of one process, is kept as an alias of --num-proc: processes also run
the ~1/3 of the work that holds Python's lock in parallel, which caps threads near 3x however many cores there
are. bench/bench_to_mds.py on 2 idle cores, block size 1024: 1 process 62 MB/s of .bin, 2 processes 119 MB/s
(1.93x; the threads did as well on 2 cores), one process 8% faster than before (numpy encodes the samples).

Safety: the dataset is written under OUT.tmp-<pid> and renamed into place when complete; an existing
dataset is replaced only with --overwrite, and only after the new one is complete. The --num-proc processes
end with the run, even a killed one (on Linux), so none writes on into a folder a later run cleans up. With
--remote, the complete dataset is uploaded by storage.upload_folder: every index.json after every shard, so a
reader never sees a half-uploaded dataset, and a failed upload is removed again (all splits or none). Replacing
an S3 dataset uploads the new one under <remote>.tmp-<pid> first and swaps it in with server-side copies.
Without --out the temp folder needs room for the whole dataset (~1.2-2 bytes per token of the .bin).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import logging
import multiprocessing
import os
import posixpath
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from pilegpt import storage
from pilegpt.common import UserError, load_dotenv_file, run_main, setup_logging
from pilegpt.data import (
    INDEX_NAME,
    META_NAME,
    SPLITS,
    TO_MDS_META,
    TOKEN_DTYPES,
    Meta,
    check_token_range,
    count_tokens,
    mds_columns,
    read_windows,
    window_starts,
)
from pilegpt.storage import S3Dir

log = logging.getLogger("to_mds")

DEFAULT_COMPRESSION = "zstd"  # Streaming's zstd = level 3: ~1.25 bytes/token on text, y nearly free
DEFAULT_HASHES = "sha1,xxh64"  # shard checksums stored in index.json (StreamingDataset validate_hash)
DEFAULT_SIZE_LIMIT = "64mb"  # uncompressed bytes per shard
DEFAULT_SEED = 1337
CHUNK_TOKENS = 1 << 22  # tokens read from the memmap at a time (8 MB of uint16)
DEFAULT_NUM_PROC = min(8, os.cpu_count() or 1)  # each process peaks at ~4 shards' worth of memory (+270 MB at 64mb)


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
    p.add_argument("--remote", help="s3://bucket/prefix: upload the dataset there once it is written")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (else AWS_ENDPOINT_URL / S3_ENDPOINT_URL)")
    p.add_argument("--compression", default=DEFAULT_COMPRESSION,
                   help="Streaming compression, e.g. zstd, zstd:1 (faster), zstd:9, none (default: zstd)")
    p.add_argument("--hashes", default=DEFAULT_HASHES,
                   help="shard checksums stored in index.json, comma-separated, or none (default: sha1,xxh64)")
    p.add_argument("--size-limit", default=DEFAULT_SIZE_LIMIT, help="max uncompressed shard size (64mb)")
    p.add_argument("--num-proc", "--workers", dest="num_proc", type=int, default=DEFAULT_NUM_PROC,
                   help=f"processes converting shards (default: CPU count, at most 8, here {DEFAULT_NUM_PROC}); "
                        "the output does not depend on it. --workers is the older name")
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
    if args.num_proc < 1:
        raise UserError(f"--num-proc {args.num_proc} must be at least 1")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise UserError(f"--vocab-size {args.vocab_size} must be at least 1")
    if args.remote:
        storage.parse_s3_url(args.remote)  # raises UserError when malformed


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


def token_settings(args: argparse.Namespace, meta: Optional[Meta], meta_path: Path) -> tuple[np.dtype, int, dict]:
    """The dtype and vocab size of the tokens, from meta.json or (for a bare .bin) from the flags."""
    if meta is None:
        if args.dtype is None or args.vocab_size is None:
            raise UserError(f"{meta_path} not found: give --dtype (e.g. uint16) and --vocab-size (e.g. 50257) "
                            f"for a .bin that prepare_data.py did not write")
        dtype_name, vocab, info = args.dtype, args.vocab_size, {}
    else:
        dtype_name, vocab = meta.dtype, meta.vocab_size
        info = {"tokenizer": meta.tokenizer, "eot_token": meta.eot_token}
        for flag, given, known in (("--dtype", args.dtype, dtype_name), ("--vocab-size", args.vocab_size, vocab)):
            if given is not None and given != known:
                raise UserError(f"{flag} {given} disagrees with {meta_path} ({known}); drop the flag")
    dtype = np.dtype(dtype_name)
    if vocab - 1 > np.iinfo(dtype).max:
        raise UserError(f"vocab_size {vocab} does not fit in {dtype_name}; use --dtype uint32")
    return dtype, vocab, info


def resolve_inputs(args: argparse.Namespace) -> tuple[list[SplitJob], np.dtype, int, dict]:
    """The .bin files to convert (one, or each split of a prepare_data folder) and their token settings."""
    src = Path(args.bin)
    if src.is_dir():
        meta_path = src / META_NAME
        meta = Meta.read(src) if meta_path.is_file() else None
        dtype, vocab, info = token_settings(args, meta, meta_path)
        jobs = []
        for split in SPLITS:
            listed = meta.splits.get(split) if meta else None
            path = src / (listed.file if listed else f"{split}.bin")
            if listed is None and not path.is_file():
                continue
            n = count_tokens(path, dtype, expected=listed.tokens if listed else None)
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
        meta = Meta.read(src.parent) if meta_path.is_file() else None
        dtype, vocab, info = token_settings(args, meta, meta_path)
        listed = meta.splits.get(src.stem) if meta else None
        n = count_tokens(src, dtype, expected=listed.tokens if listed else None)
        jobs = [SplitJob(src.stem, src, n, "", args.sampling)]
    return jobs, dtype, vocab, info


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
        "columns": mds_columns(dtype.name, T),
        "sampling": job.sampling, "num_samples": n_samples, "seed": args.seed if random else None,
        "source": {"file": job.bin_path.name, "tokens": job.n_tokens},
        "dropped_tail_tokens": 0 if random else job.n_tokens - n_samples * T - 1,
    }


def spec_starts(spec: dict, n_tokens: int) -> np.ndarray:
    """Start offset of every sample's window, as to_mds.json describes them (data.window_starts)."""
    return window_starts(n_tokens, spec["block_size"], spec["sampling"], spec.get("num_samples") or 0,
                         spec.get("seed") or 0)


def chunks(starts: np.ndarray, T: int):
    """Slices of `starts` holding about CHUNK_TOKENS tokens each."""
    step = max(1, CHUNK_TOKENS // T)
    for i in range(0, len(starts), step):
        yield starts[i:i + step]


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------------------------------------
# writing


@dataclass
class Written:
    """What write_split wrote: one MDS dataset."""
    samples: int
    shards: int
    bytes: int  # every file of the dataset: shards, index.json, to_mds.json
    seconds: float


@dataclass
class ShardTask:
    """Shard number j of a dataset: everything a process needs to write it (sent to it, so plain data)."""
    j: int
    starts: np.ndarray  # the start offset of each of its samples' windows, in order
    bin_path: Path
    dtype: str
    vocab: int
    block_size: int
    writer: dict  # MDSWriter settings: columns, compression, hashes, size_limit
    local: Path  # the dataset folder: the shard is written in local/.shard-j, then moved up as local/shard.j.*


@functools.cache
def window_writer_class():
    """MDSWriter for samples that come encoded already (see write_shard); made on first use, as Streaming is slow
    to import."""
    from streaming import MDSWriter

    class WindowWriter(MDSWriter):
        def encode_sample(self, sample: bytes) -> bytes:
            return sample

    return WindowWriter


def write_shard(task: ShardTask) -> dict:
    """Write one shard with a Streaming MDSWriter of its own; return its one-shard index (naming it shard.j.*).

    The writer is the public MDSWriter, given each sample as the bytes its encode_sample would make of x and y (two
    fixed-size ndarray columns encode as x.tobytes() + y.tobytes()): numpy lays out 8 MB of samples at once, and
    Python does one call per sample rather than ~10 (the encoding took half of the time outside compressing and
    hashing: -15% per shard at --block-size 256, -5% at 1024). The first sample of every shard is checked against
    MDSWriter's own encoding.
    """
    from streaming import MDSWriter

    T = task.block_size
    tokens = np.memmap(task.bin_path, dtype=task.dtype, mode="r")
    part = task.local / f".shard-{task.j:05}"
    writer = window_writer_class()(out=str(part), **task.writer)
    try:
        for c, chunk in enumerate(chunks(task.starts, T)):
            x, y = read_windows(tokens, chunk, T)
            check_token_range(x, y, chunk, task.bin_path, task.vocab)
            xy = np.concatenate((x, y), axis=1)  # (K, 2T): sample k = x[k] then y[k]
            if c == 0:  # Streaming's own encoding of the shard's first sample: the same bytes
                assert xy[0].tobytes() == MDSWriter.encode_sample(writer, {"x": x[0], "y": y[0]})
            for sample in xy:
                writer.write(sample.tobytes())
        writer.finish()
    except BaseException:
        writer.cancel_future_jobs()
        raise
    index = json.loads((part / INDEX_NAME).read_text())
    (entry,) = index["shards"]  # one shard, named shard.00000.mds[.zstd]: renamed shard.{j:05}.mds[.zstd]
    for info in (entry["raw_data"], entry["zip_data"]):
        if info is not None:
            name = f"shard.{task.j:05}.{info['basename'].split('.', 2)[2]}"
            if (part / info["basename"]).is_file():  # only the compressed file is kept when compressing
                os.rename(part / info["basename"], task.local / name)
            info["basename"] = name
    shutil.rmtree(part)
    return index


def start_worker(parent: int) -> None:
    """Set up a process of the pool: Ctrl-C is the parent's to handle (it stops the pool), and on Linux the
    process dies with the parent, so a killed run leaves no process writing into its folder."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1  # from linux/prctl.h
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def write_split(job: SplitJob, spec: dict, local: Path, args: argparse.Namespace, dtype: np.dtype,
                vocab: int) -> Written:
    """Write one MDS dataset (x/y samples of job.bin_path, as `spec` says) into the new folder `local`.

    The samples are cut into the shards one MDSWriter would write (with samples of one size, every shard but the
    last holds the same number), and shard j is written by a Streaming MDSWriter of its own (write_shard) on one of
    --num-proc processes, then named and indexed as one MDSWriter would have done: the same files, byte for byte,
    whatever --num-proc is. Processes run all of the work in parallel, the ~1/3 that holds Python's lock included.
    """
    from streaming import MDSWriter
    from tqdm import tqdm

    T = spec["block_size"]
    starts = spec_starts(spec, job.n_tokens)
    settings = dict(columns=spec["columns"], compression=args.compression, hashes=args.hashes,
                    size_limit=args.size_limit_bytes)
    t0 = time.perf_counter()
    probe = MDSWriter(out=str(local), **settings)  # makes the folder; only its size bookkeeping is read
    probe.cancel_future_jobs()
    sample_bytes = 2 * T * dtype.itemsize + probe.extra_bytes_per_sample
    if sample_bytes + probe.extra_bytes_per_shard > args.size_limit_bytes:
        raise UserError(f"--size-limit {args.size_limit} is smaller than one sample "
                        f"({sample_bytes + probe.extra_bytes_per_shard} bytes with --block-size {T}); raise it")
    # MDSWriter starts a new shard when the next sample would take this one past size_limit: with samples of one
    # size, every shard but the last holds the same number of them.
    per_shard = (args.size_limit_bytes - probe.extra_bytes_per_shard) // sample_bytes
    n_shards = -(-len(starts) // per_shard)
    tasks = (ShardTask(j, starts[j * per_shard:(j + 1) * per_shard], job.bin_path, dtype.name, vocab, T, settings,
                       local) for j in range(n_shards))
    n_proc = min(args.num_proc, n_shards)
    pool = None
    if n_proc > 1:  # fork: the processes start at once with Streaming imported (a fresh interpreter takes seconds);
        # made before the progress bar starts its monitor thread, as fork copies only the calling thread
        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        pool = context.Pool(n_proc, initializer=start_worker, initargs=(os.getpid(),))
    indexes = []
    try:
        with tqdm(total=len(starts), unit="sample", unit_scale=True, desc=f"to_mds {job.name}", disable=None) as bar:
            for index in (pool.imap(write_shard, tasks) if pool else map(write_shard, tasks)):  # in shard order
                indexes.append(index)
                bar.update(index["shards"][0]["samples"])
        if pool:
            pool.close()
    except BaseException:
        if pool:
            pool.terminate()  # stop the other shards now; the caller removes the folder
        raise
    finally:
        if pool:
            pool.join()
    index = dict(indexes[0], shards=[i["shards"][0] for i in indexes])
    with open(local / INDEX_NAME, "w") as f:  # as MDSWriter writes it
        json.dump(index, f, sort_keys=True)
    (local / TO_MDS_META).write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    return Written(len(starts), len(indexes), folder_bytes(local), time.perf_counter() - t0)


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
# S3 publish


def names_below(names: list[str], sub: str) -> set[str]:
    """The names in `names` that lie in folder `sub`, relative to it ("" = all of them)."""
    return {n[len(sub) + 1:] for n in names if n.startswith(sub + "/")} if sub else set(names)


def remove_stale_shards(target: S3Dir, keep: set[str]) -> None:
    """Delete shard files under `target` that its index does not list (left by an interrupted run)."""
    stale = [n for n in target.names() if "/" not in n and n.startswith("shard.") and n not in keep]
    if stale:
        target.delete(stale)


def withdraw(target: S3Dir, names: list[str]) -> None:
    """Delete these objects under `target`, every index.json first: no reader finds a dataset missing shards."""
    target.delete([n for n in names if posixpath.basename(n) == INDEX_NAME])
    target.delete([n for n in names if posixpath.basename(n) != INDEX_NAME])


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


def publish_remote(staging: Path, remote: S3Dir, jobs: list[SplitJob], replace: bool) -> str:
    """Upload the complete dataset(s) in `staging` to `remote`, index.json last; return the upload's summary.

    With `replace` (a dataset is there already) the new one goes to <remote>.tmp-<pid> first and is then swapped
    in, so the old one stays whole until the new one is complete on S3. A failure removes what was uploaded.
    """
    pid = os.getpid()
    target = remote
    if replace:
        stage_url = f"{remote.url}.tmp-{pid}" if remote.prefix else f"{remote.url}/to_mds.tmp-{pid}"
        target = S3Dir(stage_url, remote.client)
    names = [f.rel for f in storage.collect_files(staging).files]
    try:
        result = storage.upload_folder(staging, target.url, client=remote.client)
        if replace:
            for job in jobs:
                promote_remote(target.child(job.sub), remote.child(job.sub))
        else:
            for job in jobs:  # shards a killed run left beside the new dataset
                remove_stale_shards(remote.child(job.sub), names_below(names, job.sub))
    except BaseException as e:
        try:  # all splits or none
            withdraw(target, target.names() if replace else names)
        except Exception as cleanup_error:  # best effort: the index went first, so no broken dataset is visible
            log.warning("could not remove the partial upload from %s: %s", target.url, cleanup_error)
        if isinstance(e, UserError):
            raise UserError(f"{e}; nothing was published") from None
        raise
    line = storage.summary(result, target.url)
    return f"{line}; moved into place at {remote.url}" if replace else line


# ----------------------------------------------------------------------------------------------------------
# verify


def read_dataset_file(source: str, name: str, client) -> Optional[bytes]:
    """The bytes of file `name` of the dataset at `source` (folder or s3://), or None when it is missing."""
    if source.startswith("s3://"):
        target = S3Dir(source, client)
        return target.read(name) if target.exists(name) else None
    path = Path(source, name)
    return path.read_bytes() if path.is_file() else None


REBUILD = "re-run to_mds.py with --overwrite to rebuild the dataset"


def dataset_file(source: str, name: str) -> str:
    """How messages name file `name` of the dataset at `source` (folder or s3://)."""
    return f"{source.rstrip('/')}/{name}" if source.startswith("s3://") else str(Path(source, name))


def load_spec(source: str, client, args: argparse.Namespace, job: SplitJob, dtype: np.dtype) -> dict:
    """to_mds.json of an existing dataset (or, for one made elsewhere, a sequential spec from the flags)."""
    if read_dataset_file(source, INDEX_NAME, client) is None:
        raise UserError(f"{source} has no {INDEX_NAME}: not an MDS dataset; convert it first (without --verify "
                        f"on an existing folder, or with --overwrite)")
    data = read_dataset_file(source, TO_MDS_META, client)
    if data is not None:
        try:
            spec = json.loads(data)
        except ValueError as e:
            raise UserError(f"{dataset_file(source, TO_MDS_META)} is not valid JSON ({e}); {REBUILD}") from None
        if not (isinstance(spec, dict) and isinstance(spec.get("block_size"), int)
                and spec.get("sampling") in ("sequential", "random") and isinstance(spec.get("source"), dict)
                and isinstance(spec["source"].get("tokens"), int)):
            raise UserError(f"{dataset_file(source, TO_MDS_META)} lacks block_size, sampling or source.tokens, so "
                            f"it was not written by to_mds.py; {REBUILD}")
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


def check_shard_files(source: str, client) -> list[str]:
    """Check that index.json of the dataset at `source` is an MDS index and that every shard file it lists is
    there with its size, before reading anything; return the checksums the index stores (e.g. ["sha1", "xxh64"])."""
    text = read_dataset_file(source, INDEX_NAME, client)
    shards = storage.listed_shards(text, dataset_file(source, INDEX_NAME), REBUILD)
    if source.startswith("s3://"):
        sizes = {name: obj.size for name, obj in S3Dir(source, client).objects().items()}
    else:
        sizes = {p.relative_to(source).as_posix(): p.stat().st_size for p in Path(source).rglob("*") if p.is_file()}
    for shard in shards:
        where = dataset_file(source, shard.name)
        if shard.name not in sizes:
            raise UserError(f"{where} is missing, though {dataset_file(source, INDEX_NAME)} lists it: the dataset "
                            f"is incomplete; {REBUILD} (or put the shard back)")
        if shard.size is not None and sizes[shard.name] != shard.size:
            raise UserError(f"{where} is {sizes[shard.name]} bytes but {dataset_file(source, INDEX_NAME)} says "
                            f"{shard.size}: the shard is damaged or from another run; {REBUILD}")
    hashes = json.loads(text)["shards"][0].get("hashes")
    return [h for h in hashes if isinstance(h, str)] if isinstance(hashes, list) else []


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
    starts = spec_starts(spec, job.n_tokens)
    hashes = check_shard_files(source, client)
    clean_stale_shared_memory()
    with tempfile.TemporaryDirectory(prefix="to_mds_verify_") as cache:
        check = "xxh64" if "xxh64" in hashes else (hashes[0] if hashes else None)  # xxh64: the fastest
        try:
            ds = StreamingDataset(remote=source, local=cache, shuffle=False, batch_size=1, validate_hash=check)
        except (KeyError, ValueError, TypeError) as e:  # an index.json with shard entries Streaming cannot use
            raise UserError(f"{dataset_file(source, INDEX_NAME)} is not an MDS index Streaming can read "
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
    endpoint = storage.endpoint_url(args.endpoint_url)
    if endpoint:  # Streaming's downloader (--verify) reads S3_ENDPOINT_URL only
        os.environ["S3_ENDPOINT_URL"] = endpoint
    remote = S3Dir(args.remote, storage.make_client(endpoint)) if args.remote else None
    if remote is not None:
        remote.check()  # the bucket and the credentials, before any work

    if out is not None:
        clean_stale_local(out)
    exists_local = out is not None and local_exists(out)
    exists_remote = remote is not None and any(remote.child(j.sub).exists(INDEX_NAME) for j in jobs)
    if exists_local and not is_dataset_dir(out):
        raise UserError(f"--out {out} exists and is not an MDS dataset (no {INDEX_NAME}); choose another folder")
    if (exists_local or exists_remote) and not args.overwrite:
        if not args.verify:
            where = out if exists_local else args.remote
            raise UserError(f"{where} already holds a dataset; pass --overwrite to replace it, or --verify to "
                            f"check it")
        return verify_all(args, jobs, dtype, remote, out if exists_local else None, exists_remote)
    if args.block_size is None:
        raise UserError("--block-size is required to convert (e.g. --block-size 1024)")

    specs = [make_spec(j, args, dtype, vocab, info) for j in jobs]  # validates sizes before writing anything
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    else:
        staging = Path(tempfile.mkdtemp(prefix="to_mds_stage_"))
    published = False
    try:
        results = [write_split(job, spec, staging / job.sub if job.sub else staging, args, dtype, vocab)
                   for job, spec in zip(jobs, specs)]
        uploaded = publish_remote(staging, remote, jobs, exists_remote) if remote else None
        if out is not None:
            publish_local(staging, out, args.overwrite)
        published = True
    finally:
        if not published or out is None:
            shutil.rmtree(staging, ignore_errors=True)

    for job, spec, res in zip(jobs, specs, results):
        where = " and ".join(str(w) for w in (
            (out / job.sub if job.sub else out) if out is not None else None,
            remote.child(job.sub).url if remote else None) if w)
        print(f"{job.name}: {res.samples:,} samples of {spec['block_size']} tokens ({spec['sampling']}) -> "
              f"{res.shards} shard(s), {res.bytes / 1e6:.2f} MB, {res.bytes / job.n_tokens:.3f} bytes/token of "
              f"{job.bin_path.name} ({job.n_tokens:,} tokens, {spec['dropped_tail_tokens']} tail tokens dropped), "
              f"{job.n_tokens * dtype.itemsize / 1e6 / max(res.seconds, 1e-9):.1f} MB/s -> {where}")
    if uploaded:
        print(uploaded)
    if args.verify:
        return verify_all(args, jobs, dtype, remote, out, remote is not None)
    return 0


def verify_all(args: argparse.Namespace, jobs: list[SplitJob], dtype: np.dtype, remote: Optional[S3Dir],
               out: Optional[Path], check_remote: bool) -> int:
    """--verify: read back each split's dataset (local and/or S3) and compare it with its .bin."""
    client = remote.client if remote is not None else None
    for job in jobs:
        sources = []
        if out is not None:
            sources.append(str(out / job.sub if job.sub else out))
        if check_remote:
            sources.append(remote.child(job.sub).url)
        for source in sources:
            spec = load_spec(source, client, args, job, dtype)
            n = verify_split(source, job, spec, dtype, client)
            print(f"verified {source}: {n:,} samples, every token matches {job.bin_path}")
    return 0


if __name__ == "__main__":
    run_main(main)
