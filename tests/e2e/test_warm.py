"""tests/warm.py, the warm starts every other end-to-end test relies on: a warm process (and a warm launcher's rank)
sees what a fresh interpreter sees (sys.path, installed packages' entry points, argv, environment, folder, signal
handlers before and after `import composer`) and ends as one does (exit status, stderr)."""

import ast
import os
import signal
import subprocess
import sys

import pytest

from helpers import REPO, run_command, train_command, train_env
from warm import OWN_SHM

PROBE = """
import multiprocessing as mp, os, signal, sys
from importlib.metadata import entry_points
def handlers():
    return [str(signal.getsignal(s)).split(" at ")[0] for s in (signal.SIGTERM, signal.SIGINT)]
before, path = handlers(), sys.path[1:]
import composer  # sets SIGTERM's and SIGINT's handlers (and torchmetrics puts a temporary folder on sys.path)
seen = {"path": path, "argv": sys.argv[1:], "cwd": os.getcwd() == os.path.dirname(os.path.abspath(sys.argv[0])),
        "main": __name__, "stdin": sys.stdin.read(),
        "env": {k: v for k, v in os.environ.items() if k in ("RANK", "WORLD_SIZE", "OMP_NUM_THREADS", "PYTHONPATH")},
        "backends": sorted(e.name for e in entry_points(group="torch.distributed.backends")),
        "handlers": [before, handlers()], "threads": __import__("torch").get_num_threads(),
        "multiprocessing": [mp.get_start_method(allow_none=True), mp.current_process().name, mp.parent_process()]}
with open(os.path.join(os.environ["WARM_PROBE"], f"rank{os.environ.get('RANK', '-')}.txt"), "w") as f:
    f.write(repr(seen))
"""


def probe(folder, nproc: int, cold: bool) -> dict[str, str]:
    """What PROBE saw in each process (by file name), started warm or cold in `folder`."""
    out = folder / "seen"
    out.mkdir(parents=True)
    script = folder / "probe.py"
    script.write_text(PROBE)
    python = train_command([], nproc)[:-1] if nproc else [sys.executable]
    code, output = run_command([*python, script, "--flag", "x y"], folder,
                               {**train_env(nproc=nproc), "WARM_PROBE": str(out)}, cold=cold)
    assert code == 0, output[-3000:]
    return {p.name: p.read_text() for p in sorted(out.iterdir())}


def test_a_warm_process_and_a_warm_launchers_ranks_see_what_a_fresh_interpreter_sees(tmp_path):
    cold = probe(tmp_path / "cold", 0, cold=True)["rank-.txt"]
    assert probe(tmp_path / "warm", 0, cold=False) == {"rank-.txt": cold}
    assert f"'path': ['{REPO / 'tests'}', '{REPO}', " in cold
    ranks = probe(tmp_path / "ranks", 2, cold=False)  # `composer -n 2`: the launcher, then its ranks, forked
    assert list(ranks) == ["rank0.txt", "rank1.txt"]
    for rank, seen in enumerate(ranks.values()):
        seen, want = ast.literal_eval(seen), ast.literal_eval(cold)
        assert seen.pop("env") == {"RANK": str(rank), "WORLD_SIZE": "2", "PYTHONPATH": want.pop("env")["PYTHONPATH"]}
        assert seen.pop("threads") >= 1 and want.pop("threads") == 1  # one thread a process is train_env's, for 1
        assert seen == want


@pytest.mark.parametrize("body, status, says", [
    ("import sys; sys.exit(3)", 3, None),
    ("import sys; sys.exit('error: bad input')", 1, "error: bad input"),
    ("raise ValueError('boom')", 1, "ValueError: boom"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM, None),
    ("raise KeyboardInterrupt", -signal.SIGINT, "KeyboardInterrupt"),
    ("import composer, os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143, "warm only"),  # Composer's handler
    ("import threading, time; threading.Thread(target=lambda: (time.sleep(0.5), print('joined'))).start()", 0,
     "joined"),
    ("import atexit; atexit.register(print, 'atexit ran')", 0, "atexit ran"),
])
def test_a_warm_process_ends_as_an_interpreter_does(tmp_path, body, status, says):
    script = tmp_path / "end.py"
    script.write_text(body + "\n")
    for cold in (False, True) if says != "warm only" else (False,):  # (a cold import of Composer: 7-9 s of CPU)
        code, out = run_command([sys.executable, script], tmp_path, cold=cold)
        assert code == status and (says in (None, "warm only") or says in out), (cold, code, out[-2000:])


def test_a_node_wrapped_in_a_dev_shm_of_its_own_has_one_warm_too(tmp_path):
    """`unshare --mount ... mount -t tmpfs ... /dev/shm && exec "$@"` around a command line (test_multinode.py's
    nodes): warm, the forked process makes the same mount namespace itself."""
    wrap = [*OWN_SHM, 'mount -t tmpfs -o size=8m tmpfs /dev/shm && exec "$@"', "node"]
    try:
        subprocess.run([*wrap, "true"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("needs root: a /dev/shm of its own (unshare --mount, mount -t tmpfs)")
    script = tmp_path / "shm.py"
    script.write_text("import os, sys\nopen(f'/dev/shm/{sys.argv[1]}', 'w').close()\n"
                      "print(sorted(os.listdir('/dev/shm')))\n")
    for cold in (False, True):
        name = f"warm-test-{os.getpid()}-{cold}"
        code, out = run_command([*wrap, sys.executable, script, name], tmp_path, cold=cold)
        assert (code, out) == (0, f"['{name}']\n") and not os.path.exists(f"/dev/shm/{name}"), (cold, code, out)
