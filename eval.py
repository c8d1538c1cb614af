"""Score a trained GPT as the field does, from anything sample.py or init_from takes, or a Hugging Face GPT-2:
HellaSwag (karpathy/build-nanogpt's and llm.c's scoring: acc by the lowest summed loss of the ending, acc_norm by the
lowest mean; beside OpenAI GPT-2 124M's 28.59 / 29.55), or Pile bits per byte per component as lm-evaluation-harness
computes it (beside GPT-2 124M's 1.2253 on the Pile's test set), or CORE, the DCLM paper's 22 in-context tasks as
nanochat scores them (beside GPT-2 124M's 0.1139 and 1.5B's 0.2565). Details: docs/evaluation.md.

Usage:
    python eval.py runs/quickstart --task hellaswag --data tests/fixtures/hellaswag_tiny.jsonl
    python eval.py runs/pile --task hellaswag                 # the official val set, downloaded once (10,042)
    python eval.py s3://bucket/runs/pile/model.pt --task hellaswag --limit 1000 --out results.json
    python eval.py gpt2 --task hellaswag                      # OpenAI's GPT-2 124M (from the Hugging Face hub)
    python eval.py runs/my_model --task hellaswag --model-class examples.my_model:MyGPT   # your own model
    composer -n 8 eval.py runs/pile --task hellaswag          # 8 processes (GPUs) split the examples
    python eval.py runs/pile --task pile --data val.jsonl.zst --out pile.json   # Pile BPB per component
    composer -n 8 eval.py runs/pile --task pile --split test  # the Pile's test file, downloaded once
    python eval.py runs/pile --task core --data eval_bundle --max-per-task 500   # CORE on an unpacked bundle
    composer -n 8 eval.py runs/pile --task core              # all of it; the bundle downloaded once"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Optional

import torch

from pilegpt import core_eval, hellaswag, pile_bpb
from pilegpt.checkpoint import add_model_class_argument
from pilegpt.common import UserError, atomic_write_text, check_writable_folder, load_dotenv_file, pick_device, run_main
from pilegpt.hf import load_pretrained
from pilegpt.model_contract import context_length
from pilegpt.tokenizer import gpt2

TASKS = ("hellaswag", "pile", "core")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="model.pt, Composer checkpoint, run folder (local or s3://), Hugging "
                                              "Face GPT-2 folder, or a hub name such as gpt2")
    p.add_argument("--task", choices=TASKS, required=True, help="the benchmark")
    p.add_argument("--data", help="hellaswag: a local .jsonl (default: the official val set, downloaded once); pile: "
                                   "a Pile-format .jsonl(.zst) file or a folder of them (default: the --split file, "
                                   "downloaded once); core: an unpacked DCLM eval bundle (default: downloaded once)")
    p.add_argument("--split", choices=pile_bpb.SPLITS, default="test",
                   help="pile without --data: the Pile's val or test file (default test, the published figures')")
    p.add_argument("--url", help=f"where to download the data from (a mirror; default hellaswag {hellaswag.URL}, "
                                 f"pile {pile_bpb.MIRROR}/SPLIT.jsonl.zst, core {core_eval.URL})")
    p.add_argument("--limit", type=int, help="score only the first N examples (documents)")
    p.add_argument("--max-per-task", type=int, help="core: score the first N of each task's shuffled rows (a quick "
                                                    "score; nanochat's order)")
    p.add_argument("--batch-size", type=int, help="per forward pass: hellaswag examples of 4 rows (default 8), pile "
                                                  "windows of up to block_size tokens (default 16), core prompts "
                                                  "(default 16)")
    p.add_argument("--out", help="write the results and every prediction to this JSON file")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--endpoint-url", default=None, help="S3-compatible endpoint for an s3:// SRC")
    add_model_class_argument(p)
    args = p.parse_args(argv)
    if args.task == "hellaswag" and not args.url:
        args.url = hellaswag.URL
    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    if args.max_per_task is not None and (args.max_per_task < 1 or args.task != "core"):
        raise UserError(f"--max-per-task must be >= 1, got {args.max_per_task}" if args.task == "core" else
                        f"--max-per-task is for --task core; --task {args.task} takes --limit")
    if args.batch_size is not None and args.batch_size < 1:
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
    device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1:
        from composer.utils import dist

        dist.initialize_dist("gpu" if device.type == "cuda" else "cpu")
        if not args.data:  # once, on rank 0, before the others read the cache; its error ends every rank alike
            together(lambda: download(args) if rank == 0 else None, world)
    model, origin = together(lambda: load_pretrained(args.src, endpoint_url=args.endpoint_url, what="SRC",
                                                     model_class=args.model_class), world)
    model = model.to(device).eval()
    autocast = torch.bfloat16 if device.type == "cuda" else None
    run = {"hellaswag": run_hellaswag, "pile": run_pile, "core": run_core}[args.task]
    return run(args, model, device, autocast, (world, rank), f"on {world} x {device.type} ({origin})")


def download(args: argparse.Namespace):
    """The task's data downloaded into the cache (rank 0, before the others read it)."""
    if args.task == "hellaswag":
        return hellaswag.download(args.url)
    if args.task == "core":
        return core_eval.download(args.url or core_eval.URL)
    return pile_bpb.download(args.split, args.url)


def gather(items: list, world: int) -> list:
    """Every process's items, on every process (this process's own when alone)."""
    if world == 1:
        return items
    from composer.utils import dist

    return [item for part in dist.all_gather_object(items) for item in part]


def together(check, world: int):
    """check()'s result, or its UserError, on every process: with several processes each runs check() and they agree
    (an all-gather) before any exits, so that an input error one rank finds (a bad line only it reads) ends every
    rank with exit status 2. Composer's launcher reports the lowest rank's status, and a rank that had not failed
    would be ended by the SIGTERM the launcher sends once another exits: 143, the status of a preemption."""
    if world == 1:
        return check()
    try:
        result, error = check(), None
    except UserError as e:
        result, error = None, str(e)
    errors = [e for e in gather([error], world) if e is not None]
    if errors:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's SIGTERM once a rank exits: each exits 2 itself
        raise UserError(errors[0])
    return result


def progress_bar(total: Optional[int], unit: str, desc: str, rank: int):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, disable=rank != 0, file=sys.stderr,
                mininterval=0.5 if sys.stderr.isatty() else 30)


def run_hellaswag(args, model, device, autocast, world_rank: tuple[int, int], where: str) -> int:
    """Score HellaSwag (this process: every world-th example), print acc and acc_norm, write --out on rank 0."""
    world, rank = world_rank
    examples = together(lambda: hellaswag.load_examples(args.data, args.url, args.limit), world)
    mine = examples[rank::world]  # every world-th example: the processes split them evenly
    t0 = time.time()
    with progress_bar(len(mine), "ex", args.task, rank) as bar:
        predictions = hellaswag.evaluate(model, mine, gpt2(), device, args.batch_size or 8, autocast, bar)
    predictions = sorted(gather(predictions, world), key=lambda p: p.ind)
    seconds = time.time() - t0
    if rank != 0:
        return 0
    acc, acc_norm = hellaswag.accuracy(predictions)
    if args.out:
        write_out(args.out, {"task": args.task, "n": len(predictions), "acc": acc, "acc_norm": acc_norm,
                             "source": args.src, "data": args.data or args.url,
                             "predictions": [p._asdict() for p in predictions]})
    print(f"{args.task}: {len(predictions):,} examples, acc {acc:.4f}, acc_norm {acc_norm:.4f}, "
          f"{len(predictions) / max(seconds, 1e-9):.1f} examples/s {where}"
          + (f"; results in {args.out}" if args.out else ""), flush=True)
    return 0


def run_pile(args, model, device, autocast, world_rank: tuple[int, int], where: str) -> int:
    """Pile BPB (this process: every world-th document), per component and overall; --out written on rank 0."""
    world, rank = world_rank
    files = together(lambda: pile_bpb.data_files(args.data) if args.data else [pile_bpb.download(args.split, args.url)],
                     world)
    mine = lambda ind: ind % world == rank  # noqa: E731
    if world > 1:  # every line read once before scoring, so that a bad one ends every rank alike (together)
        together(lambda: sum(1 for _ in pile_bpb.read_documents(files, args.limit, keep=mine)), world)
    docs = pile_bpb.read_documents(files, args.limit, keep=mine)
    t0 = time.time()
    with progress_bar(None, "doc", args.task, rank) as bar:
        scored = pile_bpb.evaluate(model, docs, gpt2(), device, args.batch_size or 16, autocast, bar)
    scored = sorted(gather(scored, world), key=lambda s: s.ind)
    seconds = time.time() - t0
    if rank != 0:
        return 0
    if not scored:
        raise UserError(f"{args.data or files[0]} holds no documents; pass the Pile's val.jsonl.zst or test.jsonl.zst")
    results = pile_bpb.summarize(scored)
    if results["bpb"] is None:
        raise UserError(f"{args.data or files[0]}: its {len(scored):,} documents are all empty, no bytes to score; "
                        "pass the Pile's val.jsonl.zst or test.jsonl.zst")
    if args.out:
        write_out(args.out, {**results, "source": args.src, "data": [str(f) for f in files],
                             "per_document": [{**s._asdict(), "bits": s.bits} for s in scored]})
    for name, c in results["components"].items():
        bpb = "none  " if c["bpb"] is None else f"{c['bpb']:.4f}"
        print(f"pile: {name:<20} bpb {bpb} ({c['documents']:,} documents, "
              + ("all empty: no bytes to score)" if c["bpb"] is None else f"{c['bytes']:,} bytes)"))
    print(f"pile: {results['documents']:,} documents, bpb {results['bpb']:.4f} (all bits over all bytes), "
          f"{results['tokens'] / max(seconds, 1e-9):,.0f} tokens/s {where}"
          + (f"; results in {args.out}" if args.out else ""), flush=True)
    return 0


def load_core(args) -> tuple[list, list]:
    """(the tasks, each task's kept rows) of --data or the downloaded bundle, every row read and checked."""
    return core_eval.load(args.data or core_eval.download(args.url or core_eval.URL), args.max_per_task)


def run_core(args, model, device, autocast, world_rank: tuple[int, int], where: str) -> int:
    """CORE (this process: every world-th item over all tasks); per task and overall; --out written on rank 0."""
    world, rank = world_rank
    tasks, kept = together(lambda: load_core(args), world)
    block_size = context_length(model)
    stream = core_eval.items(tasks, kept, gpt2(), block_size or 1, keep=lambda n: n % world == rank)
    t0 = time.time()
    with progress_bar(len(range(rank, sum(len(k) for k in kept), world)), "item", args.task, rank) as bar:
        results, _ = core_eval.evaluate(model, stream, device, args.batch_size or 16, autocast, bar)
    results = sorted(gather(results, world), key=lambda r: (r.task, r.ind))
    seconds = time.time() - t0
    if rank != 0:
        return 0
    summary = core_eval.summarize(tasks, results)
    if args.out:
        write_out(args.out, {"task": "core", **summary, "source": args.src, "data": args.data or args.url
                             or core_eval.URL, "max_per_task": args.max_per_task,
                             "predictions": [{**r._asdict(), "task": tasks[r.task].label} for r in results]})
    for label, t in summary["tasks"].items():
        print(f"core: {label:<34} acc {t['acc']:.4f} centered {t['centered']:+.4f} ({t['n']:,} items, "
              f"{t['num_fewshot']}-shot {t['type']})")
    cut = f"; {summary['cut']:,} prompts longer than block_size {block_size} kept their last tokens" \
        if summary["cut"] else ""
    print(f"core: CORE {summary['core']:.4f} over {len(tasks)} tasks, {summary['n']:,} items, "
          f"{summary['n'] / max(seconds, 1e-9):.1f} items/s {where}{cut}"
          + (f"; results in {args.out}" if args.out else ""), flush=True)
    return 0


def write_out(out: str, results: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic_write_text(out, json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    run_main(main)
