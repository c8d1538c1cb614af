"""Memory per rank at 2 processes on CPU: DDP, DDP + activation checkpointing, FSDP (fsdp=True, Composer's FSDP2) and
FSDP + activation checkpointing, each a real `python -m pilegpt.launch -n 2 train.py` run over gloo on 127.0.0.1.

Usage:
    python bench/bench_fsdp_memory.py                  # ~5 minutes: config/tiny.py at 8 x 512, block_size 256
    python bench/bench_fsdp_memory.py --rows ddp fsdp  # some rows only
    python bench/bench_fsdp_memory.py -- --cpu_malloc_tune=False   # more train.py settings for every row, after --

What it measures, on each rank, at the last batch (--batches, one microbatch per batch), by bench/memory_probe.py's
callback (given to train.py by import path):
    state      the exact bytes of the parameters, gradients and optimizer state the rank holds: each local shard's
               numel x element size (DTensor.to_local() under FSDP), after the optimizer step, before the next
               batch frees the gradients. Checked against the parameter count from the shape (the formula in
               n_params below) x 4 bytes x (1 weight + 1 gradient + 2 AdamW moments) / N under FSDP, / 1 under
               DDP, and against plan.py's weights + gradients + optimizer per GPU for the same settings
    saved      the bytes autograd saves for backward during that batch's forward (a saved_tensors_hooks pack hook:
               each storage once, parameters left out), split into the Blocks' (between the embeddings and the
               final norm) and the rest (the head's log-softmax over the vocabulary, mostly). Exact, and what
               activation checkpointing changes. Checked against plan.py's count of the same forward on the meta
               device, and with checkpointing the Blocks save only their inputs, n_layer x B x T x C x 4 bytes
    RSS        the process's resident memory (VmRSS / VmHWM in /proc/self/status): before training (FIT_START) and
               its peak by the end of that batch, before any checkpoint is written, and the peak of each batch's
               forward, backward and optimizer step. Coarse (the interpreter, Composer, the allocator's retained
               blocks, DDP's gradient buckets, FSDP's gathered weights all count) but what the machine gave it
Without --data-dir, tiny Shakespeare (tests/fixtures/tinyshakespeare.txt) is tokenized into a temporary folder first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_train import make_shakespeare_bin  # noqa: E402

from pilegpt.common import UserError, run_main  # noqa: E402

MIB = 2**20
WORLD = 2
ROWS = {  # name: train.py settings
    "ddp": ["--fsdp=False", "--activation_checkpointing=False"],
    "ddp+ac": ["--fsdp=False", "--activation_checkpointing=True"],
    "fsdp": ["--fsdp=True", "--activation_checkpointing=False"],
    "fsdp+ac": ["--fsdp=True", "--activation_checkpointing=True"],
}
NO_EXTRAS = ["--eval_interval=100000ba", "--save_interval=100000ba", "--sample_length=0", "--device=cpu",
             "--progress_bar=False", "--vocab_size=50304", "--bias=False"]


def n_params(vocab: int, block: int, layers: int, embd: int) -> int:
    """model.py's GPT without biases, counted from its shape: the token and position tables (the head is tied to
    the token table), per Block 2 LayerNorm gains and 12 C^2 of attention (3C + C) and MLP (4C + 4C) weights, and
    the final LayerNorm's gain."""
    return vocab * embd + block * embd + layers * (12 * embd * embd + 2 * embd) + embd


def train_settings(name: str, args: argparse.Namespace, data_dir: Path, run_dir: Path) -> list[str]:
    """train.py's config file and settings for one row (plan.py reads the same)."""
    return [str(REPO / "config" / "tiny.py"), f"--data_dir={data_dir}", f"--save_folder={run_dir}",
            f"--n_layer={args.n_layer}", f"--n_head={args.n_head}", f"--n_embd={args.n_embd}",
            f"--block_size={args.block_size}", f"--global_batch_size={args.batch * WORLD}",
            f"--device_train_microbatch_size={args.batch}", f"--max_duration={args.batches}ba", *NO_EXTRAS,
            *ROWS[name], *args.extra]


def run_row(name: str, args: argparse.Namespace, data_dir: Path, work: Path) -> list[dict]:
    """One row's run to its end; each rank's probe figures."""
    run_dir = work / name
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "bench"), str(REPO), os.environ.get("PYTHONPATH")]))}
    probe = f"--callbacks={{'memory_probe:MemoryProbe': {{'folder': {str(run_dir)!r}, 'batch': {args.batches}}}}}"
    cmd = [sys.executable, "-m", "pilegpt.launch", "-n", str(WORLD), str(REPO / "train.py"),
           *train_settings(name, args, data_dir, run_dir), probe]
    start = time.time()
    done = subprocess.run(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise UserError(f"{name} failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}")
    print(f"{name}: done in {time.time() - start:.0f} s", flush=True)
    return [json.loads((run_dir / f"memory-rank{r}.json").read_text()) for r in range(WORLD)]


def expected(name: str, args: argparse.Namespace, data_dir: Path, work: Path) -> dict:
    """A row's figures computed another way: from the shape alone (state: parameters x 4 bytes x (1 + 1 + 2) / N;
    what activation checkpointing keeps of the Blocks: each one's input, B x T x C fp32), and by plan.py from the
    same settings (its per-GPU state; one microbatch's saves counted on the meta device, within the Blocks and
    outside them, and the Blocks' inputs)."""
    import plan

    cfg = plan.read_settings(train_settings(name, args, data_dir, work / name))
    planned = plan.make_plan(cfg, plan.Gpus(WORLD, "H100"), None)
    saved = plan.saved_for_backward(plan.meta_model(cfg), planned.microbatch, cfg.block_size)
    count = n_params(cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_embd)
    adamw = cfg.optimizer == "adamw"  # the formula's 2 moments a parameter (plan.py's count covers Muon too)
    return dict(n_params=count, state=count * 4 * (1 + 1 + 2) / (WORLD if cfg.fsdp else 1) if adamw else None,
                ac_blocks=cfg.n_layer * planned.microbatch * cfg.block_size * cfg.n_embd * 4,
                plan_state=planned.weights + planned.gradients + planned.optimizer,
                plan_blocks=sum(saved.blocks), plan_block_inputs=saved.block_inputs,
                # plan.py passes the input as the targets too; a real batch's targets are their own (B, T) int64
                plan_outside=saved.total - sum(saved.blocks) + planned.microbatch * cfg.block_size * 8)


def row_figures(ranks: list[dict]) -> dict:
    """A row's figures in MiB: the larger rank's of each (the ranks' state bytes are equal under FSDP here)."""
    def most(f):
        return max(f(r) for r in ranks) / MIB
    return dict(params=most(lambda r: r["params"]), grads=most(lambda r: r["grads"]),
                optimizer=most(lambda r: r["optimizer"]),
                state=most(lambda r: r["params"] + r["grads"] + r["optimizer"]),
                blocks=most(lambda r: r["saved"]["blocks"]), outside=most(lambda r: r["saved"]["outside"]),
                rss_start=most(lambda r: 1024 * r["rss_fit_start_kib"]),
                rss_peak=most(lambda r: 1024 * r["rss_peak_kib"]))


def print_table(rows: dict[str, dict]) -> None:
    base = rows.get("ddp")
    print(f"{'row':<8} {'params':>7} {'grads':>7} {'optim':>7} {'state':>7} {'x ddp':>6} {'saved Blocks':>12} "
          f"{'saved rest':>10} {'x ddp':>6} {'RSS start':>9} {'RSS peak':>9} {'peak-start':>10} {'x ddp':>6}")
    for name, f in rows.items():
        grow = f["rss_peak"] - f["rss_start"]
        x = (lambda a, b: f"{a / b:6.2f}") if base else (lambda a, b: f"{'-':>6}")
        print(f"{name:<8} {f['params']:7.1f} {f['grads']:7.1f} {f['optimizer']:7.1f} {f['state']:7.1f} "
              f"{x(f['state'], base['state'] if base else 1)} {f['blocks']:12.1f} {f['outside']:10.1f} "
              f"{x(f['blocks'], base['blocks'] if base else 1)} {f['rss_start']:9.0f} {f['rss_peak']:9.0f} "
              f"{grow:10.0f} {x(grow, (base['rss_peak'] - base['rss_start']) if base else 1)}")


def print_phases(results: dict[str, list[dict]]) -> None:
    """Each row's resident memory by batch: at its start, and its peak in the forward, the backward and the rest (the
    optimizer step), the larger rank's, MiB."""
    print("peak RSS by phase, MiB (the larger rank's): batch: start / forward / backward / optimizer step")
    for name, ranks in results.items():
        cells = [f"{p['batch']}: " + " / ".join(f"{max(r['phases'][i].get(k, 0) for r in ranks) / 1024:.0f}"
                                                for k in ("start", "forward", "backward", "step"))
                 for i, p in enumerate(ranks[0]["phases"])]
        print(f"  {name:<8} start-up peak {max(r['rss_startup_peak_kib'] for r in ranks) / 1024:.0f}; "
              + "; ".join(cells))


def checks(name: str, ranks: list[dict], want: dict) -> list[str]:
    """Each rank's measured figures against want (expected()); the lines that disagree."""
    ac, bad = name.endswith("+ac"), []
    for r in ranks:
        state, saved, who = r["params"] + r["grads"] + r["optimizer"], r["saved"], f"{name} rank {r['rank']}"
        if r["n_params"] != want["n_params"]:
            bad.append(f"{who}: {r['n_params']:,} parameters, the shape gives {want['n_params']:,}")
        for key in ("state", "plan_state"):  # apart from AdamW's step counters: 4 bytes a parameter tensor
            if want[key] is not None and abs(state - want[key]) > 1024:
                bad.append(f"{who}: state {state:,} bytes, {key} {want[key]:,.0f}")
        blocks = (want["ac_blocks"], want["plan_block_inputs"]) if ac else (want["plan_blocks"],)
        if any(saved["blocks"] != b for b in blocks):
            bad.append(f"{who}: the Blocks saved {saved['blocks']:,} bytes, computed {blocks}")
        if saved["outside"] != want["plan_outside"]:
            bad.append(f"{who}: {saved['outside']:,} bytes saved outside the Blocks, plan.py counts "
                       f"{want['plan_outside']:,} with the targets")
    return bad


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, help="a prepare_data.py folder (default: tiny Shakespeare)")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--n-layer", type=int, default=8)
    parser.add_argument("--n-head", type=int, default=8)
    parser.add_argument("--n-embd", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per batch (one microbatch)")
    parser.add_argument("--batches", type=int, default=2, help="batches per run; the last one is measured")
    parser.add_argument("extra", nargs="*", help="more train.py settings for every row (--key=value), after --")
    args = parser.parse_args(argv)
    if min(args.n_layer, args.n_head, args.n_embd, args.block_size, args.batch, args.batches) < 1:
        raise UserError("--n-layer, --n-head, --n-embd, --block-size, --batch and --batches must be >= 1")
    with tempfile.TemporaryDirectory(prefix="bench_fsdp_memory_") as tmp:
        tmp = Path(tmp)
        data_dir = args.data_dir or make_shakespeare_bin(tmp / "data")
        results = {name: run_row(name, args, data_dir, tmp) for name in args.rows}
        wants = {name: expected(name, args, data_dir, tmp) for name in args.rows}
    want = wants[args.rows[0]]
    print(f"\nconfig/tiny.py at {args.n_layer} x {args.n_embd} ({want['n_params'] / 1e6:.2f}M parameters, "
          f"vocab 50304), {WORLD} processes on CPU, {args.batch} x {args.block_size} tokens per rank, batch "
          f"{args.batches}; MiB per rank (the larger rank's):")
    print_table({name: row_figures(ranks) for name, ranks in results.items()})
    for name, w in wants.items():
        formula = "-" if w["state"] is None else f"{w['state'] / MIB:.1f}"
        print(f"computed for {name}: state {formula} MiB (parameters x 4 bytes x (1 + 1 + 2) / "
              f"{WORLD if name.startswith('fsdp') else 1}), plan.py {w['plan_state'] / MIB:.1f}; plan.py's saves "
              f"{w['plan_blocks'] / MIB:.1f} in the Blocks, {w['plan_outside'] / MIB:.1f} "
              f"outside, the Blocks' inputs {w['plan_block_inputs'] / MIB:.1f} ({w['ac_blocks'] / MIB:.1f} by shape)")
    print_phases(results)
    for name, ranks in results.items():
        if name.startswith("fsdp"):
            print(f"{name}: parameters held whole from the forward to the backward (FSDP's root unit): "
                  f"{max(r['whole_after_forward'] for r in ranks) / MIB:.1f} MiB")
    bad = [line for name, ranks in results.items() for line in checks(name, ranks, wants[name])]
    print("\n".join(bad) if bad else "every measured figure equals the ones computed another way (state: to the "
          "step counters' bytes)")
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(main)
