"""pilegpt/train/run/lock.py: a run holds its save_folder; a second run is refused naming the holder, a dead run's lock
is taken over (this machine: its process is gone; another machine: its heartbeat stood still). An s3://
save_folder: tests/e2e/test_lock.py."""

import json
import subprocess
import sys
import threading
import time

import pytest

from pilegpt import storage
from pilegpt.common import UserError
from pilegpt.train.run import lock


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def place(folder: str, **changes) -> dict:
    """A lock as another run would have left it (this machine and a live process unless `changes` say otherwise)."""
    record = {"run_name": "first", **lock.machine(), "pid": 1, "pid_start": lock.process_start(1),
              "started": "2026-01-01 00:00:00 +0000", "heartbeat": time.time(), "token": "theirs", **changes}
    storage.folder(folder).write(lock.LOCK_NAME, lock.encode(record))
    return record


def test_a_second_holder_is_refused_naming_the_first_and_release_frees_the_folder(tmp_path):
    with lock.hold(str(tmp_path / "run"), "first") as held:
        record = json.loads((tmp_path / "run" / ".lock").read_text())
        assert record["run_name"] == "first" and record["pid"] == held.record["pid"]
        with pytest.raises(UserError, match=rf"^{tmp_path / 'run'} is in use by run 'first' \(host \S+, PID "
                                            rf"{record['pid']}, since [^)]+\): two runs must not write one "
                                            r"save_folder; .*if that run is gone, delete \S+/run/.lock\)$"):
            lock.acquire(str(tmp_path / "run"), "second")
    assert not (tmp_path / "run" / ".lock").exists()
    with lock.hold(str(tmp_path / "run"), "second"):
        assert json.loads((tmp_path / "run" / ".lock").read_text())["run_name"] == "second"


@pytest.mark.parametrize("changes, why", [
    ({"pid": None}, "is gone"),  # set to a dead PID below
    ({"pid_start": "0"}, "is gone"),  # PID 1 alive, but another process than the one that took the lock
    ({"boot_id": "an earlier boot"}, None),  # this host before a reboot: another machine, its heartbeat old below
])
def test_the_lock_of_a_gone_process_is_taken_over_with_a_note(tmp_path, monkeypatch, changes, why):
    changes = {"pid": dead_pid()} if changes == {"pid": None} else changes
    if why is None:
        monkeypatch.setattr(lock, "POLL_S", 0.01)
        monkeypatch.setattr(lock, "WATCH_S", 0.05)
        changes["heartbeat"] = time.time() - lock.STALE_AFTER_S - 1
    theirs = place(str(tmp_path), **changes)
    notes = []
    with lock.hold(str(tmp_path), "second", say=notes.append):
        assert json.loads((tmp_path / ".lock").read_text())["run_name"] == "second"
    assert notes[-1].startswith(f"note: took over the lock of run 'first' (host {theirs['host']}, PID {theirs['pid']}")
    assert (why or "its heartbeat stopped") in notes[-1]


def test_another_machines_live_run_is_refused_and_a_still_one_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "POLL_S", 0.02)
    monkeypatch.setattr(lock, "WATCH_S", 0.2)
    folder = str(tmp_path)
    record = place(folder, host="node-7", heartbeat=time.time() - 10 * lock.STALE_AFTER_S)  # a clock far behind ...
    stop = threading.Event()

    def beat():  # ... but the run is alive: its heartbeat moves
        while not stop.wait(0.05):
            storage.folder(folder).write(lock.LOCK_NAME, lock.encode({**record, "heartbeat": record["heartbeat"] + 1}))
            record["heartbeat"] += 1

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        with pytest.raises(UserError, match=r"is in use by run 'first' \(host node-7, .*whose heartbeat moved"):
            lock.acquire(folder, "second", say=lambda line: None)
    finally:
        stop.set()
        thread.join()
    notes = []
    with lock.hold(folder, "second", say=notes.append):  # the same lock, standing still: a dead run's
        pass
    assert "on another machine: watching its heartbeat" in notes[0] and "its heartbeat stopped" in notes[-1]


def test_an_unreadable_lock_is_refused_naming_the_file(tmp_path):
    (tmp_path / ".lock").write_text("{not json")
    with pytest.raises(UserError, match=rf"holds a lock that cannot be read .* delete {tmp_path / '.lock'}$"):
        lock.acquire(str(tmp_path), "second")
    assert (tmp_path / ".lock").read_text() == "{not json"


def test_the_heartbeat_moves(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "HEARTBEAT_S", 0.05)
    with lock.hold(str(tmp_path), "first") as held:
        first = held.record["heartbeat"]
        deadline = time.time() + 30
        while json.loads((tmp_path / ".lock").read_text())["heartbeat"] == first and time.time() < deadline:
            time.sleep(0.02)
        assert json.loads((tmp_path / ".lock").read_text())["heartbeat"] > first
    assert not (tmp_path / ".lock").exists()


def test_release_leaves_a_lock_that_another_run_took_alone(tmp_path):
    held = lock.acquire(str(tmp_path), "first")  # its next heartbeat is a minute away
    place(str(tmp_path), token="someone else's")  # deleted by hand and taken by another run
    held.release()
    assert json.loads((tmp_path / ".lock").read_text())["token"] == "someone else's"


