"""Scoring speed of eval.py's HellaSwag, Pile BPB and CORE paths (pilegpt/hellaswag.py, pilegpt/pile_bpb.py,
pilegpt/core_eval.py on model.py) vs a plain batched transformers loop over the same examples / windows / prompts
and the same weights (the model exported by export_hf.py), alternated in one run.

Usage:
    python bench/bench_eval.py                          # a 6-layer x 384 GPT, 128 examples, 3 rounds, batch 8
    python bench/bench_eval.py --n-layer 12 --n-embd 768 --examples 256 --device cuda
    python bench/bench_eval.py --task pile --n-layer 12 --n-embd 768 --documents 96 --batch-size 16 --device cuda
    python bench/bench_eval.py --task core --batch-size 16

The examples are tests/fixtures/hellaswag_tiny.jsonl repeated. Both sides get the same batches of 4 x B
right-padded rows and compute the same thing (the summed and mean loss of each ending's tokens); the
transformers side is what a user would write: GPT2LMHeadModel(ids).logits, a masked cross-entropy. On CUDA both run
in bf16 autocast. Reports the median examples/s of each side and their ratio (goal: >= 1x).
The pile row: eval.py's batches of rolling windows (pieces of tiny Shakespeare of 3 sizes), its window_logliks vs
GPT2LMHeadModel(ids).logits and a cross-entropy masked to the scored positions; scored tokens/s of each, the ratio.
The core row: a bundle written for the bench (the HellaSwag fixture as a 3-shot multiple-choice task, Shakespeare
lines as a 0-shot language-modelling task), its prompts tokenized once; core_eval.evaluate vs the same rows in the
same batches through GPT2LMHeadModel, each row's mean continuation loss and greedy match; items/s, the ratio.
"""

from __future__ import annotations

import argparse
import json
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
from pilegpt import core_eval, hellaswag, pile_bpb  # noqa: E402
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


@torch.no_grad()
def transformers_core(hf, items: list[core_eval.Item], batch_size: int, device, dtype) -> int:
    """The plain way: the items' rows batch_size at a time through the HF model, each row's mean loss over its
    continuation and whether greedy decoding predicts it, then each item's choice."""
    rows = [r for item in items for r in item.rows]
    scores = []
    for i in range(0, len(rows), batch_size):
        part = rows[i:i + batch_size]
        T = max(len(r.tokens) for r in part)
        ids = torch.zeros((len(part), T), dtype=torch.long)
        mask = torch.zeros((len(part), T - 1), dtype=torch.bool)
        for j, r in enumerate(part):
            ids[j, :len(r.tokens)] = torch.tensor(r.tokens)
            mask[j, r.start - 1:r.end - 1] = True
        ids, mask = ids.to(device), mask.to(device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = hf(ids).logits[:, :-1].float()
        losses = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        means = (losses * mask).sum(1) / mask.sum(1)
        greedy = ((logits.argmax(-1) == ids[:, 1:]) | ~mask).all(1)
        scores += list(zip(means.tolist(), greedy.tolist()))
    for item in items:
        mine, scores = scores[:len(item.rows)], scores[len(item.rows):]
        core_eval.judge(item, mine)
    return len(items)


def core_items(block_size: int, examples: int) -> list[core_eval.Item]:
    """The bench's bundle (a 3-shot multiple-choice task from the HellaSwag fixture, a 0-shot language-modelling task
    from Shakespeare's lines), written to a temporary folder and read back as eval.py reads one; every item
    tokenized."""
    fixture = hellaswag.read_examples(REPO / "tests" / "fixtures" / "hellaswag_tiny.jsonl")
    lines = [ln.strip() for ln in (REPO / "tests" / "fixtures" / "tinyshakespeare.txt").read_text().splitlines()
             if len(ln.split()) > 4][:examples]
    tasks = {"mc": ("multiple_choice", 3, [{"query": e.ctx, "choices": e.endings, "gold": e.label} for e in fixture]),
             "lm": ("language_modeling", 0, [{"context": ln.rsplit(" ", 1)[0], "continuation": ln.rsplit(" ", 1)[1]}
                                             for ln in lines])}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "eval_data").mkdir()
        yaml = ["icl_tasks:"]
        for label, (kind, shots, rows) in tasks.items():
            yaml += [f"- label: {label}", f"  dataset_uri: {label}.jsonl", f"  num_fewshot: [{shots}]",
                     f"  icl_task_type: {kind}"]
            (root / "eval_data" / f"{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / "core.yaml").write_text("\n".join(yaml) + "\n")
        (root / "eval_meta_data.csv").write_text("Eval Task,Random baseline\nmc,25\nlm,0\n")
        bundle = core_eval.read_bundle(root)
        kept = [core_eval.select(core_eval.read_rows(t), examples) for t in bundle]
    return list(core_eval.items(bundle, kept, gpt2(), block_size))


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
    p.add_argument("--task", choices=("hellaswag", "pile", "core", "both", "all"), default="both",
                   help="both: hellaswag and pile; all: the three")
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
    if args.task in ("hellaswag", "both", "all"):
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
    if args.task in ("pile", "both", "all"):
        windows = pile_batches(config.block_size, args.documents, args.batch_size)
        m = race({"pile eval.py": lambda: ours_pile(model, windows, device, dtype),
                  "pile transformers": lambda: transformers_pile(hf, windows, device, dtype)},
                 args.rounds, device, "tokens")
        print(f"pile: {shape}, {args.documents} documents, {sum(len(b.owner) for b in windows)} windows, batch "
              f"{args.batch_size}: eval.py {m['pile eval.py']:,.0f} tokens/s, transformers "
              f"{m['pile transformers']:,.0f} tokens/s, ratio {m['pile eval.py'] / m['pile transformers']:.2f}x")
    if args.task in ("core", "all"):
        items = core_items(config.block_size, args.examples)
        bs = args.batch_size * 2  # prompts a pass: the HellaSwag rows' count at --batch-size examples / 2
        m = race({"core eval.py": lambda: len(core_eval.evaluate(model, iter(items), device, bs, dtype)[0]),
                  "core transformers": lambda: transformers_core(hf, items, bs, device, dtype)},
                 args.rounds, device, "items")
        rows = sum(len(i.rows) for i in items)
        print(f"core: {shape}, {len(items)} items ({rows} prompts), {bs} prompts a pass: eval.py "
              f"{m['core eval.py']:.1f} items/s, transformers {m['core transformers']:.1f}, "
              f"ratio {m['core eval.py'] / m['core transformers']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
