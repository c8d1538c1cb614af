"""Push MDS shards to S3 or an S3-compatible store (MinIO, R2, Ceph, rclone...): parallel, resumable, verified.

Usage:
    python upload_s3.py mds/ s3://my-bucket/pile/mds          # mds/train, mds/val -> s3://my-bucket/pile/mds/...
    python upload_s3.py mds/ s3://my-bucket/pile/mds --endpoint-url http://127.0.0.1:9000 --workers 16
    python upload_s3.py mds/ s3://my-bucket/pile/mds --dry-run    # say what would go up; change nothing

What it does, in order:
1. Finds the MDS datasets in LOCAL_DIR: folders with an index.json whose listed shards exist. LOCAL_DIR may be
   one dataset or a folder of them (train/ + val/, nested too). Anything else is refused unless --any-folder.
   From a dataset folder only index.json, the shard files it lists (the compressed ones when it lists them) and
   to_mds.json go up: other files there, such as the decompressed shard.NNNNN.mds copies a StreamingDataset
   reading the folder leaves beside shard.NNNNN.mds.zstd, stay home (the summary counts them). --any-folder
   uploads every file. Hidden files (names starting with '.', e.g. half-written temporaries) are never uploaded.
2. Lists s3://bucket/prefix once. A file whose object already exists with the same size and MD5 is skipped, so a
   re-run after an interruption uploads only what is missing. The MD5 is compared with the object's ETag (the
   MD5 of a single-part upload on AWS and most stores) and with x-amz-meta-md5chksum, which this script stores on
   every object it writes (rclone uses the same key), so multipart objects and stores whose ETag is not an MD5
   compare too.
3. Uploads the rest in parallel with boto3's transfer manager (multipart above --part-size-mb), with a progress
   bar in bytes. Every index.json goes up last, once every file it lists is in place, so a reader never sees an
   index that points at a missing shard. Replacing a shard of a dataset already in the store deletes that
   dataset's old index.json first: the dataset is briefly absent, never inconsistent.
4. Lists the prefix again and checks every object's size, and its MD5 where the store gives one (ETag or the
   stored md5chksum); a mismatch is an error. Ends with a one-line summary (files, bytes, MB/s).

Credentials: the standard AWS chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws, instance
roles), plus a `.env` file in the working directory (see .env.example); variables already set win.
Endpoint for S3-compatible stores: --endpoint-url, else AWS_ENDPOINT_URL, else S3_ENDPOINT_URL (Streaming reads
S3_ENDPOINT_URL, so one setting serves upload and training). Each request is tried AWS_MAX_ATTEMPTS times (default
5) with exponential backoff, then the script stops with a one-line error naming the cause and the fix.
An upload killed hard (SIGKILL, power loss) may leave an unfinished multipart upload in the bucket, invisible
but billed on AWS: a lifecycle rule "AbortIncompleteMultipartUpload" cleans those up.

This script is the command line; the upload itself is s3_upload.upload_folder (to_mds.py --remote uses it too).
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from pilegpt import s3
from pilegpt.common import UserError, load_dotenv_file, run_main
from pilegpt.mds import s3_upload
from pilegpt.mds.s3_upload import DEFAULT_PART_SIZE_MB, MIN_PART_SIZE_MB
from pilegpt.s3 import DEFAULT_WORKERS


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n")[1] + "\n\nMore: the docstring at the top of upload_s3.py.")
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
