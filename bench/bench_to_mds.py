"""Benchmark to_mds.py: conversion speed and StreamingDataset read speed, each against a plain baseline.

Usage:
    python bench/bench_to_mds.py                 # ~4-6 minutes on 2 CPU cores (a 256 MB .bin)
    python bench/bench_to_mds.py --tokens 64000000 --block-size 2048
    python bench/bench_to_mds.py --tokens 8000000 --read-samples 1000 --rounds 1     # quick

What it measures, in one run on the same files:
- conversion MB/s of .bin (to_mds.main, default settings: zstd, sha1+xxh64 hashes, 64mb shards, --num-proc
  default) against a plain read-and-write of the same bytes (read in 8 MB chunks, write, fsync): the ratio is the
  cost of building, compressing and hashing x/y shards;
- the writers, on 8mb shards so that there are many of them (as on the Pile, where a .bin makes thousands): to_mds
  now with --num-proc 1 and 2 (whole shards on processes, samples encoded by numpy; the figure to watch is the
  2/1 ratio), the writer before it (a frozen copy below: a public MDSWriter per shard, --workers shards at a time
  on threads of one process, samples encoded one by one; with 1 and 2 threads), and one public MDSWriter fed numpy
  arrays (Streaming parses the column encodings for every sample). Same .bin, same settings, same output bytes
  (checked), best of --rounds, interleaved so that a busy machine slows each alike. Threads overlap only the work
  that releases Python's lock (compressing, hashing: ~2/3 at block size 1024, less for shorter samples), so they
  cannot pass ~3x however many cores there are; processes run everything in parallel;
- storage bytes per token of the .bin: on the synthetic corpus and on real text (tiny Shakespeare, GPT-2 BPE);
- read samples/s of StreamingDataset over the local MDS (x and y of block_size tokens) against numpy memmap
  windows of the same size (x = w[:-1], y = w[1:]), in order and in random order.

The synthetic corpus draws GPT-2 token ids from a Zipf law (word frequencies in text follow one), so it
compresses like real tokens rather than like repeated text or uniform noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pilegpt.mds.write import folder_bytes  # noqa: E402

SHAKESPEARE = REPO / "tests" / "fixtures" / "tinyshakespeare.txt"
VOCAB = 50257


def write_bin(folder: Path, tokens: np.ndarray) -> Path:
    from pilegpt.data import write_token_files

    write_token_files(folder, {"train": tokens}, vocab_size=VOCAB, dtype="uint16")
    return folder


def zipf_tokens(n: int, seed: int = 0) -> np.ndarray:
    """n token ids drawn independently with Zipf frequencies (rank r has probability ~ 1/r), made 16M at a time."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1))
    cdf /= cdf[-1]
    ids = rng.permutation(VOCAB).astype(np.uint16)  # rank -> some token id
    out = np.empty(n, dtype=np.uint16)
    for i in range(0, n, 1 << 24):
        k = min(n - i, 1 << 24)
        out[i:i + k] = ids[np.searchsorted(cdf, rng.random(k)).clip(0, VOCAB - 1)]
    return out


def write_with_threads(tokens: np.ndarray, out: Path, block_size: int, workers: int, settings: dict) -> None:
    """to_mds's writer before --num-proc, frozen here for the comparison: shard j by an MDSWriter of its own,
    --workers shards at a time on threads of this process, each sample given as {"x": bytes, "y": bytes}."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from streaming import MDSWriter

    from pilegpt import compat
    from pilegpt.data import check_token_range, read_windows, window_starts
    from pilegpt.mds.write import chunks

    starts = window_starts(len(tokens), block_size)
    probe = MDSWriter(out=str(out), **settings)
    probe.cancel_future_jobs()
    per_shard = compat.mds_samples_per_shard(probe, 4 * block_size, probe.size_limit)
    shard_starts = [starts[i:i + per_shard] for i in range(0, len(starts), per_shard)]

    def write_shard(j: int) -> dict:
        part = out / f".shard-{j:05}"
        writer = MDSWriter(out=str(part), **settings)
        for chunk in chunks(shard_starts[j], block_size):
            x, y = read_windows(tokens, chunk, block_size)
            check_token_range(x, y, chunk, "train.bin", VOCAB)
            for xk, yk in zip(x, y):
                writer.write({"x": xk.tobytes(), "y": yk.tobytes()})
        writer.finish()
        index = json.loads((part / "index.json").read_text())
        for info in (index["shards"][0]["raw_data"], index["shards"][0]["zip_data"]):
            if info is not None:
                name = f"shard.{j:05}.{info['basename'].split('.', 2)[2]}"
                if (part / info["basename"]).is_file():
                    os.rename(part / info["basename"], out / name)
                info["basename"] = name
        shutil.rmtree(part)
        return index

    indexes, pending = [], deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for j in range(len(shard_starts)):
            pending.append(pool.submit(write_shard, j))
            while pending and (len(pending) >= 2 * workers or j == len(shard_starts) - 1):
                indexes.append(pending.popleft().result())
    with open(out / "index.json", "w") as f:
        json.dump(dict(indexes[0], shards=[i["shards"][0] for i in indexes]), f, sort_keys=True)


def convert_with(data: Path, out: Path, block_size: int, how: str, workers: int, size_limit: str) -> float:
    """Seconds to write train.bin's windows as MDS into `out`, with to_mds's settings, loop and fsync.

    how: "threads" (to_mds's writer before --num-proc, on `workers` threads) or "arrays" (one public MDSWriter
    fed numpy arrays rather than bytes)."""
    from streaming import MDSWriter

    import to_mds
    from pilegpt.data import check_token_range, mds_columns, read_windows, window_starts
    from pilegpt.mds.publish import fsync_tree
    from pilegpt.mds.write import chunks

    tokens = np.memmap(data / "train.bin", dtype=np.uint16, mode="r")
    settings = dict(columns=mds_columns("uint16", block_size), compression=to_mds.DEFAULT_COMPRESSION,
                    hashes=sorted(to_mds.DEFAULT_HASHES.split(",")), size_limit=size_limit)
    t0 = time.perf_counter()
    if how == "threads":
        write_with_threads(tokens, out, block_size, workers, settings)
    else:
        starts = window_starts(len(tokens), block_size)
        writer = MDSWriter(out=str(out), **settings)
        for part in chunks(starts, block_size):
            x, y = read_windows(tokens, part, block_size)
            check_token_range(x, y, part, data / "train.bin", VOCAB)
            for k in range(len(part)):
                writer.write({"x": x[k], "y": y[k]})
        writer.finish()
    fsync_tree(out)
    return time.perf_counter() - t0


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its children that have ended."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def same_shards(a: Path, b: Path) -> bool:
    """Whether two datasets hold the same index.json and shard files, byte for byte (to_mds.json aside)."""
    names = sorted(p.name for p in a.iterdir() if p.name != "to_mds.json")
    return names == sorted(p.name for p in b.iterdir() if p.name != "to_mds.json") and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names)


def plain_copy(src: Path, dst: Path) -> float:
    """Seconds to read `src` in 8 MB chunks and write it to `dst` (fsync'd, like to_mds's output)."""
    t0 = time.perf_counter()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(8 << 20):
            fo.write(chunk)
        fo.flush()
        os.fsync(fo.fileno())
    return time.perf_counter() - t0


def convert(data: Path, out: Path, block_size: int, extra=()) -> float:
    import to_mds

    t0 = time.perf_counter()
    to_mds.main(["--bin", str(data / "train.bin"), "--out", str(out), "--block-size", str(block_size), *extra])
    return time.perf_counter() - t0


def read_streaming(mds: Path, cache: Path, order: np.ndarray | None, batch_size: int) -> tuple[float, int]:
    """(seconds, samples) to read every sample with StreamingDataset: iterate (order None) or ds[i].

    batch_size matters when iterating: Streaming prefetches predownload = 8 * batch_size samples ahead.
    """
    from streaming import StreamingDataset

    from pilegpt import compat

    with compat.streaming_start_lock():  # stale shared memory cleaned, other starts waited for
        ds = StreamingDataset(remote=str(mds), local=str(cache), shuffle=False, batch_size=batch_size)
    for _ in ds:  # warm-up epoch: copies and decompresses the shards into the cache
        pass
    t0 = time.perf_counter()
    n = 0
    if order is None:
        for sample in ds:
            n += sample["x"].shape[0] > 0
    else:
        for i in order:
            n += ds[int(i)]["x"].shape[0] > 0
    return time.perf_counter() - t0, n


def read_memmap(path: Path, block_size: int, order: np.ndarray) -> float:
    """Seconds to build x, y (copies) of every window `order` names from a numpy memmap."""
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    t0 = time.perf_counter()
    for i in order:
        w = mm[int(i) * block_size:int(i) * block_size + block_size + 1]
        _x, _y = np.array(w[:-1]), np.array(w[1:])  # materialize both, as a reader would
    return time.perf_counter() - t0


def bench_conversion(data: Path, tmp: Path, tokens: np.ndarray, T: int) -> str:
    """to_mds with its defaults (and zstd:1) against a plain read and write of the same .bin."""
    mb = tokens.nbytes / 1e6
    base_s = min(plain_copy(data / "train.bin", tmp / f"copy{i}.bin") for i in range(2))
    conv_s = convert(data, tmp / "mds", T)
    conv1_s = convert(data, tmp / "mds1", T, ["--compression", "zstd:1"])
    return (f"conversion ({len(tokens) / 1e6:.0f}M Zipf tokens, {mb:.0f} MB .bin, T={T}): "
            f"plain read+write {mb / base_s:.0f} MB/s | to_mds zstd {mb / conv_s:.1f} MB/s "
            f"(ratio {base_s / conv_s:.3f}) | to_mds zstd:1 {mb / conv1_s:.1f} MB/s "
            f"(ratio {base_s / conv1_s:.3f})")


def bench_writers(data: Path, tmp: Path, mb: float, T: int, rounds: int, limit: str) -> list[str]:
    """The writers on shards small enough that there are many (a 256 MB .bin makes ~9 shards of 64mb), each
    `rounds` times, interleaved; every output checked byte for byte against the first."""
    writers = {
        "proc1": lambda out: convert(data, out, T, ["--size-limit", limit, "--num-proc", "1"]),
        "proc2": lambda out: convert(data, out, T, ["--size-limit", limit, "--num-proc", "2"]),
        "threads1": lambda out: convert_with(data, out, T, "threads", 1, limit),
        "threads2": lambda out: convert_with(data, out, T, "threads", 2, limit),
        "arrays": lambda out: convert_with(data, out, T, "arrays", 1, limit),
    }
    runs = {name: [] for name in writers}  # (seconds, CPU seconds of this process, its threads and children)
    for _ in range(rounds):  # interleaved, so a busy machine slows each writer alike
        for name, write in writers.items():
            cpu_start = cpu_seconds()
            seconds = write(tmp / name)
            runs[name].append((seconds, cpu_seconds() - cpu_start))
            if not (tmp / "reference").exists():
                os.rename(tmp / name, tmp / "reference")
                continue
            assert same_shards(tmp / "reference", tmp / name), name
            shutil.rmtree(tmp / name)
    n_shards = len(list((tmp / "reference").glob("shard.*")))
    best = {name: min(r[0] for r in runs[name]) for name in writers}
    cpu = {name: min(r[1] for r in runs[name]) for name in writers}
    rate = {name: mb / seconds for name, seconds in best.items()}
    busy = max(c / s for s, c in runs["proc2"])  # cores the 2 processes kept busy, in their best moment
    return [f"writers (zstd, --size-limit {limit}: {n_shards} shards; best of {rounds}; same output "
            f"bytes): to_mds --num-proc 1 {rate['proc1']:.1f} MB/s, --num-proc 2 {rate['proc2']:.1f} MB/s "
            f"(2/1: {rate['proc2'] / rate['proc1']:.2f}x) | before (--workers threads) 1 thread "
            f"{rate['threads1']:.1f} MB/s, 2 threads {rate['threads2']:.1f} MB/s (2/1: "
            f"{rate['threads2'] / rate['threads1']:.2f}x) | one process now/before "
            f"{rate['proc1'] / rate['threads1']:.2f}x | one public MDSWriter fed numpy arrays "
            f"{rate['arrays']:.1f} MB/s",
            "writers, CPU seconds per MB of .bin (little changed by other load on the machine): "
            + ", ".join(f"{name} {cpu[name] / mb * 1e3:.1f} ms" for name in writers)
            + f"; --num-proc 2 kept {busy:.2f} cores busy (free cores set its 2/1 ratio; load average "
            f"{os.getloadavg()[0]:.1f} at the end)"]


def bench_real_text(tmp: Path, T: int) -> str:
    """Bytes per token on tiny Shakespeare in GPT-2 BPE, zstd and zstd:1."""
    from pilegpt.tokenizer import gpt2

    enc = gpt2()
    text_tokens = np.array(enc.encode_ordinary(SHAKESPEARE.read_text()) + [enc.eot_token], np.uint16)
    real = write_bin(tmp / "shakespeare", text_tokens)
    convert(real, tmp / "mds_real", T)
    convert(real, tmp / "mds_real1", T, ["--compression", "zstd:1"])
    return (f"storage, tiny Shakespeare ({len(text_tokens):,} GPT-2 tokens, T={T}): zstd "
            f"{folder_bytes(tmp / 'mds_real') / len(text_tokens):.3f} bytes/token, zstd:1 "
            f"{folder_bytes(tmp / 'mds_real1') / len(text_tokens):.3f} bytes/token")


def bench_reads(data: Path, tmp: Path, n_tokens: int, T: int, read_samples: int, batch_size: int) -> list[str]:
    """StreamingDataset over tmp/mds against memmap windows of train.bin: every sample in order, and
    `read_samples` in random order."""
    n = (n_tokens - 1) // T
    seq = np.arange(n)
    rand = np.random.default_rng(0).permutation(n)[:read_samples]
    s_seq, got = read_streaming(tmp / "mds", tmp / "cache_seq", None, batch_size)
    assert got == n
    m_seq = read_memmap(data / "train.bin", T, seq)
    s_rand, _ = read_streaming(tmp / "mds", tmp / "cache_rand", rand, 1)
    m_rand = read_memmap(data / "train.bin", T, rand)
    return [f"read in order ({n:,} samples of x+y, T={T}): StreamingDataset iteration (batch_size "
            f"{batch_size}) {n / s_seq:,.0f} samples/s | "
            f"memmap windows {n / m_seq:,.0f} samples/s (ratio {m_seq / s_seq:.3f})",
            f"read in random order ({len(rand):,} samples): StreamingDataset ds[i] "
            f"{len(rand) / s_rand:,.0f} samples/s | memmap windows {len(rand) / m_rand:,.0f} samples/s "
            f"(ratio {m_rand / s_rand:.3f})"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=128_000_000,
                   help="tokens of the synthetic corpus (2 bytes each; default: a 256 MB .bin)")
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--read-samples", type=int, default=5000, help="samples read in random order")
    p.add_argument("--batch-size", type=int, default=32, help="StreamingDataset batch_size when iterating")
    p.add_argument("--rounds", type=int, default=2, help="repeats of the writer comparison (best kept)")
    p.add_argument("--writer-size-limit", default="8mb", help="shard size in the writer comparison (default 8mb)")
    args = p.parse_args()
    T = args.block_size
    import streaming  # noqa: F401  (import once, outside the timings)

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_to_mds_") as tmp:
        tmp = Path(tmp)
        tokens = zipf_tokens(args.tokens)
        data = write_bin(tmp / "zipf", tokens)
        rows.append(bench_conversion(data, tmp, tokens, T))
        rows += bench_writers(data, tmp, tokens.nbytes / 1e6, T, args.rounds, args.writer_size_limit)
        rows.append(f"storage, Zipf tokens: zstd {folder_bytes(tmp / 'mds') / len(tokens):.3f} bytes/token, "
                    f"zstd:1 {folder_bytes(tmp / 'mds1') / len(tokens):.3f} bytes/token (uncompressed x+y: 4.0)")
        if SHAKESPEARE.is_file():
            rows.append(bench_real_text(tmp, T))
        rows += bench_reads(data, tmp, len(tokens), T, args.read_samples, args.batch_size)
        shutil.rmtree(tmp / "cache_seq", ignore_errors=True)
    print(f"\nbench_to_mds ({os.cpu_count()} CPUs, python {sys.version.split()[0]}):")
    for row in rows:
        print("  " + row)


if __name__ == "__main__":
    main()
