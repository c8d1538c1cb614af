"""Plot a run's loss curve (train loss per batch, smoothed, and validation loss) from the metrics.jsonl train.py
writes; prints the first and last train loss (means of 20 batches that do not overlap; a run of 20 or fewer, its
first and last batch) and the last val loss. Details: docs/training.md.

Usage:
    python plot_loss.py runs/quickstart                 # writes runs/quickstart/loss.png
    python plot_loss.py runs/quickstart/metrics.jsonl --out loss.png"""

import argparse
from pathlib import Path
from typing import Optional, Sequence

from pilegpt.common import UserError, run_main
from pilegpt.train.report import Metrics, plot, read_metrics_file


def read_metrics(path: Path) -> Metrics:
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{path} not found: pass a run folder written by train.py (e.g. runs/quickstart)")
    metrics = read_metrics_file(path, Metrics())
    if not len(metrics.train[0]):
        raise UserError(f"{path} holds no train loss yet: did the run get past its first batch?")
    return metrics


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("metrics", help="run folder or its metrics.jsonl")
    p.add_argument("--out", default=None, help="PNG to write (default: loss.png beside metrics.jsonl)")
    args = p.parse_args(argv)
    src = Path(args.metrics)
    metrics = read_metrics(src)
    out = Path(args.out) if args.out else (src if src.is_dir() else src.parent) / "loss.png"

    print(plot(metrics, out, str(src)))
    return 0


if __name__ == "__main__":
    run_main(main)
