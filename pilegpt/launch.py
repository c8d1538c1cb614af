"""Composer's launcher (`python -m pilegpt.launch -n 8 train.py config/pile.py`, composer's arguments) that passes
SIGTERM on to its training processes, so a preempted run writes its checkpoint, and whose training processes die
with it, so no orphan keeps training. Its exit status is the first failing rank's own (job_status): 143 only after
a preemption checkpoint. Details: docs/clusters.md."""

from __future__ import annotations

import os
import signal
import sys

LAUNCHER_PID = "PILEGPT_LAUNCHER_PID"  # set for the training processes: the launcher they die with


def forward_sigterm(signum, frame) -> None:
    """Pass a SIGTERM on to the training processes. Composer 0.32.1's launcher has none: a SIGTERM to it (Kubernetes
    signals a container's first process; Slurm's --signal=B:TERM the batch shell) would end it at once and never
    reach train.py, so no preemption checkpoint would be written (train/preemption.py)."""
    import psutil  # a dependency of Composer's launcher

    for child in psutil.Process().children():
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def die_with_launcher() -> None:
    """In a process this launcher started (LAUNCHER_PID set): SIGKILL when its parent, the launcher, dies (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing changes), so that a SIGKILLed launcher leaves no orphan training on and
    holding the save_folder's lock. A launcher already gone ends the process at once."""
    launcher = os.environ.get(LAUNCHER_PID)
    if launcher is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        return  # refused (a sandbox): orphans remain possible, as with Composer's launcher
    if os.getppid() != int(launcher):  # a wrapper script in between (then it is the parent), or the launcher died
        try:                           # before the request above, and no signal will come
            os.kill(int(launcher), 0)
        except ProcessLookupError:
            os.kill(os.getpid(), signal.SIGKILL)


def shell_status(code: int) -> int:
    """A Popen returncode as a shell reports it: 128 + N for a process ended by signal N."""
    return 128 - code if code < 0 else code


def job_status(seen: dict, composer_code: int) -> int:
    """The launcher's exit status: the first failing rank's own (2 for a user error, 1 for a crash, 128 + N for a
    signal), 0 when every rank succeeded. PREEMPTED (143) is thus returned only when the first rank to stop did so
    for a preemption notice: a SIGTERM the launcher sent to the other ranks after a failure never masks it."""
    first = seen.get("first_failures") or {}
    if first:
        return shell_status(first[min(first)])
    return shell_status(composer_code)


def main() -> int:
    from composer.cli.launcher import main as composer_launcher

    from pilegpt import compat

    signal.signal(signal.SIGTERM, forward_sigterm)
    os.environ[LAUNCHER_PID] = str(os.getpid())  # Composer's launcher passes its environment on
    seen: dict = {}
    with compat.launcher_processes_seen(seen):
        code = composer_launcher()  # the first non-zero status in rank order (maybe the echo of its own SIGTERM)
    return job_status(seen, code)


if __name__ == "__main__":
    sys.exit(main())
