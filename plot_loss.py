"""Plot a run's loss curve (train loss per batch, smoothed, and validation loss) from its metrics.jsonl.

Usage:
    python plot_loss.py runs/quickstart                 # writes runs/quickstart/loss.png
    python plot_loss.py runs/quickstart/metrics.jsonl --out loss.png

train.py writes metrics.jsonl (one JSON line per batch: batch, tokens, loss, lr, val_loss...) into the
run's local folder. Prints one line: first and last train loss (mean of 20 batches) and the last val loss.
"""

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

from pilegpt.common import UserError, atomic_path, run_main

WINDOW = 20  # batches in the moving average


def read_metrics(path: Path) -> list[dict]:
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path} not found: pass a run folder written by train.py (e.g. runs/quickstart)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not any("loss" in r for r in rows):
        raise UserError(f"{path} holds no train loss yet: did the run get past its first batch?")
    return rows


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", help="run folder or its metrics.jsonl")
    p.add_argument("--out", default=None, help="PNG to write (default: loss.png beside metrics.jsonl)")
    args = p.parse_args(argv)
    src = Path(args.metrics)
    rows = read_metrics(src)
    out = Path(args.out) if args.out else (src if src.is_dir() else src.parent) / "loss.png"

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A resumed run repeats the batches after its last checkpoint: the last row of each batch wins.
    train = sorted({r["batch"]: r["loss"] for r in rows if "loss" in r}.items())
    val = sorted({r["batch"]: r["val_loss"] for r in rows if "val_loss" in r}.items())
    xs, ys = zip(*train)
    smooth = moving_average(list(ys), WINDOW)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(xs, ys, color="tab:blue", alpha=0.25, linewidth=0.8, label="train loss")
    ax.plot(xs, smooth, color="tab:blue", linewidth=1.8, label=f"train loss ({WINDOW}-batch mean)")
    if val:
        ax.plot(*zip(*val), "o-", color="tab:orange", label="val loss")
    ax.set_xlabel("batch")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"{src}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png")
    first, last = sum(ys[:WINDOW]) / len(ys[:WINDOW]), sum(ys[-WINDOW:]) / len(ys[-WINDOW:])
    print(f"plot_loss: {len(train)} batches, train loss {first:.3f} -> {last:.3f}"
          + (f", last val loss {val[-1][1]:.3f}" if val else "") + f" -> {out}")
    return 0


if __name__ == "__main__":
    run_main(main)
