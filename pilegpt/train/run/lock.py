"""A run holds its save_folder: one `.lock` file (local) or object (s3://) names the run that writes there, so that a
second run into the same folder is refused in one line instead of interleaving its checkpoints with the first one's.

    with hold("runs/x", "x"):   # rank 0, before anything in the folder is read or repaired; released on the way out
How a lock left behind is judged (this machine or another, a heartbeat): `acquire`; docs/robustness.md.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from pilegpt import storage
from pilegpt.common import UserError, pid_alive

LOCK_NAME = ".lock"  # in the save_folder
HEARTBEAT_S = 60.0  # the holder rewrites its heartbeat this often
STALE_AFTER_S = 600.0  # another machine's lock whose heartbeat is older than this, and still, is a dead run's
WATCH_S = 2 * HEARTBEAT_S + 5  # how long another machine's lock is watched for a moving heartbeat
POLL_S = 10.0  # between two reads of a watched lock
MAX_TRIES = 5  # attempts to take a lock that other runs keep taking and releasing


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def machine() -> dict:
    """What tells this machine (as its processes see it) from another: host name, PID namespace, boot."""
    return {"host": platform.node(), "pid_ns": (os.readlink("/proc/self/ns/pid") if os.path.exists("/proc/self/ns/pid")
                                                else None), "boot_id": _read("/proc/sys/kernel/random/boot_id")}


def process_start(pid: int) -> Optional[str]:
    """The start time of process `pid` (clock ticks since boot, /proc), or None where it cannot be read."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rpartition(")")[2].split()[19] if stat else None


def is_alive(record: dict) -> bool:
    """Whether the process a lock record names still runs (a PID reused by another process does not count)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if not pid_alive(pid):
        return False
    start = process_start(pid)
    return start is None or record.get("pid_start") in (None, start)


def holder(record: dict) -> str:
    return (f"run {record.get('run_name')!r} (host {record.get('host')}, PID {record.get('pid')}, since "
            f"{record.get('started')})")


class RunLock:
    """A lock this process holds: its heartbeat thread, and release()."""

    def __init__(self, folder, record: dict):
        self.folder, self.record = folder, record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="save-folder-lock", daemon=True)
        self._thread.start()

    def is_ours(self) -> bool:
        try:
            current = json.loads(self.folder.get(LOCK_NAME) or b"null")
        except (ValueError, UserError):
            return False
        return isinstance(current, dict) and current.get("token") == self.record["token"]

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if not self.is_ours():
                    return  # taken over or deleted by hand: leave it to its new owner
                self.record["heartbeat"] = time.time()
                self.folder.write(LOCK_NAME, encode(self.record))
            except (OSError, UserError):
                pass  # the store is away: the run's own writes will say so

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            if self.is_ours():
                self.folder.delete([LOCK_NAME])
        except (OSError, UserError):
            pass  # a lock left behind is judged stale by the next run


def encode(record: dict) -> bytes:
    return (json.dumps(record, indent=2) + "\n").encode()


def acquire(save_folder: str, run_name: Optional[str], say: Callable[[str], None] = print) -> RunLock:
    """Take save_folder's lock for this process, or raise a one-line UserError naming the run that holds it.

    The lock is created only if absent, through storage.py's `create` (local: O_CREAT|O_EXCL; S3: written, then read
    back and compared, as not every S3-compatible store has a create-if-absent: two runs starting within one round
    trip of each other can both believe they hold it). The holder rewrites its `heartbeat` every HEARTBEAT_S.
    A lock already there is judged by where its holder runs:
    - this machine (the same host name, PID namespace and boot), the process alive (its PID, with the start time
      the lock records): refused at once, naming the holder.
    - this machine, the process gone (kill -9, a crash, a reboot): stale, taken over with a note, so an autoresume
      after a kill works.
    - another machine: watched for WATCH_S (`watch`). A heartbeat that moves is a live run: refused. One that stays
      still and is older than STALE_AFTER_S is a dead run's (a preempted node): taken over with a note. A live run
      is recognised by its heartbeat moving, so clocks that disagree never hand a live run's folder to another.
    - unreadable: refused, naming the file to delete."""
    folder = storage.folder(save_folder)
    where = storage.join(save_folder, LOCK_NAME)
    record = {"run_name": run_name, **machine(), "pid": os.getpid(), "pid_start": process_start(os.getpid()),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "heartbeat": time.time(), "token": uuid.uuid4().hex}
    advice = (f"wait for that run to end or stop it, or pass another --run_name/--save_folder (if that run is gone, "
              f"delete {where})")
    for _ in range(MAX_TRIES):
        if folder.create(LOCK_NAME, encode(record)):
            return RunLock(folder, record)
        found = folder.get(LOCK_NAME)
        if found is None:
            continue  # released between the two requests: try again
        try:
            theirs = json.loads(found)
        except ValueError:
            theirs = None
        if not isinstance(theirs, dict) or "token" not in theirs:
            raise UserError(f"{save_folder} holds a lock that cannot be read ({where}): if no run is writing to the "
                            f"folder, delete {where}")
        if all(theirs.get(k) == v for k, v in machine().items()):
            if is_alive(theirs):
                raise UserError(f"{save_folder} is in use by {holder(theirs)}: two runs must not write one "
                                f"save_folder; {advice}")
            why = f"its process {theirs.get('pid')} is gone"
        else:
            why = watch(folder, theirs, found, save_folder, say, advice)
        if folder.get(LOCK_NAME) == found:  # still the stale one (not taken by another run meanwhile)
            folder.delete([LOCK_NAME])
            say(f"note: took over the lock of {holder(theirs)} on {save_folder}: {why}")
    raise UserError(f"could not take the lock {where} in {MAX_TRIES} tries (other runs keep taking it): {advice}")


def watch(folder, theirs: dict, found: bytes, save_folder: str, say: Callable[[str], None], advice: str) -> str:
    """Another machine's lock: a UserError when its heartbeat moves (a live run), else why it is stale (still for
    WATCH_S and older than STALE_AFTER_S)."""
    say(f"note: {save_folder} is held by {holder(theirs)}, on another machine: watching its heartbeat (a live run "
        f"renews it every {HEARTBEAT_S:.0f} s; one still for {STALE_AFTER_S:.0f} s is a dead run's and is taken over)")
    since = time.monotonic()
    while True:
        time.sleep(POLL_S)
        now = folder.get(LOCK_NAME)
        if now != found:
            if now is None:
                return "it was released"
            raise UserError(f"{save_folder} is in use by {holder(theirs)}, whose heartbeat "
                            f"moved while this run waited: two runs must not write one save_folder; {advice}")
        beat = theirs.get("heartbeat")
        age = time.time() - (beat if isinstance(beat, (int, float)) else 0)
        if time.monotonic() - since >= WATCH_S and age >= STALE_AFTER_S:
            return f"its heartbeat stopped {age:.0f} s ago"


@contextmanager
def hold(save_folder: str, run_name: Optional[str], say: Callable[[str], None] = print) -> Iterator[RunLock]:
    """save_folder's lock for the time of the `with` block (see acquire)."""
    lock = acquire(save_folder, run_name, say)
    try:
        yield lock
    finally:
        lock.release()
