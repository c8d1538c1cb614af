"""Warm starts for the suite's command lines: `python SCRIPT ARGS` and `python -m MODULE ARGS` (the launchers) run in a
process forked from a server that has already imported torch, Composer and Streaming, instead of a fresh interpreter:
`import composer` costs 7-9 s of CPU in every process here, more than most test runs train. A warm launcher's training
processes (`python -u train.py ...`) are the launcher forked in the same way. helpers.start() sends such command lines
here, also inside `unshare`'s /dev/shm of its own (a node of test_multinode.py); `python -c` and shell command lines
start cold, as does a test's that asks (start(cold=True)), and
PILEGPT_TESTS_COLD=1 makes every start cold (the suite as it ran before).

A warm process is a process of its own, as a fresh one would be: its own pid and session, the command's environment,
working directory, sys.argv and sys.path (the script's folder, then PYTHONPATH), stdout and stderr to the test's log
file, the script run as __main__. Its signal handlers are a new interpreter's until it imports Composer (which sets
SIGTERM's and SIGINT's); its exit status is an interpreter's (sys.exit's code, 1 after a traceback, -N when signal N
ends it); at its end non-daemon threads are joined, atexit handlers run and output is flushed. What differs: its
/proc/PID/cmdline and /proc/PID/environ are the server's, and it ends sooner, without an interpreter's teardown (a test
that reads them, or whose processes must end as slowly as real ones, starts cold). The server holds only imports: no
thread, no torch operation (an OpenMP pool would not survive the fork).

Python's multiprocessing forkserver is the server (one per pytest process, started at the first warm command line, gone
with that process); the log file's descriptor goes to the child through it.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from multiprocessing import reduction

PRELOAD = ["torch", "composer", "streaming", "tiktoken", "numpy"]  # what every warm process finds imported
MODULES = ("composer.cli.launcher", "pilegpt.launch")  # the `python -m` command lines that start warm
_context = None
_site_path: list[str] = []  # a fresh interpreter's sys.path after its first entry (the standard library, site)


def command(cmd: list[str]) -> tuple[str, str, list[str], str | None] | None:
    """("path"|"module", target, args, the size of a /dev/shm of its own or None) for a command line that can start
    warm, else None (also for every command line under PILEGPT_TESTS_COLD=1: the suite as it ran before warm starts,
    to tell a warm start's fault)."""
    shm, cmd = unwrapped(cmd)
    if len(cmd) < 2 or cmd[0] != sys.executable or os.environ.get("PILEGPT_TESTS_COLD") == "1":
        return None
    rest = cmd[1:]
    if rest[0] == "-u":
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m" and rest[1] in MODULES:
        return "module", rest[1], rest[2:], shm
    if rest and rest[0].endswith(".py") and os.path.isfile(rest[0]):
        return "path", rest[0], rest[1:], shm
    return None


OWN_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
MOUNT_SHM = re.compile(r'mount -t tmpfs -o size=(\w+) tmpfs /dev/shm && exec "\$@"')


def unwrapped(cmd: list[str]) -> tuple[str | None, list[str]]:
    """(the size, the command inside) for a command run with a /dev/shm of its own, as a node of its own has it:
    `unshare --mount --propagation private sh -c 'mount -t tmpfs -o size=SIZE tmpfs /dev/shm && exec "$@"' NAME
    COMMAND...`; else (None, cmd)."""
    mount = MOUNT_SHM.fullmatch(cmd[6]) if cmd[:6] == OWN_SHM and len(cmd) > 8 else None
    return (mount.group(1), cmd[8:]) if mount else (None, cmd)


def own_shm(size: str) -> None:
    """What that wrapper does, in this (single-threaded) process: a mount namespace of its own, private, with a
    new tmpfs on /dev/shm."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_rec, ms_private = 0x00020000, 0x4000, 0x40000
    if (libc.unshare(clone_newns) or libc.mount(None, b"/", None, ms_rec | ms_private, None)
            or libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, f"size={size}".encode())):
        print(f"warm.py: no /dev/shm of its own: {os.strerror(ctypes.get_errno())}", file=sys.stderr, flush=True)
        os._exit(32)


def context():
    global _context
    if _context is None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        out = subprocess.run([sys.executable, "-c", "import sys; print(chr(0).join(sys.path[1:]))"], env=env,
                             capture_output=True, text=True, check=True).stdout
        _site_path[:] = out.rstrip("\n").split("\0")
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


class _Fd:
    """A file descriptor that travels to the forked process through the server (pickled while it starts)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)


def _received(dup) -> int:
    return dup.detach()


class Process:
    """The part of subprocess.Popen the tests use (pid, poll, wait, returncode, send_signal, terminate, kill) for a
    process the server forked: its status comes from the server (it is not this process's child)."""

    def __init__(self, cmd: list[str], cwd, env: dict | None, log) -> None:
        kind, target, args, shm = command(cmd)
        self.args = cmd
        env = dict(os.environ if env is None else env)
        self._process = context().Process(target=_run, daemon=False, args=(
            kind, target, args, shm, os.path.abspath(cwd or os.getcwd()), env, _site_path, _Fd(log.fileno())))
        self._process.start()
        self.pid = self._process.pid
        self.returncode = None

    def poll(self):
        if self.returncode is None and not self._process.is_alive():
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None):
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _run(kind: str, target: str, args: list[str], shm: str | None, cwd: str, env: dict, site_path: list[str],
         fd: int) -> None:
    """In the process the server forked: its own session (and /dev/shm), the log file as stdout and stderr, then
    _become."""
    os.setsid()
    if shm:
        own_shm(shm)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    _become(kind, target, args, cwd, env, site_path)


class _ForkedPopen(subprocess.Popen):
    """subprocess.Popen inside a warm launcher: a training process it starts (`python -u train.py ...`) is this
    process forked, its file descriptors arranged as Popen arranges them for a program it runs; other command
    lines run as Popen runs them."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):
        warm = None if shell or preexec_fn or pass_fds else command([os.fsdecode(a) for a in args])
        if warm is None or warm[3]:
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                                          creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                                          errwrite, *rest)
        start_new_session = rest[-2]
        env = dict(os.environ if env is None else env)
        cwd = os.path.abspath(cwd or os.getcwd())
        pid = os.fork()
        if pid == 0:
            try:
                for child_fd, fd in ((0, p2cread), (1, c2pwrite), (2, errwrite)):
                    if fd != -1:
                        os.dup2(fd, child_fd)
                for fd in {p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite} - {-1, 0, 1, 2}:
                    os.close(fd)
                if start_new_session:
                    os.setsid()
                subprocess.Popen = _POPEN
                _become(*warm[:3], cwd, env, _site_path)
            finally:
                os._exit(1)
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


_POPEN = subprocess.Popen


def _fresh_start() -> None:
    """What a new interpreter has before the command imports anything: Python's own signal handlers (a launcher's
    SIGTERM forwarding would not survive an exec), and Composer not yet imported as far as signals go: importing it
    sets SIGTERM's and SIGINT's handlers (composer/core/engine.py), so the preloaded Composer goes back into
    sys.modules, and sets them, only when the command imports it."""
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if "composer" in sys.modules:
        sys.meta_path.insert(0, _ComposerImport(sys.modules.pop("composer")))


def _fresh_multiprocessing() -> None:
    """multiprocessing as a new interpreter has it: no start method chosen (the server's child inherits
    "forkserver", and a DataLoader's workers would then pickle the dataset) and this process its main one."""
    import itertools
    from multiprocessing import process

    multiprocessing.set_start_method(None, force=True)
    me = process._current_process
    me._identity, me._name, me._parent_pid, me._parent_name, me._popen = (), "MainProcess", None, None, None
    process._parent_process, process._children, process._process_counter = None, set(), itertools.count(1)


class _ComposerImport:
    """A meta path finder that answers the command's first `import composer` with the preloaded package."""

    def __init__(self, module) -> None:
        self.module, self.spec, self.loader = module, module.__spec__, module.__loader__

    def find_spec(self, name, path=None, target=None):
        if name != "composer":
            return None
        from importlib.machinery import ModuleSpec

        spec = ModuleSpec(name, self, origin=self.spec.origin, is_package=True)
        spec.submodule_search_locations = self.spec.submodule_search_locations
        return spec

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        sys.meta_path.remove(self)
        module.__spec__, module.__loader__ = self.spec, self.loader
        from composer.core import engine

        try:  # as composer/core/engine.py does at its import
            signal.signal(signal.SIGTERM, engine.sigterm_handler)
            signal.signal(signal.SIGINT, engine.sigterm_handler)
        except ValueError:
            pass


def _become(kind: str, target: str, args: list[str], cwd: str, env: dict, site_path: list[str]) -> None:
    """Become the command line (its environment, folder, sys.path, argv), run it, and end as its interpreter would."""
    import io
    import runpy

    _fresh_start()
    _fresh_multiprocessing()
    unbuffered = dict(write_through=True, encoding="utf-8", errors="backslashreplace")
    sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), **unbuffered)
    sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), **unbuffered)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    first = os.path.dirname(os.path.abspath(target)) if kind == "path" else cwd
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    _site_path[:] = site_path  # for the processes a warm launcher forks in turn
    sys.path[:] = [first, *extra, *site_path]
    if "OMP_NUM_THREADS" in env:  # read by OpenMP when torch was imported, in the server
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    if kind == "module" and target in MODULES:
        subprocess.Popen = _ForkedPopen
    code = 0
    try:
        sys.argv = [target, *args]
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else _message(e.code))
    except KeyboardInterrupt:  # an interpreter ends by the signal itself (status -2, a shell's 130)
        _traceback()
        _end(lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL), os.kill(os.getpid(), signal.SIGINT)))
    except BaseException:
        _traceback()
        code = 1
    _end(lambda: os._exit(code))


def _traceback() -> None:
    import traceback

    traceback.print_exc()


def _message(text) -> int:
    print(text, file=sys.stderr)
    return 1


def _end(exit_now) -> None:
    """An interpreter's end: join non-daemon threads, run the atexit handlers, flush, then exit_now()."""
    import atexit
    import threading

    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        exit_now()
        time.sleep(5)
        os._exit(1)
