"""scripts/slurm/ as a cluster admin reads them (issue 31, items 2, 11, 12): train.sbatch requeues only on 143
(a preemption with its checkpoint written) and at most PILEGPT_MAX_REQUEUES times, asks for CPUs and memory and
passes them on to srun; launch.sh's master port stays below Linux's ephemeral range and is refused in one line when
taken. srun, scontrol and python are stubs that record how they were called; the real Slurm is test_slurm_real.py."""

import os
import re
import socket
import subprocess

import pytest

from helpers import REPO

SBATCH = REPO / "scripts" / "slurm" / "train.sbatch"
LAUNCH = REPO / "scripts" / "slurm" / "launch.sh"


def stubs(tmp_path, srun_status: int = 0):
    """A bin folder whose srun exits srun_status (after recording SRUN_CPUS_PER_TASK), whose scontrol records its
    arguments and names the host, and whose python records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    scripts = {"srun": f'echo "srun cpus=$SRUN_CPUS_PER_TASK $*" >> {calls}\nexit {srun_status}\n',
               "scontrol": f'if [ "$1" = show ]; then echo 127.0.0.1; else echo "scontrol $*" >> {calls}; fi\n',
               "python": f'echo "python $*" >> {calls}\n'}
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER", "PILEGPT"))},
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, calls


def sbatch_script(tmp_path, status: int, **env) -> tuple[int, str, list[str]]:
    base, calls = stubs(tmp_path, status)
    proc = subprocess.run(["bash", str(SBATCH), "config/tiny.py"], cwd=REPO, capture_output=True, text=True,
                          env={**base, "SLURM_JOB_ID": "42", "SLURM_CPUS_PER_TASK": "64", **env}, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr, calls.read_text().splitlines()


@pytest.mark.parametrize("status", [1, 2, 137])
def test_a_failure_that_is_not_a_preemption_is_never_requeued(tmp_path, status):
    code, out, calls = sbatch_script(tmp_path, status)
    assert code == status and not [c for c in calls if c.startswith("scontrol requeue")]
    assert f"training failed with exit status {status}: not requeued" in out


def test_a_preemption_is_requeued_with_the_cpus_passed_on_to_srun(tmp_path):
    code, out, calls = sbatch_script(tmp_path, 143, SLURM_RESTART_COUNT="2")
    assert code == 143 and calls[-1] == "scontrol requeue 42" and "requeued (3 of 10)" in out
    assert calls[0].startswith("srun cpus=64 --kill-on-bad-exit=1 scripts/slurm/launch.sh config/tiny.py")


def test_a_job_preempted_max_requeues_times_is_not_requeued_again(tmp_path):
    code, out, calls = sbatch_script(tmp_path, 143, SLURM_RESTART_COUNT="3", PILEGPT_MAX_REQUEUES="3")
    assert code == 143 and not [c for c in calls if c.startswith("scontrol requeue")]
    assert "preempted again after 3 requeues (PILEGPT_MAX_REQUEUES=3): not requeued" in out


def test_the_batch_script_asks_for_cpus_memory_and_whole_nodes():
    text = SBATCH.read_text()
    for option in ("--cpus-per-task=", "--mem=", "--exclusive", "--partition=", "--account="):
        assert re.search(rf"^#+SBATCH {option}", text, re.M), option


def launch_port(tmp_path, job_id: int) -> int:
    env, calls = stubs(tmp_path)
    env.update(SLURM_NNODES="2", SLURM_NODEID="1", SLURM_JOB_NODELIST="n[0-1]", SLURM_JOB_ID=str(job_id))
    subprocess.run(["bash", str(LAUNCH), "config/tiny.py"], env=env, check=True, timeout=60, capture_output=True)
    port = int(re.search(r"--master_port (\d+)", calls.read_text()).group(1))
    calls.unlink()
    return port


def test_the_master_port_is_below_the_ephemeral_range(tmp_path):
    ports = [launch_port(tmp_path / str(j), j) for j in (0, 1, 12_767, 19_999, 20_000, 987_654_321)]
    assert all(1024 < p < 32768 for p in ports), ports
    assert len(set(ports[:4])) == 4  # one port per job


def test_a_master_port_in_use_is_one_line(tmp_path):
    env, calls = stubs(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env.update(SLURM_NNODES="1", SLURM_NODEID="0", SLURM_JOB_NODELIST="n0", MASTER_PORT=str(port))
        proc = subprocess.run(["bash", str(LAUNCH), "config/tiny.py"], env=env, capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 2 and not calls.exists()
    assert proc.stderr.strip().splitlines() == [f"launch.sh: port {port} is already in use on {socket.gethostname()} "
                                                "(another job on this node?): set MASTER_PORT to a free port, or run "
                                                "on whole nodes (sbatch --exclusive)"]
