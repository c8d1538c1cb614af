"""The upload of MDS datasets to S3 (upload_s3.py's, also used by to_mds.py --remote): only the files a reader
needs, what the store lacks (same size and MD5 is skipped, so a re-run resumes), in parallel, every index.json
after every file it lists, then every object checked again. Details: docs/mds-and-s3.md."""

from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional

from pilegpt import s3
from pilegpt.common import UserError
from pilegpt.data import INDEX_NAME, TO_MDS_META, check_shards_present
from pilegpt.s3 import (
    DEFAULT_WORKERS,
    MD5_META_KEY,
    RemoteObject,
    S3Dir,
    format_url,
    is_botocore_error,
    parse_s3_url,
)

DEFAULT_PART_SIZE_MB = 16  # multipart above this size, in parts of this size (MDS shards are <= 64 MB by default)
MIN_PART_SIZE_MB = 5  # S3 rejects smaller parts (all but the last)
HASH_CHUNK = 4 << 20  # bytes read at a time when hashing
MB = 1e6  # MB in the summary (decimal, like the progress bar)

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


def check_mds_index(root: Path, index: LocalFile, by_rel: dict[str, LocalFile]) -> set[str]:
    """Raise UserError unless every shard that `index` lists is here, in the form Streaming reads, with its size.

    Returns the relative paths of the index and of those shard files."""
    hint = "re-run to_mds.py to rewrite the dataset, or pass --any-folder to upload the folder as it is"
    try:
        text = index.path.read_text()
    except OSError as e:
        raise UserError(f"{index.path} is not a readable MDS index ({e}); {hint}") from None
    folder = posixpath.dirname(index.rel)
    inside = {rel[len(folder) + 1:] if folder else rel: f.size for rel, f in by_rel.items()
              if not folder or rel.startswith(folder + "/")}
    shards = check_shards_present(text, inside, lambda name: str(index.path.parent / name), hint)
    return {index.rel} | {posixpath.join(folder, shard.name) for shard in shards}


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


@dataclass
class _Push:
    """What one push() knows and changes as it goes: the store's listing (less the indexes it deletes), the
    index.json files of the upload (deepest first) and the tally. examine() runs on worker threads."""
    target: S3Dir
    remote: dict[str, RemoteObject]
    indexes: list[LocalFile]
    dry_run: bool
    result: Result = field(default_factory=Result)
    index_deleted: set[str] = field(default_factory=set)

    def examine(self, f: LocalFile) -> tuple[LocalFile, bool]:
        """Hash `f`; is the object in the store already exactly this file?"""
        f.md5 = file_md5(f.path)
        return f, f.rel not in self.index_deleted and same_content(self.target, f, self.remote.get(f.rel))

    def retire_old_indexes(self, f: LocalFile, bar: _Bar) -> None:
        """`f` replaces an object: delete every index.json above it that is in the store, before the upload (the
        dataset is briefly absent, never an index naming shards of another dataset)."""
        for index in self.indexes:
            folder = posixpath.dirname(index.rel)
            if (folder == "" or f.rel.startswith(folder + "/")) and index.rel in self.remote \
                    and index.rel not in self.index_deleted:
                self.index_deleted.add(index.rel)
                self.result.replaced_indexes += 1
                if self.dry_run:
                    bar.note(f"would delete {self.target.url}/{index.rel} first: {f.rel} replaces a different "
                             "object")
                    continue
                bar.note(f"deleting {self.target.url}/{index.rel} first: {f.rel} replaces a different object, and "
                         f"the new {INDEX_NAME} goes up last")
                self.target.delete([index.rel])
                del self.remote[index.rel]


def push(target: S3Dir, files: list[LocalFile], workers: int, part_size: int, dry_run: bool = False) -> Result:
    """Upload what the store lacks: data files first, then every index.json (deepest first)."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    start = time.perf_counter()
    remote = target.objects()
    indexes = sorted((f for f in files if posixpath.basename(f.rel) == INDEX_NAME),
                     key=lambda f: (-f.rel.count("/"), f.rel))
    data = [f for f in files if posixpath.basename(f.rel) != INDEX_NAME]
    state = _Push(target, remote, indexes, dry_run)
    local_names = {f.rel for f in files}
    state.result.extra_objects = sum(1 for name in remote if name not in local_names)
    transfer_config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                                     max_concurrency=workers, use_threads=True)
    bar = _Bar(sum(f.size for f in files), "checking" if dry_run else "uploading")
    hashers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="md5")
    try:
        with create_transfer_manager(target.client, transfer_config) as manager:
            for group in (data, indexes):  # every index.json only after every data file is in place
                uploads = _start_uploads(state, group, group is data, hashers, manager, bar)
                _wait_for(uploads, target)
    finally:
        hashers.shutdown(wait=True, cancel_futures=True)
        bar.close()
    state.result.seconds = time.perf_counter() - start
    return state.result


def _start_uploads(state: _Push, group: list[LocalFile], are_data: bool, hashers: ThreadPoolExecutor, manager,
                   bar: _Bar) -> list:
    """Hash and compare the files of `group` on the hashers; start an upload of each that the store lacks (none in
    a dry run). Returns the (file, transfer future) pairs started."""
    from boto3.s3.transfer import ProgressCallbackInvoker

    result, target = state.result, state.target
    uploads = []
    for done in as_completed([hashers.submit(state.examine, f) for f in group]):
        f, unchanged = done.result()
        if unchanged:
            result.skipped += 1
            result.skipped_bytes += f.size
            bar.advance(f.size)
            continue
        if f.rel in state.remote and are_data:  # an index.json replaces its old self at once
            state.retire_old_indexes(f, bar)
        result.uploaded += 1
        result.uploaded_bytes += f.size
        if state.dry_run:
            bar.advance(f.size)
            continue
        uploads.append((f, manager.upload(str(f.path), target.bucket, target.key(f.rel),
                                          extra_args={"Metadata": {MD5_META_KEY: b64(f.md5)}},
                                          subscribers=[ProgressCallbackInvoker(bar.advance)])))
    return uploads


def _wait_for(uploads: list, target: S3Dir) -> None:
    """Wait for every upload; a failure raises here (leaving the transfer manager then cancels the rest)."""
    for f, upload in uploads:
        try:
            upload.result()
        except Exception as e:
            if is_botocore_error(e):
                raise  # s3_errors names the cause and the fix
            dataset = target.child(posixpath.dirname(f.rel))
            raise UserError(f"uploading to {dataset.url} failed ({type(e).__name__}: {e})") from None


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
    target = S3Dir(url, client if client is not None else s3.make_client(endpoint_url, workers))
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

