"""Tests of to_mds.py: .bin -> MDS shards -> StreamingDataset, locally and through a real S3 server.

The .bin fixtures are written with data.write_token_files, the contract prepare_data.py writes through
(tiny Shakespeare tokenized with the repo's GPT-2 BPE, or synthetic tokens), so these tests do not depend
on prepare_data.py. Every StreamingDataset gets a fresh `local` folder: Streaming names its shared memory
after that folder. S3 uploads are watched through botocore's event hooks on the client s3.make_client
returns: every S3 request of to_mds goes through it.
"""

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import to_mds
from helpers import write_bin
from pilegpt import compat, s3
from pilegpt.common import run_main
from pilegpt.data import Meta
from pilegpt.mds.write import folder_bytes

REPO = Path(__file__).resolve().parents[1]
T = 64  # block size of most tests: small, so the tiny data still makes thousands of samples


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def small_tokens(shakespeare_tokens) -> dict:
    """A train/val pair of real text, small enough for quick round trips."""
    return {"train": shakespeare_tokens[:40_001], "val": shakespeare_tokens[40_001:45_000]}


def read_mds(source: str, local: Path) -> list[dict]:
    """Every sample of an MDS dataset, in order, read with StreamingDataset into a fresh cache."""
    from streaming import StreamingDataset

    compat.clean_stale_shared_memory()
    ds = StreamingDataset(remote=source, local=str(local), shuffle=False, batch_size=1)
    return [dict(s) for s in ds]


def run_cli(argv, capsys) -> tuple[int, str]:
    """Run to_mds as the command line does (run_main); return (exit code, stderr)."""
    with pytest.raises(SystemExit) as e:
        run_main(to_mds.main, [str(a) for a in argv])
    return e.value.code, capsys.readouterr().err


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


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


# ------------------------------------------------------------------------------------------------ round trip


def test_round_trip_folder_gives_back_every_token_with_y_shifted(tmp_path, small_tokens):
    data = write_bin(tmp_path / "data", small_tokens)
    assert to_mds.main(["--bin", str(data), "--out", str(tmp_path / "mds"), "--block-size", str(T)]) == 0

    for split, tokens in small_tokens.items():
        samples = read_mds(str(tmp_path / "mds" / split), tmp_path / f"cache_{split}")
        n = (len(tokens) - 1) // T
        assert len(samples) == n
        x = np.stack([s["x"] for s in samples])
        y = np.stack([s["y"] for s in samples])
        assert x.shape == y.shape == (n, T)
        assert np.array_equal(x.reshape(-1), tokens[:n * T])  # consecutive windows cover every token once
        assert np.array_equal(y.reshape(-1), tokens[1:n * T + 1])  # y = x shifted by one token
        assert np.array_equal(x[:, 1:], y[:, :-1])
        meta = json.loads((tmp_path / "mds" / split / "to_mds.json").read_text())
        assert meta["num_samples"] == n and meta["block_size"] == T
        assert meta["dropped_tail_tokens"] == len(tokens) - n * T - 1
    assert leftovers(tmp_path) == []


def test_single_bin_is_written_to_out_itself_and_verify_passes(tmp_path, small_tokens, capsys):
    data = write_bin(tmp_path / "data", {"train": small_tokens["train"]})
    out = tmp_path / "mds"
    assert to_mds.main(["--bin", str(data / "train.bin"), "--out", str(out), "--block-size", "100", "--verify"]) == 0
    assert (out / "index.json").is_file()
    printed = capsys.readouterr().out
    assert "400 samples" in printed and "verified" in printed
    # --verify alone on the existing dataset reads its settings from to_mds.json
    assert to_mds.main(["--bin", str(data / "train.bin"), "--out", str(out), "--verify"]) == 0
    assert "every token matches" in capsys.readouterr().out


def test_empty_val_split_is_skipped(tmp_path, small_tokens):
    data = write_bin(tmp_path / "data", {"train": small_tokens["train"], "val": []})
    assert to_mds.main(["--bin", str(data), "--out", str(tmp_path / "mds"), "--block-size", str(T)]) == 0
    assert sorted(p.name for p in (tmp_path / "mds").iterdir()) == ["train"]


def test_same_input_gives_byte_identical_shards(tmp_path, small_tokens):
    data = write_bin(tmp_path / "data", small_tokens)
    for name, workers in (("a", "1"), ("b", "3")):  # nor does the number of compressing threads matter
        to_mds.main(["--bin", str(data), "--out", str(tmp_path / name), "--block-size", str(T),
                     "--size-limit", "64kb", "--workers", workers])
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b and len([f for f in files_a if f.name.startswith("shard.")]) > 3
    for f in files_a:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    # ... and they are the files one plain Streaming MDSWriter writes for the same windows
    from streaming import MDSWriter

    tokens = small_tokens["train"]
    with MDSWriter(out=str(tmp_path / "plain"), columns={"x": f"ndarray:uint16:{T}", "y": f"ndarray:uint16:{T}"},
                   compression="zstd", hashes=["sha1", "xxh64"], size_limit="64kb") as writer:
        for i in range((len(tokens) - 1) // T):
            writer.write({"x": tokens[i * T:i * T + T], "y": tokens[i * T + 1:i * T + T + 1]})
    plain = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert plain == sorted(f.name for f in files_a if f.parent.name == "train" and f.name != "to_mds.json")
    for name in plain:
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "a" / "train" / name).read_bytes(), name


def dataset_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("sampling", ["sequential", "random"])
def test_num_proc_1_and_2_write_the_same_bytes_holding_the_bin_windows(tmp_path, small_tokens, sampling):
    data = write_bin(tmp_path / "data", small_tokens)
    args = ["--bin", data, "--block-size", T, "--size-limit", "64kb", "--sampling", sampling]
    if sampling == "random":
        args += ["--num-samples", "1500", "--seed", "5"]
    for n in (1, 2):
        assert to_mds.main([str(a) for a in args + ["--out", tmp_path / f"p{n}", "--num-proc", n]]) == 0
    one, two = dataset_files(tmp_path / "p1"), dataset_files(tmp_path / "p2")
    assert sorted(one) == sorted(two) and sum(n.startswith("train/shard.") for n in one) >= 3  # several shards
    for name in one:
        assert one[name] == two[name], name  # every shard, index.json and to_mds.json, byte for byte

    for split, tokens in small_tokens.items():
        samples = read_mds(str(tmp_path / "p2" / split), tmp_path / f"cache_{split}")
        if sampling == "random" and split == "train":  # nanoGPT's randint(len(data) - T)
            starts = np.random.default_rng(5).integers(0, len(tokens) - T, size=1500)
        else:
            starts = np.arange((len(tokens) - 1) // T) * T
        assert len(samples) == len(starts)
        for s, i in zip(samples, starts):
            assert np.array_equal(s["x"], tokens[i:i + T]) and np.array_equal(s["y"], tokens[i + 1:i + 1 + T])


@pytest.mark.slow  # a subprocess run of ~9 s
def test_a_failing_process_stops_the_run_with_one_line_and_writes_nothing(tmp_path, small_tokens, capsys):
    tokens = small_tokens["train"].copy()
    tokens[30_000] = 60_000  # out of the vocabulary, in a late shard: found by one of the processes
    data = write_bin(tmp_path / "data", {"train": tokens})
    out = tmp_path / "mds"
    # A fresh process, as a user runs it: forking the pool inside pytest, whose earlier tests left threads
    # running, can deadlock a child on a lock one of those threads held at the fork.
    proc = subprocess.run([sys.executable, str(REPO / "to_mds.py"), "--bin", str(data), "--out", str(out),
                           "--block-size", str(T), "--size-limit", "64kb", "--num-proc", "2"],
                          capture_output=True, text=True, timeout=300)
    code, err = proc.returncode, proc.stderr
    assert code == 2 and err.count("\n") == 1, err
    assert "token id 60000 at position 30000 is out of range" in err
    assert not out.exists() and leftovers(tmp_path) == []


def test_storage_stays_under_2_2_bytes_per_token_on_real_text(tmp_path, shakespeare_tokens, capsys):
    data = write_bin(tmp_path / "data", {"train": shakespeare_tokens})
    to_mds.main(["--bin", str(data), "--out", str(tmp_path / "mds"), "--block-size", "1024"])
    per_token = folder_bytes(tmp_path / "mds") / len(shakespeare_tokens)
    print(f"tiny shakespeare, block 1024, zstd: {per_token:.3f} bytes/token", file=sys.stderr)
    assert per_token <= 2.2
    assert f"{per_token:.3f} bytes/token" in capsys.readouterr().out  # the summary reports the same figure
    # without compression, x and y each cost 2 bytes per token: the bound is met by compression, not luck
    to_mds.main(["--bin", str(data), "--out", str(tmp_path / "raw"), "--block-size", "1024", "--compression", "none"])
    assert folder_bytes(tmp_path / "raw") / len(shakespeare_tokens) > 3.9


# ------------------------------------------------------------------------------------------------ random


def test_random_sampling_is_reproducible_and_matches_nanogpt_windows(tmp_path, small_tokens):
    data = write_bin(tmp_path / "data", small_tokens)
    args = ["--bin", str(data), "--block-size", str(T), "--sampling", "random", "--num-samples", "500"]
    to_mds.main(args + ["--out", str(tmp_path / "a"), "--seed", "7"])
    to_mds.main(args + ["--out", str(tmp_path / "b"), "--seed", "7"])
    to_mds.main(args + ["--out", str(tmp_path / "c"), "--seed", "8", "--verify"])
    shard = "train/shard.00000.mds.zstd"
    assert (tmp_path / "a" / shard).read_bytes() == (tmp_path / "b" / shard).read_bytes()
    assert (tmp_path / "a" / shard).read_bytes() != (tmp_path / "c" / shard).read_bytes()

    tokens = small_tokens["train"]
    samples = read_mds(str(tmp_path / "a" / "train"), tmp_path / "cache")
    starts = np.random.default_rng(7).integers(0, len(tokens) - T, size=500)  # nanoGPT: randint(len - T)
    assert len(samples) == 500
    for s, i in zip(samples, starts):
        assert np.array_equal(s["x"], tokens[i:i + T]) and np.array_equal(s["y"], tokens[i + 1:i + 1 + T])
    # val keeps sequential windows (every token once)
    assert json.loads((tmp_path / "a" / "val" / "to_mds.json").read_text())["sampling"] == "sequential"


# ------------------------------------------------------------------------------------------------ bad input


def bad_inputs(tmp_path: Path) -> dict:
    """name -> (argv, a piece of the expected message)."""
    good = write_bin(tmp_path / "good", {"train": np.arange(1000) % 50257})
    odd = write_bin(tmp_path / "odd", {"train": np.arange(1000)}, meta=False)
    with open(odd / "train.bin", "ab") as f:
        f.write(b"\x01")  # 2001 bytes: not whole uint16 tokens
    bare = write_bin(tmp_path / "bare", {"train": np.arange(1000)}, meta=False)
    oov = write_bin(tmp_path / "oov", {"train": np.r_[np.arange(500), 60000, np.arange(499)]})
    empty = write_bin(tmp_path / "empty", {})
    short = write_bin(tmp_path / "short", {"train": np.arange(1000)})
    meta = Meta.read(short)
    meta.splits["train"].tokens = 1200  # meta.json promises more tokens than train.bin holds
    meta.write(short)
    return {
        "odd_size": (["--bin", odd / "train.bin", "--dtype", "uint16", "--vocab-size", "50257"], "not a multiple of 2"),
        "block_too_big": (["--bin", good, "--block-size", "1000"], "too few for --block-size 1000"),
        "missing_file": (["--bin", tmp_path / "nope" / "train.bin"], "not found"),
        "missing_meta": (["--bin", bare / "train.bin"], "--dtype"),
        "out_of_range": (["--bin", oov], "token id 60000 at position 500 is out of range"),
        "meta_disagrees": (["--bin", short], "holds 1000 tokens but"),
        "no_splits": (["--bin", empty], "holds no train.bin or val.bin"),
        "bad_size_limit": (["--bin", good, "--size-limit", "lots"], "--size-limit lots"),
        "size_limit_below_sample": (["--bin", good, "--size-limit", "100"], "smaller than one sample"),
        "bad_compression": (["--bin", good, "--compression", "lzma"], "--compression lzma"),
        "random_without_count": (["--bin", good, "--sampling", "random"], "--num-samples"),
    }


BAD = ["odd_size", "block_too_big", "missing_file", "missing_meta", "out_of_range", "meta_disagrees", "no_splits",
       "bad_size_limit", "size_limit_below_sample", "bad_compression", "random_without_count"]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_error_and_writes_nothing(tmp_path, capsys, case):
    argv, message = bad_inputs(tmp_path)[case]
    out = tmp_path / "outs" / "mds"
    code, err = run_cli(argv + ["--out", out] + ([] if "--block-size" in argv else ["--block-size", "16"]), capsys)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not out.exists() and (not out.parent.exists() or leftovers(out.parent) == [])


def test_cli_error_exit_code_and_single_line(tmp_path):
    """The real command line: exit code 2 and one line on stderr, no traceback."""
    proc = subprocess.run([sys.executable, str(REPO / "to_mds.py"), "--bin", str(tmp_path / "missing.bin"),
                           "--out", str(tmp_path / "mds"), "--block-size", "8"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'missing.bin'} not found: pass a .bin "
                                                f"written by prepare_data.py, or its folder"]
    assert not (tmp_path / "mds").exists()


@pytest.mark.slow  # a subprocess run of ~9 s
def test_uint16_bin_with_a_vocabulary_of_every_uint16_id_converts_and_verifies(tmp_path):
    """--vocab-size 65536 on uint16: every id of the dtype is in the vocabulary (numpy 2.1 crashed, SIGSEGV,
    comparing a strided uint16 view with 65536); the highest id 65535 reaches the shards."""
    tokens = np.arange(4097, dtype=np.uint64).astype(np.uint16) * np.uint16(16)  # ids up to 65520
    tokens[-1] = 65535
    write_bin(tmp_path / "data", {"train": tokens}, meta=False)
    proc = subprocess.run([sys.executable, str(REPO / "to_mds.py"), "--bin", str(tmp_path / "data" / "train.bin"),
                           "--out", str(tmp_path / "mds"), "--block-size", "64", "--dtype", "uint16",
                           "--vocab-size", "65536", "--verify"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = read_mds(str(tmp_path / "mds"), tmp_path / "cache")
    assert len(samples) == 64 and int(samples[-1]["y"][-1]) == 65535


# ------------------------------------------------------------------------------------------------ overwrite


def test_existing_dataset_is_refused_then_replaced_with_overwrite(tmp_path, small_tokens, capsys):
    data = write_bin(tmp_path / "data", small_tokens)
    out = tmp_path / "mds"
    to_mds.main(["--bin", str(data), "--out", str(out), "--block-size", str(T)])
    before = (out / "train" / "shard.00000.mds.zstd").read_bytes()
    code, err = run_cli(["--bin", data, "--out", out, "--block-size", "32"], capsys)
    assert code == 2 and "already holds a dataset; pass --overwrite" in err
    assert (out / "train" / "shard.00000.mds.zstd").read_bytes() == before

    to_mds.main(["--bin", str(data), "--out", str(out), "--block-size", "32", "--overwrite"])
    assert json.loads((out / "train" / "to_mds.json").read_text())["block_size"] == 32
    assert len(read_mds(str(out / "train"), tmp_path / "cache")) == (len(small_tokens["train"]) - 1) // 32
    assert leftovers(tmp_path) == []


def test_overwrite_never_replaces_a_folder_that_is_not_a_dataset(tmp_path, small_tokens, capsys):
    data = write_bin(tmp_path / "data", small_tokens)
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    code, err = run_cli(["--bin", data, "--out", precious, "--block-size", str(T), "--overwrite"], capsys)
    assert code == 2 and "is not an MDS dataset" in err
    assert (precious / "notes.txt").read_text() == "keep me" and len(list(precious.iterdir())) == 1


def test_verify_detects_a_changed_bin_and_a_corrupt_shard(tmp_path, small_tokens, capsys):
    data = write_bin(tmp_path / "data", {"train": small_tokens["train"]})
    out = tmp_path / "mds"
    to_mds.main(["--bin", str(data), "--out", str(out), "--block-size", str(T)])
    tokens = small_tokens["train"].copy()
    tokens[T * 10 + 3] = (tokens[T * 10 + 3] + 1) % 50257  # same length, one token differs: sample 10
    tokens.tofile(data / "train.bin")
    code, err = run_cli(["--bin", data, "--out", out, "--verify"], capsys)
    assert code == 2 and "sample 10 column x differs" in err

    small_tokens["train"].tofile(data / "train.bin")
    shard = out / "train" / "shard.00000.mds.zstd"
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))
    code, err = run_cli(["--bin", data, "--out", out, "--verify"], capsys)
    assert code == 2 and "verify failed" in err


def damage(case: str, out: Path) -> str:
    """Damage the dataset in `out` as `case` says; return what the one-line error must say."""
    if case == "corrupt_index":
        (out / "index.json").write_text('{"shards": [')  # cut short, as by a full disk
        return f"error: {out / 'index.json'} is not a readable MDS index (Expecting value: line 1 column 13"
    if case == "index_without_shards":
        (out / "index.json").write_text('{"version": 2, "shards": []}')
        return f"error: {out / 'index.json'} lists no shards, so it is not an MDS index"
    if case == "missing_shard":
        (out / "shard.00001.mds.zstd").unlink()
        return f"error: {out / 'shard.00001.mds.zstd'} is missing, though {out / 'index.json'} lists it"
    if case == "truncated_shard":
        shard = out / "shard.00002.mds.zstd"
        size = shard.stat().st_size
        shard.write_bytes(shard.read_bytes()[:100])
        return f"error: {shard} is 100 bytes but {out / 'index.json'} says {size}: the shard is damaged"
    (out / "to_mds.json").write_text("{")  # corrupt_spec
    return f"error: {out / 'to_mds.json'} is not valid JSON"


@pytest.mark.parametrize("case", ["corrupt_index", "index_without_shards", "missing_shard", "truncated_shard",
                                  "corrupt_spec"])
def test_verify_of_a_damaged_dataset_is_one_line_naming_the_file_and_the_fix(tmp_path, small_tokens, capsys, case):
    data = write_bin(tmp_path / "data", {"train": small_tokens["train"]})
    out = tmp_path / "mds"
    to_mds.main(["--bin", str(data / "train.bin"), "--out", str(out), "--block-size", str(T), "--size-limit", "64kb"])
    expected = damage(case, out)
    code, err = run_cli(["--bin", data / "train.bin", "--out", out, "--verify"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(expected), err
    assert err.rstrip().endswith("re-run to_mds.py with --overwrite to rebuild the dataset" +
                                 (" (or put the shard back)" if case == "missing_shard" else "")), err


# ------------------------------------------------------------------------------------------------ interrupt


@pytest.mark.slow
def test_killed_run_publishes_nothing_keeps_old_dataset_and_rerun_is_valid(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.integers(0, 50257, size=3_000_001, dtype=np.uint16)
    data = write_bin(tmp_path / "data", {"train": big})
    out = tmp_path / "mds"
    old = write_bin(tmp_path / "old", {"train": big[:10_001]})
    to_mds.main(["--bin", str(old), "--out", str(out), "--block-size", "100"])  # the dataset to protect
    old_files = {p.name: p.read_bytes() for p in (out / "train").iterdir()}

    args = ["--bin", str(data), "--out", str(out), "--block-size", "512", "--size-limit", "64kb", "--overwrite"]
    argv = [sys.executable, str(REPO / "to_mds.py")] + args  # ~190 shards: a long window to kill it in
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = tmp_path / f"mds.tmp-{proc.pid}"
    deadline = time.time() + 120
    while not list(staging.glob("train/shard.00002.*")):  # mid-way: some shards written, far from done
        assert proc.poll() is None, "conversion ended before it could be interrupted"
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert staging.is_dir()  # the partial dataset lies under its temporary name ...
    assert {p.name: p.read_bytes() for p in (out / "train").iterdir()} == old_files  # ... the old one is intact

    assert to_mds.main(args + ["--verify"]) == 0
    assert leftovers(tmp_path) == []  # the dead run's staging folder was cleaned up
    assert json.loads((out / "train" / "to_mds.json").read_text())["num_samples"] == 3_000_000 // 512


# ------------------------------------------------------------------------------------------------ S3


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
    code, err = run_cli(["--bin", data / "train.bin", "--remote", remote, "--block-size", "64"], capsys)
    assert code == 2 and "already holds a dataset" in err
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
    code, err = run_cli(args + ["--verify"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {remote}/shard.00001.mds.zstd is missing, though {remote}/index.json lists it: "
                          "the dataset is incomplete; re-run to_mds.py with --overwrite"), err


@pytest.mark.s3
def test_missing_bucket_and_failed_upload_are_one_line_errors_that_publish_nothing(tmp_path, small_tokens, s3_env,
                                                                                   capsys, monkeypatch):
    data = write_bin(tmp_path / "data", small_tokens)
    args = ["--block-size", T, "--size-limit", "64kb"]
    code, err = run_cli(["--bin", data, "--remote", "s3://no-such-bucket/x"] + args, capsys)
    assert code == 2 and "bucket 'no-such-bucket' does not exist" in err and err.count("\n") == 1

    fail = {}

    def flaky_upload(key):
        if key == fail["key"]:
            raise ConnectionError("network down")

    watch_puts(monkeypatch, flaky_upload)
    flaky = s3_env.root / "test-bucket" / "flaky"
    # the second of train's 3 shards fails: the shards sent are removed, no index.json
    fail.update(key="flaky/shard.00001.mds.zstd")
    code, err = run_cli(["--bin", data / "train.bin", "--remote", "s3://test-bucket/flaky",
                         "--out", tmp_path / "mds"] + args, capsys)
    assert code == 2 and "uploading to s3://test-bucket/flaky failed (ConnectionError: network down)" in err
    assert not flaky.exists() or [p for p in flaky.rglob("*") if p.is_file()] == []
    assert not (tmp_path / "mds").exists() and leftovers(tmp_path) == []
    # val fails after train was complete on S3: train is withdrawn too (all splits or none)
    fail.update(key="flaky/val/shard.00000.mds.zstd")
    code, err = run_cli(["--bin", data, "--remote", "s3://test-bucket/flaky"] + args, capsys)
    assert code == 2 and "uploading to s3://test-bucket/flaky/val failed" in err
    assert not flaky.exists() or [p for p in flaky.rglob("*") if p.is_file()] == []
