"""Push MDS shards to S3 or an S3-compatible store (MinIO, R2, Ceph, rclone...): parallel, resumable, verified.

Usage:
    python upload_s3.py mds/ s3://my-bucket/pile/mds          # mds/train, mds/val -> s3://my-bucket/pile/mds/...
    python upload_s3.py mds/ s3://my-bucket/pile/mds --endpoint-url http://127.0.0.1:9000 --workers 16
    python upload_s3.py mds/ s3://my-bucket/pile/mds --dry-run    # say what would go up; change nothing

What it does, in order:
1. Finds the MDS datasets in LOCAL_DIR: folders with an index.json whose listed shards exist. LOCAL_DIR may be
   one dataset or a folder of them (train/ + val/, nested too). Anything else is refused unless --any-folder.
   Hidden files (names starting with '.', e.g. half-written temporaries) are never uploaded.
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
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import posixpath
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from common import UserError, load_dotenv_file, run_main, s3_endpoint_url

INDEX_NAME = "index.json"  # the MDS index; uploaded after every shard it lists
MD5_META_KEY = "md5chksum"  # x-amz-meta-md5chksum = base64 MD5 of the whole file (the key rclone uses too)
DEFAULT_WORKERS = 8  # parallel requests (whole small files and parts of big ones)
DEFAULT_PART_SIZE_MB = 16  # multipart above this size, in parts of this size (MDS shards are <= 64 MB by default)
MIN_PART_SIZE_MB = 5  # S3 rejects smaller parts (all but the last)
DEFAULT_MAX_ATTEMPTS = 5  # tries per request (AWS_MAX_ATTEMPTS overrides), exponential backoff between them
CONNECT_TIMEOUT_S = 5  # an unreachable endpoint fails after about attempts x this
READ_TIMEOUT_S = 60
HASH_CHUNK = 4 << 20  # bytes read at a time when hashing
MB = 1e6  # MB in the summary (decimal, like the progress bar)


@dataclass
class LocalFile:
    rel: str  # POSIX path relative to LOCAL_DIR; the object key is prefix/rel
    path: Path
    size: int  # bytes
    md5: Optional[bytes] = None  # raw digest, filled in just before the file is compared or uploaded


@dataclass
class RemoteObject:
    size: int  # bytes
    etag: str  # without the quotes; an MD5 in hex for single-part uploads on most stores


@dataclass
class Result:
    uploaded: int = 0  # files (or, in a dry run, files that would be uploaded)
    uploaded_bytes: int = 0
    skipped: int = 0  # files already in the store with the same size and MD5
    skipped_bytes: int = 0
    seconds: float = 0.0  # listing + hashing + uploading
    replaced_indexes: int = 0  # old index.json deleted before shards of their dataset were replaced
    verified: int = 0  # objects found with the right size after the upload
    verified_md5: int = 0  # ... of which the MD5 (ETag or md5chksum) was checked too
    extra_objects: int = 0  # objects under the prefix that LOCAL_DIR does not have (left alone)


# ---------------------------------------------------------------------------------------------------------------
# Local side: which files, and is it an MDS dataset


def parse_s3_url(url: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix/' -> ('bucket', 'some/prefix'); the prefix may be empty."""
    if not url.startswith("s3://"):
        raise UserError(f"remote {url!r} is not an S3 URL: write it as s3://bucket/prefix")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket or any(c.isspace() for c in bucket):
        raise UserError(f"remote {url!r} has no valid bucket name: write it as s3://bucket/prefix")
    return bucket, prefix.strip("/")


def object_key(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


def collect_files(root: Path, any_folder: bool = False) -> list[LocalFile]:
    """Every non-hidden file under `root`, sorted; unless `any_folder`, check that `root` holds MDS datasets."""
    if not root.is_dir():
        raise UserError(f"{root} is not a folder: pass the output folder of to_mds.py (e.g. mds/)")
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith(".") or not path.is_file():
                continue
            files.append(LocalFile(path.relative_to(root).as_posix(), path, path.stat().st_size))
    if not files:
        raise UserError(f"{root} holds no files: nothing to upload (did to_mds.py write somewhere else?)")
    if not any_folder:
        indexes = [f for f in files if posixpath.basename(f.rel) == INDEX_NAME]
        if not indexes:
            raise UserError(f"{root} is not an MDS dataset: no {INDEX_NAME} in it or its subfolders; pass the "
                            "output folder of to_mds.py, or --any-folder to upload any folder as it is")
        by_rel = {f.rel: f for f in files}
        listed = set()
        for index in indexes:
            listed |= check_mds_index(root, index, by_rel)
        # Besides the datasets, only side files in LOCAL_DIR or a dataset folder (e.g. to_mds.py's notes) go up:
        # a stray folder means LOCAL_DIR is probably wrong (a parent folder that happens to hold a dataset).
        dataset_dirs = {posixpath.dirname(index.rel) for index in indexes}
        for f in files:
            folder = posixpath.dirname(f.rel)
            if f.rel not in listed and folder != "" and folder not in dataset_dirs:
                raise UserError(f"{f.path} is not part of an MDS dataset in {root} (no {INDEX_NAME} lists it or "
                                "lies beside it): point LOCAL_DIR at the datasets' folder, move the file away, or "
                                "pass --any-folder to upload everything")
    return files


def check_mds_index(root: Path, index: LocalFile, by_rel: dict[str, LocalFile]) -> set[str]:
    """Raise UserError unless every shard that `index` lists is here (compressed if listed so) with its size.

    Returns the relative paths of the index and of the listed shard files that are here."""
    hint = "re-run to_mds.py to rewrite the dataset, or pass --any-folder to upload the folder as it is"
    try:
        shards = json.loads(index.path.read_text()).get("shards")
    except (OSError, ValueError, AttributeError) as e:
        raise UserError(f"{index.path} is not a readable MDS index ({e}); {hint}") from None
    if not isinstance(shards, list) or not shards:
        raise UserError(f"{index.path} lists no shards, so it is not an MDS dataset; {hint}")
    folder = posixpath.dirname(index.rel)
    present = {index.rel}
    for shard in shards:
        listed = {}  # kind -> (rel path, size the index gives)
        for kind in ("raw_data", "zip_data"):
            info = shard.get(kind) if isinstance(shard, dict) else None
            if isinstance(info, dict) and isinstance(info.get("basename"), str):
                listed[kind] = (posixpath.normpath(posixpath.join(folder, info["basename"])), info.get("bytes"))
        if "raw_data" not in listed:
            raise UserError(f"{index.path} has a shard entry without raw_data: not an MDS index; {hint}")
        # Streaming downloads the compressed form when the index lists one, else the raw shard: that one must be here
        needed, _ = listed.get("zip_data", listed["raw_data"])
        if needed not in by_rel:
            raise UserError(f"{index.path} lists shard {needed!r}, which is missing from {root}: the dataset is "
                            f"incomplete; {hint}")
        for rel, size in listed.values():
            if rel in by_rel and isinstance(size, int) and by_rel[rel].size != size:
                raise UserError(f"{by_rel[rel].path} is {by_rel[rel].size} bytes but {index.path} says {size}: "
                                f"the shard is damaged or from another run; {hint}")
            if rel in by_rel:
                present.add(rel)
    return present


def file_md5(path: Path) -> bytes:
    h = hashlib.md5(usedforsecurity=False)  # an integrity check that S3 ETags speak, not a security measure
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    return h.digest()


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def is_plain_md5(etag: str) -> bool:
    return len(etag) == 32 and all(c in "0123456789abcdefABCDEF" for c in etag)


# ---------------------------------------------------------------------------------------------------------------
# Store side: client, errors


def max_attempts() -> int:
    """Tries per request: AWS_MAX_ATTEMPTS (the variable botocore reads too), else DEFAULT_MAX_ATTEMPTS."""
    value = os.environ.get("AWS_MAX_ATTEMPTS") or str(DEFAULT_MAX_ATTEMPTS)
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"AWS_MAX_ATTEMPTS={value!r} is not a whole number >= 1: fix it in the environment or .env")
    return int(value)


def make_client(endpoint_url: Optional[str], workers: int) -> tuple[object, str]:
    """An S3 client from the default credential chain, with bounded retries and timeouts, and '****WXYZ' for the
    access key id in use (for error messages; the secret is never shown)."""
    import boto3
    from botocore.config import Config

    session = boto3.session.Session()
    credentials = session.get_credentials()
    if credentials is None:
        from botocore.exceptions import NoCredentialsError

        raise NoCredentialsError()
    config = Config(
        retries={"total_max_attempts": max_attempts(), "mode": "standard"},  # backoff rand(0, 2^i) s, i = 0, 1, ..
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_pool_connections=max(10, 2 * workers),
    )
    key_id = credentials.access_key or ""
    try:
        return session.client("s3", endpoint_url=endpoint_url, config=config), f"****{key_id[-4:]}" if key_id else ""
    except ValueError as e:  # botocore: "Invalid endpoint: ..."
        raise UserError(f"endpoint URL {endpoint_url!r} is not valid ({e}): write it like "
                        "http://127.0.0.1:9000 or https://ACCOUNT.r2.cloudflarestorage.com") from None


def describe_client_error(err, bucket: str, where: str, at: str, attempts: int, key_id: str = "") -> str:
    """One line naming the cause and the fix for an S3 error response (a botocore ClientError)."""
    error = err.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    op = getattr(err, "operation_name", "request")
    creds = "in the environment or .env (or AWS_PROFILE / ~/.aws/credentials)"
    key = f" {key_id}" if key_id else ""
    if code in ("InvalidAccessKeyId", "InvalidClientTokenId"):
        return (f"wrong credentials: the store{at} does not know the access key id{key}; check AWS_ACCESS_KEY_ID "
                f"{creds}")
    if code == "SignatureDoesNotMatch":
        return (f"wrong credentials: the store{at} rejected the request signature, so the secret key does not "
                f"match the access key id{key}; check AWS_SECRET_ACCESS_KEY {creds}")
    if code in ("ExpiredToken", "InvalidToken", "TokenRefreshRequired", "RequestExpired"):
        return (f"the credentials have expired ({code}); refresh them (new AWS_SESSION_TOKEN, `aws sso login`) "
                "and check the clock of this machine")
    if code == "NoSuchBucket" or (code in ("404", "NotFound") and op == "HeadBucket"):
        return (f"bucket '{bucket}' does not exist{at}: create it (e.g. `aws s3 mb s3://{bucket}`) or fix the "
                f"bucket in {where}")
    if code in ("AccessDenied", "AllAccessDisabled", "Forbidden", "403") or status == 403:
        return (f"access denied to {where}{at} ({op}): the credentials{key} need s3:ListBucket, s3:GetObject, "
                "s3:PutObject (and s3:DeleteObject to replace a dataset) there; fix the bucket policy or IAM "
                "permissions, or use other credentials")
    if code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"):
        return (f"bucket '{bucket}' is in another region ({code}): set AWS_DEFAULT_REGION to the bucket's region "
                f"{creds}")
    if code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout") or (status or 0) >= 500:
        return (f"the store{at} kept failing {op} on {where} ({code or status}) after {attempts} attempts: try "
                "again later (a re-run resumes), or lower --workers")
    message = error.get("Message") or ""
    return f"S3 {op} on {where} failed{at}: {code or status} {message}".rstrip() + "; check the URL and permissions"


@contextmanager
def s3_errors(known: dict, bucket: str, prefix: str, endpoint_url: Optional[str]) -> Iterator[None]:
    """Turn botocore exceptions into one-line UserErrors naming the cause and the fix."""
    from botocore import exceptions as bx

    where = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    at = f" at {endpoint_url}" if endpoint_url else ""
    attempts = max_attempts()
    try:
        yield
    except (bx.NoCredentialsError, bx.PartialCredentialsError) as e:
        raise UserError(f"no usable AWS credentials ({type(e).__name__}): set AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY in the environment or in a .env file in the working directory (see "
                        ".env.example), or AWS_PROFILE / ~/.aws/credentials") from None
    except bx.ProfileNotFound as e:
        raise UserError(f"{e}: fix AWS_PROFILE or add the profile to ~/.aws/credentials") from None
    except (bx.ConnectionError, bx.HTTPClientError) as e:  # refused, DNS, timeouts, dropped connections
        raise UserError(f"cannot reach the S3 endpoint {endpoint_url or '(AWS default)'} after {attempts} attempts "
                        f"({type(e).__name__}): check --endpoint-url / AWS_ENDPOINT_URL / S3_ENDPOINT_URL, the "
                        "network, and that the server is running; a re-run resumes") from None
    except bx.ParamValidationError as e:
        raise UserError(f"S3 rejected the request for {where}: {e}; check the bucket name and prefix") from None
    except bx.ClientError as e:
        raise UserError(describe_client_error(e, bucket, where, at, attempts, known.get("key_id", ""))) from None
    except bx.BotoCoreError as e:  # anything else botocore detects before or after a request
        raise UserError(f"S3 client error for {where}{at}: {e}; check the settings in the environment or .env") \
            from None


def list_remote(client, bucket: str, prefix: str) -> dict[str, RemoteObject]:
    """Every object under the prefix (paginated), key -> size and ETag."""
    found = {}
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""):
        for obj in page.get("Contents", []):
            found[obj["Key"]] = RemoteObject(int(obj["Size"]), str(obj.get("ETag", "")).strip('"'))
    return found


def same_content(client, bucket: str, key: str, local: LocalFile, remote: Optional[RemoteObject]) -> bool:
    """Does the object hold exactly this file? Size, then the ETag as MD5, then the md5chksum metadata."""
    if remote is None or remote.size != local.size:
        return False
    if remote.etag.lower() == local.md5.hex():
        return True
    return stored_md5(client, bucket, key) == b64(local.md5)


def stored_md5(client, bucket: str, key: str) -> Optional[str]:
    """The md5chksum metadata of an object, or None (keys compared without case: rclone says 'Md5chksum')."""
    metadata = client.head_object(Bucket=bucket, Key=key).get("Metadata", {})
    return next((v for k, v in metadata.items() if k.lower() == MD5_META_KEY), None)


# ---------------------------------------------------------------------------------------------------------------
# Upload and verify


class _Bar:
    """A tqdm bar in bytes that many threads may advance."""

    def __init__(self, total: int, desc: str):
        from tqdm import tqdm

        self._lock = threading.Lock()
        self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc, dynamic_ncols=True, file=sys.stderr)

    def advance(self, n: int) -> None:
        with self._lock:
            self._bar.update(n)

    def note(self, text: str) -> None:
        with self._lock:
            self._bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()


def push(client, bucket: str, prefix: str, files: list[LocalFile], workers: int, part_size: int,
         dry_run: bool = False) -> Result:
    """Upload what the store lacks: data files first, then every index.json (deepest first)."""
    from boto3.s3.transfer import ProgressCallbackInvoker, TransferConfig, create_transfer_manager

    start = time.perf_counter()
    result = Result()
    remote = list_remote(client, bucket, prefix)
    local_keys = {object_key(prefix, f.rel) for f in files}
    result.extra_objects = sum(1 for k in remote if k not in local_keys)
    indexes = sorted((f for f in files if posixpath.basename(f.rel) == INDEX_NAME),
                     key=lambda f: (-f.rel.count("/"), f.rel))
    data = [f for f in files if posixpath.basename(f.rel) != INDEX_NAME]
    index_deleted: set[str] = set()

    def examine(f: LocalFile) -> tuple[LocalFile, bool]:  # runs on a worker thread: hash, then compare
        f.md5 = file_md5(f.path)
        key = object_key(prefix, f.rel)
        return f, key not in index_deleted and same_content(client, bucket, key, f, remote.get(key))

    def retire_old_indexes(f: LocalFile) -> None:
        """`f` replaces an object: delete every index.json above it that is in the store, before the upload."""
        for index in indexes:
            folder = posixpath.dirname(index.rel)
            key = object_key(prefix, index.rel)
            if (folder == "" or f.rel.startswith(folder + "/")) and key in remote and key not in index_deleted:
                index_deleted.add(key)
                result.replaced_indexes += 1
                if dry_run:
                    bar.note(f"would delete s3://{bucket}/{key} first: {f.rel} replaces a different object")
                    continue
                bar.note(f"deleting s3://{bucket}/{key} first: {f.rel} replaces a different object, and the new "
                         f"{INDEX_NAME} goes up last")
                client.delete_object(Bucket=bucket, Key=key)
                del remote[key]

    transfer_config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                                     max_concurrency=workers, use_threads=True)
    bar = _Bar(sum(f.size for f in files), "checking" if dry_run else "uploading")
    hashers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="md5")
    try:
        with create_transfer_manager(client, transfer_config) as manager:
            for group in (data, indexes):  # every index.json only after every data file is in place
                uploads = []
                checks = [hashers.submit(examine, f) for f in group]
                for done in as_completed(checks):
                    f, unchanged = done.result()
                    key = object_key(prefix, f.rel)
                    if unchanged:
                        result.skipped += 1
                        result.skipped_bytes += f.size
                        bar.advance(f.size)
                        continue
                    if key in remote and group is data:  # an index.json replaces its old self at once
                        retire_old_indexes(f)
                    result.uploaded += 1
                    result.uploaded_bytes += f.size
                    if dry_run:
                        bar.advance(f.size)
                        continue
                    uploads.append(manager.upload(str(f.path), bucket, key,
                                                  extra_args={"Metadata": {MD5_META_KEY: b64(f.md5)}},
                                                  subscribers=[ProgressCallbackInvoker(bar.advance)]))
                for upload in uploads:  # a failure raises here; leaving the manager cancels the rest
                    upload.result()
    finally:
        hashers.shutdown(wait=True, cancel_futures=True)
        bar.close()
    result.seconds = time.perf_counter() - start
    return result


def verify(client, bucket: str, prefix: str, files: list[LocalFile], result: Result) -> None:
    """List the prefix again; every file must be there with its size, and its MD5 where the store gives one."""
    remote = list_remote(client, bucket, prefix)
    problems = []
    for f in files:
        key = object_key(prefix, f.rel)
        obj = remote.get(key)
        if obj is None:
            problems.append(f"{key} is missing")
            continue
        if obj.size != f.size:
            problems.append(f"{key} is {obj.size} bytes, the local file {f.size}")
            continue
        if f.md5 is None:
            f.md5 = file_md5(f.path)
        if obj.etag.lower() == f.md5.hex():
            result.verified_md5 += 1
        else:  # a multipart ETag, or a store whose ETag is no MD5: the MD5 stored at upload
            stored = stored_md5(client, bucket, key)
            if stored == b64(f.md5):
                result.verified_md5 += 1
            elif stored is not None or is_plain_md5(obj.etag):
                problems.append(f"{key} has other content than the local file (MD5 differs)")
                continue
        result.verified += 1
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"verification failed for {len(problems)} of {len(files)} objects under "
                        f"s3://{bucket}/{prefix}: {problems[0]}{more}; re-run the same command to upload them again")


def summary(result: Result, bucket: str, prefix: str, dry_run: bool) -> str:
    where = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    rate = result.uploaded_bytes / MB / max(result.seconds, 1e-9)
    if dry_run:
        return (f"dry run: would upload {result.uploaded} files ({result.uploaded_bytes / MB:.1f} MB) to {where}, "
                f"skip {result.skipped} unchanged ({result.skipped_bytes / MB:.1f} MB)"
                + (f", delete {result.replaced_indexes} old {INDEX_NAME} first" if result.replaced_indexes else "")
                + "; nothing was changed")
    line = (f"uploaded {result.uploaded} files ({result.uploaded_bytes / MB:.1f} MB) in {result.seconds:.1f} s at "
            f"{rate:.1f} MB/s, skipped {result.skipped} unchanged ({result.skipped_bytes / MB:.1f} MB); verified "
            f"{result.verified} objects in {where} ({result.verified_md5} by MD5, the rest by size)")
    if result.extra_objects:
        line += f"; {result.extra_objects} other objects under the prefix left as they are"
    return line


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
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    bucket, prefix = parse_s3_url(args.remote)
    files = collect_files(Path(args.local_dir), args.any_folder)
    load_dotenv_file(".env")  # before the session reads the environment
    endpoint_url = s3_endpoint_url(args.endpoint_url)
    known: dict = {}
    with s3_errors(known, bucket, prefix, endpoint_url):
        client, known["key_id"] = make_client(endpoint_url, args.workers)
        result = push(client, bucket, prefix, files, args.workers, args.part_size_mb << 20, args.dry_run)
        if not args.dry_run:
            verify(client, bucket, prefix, files, result)
    print(summary(result, bucket, prefix, args.dry_run))
    return 0


if __name__ == "__main__":
    run_main(main)
