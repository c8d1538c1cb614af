"""Training throughput of config/tiny.py on this machine's CPU: glibc malloc, glibc tuned, jemalloc.

Usage:
    python bench/bench_train.py                      # 3 rounds x 3 allocator set-ups, 30 batches each
    python bench/bench_train.py --batches 60 --rounds 3 --data-dir data/shakespeare

Each run is a real `python train.py config/tiny.py` process; tokens/s is tokens per batch over the median
batch time in train.py's metrics.jsonl after batch --skip (start-up, imports and the first slow steps do
not count; the median resists bursts of load from other processes). Runs alternate between the set-ups so
that load from other processes hits all alike; the result is the median per set-up and its ratio to plain glibc:
    glibc           glibc malloc as it comes (train.py --cpu_malloc_tune=False)
    glibc+mallopt   train.py's default on CPU: mallopt keeps large freed blocks (see common.tune_glibc_malloc)
    jemalloc        Debian's jemalloc preloaded (train.py then leaves malloc alone)

jemalloc: Debian's libjemalloc2 (apt-get install libjemalloc2), preloaded with
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1
It keeps freed memory mapped, so the large per-step tensors (the (B*T, 50257) logits) are not unmapped and
page-faulted back in every step as with glibc's mmap threshold.
Without --data-dir, tiny Shakespeare (tests/fixtures/tinyshakespeare.txt) is tokenized into a
temporary prepare_data-style folder first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pilegpt.common import UserError, run_main  # noqa: E402

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
JEMALLOC_CONF = "retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"
SHAKESPEARE = REPO / "tests" / "fixtures" / "tinyshakespeare.txt"


def make_shakespeare_bin(folder: Path) -> Path:
    from pilegpt.data import write_token_files
    from pilegpt.tokenizer import gpt2

    tokens = gpt2().encode_ordinary(SHAKESPEARE.read_text()) + [50256]
    n_val = len(tokens) // 10
    write_token_files(folder, {"train": tokens[:-n_val], "val": tokens[-n_val:]})
    return folder


VARIANTS = {  # name: (extra environment, extra train.py settings)
    "glibc": ({}, ["--cpu_malloc_tune=False"]),  # the baseline: glibc malloc as it comes
    "glibc+mallopt": ({}, ["--cpu_malloc_tune=True"]),  # train.py's default on CPU
    "jemalloc": ({"LD_PRELOAD": JEMALLOC, "MALLOC_CONF": JEMALLOC_CONF}, []),
}


def run_once(data_dir: Path, work: Path, batches: int, skip: int, variant: str, extra: list[str]) -> float:
    """Tokens/s of one train.py run: tokens per batch / median time of the batches after `skip`."""
    run_dir = work / f"run-{variant}-{len(list(work.iterdir()))}"
    env = dict(os.environ)
    env.update(VARIANTS[variant][0])
    cmd = [sys.executable, str(REPO / "train.py"), str(REPO / "config" / "tiny.py"), f"--data_dir={data_dir}",
           f"--max_duration={batches}ba", f"--save_folder={run_dir}", "--eval_interval=100000ba",
           "--save_interval=100000ba", "--sample_length=0", "--device=cpu", *VARIANTS[variant][1], *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"train.py failed ({' '.join(cmd)}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][skip - 1:]
    # The median step time resists the bursts of load that other processes put on a shared machine.
    step = statistics.median(b["time_s"] - a["time_s"] for a, b in zip(rows, rows[1:]))
    return (rows[1]["tokens"] - rows[0]["tokens"]) / step


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, help="a prepare_data.py folder (default: tiny Shakespeare)")
    parser.add_argument("--batches", type=int, default=30, help="batches per run")
    parser.add_argument("--skip", type=int, default=5, help="first batches not timed (warm-up)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per set-up")
    parser.add_argument("extra", nargs="*", help="more train.py --key=value settings, after --")
    args = parser.parse_args(argv)
    if not Path(JEMALLOC).is_file():
        raise UserError(f"{JEMALLOC} not found: apt-get install -y libjemalloc2")
    if args.skip < 1 or args.batches <= args.skip + 1:
        raise UserError("need --batches > --skip + 1 and --skip >= 1")
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        tmp = Path(tmp)
        data_dir = args.data_dir or make_shakespeare_bin(tmp)
        work = tmp / "runs"
        work.mkdir()
        results: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for r in range(args.rounds):
            for name in VARIANTS:
                tps = run_once(data_dir, work, args.batches, args.skip, name, args.extra)
                results[name].append(tps)
                print(f"round {r + 1}: {name:<14} {tps:8.0f} tokens/s", flush=True)
    median = {name: statistics.median(v) for name, v in results.items()}
    base = median["glibc"]
    figures = ", ".join(f"{name} {tps:.0f} tokens/s ({tps / base:.2f}x)" for name, tps in median.items())
    print(f"config/tiny.py on {os.cpu_count()} CPU cores, batches {args.skip + 1}-{args.batches}, median of "
          f"{args.rounds}: {figures}")
    return 0


if __name__ == "__main__":
    run_main(main)
