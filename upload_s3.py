"""Push MDS shards to S3 or an S3-compatible store (MinIO, R2, Ceph, rclone...): parallel, resumable (what is
already there with the same size and MD5 is skipped), every index.json after the shards it lists, verified
afterwards. Credentials from the AWS chain or .env. The upload itself is pilegpt/mds/s3_upload.py (to_mds.py
--remote uses it too). Details: docs/mds-and-s3.md.

Usage:
    python upload_s3.py mds/ s3://my-bucket/pile/mds          # mds/train, mds/val -> s3://my-bucket/pile/mds/...
    python upload_s3.py mds/ s3://my-bucket/pile/mds --endpoint-url http://127.0.0.1:9000 --workers 16
    python upload_s3.py mds/ s3://my-bucket/pile/mds --dry-run    # say what would go up; change nothing"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from pilegpt import s3
from pilegpt.common import UserError, load_dotenv_file, run_main
from pilegpt.mds import s3_upload
from pilegpt.mds.s3_upload import DEFAULT_PART_SIZE_MB, MIN_PART_SIZE_MB
from pilegpt.s3 import DEFAULT_WORKERS


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("local_dir", metavar="LOCAL_DIR", help="an MDS dataset (has index.json) or a folder of them")
    p.add_argument("remote", metavar="s3://bucket/prefix", help="where to put it; LOCAL_DIR/x goes to prefix/x")
    p.add_argument("--endpoint-url", default=None,
                   help="S3-compatible store (MinIO, R2, ...); default: AWS_ENDPOINT_URL or S3_ENDPOINT_URL, "
                        "else AWS S3")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"parallel requests (default {DEFAULT_WORKERS})")
    p.add_argument("--part-size-mb", type=int, default=DEFAULT_PART_SIZE_MB,
                   help=f"multipart upload for files above this size, in parts of it (default "
                        f"{DEFAULT_PART_SIZE_MB}, at least {MIN_PART_SIZE_MB})")
    p.add_argument("--dry-run", action="store_true", help="compare with the store and report; upload nothing")
    p.add_argument("--any-folder", action="store_true",
                   help="upload LOCAL_DIR even if it is not an MDS dataset (index.json files still go last)")
    args = p.parse_args(argv)
    if args.workers < 1:
        raise UserError(f"--workers {args.workers} must be at least 1")
    if args.part_size_mb < MIN_PART_SIZE_MB:
        raise UserError(f"--part-size-mb {args.part_size_mb} is below S3's minimum part size: use at least "
                        f"{MIN_PART_SIZE_MB}")
    s3.parse_s3_url(args.remote)  # a malformed URL fails before anything is read
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    load_dotenv_file(".env")  # before the client reads the environment
    result = s3_upload.upload_folder(args.local_dir, args.remote, workers=args.workers,
                                   part_size=args.part_size_mb << 20, dry_run=args.dry_run,
                                   any_folder=args.any_folder, endpoint_url=args.endpoint_url)
    print(s3_upload.summary(result, args.remote, args.dry_run))
    return 0


if __name__ == "__main__":
    run_main(main)
