"""GPT-2 124M on one GPU: first its compiled step beside the presets' (tokens/s, MFU, peak memory, the optimizer's
share of the step), then a race of GPT-2's recipe against config/modern.py and the nanochat preset on the same real
text for the same seconds; then, when asked, the older comparison rows (eager vs compile, vocab, "auto", loader).

Usage:
    bash bench/gpu_run.sh                                  # the GPU session (installs the carried wheels first)
    python bench/bench_gpu.py --out $OUT/bench_gpu.md --logs /tmp/logs  # what it runs, ~8 min on an H100
    python bench/bench_gpu.py --smoke                      # the same code on CPU, tiny model, eager (the test)
    python bench/bench_gpu.py --race-s 120 --budget-s 560 --out /tmp/b.md
    python bench/bench_gpu.py --race-s 0 --variants eager-50304-fixed compile-50304-fixed --loader-workers 8,2,0

The race. Contestants: `gpt2` (config/pile.py: GPT-2's architecture and AdamW), `modern` (config/pile.py then
config/modern.py) and `nanochat` (config/pile.py then the nanochat preset's file in config/, named in
CONTESTANTS; skipped with a note while that file is not in the checkout). Each is one real
`python train.py config/pile.py [preset] --compile=True ...` process at 124M (pile.py's 12 x 768, block 1024,
vocab 50304) with amp_bf16 and pile.py's per-GPU batch (480 sequences over its 8 GPUs = 60 per step, microbatch
12); the race's settings come after the preset, so every contestant trains the
same batch on the same schedule: 50 batches of linear warmup, then its recipe's own peak rates (max_duration is
100,000 batches, which no one reaches: the cosine stays within 1% of the peak, nobody anneals; an annealed end
would lower every curve, by an amount this race does not measure). Its text: this machine's Python sources (the
standard library's, then the installed packages', sorted; the GPU machine has no internet), each file one
document, tokenized by prepare_data.py (GPT-2 BPE; 40M train tokens by default, 2% of the files for val), never
random ids. Its clock: bench/race_clock.py, a Composer callback train.py loads by name, counts training seconds from
the end of batch 1 (the compile is behind it) less the evaluations (their compile included), stops the run at
--race-s and records the val loss of each evaluation (every 50 batches, the same 8 x 16 sequences) against them.
--race-s (default 75) shrinks, the same for all, when --budget-s cannot pay every contestant's seconds and its
allowance for start-up, compile and final checkpoint (Contestant.startup_s: 75 s for gpt2, 110 s and 120 s for the
presets, whose compiled graphs are larger). The race's table: the val loss at 1/4, 1/2, 3/4 and all of the
seconds (linear between evaluations), the batches and epochs of the text each ran, and the second each reached
gpt2's final val loss, with its ratio to gpt2's.

The compiled step, from the same runs (the race's steps are the benchmark's steps):
    tokens/s      tokens per step over the median step time of batches 11 .. last-1 (train.py's metrics.jsonl
                  time_s; every step ends in a GPU sync, Composer's loss .item(); evaluation steps are slow outliers
                  that the median leaves out)
    MFU           tokens/s x model.GPT.flops_per_token() (of that recipe) / the GPU's dense bf16 peak
                  (PEAK_BF16_TFLOPS, by device name); a GPU not in that table: n/a
    peak GB       torch.cuda.max_memory_allocated, from Composer's MemoryMonitor in the run's file log (1e9 bytes)
    1st batch s   from train.py's logger set-up to the end of batch 1: mostly the compile
    optimizer ms  the median optimizer update (Muon and its AdamW groups for the presets, fused AdamW for gpt2), timed
                  by race_clock.py in the run itself on every 10th step from batch 10: the closure (the microbatches'
                  forward and backward) runs first, then a device sync, the update alone, another sync. In the real
                  run, on the real model and gradients, rather than in a separate process: no second copy of the
                  model, and no guess at what Composer's step leaves around the optimizer
    optimizer share  optimizer ms over the median step's ms: Muon's share of the step for the presets

The older rows (--variants, run after the race while the budget lasts; none by default): random GPT-2 token ids
written as a prepare_data .bin and converted by to_mds.py (zstd), 30 steps each of pile.py's model, the median step
of steps warmup+1 .. steps-1, with the columns above plus vocab and microbatch:
    eager-50257-fixed     the baseline: pile.py unpadded (compile=False, vocab 50257 as it was, microbatch 12)
    eager-50304-fixed     vocab padded to a multiple of 64
    eager-50304-muon      eager-50304-fixed with optimizer="muon" instead of AdamW: what Muon's steps cost
    eager-50304-modern    eager-50304-fixed with config/modern.py applied after pile.py (the architecture preset)
    eager-50304-fsdp      eager-50304-fixed with fsdp=True: FSDP2 on one GPU (its all-gathers and reduce-scatters
                          over one rank, the sharded optimizer state), against eager-50304-fixed's DDP step
    compile-50304-fixed   eager-50304-fixed and torch.compile (train.py --compile=True)
    compile-50304-modern  compile-50304-fixed with config/modern.py
    eager-50304-auto      microbatch "auto" instead of 12 (Composer: start at the whole batch, halve on each CUDA OOM)
    compile-50304-auto    compile + padded vocab + "auto"
    compile-50257-fixed   compile without the padding
    loader, W workers     (--loader-workers W,...) loaders.build_dataloaders on the same data with pile.py's settings,
                          iterated --loader-batches batches with no model
and a recommendation for config/pile.py's defaults from them. Measured on one H200 (2026-12-04,
docs/performance.md#on-a-gpu): 69-81 s per eager variant, 114 s compiled (29 s of it before batch 1); a variant
starts only with MIN_RUN_S left of --budget-s.

Time on one H100 (estimated from the H200's figures, not yet run): ~30 s for the text (16 cores), then the
allowances (305 s) and 3 x 75 s of race = ~9.3 min at the defaults; --budget-s (480 by default; gpu_run.sh gives
what its lease leaves) shrinks the race's seconds to fit.

Nothing measured is lost at a cut. The tables are rewritten to --out after every run and every POLL_S while a
contestant runs (its row so far, "running"); race_clock.py appends each evaluation and each optimizer timing as it
is taken; every run's save folder (metrics.jsonl, config.json, Composer's log; its checkpoints dropped after the run),
train.py's output and the race clock are in --logs (default {out stem}_logs/). SIGTERM stops the run in flight with
its process group, adds its row (how far it came) and exits 143. A contestant that fails is a row with its last
error line; when no contestant trained a batch, the bench exits 1. An unreadable .py file is left out of the text.

--smoke: the same code on CPU in fp32 with a tiny model (2 layers, 64 wide, block 64, batch 8 of microbatch 4),
eager (compiling on CPU costs minutes for nothing this bench measures), 150k tokens of text, 3 s of race each, an
evaluation every 2 batches; the compile and "auto" variants are marked "skipped: GPU only".
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pilegpt.common import UserError, atomic_write_text, run_main  # noqa: E402

PILE = REPO / "config" / "pile.py"
PILE_GPUS = 8  # config/pile.py's global batch is sized for one node of 8 GPUs
GPT2_VOCAB = 50257  # the token ids of the synthetic data are drawn from it
# Budget a variant needs left to be worth starting: eager 69-81 s, compiled 114 s on one H200 (measured, see above)
MIN_RUN_S = {"eager": 85, "compile": 130, "smoke": 10}
# Thresholds for the recommendation: a gain below them is noise on a 20-step median, not a reason to change a default.
COMPILE_GAIN, VOCAB_GAIN, AUTO_GAIN = 1.05, 1.01, 1.03
LOADER_HEADROOM = 2.0  # the loader should deliver at least this many times what the fastest training row consumes

# Dense bf16 tensor-core peaks in TFLOPs (vendor datasheets; the sparse figures are twice these), matched against
# torch.cuda.get_device_name().lower() in order: the first entry whose substrings all occur wins.
PEAK_BF16_TFLOPS = (
    (("h200",), 989.0),  # also GH200
    (("h100", "pcie"), 756.0),
    (("h100", "hbm2e"), 756.0),
    (("h100", "nvl"), 835.0),
    (("h100",), 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    (("b200",), 2250.0),
    (("a100",), 312.0),
    (("l40s",), 362.0),
    (("l40",), 181.0),
    (("l4",), 121.0),
    (("a10",), 125.0),
)


@dataclass(frozen=True)
class Variant:
    name: str
    compile: bool
    vocab_size: int
    auto_microbatch: bool
    optimizer: str = "adamw"  # train.py's optimizer setting
    preset: str = ""  # a config file applied after config/pile.py, e.g. "modern.py"
    fsdp: bool = False  # train.py's fsdp setting: FSDP2 on one GPU, its own overhead against DDP's step

    @property
    def gpu_only(self) -> bool:
        """"auto" needs CUDA OOMs to search; compiling on CPU costs minutes for nothing this bench measures."""
        return self.compile or self.auto_microbatch


VARIANTS = (  # the baseline first, then what the recommendation needs; the budget cuts from the end
    Variant("eager-50257-fixed", compile=False, vocab_size=50257, auto_microbatch=False),
    Variant("eager-50304-fixed", compile=False, vocab_size=50304, auto_microbatch=False),
    Variant("eager-50304-muon", compile=False, vocab_size=50304, auto_microbatch=False, optimizer="muon"),
    Variant("eager-50304-modern", compile=False, vocab_size=50304, auto_microbatch=False, preset="modern.py"),
    Variant("eager-50304-fsdp", compile=False, vocab_size=50304, auto_microbatch=False, fsdp=True),
    Variant("compile-50304-fixed", compile=True, vocab_size=50304, auto_microbatch=False),
    Variant("compile-50304-modern", compile=True, vocab_size=50304, auto_microbatch=False, preset="modern.py"),
    Variant("eager-50304-auto", compile=False, vocab_size=50304, auto_microbatch=True),
    Variant("compile-50304-auto", compile=True, vocab_size=50304, auto_microbatch=True),
    Variant("compile-50257-fixed", compile=True, vocab_size=50257, auto_microbatch=False),
)
BASELINE = VARIANTS[0].name

SMOKE_MODEL = ["--n_layer=2", "--n_head=2", "--n_embd=64"]  # with --block 64 --batch 8 --microbatch 4 --steps 8


@dataclass
class Setup:
    """What every row shares: the data, the shape of a step, the device."""
    data_dir: Path
    work: Path  # scratch: caches and run folders
    logs: Optional[Path]  # where each run's output is kept (None: not kept)
    block_size: int
    batch: int  # sequences per step (global_batch_size on one process)
    microbatch: int  # the fixed microbatch
    steps: int
    warmup: int  # steps not timed
    smoke: bool
    extra: list[str]  # more train.py settings (the smoke model, the device)

    @property
    def runs(self) -> Path:
        """The runs' save folders: in the logs, so that what a cut run wrote is kept (its checkpoints are dropped)."""
        return (self.logs or self.work) / "runs"

    def train_args(self) -> list[str]:
        """train.py settings of every row after config/pile.py: the bench's data, length and logging."""
        return [f"--data_dir={self.data_dir}", f"--block_size={self.block_size}", f"--global_batch_size={self.batch}",
                f"--max_duration={self.steps}ba", f"--warmup={self.warmup}ba", "--eval_interval=1000000ba",
                "--eval_subset_num_batches=1", "--hellaswag_examples=0", "--save_interval=1000000ba",
                "--sample_length=0", "--progress_bar=False", "--log_interval=10", "--autoresume=False",
                "--save_overwrite=True", f"--speed_window={max(1, self.steps - self.warmup - 1)}", *self.extra]


@dataclass
class Row:
    """One line of the table."""
    name: str
    compile: str = ""
    vocab: str = ""
    microbatch: str = ""
    tokens_per_s: Optional[float] = None
    samples_per_s: Optional[float] = None
    mfu: str = ""
    peak_gb: Optional[float] = None
    first_batch_s: Optional[float] = None
    run_s: Optional[float] = None
    note: str = ""
    gpu: Optional[str] = None  # the device train.py ran on (config.json), for the header
    versions: str = ""  # torch/Composer/commit from config.json, for the header


# ----------------------------------------------------------------------------------------------------------
# The race: GPT-2's recipe against the presets, compiled, on real text, for the same seconds each

@dataclass(frozen=True)
class Contestant:
    name: str
    presets: tuple[str, ...]  # config files applied after config/pile.py
    startup_s: float  # on a GPU: start-up, data, compile (training's and evaluation's) and the final checkpoint


# The allowances, estimated (no GPU has run the presets yet): gpt2's 75 s from the H200's 29 s before batch 1 and an
# eager run's ~70 s of overhead, of which ~44 s is compiling (batch 1's and the evaluation's graphs) and ~31 s the
# rest; the presets' compile scaled by their graphs' nodes (modern 833, nanochat 906, GPT-2 460):
# 31 + 44 x 833 / 460 = 111 s and 31 + 44 x 906 / 460 = 118 s, to the nearest 10 s. A contestant cut before its
# last evaluation loses its end of the curve: rather too much than too little.
CONTESTANTS = (Contestant("gpt2", (), 75.0), Contestant("modern", ("modern.py",), 110.0),
               Contestant("nanochat", ("nanochat.py",), 120.0))
RACE_S = {"gpu": 75.0, "smoke": 3.0}  # seconds of training each (--race-s)
SMOKE_STARTUP_S = 15.0  # --smoke: every contestant's allowance (a cold start on a busy 2-core CPU, eager)
POLL_S = 5.0  # while a contestant runs, the table is rewritten this often with what it has reached
MIN_RACE_S = {"gpu": 20.0, "smoke": 1.0}  # less than this each and the race is skipped with a note
RACE_TOKENS = {"gpu": 40_000_000, "smoke": 150_000}  # train tokens of the race's text (--race-tokens)
RACE_VAL = {"gpu": 0.02, "smoke": 0.2}  # the fraction of the documents (files) held out for val
RACE_WARMUP = {"gpu": 50, "smoke": 5}  # batches of linear warmup, then the peak rates (see the docstring)
RACE_EVAL = {"gpu": (50, 8), "smoke": (2, 1)}  # an evaluation every N batches, of M batches of 16 sequences
# race_clock.py's optimizer timing from batch first_timed on, every sample_every-th step; --smoke: at least
# min_batches whatever the seconds, so the test has steps to time on a busy CPU
RACE_CLOCK = {"gpu": {"first_timed": 10, "sample_every": 10}, "smoke": {"first_timed": 2, "sample_every": 1,
                                                                         "min_batches": 6}}
RACE_STEP_WARMUP = {"gpu": 10, "smoke": 1}  # batches left out of the median step: the compile and its warm-up
RACE_HORIZON = 100_000  # max_duration in batches: never reached in the race, so the cosine stays near its peak


def contestants() -> tuple[list[Contestant], list[str]]:
    """(those whose config files exist, a note for each that does not)."""
    here = [c for c in CONTESTANTS if all((REPO / "config" / p).is_file() for p in c.presets)]
    notes = [f"{c.name}: skipped, config/{' config/'.join(c.presets)} is not in this checkout"
             for c in CONTESTANTS if c not in here]
    return here, notes


def python_sources() -> list[Path]:
    """This interpreter's Python sources: the standard library's, then the installed packages', each sorted."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    packages = [Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")]
    own = sorted(p for p in stdlib.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts))
    installed = sorted({p for root in dict.fromkeys(packages) if root.is_dir() for p in root.rglob("*.py")})
    return own + installed


def write_race_text(folder: Path, tokens: int, workers: int, val_fraction: float,
                    timeout_s: float) -> tuple[Path, int]:
    """The race's text: this machine's Python sources, each file one document (numbered: prepare_data.py takes a
    name with "val" in it for a validation file), about 4 bytes a token, tokenized by prepare_data.py (GPT-2 BPE,
    `val_fraction` of the documents for val, --max-tokens train tokens): (folder/tokens, the files skipped because
    they could not be read: no permission, a broken link, a folder named *.py)."""
    text = folder / "text"
    text.mkdir(parents=True, exist_ok=True)
    written = skipped = 0
    for i, source in enumerate(python_sources()):
        if written >= 4 * tokens:
            break
        try:
            body = source.read_text(encoding="utf-8", errors="replace")
        except OSError:
            skipped += 1
            continue
        if body.strip():
            (text / f"{i:06d}.txt").write_text(body)
            written += len(body)
    out, log = folder / "tokens", folder / "prepare_data.out.txt"
    cmd = [sys.executable, str(REPO / "prepare_data.py"), "--input", str(text), "--val-fraction", str(val_fraction),
           "--max-tokens", str(tokens), "--num-proc", str(workers), "--out-dir", str(out)]
    returncode, timed_out = run_with_timeout(cmd, REPO, dict(os.environ), log, timeout_s)
    if returncode != 0:
        why = f"stopped by the budget after {timeout_s:.0f} s" if timed_out else f"exit {returncode}"
        raise UserError(f"prepare_data.py failed on the race's text ({why}): {log.read_text(errors='replace')[-2000:]}")
    shutil.rmtree(text, ignore_errors=True)
    return out, skipped


@dataclass
class RaceRun:
    """One contestant: its step (the first table) and its val loss against seconds (the race's table)."""
    name: str
    config: str
    compiled: bool
    tokens_per_s: Optional[float] = None
    mfu: str = ""
    peak_gb: Optional[float] = None
    first_batch_s: Optional[float] = None
    step_ms: Optional[float] = None  # the median step
    optimizer_ms: Optional[float] = None  # the median optimizer update (race_clock.py)
    curve: list[tuple[float, float]] = field(default_factory=list)  # (race seconds, val loss)
    batches: int = 0
    tokens: int = 0
    run_s: Optional[float] = None
    note: str = ""
    versions: str = ""


def race_settings(setup: Setup, c: Contestant, precision: str, seconds: float, clock: Path) -> list[str]:
    """train.py's arguments for contestant c: config/pile.py, its presets, then the race's settings (last, so a
    preset's own schedule, batch or data settings give way to the race's: every contestant runs the same)."""
    kind = "smoke" if setup.smoke else "gpu"
    every, eval_batches = RACE_EVAL[kind]
    callbacks = {"race_clock:RaceClock": {"seconds": seconds, "path": str(clock), **RACE_CLOCK[kind]}}
    return [str(PILE), *[str(REPO / "config" / p) for p in c.presets], f"--data_dir={setup.data_dir}",
            f"--block_size={setup.block_size}", f"--global_batch_size={setup.batch}",
            f"--device_train_microbatch_size={setup.microbatch}", f"--max_duration={RACE_HORIZON}ba",
            f"--warmup={RACE_WARMUP[kind]}ba", f"--eval_interval={every}ba",
            f"--eval_subset_num_batches={eval_batches}",
            "--hellaswag_examples=0", "--save_interval=1000000ba", "--sample_length=0", "--progress_bar=False",
            "--log_interval=50", "--autoresume=False", "--save_overwrite=True", "--speed_window=20",
            f"--run_name=race-{c.name}", f"--save_folder={setup.runs / ('race-' + c.name)}",
            f"--compile={not setup.smoke}", f"--precision={precision}", f"--callbacks={callbacks!r}", *setup.extra]


class Cut(Exception):
    """SIGTERM reached the bench (a time limit, a person): the run in flight is stopped with its process group, its
    row says how far it came, and the tables are written once more. `run`: that row, when a contestant was running."""

    def __init__(self) -> None:
        super().__init__("stopped by SIGTERM")
        self.run: Optional[RaceRun] = None


def on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one notice: a second SIGTERM does not break the clean-up
    raise Cut()


def run_contestant(setup: Setup, c: Contestant, precision: str, seconds: float, timeout_s: float,
                   show=lambda run: None) -> RaceRun:
    """One train.py process for `seconds` of training after batch 1; its step and its curve. Every POLL_S while it
    runs, show(the row so far); on SIGTERM (Cut) the row of what it reached goes with the exception."""
    run_dir, logs = setup.runs / f"race-{c.name}", setup.logs or setup.work
    clock, out_file = logs / f"race-{c.name}.clock.jsonl", logs / f"race-{c.name}.out.txt"
    run = RaceRun(c.name, " + ".join(["pile.py", *c.presets]), compiled=not setup.smoke)
    cmd = [sys.executable, str(REPO / "train.py"), *race_settings(setup, c, precision, seconds, clock)]
    print(f"race {c.name}: {' '.join(cmd[1:])}", flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)  # a folder of an earlier bench in the same --logs
    clock.unlink(missing_ok=True)  # the clock appends
    out_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def progress() -> None:
        read_race(run, c, setup, run_dir, clock)
        run.note = f"running: {time.monotonic() - t0:.0f} s so far"
        show(run)

    try:
        returncode, timed_out = run_with_timeout(cmd, setup.work, train_env(setup), out_file, timeout_s, progress)
    except Cut as cut:
        run.run_s = time.monotonic() - t0
        read_race(run, c, setup, run_dir, clock)
        run.note = f"cut by SIGTERM after {run.run_s:.0f} s and {run.batches} batches"
        drop_checkpoints(run_dir)
        cut.run = run
        raise
    run.run_s = time.monotonic() - t0
    read_race(run, c, setup, run_dir, clock)
    drop_checkpoints(run_dir)
    run.note = ""
    if timed_out:
        run.note = f"stopped by the budget after {run.run_s:.0f} s and {run.batches} batches"
    elif returncode != 0:
        run.note = outcome_note(Row(c.name), False, returncode, out_file.read_text(errors="replace"), 0, 0)
    print(f"race {c.name}: {fmt(run.tokens_per_s, '.0f')} tokens/s, {len(run.curve)} evaluations, final val loss "
          f"{fmt(run.curve[-1][1] if run.curve else None, '.4f')}, {run.run_s:.0f} s {run.note}", flush=True)
    return run


def read_race(run: RaceRun, c: Contestant, setup: Setup, run_dir: Path, clock: Path) -> None:
    """Fill `run` from metrics.jsonl (steps, val losses), the clock file and Composer's file log."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    by_batch = {r["batch"]: r for r in rows}
    run.batches = max(by_batch, default=0)
    run.tokens = by_batch[run.batches]["tokens"] if run.batches else 0
    run.first_batch_s = by_batch[1]["time_s"] if 1 in by_batch else None
    run.tokens_per_s, _ = step_timing(rows, warmup=RACE_STEP_WARMUP["smoke" if setup.smoke else "gpu"],
                                      last_step=run.batches)
    if run.tokens_per_s is not None:
        run.step_ms = 1000 * setup.batch * setup.block_size / run.tokens_per_s
    marks = read_jsonl(clock)
    run.curve = sorted({m["batch"]: (m["train_s"], m["val_loss"]) for m in marks if "val_loss" in m}.values())
    timings = [ms for m in marks for ms in m.get("optimizer_ms", [])]
    run.optimizer_ms = statistics.median(timings) if timings else None
    logs = sorted((run_dir / "logs").glob("*-rank0.txt"))
    run.peak_gb = read_file_log(logs[-1].read_text())[0] if logs else None
    config = run_dir / "config.json"
    info = json.loads(config.read_text()) if config.is_file() else {}
    gpu = info.get("gpu")
    if info:
        run.versions = (f"torch {info.get('torch')}, composer {info.get('composer')}, commit "
                        f"{(info.get('git_commit') or 'unknown')[:12]}")
    peak = peak_tflops(gpu) if gpu else None
    if run.tokens_per_s is not None:
        flops = flops_per_token(setup.extra, setup.block_size, c.presets)
        run.mfu = (f"{100 * run.tokens_per_s * flops / (peak * 1e12):.1f}%" if peak
                   else "n/a" if gpu else "n/a (CPU)")


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a file of JSON lines that may still be written (a run in flight, one cut mid-line): a line
    that does not parse as an object is left out. [] for no file."""
    rows = []
    for line in (path.read_text(errors="replace").splitlines() if path.is_file() else []):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def reaches(curve: list[tuple[float, float]], target: float) -> Optional[float]:
    """The first second at which `curve` (seconds, loss) is at or below `target`, linear between evaluations."""
    for i, (s, loss) in enumerate(curve):
        if loss <= target:
            if i == 0:
                return s
            s0, l0 = curve[i - 1]
            return s0 + (s - s0) * (l0 - target) / (l0 - loss)
    return None


def loss_at(curve: list[tuple[float, float]], second: float) -> Optional[float]:
    """The val loss at `second`, linear between evaluations; None outside the curve."""
    for (s0, l0), (s1, l1) in zip(curve, curve[1:]):
        if s0 <= second <= s1:
            return l0 if s1 == s0 else l0 + (l1 - l0) * (second - s0) / (s1 - s0)
    return curve[0][1] if curve and curve[0][0] == second else None


def allowance(c: Contestant, smoke: bool) -> float:
    """Contestant c's seconds of start-up, compile and final checkpoint, besides its race seconds."""
    return SMOKE_STARTUP_S if smoke else c.startup_s


def race_seconds(args: argparse.Namespace, left: float, allowances: Sequence[float]) -> float:
    """Each contestant's seconds: --race-s, or less, the same for all, when the budget left cannot pay them and
    every contestant's allowance."""
    kind = "smoke" if args.smoke else "gpu"
    want = args.race_s if args.race_s is not None else RACE_S[kind]
    return min(want, (left - sum(allowances)) / max(len(allowances), 1))


def contestant_timeout(left: float, seconds: float, allowances: Sequence[float]) -> float:
    """The first of the contestants still to run: its seconds and allowance, and an even share of what the budget
    left holds beyond every remaining contestant's (a slow compile stops its own run, not the next one's)."""
    spare = max(0.0, left - sum(seconds + a for a in allowances))
    return seconds + allowances[0] + spare / len(allowances)


def run_race(table: "Table", setup: Setup, args: argparse.Namespace, precision: str, t_start: float) -> None:
    """The race's text, then each contestant for the same seconds; both tables rewritten after each."""
    here, table.race_notes = contestants()
    kind = "smoke" if setup.smoke else "gpu"
    t_text = time.monotonic()
    tokens = args.race_tokens or RACE_TOKENS[kind]
    # the smoke's 150k tokens in-process: a pool of tokenizer processes would only start up (and once, under the
    # suite's warm start and load, its spawned workers stalled at 0% until the budget ran out)
    workers = 1 if setup.smoke else min(os.cpu_count() or 1, 16)
    setup.data_dir, skipped = write_race_text(setup.work / "race", tokens, workers=workers,
                                              val_fraction=RACE_VAL[kind],
                                              timeout_s=args.budget_s - (time.monotonic() - t_start))
    if skipped:
        table.race_notes.append(f"{skipped} unreadable .py files left out of the text")
    splits = json.loads((setup.data_dir / "meta.json").read_text())["splits"]
    if "val" not in splits:
        raise UserError(f"the race's text has no val split ({splits['train']['documents']} documents): give it more "
                        "with --race-tokens")
    table.race_train_tokens = splits["train"]["tokens"]
    table.race_text = (f"The text: {splits['train']['tokens']:,} train and {splits['val']['tokens']:,} "
                       f"val tokens (whole files) of this machine's Python sources, GPT-2 BPE (prepare_data.py, "
                       f"{time.monotonic() - t_text:.0f} s). Every contestant: {setup.batch} x {setup.block_size} "
                       f"tokens a step, microbatch {setup.microbatch}, {RACE_WARMUP[kind]} batches of warmup, then "
                       f"its recipe's peak rates (the cosine's horizon, {RACE_HORIZON:,} batches, is far off); val "
                       f"loss every {RACE_EVAL[kind][0]} batches on the same {RACE_EVAL[kind][1]} x 16 sequences.")
    left = args.budget_s - (time.monotonic() - t_start)
    allowances = [allowance(c, setup.smoke) for c in here]
    seconds = race_seconds(args, left, allowances)
    if seconds < MIN_RACE_S[kind]:
        table.race_notes.append(f"race skipped: {max(seconds, 0):.0f} s of training each (--race-s, or what "
                                f"{max(left, 0):.0f} s left of --budget-s {args.budget_s:.0f} pays after the "
                                f"contestants' {sum(allowances):.0f} s of start-up) is under {MIN_RACE_S[kind]:.0f} s")
        return
    table.race_s = seconds
    for i, c in enumerate(here):
        left = args.budget_s - (time.monotonic() - t_start)
        try:
            table.race.append(run_contestant(setup, c, precision, seconds, contestant_timeout(
                left, seconds, allowances[i:]), show=table.show))
        except Cut as cut:
            table.race += [cut.run] if cut.run else []
            raise
        finally:
            table.save()


# ----------------------------------------------------------------------------------------------------------
# Reading a run: metrics.jsonl, Composer's file log, config.json

def peak_tflops(device_name: str) -> Optional[float]:
    name = device_name.lower()
    for parts, tflops in PEAK_BF16_TFLOPS:
        if all(p in name for p in parts):
            return tflops
    return None


def step_timing(rows: list[dict], warmup: int, last_step: int) -> tuple[Optional[float], int]:
    """(tokens/s, steps timed): tokens per step over the median step time of the steps after `warmup`, leaving out
    `last_step` (the one that also holds the final evaluation and checkpoint). None when no step qualifies."""
    by_batch = {r["batch"]: r for r in rows}
    steps = [(by_batch[b]["tokens"] - by_batch[b - 1]["tokens"], by_batch[b]["time_s"] - by_batch[b - 1]["time_s"])
             for b in sorted(by_batch) if b > warmup and b != last_step and b - 1 in by_batch]
    steps = [(tok, dt) for tok, dt in steps if dt > 0]
    if not steps:
        return None, 0
    return statistics.median(tok for tok, _ in steps) / statistics.median(dt for _, dt in steps), len(steps)


def read_file_log(text: str) -> tuple[Optional[float], Optional[int]]:
    """(peak allocated GB, the last train microbatch size) from a Composer FileLogger log, as it writes metrics:
    `[metric][batch=N]: memory/peak_allocated_mem: 12.3456`. None where the log has no such line (CPU runs)."""
    peaks = [float(v) for v in re.findall(r"memory/peak_allocated_mem: ([0-9.eE+-]+)", text)]
    sizes = re.findall(r"trainer/device_train_microbatch_size: (\d+)", text)
    return (max(peaks) if peaks else None), (int(sizes[-1]) if sizes else None)


def flops_per_token(extra: list[str], block_size: int, presets: Sequence[str] = (),
                    vocab_size: Optional[int] = None) -> int:
    """model.GPT's training FLOPs per token for the bench's model (config/pile.py, then `presets`), built on the meta
    device (no memory, no init)."""
    import torch

    from model import GPT
    from pilegpt.train.config_load import load_config

    vocab = [f"--vocab_size={vocab_size}"] if vocab_size else []
    cfg = load_config([str(PILE), *[str(REPO / "config" / p) for p in presets], f"--block_size={block_size}", *vocab,
                       "--data_dir=.", *[a for a in extra if a.split("=")[0] in ("--n_layer", "--n_head", "--n_embd")]])
    with torch.device("meta"):
        return GPT(cfg.model_config()).flops_per_token()


# ----------------------------------------------------------------------------------------------------------
# Running the rows

def write_data(folder: Path, n_train: int, n_val: int, block_size: int, seed: int = 0) -> Path:
    """Random GPT-2 token ids as a .bin dataset (data.write_token_files), converted by to_mds.py into folder/mds
    (train/, val/): the files to_mds writes for the real data, zstd and checksums included."""
    import numpy as np

    import to_mds
    from pilegpt.data import write_token_files

    rng = np.random.default_rng(seed)
    bins = folder / "bin"
    write_token_files(bins, {split: rng.integers(0, GPT2_VOCAB, n * block_size + 1, dtype=np.uint16)
                             for split, n in (("train", n_train), ("val", n_val))}, source="bench_gpu.py: random ids")
    to_mds.main(["--bin", str(bins), "--out", str(folder / "mds"), "--block-size", str(block_size)])
    return folder / "mds"


def drop_checkpoints(run_dir: Path) -> None:
    """A run's checkpoints (1.5 GB each at 124M) removed; its metrics.jsonl, config.json and logs stay."""
    for path in sorted(run_dir.rglob("*.pt")) if run_dir.is_dir() else []:
        path.unlink(missing_ok=True)


def variant_settings(setup: Setup, v: Variant, precision: str) -> list[str]:
    """train.py's arguments for variant v: config/pile.py, the bench's settings, the variant's, its preset file."""
    run_dir = setup.runs / v.name
    microbatch = "auto" if v.auto_microbatch else str(setup.microbatch)
    return [str(PILE), *setup.train_args(), f"--run_name={v.name}", f"--save_folder={run_dir}",
            f"--data_local={setup.work / 'cache' / v.name}", f"--compile={v.compile}", f"--vocab_size={v.vocab_size}",
            f"--device_train_microbatch_size={microbatch}", f"--precision={precision}", f"--optimizer={v.optimizer}",
            f"--fsdp={v.fsdp}", *([str(REPO / "config" / v.preset)] if v.preset else [])]


def run_variant(setup: Setup, v: Variant, precision: str, timeout_s: float) -> Row:
    """One real train.py process; its row from metrics.jsonl, config.json and Composer's file log."""
    run_dir = setup.runs / v.name
    microbatch = "auto" if v.auto_microbatch else str(setup.microbatch)
    row = Row(v.name, compile="yes" if v.compile else "no", vocab=str(v.vocab_size), microbatch=microbatch)
    cmd = [sys.executable, str(REPO / "train.py"), *variant_settings(setup, v, precision)]
    env = train_env(setup)
    print(f"{v.name}: {' '.join(cmd[1:])}", flush=True)
    out_file = (setup.logs or setup.work) / f"{v.name}.out.txt"  # a file, not a pipe: nothing to wait on if killed
    out_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    returncode, timed_out = run_with_timeout(cmd, setup.work, env, out_file, timeout_s)
    row.run_s = time.monotonic() - t0
    output = out_file.read_text(errors="replace")
    timed, batches = read_run(row, v, setup, run_dir)
    drop_checkpoints(run_dir)
    row.note = outcome_note(row, timed_out, returncode, output, timed, batches)
    print(f"{v.name}: {fmt(row.tokens_per_s, '.0f')} tokens/s, MFU {row.mfu or 'n/a'}, peak "
          f"{fmt(row.peak_gb, '.1f')} GB, {row.run_s:.0f} s; {row.note}", flush=True)
    return row


def train_env(setup: Setup) -> dict:
    """train.py's environment: unbuffered output, bench/ on PYTHONPATH (race_clock.py), one thread for --smoke."""
    path = os.pathsep.join(p for p in (str(REPO / "bench"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    if setup.smoke:
        env.setdefault("OMP_NUM_THREADS", "1")  # a tiny model on a shared CPU: one thread is fastest and steadiest
    return env


def start_process(cmd: list[str], cwd: Path, env: dict, out_file: Path) -> subprocess.Popen:
    """`cmd` in a session of its own (so that one killpg stops train.py and its DataLoader and compile workers
    together), its output to `out_file`: a file, not a pipe, so nothing waits on a reader if it is killed."""
    with open(out_file, "w") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def run_with_timeout(cmd: list[str], cwd: Path, env: dict, out_file: Path, timeout_s: float,
                     on_poll=None) -> tuple[int, bool]:
    """Run `cmd` (start_process) with its output to `out_file`, calling on_poll() every POLL_S while it runs;
    (exit code, whether it was killed at `timeout_s`). However this ends (the timeout, SIGTERM's Cut, an error in
    on_poll), the process group is killed before it returns."""
    proc, deadline = None, time.monotonic() + timeout_s
    try:
        proc = start_process(cmd, cwd, env, out_file)
        while True:
            try:
                return proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic()))), False
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    kill_group(proc)
                    return proc.returncode, True
                if on_poll is not None:
                    on_poll()
    finally:
        if proc is not None:  # also what it left behind when it ended by itself (a DataLoader worker)
            kill_group(proc)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to proc's process group, then reap proc (whose group may be gone already: it ended just now)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def read_run(row: Row, v: Variant, setup: Setup, run_dir: Path) -> tuple[int, int]:
    """Fill `row` from the run's metrics.jsonl, Composer's file log and config.json; (steps timed, last batch)."""
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    row.tokens_per_s, timed = step_timing(rows, setup.warmup, last_step=setup.steps)
    if row.tokens_per_s is not None:
        row.samples_per_s = row.tokens_per_s / setup.block_size
    by_batch = {r["batch"]: r for r in rows}
    if 1 in by_batch:
        row.first_batch_s = by_batch[1]["time_s"]
    composer_mfu = next((r["mfu"] for r in reversed(rows) if "mfu" in r), None)
    logs = sorted((run_dir / "logs").glob("*-rank0.txt"))
    row.peak_gb, chosen = read_file_log(logs[-1].read_text()) if logs else (None, None)
    if v.auto_microbatch and chosen is not None:
        row.microbatch = f"auto -> {chosen}"
    config = run_dir / "config.json"
    if config.is_file():
        info = json.loads(config.read_text())
        row.gpu = info.get("gpu")
        row.versions = (f"torch {info.get('torch')}, composer {info.get('composer')}, streaming "
                        f"{info.get('streaming')}, commit {(info.get('git_commit') or 'unknown')[:12]}")
    row.mfu = mfu_text(row, v, setup, composer_mfu)
    return timed, max(by_batch, default=0)


def outcome_note(row: Row, timed_out: bool, returncode: int, output: str, timed: int, batches: int) -> str:
    """The row's note: stopped by the budget, failed (with the last error line), or the steps timed."""
    note = row.note
    if timed_out:
        note = f"stopped by the budget after {row.run_s:.0f} s and {batches} batches"
    elif returncode != 0:
        lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if "Error" in ln or ln.startswith("error:")), lines[-1] if lines
                    else "no output")
        note = f"failed (exit {returncode}): {last[:200]}"
    if row.tokens_per_s is None and not note:
        return "no timed steps in metrics.jsonl"
    if row.tokens_per_s is not None:
        return "; ".join(n for n in (note, f"{timed} steps timed") if n)
    return note


def mfu_text(row: Row, v: Variant, setup: Setup, composer_mfu: Optional[float]) -> str:
    if row.tokens_per_s is None:
        return ""
    if not row.gpu:
        return "n/a (CPU)"
    peak = peak_tflops(row.gpu)
    if peak is not None:
        flops = flops_per_token(setup.extra, setup.block_size, [v.preset] if v.preset else [], v.vocab_size)
        return f"{100 * row.tokens_per_s * flops / (peak * 1e12):.1f}%"
    return f"{100 * composer_mfu:.1f}% (Composer)" if composer_mfu else "n/a"


def stop_streaming_threads(dataset) -> None:
    """End the download threads of a StreamingDataset iterated in this process (num_workers=0). They run on to the
    end of the epoch and would write shards into the cache while the temporary folder is being removed. Streaming
    has no public call for this: its own __iter__ stops the previous epoch's threads the same way."""
    iterator, executor = getattr(dataset, "_iterator", None), getattr(dataset, "_executor", None)
    if iterator is not None:
        iterator.exit()
    if executor is not None:
        executor.shutdown(wait=True)


def bench_loader(setup: Setup, workers: int, batches: int) -> Row:
    """loaders.build_dataloaders with pile.py's settings and `workers` DataLoader workers: samples/s over `batches`
    batches after the first (which pays for starting the workers and opening the shards), with no model."""
    import composer  # noqa: F401  (imported before the clock starts: train.py's start-up is not the loader's)
    import torch

    from pilegpt.train.config_load import load_config
    from pilegpt.train.data.loaders import build_dataloaders

    row = Row(f"loader, {workers} workers", note=f"build_dataloaders, {batches} batches of {setup.batch}, no model")
    t0 = time.monotonic()
    spec = loader = it = None
    try:
        cfg = load_config([str(PILE), *setup.train_args(), f"--num_workers={workers}",
                           f"--data_local={setup.work / 'cache' / f'loader-{workers}'}",
                           f"--device_train_microbatch_size={setup.microbatch}"])
        spec, _ = build_dataloaders(cfg, world_size=1, rank=0, pin_memory=torch.cuda.is_available())
        loader = spec.dataloader
        it = iter(loader)
        next(it)
        t1, samples, done = time.monotonic(), 0, 0
        while done < batches:
            try:
                batch = next(it)
            except StopIteration:  # the end of an epoch: a new one, as the trainer would
                it = iter(loader)
                continue
            samples += batch["x"].shape[0]
            done += 1
        row.samples_per_s = samples / (time.monotonic() - t1)
        row.tokens_per_s = row.samples_per_s * setup.block_size
    except Exception as e:  # a row that says what went wrong, not a lost table
        row.note = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        stop_streaming_threads(getattr(loader, "dataset", None))
        spec = loader = it = None
        gc.collect()  # ends the persistent workers now: idle Streaming workers still poll, and would slow the next row
    row.run_s = time.monotonic() - t0
    print(f"{row.name}: {fmt(row.samples_per_s, '.0f')} samples/s, {row.run_s:.0f} s {row.note}", flush=True)
    return row


# ----------------------------------------------------------------------------------------------------------
# The table and the recommendation

def fmt(value: Optional[float], spec: str) -> str:
    return "–" if value is None else format(value, spec)


def markdown_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in rows]]


def render_step(runs: list[RaceRun]) -> list[str]:
    """The first table: each contestant's compiled step, from its race run."""
    base = next((r.tokens_per_s for r in runs if r.name == "gpt2"), None)
    rows = []
    for r in runs:
        share = f"{100 * r.optimizer_ms / r.step_ms:.1f}%" if r.optimizer_ms and r.step_ms else None
        rows.append([r.name, r.config, "yes" if r.compiled else "no (--smoke)", fmt(r.tokens_per_s, ",.0f"),
                     f"{r.tokens_per_s / base:.2f}x" if r.tokens_per_s and base else "–", r.mfu or "–",
                     fmt(r.peak_gb, ".1f"), fmt(r.first_batch_s, ".1f"), fmt(r.step_ms, ".1f"),
                     fmt(r.optimizer_ms, ".1f"), share or "–", r.note or "–"])
    return markdown_table(["recipe", "config", "compiled", "tokens/s", "vs gpt2", "MFU", "peak GB", "1st batch s",
                           "step ms", "optimizer ms", "optimizer share", "note"], rows)


def render_race(runs: list[RaceRun], seconds: float, train_tokens: int) -> list[str]:
    """The race's table: val loss at a quarter, half, three quarters and all of the seconds, and when each
    contestant reached GPT-2's final val loss."""
    marks = [seconds * f for f in (0.25, 0.5, 0.75)]
    gpt2 = next((r for r in runs if r.name == "gpt2" and r.curve), None)
    target = gpt2.curve[-1][1] if gpt2 else None
    base_s = reaches(gpt2.curve, target) if gpt2 else None
    rows = []
    for r in runs:
        at = reaches(r.curve, target) if target is not None else None
        rows.append([r.name, *[fmt(loss_at(r.curve, m), ".4f") for m in marks],
                     fmt(r.curve[-1][1] if r.curve else None, ".4f"), fmt(r.curve[-1][0] if r.curve else None, ".0f"),
                     str(r.batches), f"{r.tokens / train_tokens:.2f}" if train_tokens else "–",
                     "not reached" if target is not None and at is None else fmt(at, ".0f"),
                     f"{at / base_s:.2f}x" if at is not None and base_s else "–"])
    return markdown_table(["recipe", *[f"val @{round(m, 1):g} s" for m in marks], "final val", "at s", "batches",
                           "epochs of text", f"s to gpt2's final {fmt(target, '.4f')}", "vs gpt2"], rows)


def render(rows: list[Row], header: list[str], recommendation: str = "", race: Optional["Table"] = None) -> str:
    lines = list(header)
    if race is not None and (race.race or race.race_notes):
        lines += ["", "## The compiled step (from each race run)", "", *render_step(race.race), "",
                  f"## The race: val loss against training seconds ({race.race_s:.0f} s each after batch 1)", "",
                  race.race_text, ""]
        lines += render_race(race.race, race.race_s, race.race_train_tokens) if race.race else []
        lines += ["", *[f"- {n}" for n in race.race_notes]] if race.race_notes else []
    if not rows:
        return "\n".join(lines) + "\n"
    base = next((r.tokens_per_s for r in rows if r.name == BASELINE), None)
    columns = ["variant", "compile", "vocab", "microbatch", "tokens/s", f"vs {BASELINE}", "samples/s", "MFU",
               "peak GB", "1st batch s", "run s", "note"]
    lines += ["", "## More rows (--variants, --loader-workers)", "", "| " + " | ".join(columns) + " |",
              "|" + "---|" * len(columns)]
    for r in rows:
        ratio = f"{r.tokens_per_s / base:.2f}x" if r.tokens_per_s is not None and base else "–"
        cells = [r.name, r.compile or "–", r.vocab or "–", r.microbatch or "–", fmt(r.tokens_per_s, ",.0f"),
                 ratio, fmt(r.samples_per_s, ",.1f"), r.mfu or "–", fmt(r.peak_gb, ".1f"),
                 fmt(r.first_batch_s, ".1f"), fmt(r.run_s, ".0f"), r.note.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    if recommendation:
        lines += ["", recommendation]
    return "\n".join(lines) + "\n"


def recommend(rows: list[Row], pile: dict) -> str:
    """One line: the config/pile.py defaults the measured rows argue for, each with the figures behind it."""
    tps = {r.name: r.tokens_per_s for r in rows if r.tokens_per_s is not None and "loader" not in r.name}
    by_name = {r.name: r for r in rows}

    def gain(a: str, b: str) -> Optional[float]:
        return tps[a] / tps[b] if a in tps and b in tps else None

    def first_gain(pairs: list[tuple[str, str]]) -> tuple[Optional[float], str]:
        for a, b in pairs:
            if (g := gain(a, b)) is not None:
                return g, f"{a} vs {b}"
        return None, ""

    parts = []
    g, which = first_gain([("compile-50304-fixed", "eager-50304-fixed"), ("compile-50257-fixed", "eager-50257-fixed")])
    if g is None:
        parts.append(f"compile={pile['compile']} (not measured)")
    else:
        start = by_name[which.split(" vs ")[0]].first_batch_s
        cost = f", {start:.0f} s to the first batch" if start is not None else ""
        parts.append(f"compile={g >= COMPILE_GAIN} ({g:.2f}x, {which}{cost})")
    g, which = first_gain([("eager-50304-fixed", "eager-50257-fixed"), ("compile-50304-fixed", "compile-50257-fixed")])
    if g is None:
        parts.append(f"vocab_size={pile['vocab_size']} (not measured)")
    else:
        parts.append(f"vocab_size={50304 if g >= VOCAB_GAIN else 50257} ({g:.2f}x, {which})")
    g, which = first_gain([("compile-50304-auto", "compile-50304-fixed"), ("eager-50304-auto", "eager-50304-fixed")])
    mb = pile["device_train_microbatch_size"]
    if g is None:
        parts.append(f"device_train_microbatch_size={mb!r} (\"auto\" not measured)")
    elif g >= AUTO_GAIN:
        chosen = by_name[which.split(" vs ")[0]].microbatch.partition("-> ")[2]
        parts.append(f"device_train_microbatch_size={chosen or 'auto'} ({g:.2f}x, {which}: the size \"auto\" chose "
                     "on this GPU; keep \"auto\" for GPUs of other memory sizes)")
    else:
        parts.append(f"device_train_microbatch_size={mb!r} (\"auto\" {g:.2f}x, {which})")
    need = max((r.samples_per_s for r in rows if r.samples_per_s and "loader" not in r.name), default=None)
    loaders = sorted((int(r.name.split()[1]), r.samples_per_s) for r in rows if "loader" in r.name and r.samples_per_s)
    if need is None or not loaders:
        parts.append(f"num_workers={pile['num_workers']} (not measured)")
    else:
        # 0 workers load in the training process, in series with every step: a count > 0 is what can keep up
        enough = [(w, s) for w, s in loaders if s >= LOADER_HEADROOM * need and w > 0]
        if enough:
            w, s = enough[0]
            parts.append(f"num_workers={w} (the loader gives {s:,.0f} samples/s at {w} workers, "
                         f"{s / need:.0f}x the fastest row's {need:,.0f}; Streaming from S3 needs more)")
        else:
            w, s = loaders[-1]
            parts.append(f"num_workers: more than {w} (the loader gives {s:,.0f} samples/s at {w} workers, under "
                         f"{LOADER_HEADROOM:.0f}x the fastest row's {need:,.0f})")
    return "Recommended for config/pile.py, from this run: " + "; ".join(parts) + "."


# ----------------------------------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="also write the table here (rewritten after every row), and each run's "
                                            "logs to {out stem}_logs/ beside it")
    p.add_argument("--logs", type=Path, help="each run's output, save folder (less its checkpoints), race clock and "
                                             "Composer log here (default: {out stem}_logs/ beside --out)")
    p.add_argument("--smoke", action="store_true", help="CPU, fp32, a tiny model, GPU-only rows skipped (the test)")
    p.add_argument("--steps", type=int, help="steps per variant (default 30; smoke 8)")
    p.add_argument("--warmup", type=int, help="first steps not timed (default 10; smoke 3)")
    p.add_argument("--batch", type=int, help="sequences per step (default: config/pile.py's global_batch_size / "
                                             f"{PILE_GPUS} GPUs = 60; smoke 8)")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="seconds for everything from the start (default 480): the race's seconds shrink to fit it, "
                        "later rows are skipped")
    p.add_argument("--race-s", type=float, help="training seconds of each race contestant after compiling (default "
                                                f"{RACE_S['gpu']:.0f}; smoke {RACE_S['smoke']:.0f}); 0: no race")
    p.add_argument("--race-tokens", type=int, help="train tokens of the race's text (default "
                                                   f"{RACE_TOKENS['gpu']:,}; smoke {RACE_TOKENS['smoke']:,})")
    p.add_argument("--variants", nargs="+", default=[], choices=[v.name for v in VARIANTS], metavar="VARIANT",
                   help=f"after the race, these rows on random ids while the budget lasts: "
                        f"{', '.join(v.name for v in VARIANTS)}")
    p.add_argument("--loader-batches", type=int, default=50, help="batches per loader row (default 50)")
    p.add_argument("--loader-workers", help="comma-separated num_workers of loader rows, e.g. 8,2,0 (default: none)")
    return p.parse_args(argv)


class Plan(NamedTuple):
    """The sizes of the bench: from the flags, --smoke and config/pile.py."""
    steps: int
    warmup: int  # steps not timed
    batch: int  # sequences per step
    microbatch: int  # the fixed microbatch
    block_size: int
    workers: list[int]  # num_workers of the loader rows


def make_plan(args: argparse.Namespace, pile: dict) -> Plan:
    smoke = args.smoke
    steps = args.steps or (8 if smoke else 30)
    warmup = args.warmup if args.warmup is not None else (3 if smoke else 10)
    batch = args.batch or (8 if smoke else pile["global_batch_size"] // PILE_GPUS)
    microbatch = 4 if smoke else pile["device_train_microbatch_size"]
    if not isinstance(microbatch, int):
        microbatch = 12  # pile.py says "auto": the fixed rows use nanoGPT's 12
    block_size = 64 if smoke else pile["block_size"]
    if not 1 <= warmup < steps - 1:
        raise UserError(f"need 1 <= --warmup < --steps - 1 (the last step is not timed), got {warmup} and {steps}")
    if batch % microbatch:
        raise UserError(f"--batch {batch} must be a multiple of the fixed microbatch {microbatch}")
    if not math.isfinite(args.budget_s) or args.budget_s <= 0:
        raise UserError(f"--budget-s takes seconds > 0, got {args.budget_s}")
    if args.race_s is not None and (not math.isfinite(args.race_s) or args.race_s < 0):
        raise UserError(f"--race-s takes seconds >= 0 (0: no race), got {args.race_s}")
    if args.race_tokens is not None and args.race_tokens < 100 * block_size:
        raise UserError(f"--race-tokens takes at least 100 x block_size = {100 * block_size} tokens, got "
                        f"{args.race_tokens}")
    try:
        workers = [int(w) for w in args.loader_workers.split(",")] if args.loader_workers is not None else []
    except ValueError:
        workers = [-1]
    if any(w < 0 for w in workers):
        raise UserError(f"--loader-workers takes counts >= 0 with commas, e.g. 8,2,0; got {args.loader_workers}")
    return Plan(steps, warmup, batch, microbatch, block_size, workers)


def pick_device(smoke: bool) -> tuple[Optional[str], str, list[str]]:
    """(the GPU's name or None, the precision, the train.py settings of the device and the smoke model)."""
    import torch

    if smoke:
        return None, "fp32", [*SMOKE_MODEL, "--device=cpu", "--num_workers=2"]
    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU here: run `python bench/bench_gpu.py --smoke` for the CPU check")
    return torch.cuda.get_device_name(0), "amp_bf16", ["--device=gpu"]


def make_header(smoke: bool, gpu: Optional[str], precision: str, plan: Plan) -> list[str]:
    peak = peak_tflops(gpu) if gpu else None
    device = (f"{gpu} ({f'{peak:.0f} TFLOPs bf16 dense' if peak else 'not in PEAK_BF16_TFLOPS: MFU from Composer'})"
              if gpu else f"CPU ({os.cpu_count()} cores), model {' '.join(SMOKE_MODEL)}")
    return [f"# bench/bench_gpu.py{' --smoke' if smoke else ''}: GPT-2 124M and the presets on one device", "",
            f"{device}; {precision}; {plan.batch} x {plan.block_size} tokens per step (config/pile.py's per-GPU "
            f"share), microbatch {plan.microbatch}; {time.strftime('%Y-%m-%d %H:%M')}"]


@dataclass
class Table:
    """The rows so far, rewritten to --out after every row, so a timeout keeps what was measured."""
    header: list[str]
    out: Optional[Path]
    rows: list[Row] = field(default_factory=list)

    race: list[RaceRun] = field(default_factory=list)
    race_notes: list[str] = field(default_factory=list)
    race_s: float = 0.0
    race_text: str = ""
    race_train_tokens: int = 0

    def show(self, running: RaceRun) -> None:
        """The tables rewritten with a contestant still running as their last row (what it has reached)."""
        self.race.append(running)
        try:
            self.save()
        finally:
            self.race.pop()

    def save(self, recommendation: str = "") -> str:
        text = render(self.rows, self.header, recommendation, race=self)
        if self.out:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.out, text)
        return text


def run_training_rows(table: Table, setup: Setup, variants: list[Variant], precision: str, budget_s: float,
                      t_start: float) -> None:
    """Each variant's row, in order, while --budget-s lasts: a row that needs more than is left is skipped."""
    for v in variants:
        left = budget_s - (time.monotonic() - t_start)
        need = MIN_RUN_S["smoke" if setup.smoke else "compile" if v.compile else "eager"]
        skipped = Row(v.name, "yes" if v.compile else "no", str(v.vocab_size),
                      "auto" if v.auto_microbatch else str(setup.microbatch))
        if setup.smoke and v.gpu_only:
            table.rows.append(replace(skipped, note="skipped: GPU only (--smoke)"))
        elif left < need:
            table.rows.append(replace(skipped, note=f"skipped: {max(left, 0):.0f} s left of --budget-s "
                                                    f"{budget_s:.0f}, this row needs ~{need}"))
        else:
            table.rows.append(run_variant(setup, v, precision, timeout_s=left))
        table.save()


def logs_folder(args: argparse.Namespace) -> Optional[Path]:
    """--logs, or {out stem}_logs beside --out, or None (nothing kept); refused where it would hold --out."""
    logs = args.logs or (args.out.parent / f"{args.out.stem}_logs" if args.out else None)
    if logs is not None and logs.exists() and not logs.is_dir():
        raise UserError(f"--logs {logs} is a file: name a folder")
    if logs is not None and args.out and args.out.resolve().parent.is_relative_to(logs.resolve()):
        raise UserError(f"--out {args.out} lies in --logs {logs}, whose run folders it would mix with: name another")
    return logs


def run_all(table: Table, args: argparse.Namespace, plan: Plan, precision: str, extra: list[str],
            t_start: float) -> None:
    """The race, then the variants and loader rows that were asked for, in a scratch folder removed at the end."""
    variants = [v for v in VARIANTS if v.name in args.variants]
    with tempfile.TemporaryDirectory(prefix="bench_gpu_", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        setup = Setup(work, work, logs_folder(args), plan.block_size, plan.batch, plan.microbatch, plan.steps,
                      plan.warmup, args.smoke, extra)
        if args.race_s != 0:
            run_race(table, setup, args, precision, t_start)
        if variants or plan.workers:
            # 5/4: room for Streaming's split of the samples over the loader's workers
            n_train = (max(plan.steps, args.loader_batches) + 4) * plan.batch * 5 // 4
            setup.data_dir = write_data(work / "variants", n_train, n_val=4 * plan.batch, block_size=plan.block_size)
            run_training_rows(table, setup, variants, precision, args.budget_s, t_start)
            for w in plan.workers:
                table.rows.append(bench_loader(replace(setup), w, args.loader_batches))
                table.save()


def no_contestant_ran(table: Table) -> Optional[str]:
    """Why the race measured nothing (no contestant trained a batch), or None when one did."""
    if any(r.batches > 0 for r in table.race):
        return None
    reasons = [f"{r.name}: {r.note}" for r in table.race] or table.race_notes or ["no contestant started"]
    return "; ".join(reasons)


def main(argv: Optional[Sequence[str]] = None) -> int:
    t_start = time.monotonic()
    args = parse_args(argv)
    from pilegpt.train.config_load import read_config_file

    pile = read_config_file(str(PILE))
    plan = make_plan(args, pile)
    logs = logs_folder(args)
    gpu, precision, extra = pick_device(args.smoke)
    table = Table(make_header(args.smoke, gpu, precision, plan), args.out)
    table.save()
    import composer  # noqa: F401  (its engine sets a SIGTERM handler when imported, which would replace ours later)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        run_all(table, args, plan, precision, extra, t_start)
    except Cut:
        table.race_notes.append(f"stopped by SIGTERM {time.monotonic() - t_start:.0f} s after the start: the rows "
                                "above are what was reached")
        table.save()
        print(f"bench_gpu.py: stopped by SIGTERM; the table{f' in {args.out}' if args.out else ''} holds the rows "
              "reached", file=sys.stderr, flush=True)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)
    versions = next((r.versions for r in [*table.race, *table.rows] if r.versions), "")
    table.header[2] += f"; {versions}" if versions else ""
    recommendation = recommend(table.rows, pile) if table.rows else ""
    if args.smoke and recommendation:
        recommendation += " (A --smoke run on CPU: a check that the bench works, not a basis for defaults.)"
    print(table.save(recommendation), flush=True)
    if args.out:
        print(f"table written to {args.out}" + (f", logs of every run in {logs}" if logs and logs.is_dir() else ""))
    why = no_contestant_ran(table) if args.race_s != 0 else None
    if why:
        print(f"bench_gpu.py: no race contestant trained a batch ({why[:600]})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main)
