"""Writing one MDS dataset of x/y windows from a .bin (to_mds.py's), shard j by an MDSWriter of its own on one of
--num-proc processes, named and indexed so that the files are byte for byte those one MDSWriter would write.
Streaming is imported inside the functions: it is slow to import, and --help and the flag checks do not need it.
Details: docs/mds-and-s3.md."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import select
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from pilegpt import compat
from pilegpt.common import UserError
from pilegpt.data import (
    INDEX_NAME,
    TO_MDS_META,
    check_token_range,
    mds_columns,
    num_windows,
    read_windows,
    window_starts,
)

CHUNK_TOKENS = 1 << 22  # tokens read from the memmap at a time (8 MB of uint16)


# ----------------------------------------------------------------------------------------------------------
# what to write: the job and its to_mds.json record


@dataclass
class SplitJob:
    """One .bin to convert into one MDS dataset."""
    name: str  # split name: "train", "val", or the .bin's stem
    bin_path: Path
    n_tokens: int
    sub: str  # subfolder of OUT / --remote holding this dataset ("" when OUT is the dataset itself)
    sampling: str  # "sequential" or "random"


@dataclass
class WriterSettings:
    """MDSWriter's settings for every shard of a run (to_mds's --compression, --hashes, --size-limit)."""
    compression: Optional[str]  # Streaming compression, e.g. "zstd" or "zstd:1"; None: uncompressed
    hashes: list[str]  # shard checksums stored in index.json, e.g. ["sha1", "xxh64"]
    size_limit: int  # max uncompressed bytes of a shard
    size_limit_flag: str  # --size-limit as given (e.g. "64mb"), for messages


def make_spec(job: SplitJob, block_size: int, num_samples: Optional[int], seed: int, dtype: np.dtype, vocab: int,
              info: dict) -> dict:
    """The contents of to_mds.json: everything --verify needs to recompute every sample. `num_samples` and
    `seed` apply to random sampling; `info` (tokenizer, eot_token) is copied from meta.json."""
    T = block_size
    if job.n_tokens < T + 1:
        raise UserError(f"{job.bin_path} holds {job.n_tokens} tokens, too few for --block-size {T} (a sample "
                        f"needs {T + 1}); use a smaller --block-size")
    random = job.sampling == "random"
    n_samples = num_samples if random else num_windows(job.n_tokens, T)
    return {
        "version": 1, "block_size": T, "dtype": dtype.name, "vocab_size": vocab, **info,
        "columns": mds_columns(dtype.name, T),
        "sampling": job.sampling, "num_samples": n_samples, "seed": seed if random else None,
        "source": {"file": job.bin_path.name, "tokens": job.n_tokens},
        "dropped_tail_tokens": 0 if random else job.n_tokens - n_samples * T - 1,
    }


def spec_starts(spec: dict, n_tokens: int) -> np.ndarray:
    """Start offset of every sample's window, as to_mds.json describes them (data.window_starts)."""
    return window_starts(n_tokens, spec["block_size"], spec["sampling"], spec.get("num_samples") or 0,
                         spec.get("seed") or 0)


def chunks(starts: np.ndarray, T: int) -> Iterator[np.ndarray]:
    """Slices of `starts` holding about CHUNK_TOKENS tokens each."""
    step = max(1, CHUNK_TOKENS // T)
    for i in range(0, len(starts), step):
        yield starts[i:i + step]


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ----------------------------------------------------------------------------------------------------------
# one shard


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
    Each sample goes in as the bytes MDSWriter's encode_sample would make of x and y (x.tobytes() + y.tobytes()),
    laid out by numpy CHUNK_TOKENS at a time; the first sample of every shard is checked against MDSWriter's own
    encoding, so a Streaming that encodes otherwise fails loudly."""
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
                expected = MDSWriter.encode_sample(writer, {"x": x[0], "y": y[0]})
                if xy[0].tobytes() != expected:
                    raise RuntimeError(f"shard {task.j}: x.tobytes() + y.tobytes() ({xy[0].nbytes} bytes) differs "
                                       f"from MDSWriter.encode_sample of columns {task.writer['columns']} "
                                       f"({len(expected)} bytes): this Streaming version encodes samples otherwise, "
                                       f"so write_shard must encode them as it does")
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


def pool_context() -> multiprocessing.context.BaseContext:
    """The pool's start method: forkserver (spawn where there is none), never fork. A fork copies one thread of a
    process that has others (numpy's BLAS pool, the probe MDSWriter's, tqdm's monitor, a caller's): a lock one of
    them held stays held in the child forever (Python 3.12 warns at each fork). The server is a fresh interpreter
    that imports nothing (numpy would start threads in it too) and forks each process of the pool from its single
    thread; each process then imports what it runs."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([])  # not even __main__ (the default): to_mds.py imports numpy
    return context


def start_worker(parent: int) -> None:
    """Set up a process of the pool: Ctrl-C is the parent's to handle (it stops the pool), and the process dies with
    the parent `parent`, so a killed run leaves no process writing into its folder (a fork server's process would
    go on with the shards already queued to it: the server is its parent, and lives while it does)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=die_with, args=(parent,), daemon=True, name="die-with-parent").start()


def die_with(parent: int) -> None:
    """Wait for the process `parent` to end (its pidfd on Linux, else a look every 0.1 s), then end this one."""
    try:
        fd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # not Linux 5.3+, or it has ended already
        fd = None
    if fd is not None:
        select.select([fd], [], [])  # readable when it ends
    else:
        while process_exists(parent):
            time.sleep(0.1)
    os._exit(1)


def process_exists(pid: int) -> bool:
    """Whether the process `pid` exists (signal 0 checks without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, under another user
        return True
    return True


# ----------------------------------------------------------------------------------------------------------
# one dataset


def write_split(job: SplitJob, spec: dict, local: Path, settings: WriterSettings, num_proc: int) -> Written:
    """Write one MDS dataset (x/y samples of job.bin_path, as `spec` says) into the new folder `local`: the samples
    cut into the shards one MDSWriter would write (compat.mds_samples_per_shard), shard j written by write_shard on
    one of `num_proc` processes (1: this process), then named and indexed in order, so the files are the same,
    byte for byte, whatever `num_proc` is."""
    from streaming import MDSWriter
    from tqdm import tqdm

    T = spec["block_size"]
    dtype = np.dtype(spec["dtype"])
    starts = spec_starts(spec, job.n_tokens)
    writer = dict(columns=spec["columns"], compression=settings.compression, hashes=settings.hashes,
                  size_limit=settings.size_limit)
    t0 = time.perf_counter()
    probe = MDSWriter(out=str(local), **writer)  # makes the folder; only its size bookkeeping is read
    probe.cancel_future_jobs()
    encoded = 2 * T * dtype.itemsize  # x then y
    per_shard = compat.mds_samples_per_shard(probe, encoded, settings.size_limit)
    if per_shard == 0:
        shard_extra, sample_extra = compat.mds_extra_bytes(probe)
        raise UserError(f"--size-limit {settings.size_limit_flag} is smaller than one sample "
                        f"({encoded + sample_extra + shard_extra} bytes with --block-size {T}); raise it")
    n_shards = -(-len(starts) // per_shard)
    tasks = (ShardTask(j, starts[j * per_shard:(j + 1) * per_shard], job.bin_path, dtype.name, spec["vocab_size"],
                       T, writer, local) for j in range(n_shards))
    n_proc = min(num_proc, n_shards)
    pool = None
    if n_proc > 1:
        pool = pool_context().Pool(n_proc, initializer=start_worker, initargs=(os.getpid(),))
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
