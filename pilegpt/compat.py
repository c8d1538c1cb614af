"""Every use of a library's private parts, in one place: Composer 0.32.1 and mosaicml-streaming 0.13.0. Each entry
says which version it was written against and why the public API does not serve; tests/unit/test_compat.py fails when
an upgrade moves one of them. Composer and Streaming are imported inside the functions (both are slow to import).
Details: docs/extending.md.

Torch: every entry holds on torch 2.7.0 (the pinned stack) and on 2.14.1 with numpy 2.5.5 and Python 3.12 (`make
install-keep-torch`, tested by .ci/keep_torch), and neither needed a shim of its own: Composer 0.32.1's private torch
imports (torch.distributed._tensor, fsdp._flat_param, ...) are all still there, and nothing the repo uses of
Streaming 0.13.0 needs its numpy<2.2 pin. A shim for a later torch belongs here, with a test that fails both when
it stops working and when that torch no longer needs it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

# ----------------------------------------------------------------------------------------------------------
# Composer 0.32.1

def cpu_model_from_proc() -> None:
    """Composer's environment report (the Trainer's start, each checkpoint's metadata) names the CPU with py-cpuinfo,
    which runs a Python subprocess for it: 1.1 s of every process's start, measured here (0.6 s of it CPU). On Linux
    /proc/cpuinfo's "model name" is the same brand string, read at once; elsewhere, or without that line, Composer's
    own call stays. Composer 0.32.1: collect_env.get_cpu_model, looked up by get_composer_env_dict at each call."""
    import functools

    from composer.utils import collect_env

    original = getattr(collect_env.get_cpu_model, "__wrapped_by_pilegpt__", collect_env.get_cpu_model)

    @functools.lru_cache(maxsize=1)
    def get_cpu_model() -> str:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        except OSError:
            names = []
        return names[0] if names and names[0] else original()

    get_cpu_model.__wrapped_by_pilegpt__ = original
    collect_env.get_cpu_model = get_cpu_model



@contextlib.contextmanager
def checkpoint_saver_uploads_through(uploader: Any) -> Iterator[None]:
    """Inside, Composer's CheckpointSaver (built by the Trainer for a remote save_folder) takes `uploader` instead
    of Composer's process-based RemoteUploader.

    Private: composer.callbacks.checkpoint_saver looks the class up by the module-level name `RemoteUploader`
    when the saver is built; the Trainer has no argument for the uploader (pilegpt/train/run/uploads.py says why
    ours is needed).
    """
    from composer.callbacks import checkpoint_saver

    original = checkpoint_saver.RemoteUploader
    checkpoint_saver.RemoteUploader = lambda *args, **kwargs: uploader
    try:
        yield
    finally:
        checkpoint_saver.RemoteUploader = original


def s3_object_store(bucket: str, client: Any) -> Any:
    """Composer's S3ObjectStore for `bucket` that sends its requests through `client` (s3.make_client's).

    Private: S3ObjectStore builds its own boto3 client (adaptive retries, botocore's default attempts) and keeps it
    as the attribute `client`; no argument takes a client. The Trainer downloads the autoresume checkpoint through
    this store, so without it that first lookup would have another retry policy than every other S3 request.
    """
    from composer.utils.object_store import S3ObjectStore

    store = S3ObjectStore(bucket=bucket)
    store.client = client
    return store


def shard_file_name_of_this_rank(rank: int) -> None:
    """Make Composer name this rank's part of a sharded checkpoint `__{rank}_0.distcp`, the name
    torch.distributed.checkpoint gives the file it writes.

    Private: composer.utils.checkpoint computes _TORCH_DISTRIBUTED_CHECKPOINTS_FILENAME once, when it is imported,
    from the RANK variable of that moment. A process that imported Composer before its rank was set (a warm start
    forked from a server, a wrapper that imports train.py first) names every rank's part `__0_0.distcp`: the saver
    of an s3:// run then finds no file of that name in its own folder on the other ranks and stops the run, or would
    upload rank 0's name for another rank's part."""
    from composer.utils import checkpoint

    checkpoint._TORCH_DISTRIBUTED_CHECKPOINTS_FILENAME = f"__{rank}_0.distcp"


@contextlib.contextmanager
def sharded_autoresume_reads_through(bucket: str, store: Any) -> Iterator[None]:
    """Inside, the Trainer reads a sharded checkpoint's `latest` pointer and parts in s3://bucket through `store`
    (s3_object_store's: s3.py's client, retries and timeouts) instead of an S3ObjectStore of its own.

    Private: for a sharded checkpoint (fsdp=True) on S3, Composer's Trainer builds its own store from the URL with
    the module-level name maybe_create_object_store_from_uri, once for the pointer and once for the checkpoint,
    and skips the saver's remote_backend that it uses for a whole checkpoint."""
    from composer.trainer import trainer

    from pilegpt import s3, storage

    original = trainer.maybe_create_object_store_from_uri

    def store_for(uri: str):
        ours = isinstance(uri, str) and storage.is_s3(uri) and s3.parse_s3_url(uri)[0] == bucket
        return store if ours else original(uri)

    trainer.maybe_create_object_store_from_uri = store_for
    try:
        yield
    finally:
        trainer.maybe_create_object_store_from_uri = original


def checkpoint_saver_local_root(saver: Any, prefix: str) -> str | None:
    """The temporary folder in which Composer's CheckpointSaver keeps its local copies for a remote save_folder
    (each checkpoint, the `latest` link, an autoresume download), or None when its folder is not one.

    Private: for a remote folder the saver writes to os.path.join(tempfile.mkdtemp(), PREFIX), kept in its
    attribute `folder`, and never removes it; the Trainer downloads the autoresume checkpoint there too.
    """
    import os
    import tempfile

    folder = os.path.normpath(saver.folder)
    root = folder[: -len(prefix)].rstrip(os.sep) if prefix and folder.endswith(os.sep + prefix.strip("/")) else folder
    if os.path.dirname(root) != os.path.normpath(tempfile.gettempdir()) or not os.path.basename(root).startswith("tmp"):
        return None
    return root


@contextlib.contextmanager
def node_signal_files_per_node() -> Iterator[None]:
    """Inside, the file by which Composer's processes of one node wait for that node's first process (an autoresume
    download, a checkpoint load) has a name of that node's own, so that a multi-node autoresume on a shared
    filesystem (or two nodes on one host) does not crash with FileNotFoundError."""
    # Private: composer.utils.dist.get_node_signal_file_name broadcasts rank 0's name (`._signal_file_node0_...`) to
    # every rank, and the Trainer puts it in a folder whose path is rank 0's. Where the nodes see that folder as one,
    # each node's first process writes and then removes the same file, and the second removal fails. Composer looks
    # the function up on the module at each call, so replacing it there suffices.
    from composer.utils import dist

    original = dist.get_node_signal_file_name
    dist.get_node_signal_file_name = lambda rng=None: f"{original(rng)}_on{dist.get_node_rank()}"
    try:
        yield
    finally:
        dist.get_node_signal_file_name = original


@contextlib.contextmanager
def launcher_processes_seen(seen: dict) -> Iterator[None]:
    """Inside, Composer's launcher fills `seen["first_failures"]`: global rank -> returncode of the ranks that had
    failed when the launcher noticed the first failure, before it sent SIGTERM to the others.

    Private: composer.cli.launcher._monitor_processes(processes) returns at the first failed rank; the launcher
    then SIGTERMs the rest and returns the first non-zero status in rank order, which may be the SIGTERM's echo
    of another rank rather than the failure itself. main() looks the function up on the module at its call.
    """
    from composer.cli import launcher

    original = launcher._monitor_processes

    def monitor(processes: dict) -> None:
        original(processes)
        seen["first_failures"] = {r: p.returncode for r, p in processes.items()
                                  if p.poll() is not None and p.returncode != 0}

    launcher._monitor_processes = monitor
    try:
        yield
    finally:
        launcher._monitor_processes = original


@contextlib.contextmanager
def checkpoint_loads_through(load: Callable[[str, str], Any]) -> Iterator[None]:
    """Inside, every checkpoint Composer's Trainer reads (autoresume, load_path) is read by `load(path,
    map_location)` instead of Composer's full unpickling.

    Private: composer.utils.checkpoint.safe_torch_load calls the module's _torch_load_with_validation(path,
    map_location), which is torch.load(weights_only=False): a pickle in a shared save_folder would run its code on
    resume. The Trainer has no setting for it; the function is looked up on the module at each call.
    """
    from composer.utils import checkpoint

    original = checkpoint._torch_load_with_validation
    checkpoint._torch_load_with_validation = lambda path, map_location: load(str(path), map_location)
    try:
        yield
    finally:
        checkpoint._torch_load_with_validation = original


@contextlib.contextmanager
def sharded_loads_through(load_object: Callable[[Any], Any], load_metadata: Callable[[Any], Any]) -> Iterator[None]:
    """Inside, a sharded checkpoint (fsdp=True) is read with `load_object(stream)` for each of its non-tensor items
    and `load_metadata(stream)` for its .metadata, instead of torch.distributed.checkpoint's full unpickling (its
    tensors it already reads with torch.load(weights_only=True)).

    Private: DefaultLoadPlanner.load_bytes calls torch.load(weights_only=False) and FileSystemReader.read_metadata
    pickle.load, the methods Composer's sharded load goes through (it builds the reader and the planner itself)."""
    from torch.distributed.checkpoint import default_planner, filesystem
    from torch.distributed.checkpoint.metadata import StorageMeta

    def load_bytes(planner, read_item, value):
        item = load_object(value)
        if planner.flatten_state_dict:
            default_planner.set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], item)
        else:
            planner.state_dict[read_item.dest_index.fqn] = item

    def read_metadata(reader):
        with reader.fs.create_stream(reader.fs.concat_path(reader.path, ".metadata"), "rb") as stream:
            metadata = load_metadata(stream)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = reader.load_id
        return metadata

    originals = default_planner.DefaultLoadPlanner.load_bytes, filesystem.FileSystemReader.read_metadata
    default_planner.DefaultLoadPlanner.load_bytes, filesystem.FileSystemReader.read_metadata = load_bytes, read_metadata
    try:
        yield
    finally:
        default_planner.DefaultLoadPlanner.load_bytes, filesystem.FileSystemReader.read_metadata = originals


def activate_ema_weights(algorithm: Any, state: Any) -> None:
    """Swap EMA's averaged weights into the model, as Composer's EMA does itself before a checkpoint.

    Private: EMA._ensure_ema_weights_active; EMA has no public method to do it outside a checkpoint event, and an
    export at the end of a run stopped early (early_stopper) has no checkpoint event.
    """
    algorithm._ensure_ema_weights_active(state)


# ----------------------------------------------------------------------------------------------------------
# mosaicml-streaming 0.13.0


SHARED_MEMORY = Path("/dev/shm")
START_LOCK = "pilegpt-streaming-start.lock"  # in SHARED_MEMORY: one per machine (per /dev/shm), never removed
START_LOCK_WAIT = 60.0  # seconds a local leader waits for the lock before it starts without it
START_LOCK_NOTE_S = 5.0  # a leader still waiting after this long says for whom (as cluster.join's nodes do)
SHM_CLEANUP = "PILEGPT_SHM_CLEANUP"  # "0": never remove stale shared memory; "1": also where it may not be stale
PROC_PID_INIT_INO, PROC_IPC_INIT_INO = 0xEFFFFFFC, 0xEFFFFFFF  # the kernel's initial PID and IPC namespaces


@contextlib.contextmanager
def streaming_start_lock() -> Iterator[None]:
    """Held by a local leader (LOCAL_RANK 0 or unset) around the making of a StreamingDataset, so that two runs
    starting at once on one machine do not take the same shared memory prefix; inside it, the leader first removes
    the blocks a crashed run left (clean_stale_shared_memory).

    Private: Streaming registers a dataset by taking the first prefix with no "{prefix:06}_locals" block
    (streaming.base.shared.prefix.get_shm_prefix); two local leaders that look at once take the same one, and the
    second fails with FileExistsError: '/000000_locals'. The other ranks of a job only attach to their leader's
    block, so they take no lock (and cannot deadlock against it). After START_LOCK_WAIT s (a leader of another
    "node" on this host, in the same collective) the leader starts without the lock."""
    if os.environ.get("LOCAL_RANK", "0") != "0":
        yield
        return
    with _machine_lock(SHARED_MEMORY / START_LOCK, START_LOCK_WAIT):
        clean_stale_shared_memory()
        yield


@contextlib.contextmanager
def _machine_lock(path: Path, wait: float) -> Iterator[None]:
    """An exclusive flock on `path`, waited for at most `wait` s; without it where the file cannot be opened. The
    holder writes its PID, host and start into the file, so that a leader still waiting after START_LOCK_NOTE_S
    says whom it waits for (a holder stopped by SIGSTOP or Ctrl-Z holds it until it goes on or ends)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # no /dev/shm, or not ours to open: start as Streaming alone would
        yield
        return
    try:
        start = time.monotonic()
        noted, locked = False, _try_lock(fd)
        while not locked and time.monotonic() - start < wait:
            if not noted and time.monotonic() - start >= START_LOCK_NOTE_S:
                print(f"waiting for {path} (up to {wait:.0f} s), the lock of Streaming's start-up on this machine: "
                      f"{_lock_holder(fd)}", file=sys.stderr, flush=True)
                noted = True
            time.sleep(0.05)
            locked = _try_lock(fd)
        if locked:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        else:
            print(f"gave up waiting for {path} after {wait:.0f} s ({_lock_holder(fd)}); starting without it",
                  file=sys.stderr, flush=True)
        yield
    finally:
        os.close(fd)  # releases the lock


def _lock_holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it ("PID N on HOST since TIME"), and whether that process is stopped."""
    try:
        pid, host, since = os.pread(fd, 200, 0).decode().split(" ", 2)
        int(pid)
    except (OSError, ValueError):
        return "held by a process that did not say who it is"
    state = ""
    if host == socket.gethostname():
        with contextlib.suppress(OSError, IndexError):
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    stopped = (f"; that process is stopped (SIGSTOP or Ctrl-Z): `kill -CONT {pid}` lets it go on, or end it"
               if state in ("T", "t") else "")
    return f"held by PID {pid} on {host} since {since}{stopped}"


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def clean_stale_shared_memory() -> None:
    """Remove the shared memory blocks that a crashed StreamingDataset left (a stale block naming this run's cache
    folder stops the next run), and only those: a block that a live process holds (another run or a to_mds verify
    on this machine) stays. Linux only (it reads /proc); elsewhere nothing is removed.

    Private: Streaming names its blocks f"{prefix:06}_{name}" (streaming.base.shared.prefix) for the names in
    streaming.base.constant.SHM_TO_CLEAN. Its own clean_stale_shared_memory removes every such block, held or not,
    which breaks every other StreamingDataset running on the machine."""
    from streaming.base.constant import SHM_TO_CLEAN

    folder = SHARED_MEMORY
    if not Path("/proc/self/fd").is_dir() or not folder.is_dir() or not shm_cleanup_wanted():
        return
    pattern = re.compile(r"\d{6}_(?:%s)" % "|".join(map(re.escape, SHM_TO_CLEAN)))
    blocks = {p.name for p in folder.iterdir() if pattern.fullmatch(p.name)}
    unheld = blocks - (shared_memory_in_use(folder) if blocks else set())
    hidden = unheld and os.environ.get(SHM_CLEANUP) != "1" and holders_may_be_hidden()
    if hidden:
        if not _NOTED:
            print(f"note: {len(unheld)} Streaming shared memory block(s) in {folder} that no process in sight holds "
                  f"are left alone: {hidden}, so their holders may be out of sight; {SHM_CLEANUP}=1 removes them "
                  "where no other run uses them", file=sys.stderr, flush=True)
            _NOTED.append(True)
        return
    for name in unheld:
        with contextlib.suppress(FileNotFoundError, PermissionError):  # gone already; another user's (sticky /dev/shm)
            (folder / name).unlink()


_NOTED: list = []  # the note of clean_stale_shared_memory, once a process


def shm_cleanup_wanted() -> bool:
    """PILEGPT_SHM_CLEANUP: unset (or "1") cleans, "0" never removes a block; another value is a UserError."""
    from pilegpt.common import UserError

    value = os.environ.get(SHM_CLEANUP, "").strip()
    if value not in ("", "0", "1"):
        raise UserError(f"{SHM_CLEANUP}={value!r}: set 0 (never remove Streaming's shared memory in /dev/shm), 1 "
                        "(remove the blocks no process in sight holds, even from a PID namespace of its own) or "
                        "unset it (the same, except where their holders may be out of sight)")
    return value != "0"


def holders_may_be_hidden() -> str:
    """Why processes sharing /dev/shm may be out of this one's sight in /proc, or "": it runs in a PID namespace of its
    own (a container) but in the host's IPC namespace (docker --ipc=host, Kubernetes hostIPC), whose /dev/shm the
    host's processes and other containers use. A container with an IPC namespace (and /dev/shm) of its own sees
    every process using it. Unknown (no /proc/self/ns): "", as before namespaces were looked at."""
    try:
        pid_ns, ipc_ns = (os.stat(f"/proc/self/ns/{n}").st_ino for n in ("pid", "ipc"))
    except OSError:
        return ""
    if pid_ns != PROC_PID_INIT_INO and ipc_ns == PROC_IPC_INIT_INO:
        return "this process runs in a PID namespace of its own but shares the host's IPC namespace (--ipc=host)"
    return ""


def shared_memory_in_use(folder: Path) -> set[str]:
    """Names of the files in `folder` (/dev/shm) that some process on this machine has open or mapped (/proc)."""
    held = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):  # ended meanwhile, or not ours to read
                held.update(_paths_held(proc, f"{folder}/"))
    return held


def _paths_held(proc: Path, prefix: str) -> Iterator[str]:
    """The names under `prefix` that the process /proc/PID has open (fd/) or mapped (maps)."""
    for fd in (proc / "fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith(prefix):
                yield target[len(prefix):]
    for line in (proc / "maps").read_text().splitlines():
        at = line.find(prefix)
        if at >= 0:
            yield line[at + len(prefix):].removesuffix(" (deleted)")


def caches_read_elsewhere(caches: list[str]) -> list[str]:
    """Those of `caches` (a StreamingDataset's local folders, about to be made) that a live StreamingDataset of
    another process on this machine reads through: another run on one dataset with one data_local. Call it under
    streaming_start_lock, after its clean-up, on a local leader; Linux only (it reads /proc), elsewhere [].

    Private: Streaming registers each dataset's local folders in a "{prefix:06}_locals" block (int32 size, the
    folders joined by NUL, NUL, the prefix; streaming.base.shared.prefix) and checks a new dataset against them
    itself, but its walk stops at the first free prefix and skips every prefix whose file lock exists in the
    temporary folder, which a dataset makes once it reads a shard: a run that has started reading is never seen.
    This reads every block, and counts one only where a process other than this one (and its DataLoader workers)
    has it open or mapped."""
    folder = SHARED_MEMORY
    if not Path("/proc/self/fd").is_dir() or not folder.is_dir():
        return []
    ours = {os.path.realpath(c) for c in caches}
    found = set()
    for block in folder.glob("[0-9][0-9][0-9][0-9][0-9][0-9]_locals"):
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
            data = block.read_bytes()
            size = int.from_bytes(data[:4], "little")
            theirs = {os.path.realpath(t) for t in data[4:size].decode("utf-8").split("\0")[:-1] if t}
            if ours & theirs and _held_by_another_process(block.name):
                found |= ours & theirs
    return sorted(found)


def _held_by_another_process(name: str) -> bool:
    """Whether a process other than this one and its children has /dev/shm/`name` open or mapped (/proc)."""
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int((proc / "stat").read_text().rpartition(")")[2].split()[1]) == me:
                continue  # a DataLoader worker of this process
            if name in set(_paths_held(proc, f"{SHARED_MEMORY}/")):
                return True
    return False


def mds_writer_checks() -> tuple[Any, Any, Any, Any]:
    """(get_compressions, is_compression, is_hash, bytes_to_int): how MDSWriter validates its settings, to check
    to_mds's flags before any work. Not exported by `streaming`: streaming.base.{compression,hashing,util}."""
    from streaming.base.compression import get_compressions, is_compression
    from streaming.base.hashing import is_hash
    from streaming.base.util import bytes_to_int

    return get_compressions, is_compression, is_hash, bytes_to_int


def mds_samples_per_shard(writer: Any, sample_bytes: int, size_limit: int) -> int:
    """Samples of `sample_bytes` encoded bytes that one MDSWriter shard holds under `size_limit` (0 when one sample
    does not fit). With samples of one size every shard but the last holds this many: pilegpt/mds/write.py writes
    the shards in parallel and must cut them exactly where one writer would."""
    # Private: MDSWriter starts a new shard when the next sample would take the current one past size_limit,
    # counting its bookkeeping bytes (extra_bytes_per_shard, extra_bytes_per_sample: attributes, not documented API).
    return max(0, (size_limit - writer.extra_bytes_per_shard) // (sample_bytes + writer.extra_bytes_per_sample))


def mds_extra_bytes(writer: Any) -> tuple[int, int]:
    """(bytes per shard, bytes per sample) that MDSWriter adds to the encoded samples (see mds_samples_per_shard)."""
    return writer.extra_bytes_per_shard, writer.extra_bytes_per_sample


class KeepStreamingFailure:
    """A mixin for streaming.StreamingDataset that keeps the first failure of its background download threads.

    Private: StreamingDataset.on_exception (the done-callback of every background future) and `_event` (set to
    stop the iterator). Streaming re-raises such a failure as "Background thread failed" with the cause only
    logged; keeping it lets the reader name the cause (a checksum mismatch, a lost connection) in one line.
    """

    failure: BaseException | None = None

    def on_exception(self, future) -> None:
        if future.exception() is not None:
            self.failure = self.failure or future.exception()
            self._event.set()
