"""Benchmark to_mds.py: conversion speed and StreamingDataset read speed, each against a plain baseline.

Usage:
    python bench/bench_to_mds.py                 # ~1-2 minutes on 2 CPU cores
    python bench/bench_to_mds.py --tokens 64000000 --block-size 2048

What it measures, in one run on the same files:
- conversion MB/s of .bin (to_mds.main, default settings: zstd, sha1+xxh64 hashes, 64mb shards) against a
  plain read-and-write of the same bytes (read in 8 MB chunks, write, fsync): the ratio is the cost of
  building, compressing and hashing x/y shards;
- storage bytes per token of the .bin: on the synthetic corpus and on real text (tiny Shakespeare, GPT-2 BPE);
- read samples/s of StreamingDataset over the local MDS (x and y of block_size tokens) against numpy memmap
  windows of the same size (x = w[:-1], y = w[1:]), in order and in random order.

The synthetic corpus draws GPT-2 token ids from a Zipf law (word frequencies in text follow one), so it
compresses like real tokens rather than like repeated text or uniform noise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TIKTOKEN_CACHE = REPO.parent / "shared" / "data" / "gpt2" / "tiktoken_cache"
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
VOCAB = 50257


def write_bin(folder: Path, tokens: np.ndarray) -> Path:
    import json

    folder.mkdir(parents=True)
    tokens.astype(np.uint16).tofile(folder / "train.bin")
    (folder / "meta.json").write_text(json.dumps({
        "tokenizer": "gpt2", "vocab_size": VOCAB, "eot_token": 50256, "dtype": "uint16",
        "splits": {"train": {"tokens": len(tokens), "documents": 1, "file": "train.bin"}}, "version": 1}))
    return folder


def zipf_tokens(n: int, seed: int = 0) -> np.ndarray:
    """n token ids drawn independently with Zipf frequencies (rank r has probability ~ 1/r)."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1))
    ranks = np.searchsorted(cdf / cdf[-1], rng.random(n)).clip(0, VOCAB - 1)
    return rng.permutation(VOCAB).astype(np.uint16)[ranks]  # rank -> some token id


def plain_copy(src: Path, dst: Path) -> float:
    """Seconds to read `src` in 8 MB chunks and write it to `dst` (fsync'd, like to_mds's output)."""
    t0 = time.perf_counter()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(8 << 20):
            fo.write(chunk)
        fo.flush()
        os.fsync(fo.fileno())
    return time.perf_counter() - t0


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


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
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=24_000_000, help="tokens of the synthetic corpus (2 bytes each)")
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--read-samples", type=int, default=5000, help="samples read in random order")
    p.add_argument("--batch-size", type=int, default=32, help="StreamingDataset batch_size when iterating")
    args = p.parse_args()
    T = args.block_size
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))
    import streaming  # noqa: F401  (import once, outside the timings)

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_to_mds_") as tmp:
        tmp = Path(tmp)
        tokens = zipf_tokens(args.tokens)
        data = write_bin(tmp / "zipf", tokens)
        mb = tokens.nbytes / 1e6

        base_s = min(plain_copy(data / "train.bin", tmp / f"copy{i}.bin") for i in range(2))
        conv_s = convert(data, tmp / "mds", T)
        conv1_s = convert(data, tmp / "mds1", T, ["--compression", "zstd:1"])
        rows.append(f"conversion ({len(tokens) / 1e6:.0f}M Zipf tokens, {mb:.0f} MB .bin, T={T}): "
                    f"plain read+write {mb / base_s:.0f} MB/s | to_mds zstd {mb / conv_s:.1f} MB/s "
                    f"(ratio {base_s / conv_s:.3f}) | to_mds zstd:1 {mb / conv1_s:.1f} MB/s "
                    f"(ratio {base_s / conv1_s:.3f})")
        rows.append(f"storage, Zipf tokens: zstd {folder_bytes(tmp / 'mds') / len(tokens):.3f} bytes/token, "
                    f"zstd:1 {folder_bytes(tmp / 'mds1') / len(tokens):.3f} bytes/token (uncompressed x+y: 4.0)")

        if SHAKESPEARE.is_file():
            import tiktoken

            enc = tiktoken.get_encoding("gpt2")
            text_tokens = np.array(enc.encode_ordinary(SHAKESPEARE.read_text()) + [enc.eot_token], np.uint16)
            real = write_bin(tmp / "shakespeare", text_tokens)
            convert(real, tmp / "mds_real", T)
            convert(real, tmp / "mds_real1", T, ["--compression", "zstd:1"])
            rows.append(f"storage, tiny Shakespeare ({len(text_tokens):,} GPT-2 tokens, T={T}): zstd "
                        f"{folder_bytes(tmp / 'mds_real') / len(text_tokens):.3f} bytes/token, zstd:1 "
                        f"{folder_bytes(tmp / 'mds_real1') / len(text_tokens):.3f} bytes/token")

        n = (len(tokens) - 1) // T
        seq = np.arange(n)
        rand = np.random.default_rng(0).permutation(n)[:args.read_samples]
        s_seq, got = read_streaming(tmp / "mds", tmp / "cache_seq", None, args.batch_size)
        assert got == n
        m_seq = read_memmap(data / "train.bin", T, seq)
        s_rand, _ = read_streaming(tmp / "mds", tmp / "cache_rand", rand, 1)
        m_rand = read_memmap(data / "train.bin", T, rand)
        rows.append(f"read in order ({n:,} samples of x+y, T={T}): StreamingDataset iteration (batch_size "
                    f"{args.batch_size}) {n / s_seq:,.0f} samples/s | "
                    f"memmap windows {n / m_seq:,.0f} samples/s (ratio {m_seq / s_seq:.3f})")
        rows.append(f"read in random order ({len(rand):,} samples): StreamingDataset ds[i] "
                    f"{len(rand) / s_rand:,.0f} samples/s | memmap windows {len(rand) / m_rand:,.0f} samples/s "
                    f"(ratio {m_rand / s_rand:.3f})")
        shutil.rmtree(tmp / "cache_seq", ignore_errors=True)
    print(f"\nbench_to_mds ({os.cpu_count()} CPUs, python {sys.version.split()[0]}):")
    for row in rows:
        print("  " + row)


if __name__ == "__main__":
    main()
