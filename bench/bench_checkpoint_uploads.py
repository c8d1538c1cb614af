"""Benchmark a training run's checkpoint uploads: train.py's thread uploader (pilegpt/train/run/uploads.py) against
Composer's own process-based RemoteUploader, with a local save_folder (no uploads) as the baseline, in the same run.

Usage:
    python bench/bench_checkpoint_uploads.py                           # config/tiny.py, 60 batches, save every 10
    python bench/bench_checkpoint_uploads.py --batches 40 --save-every 5 --rounds 2

Each variant is a whole `python train.py config/tiny.py` process (start-up included, as a user pays it) on the same
.bin data, saving a Composer checkpoint (model + Adam state, ~80 MB for config/tiny.py) every --save-every
batches: to a local folder (baseline), and to `rclone serve s3` on loopback with Composer 0.32's RemoteUploader
(a pool of spawned processes, the `latest` pointer after a 30 s poll of S3) and with train.py's S3Uploads (threads
of the training process). Both S3 variants also upload config.json, model.pt and the logs through S3Uploads;
only the checkpoint saver's uploader differs. Every run must end with all its checkpoints in the bucket. Reports
wall seconds (best of --rounds) and the overhead over the baseline.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from helpers import KEY, SECRET, start_s3_server, stop  # noqa: E402

# train.py with Composer's uploader for checkpoints: the patch that hands the saver S3Uploads is made a no-op.
COMPOSERS = ("import contextlib, sys; from pilegpt.train import run_uploads; "
             "run_uploads.checkpoint_uploads = lambda u: contextlib.nullcontext(); import train; "
             "sys.argv[0] = train.__file__; from pilegpt.common import run_main; run_main(train.main)")


def write_data(folder: Path) -> None:
    import numpy as np

    from pilegpt.data import write_token_files

    rng = np.random.default_rng(0)
    write_token_files(folder, {"train": rng.integers(0, 50257, 400_000), "val": rng.integers(0, 50257, 20_000)})


def train(variant: str, data: Path, save_folder: str, batches: int, every: int, cwd: Path, env: dict) -> float:
    args = [str(REPO / "config" / "tiny.py"), f"--data_dir={data}", f"--max_duration={batches}ba",
            f"--save_interval={every}ba", f"--eval_interval={batches}ba", "--eval_subset_num_batches=1",
            "--sample_length=0", "--progress_bar=False", "--device=cpu", f"--save_folder={save_folder}",
            "--run_name=bench"]
    launch = [sys.executable, "-c", COMPOSERS] if variant == "composer" else [sys.executable, str(REPO / "train.py")]
    start = time.perf_counter()
    proc = subprocess.run([*launch, *args], cwd=cwd, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=1800)
    seconds = time.perf_counter() - start
    if proc.returncode != 0 or "done: " not in proc.stdout:
        sys.exit(f"{variant}: train.py failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return seconds


def run_rounds(args: argparse.Namespace, tmp: Path, served: Path, env: dict, saves: int) -> dict[str, list[float]]:
    """--rounds rounds of the three variants, interleaved; each S3 run must leave every checkpoint in the bucket."""
    times: dict[str, list[float]] = {"local": [], "composer": [], "threads": []}
    for r in range(args.rounds):
        for variant in times:
            cwd = tmp / f"{variant}{r}"
            cwd.mkdir()
            folder = str(cwd / "run") if variant == "local" else f"s3://bench/{variant}{r}"
            times[variant].append(train(variant, tmp / "data", folder, args.batches, args.save_every, cwd, env))
            if variant != "local":
                got = sorted(p.name for p in (served / f"{variant}{r}").glob("ep*-ba*-rank0.pt"))
                assert len(got) == saves and (served / f"{variant}{r}" / "model.pt").is_file(), got
            print(f"round {r + 1}: {variant:<8} {times[variant][-1]:6.1f} s", flush=True)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=60, help="batches per run (default 60)")
    p.add_argument("--save-every", type=int, default=10, help="checkpoint interval in batches (default 10)")
    p.add_argument("--rounds", type=int, default=1, help="repeats, interleaved; best kept (default 1)")
    args = p.parse_args(argv)
    saves = args.batches // args.save_every

    with tempfile.TemporaryDirectory(prefix="bench_ckpt_uploads_") as tmp:
        tmp = Path(tmp)
        write_data(tmp / "data")
        served = tmp / "s3root" / "bench"
        server, s3 = start_s3_server(served.parent, bucket="bench")
        endpoint = s3.endpoint_url
        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint, "PYTHONUNBUFFERED": "1"}
        try:
            times = run_rounds(args, tmp, served, env, saves)
        finally:
            stop(server)
        size = max(p.stat().st_size for p in (served / "threads0").glob("ep*-ba*-rank0.pt"))

    best = {name: min(values) for name, values in times.items()}
    print(f"\nconfig/tiny.py, {args.batches} batches, a {size / 1e6:.0f} MB checkpoint every {args.save_every} "
          f"({saves} uploads), rclone serve s3 on loopback, {os.cpu_count()} CPUs; best of {args.rounds}")
    print(f"{'checkpoints go to':<46} {'seconds':>8} {'overhead':>9} {'vs Composer':>12}")
    names = {"local": "a local folder (baseline: no uploads)", "composer": "S3, Composer's RemoteUploader (processes)",
             "threads": "S3, train.py's S3Uploads (threads)"}
    for key, name in names.items():
        over = best[key] - best["local"]
        print(f"{name:<46} {best[key]:8.1f} {over:+8.1f}s {best['composer'] / best[key]:11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
