"""A training run's uploads to S3 (checkpoints, the `latest` pointer, config.json, model.pt, logs) on threads of this
process, instead of Composer's process-based RemoteUploader: `S3Uploads`, `checkpoint_uploads` (docs/robustness.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

from composer.loggers import LoggerDestination

from pilegpt import compat
from pilegpt.checkpoint import SHARDED_CHECKPOINT, SHARDED_COMPLETE
from pilegpt.common import UserError
from pilegpt.s3 import S3Dir, make_client

RERUN = "then re-run with --autoresume=True to continue from the last checkpoint in the bucket"
POLL_S = 1.0  # how often a check for another process's upload asks S3 (Composer: 30 s)


class S3Uploads(LoggerDestination):
    """Uploads to one bucket on `workers` threads; keys are object names in the bucket (as Composer passes them).

    Composer 0.32's checkpoint saver uploads through its own RemoteUploader: a pool of spawned processes that each
    import torch and Composer (~20 s apiece on a small machine), a Manager process, and a poll of S3 every 30 s
    before the `latest` pointer is uploaded; when the endpoint goes away it keeps polling for up to an hour, so a
    run with a lost S3 hangs instead of failing. train.py gives the saver this uploader instead (`checkpoint_uploads`)
    and also registers it as the logger destination that takes every other file, so a run has one uploader:

    - a few threads of this process, storage.py's S3 client (bounded retries and timeouts, one policy for the repo);
    - each file is copied to a staging folder when handed over (the saver may delete or rewrite its own copy), and
      the copy is deleted once uploaded; a checkpoint from the saver's own temporary folder is moved there instead
      (`take_saver_copies`), so an s3:// run keeps no local copy of an uploaded checkpoint, and `shutdown()` removes
      that folder (with what autoresume downloaded into it) and the staging folder, also when the run fails;
    - the Trainer's autoresume lookup reads the bucket through the same client (`remote_backend`);
    - a sharded checkpoint (fsdp=True: a folder of one part per rank and the .metadata that says where every tensor
      lies) is complete in the bucket before any reader can take it for one: each rank uploads its own part, rank 0
      holds the .metadata back until every rank's part is in the bucket (`check_remote_files_exist_async`, which
      the saver awaits before the `latest` pointer), so the order is the parts, the .metadata, then the pointer;
    - the first failed upload fails the run at the next batch with one line (UserError naming the file, the cause
      and the fix); uploads queued after it are skipped, so the process exits within the retry budget;
    - `finish()` returns only when every upload is in the bucket: train.py calls it before it reports "done".

        uploads = S3Uploads("my-bucket")
        with checkpoint_uploads(uploads):
            trainer = Trainer(..., save_folder="s3://my-bucket/runs/x", loggers=[uploads, ...])
        uploads.take_saver_copies(trainer, "runs/x")
        try:
            trainer.fit(); trainer.close(); uploads.finish()
        finally:
            uploads.shutdown()

    Serves two callers with one queue: Composer's logger (`upload_file`, for config.json, model.pt, logs) and
    Composer's CheckpointSaver, through the RemoteUploader interface it calls (`upload_file_async`,
    `check_workers`, `wait`, `wait_and_close`, `check_remote_files_exist_async`, `remote_backend`)."""

    def __init__(self, bucket: str, workers: int = 2):
        self.bucket = bucket
        # credentials are read now, once; a lost connection's message says how to continue a training run
        self.dir = S3Dir(f"s3://{bucket}", make_client(workers=workers), rerun=RERUN)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="s3-upload")
        self._checks = ThreadPoolExecutor(1, thread_name_prefix="s3-check")
        self._staging = tempfile.mkdtemp(prefix="pile-gpt-uploads-")
        self._futures: list[Future] = []  # not yet seen finished by check_workers / wait
        self._by_key: dict[str, Future] = {}  # the latest upload of each key
        self._watchers: list[list[Future]] = []  # lists that receive each upload submitted (watch_uploads)
        self._failed = threading.Event()
        self._closed = False
        self._backend = None
        self._saver_root: Optional[str] = None  # the saver's temporary folder: its files are ours to move
        self._held: dict[str, tuple[str, bool, Future]] = {}  # a sharded checkpoint's .metadata: until its parts are in
        self._held_lock = threading.Lock()  # released by the check's thread or by wait()

    # -- the queue ------------------------------------------------------------------------------------------
    def upload_file_async(self, remote_file_name: str, file_path, overwrite: bool) -> Future:
        key = str(remote_file_name).lstrip("/")
        if self._failed.is_set() or self._closed:  # the run is failing (or exiting): its error is reported once
            future = Future()
            future.set_exception(UploadSkipped(f"s3://{self.bucket}/{key} not uploaded: an earlier upload failed"))
            return future
        staged = os.path.join(self._staging, uuid.uuid4().hex)
        if self._is_saver_copy(file_path):  # the saver never reads its checkpoint again: no copy stays behind
            shutil.move(file_path, staged)
        else:
            shutil.copy2(file_path, staged)  # the file as it is now: the saver rotates checkpoints, logs grow
        if is_sharded_metadata(key):  # uploaded once every rank's part is in the bucket (release_held)
            future = Future()
            with self._held_lock:
                self._held[key] = (staged, overwrite, future)
        else:
            future = self._pool.submit(self._upload, key, staged, overwrite)
        self._futures.append(future)
        self._by_key[key] = future
        for watcher in self._watchers:
            watcher.append(future)
        return future

    def release_held(self, keys: Optional[list[str]] = None) -> None:
        """Upload the held .metadata of these keys (default: every one held): called once the parts it describes
        are in the bucket. Its future, handed out before, completes with the upload."""
        with self._held_lock:
            keys = list(self._held) if keys is None else [k for k in keys if k in self._held]
            released = [(k, *self._held.pop(k)) for k in keys]
        for key, staged, overwrite, future in released:
            upload = self._pool.submit(self._upload, key, staged, overwrite)
            upload.add_done_callback(lambda done, future=future: relay(done, future))

    def watch_uploads(self) -> list[Future]:
        """A list that receives every upload submitted from now on, until unwatch_uploads(it)."""
        self._watchers.append(watcher := [])
        return watcher

    def unwatch_uploads(self, watcher: list[Future]) -> list[Future]:
        """The uploads submitted since watch_uploads() gave `watcher`; it receives no more."""
        self._watchers.remove(watcher)
        return watcher

    def _upload(self, key: str, staged: str, overwrite: bool) -> None:
        url = f"s3://{self.bucket}/{key}"
        try:
            if self._failed.is_set():
                raise UploadSkipped(f"{url} not uploaded: an earlier upload failed")
            with self.dir.errors():
                if not overwrite and self.dir.exists(key):
                    raise UserError("the object already exists: pass --save_overwrite=True to replace the run's "
                                    "files, or choose another --run_name / --save_folder")
                self.dir.upload(staged, key)
        except UploadSkipped:
            raise
        except UserError as e:
            self._failed.set()
            raise UserError(f"uploading {url} failed, training stopped: {e}") from None
        except BaseException:
            self._failed.set()
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(staged)

    def _first_error(self, futures: list[Future]) -> Optional[BaseException]:
        errors = [f.exception() for f in futures if f.exception() is not None]
        real = [e for e in errors if not isinstance(e, UploadSkipped)]
        return (real or errors or [None])[0]

    def check_workers(self) -> None:
        """Raise the first failed upload's error; forget the uploads that finished well. Never blocks."""
        done = [f for f in self._futures if f.done()]
        if (error := self._first_error(done)) is not None:
            raise error
        self._futures = [f for f in self._futures if not f.done()]

    def wait(self) -> None:
        """Block until every upload handed over so far is in the bucket, a held .metadata last; raise the first
        failure."""
        pending, self._futures = self._futures, []
        held = {future for _, _, future in self._held.values()}
        for future in pending:
            if future not in held:
                future.exception()  # waits
        self.release_held()
        for future in held:
            future.exception()
        if (error := self._first_error(pending)) is not None:
            raise error

    def wait_and_close(self) -> None:
        """The saver calls this at the Trainer's close. Nothing happens: the queue stays open for the logs
        uploaded after it, and errors are raised by check_workers, wait and finish, each reported once."""

    def finish(self) -> None:
        """Wait for every upload (raise the first failure), then close: the last call of a run that went well."""
        try:
            self.wait()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Let the uploads handed over finish (a failing run's are skipped), stop the threads, and remove the
        local copies: the staging folder and the saver's temporary folder. Any number of times, also on failure.
        (Not `close`: that is Composer's Callback.close(state, logger), which the Trainer calls at its close.)"""
        self._closed = True
        with self._held_lock:  # a run that stopped before the parts were in: that checkpoint stays incomplete
            held, self._held = self._held, {}
        for key, (_, _, future) in held.items():
            relay_skipped(future, f"s3://{self.bucket}/{key}")
        self._pool.shutdown(wait=True)
        self._checks.shutdown(wait=True)
        shutil.rmtree(self._staging, ignore_errors=True)
        if self._saver_root is not None:
            shutil.rmtree(self._saver_root, ignore_errors=True)

    def take_saver_copies(self, trainer, prefix: str) -> None:
        """The checkpoints the Trainer's CheckpointSaver writes into its temporary folder (for an s3:// save_folder
        with this key prefix) are moved, not copied, when handed over, and the folder is removed by shutdown()."""
        from composer.callbacks import CheckpointSaver

        for callback in trainer.state.callbacks:
            if isinstance(callback, CheckpointSaver):
                self._saver_root = compat.checkpoint_saver_local_root(callback, prefix)

    def _is_saver_copy(self, path) -> bool:
        path = os.path.abspath(path)
        return (self._saver_root is not None and not os.path.islink(path)
                and os.path.commonpath([path, self._saver_root]) == self._saver_root)

    # -- what Composer's CheckpointSaver calls besides ------------------------------------------------------
    def init(self, state=None, logger=None) -> None:
        """Called twice: as a callback (Event.INIT) and by the saver, where Composer's uploader checks the
        credentials by writing an object to the bucket; train.py has listed the save folder already (same
        credentials), so nothing is written."""

    @property
    def remote_backend(self):
        """Composer's object store for this bucket: the Trainer downloads the autoresume checkpoint with it. Its
        requests go through this uploader's client, with s3.py's retries and timeouts like every other request."""
        if self._backend is None:
            self._backend = compat.s3_object_store(self.bucket, self.dir.client)
        return self._backend

    def check_remote_files_exist_async(self, remote_checkpoint_file_names: list[str],
                                       max_wait_time_in_seconds: float = 3600,
                                       wait_before_next_try_in_seconds: float = 30) -> Future:
        """A future that is RemoteFilesExistingCheckStatus.EXIST once these files are in the bucket (the saver
        then uploads the `latest` pointer): our own uploads are awaited, others' are polled every POLL_S."""
        from composer.utils import RemoteFilesExistingCheckStatus as Status

        def check() -> Status:
            try:
                return wait_for(remote_checkpoint_file_names)
            except Exception:  # S3 unreachable: the failed upload's own error is what the run reports
                return Status.ERROR

        def wait_for(names: list[str]) -> Status:
            deadline = time.time() + max_wait_time_in_seconds
            keys = [name.lstrip("/") for name in names]
            parts = [k for k in keys if k not in self._held]
            for key in [*parts, *(k for k in keys if k in self._held)]:  # a .metadata once its parts are in
                if key in self._held:
                    self.release_held([key])
                if (mine := self._by_key.get(key)) is not None:
                    if mine.exception() is not None:
                        return Status.ERROR
                    continue
                while not self.dir.exists(key):
                    if self._failed.is_set() or self._closed:  # (a run that stops waits for no other rank's part)
                        return Status.ERROR
                    if time.time() > deadline:
                        return Status.TIMEOUT
                    time.sleep(min(POLL_S, wait_before_next_try_in_seconds))
            return Status.EXIST

        future = self._checks.submit(check)
        self._futures.append(future)
        return future

    # -- LoggerDestination: files the Trainer and callbacks log (config.json, model.pt, logs) --------------
    def can_upload_files(self) -> bool:
        return True

    def upload_file(self, state, remote_file_name: str, file_path, *, overwrite: bool) -> None:
        self.upload_file_async(remote_file_name, file_path, overwrite)

    def batch_end(self, state, logger) -> None:
        self.check_workers()


class UploadSkipped(UserError):
    """An upload not tried because an earlier one failed (that one's error is the one reported)."""


def is_sharded_metadata(key: str) -> bool:
    """Whether an object key is a sharded checkpoint's .metadata (…/ep0-ba3/.metadata)."""
    *_, folder, name = ["", *key.split("/")]
    return name == SHARDED_COMPLETE and SHARDED_CHECKPOINT.fullmatch(folder) is not None


def relay(done: Future, future: Future) -> None:
    """Complete `future` as `done` completed."""
    if (error := done.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())


def relay_skipped(future: Future, url: str) -> None:
    future.set_exception(UploadSkipped(f"{url} not uploaded: the run stopped before its checkpoint's parts were in"))


@contextlib.contextmanager
def checkpoint_uploads(uploads: S3Uploads):
    """Inside, Composer's CheckpointSaver (built by the Trainer for an s3:// save_folder) takes `uploads` as its
    uploader instead of Composer's process-based RemoteUploader, and the Trainer's autoresume reads a sharded
    checkpoint in the bucket through the same client; this rank's part of a sharded checkpoint has its own name."""
    from composer.utils import dist

    compat.shard_file_name_of_this_rank(dist.get_global_rank())
    with compat.checkpoint_saver_uploads_through(uploads), \
            compat.sharded_autoresume_reads_through(uploads.bucket, uploads.remote_backend):
        yield
