"""Composer algorithms on config/tiny.py: tokens/s and loss after a fixed number of batches, against no algorithm.

Usage:
    python bench/bench_algorithms.py                      # every algorithm in ROWS, 60 batches each (~3 min)
    python bench/bench_algorithms.py --batches 60 --only ema sam

One real `python train.py config/tiny.py --algorithms=...` process per row, one run each, all with the same seed,
data and data order, so a row differs from "none" by its algorithm alone (train.py's default grad_clip=1.0 norm
clipping is on in every row except gradient_clipping's). The corpus needs no download: this interpreter's
standard-library .py files, sorted by name, GPT-2 tokens (tokenizer.gpt2()) with <|endoftext|> between files,
the first --tokens of them, the last 10% as val, written with data.write_token_files: the default 40,000 give
one pass over the train split, no sample twice. Each run uses one thread (OMP_NUM_THREADS=1 unless set): on a
shared 2-core machine two threads contend and make the timings noisy.

    tokens/s    tokens per batch over the median batch time after batch --skip (as bench/bench_train.py)
    train loss  mean of the last 10 batches' losses (the training weights, also under EMA and SWA)
    val loss    the evaluation at the end, over the whole val split: with EMA's weights for ema, with the
                averaged weights for swa (loaded into the model at swa_end)

low_precision_layernorm needs AMP, so a GPU: its row says so instead of running on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pilegpt.common import UserError, run_main  # noqa: E402

ROWS = {  # name: (algorithms setting, more train.py settings)
    "none": ({}, []),
    "ema": ({"ema": {"half_life": "10ba"}}, []),
    "gradient_clipping": ({"gradient_clipping": {"clipping_type": "adaptive", "clipping_threshold": 0.01}},
                          ["--grad_clip=0"]),
    "low_precision_layernorm": ({"low_precision_layernorm": {}}, []),
    "sam": ({"sam": {"rho": 0.05}}, []),
    "swa": ({"swa": {"swa_start": "0.5dur", "swa_end": "0.97dur", "update_interval": "1ba"}}, []),
}
NEEDS_GPU = {"low_precision_layernorm"}


def make_stdlib_bin(folder: Path, n_tokens: int) -> Path:
    """The first n_tokens GPT-2 tokens of the standard library's .py files, 90% train / 10% val."""
    from pilegpt.data import write_token_files
    from pilegpt.tokenizer import EOT_ID, gpt2

    enc, tokens = gpt2(), []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        tokens += enc.encode_ordinary(path.read_text(errors="replace")) + [EOT_ID]
        if len(tokens) >= n_tokens:
            break
    tokens = tokens[:n_tokens]
    n_val = n_tokens // 10
    write_token_files(folder, {"train": tokens[:-n_val], "val": tokens[-n_val:]})
    return folder


def run_once(data_dir: Path, run_dir: Path, batches: int, skip: int, name: str) -> dict:
    """tokens/s, train loss and val loss of one train.py run with ROWS[name]."""
    algorithms, extra = ROWS[name]
    cmd = [sys.executable, str(REPO / "train.py"), str(REPO / "config" / "tiny.py"), f"--data_dir={data_dir}",
           f"--max_duration={batches}ba", f"--save_folder={run_dir}", f"--eval_interval={batches}ba",
           "--eval_subset_num_batches=-1", "--save_interval=100000ba", "--sample_length=0", "--device=cpu",
           f"--algorithms={algorithms!r}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"train.py failed ({' '.join(cmd)}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = rows[skip - 1:]
    # The median step time resists the bursts of load that other processes put on a shared machine.
    step = statistics.median(b["time_s"] - a["time_s"] for a, b in zip(timed, timed[1:]))
    return {"tokens_per_sec": (timed[1]["tokens"] - timed[0]["tokens"]) / step,
            "train_loss": statistics.mean(r["loss"] for r in rows[-10:]),
            "val_loss": next(r["val_loss"] for r in reversed(rows) if "val_loss" in r)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60, help="batches per run")
    parser.add_argument("--skip", type=int, default=5, help="first batches not timed (warm-up)")
    parser.add_argument("--tokens", type=int, default=40_000, help="corpus tokens (90%% train: more than 60 "
                                                                    "batches of 8 x 64)")
    parser.add_argument("--only", nargs="+", choices=list(ROWS), help="these rows only (none is always run)")
    args = parser.parse_args(argv)
    if args.skip < 1 or args.batches <= max(args.skip + 1, 10):
        raise UserError("need --batches > --skip + 1, --batches > 10 and --skip >= 1")
    names = ["none", *[n for n in ROWS if n != "none" and (not args.only or n in args.only)]]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_algorithms_") as tmp:
        data_dir = make_stdlib_bin(Path(tmp) / "stdlib", args.tokens)
        for name in names:
            if name in NEEDS_GPU:
                continue
            results[name] = run_once(data_dir, Path(tmp) / name, args.batches, args.skip, name)
            print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    base = results["none"]["tokens_per_sec"]
    command = " ".join(["python bench/bench_algorithms.py", *(sys.argv[1:] if argv is None else argv)])
    print(f"\nconfig/tiny.py, {args.batches} batches of 8 x 64 tokens on {os.cpu_count()} CPU cores, one run each "
          f"(`{command}`):\n")
    print("| algorithm | arguments | tokens/s | vs none | train loss (last 10) | val loss (end) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        algorithms, extra = ROWS[name]
        settings = " ".join(f"`{s}`" for s in [*algorithms.values(), *extra])
        if name in NEEDS_GPU:
            print(f"| {name} | {settings} | needs a GPU (amp_bf16 / amp_fp16): not run | | | |")
            continue
        r = results[name]
        print(f"| {name} | {settings or '-'} | {r['tokens_per_sec']:,.0f} | {r['tokens_per_sec'] / base:.2f}x | "
              f"{r['train_loss']:.3f} | {r['val_loss']:.3f} |")
    return 0


if __name__ == "__main__":
    run_main(main)
