"""Benchmark upload_s3.py against a plain sequential boto3 upload loop, on a local S3 server (rclone serve s3).

Usage:
    python bench/bench_upload_s3.py                      # ~200 MB in 4 MB shards; workers 1, 4, 8
    python bench/bench_upload_s3.py --total-mb 400 --file-mb 16 --workers 1 8
    python bench/bench_upload_s3.py --total-mb 40 --workers 1 4 --rounds 1     # quick: ~15 s

Writes an MDS-shaped folder (random shards + an index.json listing them), starts `rclone serve s3` on loopback, then
times, in the same run and to fresh prefixes: the baseline (a `client.upload_file` loop, one file after another, as
one would write it by hand), upload_s3 at each --workers, and an upload_s3 re-run over an existing copy (everything
skipped). Reports MB/s and the ratio to the baseline. upload_s3's time includes hashing each file (MD5), listing
the prefix before and after, and verification. Client and server share this machine's cores, so the ratios are
those of a loopback link, not of a network one, where parallel requests matter more. upload_s3 is a thin command
line over s3_upload.upload_folder, which to_mds.py --remote uses too: the figures hold for both.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "tests"))

import upload_s3  # noqa: E402
from helpers import KEY, SECRET, start_s3_server, stop  # noqa: E402

BUCKET = "bench"


def write_dataset(folder: Path, total_mb: int, file_mb: float) -> int:
    """Random (incompressible) shards plus an MDS index.json listing them; returns the bytes written."""
    folder.mkdir(parents=True)
    size = int(file_mb * 1e6)
    shards = []
    for i in range(max(1, round(total_mb / file_mb))):
        name = f"shard.{i:05d}.mds"
        (folder / name).write_bytes(os.urandom(size))
        shards.append({"raw_data": {"basename": name, "bytes": size, "hashes": {}}, "zip_data": None,
                       "format": "mds", "version": 2, "compression": None})
    (folder / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))
    return sum(p.stat().st_size for p in folder.iterdir())


def baseline(endpoint: str, folder: Path, prefix: str) -> float:
    """The hand-written way: one boto3 upload_file after another. Returns seconds."""
    import boto3

    start = time.perf_counter()
    client = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
    return time.perf_counter() - start


def run_upload_s3(endpoint: str, folder: Path, prefix: str, workers: int) -> tuple[float, str]:
    """upload_s3.main in this process (progress bar hidden). Returns (seconds, its summary line)."""
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        upload_s3.main([str(folder), f"s3://{BUCKET}/{prefix}", "--endpoint-url", endpoint,
                        "--workers", str(workers)])
    return time.perf_counter() - start, out.getvalue().strip()


def measure(endpoint: str, served: Path, mds: Path, n_files: int, workers: list[int], rounds: int) -> dict:
    """Seconds per method, `rounds` times each, interleaved so that a busy machine slows every method alike.

    Every prefix is deleted after its run except the last one, which the re-run measurement reuses."""
    times: dict[str, list[float]] = {"baseline": [], **{f"w{w}": [] for w in workers}}
    for r in range(rounds):
        times["baseline"].append(baseline(endpoint, mds / "train", f"baseline{r}"))
        shutil.rmtree(served / f"baseline{r}")
        for w in workers:
            seconds, line = run_upload_s3(endpoint, mds, f"w{w}r{r}", w)
            assert line.startswith(f"uploaded {n_files} files"), line
            times[f"w{w}"].append(seconds)
            if (r, w) != (rounds - 1, workers[-1]):
                shutil.rmtree(served / f"w{w}r{r}")
    return times


def report(title: str, times: dict, total: int, workers: list[int]) -> None:
    med = {name: min(values) for name, values in times.items()}  # the least disturbed run of each
    print(f"\n{title} (best of {len(times['baseline'])})")
    print(f"{'method':<36} {'seconds':>8} {'MB/s':>8} {'vs baseline':>12}")
    names = [("baseline", "boto3 upload_file loop (baseline)")] + [(f"w{w}", f"upload_s3.py --workers {w}")
                                                                   for w in workers]
    for key, name in names:
        print(f"{name:<36} {med[key]:8.2f} {total / 1e6 / med[key]:8.1f} {med['baseline'] / med[key]:11.2f}x")
    if len(workers) > 1:
        ratio = med[f"w{workers[0]}"] / med[f"w{workers[-1]}"]
        print(f"--workers {workers[-1]} vs --workers {workers[0]}: {ratio:.2f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-mb", type=int, default=200, help="data to upload per run (default 200)")
    p.add_argument("--file-mb", type=float, default=4, help="size of each shard (default 4)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8], help="upload_s3 --workers to time")
    p.add_argument("--rounds", type=int, default=2, help="repeats on the unlimited link (default 2; best kept)")
    p.add_argument("--per-stream-mb", type=float, default=20,
                   help="second server: each upload stream capped at this MB/s, like one connection to a remote "
                        "store (default 20; 0 skips it)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench_upload_s3_") as tmp:
        tmp = Path(tmp)
        mds = tmp / "mds"
        total = write_dataset(mds / "train", args.total_mb, args.file_mb)
        n_files = len(list((mds / "train").iterdir()))
        os.environ.update({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                           "AWS_DEFAULT_REGION": "us-east-1"})
        print(f"{n_files} files, {total / 1e6:.1f} MB per run, to rclone serve s3 on loopback; {os.cpu_count()} CPUs "
              "shared by client and server", flush=True)
        results = []
        for per_stream in ([0, args.per_stream_mb] if args.per_stream_mb else [0]):
            served = tmp / f"s3root{per_stream}" / BUCKET
            limit = ("--bwlimit-file", f"{per_stream}M") if per_stream else ()
            server, s3 = start_s3_server(served.parent, bucket=BUCKET, extra_args=limit)
            endpoint = s3.endpoint_url
            try:
                rounds = args.rounds if not per_stream else 1
                times = measure(endpoint, served, mds, n_files, args.workers, rounds)
                if not per_stream:  # idempotence: a re-run over the complete copy the last run left
                    rerun_s, line = run_upload_s3(endpoint, mds, f"w{args.workers[-1]}r{rounds - 1}", args.workers[-1])
                    assert line.startswith("uploaded 0 files") and f"skipped {n_files} unchanged" in line, line
            finally:
                stop(server)
            title = (f"each upload stream capped at {per_stream:g} MB/s (rclone --bwlimit-file)" if per_stream
                     else "loopback, no limit (CPU-bound here)")
            results.append((title, times))
    for title, times in results:
        report(title, times, total, args.workers)
    print(f"\nre-run over a complete copy (--workers {args.workers[-1]}): {rerun_s:.2f} s, all {n_files} files "
          "skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
