"""Write a run's report.md: what a person reads instead of its logs. train.py writes it at the end of every run.

Usage:
    python report.py runs/quickstart               # -> runs/quickstart/report.md and loss.png
    python report.py s3://my-bucket/runs/pile      # read from S3; report.md and loss.png are uploaded beside it

Each figure names the file it comes from:
- the run: name, commit, start, processes, device, precision, and every setting that differs from train.py's
  defaults (config.json);
- the environment: Python, torch, Composer, Streaming, numpy, host, GPU (config.json);
- speed: median tokens/s and MFU over the last logged batches (metrics.jsonl);
- losses: the final train loss, and the last loss and bits per byte of every eval set (metrics.jsonl);
- HellaSwag: the last in-training figures (metrics.jsonl) and eval.py's results saved in the run folder
  (hellaswag*.json), beside the published anchors;
- the loss curve (loss.png, plot_loss.py).
A run on S3 keeps its metrics as logs/{start}-metrics.jsonl, one file per start (a resumed run has several):
they are read in order, and for a batch trained twice the later row wins.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from pilegpt.common import load_dotenv_file, run_main
from pilegpt.train.report import write_report


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a train.py save folder: local, or s3://bucket/prefix")
    args = p.parse_args(argv)
    load_dotenv_file()
    print(f"report: {write_report(args.run)}")
    return 0


if __name__ == "__main__":
    run_main(main)
