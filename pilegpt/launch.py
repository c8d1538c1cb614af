"""Composer's launcher (`composer -n N ...`, same arguments) that passes SIGTERM on to its training processes.

    python -m pilegpt.launch -n 8 train.py config/pile.py --autoresume=True

Composer 0.32.1's launcher has no SIGTERM handler: a SIGTERM sent to it (Kubernetes signals a container's first
process; Slurm's --signal=B:TERM the batch shell, which passes it on) ends the launcher at once and never reaches
train.py, so no preemption checkpoint is written (preemption.py). Here the launcher forwards each SIGTERM to its
children and keeps waiting for them, and exits with their status (preemption.PREEMPTED after a checkpoint).
"""

from __future__ import annotations

import os
import signal
import sys


def forward_sigterm(signum, frame) -> None:
    import psutil  # a dependency of Composer's launcher

    for child in psutil.Process().children():
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def main() -> int:
    from composer.cli.launcher import main as composer_launcher

    signal.signal(signal.SIGTERM, forward_sigterm)
    return composer_launcher()


if __name__ == "__main__":
    sys.exit(main())
