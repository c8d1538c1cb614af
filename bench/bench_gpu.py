"""GPT-2 124M (config/pile.py) on one GPU: eager vs torch.compile, vocab 50257 vs 50304, microbatch fixed vs "auto",
and the data loader alone; one markdown table, ratios against eager-50257-fixed, and a recommendation.

Usage:
    python bench/bench_gpu.py --out $OUT/bench_gpu.md       # the GPU session: one command, ~8.5 min on an H200
    python bench/bench_gpu.py --smoke                      # the same code on CPU, tiny model, ~1 min (the test)
    python bench/bench_gpu.py --only eager-50257-fixed compile-50304-fixed --out /tmp/b.md
    python bench/bench_gpu.py --steps 50 --warmup 20 --batch 120 --budget-s 900

What runs: random GPT-2 token ids (uniform over 50,257), written as a prepare_data .bin (data.write_token_files) and
converted by to_mds.py itself (zstd, train/ and val/), so the data is exactly what to_mds writes for the Pile. Each
variant is one real `python train.py config/pile.py --data_dir=... --max_duration={steps}ba ...` process, with
pile.py's model (12 layers, 12 heads, 768 wide, block 1024), AdamW (Muon in its row), grad clipping, num_workers and
callbacks, and amp_bf16. The batch is pile.py's per-GPU share: 480 sequences over its 8 GPUs = 60 per step, in
microbatches of pile.py's 12 ("fixed") or Composer's "auto" (start at the whole batch, halve on each CUDA OOM).
Nothing is downloaded. The rows, in the order they run (later rows are the first to fall to --budget-s):
    eager-50257-fixed     the baseline: pile.py unpadded (compile=False, vocab 50257 as it was, microbatch 12)
    eager-50304-fixed     vocab padded to a multiple of 64
    eager-50304-muon      eager-50304-fixed with optimizer="muon" instead of AdamW: what Muon's steps cost
    eager-50304-modern    eager-50304-fixed with config/modern.py applied after pile.py (the architecture preset)
    compile-50304-fixed   eager-50304-fixed and torch.compile (train.py --compile=True)
    compile-50304-modern  compile-50304-fixed with config/modern.py
    eager-50304-auto      microbatch "auto" instead of 12
    compile-50304-auto    compile + padded vocab + "auto": the fastest candidate default
    compile-50257-fixed   compile without the padding (does padding matter more once compiled?)
    loader, W workers     loaders.build_dataloaders on the same data with pile.py's settings and num_workers=W, iterated
                          --loader-batches batches with no model (pin_memory as train.py on GPU)

Columns:
    tokens/s      tokens per step over the median step time of steps warmup+1 .. steps-1 (train.py's metrics.jsonl
                  time_s; every step ends in a GPU sync, Composer's loss .item(); the last step is left out: it
                  also holds the final evaluation and checkpoint). Loader rows: samples/s x block_size.
    vs base       tokens/s over eager-50257-fixed's tokens/s of the same run (loader rows: how many times the
                  baseline's appetite the loader can feed)
    samples/s     tokens/s / block_size
    MFU           tokens/s x model.GPT.flops_per_token() / the GPU's dense bf16 peak (PEAK_BF16_TFLOPS, by device
                  name); a GPU not in that table: Composer SpeedMonitor's MFU (its own table, averaged over the timed
                  steps), marked "(Composer)"; else n/a. The padded vocab's extra 47 columns count as FLOPs.
    peak GB       torch.cuda.max_memory_allocated of the training process, in GB of 1e9 bytes: Composer's
                  MemoryMonitor memory/peak_allocated_mem, read from the run's file log (logs/*-rank0.txt;
                  metrics.jsonl does not keep it). With "auto" it includes the microbatches that ran out of memory.
    1st batch s   from train.py's logger set-up (just before the Trainer is built) to the end of batch 1: the
                  compile time, the OOM search of "auto"
    run s         the whole train.py process: imports, data, compile, steps, final evaluation, checkpoint
    microbatch    the fixed size, or "auto -> N" with the size Composer settled on (its file log)

Time, measured on one H200 (2026-12-04, docs/performance.md#on-a-gpu): 69-81 s per eager variant (start-up, 30
steps of 61k tokens, the final eval and a 1.5 GB checkpoint), 114 s compiled (29 s of it before batch 1).
--budget-s (default 420) bounds the variants, counted from the start: a variant starts only with MIN_RUN_S left (85 s
eager, 130 s compiled) and is stopped when the budget runs out (its finished steps still count); the rest are skipped
with a note. Then the loader rows (~55 s measured: 41 s at 8 workers), so the command ends within ~8.5 min. The
table is rewritten to --out after every row, so a timeout keeps what was measured; train.py's output, metrics.jsonl,
config.json and Composer's log of every run go beside it, to {out stem}_logs/. GPU memory (measured on the H200):
13.9 GB peak with microbatch 12 eager, 10.2 GB compiled, 59.6 GB for "auto", which settled on the whole batch of 60.

--smoke: the same code on CPU in fp32 with a tiny model (2 layers, 64 wide, block 64, batch 8 of microbatch 4, 8
steps, 2 workers): the eager rows and the loader rows (2 and 0 workers) run, the compile and "auto" rows are marked
"skipped: GPU only". ~1 min on 2 idle cores, most of it three train.py start-ups; up to ~2 min on busy ones.
"""

from __future__ import annotations

import argparse
import gc
import json
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

    @property
    def gpu_only(self) -> bool:
        """"auto" needs CUDA OOMs to search; compiling on CPU costs minutes for nothing this bench measures."""
        return self.compile or self.auto_microbatch


VARIANTS = (  # the baseline first, then what the recommendation needs; the budget cuts from the end
    Variant("eager-50257-fixed", compile=False, vocab_size=50257, auto_microbatch=False),
    Variant("eager-50304-fixed", compile=False, vocab_size=50304, auto_microbatch=False),
    Variant("eager-50304-muon", compile=False, vocab_size=50304, auto_microbatch=False, optimizer="muon"),
    Variant("eager-50304-modern", compile=False, vocab_size=50304, auto_microbatch=False, preset="modern.py"),
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


def flops_per_token(extra: list[str], block_size: int, vocab_size: int) -> int:
    """model.GPT's training FLOPs per token for the bench's model, built on the meta device (no memory, no init)."""
    import torch

    from model import GPT
    from pilegpt.train.config_load import load_config

    cfg = load_config([str(PILE), f"--block_size={block_size}", f"--vocab_size={vocab_size}", "--data_dir=.",
                       *[a for a in extra if a.split("=")[0] in ("--n_layer", "--n_head", "--n_embd")]])
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


def keep_logs(setup: Setup, name: str, run_dir: Path) -> None:
    """metrics.jsonl, config.json and Composer's file log of a run, beside its output in setup.logs."""
    if setup.logs is None:
        return
    for src, dst in [(run_dir / "metrics.jsonl", f"{name}.metrics.jsonl"), (run_dir / "config.json",
                                                                                 f"{name}.config.json")]:
        if src.is_file():
            shutil.copyfile(src, setup.logs / dst)
    for i, log in enumerate(sorted((run_dir / "logs").glob("*-rank0.txt"))):
        shutil.copyfile(log, setup.logs / f"{name}.composer{'-' + str(i) if i else ''}.txt")


def variant_settings(setup: Setup, v: Variant, precision: str) -> list[str]:
    """train.py's arguments for variant v: config/pile.py, the bench's settings, the variant's, its preset file."""
    run_dir = setup.work / "runs" / v.name
    microbatch = "auto" if v.auto_microbatch else str(setup.microbatch)
    return [str(PILE), *setup.train_args(), f"--run_name={v.name}", f"--save_folder={run_dir}",
            f"--data_local={setup.work / 'cache' / v.name}", f"--compile={v.compile}", f"--vocab_size={v.vocab_size}",
            f"--device_train_microbatch_size={microbatch}", f"--precision={precision}", f"--optimizer={v.optimizer}",
            *([str(REPO / "config" / v.preset)] if v.preset else [])]


def run_variant(setup: Setup, v: Variant, precision: str, timeout_s: float) -> Row:
    """One real train.py process; its row from metrics.jsonl, config.json and Composer's file log."""
    run_dir = setup.work / "runs" / v.name
    microbatch = "auto" if v.auto_microbatch else str(setup.microbatch)
    row = Row(v.name, compile="yes" if v.compile else "no", vocab=str(v.vocab_size), microbatch=microbatch)
    cmd = [sys.executable, str(REPO / "train.py"), *variant_settings(setup, v, precision)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if setup.smoke:
        env.setdefault("OMP_NUM_THREADS", "1")  # a tiny model on a shared CPU: one thread is fastest and steadiest
    print(f"{v.name}: {' '.join(cmd[1:])}", flush=True)
    out_file = (setup.logs or setup.work) / f"{v.name}.out.txt"  # a file, not a pipe: nothing to wait on if killed
    out_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    returncode, timed_out = run_with_timeout(cmd, setup.work, env, out_file, timeout_s)
    row.run_s = time.monotonic() - t0
    output = out_file.read_text(errors="replace")
    keep_logs(setup, v.name, run_dir)
    timed, batches = read_run(row, v, setup, run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints: 1.5 GB per run
    row.note = outcome_note(row, timed_out, returncode, output, timed, batches)
    print(f"{v.name}: {fmt(row.tokens_per_s, '.0f')} tokens/s, MFU {row.mfu or 'n/a'}, peak "
          f"{fmt(row.peak_gb, '.1f')} GB, {row.run_s:.0f} s; {row.note}", flush=True)
    return row


def run_with_timeout(cmd: list[str], cwd: Path, env: dict, out_file: Path, timeout_s: float) -> tuple[int, bool]:
    """Run `cmd` with its output to `out_file`; (exit code, whether it was killed at `timeout_s`)."""
    with open(out_file, "w") as out:
        # its own session, so that a timeout stops train.py and its DataLoader and compile workers together
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
            return proc.returncode, False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended just now
                pass
            proc.wait()
            return proc.returncode, True


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
        flops = flops_per_token(setup.extra, setup.block_size, v.vocab_size)
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


def render(rows: list[Row], header: list[str], recommendation: str = "") -> str:
    base = next((r.tokens_per_s for r in rows if r.name == BASELINE), None)
    columns = ["variant", "compile", "vocab", "microbatch", "tokens/s", f"vs {BASELINE}", "samples/s", "MFU",
               "peak GB", "1st batch s", "run s", "note"]
    lines = [*header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        ratio = f"{r.tokens_per_s / base:.2f}x" if r.tokens_per_s is not None and base else "–"
        cells = [r.name, r.compile or "–", r.vocab or "–", r.microbatch or "–", fmt(r.tokens_per_s, ",.0f"), ratio,
                 fmt(r.samples_per_s, ",.1f"), r.mfu or "–", fmt(r.peak_gb, ".1f"), fmt(r.first_batch_s, ".1f"),
                 fmt(r.run_s, ".0f"), r.note.replace("|", "/")]
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
    p.add_argument("--smoke", action="store_true", help="CPU, fp32, a tiny model, GPU-only rows skipped (the test)")
    p.add_argument("--steps", type=int, help="steps per variant (default 30; smoke 8)")
    p.add_argument("--warmup", type=int, help="first steps not timed (default 10; smoke 3)")
    p.add_argument("--batch", type=int, help="sequences per step (default: config/pile.py's global_batch_size / "
                                             f"{PILE_GPUS} GPUs = 60; smoke 8)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="seconds for the data and the variants, from the start (default 420); later rows are skipped")
    p.add_argument("--loader-batches", type=int, default=50, help="batches per loader row (default 50)")
    p.add_argument("--loader-workers", help="comma-separated num_workers of the loader rows (default: pile.py's, "
                                            "2 and 0)")
    p.add_argument("--only", nargs="+", choices=[v.name for v in VARIANTS], metavar="VARIANT",
                   help=f"run only these variants: {', '.join(v.name for v in VARIANTS)}")
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
    try:
        workers = ([int(w) for w in args.loader_workers.split(",")] if args.loader_workers
                   else [2, 0] if smoke else sorted({pile["num_workers"], 2, 0}, reverse=True))
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
    return [f"# bench/bench_gpu.py{' --smoke' if smoke else ''}: config/pile.py on one device", "",
            f"{device}; {precision}; {plan.batch} x {plan.block_size} tokens per step, microbatch {plan.microbatch} "
            f"or auto; {plan.steps} steps per variant, median step of {plan.warmup + 1}-{plan.steps - 1}; random "
            f"token ids through to_mds.py (zstd); {time.strftime('%Y-%m-%d %H:%M')}"]


@dataclass
class Table:
    """The rows so far, rewritten to --out after every row, so a timeout keeps what was measured."""
    header: list[str]
    out: Optional[Path]
    rows: list[Row] = field(default_factory=list)

    def save(self, recommendation: str = "") -> str:
        text = render(self.rows, self.header, recommendation)
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    t_start = time.monotonic()
    args = parse_args(argv)
    from pilegpt.train.config_load import read_config_file

    pile = read_config_file(str(PILE))
    plan = make_plan(args, pile)
    gpu, precision, extra = pick_device(args.smoke)
    variants = [v for v in VARIANTS if not args.only or v.name in args.only]
    logs = args.out.parent / f"{args.out.stem}_logs" if args.out else None
    table = Table(make_header(args.smoke, gpu, precision, plan), args.out)
    table.save()
    with tempfile.TemporaryDirectory(prefix="bench_gpu_", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        # 5/4: room for Streaming's split of the samples over the loader's workers
        n_train = (max(plan.steps, args.loader_batches) + 4) * plan.batch * 5 // 4
        data_dir = write_data(work, n_train, n_val=4 * plan.batch, block_size=plan.block_size)
        setup = Setup(data_dir, work, logs, plan.block_size, plan.batch, plan.microbatch, plan.steps, plan.warmup,
                      args.smoke, extra)
        run_training_rows(table, setup, variants, precision, args.budget_s, t_start)
        versions = next((r.versions for r in table.rows if r.versions), "")
        table.header[2] += f"; {versions}" if versions else ""
        for w in plan.workers:
            table.rows.append(bench_loader(replace(setup), w, args.loader_batches))
            table.save()
    recommendation = recommend(table.rows, pile)
    if args.smoke:
        recommendation += " (A --smoke run on CPU: a check that the bench works, not a basis for defaults.)"
    print(table.save(recommendation), flush=True)
    if args.out:
        print(f"table written to {args.out}" + (f", logs of every run in {logs}" if logs and logs.is_dir() else ""))
    return 0


if __name__ == "__main__":
    run_main(main)
