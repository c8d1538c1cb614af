"""Training step on this machine's CPU: train.py against a plain PyTorch loop over model.py, and the allocators.

Usage:
    python bench/bench_train.py                      # train.py vs the plain loop, 3 rounds, 40 batches each
    python bench/bench_train.py --rounds 5 --threads 1  # OMP_NUM_THREADS=1: steadier on a loaded machine
    python bench/bench_train.py -- --n_layer=2       # more settings for both sides, after --
    python bench/bench_train.py --allocators         # train.py with glibc, glibc+mallopt, jemalloc

Both sides run the same settings (SETTINGS: config/tiny.py at 4 layers x 128, vocab 50304, no bias, batches of
12 x 64, as nanoGPT's comparison in issue 22) on the same batches, each in its own process, alternated run by run
so that load from other processes hits both alike:
    train.py      `python train.py config/tiny.py ...`: the Composer Trainer with every default callback, plus
                  bench/step_clock.py's StepClock (by import path) to read the clocks at each batch's end
    plain loop    pilegpt/train/plain_loop.py: model.py's GPT, forward, backward, clip_grad_norm_, AdamW step,
                  loss.item() per batch over train.py's own .bin loader; the same seed, optimizer groups,
                  learning-rate schedule and malloc settings (common.tune_glibc_malloc) as train.py
A run's step time is the median over the batches after --skip of the wall-clock time between consecutive batch
ends, and of the process's CPU time likewise (CPU time is the steadier figure when other processes share the cores;
with more than one thread it also counts OpenMP's spinning). Start-up, imports and the first slow steps do not
count; the result is the median over rounds per side and the ratio train.py / plain loop (1.00x = nothing around
the model costs anything). Each run also reports the time from the command to the end of its first batch.

--allocators compares train.py's set-ups instead, with tokens/s and the ratio to plain glibc:
    glibc           glibc malloc as it comes (train.py --cpu_malloc_tune=False)
    glibc+mallopt   train.py's default on CPU: mallopt keeps large freed blocks (see common.tune_glibc_malloc)
    jemalloc        Debian's jemalloc preloaded (train.py then leaves malloc alone): apt-get install libjemalloc2,
                    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=retain:true,dirty_decay_ms:-1,...
Without --data-dir, tiny Shakespeare (tests/fixtures/tinyshakespeare.txt) is tokenized into a temporary
prepare_data-style folder first.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pilegpt.common import UserError, run_main  # noqa: E402

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
JEMALLOC_CONF = "retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"
SHAKESPEARE = REPO / "tests" / "fixtures" / "tinyshakespeare.txt"
SETTINGS = ["--n_layer=4", "--n_head=4", "--n_embd=128", "--vocab_size=50304", "--bias=False",
            "--global_batch_size=12", "--device_train_microbatch_size=12"]
NO_EXTRAS = ["--eval_interval=100000ba", "--save_interval=100000ba", "--sample_length=0", "--device=cpu"]


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
    "train.py": ({}, []),
    "plain loop": ({}, []),
}


def plain_loop(argv: Sequence[str]) -> None:
    """One run of the baseline, pilegpt/train/plain_loop.py, on train.py's arguments (config file, --key=value) and
    malloc settings. Writes to save_folder: steps.jsonl (batch, tokens, loss, time_s, cpu_s at each batch's end, as
    step_clock.StepClock for train.py), and metrics.jsonl once the first batch is done."""
    from pilegpt.common import tune_glibc_malloc
    from pilegpt.train import plain_loop as loop
    from pilegpt.train.config_load import config_values, make_config

    cfg = make_config(config_values(argv))
    if cfg.cpu_malloc_tune:
        tune_glibc_malloc()
    out = Path(cfg.save_folder)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for batch, tokens, loss in loop.train(cfg):
        rows.append({"batch": batch, "tokens": tokens, "loss": loss, "time_s": time.time(),
                     "cpu_s": time.process_time()})
        if batch == 1:  # the first batch is done: run_once times the start-up by this file's appearance
            (out / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (out / "steps.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


class Run(NamedTuple):
    step_s: float  # median wall-clock seconds per step over the batches after --skip
    step_cpu_s: float  # median CPU seconds of the process per step, the same batches
    tokens: int  # per batch
    first_batch_s: float  # from the command to the end of the first batch


def run_once(data_dir: Path, work: Path, batches: int, skip: int, variant: str, settings: list[str],
             threads: Optional[int] = None) -> Run:
    run_dir = work / f"run-{variant.replace(' ', '-')}-{len(list(work.iterdir()))}"
    env = dict(os.environ)
    env.update(VARIANTS[variant][0])
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    script = [str(Path(__file__).resolve()), "--plain-loop"] if variant == "plain loop" else [str(REPO / "train.py")]
    if variant != "plain loop":  # train.py's batch ends, read by a callback (bench/step_clock.py)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "bench"), env.get("PYTHONPATH")]))
        script.append(f"--callbacks={{'step_clock:StepClock': {{'path': {str(run_dir / 'steps.jsonl')!r}}}}}")
    cmd = [sys.executable, *script, str(REPO / "config" / "tiny.py"), f"--data_dir={data_dir}",
           f"--max_duration={batches}ba", f"--save_folder={run_dir}", *NO_EXTRAS, *settings, *VARIANTS[variant][1]]
    metrics, start, first_batch = run_dir / "metrics.jsonl", time.time(), math.nan
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:  # from the command to the end of the first batch: start-up as a user sees it
            if math.isnan(first_batch) and metrics.is_file() and metrics.stat().st_size:
                first_batch = time.time() - start
            time.sleep(0.02)
        if proc.returncode != 0:
            log.seek(0)
            raise UserError(f"{variant} failed ({' '.join(cmd)}):\n{log.read()[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()][skip - 1:]
    return Run(*(statistics.median(b[k] - a[k] for a, b in zip(rows, rows[1:])) for k in ("time_s", "cpu_s")),
               rows[1]["tokens"] - rows[0]["tokens"], first_batch)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--plain-loop"]:  # one plain-loop run, started by run_once
        plain_loop(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, help="a prepare_data.py folder (default: tiny Shakespeare)")
    parser.add_argument("--batches", type=int, default=40, help="batches per run")
    parser.add_argument("--skip", type=int, default=10, help="first batches not timed (warm-up)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per side")
    parser.add_argument("--allocators", action="store_true", help="compare malloc set-ups of train.py instead")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every run (1 resists a loaded machine)")
    parser.add_argument("extra", nargs="*", help="more settings for both sides (--key=value), after --")
    args = parser.parse_args(argv)
    if args.skip < 1 or args.batches <= args.skip + 1:
        raise UserError("need --batches > --skip + 1 and --skip >= 1")
    sides = ["glibc", "glibc+mallopt", "jemalloc"] if args.allocators else ["train.py", "plain loop"]
    if args.allocators and not Path(JEMALLOC).is_file():
        print(f"note: {JEMALLOC} not found (apt-get install -y libjemalloc2): comparing glibc set-ups only", flush=True)
        sides.remove("jemalloc")
    settings = [*SETTINGS, *args.extra]
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        tmp = Path(tmp)
        data_dir = args.data_dir or make_shakespeare_bin(tmp / "data")
        work = tmp / "runs"
        work.mkdir()
        runs: dict[str, list[Run]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name in sides if r % 2 == 0 else sides[::-1]:  # alternate who goes first
                run = run_once(data_dir, work, args.batches, args.skip, name, settings, args.threads)
                runs[name].append(run)
                print(f"round {r + 1}: {name:<14} {1000 * run.step_s:7.1f} ms/step ({1000 * run.step_cpu_s:7.1f} ms "
                      f"CPU), first batch done {run.first_batch_s:5.1f} s after the command", flush=True)
    threads = f", OMP_NUM_THREADS={args.threads}" if args.threads else ""
    print(f"{' '.join(settings)} on {os.cpu_count()} CPU cores{threads}, batches {args.skip + 1}-{args.batches}, "
          f"median of {args.rounds} rounds:")
    median = {name: Run(*(statistics.median(getattr(run, k) for run in v) for k in Run._fields))
              for name, v in runs.items()}
    base = median["glibc" if args.allocators else "plain loop"]
    for name, m in median.items():
        if args.allocators:
            print(f"  {name:<14} {m.tokens / m.step_s:7,.0f} tok/s ({base.step_s / m.step_s:.2f}x glibc), "
                  f"{1000 * m.step_cpu_s:7.1f} ms CPU/step ({base.step_cpu_s / m.step_cpu_s:.2f}x glibc)")
        else:
            print(f"  {name:<14} {1000 * m.step_s:7.1f} ms/step ({m.step_s / base.step_s:.3f}x), "
                  f"{1000 * m.step_cpu_s:7.1f} ms CPU/step ({m.step_cpu_s / base.step_cpu_s:.3f}x), "
                  f"first batch {m.first_batch_s:.1f} s after the command")
    return 0


if __name__ == "__main__":
    run_main(main)
