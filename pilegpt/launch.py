"""Composer's launcher (`python -m pilegpt.launch -n 8 train.py config/pile.py`, composer's arguments) that passes
SIGTERM on to its training processes, so a preempted run writes its checkpoint, and whose training processes die
with it, so no orphan keeps training. Details: docs/clusters.md."""

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


def main() -> int:
    from composer.cli.launcher import main as composer_launcher

    signal.signal(signal.SIGTERM, forward_sigterm)
    os.environ[LAUNCHER_PID] = str(os.getpid())  # Composer's launcher passes its environment on
    code = composer_launcher()  # the first failed rank's Popen status: -N for a rank ended by signal N
    return 128 - code if code < 0 else code  # 128 + N, as a shell reports it; sys.exit(-15) would exit 241


if __name__ == "__main__":
    sys.exit(main())
