"""HellaSwag scoring speed: eval.py's path (pilegpt/hellaswag.py on model.py) vs a plain batched transformers loop over
the same examples and the same weights (the model exported by export_hf.py), alternated in one run.

Usage:
    python bench/bench_eval.py                          # a 6-layer x 384 GPT, 128 examples, 3 rounds, batch 8
    python bench/bench_eval.py --n-layer 12 --n-embd 768 --examples 256 --device cuda

The examples are tests/fixtures/hellaswag_tiny.jsonl repeated. Both sides get the same batches of 4 x B
right-padded rows and compute the same thing (the summed and mean loss of each ending's tokens); the
transformers side is what a user would write: GPT2LMHeadModel(ids).logits, a masked cross-entropy. On CUDA both run
in bf16 autocast. Reports the median examples/s of each side and their ratio (goal: >= 1x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import export_hf  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from pilegpt import hellaswag  # noqa: E402
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--examples", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
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
    examples = hellaswag.read_examples(REPO / "tests" / "fixtures" / "hellaswag_tiny.jsonl")
    examples = (examples * (args.examples // len(examples) + 1))[:args.examples]
    rendered = [hellaswag.render(e, gpt2(), config.block_size) for e in examples]
    batches = [rendered[i:i + args.batch_size] for i in range(0, len(rendered), args.batch_size)]
    rates = {"eval.py (model.py)": [], "transformers loop": []}
    for r in range(args.rounds):
        for name, side in (("eval.py (model.py)", lambda: ours(model, batches, device, dtype)),
                           ("transformers loop", lambda: transformers_side(hf, batches, device, dtype))):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            n = side()
            if device.type == "cuda":
                torch.cuda.synchronize()
            rates[name].append(n / (time.perf_counter() - t0))
            print(f"round {r + 1}: {name:<20} {rates[name][-1]:8.1f} examples/s", flush=True)
    median = {k: statistics.median(v) for k, v in rates.items()}
    ours_rate, theirs = median["eval.py (model.py)"], median["transformers loop"]
    print(f"{args.n_layer} layers x {args.n_embd}, {args.examples} examples, batch {args.batch_size} x 4 rows, "
          f"{device.type}, median of {args.rounds}: eval.py {ours_rate:.1f} examples/s, transformers "
          f"{theirs:.1f} examples/s, ratio {ours_rate / theirs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
