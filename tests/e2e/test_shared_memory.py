"""Streaming's shared memory on one machine through the command line: `to_mds.py --verify` makes its StreamingDataset
as train.py does, under the start lock in /dev/shm and after the clean-up of stale blocks (pilegpt/compat.py). Each
test has a /dev/shm of its own (a tmpfs in a mount namespace, as test_multinode.py's nodes), so that no other run
on the machine waits for its lock or loses a block to it; the commands enter that namespace with nsenter. Needs
root (unshare, mount, nsenter); the rules themselves: tests/unit/test_compat.py."""

import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from helpers import (
    REPO,
    finish,
    output_of,
    run_command,
    script,
    start,
    succeeded,
    wait_until,
    write_bin,
)

OWN_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "own-shm"]
# argv[1] "lock": take the start lock as a local leader does, say so, and stop (SIGSTOP) holding it.
# argv[1] "block": hold the file argv[2] open, as a live StreamingDataset holds its block.
HOLDER = """
import os, signal, sys, time
from pilegpt import compat
if sys.argv[1] == "lock":
    with compat.streaming_start_lock():
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
else:
    fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT)
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def own_shm():
    try:
        subprocess.run([*OWN_SHM, "nsenter", "--version"], check=True, capture_output=True, timeout=30)
        subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], check=True, capture_output=True,
                       timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("needs root: a /dev/shm of its own (unshare --mount, mount -t tmpfs), nsenter, unshare --pid")
    return OWN_SHM


@pytest.fixture
def env():
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def start_holder(tmp_path, env, *args):
    """HOLDER in a /dev/shm of its own, once it is ready; the command prefix that enters that mount namespace."""
    holder = start([*OWN_SHM, sys.executable, "-c", HOLDER, *args], tmp_path, env)
    wait_until(lambda: "ready" in output_of(holder), holder, "the holder ready", seconds=60)
    return holder, ["nsenter", f"--mount=/proc/{holder.pid}/ns/mnt"]


def mds_dataset(tmp_path) -> list:
    """A small MDS dataset (to_mds.py's main in this process: no shared memory of the tests' own is involved); the
    to_mds.py --verify command line of it."""
    import to_mds

    data = write_bin(tmp_path / "data", {"train": np.arange(2000) % 500})
    assert to_mds.main(["--bin", str(data), "--out", str(tmp_path / "mds"), "--block-size", "16"]) == 0
    return script("to_mds.py", "--bin", data, "--out", tmp_path / "mds", "--verify")


def test_a_stopped_holder_of_the_start_lock_is_named_while_it_is_waited_for(tmp_path, own_shm, env):
    """A leader that holds the start lock is stopped (SIGSTOP): the next one, waiting up to 60 s, says within 5 s
    which lock, which process on which host, and that it is stopped; once it goes on, the verify runs."""
    verify = mds_dataset(tmp_path)
    holder, in_ns = start_holder(tmp_path, env, "lock")
    proc = start([*in_ns, *verify], tmp_path, env)
    waiting = "waiting for /dev/shm/pilegpt-streaming-start.lock (up to 60 s), the lock of Streaming's start-up"
    wait_until(lambda: waiting in output_of(proc), proc, "the waiting line", seconds=60)
    line = next(line for line in output_of(proc).splitlines() if line.startswith(waiting))
    assert f": held by PID {holder.pid} on {socket.gethostname()} since " in line
    assert line.endswith(f"; that process is stopped (SIGSTOP or Ctrl-Z): `kill -CONT {holder.pid}` lets it go on, "
                         "or end it")
    os.kill(holder.pid, signal.SIGCONT)  # it goes on and lets the lock go
    out = succeeded(finish(proc, timeout=120))
    assert "gave up waiting" not in out
    assert finish(holder)[0] == 0


def test_shared_memory_a_process_out_of_sight_may_hold_is_left_alone(tmp_path, own_shm, env):
    """A verify in a PID namespace of its own sharing /dev/shm and the IPC namespace (docker --ipc=host) cannot see
    the process holding a block in /proc: it leaves every block alone, with a note. In the holder's namespace the
    stale block goes and the held one stays; PILEGPT_SHM_CLEANUP=0 removes nothing, =1 cleans even out of sight."""
    from streaming.base.constant import LOCALS
    from streaming.base.shared.prefix import _get_path

    held, stale = (f"/dev/shm/{_get_path(prefix, LOCALS)}" for prefix in (987_700, 987_701))
    verify = mds_dataset(tmp_path)
    holder, in_ns = start_holder(tmp_path, env, "block", held)
    out_of_sight = [*in_ns, "unshare", "--pid", "--fork", "--mount-proc"]

    def blocks() -> set:
        return {p for p in (held, stale) if run_command([*in_ns, "test", "-e", p])[0] == 0}

    succeeded(run_command([*in_ns, "touch", stale]))  # a block no process holds: a crashed run's
    assert blocks() == {held, stale}
    out = succeeded(run_command([*out_of_sight, *verify], tmp_path, env))
    assert ("note: 2 Streaming shared memory block(s) in /dev/shm that no process in sight holds are left alone: "
            "this process runs in a PID namespace of its own but shares the host's IPC namespace (--ipc=host)") in out
    assert blocks() == {held, stale}
    succeeded(run_command([*in_ns, *verify], tmp_path, env))  # in sight of the holder: only the stale block goes
    assert blocks() == {held}
    succeeded(run_command([*in_ns, "touch", stale]))
    succeeded(run_command([*in_ns, *verify], tmp_path, {**env, "PILEGPT_SHM_CLEANUP": "0"}))
    assert blocks() == {held, stale}  # (another value is one line: tests/unit/test_compat.py)
    succeeded(run_command([*out_of_sight, *verify], tmp_path, {**env, "PILEGPT_SHM_CLEANUP": "1"}))
    assert blocks() == set()  # the user's word: no other run uses them
    holder.kill()
    finish(holder)
