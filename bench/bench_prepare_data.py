"""Benchmark prepare_data.py: tokens/s against plain single-process tiktoken, scaling, and peak memory.

Usage:
    python bench/bench_prepare_data.py                 # ~10 MB corpus (1x) and ~100 MB (10x)
    python bench/bench_prepare_data.py --mb 5 --no-10x

The corpus is tiny Shakespeare cut into speeches, repeated and shuffled into .jsonl.zst files (the Pile's
format). Baseline: `enc.encode_ordinary(text)` in one process over the same documents, held in memory, after the
vocabulary is loaded. prepare_data's figures are wall time of the whole command, start-up included (about
1.5 s: Python, numpy, the vocabulary, the tokenizer processes), which the 10x corpus amortizes.
Each prepare_data run is a real subprocess; peak RSS is sampled over its whole process tree (main process +
tokenizer processes, summed) every 20 ms, and the largest single process is reported too.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def make_corpus(folder: Path, target_mb: float, n_files: int = 4) -> list[str]:
    import zstandard

    docs = [d for d in SHAKESPEARE.read_text().split("\n\n") if d.strip()]
    rng = random.Random(0)
    texts, size = [], 0
    while size < target_mb * 1e6:
        batch = docs[:]
        rng.shuffle(batch)
        texts += batch
        size += sum(len(d) for d in batch)
    folder.mkdir(parents=True)
    per = len(texts) // n_files + 1
    for k in range(n_files):
        lines = "".join(json.dumps({"text": t}) + "\n" for t in texts[k * per:(k + 1) * per])
        (folder / f"{k:02d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(lines.encode()))
    return texts


def baseline(texts: list[str]) -> tuple[float, int]:
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    t0 = time.perf_counter()
    n = sum(len(enc.encode_ordinary(t)) + 1 for t in texts)
    return n / (time.perf_counter() - t0), n


def run_prepare(corpus: Path, out: Path, num_proc: int) -> dict:
    import psutil

    cmd = [sys.executable, str(REPO / "prepare_data.py"), "--input", str(corpus), "--out-dir", str(out),
           "--num-proc", str(num_proc), "--val-fraction", "0.001"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    root = psutil.Process(proc.pid)
    peak_total = peak_single = 0
    while proc.poll() is None:
        try:
            procs = [root] + root.children(recursive=True)
            rss = [p.memory_info().rss for p in procs]
            peak_total, peak_single = max(peak_total, sum(rss)), max(peak_single, max(rss))
        except psutil.Error:
            pass
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    summary = proc.stdout.read().strip()
    assert proc.returncode == 0, summary
    meta = json.loads((out / "meta.json").read_text())
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    return {"tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "peak_total_mb": peak_total / 2**20, "peak_single_mb": peak_single / 2**20}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="benchmark prepare_data.py")
    p.add_argument("--mb", type=float, default=10.0, help="size of the 1x corpus in MB of text")
    p.add_argument("--no-10x", action="store_true", help="skip the 10x memory run")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        texts = make_corpus(tmp / "c1", args.mb)
        base_tok_s, n = baseline(texts)
        del texts
        print(f"corpus 1x: {args.mb:.0f} MB of text, {n:,} tokens; cpus: {os.cpu_count()}")
        print(f"baseline (tiktoken encode_ordinary, 1 process, in memory): {base_tok_s:,.0f} tok/s")
        results = {}
        for num_proc in (1, 2):
            r = run_prepare(tmp / "c1", tmp / f"out1x_{num_proc}", num_proc)
            results[num_proc] = r
            print(f"prepare_data --num-proc {num_proc}: {r['tok_s']:,.0f} tok/s "
                  f"({r['tok_s'] / base_tok_s:.2f}x baseline), {r['seconds']:.1f}s, "
                  f"peak RSS {r['peak_total_mb']:.0f} MB total / {r['peak_single_mb']:.0f} MB largest process")
        print(f"scaling 1 -> 2 processes: {results[2]['tok_s'] / results[1]['tok_s']:.2f}x")
        if not args.no_10x:
            make_corpus(tmp / "c10", args.mb * 10)
            big = {}
            for num_proc in (1, 2):
                r = big[num_proc] = run_prepare(tmp / "c10", tmp / f"out10x_{num_proc}", num_proc)
                print(f"10x corpus ({r['tokens']:,} tokens) --num-proc {num_proc}: {r['tok_s']:,.0f} tok/s "
                      f"({r['tok_s'] / base_tok_s:.2f}x baseline), {r['seconds']:.1f}s, peak RSS "
                      f"{r['peak_total_mb']:.0f} MB total / {r['peak_single_mb']:.0f} MB largest process "
                      f"(1x: {results[num_proc]['peak_total_mb']:.0f} MB / "
                      f"{results[num_proc]['peak_single_mb']:.0f} MB)")
            print(f"scaling 1 -> 2 processes on the 10x corpus: {big[2]['tok_s'] / big[1]['tok_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
