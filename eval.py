"""Score a trained GPT on HellaSwag as the field does (karpathy/build-nanogpt's and llm.c's scoring: acc by the
lowest summed loss of the ending, acc_norm by the lowest mean), from anything sample.py or init_from takes, or a
Hugging Face GPT-2: the number to put beside OpenAI GPT-2 124M's 28.59 / 29.55. Details: docs/evaluation.md.

Usage:
    python eval.py runs/quickstart --task hellaswag --data tests/fixtures/hellaswag_tiny.jsonl
    python eval.py runs/pile --task hellaswag                 # the official val set, downloaded once (10,042)
    python eval.py s3://bucket/runs/pile/model.pt --task hellaswag --limit 1000 --out results.json
    python eval.py gpt2 --task hellaswag                      # OpenAI's GPT-2 124M (from the Hugging Face hub)
    python eval.py runs/my_model --task hellaswag --model-class examples.my_model:MyGPT   # your own model
    composer -n 8 eval.py runs/pile --task hellaswag          # 8 processes (GPUs) split the examples"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from pilegpt import hellaswag
from pilegpt.checkpoint import add_model_class_argument
from pilegpt.common import UserError, atomic_write_text, check_writable_folder, load_dotenv_file, pick_device, run_main
from pilegpt.hf import load_pretrained
from pilegpt.tokenizer import gpt2

TASKS = ("hellaswag",)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="model.pt, Composer checkpoint, run folder (local or s3://), Hugging "
                                              "Face GPT-2 folder, or a hub name such as gpt2")
    p.add_argument("--task", choices=TASKS, required=True, help="the benchmark")
    p.add_argument("--data", help="a local HellaSwag .jsonl (default: the official val set, downloaded once)")
    p.add_argument("--url", default=hellaswag.URL, help="where to download the val set from (a mirror)")
    p.add_argument("--limit", type=int, help="score only the first N examples")
    p.add_argument("--batch-size", type=int, default=8, help="examples per forward pass, 4 rows each (default 8)")
    p.add_argument("--out", help="write the results and every prediction to this JSON file")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint for an s3:// SRC")
    add_model_class_argument(p)
    args = p.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.out:  # checked before any example is scored
        check_out_file(args.out)
    return args


def check_out_file(out: str) -> None:
    """A UserError unless --out names a file that can be written (its folder existing, or one that can be made)."""
    if os.path.isdir(out):
        raise UserError(f"--out {out} is a folder: name the JSON file to write, e.g. "
                        f"{os.path.join(out, 'results.json')}")
    check_writable_folder(os.path.dirname(os.path.abspath(out)), "--out", "choose another --out")


def main(argv=None) -> int:
    args = parse_args(argv)
    load_dotenv_file()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(args.device, local_rank)
    if world > 1:
        from composer.utils import dist

        dist.initialize_dist("gpu" if device.type == "cuda" else "cpu")
        if rank == 0 and not args.data:
            hellaswag.download(args.url)  # once, before the other processes read it from the cache
        dist.barrier()
    examples = hellaswag.load_examples(args.data, args.url, args.limit)
    model, origin = load_pretrained(args.src, endpoint_url=args.endpoint_url, what="SRC", model_class=args.model_class)
    model = model.to(device).eval()
    autocast = torch.bfloat16 if device.type == "cuda" else None
    mine = examples[rank::world]  # every world-th example: the processes split them evenly
    from tqdm import tqdm

    t0 = time.time()
    with tqdm(total=len(mine), unit="ex", desc=args.task, disable=rank != 0, file=sys.stderr,
              mininterval=0.5 if sys.stderr.isatty() else 30) as bar:
        predictions = hellaswag.evaluate(model, mine, gpt2(), device, args.batch_size, autocast, bar)
    if world > 1:
        from composer.utils import dist

        predictions = sorted((p for part in dist.all_gather_object(predictions) for p in part), key=lambda p: p.ind)
    seconds = time.time() - t0
    if rank != 0:
        return 0
    acc, acc_norm = hellaswag.accuracy(predictions)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        atomic_write_text(args.out, json.dumps({
            "task": args.task, "n": len(predictions), "acc": acc, "acc_norm": acc_norm, "source": args.src,
            "data": args.data or args.url, "predictions": [p._asdict() for p in predictions]}, indent=1) + "\n")
    print(f"{args.task}: {len(predictions):,} examples, acc {acc:.4f}, acc_norm {acc_norm:.4f}, "
          f"{len(predictions) / max(seconds, 1e-9):.1f} examples/s on {world} x {device.type} ({origin})"
          + (f"; results in {args.out}" if args.out else ""), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
