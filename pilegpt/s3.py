"""S3 (or an S3-compatible store: MinIO, R2, Ceph, rclone), one of each thing so that a fault is handled once:
the URL parser, the endpoint setting, the client (one retry and timeout policy), botocore errors as one-line
UserErrors naming the cause and the fix, and `S3Dir`, a prefix as a folder of files. boto3 is imported inside
the functions that need it. Details: docs/mds-and-s3.md."""

from __future__ import annotations

import os
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from pilegpt.common import UserError, atomic_path

MD5_META_KEY = "md5chksum"  # x-amz-meta-md5chksum = base64 MD5 of the whole file (the key rclone uses too)
DEFAULT_WORKERS = 8  # parallel requests (whole small files and parts of big ones)
DEFAULT_MAX_ATTEMPTS = 5  # tries per request (AWS_MAX_ATTEMPTS overrides), exponential backoff between them
CONNECT_TIMEOUT_S = 5  # an unreachable endpoint fails after about attempts x this
READ_TIMEOUT_S = 60
DELETE_BATCH = 1000  # keys per DeleteObjects request (the S3 maximum)
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

    def get(self, name: str) -> Optional[bytes]:
        """The bytes of object `name`, or None when there is none."""
        return self.read(name) if self.exists(name) else None

    def write(self, name: str, data: bytes) -> None:
        """Object `name` := data (S3 objects appear whole or not at all)."""
        with self.errors():
            self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def create(self, name: str, data: bytes) -> bool:
        """Object `name` := data only if there is none; whether this call created it. Not every S3-compatible store
        offers a create-if-absent, so: absent, written, then read back and compared. Two writers within one round
        trip of each other can both read back their own bytes (the residual race lock.py documents)."""
        if self.exists(name):
            return False
        self.write(name, data)
        return self.get(name) == data

    def upload(self, local_path: str | os.PathLike, name: str) -> None:
        """Upload a local file as object `name` (multipart when large)."""
        with self.errors():
            self.client.upload_file(str(local_path), self.bucket, self.key(name))

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

    def sizes(self) -> dict[str, int]:
        """Every object under the prefix -> its size in bytes."""
        return {name: obj.size for name, obj in self.objects().items()}

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


