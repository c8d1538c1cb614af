"""Benchmark train.py's doc_aligned=True reader against the window reader it replaces, on the same .bin in one run.

Usage:
    python bench/bench_doc_aligned.py                          # ~1 minute: a synthetic Pile-like .bin, T = 1024
    python bench/bench_doc_aligned.py --data-dir data/pile --block-size 2048 --samples 20000

What it measures, on one .bin (a prepare_data.py folder's train.bin, or a synthetic one: 64M tokens in documents
whose lengths follow a log-normal law, median ~670 tokens and a long tail, as the Pile's mix of short web pages and
long books and code; ids are not real text, only their end-of-text marks matter here):
- samples/s of pilegpt.train.data.bin_reader.BinDataset read in the training order (a keyed shuffle of every sample),
  with and without doc_aligned, interleaved over --rounds, the best of each, and their ratio, each timed pass after an
  untimed one over the same samples (the file's pages in memory: the reader's own cost, not the disk's): each
  aligned sample reads and packs its whole block (data.ALIGN_ROWS rows), a window one read of T+1 tokens;
- what the rows hold: the share that start at a document's first token (windows: those that happen to), and the
  tokens of a .bin no row holds (the tail short of a row, the same for both).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pilegpt.data import ALIGN_ROWS, Meta, pack_rows, write_token_files  # noqa: E402
from pilegpt.tokenizer import EOT_ID  # noqa: E402
from pilegpt.train.data.bin_reader import BinDataset, permute  # noqa: E402


def synthetic_bin(folder: Path, n_tokens: int, seed: int) -> Path:
    """A .bin of n_tokens in log-normal documents (median ~670 tokens), each ending with EOT_ID."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(2, rng.lognormal(6.5, 1.3, size=n_tokens // 300)).astype(np.int64)
    ends = np.cumsum(lengths)
    ends = ends[ends <= n_tokens] - 1
    tokens = rng.integers(0, EOT_ID, size=n_tokens, dtype=np.uint16)
    tokens[ends] = EOT_ID
    write_token_files(folder, {"train": tokens[:ends[-1] + 1]})
    return folder


def read_speed(ds: BinDataset, samples: int, seed: int) -> float:
    """Samples per second of ds[i] over the first `samples` positions of the training order."""
    order = permute(np.arange(samples, dtype=np.int64), len(ds), seed << 20).tolist()
    for i in order:  # untimed: the pages these samples lie on come into memory, for either reader alike
        ds[i]
    ds.packed = (-1, None)
    start = time.perf_counter()
    for i in order:
        ds[i]
    return samples / (time.perf_counter() - start)


def starts_at_documents(ds: BinDataset, tokens: np.ndarray, eot: int, samples: int) -> float:
    """The share of the first `samples` rows (in file order) whose first token is a document's first."""
    W = ds.block_size + 1
    head = np.asarray(tokens[:-(-samples // ALIGN_ROWS) * ALIGN_ROWS * W + 1])
    first = np.zeros(len(head) + 1, dtype=bool)
    first[0], first[np.flatnonzero(head == eot) + 1] = True, True
    if not ds.doc_aligned:
        return float(first[np.arange(samples) * ds.block_size].mean())
    starts = [b + pack_rows(head[b:b + ALIGN_ROWS * W], eot, ds.block_size)[:, 0]
              for b in range(0, samples * W, ALIGN_ROWS * W)]
    return float(first[np.concatenate(starts)[:samples]].mean())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, help="a prepare_data.py folder (default: a synthetic Pile-like .bin)")
    p.add_argument("--tokens", type=int, default=64_000_000, help="tokens of the synthetic .bin")
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--samples", type=int, default=4000, help="samples read per side and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_doc_aligned_") as tmp:
        folder = args.data_dir or synthetic_bin(Path(tmp), args.tokens, seed=0)
        meta = Meta.read(folder)
        path, n = str(folder / meta.splits["train"].file), meta.token_count(folder, "train")
        sides = {on: BinDataset(path, args.block_size, meta.dtype, num_tokens=n, vocab_size=meta.vocab_size,
                                doc_aligned=on, eot_token=meta.eot_token) for on in (False, True)}
        best = {False: 0.0, True: 0.0}
        for r in range(args.rounds):
            for on, ds in sides.items():
                best[on] = max(best[on], read_speed(ds, min(args.samples, len(ds)), seed=r))
        tokens = np.memmap(path, dtype=meta.dtype, mode="r")
        share = {on: starts_at_documents(ds, tokens, meta.eot_token, min(2000, len(ds))) for on, ds in sides.items()}
        docs = meta.splits["train"].documents
        print(f"{folder}: {n:,} tokens, {docs:,} documents (mean {n / max(docs, 1):,.0f} tokens), T = "
              f"{args.block_size}, {ALIGN_ROWS} rows a block")
        for on, name in ((False, "windows"), (True, "doc_aligned")):
            print(f"  {name:12s} {len(sides[on]):>12,} samples  {best[on]:>10,.0f} samples/s in the training order  "
                  f"{share[on]:6.1%} start at a document")
        print(f"doc_aligned reads {best[True] / best[False]:.2f}x the window reader's samples/s; "
              f"{share[True]:.1%} of its rows start at a document's first token (windows: {share[False]:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
