"""to_mds.py through its command line (a failing worker process, a missing file, every uint16 id, a kill mid-run:
nothing published, the old dataset kept) and to a real S3 server (index.json last, overwrite, --out with
--remote, verify, a missing bucket or a failed upload publishes nothing). In this process: tests/unit/test_to_mds.py.

S3 uploads are watched through botocore's event hooks on the client s3.make_client returns: every S3 request of
to_mds goes through it.
"""

import json
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import to_mds
from helpers import (
    failed_with_one_line,
    main_error,
    read_mds,
    run_command,
    script,
    start,
    succeeded,
    wait_until,
    write_bin,
)
from helpers import staging_leftovers as leftovers
from pilegpt import s3

T = 64  # block size of most tests: small, so the tiny data still makes thousands of samples


@pytest.fixture(scope="module")
def small_tokens(shakespeare_tokens) -> dict:
    """A train/val pair of real text, small enough for quick round trips."""
    return {"train": shakespeare_tokens[:40_001], "val": shakespeare_tokens[40_001:45_000]}


def watch_puts(monkeypatch, before=None) -> list[tuple[str, str]]:
    """Record ('start' | 'done', key) of every PutObject to_mds makes, in order; before(key) runs at each start.

    Wraps s3.make_client, the one factory of S3 clients, with botocore event hooks."""
    events, lock = [], threading.Lock()
    real_make_client = s3.make_client

    def make_client(endpoint_url=None, workers=s3.DEFAULT_WORKERS):
        client = real_make_client(endpoint_url, workers)

        def started(params, context, **kwargs):
            context["watched_key"] = params["Key"]
            with lock:
                events.append(("start", params["Key"]))
            if before is not None:
                before(params["Key"])

        def done(context, **kwargs):
            with lock:
                events.append(("done", context["watched_key"]))

        client.meta.events.register("before-parameter-build.s3.PutObject", started)
        client.meta.events.register("after-call.s3.PutObject", done)
        return client

    monkeypatch.setattr(s3, "make_client", make_client)
    return events


def test_a_failing_process_stops_the_run_with_one_line_and_writes_nothing(tmp_path, small_tokens):
    tokens = small_tokens["train"].copy()
    tokens[30_000] = 60_000  # out of the vocabulary, in a late shard: found by one of the processes
    data = write_bin(tmp_path / "data", {"train": tokens})
    out = tmp_path / "mds"
    # A fresh process, as a user runs it: forking the pool inside pytest, whose earlier tests left threads
    # running, can deadlock a child on a lock one of those threads held at the fork.
    result = run_command(script("to_mds.py", "--bin", data, "--out", out, "--block-size", T, "--size-limit", "64kb",
                                "--num-proc", 2))
    assert "token id 60000 at position 30000 is out of range" in failed_with_one_line(result, alone=True)
    assert not out.exists() and leftovers(tmp_path) == []


def test_cli_error_exit_code_and_single_line(tmp_path):
    """The real command line: exit code 2 and one line on stderr, no traceback."""
    result = run_command(script("to_mds.py", "--bin", tmp_path / "missing.bin", "--out", tmp_path / "mds",
                                "--block-size", 8))
    assert failed_with_one_line(result, alone=True) == (f"error: {tmp_path / 'missing.bin'} not found: pass a .bin "
                                                        "written by prepare_data.py, or its folder")
    assert not (tmp_path / "mds").exists()


def test_uint16_bin_with_a_vocabulary_of_every_uint16_id_converts_and_verifies(tmp_path):
    """--vocab-size 65536 on uint16: every id of the dtype is in the vocabulary (numpy 2.1 crashed, SIGSEGV,
    comparing a strided uint16 view with 65536); the highest id 65535 reaches the shards."""
    tokens = np.arange(4097, dtype=np.uint64).astype(np.uint16) * np.uint16(16)  # ids up to 65520
    tokens[-1] = 65535
    write_bin(tmp_path / "data", {"train": tokens}, meta=False)
    succeeded(run_command(script("to_mds.py", "--bin", tmp_path / "data" / "train.bin", "--out", tmp_path / "mds",
                                 "--block-size", 64, "--dtype", "uint16", "--vocab-size", 65536, "--verify"),
                          timeout=120))
    samples = read_mds(str(tmp_path / "mds"), tmp_path / "cache")
    assert len(samples) == 64 and int(samples[-1]["y"][-1]) == 65535


def test_killed_run_publishes_nothing_keeps_old_dataset_and_rerun_is_valid(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.integers(0, 50257, size=3_000_001, dtype=np.uint16)
    data = write_bin(tmp_path / "data", {"train": big})
    out = tmp_path / "mds"
    old = write_bin(tmp_path / "old", {"train": big[:10_001]})
    to_mds.main(["--bin", str(old), "--out", str(out), "--block-size", "100"])  # the dataset to protect
    old_files = {p.name: p.read_bytes() for p in (out / "train").iterdir()}

    args = ["--bin", str(data), "--out", str(out), "--block-size", "512", "--size-limit", "64kb", "--overwrite",
            "--num-proc", "2"]
    proc = start(script("to_mds.py", *args))  # ~190 shards: a long window to kill it in
    staging = tmp_path / f"mds.tmp-{proc.pid}"
    # mid-way: some shards written, far from done
    wait_until(lambda: list(staging.glob("train/shard.00002.*")), proc, "moment to interrupt the conversion", 120)
    pool = descendants(proc.pid)
    assert len(pool) >= 3, pool  # the fork server and the pool's 2 processes (pilegpt/mds/write.py's pool_context)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    deadline = time.monotonic() + 30  # the pool's processes end with it: none goes on writing the queued shards
    while [p for p in pool if Path(f"/proc/{p}").exists()] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pool if Path(f"/proc/{p}").exists() and "zombie" not in state(p)], pool
    assert staging.is_dir()  # the partial dataset lies under its temporary name ...
    assert {p.name: p.read_bytes() for p in (out / "train").iterdir()} == old_files  # ... the old one is intact

    assert to_mds.main(args + ["--verify"]) == 0
    assert leftovers(tmp_path) == []  # the dead run's staging folder was cleaned up
    assert json.loads((out / "train" / "to_mds.json").read_text())["num_samples"] == 3_000_000 // 512


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, theirs, ...), from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found, frontier = found + children, children
    return found


def state(pid: int) -> str:
    try:
        return next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State"))
    except (OSError, StopIteration):
        return "zombie (gone)"


@pytest.mark.s3
def test_remote_upload_reads_back_from_s3_with_index_uploaded_last(tmp_path, small_tokens, s3_env, monkeypatch):
    def slow_shards(key):  # slow shard uploads: an uploader that only waits for its queue would send the index first
        if key.rsplit("/", 1)[-1].startswith("shard."):
            time.sleep(0.3)

    puts = watch_puts(monkeypatch, slow_shards)
    data = write_bin(tmp_path / "data", small_tokens)
    remote = "s3://test-bucket/to_mds/shakespeare"
    assert to_mds.main(["--bin", str(data), "--remote", remote, "--block-size", str(T), "--size-limit", "64kb",
                        "--verify"]) == 0
    uploads = [tuple(key.split("/")[-2:]) for what, key in puts if what == "done"]  # (split, file), as completed
    for split in small_tokens:
        done = [name for s, name in uploads if s == split]
        assert done[-1] == "index.json" and done.count("index.json") == 1  # index last, after every shard
        assert len(done) > (4 if split == "train" else 2)
    index_starts = [i for i, (what, key) in enumerate(puts) if what == "start" and key.endswith("/index.json")]
    shard_dones = [i for i, (what, key) in enumerate(puts) if what == "done" and "/shard." in key]
    assert min(index_starts) > max(shard_dones)  # no index.json even starts before every shard is in place

    bucket_dir = s3_env.root / "test-bucket" / "to_mds" / "shakespeare"
    assert sorted(p.name for p in bucket_dir.iterdir()) == ["train", "val"]
    for split, tokens in small_tokens.items():
        samples = read_mds(f"{remote}/{split}", tmp_path / f"cache_{split}")
        n = (len(tokens) - 1) // T
        assert np.array_equal(np.stack([s["x"] for s in samples]).reshape(-1), tokens[:n * T])
        assert np.array_equal(np.stack([s["y"] for s in samples]).reshape(-1), tokens[1:n * T + 1])


@pytest.mark.s3
def test_remote_overwrite_replaces_dataset_and_leaves_no_staging(tmp_path, small_tokens, s3_env, capsys):
    data = write_bin(tmp_path / "data", {"train": small_tokens["train"]})
    remote = "s3://test-bucket/over/train"
    to_mds.main(["--bin", str(data / "train.bin"), "--remote", remote, "--block-size", "16",
                 "--size-limit", "64kb"])
    err = main_error(to_mds.main, ["--bin", data / "train.bin", "--remote", remote, "--block-size", "64"], capsys)
    assert "already holds a dataset" in err
    to_mds.main(["--bin", str(data / "train.bin"), "--remote", remote, "--block-size", "64", "--overwrite"])
    over = s3_env.root / "test-bucket" / "over"
    assert sorted(p.name for p in over.iterdir()) == ["train"]  # no train.tmp-<pid> left behind
    names = sorted(p.name for p in (over / "train").iterdir())
    index = json.loads((over / "train" / "index.json").read_text())
    assert names == sorted([s["zip_data"]["basename"] for s in index["shards"]] + ["index.json", "to_mds.json"])
    samples = read_mds(remote, tmp_path / "cache")
    assert len(samples) == (len(small_tokens["train"]) - 1) // 64
    assert np.array_equal(samples[-1]["y"], small_tokens["train"][len(samples) * 64 - 63:len(samples) * 64 + 1])


@pytest.mark.s3
def test_out_and_remote_hold_the_same_dataset_and_leftovers_of_a_dead_run_are_removed(tmp_path, small_tokens,
                                                                                       s3_env):
    data = write_bin(tmp_path / "data", {"train": small_tokens["train"]})
    remote_dir = s3_env.root / "test-bucket" / "both"
    remote_dir.mkdir()
    (remote_dir / "shard.00000.mds.zstd").write_bytes(b"partial")  # what a killed run leaves: shards, no index
    (remote_dir / "shard.00042.mds.zstd").write_bytes(b"partial")
    (remote_dir / "notes.txt").write_text("not ours")
    out = tmp_path / "mds"
    assert to_mds.main(["--bin", str(data / "train.bin"), "--out", str(out), "--remote", "s3://test-bucket/both",
                        "--block-size", str(T), "--size-limit", "64kb"]) == 0
    local = sorted(p.name for p in out.iterdir())
    assert sorted(p.name for p in remote_dir.iterdir()) == sorted(local + ["notes.txt"])
    for name in local:
        assert (out / name).read_bytes() == (remote_dir / name).read_bytes(), name
    samples = read_mds("s3://test-bucket/both", tmp_path / "cache")
    assert len(samples) == (len(small_tokens["train"]) - 1) // T


@pytest.mark.s3
def test_verify_names_a_shard_missing_from_s3(tmp_path, small_tokens, s3_env, capsys):
    data = write_bin(tmp_path / "data", {"train": small_tokens["train"]})
    remote = "s3://test-bucket/verify_missing/train"
    args = ["--bin", data / "train.bin", "--remote", remote]
    to_mds.main([str(a) for a in args + ["--block-size", T, "--size-limit", "64kb"]])
    s3_env.client().delete_object(Bucket="test-bucket", Key="verify_missing/train/shard.00001.mds.zstd")  # lost
    capsys.readouterr()
    err = main_error(to_mds.main, args + ["--verify"], capsys)
    assert err.startswith(f"error: {remote}/shard.00001.mds.zstd is missing, though {remote}/index.json lists it: "
                          "the dataset is incomplete; re-run to_mds.py with --overwrite"), err


@pytest.mark.s3
def test_missing_bucket_and_failed_upload_are_one_line_errors_that_publish_nothing(tmp_path, small_tokens, s3_env,
                                                                                   capsys, monkeypatch):
    data = write_bin(tmp_path / "data", small_tokens)
    args = ["--block-size", T, "--size-limit", "64kb"]
    err = main_error(to_mds.main, ["--bin", data, "--remote", "s3://no-such-bucket/x"] + args, capsys)
    assert "bucket 'no-such-bucket' does not exist" in err

    fail = {}

    def flaky_upload(key):
        if key == fail["key"]:
            raise ConnectionError("network down")

    watch_puts(monkeypatch, flaky_upload)
    flaky = s3_env.root / "test-bucket" / "flaky"
    # the second of train's 3 shards fails: the shards sent are removed, no index.json
    fail.update(key="flaky/shard.00001.mds.zstd")
    err = main_error(to_mds.main, ["--bin", data / "train.bin", "--remote", "s3://test-bucket/flaky", "--out",
                                   tmp_path / "mds"] + args, capsys, alone=False)  # after the progress bar
    assert "uploading to s3://test-bucket/flaky failed (ConnectionError: network down)" in err
    assert not flaky.exists() or [p for p in flaky.rglob("*") if p.is_file()] == []
    assert not (tmp_path / "mds").exists() and leftovers(tmp_path) == []
    # val fails after train was complete on S3: train is withdrawn too (all splits or none)
    fail.update(key="flaky/val/shard.00000.mds.zstd")
    err = main_error(to_mds.main, ["--bin", data, "--remote", "s3://test-bucket/flaky"] + args, capsys, alone=False)
    assert "uploading to s3://test-bucket/flaky/val failed" in err
    assert not flaky.exists() or [p for p in flaky.rglob("*") if p.is_file()] == []
