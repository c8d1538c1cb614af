"""Write a run's report.md (and loss.png): what a person reads instead of its logs, each figure naming the file it
comes from (config.json, metrics.jsonl, hellaswag*.json, pile*.json). train.py writes it at the end of every run.
Details: docs/training.md.

Usage:
    python report.py runs/quickstart               # -> runs/quickstart/report.md and loss.png
    python report.py s3://my-bucket/runs/pile      # read from S3; report.md and loss.png are uploaded beside it"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from pilegpt.common import load_dotenv_file, run_main
from pilegpt.train.report import write_report


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a train.py save folder: local, or s3://bucket/prefix")
    args = p.parse_args(argv)
    load_dotenv_file()
    print(f"report: {write_report(args.run)}")
    return 0


if __name__ == "__main__":
    run_main(main)
