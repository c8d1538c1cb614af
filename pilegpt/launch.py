"""Composer's launcher (`composer -n N ...`, same arguments) that passes SIGTERM on to its training processes, and
whose training processes die with it.

    python -m pilegpt.launch -n 8 train.py config/pile.py --autoresume=True

Composer 0.32.1's launcher has no SIGTERM handler: a SIGTERM sent to it (Kubernetes signals a container's first
process; Slurm's --signal=B:TERM the batch shell, which passes it on) ends the launcher at once and never reaches
train.py, so no preemption checkpoint is written (preemption.py). Here the launcher forwards each SIGTERM to its
children and keeps waiting for them. Its exit status is the first failing rank's own (job_status): PREEMPTED (143)
after a preemption checkpoint, 2 for a user error, 128 + N for a rank ended by signal N (137 for the OOM killer).

A SIGKILL to the launcher (a grace period run out, `kill -9`) cannot be handled, and its training processes would
live on as orphans: still training, holding the save_folder's lock, so that the resumed run is refused. Kubernetes
(the container) and Slurm (the step's cgroup) kill them too; elsewhere nothing would. So each training process asks
Linux for a SIGKILL when the launcher dies (die_with_launcher, first thing in train.py).
"""

from __future__ import annotations

import os
import signal
import sys

LAUNCHER_PID = "PILEGPT_LAUNCHER_PID"  # set for the training processes: the launcher they die with


def forward_sigterm(signum, frame) -> None:
    import psutil  # a dependency of Composer's launcher

    for child in psutil.Process().children():
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def die_with_launcher() -> None:
    """In a process this launcher started (LAUNCHER_PID set): SIGKILL when its parent, the launcher, dies (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing changes). A launcher already gone ends the process at once."""
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
