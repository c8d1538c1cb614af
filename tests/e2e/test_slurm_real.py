"""scripts/slurm/train.sbatch on a real Slurm: Debian's slurm-wlm, slurmctld and slurmd started by the test on
127.0.0.1 (one node: this host; config, state and logs in tmp_path; auth/none, so no munged). The real batch script
runs a 1-node CPU job; `scancel --signal=TERM` sends SIGTERM mid-run as `#SBATCH --signal=TERM@300` does (to the
job's steps, not the batch shell). train.py checkpoints that batch and exits 143, train.sbatch runs `scontrol
requeue`, Slurm starts the job again (Restarts=1), and train.py resumes with --autoresume: the losses of batches
1..6 equal a run that was never interrupted (run meanwhile, in the test's process). Skipped where Slurm is not installed
(.ci/run installs it as root)."""

import os
import re
import shutil
import subprocess
import time

import pytest

from helpers import (
    REPO,
    SMALL,
    assert_same_losses,
    free_port,
    interpreter_bin,
    losses_by_batch,
    read_jsonl,
    shakespeare_tokens,
    stop,
    train_main,
    write_bin,
)

MISSING = [tool for tool in ("slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo") if not shutil.which(tool)]
pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"no real Slurm here ({', '.join(MISSING)} not found): "
                                             "apt-get install slurm-wlm (.ci/run does, as root)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="a single-host Slurm runs its daemons and jobs as root here"),
]
ARGS = [*SMALL, "--device=cpu", "--sample_length=0", "--progress_bar=False", "--eval_interval=100ba",
        "--eval_subset_num_batches=1", "--save_interval=100ba", "--max_duration=6ba", "--run_name=real"]
SLOW = "--callbacks={'faults:SlowBatches': {'seconds': 0.3}}"  # tests/faults.py: time to signal mid-run
CONF = """ClusterName=pilegpt
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/none
CredType=cred/none
# A requeued job waits cred_expire + 1 s (default 121 s), then the backfill scheduler starts it (every bf_interval).
AuthInfo=cred_expire=5
SchedulerParameters=bf_interval=1
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
{node} NodeAddr=127.0.0.1
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def until(condition, seconds: float, what: str) -> None:
    """Polls condition() until true; RuntimeError naming `what` after `seconds` (a guard against hanging)."""
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.1)


def slurm_cmd(env: dict, *args: str) -> str:
    """A Slurm command's output; RuntimeError with its error line when it fails."""
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args[:2])}: {proc.stderr.strip()}")
    return proc.stdout


def quiet(env: dict, *args: str) -> str:
    """A Slurm command's output, "" when it fails (the cluster is starting or stopping)."""
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=60).stdout


def job_info(env: dict, job: str) -> dict:
    """`scontrol show job` of a job as {field: value} (Command and such with spaces are cut; not needed)."""
    return dict(re.findall(r"(\w+)=(\S*)", slurm_cmd(env, "scontrol", "show", "job", "-o", job)))


@pytest.fixture
def slurm(tmp_path):
    """A single-host Slurm cluster in tmp_path/slurm; yields the environment its commands use (SLURM_CONF, and
    `python` is this interpreter). Teardown cancels its jobs, waits for them to end, and stops both daemons."""
    folder = tmp_path / "slurm"
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True)
    interpreter_bin(folder / "bin")  # the job's bare `python` (launch.sh) is this interpreter
    node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    host = node.split()[0].removeprefix("NodeName=")  # this host's name and hardware, as slurmd sees them
    conf = folder / "slurm.conf"
    conf.write_text(CONF.format(host=host, node=node, folder=folder, ctld_port=free_port(), slurmd_port=free_port()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(SLURM_CONF=str(conf), PATH=f"{folder / 'bin'}{os.pathsep}{env['PATH']}")
    started, daemons = time.time(), []
    try:
        for name in ("slurmctld", "slurmd"):
            with open(folder / f"{name}.log", "w") as log:  # the daemon keeps its own handle
                daemons.append(subprocess.Popen([name, "-D"], env=env, stdout=log, stderr=subprocess.STDOUT))
        until(lambda: "idle" in quiet(env, "sinfo", "-h", "-o", "%t"), 60, f"an idle Slurm node: see {folder}/*.log")
        print(f"Slurm cluster up in {time.time() - started:.1f} s")
        yield env
    finally:
        quiet(env, "scancel", "--user=root")
        try:
            until(lambda: not quiet(env, "squeue", "-h"), 60, "the Slurm jobs to end")
        finally:
            for daemon in reversed(daemons):  # slurmd, then slurmctld (its slurmscriptd ends with it)
                stop(daemon)


def test_sigterm_on_a_real_slurm_checkpoints_requeues_and_resumes_loss_for_loss(slurm, tmp_path, monkeypatch):
    args = [*ARGS, f"--data_dir={write_bin(tmp_path / 'data', shakespeare_tokens()[:20_000])}"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # both runs alike, and steady on a busy machine
    saved, log = tmp_path / "slurm_run", tmp_path / "job.out"
    env = {**slurm, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "tests"), "PYTHONUNBUFFERED": "1",
           "MASTER_PORT": str(free_port())}
    job = slurm_cmd(env, "sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1",
                    f"--output={log}",
                    str(REPO / "scripts" / "slurm" / "train.sbatch"), *args, f"--save_folder={saved}", SLOW).strip()
    metrics = saved / "metrics.jsonl"
    until(lambda: metrics.is_file() and any(r["batch"] >= 2 for r in read_jsonl(metrics)), 240, "batch 2")
    slurm_cmd(env, "scancel", "--signal=TERM", job)  # to the job's steps (srun's tasks), as --signal=TERM@300
    whole = tmp_path / "whole"
    train_main([*args, f"--save_folder={whole / 'run'}"])  # the uninterrupted run, in this process, meanwhile
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    until(lambda: job_info(env, job)["JobState"] in ended, 300, f"job {job} to end")
    expected = losses_by_batch(whole / "run")

    out, info = log.read_text(), job_info(env, job)  # the job's log: both runs (--open-mode=append)
    assert (info["JobState"], info["Restarts"], info["ExitCode"]) == ("COMPLETED", "1", "0:0"), out[-4000:]
    stopped = [line for line in out.splitlines() if "stopped by SIGTERM after batch" in line]
    assert len(stopped) == 1 and "Traceback" not in out, out[-4000:]
    stop_batch = int(stopped[0].split("after batch ")[1].split(",")[0])
    assert 2 <= stop_batch < 6
    assert "task 0: Exited with exit code 143" in out  # srun's status, on which train.sbatch requeued
    assert "train.sbatch: preempted (exit 143), checkpoint saved: requeued (1 of 10)" in out
    assert (saved / f"ep0-ba{stop_batch}-rank0.pt").is_file()  # the preemption checkpoint (save_interval 100ba)
    assert f"resuming from the checkpoint at batch {stop_batch} " in out
    assert f"done: {6 - stop_batch} batches" in out
    assert [r["batch"] for r in read_jsonl(metrics) if "loss" in r] == list(range(1, 7))  # none lost or repeated
    got = losses_by_batch(saved)
    assert_same_losses(got, expected, range(1, 7), atol=1e-6)
