"""Faults at the edges of a long run: a kill during a checkpoint write, a truncated checkpoint, a diverging loss, a
changed model on resume, a lost or throttling S3 store, a full disk, a folder held by another run. Each either
resumes or stops with one line, and what the user already has is kept. The faulty run is train.py's command line
(its exit status and its one error line are what is tested); the runs that set up or resume, in this process."""

import contextlib
import json
import os
import signal
import time

import numpy as np
import pytest
import torch

import train
from helpers import (
    SMALL,
    checkpoint_state,
    failed_with_one_line,
    finish,
    losses_by_batch,
    main_error,
    read_jsonl,
    run_train,
    start_s3_server,
    start_train,
    stop,
    succeeded,
    train_output,
    wait_until,
)
from pilegpt.train.run.resume import is_whole_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ARGS = [*SMALL, "--device=cpu", "--sample_length=8", "--eval_interval=3ba", "--eval_subset_num_batches=1",
        "--progress_bar=False", "--save_interval=3ba", "--run_name=faults"]


def test_a_kill_during_a_checkpoint_write_resumes_from_the_previous_checkpoint(random_bin, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [f"--data_dir={random_bin}", *ARGS, f"--save_folder={run_dir}", "--max_duration=6ba"]
    code, out = run_train([*args, "--callbacks={'faults:KillDuringCheckpoint': {'batch': 6}}"], tmp_path)
    assert code == -signal.SIGKILL, out[-2000:]
    half = (run_dir / "ep0-ba6-rank0.pt").stat().st_size
    assert os.readlink(run_dir / "latest-rank0.pt") == "ep0-ba3-rank0.pt"  # Composer had not moved it yet

    resumed = train_output([*args, "--autoresume=True"], capsys)
    assert "set aside" in resumed and "resuming from ep0-ba3-rank0.pt" in resumed
    assert "resumed at batch 3" in resumed
    broken = list(run_dir.glob("ep0-ba6-rank0.pt.broken-*"))
    assert len(broken) == 1 and broken[0].stat().st_size == half  # set aside as it was, not deleted
    assert checkpoint_state(run_dir / "ep0-ba6-rank0.pt")["timestamp"]["Timestamp"]["batch"] == 6


def test_a_truncated_latest_checkpoint_falls_back_to_the_one_before(random_bin, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [f"--data_dir={random_bin}", *ARGS, f"--save_folder={run_dir}"]
    train_output([*args, "--max_duration=6ba"], capsys)
    latest = run_dir / "ep0-ba6-rank0.pt"
    assert os.readlink(run_dir / "latest-rank0.pt") == latest.name
    with open(latest, "r+b") as f:
        f.truncate(latest.stat().st_size // 3)
    resumed = train_output([*args, "--max_duration=9ba", "--autoresume=True"], capsys)
    assert "resumed at batch 3" in resumed
    assert checkpoint_state(run_dir / "ep0-ba9-rank0.pt")["timestamp"]["Timestamp"]["batch"] == 9


def test_a_diverging_loss_stops_the_run_before_any_bad_checkpoint(random_bin, tmp_path):
    run_dir = tmp_path / "run"
    result = run_train([f"--data_dir={random_bin}", *ARGS, f"--save_folder={run_dir}", "--max_duration=12ba",
                        "--save_interval=2ba", "--eval_interval=2ba", "--learning_rate=1e6",
                        "--weight_decay=0.0"], tmp_path)  # 1e6 x 0.1 is refused before training
    assert "went NaN or infinite at batch" in failed_with_one_line(result)
    saved = sorted(run_dir.glob("ep0-ba*-rank0.pt"))
    assert saved, "at least the first checkpoint was good"
    for path in saved:  # every checkpoint left holds finite weights
        weights = checkpoint_state(path)["model"]
        assert all(torch.isfinite(w).all() for w in weights.values() if torch.is_tensor(w)), path
    last = max(int(p.name.split("-ba")[1].split("-")[0]) for p in saved)
    assert max(losses_by_batch(run_dir)) <= last + 2  # stopped within a couple of batches of the last save


def test_a_diverging_muon_run_names_muon_lr_among_the_causes(random_bin, tmp_path, capsys):
    # in this process (the NaN stop through the command line: the test above); Muon's orthogonalised steps at 1e6
    # alone stay finite for 12 batches (it was the weight decay, 1e6 x 0.1, that overflowed, now refused), so a
    # fault makes the weights infinite
    line = main_error(train.main, [f"--data_dir={random_bin}", *ARGS, f"--save_folder={tmp_path / 'run'}",
                                   "--max_duration=12ba", "--eval_interval=100ba", "--optimizer=muon", "--muon_lr=1e6",
                                   "--weight_decay=0.0", "--callbacks={'faults:InfiniteWeight': {'batch': 3}}"],
                      capsys, alone=False)
    assert "went NaN or infinite at batch" in line, line
    assert "lower --learning_rate (now 0.003) or --muon_lr (now 1e+06), or raise --warmup" in line, line


def test_infinite_weights_are_never_checkpointed_or_exported(random_bin, tmp_path):
    # The loss of batch 6 is finite; the weights after its update are not, and batch 6 is a checkpoint batch
    # (no evaluation there: its loss would stop the run first).
    run_dir = tmp_path / "run"
    result = run_train([f"--data_dir={random_bin}", *ARGS, f"--save_folder={run_dir}", "--max_duration=9ba",
                        "--eval_interval=100ba", "--callbacks={'faults:InfiniteWeight': {'batch': 6}}"], tmp_path)
    assert failed_with_one_line(result) == (
        "error: the weights went NaN or infinite at batch 6, so the run stopped before saving it: lower "
        "--learning_rate (now 0.003) or raise --warmup, then continue from the last good checkpoint with "
        "--autoresume=True")
    assert sorted(p.name for p in run_dir.glob("ep0-ba*-rank0.pt")) == ["ep0-ba3-rank0.pt"]
    assert max(losses_by_batch(run_dir)) == 5  # batch 6's row is written at its checkpoint event: none after 5
    exported = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    assert all(torch.isfinite(w).all() for w in exported["model"].values())


def test_the_nan_line_names_the_settings_set_away_from_the_default_and_every_preset(random_bin, tmp_path, capsys):
    # qk_scale=8 and beta2=0.5 are in bounds but no preset's, weight_decay=0.0 and qk_norm are config/nanochat.py's
    line = main_error(train.main, [f"--data_dir={random_bin}", *ARGS, f"--save_folder={tmp_path / 'run'}",
                                   "--max_duration=3ba", "--eval_interval=100ba", "--qk_scale=8", "--beta2=0.5",
                                   "--weight_decay=0.0", "--qk_norm=True",
                                   "--callbacks={'faults:InfiniteWeight': {'batch': 3}}"], capsys, alone=False)
    assert line == (
        "error: the weights went NaN or infinite at batch 3, so the run stopped before saving it: lower "
        "--learning_rate (now 0.003) or raise --warmup; --qk_scale (now 8) and --beta2 (now 0.5) can cause it too, "
        "at a value neither the default nor a preset in config/ uses, then continue from the last good checkpoint "
        "with --autoresume=True")


def test_resuming_with_another_model_shape_is_one_line(random_bin, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [f"--data_dir={random_bin}", *ARGS, f"--save_folder={run_dir}", "--max_duration=3ba"]
    train_output(args, capsys)
    result = run_train([*args, "--max_duration=6ba", "--autoresume=True", "--n_layer=3"], tmp_path)
    assert failed_with_one_line(result) == (
        f"error: autoresume: the checkpoints in {run_dir} are of another model: n_layer=3 (the run has 2); resume "
        f"with the run's settings ({run_dir / 'config.json'}) or start a new run with another --run_name")


def test_an_init_only_setting_changed_on_autoresume_is_said_and_kept_and_another_seed_is_refused(random_bin, tmp_path,
                                                                                                  capsys):
    # weight_init acts when the weights are made, and a resume's come from its checkpoint: it resumed with rc 0 and
    # nothing said, while config.json recorded a value the run never started with; a new seed reorders the data
    run_dir = tmp_path / "run"
    args = [f"--data_dir={random_bin}", *ARGS, f"--save_folder={run_dir}", "--max_duration=3ba"]
    train_output(args, capsys)
    resume = [*args, "--max_duration=6ba", "--autoresume=True"]
    fix = f"resume with the run's settings ({run_dir / 'config.json'}) or start a new run with another --run_name"
    assert main_error(train.main, [*resume, "--seed=7"], capsys, alone=False) == (
        f"error: autoresume: the checkpoints in {run_dir} are of another seed, which orders the data (a new one "
        f"mid-epoch repeats and skips samples): seed=7 (the run has 1337); {fix}")
    out = train_output([*resume, "--weight_init=nanochat", "--log_interval=2"], capsys)
    assert (f"note: autoresume: weight_init='nanochat' acts only when a run starts (the weights come from the "
            f"checkpoint): the run keeps weight_init='gpt2', as it started ({run_dir / 'config.json'})"
            ) in out.splitlines()
    assert "resuming from the checkpoint at batch 3" in out and "done: 3 batches" in out
    saved = json.loads((run_dir / "config.json").read_text())["config"]
    assert (saved["weight_init"], saved["seed"], saved["log_interval"]) == ("gpt2", 1337, 2)  # a used one: the new


def test_resuming_with_another_optimizer_is_one_line_also_without_config_json(random_bin, tmp_path, capsys):
    # adamw -> muon resumed with AdamW's lrs in Muon's groups (and norms at 0), muon -> adamw with Muon's lr on
    # every 2-D weight: refused, from config.json, and from the checkpoint itself when config.json is not there
    for first, then in (("adamw", "muon"), ("muon", "adamw")):
        run_dir = tmp_path / first
        args = [f"--data_dir={random_bin}", *ARGS, f"--save_folder={run_dir}", "--max_duration=3ba"]
        train_output([*args, f"--optimizer={first}"], capsys)
        before = sorted(p.name for p in run_dir.iterdir())
        resume = [*args, "--max_duration=6ba", "--autoresume=True", f"--optimizer={then}"]
        # through the command line once; the other way round in this process, as it runs it
        line = (failed_with_one_line(run_train(resume, tmp_path)) if first == "adamw"
                else main_error(train.main, resume, capsys, alone=False))
        assert line == (
            f"error: autoresume: the checkpoints in {run_dir} are of optimizer {first}; this run asks for {then}: "
            f"resume with the run's settings ({run_dir / 'config.json'}) or start a new run with another --run_name")
        assert sorted(p.name for p in run_dir.iterdir()) == before
    (run_dir / "config.json").unlink()  # the muon run: its checkpoint alone tells
    error = main_error(train.main, [*args, "--max_duration=6ba", "--autoresume=True", "--optimizer=adamw"], capsys,
                       alone=False)
    assert error == (f"error: autoresume: the checkpoint {run_dir / 'ep0-ba3-rank0.pt'} is of optimizer muon; this run "
                     "asks for adamw: resume with the run's --optimizer or start a new run with another --run_name")
    assert sorted(p.name for p in run_dir.glob("ep*")) == ["ep0-ba3-rank0.pt"]


def test_changed_learning_rates_and_decay_on_autoresume_are_used_and_said(random_bin, tmp_path, capsys):
    # Composer restores every group's lr, weight decay and betas and the schedule's base lrs from the checkpoint: the
    # new values were ignored in silence while config.json recorded them (and the NaN stop's advice, "lower
    # --learning_rate, then --autoresume", did nothing)
    args = [f"--data_dir={random_bin}", *ARGS, "--optimizer=muon", "--eval_interval=100ba", "--sample_length=0",
            "--tie_embeddings=False", "--embedding_lr=0.01", "--head_lr=0.005"]  # the parts' own groups too
    new = ["--learning_rate=1e-3", "--muon_lr=0.01", "--weight_decay=0.0", "--beta2=0.99", "--embedding_lr=0.02",
           "--head_lr=0.004"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    train_output([*args, *new, f"--save_folder={reference}", "--max_duration=6ba"], capsys)
    train_output([*args, f"--save_folder={run_dir}", "--max_duration=3ba"], capsys)
    out = succeeded(run_train([*args, *new, f"--save_folder={run_dir}", "--max_duration=6ba", "--autoresume=True"],
                              tmp_path))
    assert ("autoresume: this run's muon_lr=0.01 (was 0.02), weight_decay=0 (was 0.1), beta2=0.99 (was 0.95), "
            "learning_rate=0.001 (was 0.003), embedding_lr=0.02 (was 0.01), head_lr=0.004 (was 0.005) replace the "
            "checkpoint's from batch 3 on (the moments and momentum are the checkpoint's)") in out.splitlines()
    lrs = {path: {r["batch"]: (r["lr"], r["muon_lr"]) for r in read_jsonl(path / "metrics.jsonl") if "lr" in r}
           for path in (reference, run_dir)}
    assert lrs[run_dir][3] == (3e-3, 0.02)  # the run's own schedule up to the checkpoint
    for batch in (4, 5, 6):  # then the schedule of a run that had the new settings from the start
        assert lrs[run_dir][batch] == pytest.approx(lrs[reference][batch], rel=1e-12)
    groups = checkpoint_state(run_dir / "ep0-ba6-rank0.pt")["optimizers"]["Muon"]["param_groups"]
    assert [(g["initial_lr"], g["weight_decay"], tuple(g["betas"])) for g in groups] == [
        (0.01, 0.0, (0.9, 0.99)), (1e-3, 0.0, (0.9, 0.99)), (0.02, 0.0, (0.9, 0.99)), (0.004, 0.0, (0.9, 0.99))]
    state = checkpoint_state(run_dir / "ep0-ba6-rank0.pt")["optimizers"]["Muon"]["state"]
    # Muon's matrices, the gains (AdamW's 2-D group was all parts), wte and wpe, lm_head; the parts' moments travel
    assert [len(g["params"]) for g in groups[2:]] == [2, 1]
    assert all("exp_avg" in state[i] for g in groups[2:] for i in g["params"])
    recorded = json.loads((run_dir / "config.json").read_text())["config"]
    assert (recorded["learning_rate"], recorded["muon_lr"], recorded["weight_decay"]) == (1e-3, 0.01, 0.0)
    again = train_output([*args, *new, f"--save_folder={run_dir}", "--max_duration=9ba", "--autoresume=True"], capsys)
    assert "autoresume: this run's" not in again  # the run's settings now: nothing to replace
    # a part's rate unset (or set) adds or drops a parameter group, which the checkpoint cannot load into: one line
    error = main_error(train.main, [*args, *new, "--embedding_lr=0", f"--save_folder={run_dir}", "--max_duration=12ba",
                                    "--autoresume=True"], capsys, alone=False)
    assert error.startswith(f"error: autoresume: the checkpoints in {run_dir} have another optimizer layout: "
                            "embedding_lr=0.0 (the run has 0.02) (a part's rate set or unset adds or drops a "
                            "parameter group")
    # without config.json (an s3:// run resumed elsewhere), the checkpoint's own groups tell: torch loads them by
    # their parameters' names into this run's layout, and the check after the load refuses it in one line
    (run_dir / "config.json").unlink()
    error = main_error(train.main, [*args, *new, "--embedding_lr=0", f"--save_folder={run_dir}", "--max_duration=12ba",
                                    "--autoresume=True"], capsys, alone=False)
    assert error == ("error: autoresume: the checkpoint's optimizer has its own groups for embedding_lr and head_lr, "
                     "this run's for head_lr (a part's rate, embedding_lr or head_lr, set or unset adds or drops a "
                     "group): resume with the run's settings or start a new run with another --run_name")


@pytest.mark.s3
def test_losing_s3_mid_training_stops_with_one_line_and_resumes_from_the_bucket(random_bin, tmp_path, capsys,
                                                                                monkeypatch):
    root = tmp_path / "s3"
    server, s3 = start_s3_server(root)
    args = [*ARGS, f"--data_dir={random_bin}", "--save_interval=2ba", f"--save_folder=s3://{s3.bucket}/runs/faults"]
    first = root / s3.bucket / "runs" / "faults" / "ep0-ba2-rank0.pt"
    try:
        proc = start_train([*args, "--max_duration=400ba", "--eval_interval=400ba"], tmp_path,
                           env={**os.environ, **s3.env()})
        wait_until(first.exists, proc, "first checkpoint in the bucket", seconds=120)
        stop(server)  # the store goes away once the first checkpoint reached it
        lost_at = time.time()
        code, out = finish(proc, timeout=120)  # Composer's own uploader kept polling S3 here for an hour
        seconds = time.time() - lost_at
        error = failed_with_one_line((code, out))
        assert "failed, training stopped: cannot reach the S3 endpoint" in error, error
        assert "--autoresume=True" in error and s3.secret_key not in out
        assert seconds < 60, seconds  # storage.py's retry budget (5 attempts), measured ~14 s

        # The store is back (same address, same files); on another machine (no local files: another working
        # folder), autoresume continues from the last checkpoint that reached the bucket.
        server, s3 = start_s3_server(root, port=int(s3.endpoint_url.rsplit(":", 1)[1]))
        last = max(int(p.name.split("-ba")[1].split("-")[0]) for p in first.parent.glob("ep0-ba*-rank0.pt"))
        fresh = tmp_path / "another_machine"
        fresh.mkdir()
        monkeypatch.chdir(fresh)
        for name, value in s3.env().items():
            monkeypatch.setenv(name, value)
        resumed = train_output([*args, f"--max_duration={last + 4}ba", "--eval_interval=400ba", "--autoresume=True"],
                               capsys)
        assert f"resuming from the checkpoint at batch {last} " in resumed, resumed[-2000:]
        assert "done: 4 batches" in resumed
        assert (first.parent / f"ep0-ba{last + 4}-rank0.pt").is_file()  # and its uploads finished before "done"
        assert (first.parent / "model.pt").is_file() and (first.parent / "latest-rank0.pt.symlink").is_file()
    finally:
        stop(server)


@pytest.mark.s3
def test_s3_runs_leave_no_local_checkpoint_copies_and_autoresume_survives_throttling(random_bin, tmp_path):
    """Composer kept a local copy of every checkpoint of an s3:// run in a temporary folder, and looked the
    autoresume checkpoint up through its own S3 client (3 tries): 503 SlowDown on a read's first 3 tries failed
    the resume with a traceback. Now each copy goes once uploaded (also when the run fails) and every request
    takes s3.py's policy (5 tries)."""
    from helpers import ThrottlingProxy

    server, s3 = start_s3_server(tmp_path / "s3")
    proxy = ThrottlingProxy(s3.endpoint_url, refusals=3)
    scratch = tmp_path / "tmp"  # the runs' TMPDIR, where Composer's saver keeps its local copies
    scratch.mkdir()
    args = [*ARGS, f"--data_dir={random_bin}", "--save_interval=2ba", "--eval_interval=400ba",
            f"--save_folder=s3://{s3.bucket}/runs/disk"]
    bucket = tmp_path / "s3" / s3.bucket / "runs" / "disk"
    try:
        env = {**os.environ, **s3.env(), "TMPDIR": str(scratch)}  # a process: what it leaves there includes its exit
        succeeded(run_train([*args, "--max_duration=4ba"], tmp_path, env=env))
        assert sorted(p.name for p in bucket.glob("ep*.pt")) == ["ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"]
        assert [p for p in scratch.rglob("*") if not p.is_dir()] == []
        assert list(scratch.iterdir()) == []

        throttled = {**env, "AWS_ENDPOINT_URL": proxy.endpoint_url, "S3_ENDPOINT_URL": proxy.endpoint_url}
        code, second = run_train([*args, "--max_duration=8ba", "--autoresume=True",
                                  "--callbacks={'faults:FailAtBatch': {'batch': 7}}"], tmp_path, env=throttled)
        assert "resuming from the checkpoint at batch 4 " in second, second[-3000:]
        assert code == 1 and "injected failure at batch 7" in second, second[-3000:]
        assert proxy.throttled >= 9  # the lookup of the pointer and the checkpoint, and resume.py's listing
        assert (bucket / "ep0-ba6-rank0.pt").is_file()  # uploaded before the failure
        assert [p for p in scratch.rglob("*") if not p.is_dir()] == []
        assert list(scratch.iterdir()) == []
    finally:
        proxy.shutdown()
        stop(server)


def test_a_full_disk_during_a_checkpoint_write_is_one_line_and_the_resume_continues(random_bin, tmp_path, capsys):
    """A 40 MB disk holds the checkpoint of batch 2 (20 MB) and model.pt (6.5 MB), not the checkpoint of batch 4:
    torch.save failed with a 105-line traceback."""
    from helpers import remount, tmpfs

    with tmpfs(tmp_path / "disk", size="40m") as disk:
        args = [*ARGS, f"--data_dir={random_bin}", "--save_interval=2ba", "--eval_interval=400ba",
                f"--save_folder={disk / 'run'}", "--max_duration=6ba"]
        line = failed_with_one_line(run_train(args, tmp_path))
        # torch names neither the file nor the cause; where it does not, errno says it
        assert line.startswith("error: writing ") and str(disk / "run") in line, line
        assert "No space left on device (ENOSPC)" in line or "file write failed; 0.0 MB free" in line, line
        assert line.endswith(": free space on that disk (or choose another --save_folder), then re-run with "
                             "--autoresume=True: it continues from the last whole checkpoint")
        remount(disk, "200m")  # space freed
        resumed = train_output([*args, "--autoresume=True"], capsys)
        assert "resuming from the checkpoint at batch 2 " in resumed and "done: 4 batches" in resumed
        assert (disk / "run" / "ep0-ba6-rank0.pt").is_file()


@pytest.mark.parametrize("kind", ["under a file", "read-only"])
def test_folders_that_cannot_be_written_are_one_line_errors_naming_them(random_bin, tmp_path, capsys, kind):
    import export_hf
    import to_mds
    from helpers import main_error, tmpfs, write_mds
    from model import GPT, GPTConfig
    from pilegpt.checkpoint import save_export

    write_mds(tmp_path / "mds" / "train", np.arange(2000, dtype=np.uint16), 32, vocab_size=50257)
    save_export(GPT(GPTConfig(block_size=16, n_layer=1, n_head=1, n_embd=8)), tmp_path / "model.pt")
    blocked = tmp_path / "blocked"
    with contextlib.ExitStack() as stack:
        if kind == "under a file":
            blocked.write_text("a file, not a folder")
            why = f"{blocked} is a file, not a folder"
        else:
            stack.enter_context(tmpfs(blocked, size="1m", readonly=True))
            why = f"cannot write in {blocked} (a read-only file system)"
        where = blocked / "sub"
        cases = [
            (train.main, [f"--data_dir={random_bin}", *ARGS, f"--save_folder={where / 'run'}"],
             f"save_folder {where / 'run'}: {why}: choose another --save_folder or --run_name"),
            (train.main, [f"--data_dir={tmp_path / 'mds'}", *ARGS, f"--save_folder={tmp_path / 'run'}",
                          f"--data_local={where / 'cache'}"],
             f"data_local {where / 'cache'}: {why}: pass another --data_local"),
            (to_mds.main, ["--bin", str(random_bin), "--out", str(where / "mds"), "--block-size", "32"],
             f"--out {where / 'mds'}: {why}: choose another folder"),
            (export_hf.main, [str(tmp_path / "model.pt"), str(where / "hf")],
             f"OUT_DIR {where / 'hf'}: {why}: choose another OUT_DIR"),
        ]
        for main, argv, message in cases:
            assert main_error(main, argv, capsys).startswith(f"error: {message}")


def test_a_second_run_into_a_held_folder_is_one_line_and_a_killed_holder_is_taken_over(random_bin, tmp_path):
    """Two runs into one save_folder both said "done": the second's checkpoints replaced the first's."""
    run_dir = tmp_path / "run"
    args = [f"--data_dir={random_bin}", *ARGS, f"--save_folder={run_dir}", "--save_interval=2ba"]
    first = start_train([*args, "--max_duration=400ba", "--eval_interval=400ba"], tmp_path)
    wait_until((run_dir / "ep0-ba2-rank0.pt").exists, first, "first checkpoint", seconds=120)
    second = failed_with_one_line(run_train([*args, "--max_duration=4ba", "--autoresume=True"], tmp_path))
    assert second == (
        f"error: {run_dir} is in use by run 'faults' (host {os.uname().nodename}, PID {first.pid}, since "
        f"{second.split(', since ')[1].split(')')[0]}): two runs must not write one save_folder; "
        "wait for that run to end or stop it, or pass another --run_name/--save_folder (if that run is gone, "
        f"delete {run_dir / '.lock'})")
    assert first.poll() is None  # the first run trains on
    first.kill()  # SIGKILL: its lock stays behind
    finish(first)
    assert (run_dir / ".lock").is_file()
    # the newest whole checkpoint (SIGKILL may land inside a write: autoresume sets that one aside)
    last = max(int(p.name.split("-ba")[1].split("-")[0]) for p in run_dir.glob("ep0-ba*-rank0.pt")
               if is_whole_checkpoint(p))
    resumed = start_train([*args, "--max_duration=400ba", "--autoresume=True", "--eval_interval=400ba"], tmp_path)

    def resumed_and_saved() -> bool:  # the resumed run holds the lock and has written a whole new checkpoint
        try:
            held = json.loads((run_dir / ".lock").read_text()).get("pid") == resumed.pid
        except (OSError, ValueError):
            return False
        newer = run_dir / f"ep0-ba{last + 2}-rank0.pt"
        return held and newer.exists() and is_whole_checkpoint(newer)

    wait_until(resumed_and_saved, resumed, "lock taken over and a new checkpoint", seconds=120)
    resumed.send_signal(signal.SIGINT)  # Ctrl-C
    code, out = finish(resumed, timeout=120)
    assert code == 130, out[-3000:]
    assert f"note: took over the lock of run 'faults' (host {os.uname().nodename}, PID {first.pid}" in out
    assert f"its process {first.pid} is gone" in out and f"resuming from the checkpoint at batch {last} " in out
    assert not (run_dir / ".lock").exists()  # released on Ctrl-C
