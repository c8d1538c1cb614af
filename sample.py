"""Generate text from a trained GPT: a model.pt export, a Composer checkpoint or a run folder, local or on S3,
read weights-only (nothing in a file can run code). Samples go to stdout, each followed by a line of dashes;
progress to stderr. The same --seed on the same device gives the same text. Details: docs/evaluation.md.

Usage:
    python sample.py --checkpoint runs/quickstart --prompt "def main(" --num-samples 3 --max-new-tokens 200
    python sample.py --checkpoint s3://bucket/runs/pile/model.pt --prompt "The meaning of life" --top-k 50
    python sample.py --checkpoint runs/pile/ep0-ba2000-rank0.pt --device cuda --seed 7
    python sample.py --checkpoint runs/my_model --model-class examples.my_model:MyGPT   # your own model's class"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional

import torch

from pilegpt.checkpoint import add_load_arguments, add_model_class_argument, load_model
from pilegpt.common import UserError, load_dotenv_file, pick_device, run_main
from pilegpt.model_contract import generate_tokens, stated
from pilegpt.tokenizer import EOT, EOT_ID, gpt2

SEPARATOR = "-" * 40  # printed after each sample


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="model.pt export, Composer checkpoint file, or run folder; local path or s3://bucket/key")
    p.add_argument("--prompt", default=EOT, help=f"text to continue (default {EOT}: the start of a new document)")
    p.add_argument("--num-samples", type=int, default=1, help="how many samples (default 1)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="samples generated at once; memory grows with it, not with --num-samples (default 64)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate per sample (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="> 0; below 1 is more conservative (default 0.8)")
    p.add_argument("--top-k", type=int, default=200,
                   help="sample among the k likeliest tokens; 0 = all; 1 = greedy (default 200)")
    p.add_argument("--seed", type=int, default=1337, help="random seed; same seed + device = same text (default 1337)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    add_load_arguments(p)
    add_model_class_argument(p)
    args = p.parse_args(argv)
    for name in ("num_samples", "batch_size", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0 = no limit), got {args.top_k}")
    if not args.temperature > 0:
        raise UserError(f"--temperature must be > 0, got {args.temperature} (use --top-k 1 for greedy decoding)")
    return args


# ---------------------------------------------------------------------------------------------------------
# Sampling

def encode_prompt(prompt: str, vocab_size: Optional[int]) -> list[int]:
    ids = gpt2().encode(prompt, allowed_special={EOT}) or [EOT_ID]  # an empty prompt: start a new document
    if vocab_size is not None and max(ids) >= vocab_size:
        raise UserError(f"the prompt encodes to token {max(ids)}, but the model's vocabulary has only "
                        f"{vocab_size} tokens: was it trained with the GPT-2 tokenizer?")
    return ids


def decode(ids: list[int]) -> str:
    # A vocabulary padded past GPT-2's 50257 (e.g. 50304) has ids with no text; drop them.
    return gpt2().decode([i for i in ids if i < gpt2().n_vocab])


def main(argv=None) -> int:
    args = parse_args(argv)
    load_dotenv_file()
    device = pick_device(args.device)
    model = load_model(args.checkpoint, n_head=args.n_head, endpoint_url=args.endpoint_url,
                       model_class=args.model_class).to(device)

    prompt = encode_prompt(args.prompt, stated(model, "vocab_size"))  # a custom model may state none
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(args.seed)
    top_k = args.top_k or None
    from tqdm import tqdm

    start = time.perf_counter()
    # Batches of --batch-size rows, each printed when done: memory does not grow with --num-samples. Up to one
    # batch of samples, the same RNG draws as one generate(idx, max_new_tokens) call.
    batches = range(0, args.num_samples, args.batch_size)  # the first sample of each
    bar = tqdm(total=len(batches) * args.max_new_tokens, desc="generate", unit="tok", file=sys.stderr, leave=False)
    for first in batches:
        rows = min(args.batch_size, args.num_samples - first)
        idx = torch.tensor([prompt] * rows, dtype=torch.long, device=device)  # (B, T)
        for _ in range(args.max_new_tokens):  # one token per call, so the bar moves
            idx = generate_tokens(model, idx, 1, temperature=args.temperature, top_k=top_k)  # model_contract.py
            bar.update()
        for row in idx.tolist():
            print(decode(row))
            print(SEPARATOR)
        sys.stdout.flush()
    bar.close()
    seconds = time.perf_counter() - start
    new_tokens = args.num_samples * args.max_new_tokens
    params = sum(p.numel() for p in model.parameters())  # a tied matrix once
    print(f"sampled {args.num_samples} x {args.max_new_tokens} tokens from a {params / 1e6:.2f}M-parameter "
          f"model on {device} in {seconds:.1f} s ({new_tokens / max(seconds, 1e-9):.0f} tokens/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_main(main)
