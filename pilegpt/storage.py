"""The one place that touches S3 (or an S3-compatible store: MinIO, R2, Ceph, rclone): URLs, the client, errors,
a prefix seen as a folder, and the index-last upload of a dataset folder.

Usage:
    from pilegpt import storage
    bucket, prefix = storage.parse_s3_url("s3://my-bucket/pile/mds")      # ("my-bucket", "pile/mds")
    train = storage.S3Dir("s3://my-bucket/pile/mds/train")                 # a client from make_client()
    if train.exists("index.json"):
        index = json.loads(train.read("index.json"))
    result = storage.upload_folder("mds/", "s3://my-bucket/pile/mds")      # shards, then index.json, verified
    print(storage.summary(result, "s3://my-bucket/pile/mds"))

One of each thing, so that a fault is handled once, everywhere:
- `parse_s3_url`: s3://bucket/prefix -> (bucket, prefix); a malformed URL is a one-line UserError.
- `endpoint_url`: --endpoint-url, else AWS_ENDPOINT_URL, else S3_ENDPOINT_URL (Streaming reads S3_ENDPOINT_URL,
  so one setting serves upload, conversion and training).
- `make_client`: a boto3 S3 client from a fresh session (credentials read now: the environment, `.env` once a
  script loaded it, AWS_PROFILE, ~/.aws, instance roles) with one retry and timeout policy: each request is
  tried AWS_MAX_ATTEMPTS times (default 5) with exponential backoff, connect timeout 5 s, read timeout 60 s.
- `s3_errors`: botocore exceptions become one-line UserErrors naming the cause and the fix (wrong key, wrong
  secret, missing bucket, access denied, other region, unreachable endpoint...); the secret is never shown.
- `S3Dir`: the objects under s3://bucket/prefix as a folder of files: exists (False only on 404), read, names,
  delete, copy_from, download. Every method raises UserError, never a botocore traceback.
- `upload_folder`: upload_s3.py's upload of MDS datasets, also used by to_mds.py --remote:
  1. finds the MDS datasets in the folder (index.json whose listed shards exist; --any-folder skips the check)
     and, inside a dataset folder, takes only what a reader needs: index.json, the shard files it lists in the
     form Streaming reads (`listed_shards`) and to_mds.json; anything else there (e.g. the decompressed
     shard.NNNNN.mds copies a StreamingDataset leaves beside shard.NNNNN.mds.zstd) stays home, and is counted
     in the summary. Hidden files (names starting with '.') are never uploaded;
  2. lists the prefix once and skips a file whose object has the same size and MD5 (the ETag, or the
     x-amz-meta-md5chksum this module stores on every object, the key rclone uses too), so a re-run resumes;
  3. uploads the rest in parallel (multipart above part_size), then every index.json, once every file it lists
     is in place: a reader never sees an index naming a missing shard. Replacing a shard of a dataset already
     in the store deletes that dataset's old index.json first: the dataset is briefly absent, never inconsistent;
  4. lists the prefix again and checks every object's size, and its MD5 where the store gives one.

boto3 is imported inside the functions that need it (it takes a while to import, and train.py imports this).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import posixpath
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Optional

from pilegpt.common import UserError, atomic_path
from pilegpt.data import INDEX_NAME, TO_MDS_META

MD5_META_KEY = "md5chksum"  # x-amz-meta-md5chksum = base64 MD5 of the whole file (the key rclone uses too)
DEFAULT_WORKERS = 8  # parallel requests (whole small files and parts of big ones)
DEFAULT_PART_SIZE_MB = 16  # multipart above this size, in parts of this size (MDS shards are <= 64 MB by default)
MIN_PART_SIZE_MB = 5  # S3 rejects smaller parts (all but the last)
DEFAULT_MAX_ATTEMPTS = 5  # tries per request (AWS_MAX_ATTEMPTS overrides), exponential backoff between them
CONNECT_TIMEOUT_S = 5  # an unreachable endpoint fails after about attempts x this
READ_TIMEOUT_S = 60
DELETE_BATCH = 1000  # keys per DeleteObjects request (the S3 maximum)
HASH_CHUNK = 4 << 20  # bytes read at a time when hashing
MB = 1e6  # MB in the summary (decimal, like the progress bar)
CREDENTIALS_WHERE = "in the environment or .env (or AWS_PROFILE / ~/.aws/credentials)"


# ---------------------------------------------------------------------------------------------------------------
# URLs, endpoint, client, errors


def parse_s3_url(url: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix/' -> ('bucket', 'some/prefix'); the prefix may be empty."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise UserError(f"{url!r} is not an S3 URL: write it as s3://bucket/prefix")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket or any(c.isspace() for c in bucket):
        raise UserError(f"{url!r} has no valid bucket name: write it as s3://bucket/prefix")
    return bucket, prefix.strip("/")


def format_url(bucket: str, prefix: str = "") -> str:
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def join_url(base: str, *parts: str) -> str:
    """s3://b/p + 'train' -> s3://b/p/train; empty parts are skipped."""
    return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts if p and p.strip("/")])


def endpoint_url(explicit: Optional[str] = None) -> Optional[str]:
    """The S3 endpoint for S3-compatible stores: the flag, else AWS_ENDPOINT_URL, else S3_ENDPOINT_URL (None: AWS).

    Streaming reads S3_ENDPOINT_URL, boto3 reads AWS_ENDPOINT_URL; either one serves every stage.
    """
    return explicit or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("S3_ENDPOINT_URL") or None


_resolve_endpoint = endpoint_url  # for make_client and upload_folder, whose parameter of that name hides it


def max_attempts() -> int:
    """Tries per request: AWS_MAX_ATTEMPTS (the variable botocore reads too), else DEFAULT_MAX_ATTEMPTS."""
    value = os.environ.get("AWS_MAX_ATTEMPTS") or str(DEFAULT_MAX_ATTEMPTS)
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"AWS_MAX_ATTEMPTS={value!r} is not a whole number >= 1: fix it in the environment or .env")
    return int(value)


def _no_credentials(cause: str) -> UserError:
    return UserError(f"no usable AWS credentials ({cause}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
                     "environment or in a .env file in the working directory (see .env.example), or AWS_PROFILE / "
                     "~/.aws/credentials")


def make_client(endpoint_url: Optional[str] = None, workers: int = DEFAULT_WORKERS):
    """An S3 client: a fresh boto3 session (so credentials are read now), bounded retries and timeouts, and a
    connection pool for `workers` parallel requests. `endpoint_url` None: AWS_ENDPOINT_URL / S3_ENDPOINT_URL / AWS.

    Raises UserError (never a botocore error) when there are no credentials or the endpoint URL is malformed."""
    import boto3
    from botocore import exceptions as bx
    from botocore.config import Config

    endpoint = _resolve_endpoint(endpoint_url)
    attempts = max_attempts()
    try:
        session = boto3.session.Session()
        credentials = session.get_credentials()
    except bx.ProfileNotFound as e:
        raise UserError(f"{e}: fix AWS_PROFILE or add the profile to ~/.aws/credentials") from None
    except (bx.PartialCredentialsError, bx.NoCredentialsError) as e:
        raise _no_credentials(type(e).__name__) from None
    if credentials is None:
        raise _no_credentials("NoCredentialsError")
    config = Config(
        retries={"total_max_attempts": attempts, "mode": "standard"},  # backoff rand(0, 2^i) s, i = 0, 1, ..
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_pool_connections=max(10, 2 * workers),
    )
    try:
        return session.client("s3", endpoint_url=endpoint, config=config)
    except ValueError as e:  # botocore: "Invalid endpoint: ..."
        raise UserError(f"endpoint URL {endpoint!r} is not valid ({e}): write it like "
                        "http://127.0.0.1:9000 or https://ACCOUNT.r2.cloudflarestorage.com") from None


def shown_endpoint(client) -> Optional[str]:
    """The endpoint a client talks to, for messages; None for AWS's own (messages then say nothing of it)."""
    url = client.meta.endpoint_url
    host = urllib.parse.urlparse(url).hostname or ""
    return None if host == "amazonaws.com" or host.endswith(".amazonaws.com") else url


def access_key_hint() -> str:
    """'****WXYZ' for the access key id the credential chain gives now, '' when none: the secret is never shown."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        credentials = boto3.session.Session().get_credentials()
    except BotoCoreError:
        return ""
    key_id = (credentials.access_key if credentials is not None else "") or ""
    return f"****{key_id[-4:]}" if key_id else ""


def describe_client_error(err, bucket: str, where: str, at: str, attempts: int, key_id: str = "") -> str:
    """One line naming the cause and the fix for an S3 error response (a botocore ClientError)."""
    error = err.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    op = getattr(err, "operation_name", "request")
    key = f" {key_id}" if key_id else ""
    if code in ("InvalidAccessKeyId", "InvalidClientTokenId"):
        return (f"wrong credentials: the store{at} does not know the access key id{key}; check AWS_ACCESS_KEY_ID "
                f"{CREDENTIALS_WHERE}")
    if code == "SignatureDoesNotMatch":
        return (f"wrong credentials: the store{at} rejected the request signature, so the secret key does not "
                f"match the access key id{key}; check AWS_SECRET_ACCESS_KEY {CREDENTIALS_WHERE}")
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
                f"{CREDENTIALS_WHERE}")
    if code in ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout") or (status or 0) >= 500:
        return (f"the store{at} kept failing {op} on {where} ({code or status}) after {attempts} attempts: try "
                "again later (a re-run resumes), or lower --workers")
    message = error.get("Message") or ""
    return f"S3 {op} on {where} failed{at}: {code or status} {message}".rstrip() + "; check the URL and permissions"


@contextmanager
def s3_errors(url: str, endpoint_url: Optional[str] = None, rerun: str = "a re-run resumes") -> Iterator[None]:
    """Turn botocore exceptions raised inside into one-line UserErrors naming the cause and the fix.

    `url` (s3://bucket/prefix) and `endpoint_url` (None: AWS) only shape the messages; `rerun` ends the message
    for a lost connection (how the caller's work continues)."""
    from botocore import exceptions as bx

    bucket, prefix = parse_s3_url(url)
    where = format_url(bucket, prefix)
    at = f" at {endpoint_url}" if endpoint_url else ""
    attempts = max_attempts()
    try:
        yield
    except (bx.NoCredentialsError, bx.PartialCredentialsError) as e:
        raise _no_credentials(type(e).__name__) from None
    except bx.ProfileNotFound as e:
        raise UserError(f"{e}: fix AWS_PROFILE or add the profile to ~/.aws/credentials") from None
    except (bx.ConnectionError, bx.HTTPClientError) as e:  # refused, DNS, timeouts, dropped connections
        raise UserError(f"cannot reach the S3 endpoint {endpoint_url or '(AWS default)'} after {attempts} attempts "
                        f"({type(e).__name__}): check --endpoint-url / AWS_ENDPOINT_URL / S3_ENDPOINT_URL, the "
                        f"network, and that the server is running; {rerun}") from None
    except bx.ParamValidationError as e:
        raise UserError(f"S3 rejected the request for {where}: {e}; check the bucket name and prefix") from None
    except bx.ClientError as e:
        raise UserError(describe_client_error(e, bucket, where, at, attempts, access_key_hint())) from None
    except bx.BotoCoreError as e:  # anything else botocore detects before or after a request
        raise UserError(f"S3 client error for {where}{at}: {e}; check the settings in the environment or .env") \
            from None


def connection_failure(e: Optional[BaseException]) -> Optional[BaseException]:
    """The S3/network failure (botocore, urllib3, ConnectionError) behind `e`, following its causes, or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if type(e).__module__.startswith(("botocore", "urllib3")) or isinstance(e, ConnectionError):
            return e
        e = e.__cause__ or e.__context__
    return None


def lost_connection(e: BaseException, doing: str) -> Optional[str]:
    """One line for a lost S3/network connection behind `e` while `doing` (e.g. "while reading s3://..."), naming
    how a training run continues, or None when the failure is something else."""
    lost = connection_failure(e)
    if lost is None:
        return None
    return (f"lost the connection {doing} ({type(lost).__name__}: {lost}); check the endpoint and the network, "
            "then run the same command with --autoresume=True to continue from the last checkpoint")


def is_botocore_error(e: BaseException) -> bool:
    from botocore import exceptions as bx

    return isinstance(e, (bx.BotoCoreError, bx.ClientError))


# ---------------------------------------------------------------------------------------------------------------
# A prefix as a folder


@dataclass
class RemoteObject:
    size: int  # bytes
    etag: str  # without the quotes; an MD5 in hex for single-part uploads on most stores


class S3Dir:
    """The objects under s3://bucket/prefix, seen as a folder of files named relative to the prefix.

    The client is made by make_client() on first use unless one is given. Every method raises UserError (cause
    and fix in one line) for credential, endpoint and permission problems.
    """

    def __init__(self, url: str, client=None, rerun: str = "a re-run resumes"):
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = format_url(self.bucket, self.prefix)
        self._client = client
        self.rerun = rerun  # how the caller's work continues, for a lost connection (s3_errors)

    def __repr__(self) -> str:
        return f"S3Dir({self.url!r})"

    @property
    def client(self):
        if self._client is None:
            self._client = make_client()
        return self._client

    def key(self, name: str) -> str:
        """The object key of file `name` (relative to the prefix)."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def child(self, sub: str) -> "S3Dir":
        """The folder `sub` below this one, on the same client."""
        return S3Dir(join_url(self.url, sub), self._client, self.rerun) if sub else self

    def errors(self):
        """s3_errors for this folder: botocore exceptions inside become one-line UserErrors."""
        return s3_errors(self.url, shown_endpoint(self.client), self.rerun)

    def check(self) -> None:
        """UserError unless the bucket exists and the prefix can be listed with these credentials (one request)."""
        with self.errors():
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.key(""), MaxKeys=1)

    def exists(self, name: str) -> bool:
        """Whether object `name` exists: False only when the store answers 404 (a missing bucket answers so too)."""
        from botocore.exceptions import ClientError

        with self.errors():
            try:
                self.client.head_object(Bucket=self.bucket, Key=self.key(name))
                return True
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise

    def read(self, name: str) -> bytes:
        with self.errors():
            return self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()

    def objects(self) -> dict[str, RemoteObject]:
        """Every object under the prefix (paginated): name relative to the prefix -> size and ETag."""
        start = self.key("")
        found = {}
        with self.errors():
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start):
                for obj in page.get("Contents", []):
                    found[obj["Key"][len(start):]] = RemoteObject(int(obj["Size"]), str(obj.get("ETag", "")).strip('"'))
        return found

    def names(self) -> list[str]:
        """Every object under the prefix, as names relative to it (sub/folders included), sorted."""
        return sorted(self.objects())

    def stored_md5(self, name: str) -> Optional[str]:
        """The md5chksum metadata of an object, or None (keys compared without case: rclone says 'Md5chksum')."""
        with self.errors():
            metadata = self.client.head_object(Bucket=self.bucket, Key=self.key(name)).get("Metadata", {})
        return next((v for k, v in metadata.items() if k.lower() == MD5_META_KEY), None)

    def delete(self, names: Iterable[str]) -> None:
        """Delete these objects (missing ones are fine): one DeleteObject, or DeleteObjects of DELETE_BATCH each."""
        names = list(names)
        with self.errors():
            if len(names) == 1:
                self.client.delete_object(Bucket=self.bucket, Key=self.key(names[0]))
                return
            for i in range(0, len(names), DELETE_BATCH):
                objects = [{"Key": self.key(n)} for n in names[i:i + DELETE_BATCH]]
                response = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
                failed = response.get("Errors") or []
                if failed:
                    first = failed[0]
                    raise UserError(f"could not delete {len(failed)} objects under {self.url}, e.g. {first.get('Key')} "
                                    f"({first.get('Code')}: {first.get('Message')}); check s3:DeleteObject "
                                    "permissions")

    def copy_from(self, other: "S3Dir", name: str) -> None:
        """Copy object `name` of `other` to `name` here, server-side (its metadata comes along)."""
        with self.errors():
            self.client.copy_object(Bucket=self.bucket, Key=self.key(name),
                                    CopySource={"Bucket": other.bucket, "Key": other.key(name)})

    def download(self, name: str, local_path: str | os.PathLike) -> None:
        """Download object `name` to `local_path` (its folder made if missing), through a temporary name: a
        failed or killed download leaves no partial file under `local_path`."""
        Path(local_path).parent.mkdir(parents=True, exist_ok=True)
        with self.errors(), atomic_path(local_path) as tmp:
            self.client.download_file(self.bucket, self.key(name), tmp)


# ---------------------------------------------------------------------------------------------------------------
# Upload of a dataset folder: which files, is it an MDS dataset


@dataclass
class LocalFile:
    rel: str  # POSIX path relative to the local folder; the object name below the prefix
    path: Path
    size: int  # bytes
    md5: Optional[bytes] = None  # raw digest, filled in just before the file is compared or uploaded


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
    extra_objects: int = 0  # objects under the prefix that the local folder does not have (left alone)
    unlisted: list[str] = field(default_factory=list)  # files in dataset folders no index.json lists: not uploaded


class Collected(NamedTuple):
    """What collect_files found: the files to upload, and those it leaves home."""
    files: list[LocalFile]  # to upload, sorted
    unlisted: list[LocalFile]  # inside an MDS dataset folder but not listed by its index.json (nor a side file)


class ListedShard(NamedTuple):
    """A shard file of an MDS index, in the form Streaming reads it."""
    name: str  # path relative to the index's folder: zip_data's basename when the index lists one, else raw_data's
    size: Optional[int]  # bytes, as the index gives them (None when it does not)


def collect_files(root: Path, any_folder: bool = False) -> Collected:
    """The non-hidden files under `root` to upload, sorted, and the ones left home.

    Unless `any_folder`, `root` must hold MDS datasets (a folder with an index.json, or a folder of them), and a
    dataset folder contributes only its index.json, the shard files the index lists (`listed_shards`) and
    to_mds.json: a dataset goes up exactly as to_mds wrote it, whatever a reader left beside it."""
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
    if any_folder:
        return Collected(files, [])
    indexes = [f for f in files if posixpath.basename(f.rel) == INDEX_NAME]
    if not indexes:
        raise UserError(f"{root} is not an MDS dataset: no {INDEX_NAME} in it or its subfolders; pass the "
                        "output folder of to_mds.py, or --any-folder to upload any folder as it is")
    by_rel = {f.rel: f for f in files}
    listed = set()
    for index in indexes:
        listed |= check_mds_index(root, index, by_rel)
    dataset_dirs = {posixpath.dirname(index.rel) for index in indexes}

    def in_dataset(rel: str) -> bool:
        folder = posixpath.dirname(rel)
        return any(d == "" or folder == d or folder.startswith(d + "/") for d in dataset_dirs)

    upload, unlisted = [], []
    for f in files:
        if f.rel in listed or (posixpath.basename(f.rel) == TO_MDS_META and posixpath.dirname(f.rel) in dataset_dirs):
            upload.append(f)
        elif in_dataset(f.rel):
            unlisted.append(f)
        elif posixpath.dirname(f.rel) == "":  # a side file beside the datasets (e.g. notes on how they were made)
            upload.append(f)
        else:  # a stray folder means the folder is probably wrong (a parent folder that happens to hold a dataset)
            raise UserError(f"{f.path} is not part of an MDS dataset in {root} (no {INDEX_NAME} lists it or "
                            "lies beside it): point LOCAL_DIR at the datasets' folder, move the file away, or "
                            "pass --any-folder to upload everything")
    return Collected(upload, unlisted)


def listed_shards(text: str | bytes, where: str | os.PathLike, hint: str) -> list[ListedShard]:
    """The shard files an MDS index.json (its text) lists, in order, as Streaming reads them: a shard's zip_data
    when the index lists one (the compressed file), else its raw_data. A UserError naming `where` and `hint`
    when the text is not an MDS index."""
    try:
        shards = json.loads(text).get("shards")
    except (ValueError, AttributeError) as e:
        raise UserError(f"{where} is not a readable MDS index ({e}); {hint}") from None
    if not isinstance(shards, list) or not shards:
        raise UserError(f"{where} lists no shards, so it is not an MDS index; {hint}")
    found = []
    for shard in shards:
        entry = {}
        for kind in ("raw_data", "zip_data"):
            info = shard.get(kind) if isinstance(shard, dict) else None
            if isinstance(info, dict) and isinstance(info.get("basename"), str):
                size = info.get("bytes")
                entry[kind] = ListedShard(info["basename"], size if isinstance(size, int) else None)
        if "raw_data" not in entry:
            raise UserError(f"{where} has a shard entry without raw_data, so it is not an MDS index; {hint}")
        found.append(entry.get("zip_data", entry["raw_data"]))
    return found


def check_mds_index(root: Path, index: LocalFile, by_rel: dict[str, LocalFile]) -> set[str]:
    """Raise UserError unless every shard that `index` lists is here, in the form Streaming reads, with its size.

    Returns the relative paths of the index and of those shard files."""
    hint = "re-run to_mds.py to rewrite the dataset, or pass --any-folder to upload the folder as it is"
    try:
        text = index.path.read_text()
    except OSError as e:
        raise UserError(f"{index.path} is not a readable MDS index ({e}); {hint}") from None
    folder = posixpath.dirname(index.rel)
    present = {index.rel}
    for shard in listed_shards(text, index.path, hint):
        rel = posixpath.normpath(posixpath.join(folder, shard.name))
        if rel not in by_rel:
            raise UserError(f"{index.path} lists shard {rel!r}, which is missing from {root}: the dataset is "
                            f"incomplete; {hint}")
        if shard.size is not None and by_rel[rel].size != shard.size:
            raise UserError(f"{by_rel[rel].path} is {by_rel[rel].size} bytes but {index.path} says {shard.size}: "
                            f"the shard is damaged or from another run; {hint}")
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


def same_content(target: S3Dir, local: LocalFile, remote: Optional[RemoteObject]) -> bool:
    """Does the object hold exactly this file? Size, then the ETag as MD5, then the md5chksum metadata."""
    if remote is None or remote.size != local.size:
        return False
    if remote.etag.lower() == local.md5.hex():
        return True
    return target.stored_md5(local.rel) == b64(local.md5)


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


def push(target: S3Dir, files: list[LocalFile], workers: int, part_size: int, dry_run: bool = False) -> Result:
    """Upload what the store lacks: data files first, then every index.json (deepest first)."""
    from boto3.s3.transfer import ProgressCallbackInvoker, TransferConfig, create_transfer_manager

    start = time.perf_counter()
    result = Result()
    remote = target.objects()
    local_names = {f.rel for f in files}
    result.extra_objects = sum(1 for name in remote if name not in local_names)
    indexes = sorted((f for f in files if posixpath.basename(f.rel) == INDEX_NAME),
                     key=lambda f: (-f.rel.count("/"), f.rel))
    data = [f for f in files if posixpath.basename(f.rel) != INDEX_NAME]
    index_deleted: set[str] = set()

    def examine(f: LocalFile) -> tuple[LocalFile, bool]:  # runs on a worker thread: hash, then compare
        f.md5 = file_md5(f.path)
        return f, f.rel not in index_deleted and same_content(target, f, remote.get(f.rel))

    def retire_old_indexes(f: LocalFile) -> None:
        """`f` replaces an object: delete every index.json above it that is in the store, before the upload."""
        for index in indexes:
            folder = posixpath.dirname(index.rel)
            if (folder == "" or f.rel.startswith(folder + "/")) and index.rel in remote \
                    and index.rel not in index_deleted:
                index_deleted.add(index.rel)
                result.replaced_indexes += 1
                if dry_run:
                    bar.note(f"would delete {target.url}/{index.rel} first: {f.rel} replaces a different object")
                    continue
                bar.note(f"deleting {target.url}/{index.rel} first: {f.rel} replaces a different object, and the "
                         f"new {INDEX_NAME} goes up last")
                target.delete([index.rel])
                del remote[index.rel]

    transfer_config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                                     max_concurrency=workers, use_threads=True)
    bar = _Bar(sum(f.size for f in files), "checking" if dry_run else "uploading")
    hashers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="md5")
    try:
        with create_transfer_manager(target.client, transfer_config) as manager:
            for group in (data, indexes):  # every index.json only after every data file is in place
                uploads = []
                checks = [hashers.submit(examine, f) for f in group]
                for done in as_completed(checks):
                    f, unchanged = done.result()
                    if unchanged:
                        result.skipped += 1
                        result.skipped_bytes += f.size
                        bar.advance(f.size)
                        continue
                    if f.rel in remote and group is data:  # an index.json replaces its old self at once
                        retire_old_indexes(f)
                    result.uploaded += 1
                    result.uploaded_bytes += f.size
                    if dry_run:
                        bar.advance(f.size)
                        continue
                    uploads.append((f, manager.upload(str(f.path), target.bucket, target.key(f.rel),
                                                      extra_args={"Metadata": {MD5_META_KEY: b64(f.md5)}},
                                                      subscribers=[ProgressCallbackInvoker(bar.advance)])))
                for f, upload in uploads:  # a failure raises here; leaving the manager cancels the rest
                    try:
                        upload.result()
                    except Exception as e:
                        if is_botocore_error(e):
                            raise  # s3_errors names the cause and the fix
                        dataset = target.child(posixpath.dirname(f.rel))
                        raise UserError(f"uploading to {dataset.url} failed ({type(e).__name__}: {e})") from None
    finally:
        hashers.shutdown(wait=True, cancel_futures=True)
        bar.close()
    result.seconds = time.perf_counter() - start
    return result


def verify(target: S3Dir, files: list[LocalFile], result: Result) -> None:
    """List the prefix again; every file must be there with its size, and its MD5 where the store gives one."""
    remote = target.objects()
    problems = []
    for f in files:
        key = target.key(f.rel)
        obj = remote.get(f.rel)
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
            stored = target.stored_md5(f.rel)
            if stored == b64(f.md5):
                result.verified_md5 += 1
            elif stored is not None or is_plain_md5(obj.etag):
                problems.append(f"{key} has other content than the local file (MD5 differs)")
                continue
        result.verified += 1
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"verification failed for {len(problems)} of {len(files)} objects under {target.url}: "
                        f"{problems[0]}{more}; re-run the same command to upload them again")


def upload_folder(local_dir: str | os.PathLike, url: str, workers: int = DEFAULT_WORKERS,
                  part_size: int = DEFAULT_PART_SIZE_MB << 20, dry_run: bool = False, any_folder: bool = False,
                  endpoint_url: Optional[str] = None, client=None) -> Result:
    """Upload the MDS dataset(s) in `local_dir` to `url` (local_dir/x -> url/x): what the store lacks, every
    index.json last, then verify (unless `dry_run`). The folder is checked before any request; without `client`,
    one is made with make_client(endpoint_url, workers)."""
    parse_s3_url(url)
    files, unlisted = collect_files(Path(local_dir), any_folder)
    target = S3Dir(url, client if client is not None else make_client(endpoint_url, workers))
    with target.errors():
        result = push(target, files, workers, part_size, dry_run)
        if not dry_run:
            verify(target, files, result)
    result.unlisted = [f.rel for f in unlisted]
    return result


def summary(result: Result, url: str, dry_run: bool = False) -> str:
    """The one-line report of an upload_folder run."""
    where = format_url(*parse_s3_url(url))
    rate = result.uploaded_bytes / MB / max(result.seconds, 1e-9)
    unlisted = ""
    if result.unlisted:
        unlisted = (f"; {'would skip' if dry_run else 'skipped'} {len(result.unlisted)} files {INDEX_NAME} does "
                    f"not list (e.g. {result.unlisted[0]})")
    if dry_run:
        return (f"dry run: would upload {result.uploaded} files ({result.uploaded_bytes / MB:.1f} MB) to {where}, "
                f"skip {result.skipped} unchanged ({result.skipped_bytes / MB:.1f} MB)"
                + (f", delete {result.replaced_indexes} old {INDEX_NAME} first" if result.replaced_indexes else "")
                + unlisted + "; nothing was changed")
    line = (f"uploaded {result.uploaded} files ({result.uploaded_bytes / MB:.1f} MB) in {result.seconds:.1f} s at "
            f"{rate:.1f} MB/s, skipped {result.skipped} unchanged ({result.skipped_bytes / MB:.1f} MB); verified "
            f"{result.verified} objects in {where} ({result.verified_md5} by MD5, the rest by size)")
    if result.extra_objects:
        line += f"; {result.extra_objects} other objects under the prefix left as they are"
    return line + unlisted
