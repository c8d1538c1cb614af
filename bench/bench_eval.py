"""Scoring speed of eval.py's HellaSwag and Pile BPB paths (pilegpt/hellaswag.py, pilegpt/pile_bpb.py on model.py) vs
a plain batched transformers loop over the same examples / windows and the same weights (the model exported by
export_hf.py), alternated in one run.

Usage:
    python bench/bench_eval.py                          # a 6-layer x 384 GPT, 128 examples, 3 rounds, batch 8
    python bench/bench_eval.py --n-layer 12 --n-embd 768 --examples 256 --device cuda
    python bench/bench_eval.py --task pile --n-layer 12 --n-embd 768 --documents 96 --batch-size 16 --device cuda

The examples are tests/fixtures/hellaswag_tiny.jsonl repeated. Both sides get the same batches of 4 x B
right-padded rows and compute the same thing (the summed and mean loss of each ending's tokens); the
transformers side is what a user would write: GPT2LMHeadModel(ids).logits, a masked cross-entropy. On CUDA both run
in bf16 autocast. Reports the median examples/s of each side and their ratio (goal: >= 1x).
The pile row: eval.py's batches of rolling windows (pieces of tiny Shakespeare of 3 sizes), its window_logliks vs
GPT2LMHeadModel(ids).logits and a cross-entropy masked to the scored positions; scored tokens/s of each, the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import export_hf  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from pilegpt import hellaswag, pile_bpb  # noqa: E402
from pilegpt.tokenizer import gpt2  # noqa: E402


@torch.no_grad()
def transformers_side(hf, batches: list[list[list[hellaswag.Row]]], device, dtype) -> int:
    """The plain way: pad, run the HF model, mask the cross-entropy to the endings."""
    n = 0
    for batch in batches:
        rows = [r for example in batch for r in example]
        T = max(len(r.tokens) for r in rows)
        ids = torch.zeros((len(rows), T), dtype=torch.long)
        mask = torch.zeros((len(rows), T), dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, :len(r.tokens)] = torch.tensor(r.tokens)
            mask[i, r.start:len(r.tokens)] = True
        ids, mask = ids.to(device), mask.to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = hf(ids).logits
        losses = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
        losses = losses * mask[:, 1:]
        total = losses.sum(1)
        _ = torch.stack((total, total / mask[:, 1:].sum(1)), 1).view(len(batch), 4, 2).argmin(1).cpu()
        n += len(batch)
    return n


@torch.no_grad()
def ours(model, batches, device, dtype) -> int:
    n = 0
    for batch in batches:
        hellaswag.ending_losses(model, batch, device, dtype).argmin(1)
        n += len(batch)
    return n


@torch.no_grad()
def transformers_pile(hf, batches: list[pile_bpb.Batch], device, dtype) -> int:
    """The plain way: the HF model on the same windows, the cross-entropy masked to the scored positions."""
    n = 0
    for batch in batches:
        ids, targets = batch.idx.to(device), batch.targets.to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = hf(ids).logits
        losses = F.cross_entropy(logits.float().transpose(1, 2), targets.clamp(min=0), reduction="none")
        _ = (-(losses * (targets != -1)).double().sum(1)).cpu()
        n += int((batch.targets != -1).sum())
    return n


@torch.no_grad()
def ours_pile(model, batches: list[pile_bpb.Batch], device, dtype) -> int:
    n = 0
    for batch in batches:
        pile_bpb.window_logliks(model, batch, device, dtype)
        n += int((batch.targets != -1).sum())
    return n


def race(sides: dict, rounds: int, device, unit: str) -> dict[str, float]:
    """Run the sides in turn, `rounds` times; each side's median rate (units of work a second)."""
    rates = {name: [] for name in sides}
    for r in range(rounds):
        for name, side in sides.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            n = side()
            if device.type == "cuda":
                torch.cuda.synchronize()
            rates[name].append(n / (time.perf_counter() - t0))
            print(f"round {r + 1}: {name:<26} {rates[name][-1]:10.1f} {unit}/s", flush=True)
    return {k: statistics.median(v) for k, v in rates.items()}


def pile_batches(block_size: int, documents: int, batch_size: int) -> list[pile_bpb.Batch]:
    """eval.py's batches of the rolling windows of `documents` pieces of tiny Shakespeare, of many lengths."""
    text = (REPO / "tests" / "fixtures" / "tinyshakespeare.txt").read_text()
    enc, pieces, at = gpt2(), [], 0
    for i in range(documents):
        size = (500, 3000, 9000)[i % 3]  # short, one-window and several-window documents
        pieces.append(text[at:at + size])
        at = (at + size) % (len(text) - 9000)
    streams = [np.array([enc.eot_token] + pile_bpb.encode(enc, t), dtype=np.int64) for t in pieces]
    return pile_bpb.make_batches(streams, block_size, batch_size)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--examples", type=int, default=128, help="HellaSwag examples")
    p.add_argument("--documents", type=int, default=48, help="Pile-like documents")
    p.add_argument("--batch-size", type=int, default=8, help="HellaSwag examples (4 rows) or Pile windows a batch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--task", choices=("hellaswag", "pile", "both"), default="both")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else None
    torch.manual_seed(0)
    config = GPTConfig(block_size=1024, vocab_size=50257, n_layer=args.n_layer, n_head=args.n_embd // 64,
                       n_embd=args.n_embd)
    model = GPT(config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        export_hf.export(model, Path(tmp) / "hf")
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(Path(tmp) / "hf").eval().to(device)
    model = model.to(device)
    shape = f"{args.n_layer} layers x {args.n_embd}, {device.type}, median of {args.rounds}"
    if args.task in ("hellaswag", "both"):
        examples = hellaswag.read_examples(REPO / "tests" / "fixtures" / "hellaswag_tiny.jsonl")
        examples = (examples * (args.examples // len(examples) + 1))[:args.examples]
        rendered = [hellaswag.render(e, gpt2(), config.block_size) for e in examples]
        batches = [rendered[i:i + args.batch_size] for i in range(0, len(rendered), args.batch_size)]
        m = race({"hellaswag eval.py": lambda: ours(model, batches, device, dtype),
                  "hellaswag transformers": lambda: transformers_side(hf, batches, device, dtype)},
                 args.rounds, device, "examples")
        ratio = m["hellaswag eval.py"] / m["hellaswag transformers"]
        print(f"hellaswag: {shape}, {args.examples} examples, batch {args.batch_size} x 4 rows: eval.py "
              f"{m['hellaswag eval.py']:.1f} examples/s, transformers {m['hellaswag transformers']:.1f}, "
              f"ratio {ratio:.2f}x")
    if args.task in ("pile", "both"):
        windows = pile_batches(config.block_size, args.documents, args.batch_size)
        m = race({"pile eval.py": lambda: ours_pile(model, windows, device, dtype),
                  "pile transformers": lambda: transformers_pile(hf, windows, device, dtype)},
                 args.rounds, device, "tokens")
        print(f"pile: {shape}, {args.documents} documents, {sum(len(b.owner) for b in windows)} windows, batch "
              f"{args.batch_size}: eval.py {m['pile eval.py']:,.0f} tokens/s, transformers "
              f"{m['pile transformers']:,.0f} tokens/s, ratio {m['pile eval.py'] / m['pile transformers']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
