"""What train.py's loaders do with data in a run: .bin data of any size starts in seconds in bounded memory, nanoGPT's
folders train; ids outside the vocabulary, damaged shards, too little data, hostile indexes and data changed
under a run are one line through the command line, and a user's dataset folder is never written into. The
contract itself (meta.json, the window, the order): tests/unit/test_data.py."""

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import train
from helpers import (
    REPO,
    SMALL,
    failed_with_one_line,
    finish,
    kill_group,
    losses_by_batch,
    main_error,
    read_jsonl,
    run_command,
    run_train,
    start_train,
    streaming_dataset,
    succeeded,
    train_env,
    wait_until,
    write_mds,
    write_mds_splits,
)
from pilegpt import data
from pilegpt.common import UserError
from pilegpt.data import Meta, SplitInfo, write_token_files

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TRAIN = [*SMALL, "--device=cpu", "--sample_length=0", "--max_duration=2ba", "--eval_interval=2ba",
         "--eval_subset_num_batches=1", "--progress_bar=False"]


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ meta.json


# ------------------------------------------------------------------------------------- training order


def test_a_40_gb_bin_starts_in_seconds_and_bounded_memory(tmp_path):
    """A sparse 40 GB train.bin (20B tokens, 625M windows of 32): the old full index list took 19 GB."""
    folder = tmp_path / "big"
    folder.mkdir()
    n_tokens = 20_000_000_000
    for split, n in (("train", n_tokens), ("val", 10_000)):
        with open(folder / f"{split}.bin", "wb") as f:
            f.truncate(2 * n)
    Meta("gpt2", 50257, 50256, "uint16", {"train": SplitInfo("train.bin", n_tokens),
                                           "val": SplitInfo("val.bin", 10_000)}).write(folder)
    script = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
              "print('maxrss_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    train_py = [sys.executable, REPO / "train.py", f"--data_dir={folder}", *TRAIN, f"--save_folder={tmp_path / 'run'}"]
    out = succeeded(run_command([sys.executable, "-c", script, *train_py], env=train_env(), timeout=600))
    maxrss_gb = int(out.split("maxrss_kb")[1].split()[0]) / 2**20
    assert maxrss_gb < 3.0, f"peak RSS {maxrss_gb:.2f} GB"  # measured here: ~1 GB (torch + Composer themselves)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["batch"] for r in rows] == [1, 2]
    # From the Trainer's start to the end of batch 1 (it was 109 s for 3 batches with the index list).
    assert rows[0]["time_s"] < 30


# --------------------------------------------------------------------------------- what train.py reads

def test_a_nanogpt_data_folder_trains_as_uint16_gpt2_tokens(tmp_path, capsys):
    folder = tmp_path / "nanogpt"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 5000), ("val", 1000)):
        rng.integers(0, 50257, n).astype(np.uint16).tofile(folder / f"{split}.bin")  # nanoGPT's data/*/prepare.py
    train.main([f"--data_dir={folder}", *TRAIN, f"--save_folder={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert f"note: {folder} has no meta.json: reading its .bin files as nanoGPT's" in out
    assert sorted(losses_by_batch(tmp_path / "run")) == [1, 2]
    assert not (folder / data.META_NAME).exists()


def test_token_ids_outside_the_vocabulary_are_one_line_errors(tmp_path):
    tokens = np.full(4000, 60000, dtype=np.uint16)  # a .bin made with another (bigger) vocabulary
    write_token_files(tmp_path / "bin", {"train": tokens}, vocab_size=50257)  # ... but recorded as GPT-2's
    error = failed_with_one_line(run_train([f"--data_dir={tmp_path / 'bin'}", *TRAIN,
                                            f"--save_folder={tmp_path / 'run'}"], tmp_path))
    assert re.search(r"^error: \S+train.bin: token id 60000 at position \d+ is out of range for vocab_size 50257",
                     error)
    write_mds_splits(tmp_path / "mds", tokens[:2000])  # MDS without a record of its vocabulary: checked per batch
    (tmp_path / "mds" / "train" / data.TO_MDS_META).unlink()
    with pytest.raises(UserError, match="MDS data holds token id 60000, outside the model's vocab_size 50257"):
        train.main([f"--data_dir={tmp_path / 'mds'}", *TRAIN, f"--save_folder={tmp_path / 'run2'}",
                    f"--data_local={tmp_path / 'cache'}"])


def test_training_never_writes_into_a_local_mds_dataset_folder(tmp_path):
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(1).integers(0, 50257, 20_000).astype(np.uint16))
    before = tree(root)
    with pytest.raises(UserError, match="block_size is 64"):  # a refused run reads a sample first
        train.main([f"--data_dir={root}", *TRAIN, "--block_size=64", f"--save_folder={tmp_path / 'new' / 'r1'}",
                    f"--data_local={tmp_path / 'cache'}"])
    assert not (tmp_path / "new").exists()  # refused after its folder was made: it leaves nothing behind
    train.main([f"--data_dir={root}", *TRAIN, f"--save_folder={tmp_path / 'r2'}", f"--data_local={tmp_path / 'cache'}"])
    assert sorted(losses_by_batch(tmp_path / "r2")) == [1, 2]
    assert tree(root) == before  # the same files, byte for byte: the shards were decompressed in the cache
    assert list((tmp_path / "cache").rglob("shard.*.mds"))


def test_a_damaged_shard_stops_training_with_one_line(tmp_path):
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(2).integers(0, 50257, 20_000).astype(np.uint16))
    shard = sorted((root / "train").glob("shard.*.mds.zstd"))[1]
    damaged = bytearray(shard.read_bytes())
    damaged[-10] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    result = run_train([f"--data_dir={root}", *TRAIN, "--max_duration=30ba", f"--save_folder={tmp_path / 'run'}",
                        f"--data_local={tmp_path / 'cache'}"], tmp_path)
    error = failed_with_one_line(result)
    assert f"shard {shard.name} of {root / 'train'} does not match the checksum in its index.json" in error


@pytest.mark.parametrize("duration", ["1ep", "5ba"])
def test_mds_data_smaller_than_one_global_batch_is_refused_before_training(tmp_path, duration, capsys):
    """3 samples, a global batch of 4: "5ba" waited forever for a batch, "1ep" ended "done: 0 batches" with an
    untrained model.pt. "5ba" through the command line (its last line is the error), "1ep" in this process."""
    root = tmp_path / "mds"
    assert write_mds(root / "train", np.arange(3 * 32 + 1, dtype=np.uint16), 32, vocab_size=50257) == 3
    argv = [f"--data_dir={root}", *TRAIN, f"--max_duration={duration}",
            "--warmup=0ba" if duration == "5ba" else "--warmup=0ep", f"--save_folder={tmp_path / 'run'}",
            f"--data_local={tmp_path / 'cache'}"]
    if duration == "5ba":
        result = run_train(argv, tmp_path, timeout=120)
        line = failed_with_one_line(result)
        assert line == result[1].strip().splitlines()[-1]
    else:
        line = main_error(train.main, argv, capsys, alone=False)
    assert line == (f"error: the MDS train split of ['{root}'] has 3 samples of 32 tokens, fewer than one global batch "
                    "(4): lower --global_batch_size or use more data")
    assert not (tmp_path / "run" / "model.pt").exists()


# ------------------------------------------------------------------------------------------ hostile indexes

def hostile_index(split_dir: Path, name: str, kind: str = "zip_data") -> None:
    """Rewrite the index.json of split_dir so that its first shard's `kind` file is called `name`."""
    index = json.loads((split_dir / data.INDEX_NAME).read_text())
    index["shards"][0][kind]["basename"] = name
    (split_dir / data.INDEX_NAME).write_text(json.dumps(index))


@pytest.mark.parametrize("kind", ["zip_data", "raw_data"])
def test_an_index_naming_a_file_outside_its_folder_is_refused_and_the_file_kept(tmp_path, kind, capsys):
    """A shared dataset whose index names an existing file of the user's: training used to decompress the shard
    outside data_local and, the file failing the shard's checksum, delete it. zip_data through the command line (its
    last line is the error), raw_data in this process."""
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(3).integers(0, 50257, 20_000).astype(np.uint16))
    victim = tmp_path / "precious.txt"
    victim.write_text("the user's own file")
    hostile_index(root / "val", str(victim), kind)  # val: train/ is read first, so the whole index set is checked
    before = tree(tmp_path)
    argv = [f"--data_dir={root}", *TRAIN, f"--save_folder={tmp_path / 'run'}", f"--data_local={tmp_path / 'cache'}"]
    if kind == "zip_data":
        result = run_train(argv, tmp_path)
        line = failed_with_one_line(result)
        assert line == result[1].strip().splitlines()[-1]
    else:
        line = main_error(train.main, argv, capsys, alone=False)
    assert line == (
        f"error: {root / 'val' / 'index.json'} lists the shard file {str(victim)!r}, which is not a plain name inside "
        "its folder (an absolute path, '..', a backslash or an empty name): the index is damaged or hostile, nothing "
        "was read by that name; re-run to_mds.py")
    assert victim.read_text() == "the user's own file"
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith(("run/", "cache/"))} == before
    assert not (tmp_path / "cache").exists()  # refused before Streaming made its cache


def test_an_s3_index_naming_a_key_outside_its_prefix_is_one_line(s3_env, tmp_path):
    """From S3, a '..' key made Streaming retry forever (10 minutes, 100% CPU, ~1,000 sockets) until killed."""
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(4).integers(0, 50257, 20_000).astype(np.uint16))
    hostile_index(root / "train", "../../outside.mds.zstd")
    remote = s3_env.upload_tree(root, f"hostile-{os.getpid()}/mds")
    result = run_train([f"--data_remote={remote}", *TRAIN, f"--save_folder={tmp_path / 'run'}",
                        f"--data_local={tmp_path / 'cache'}"], tmp_path)
    assert failed_with_one_line(result) == (
        f"error: {remote}/train/index.json lists the shard file '../../outside.mds.zstd', which is not a plain name "
        "inside its folder (an absolute path, '..', a backslash or an empty name): the index is damaged or hostile, "
        "nothing was read by that name; re-run to_mds.py")
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------------------------- data changed under a run

def test_a_resume_on_other_bin_data_is_refused_unless_the_change_is_intended(tmp_path, capsys):
    """prepare_data --overwrite with other text, then --autoresume=True, continued silently on the new tokens."""
    rng = np.random.default_rng(5)
    write_token_files(tmp_path / "d", {"train": rng.integers(0, 50257, 20_000), "val": rng.integers(0, 50257, 3_000)})
    args = [f"--data_dir={tmp_path / 'd'}", *TRAIN, "--max_duration=2ba", f"--save_folder={tmp_path / 'run'}",
            "--run_name=changed"]
    train.main(args)
    record = json.loads((tmp_path / "run" / "data.json").read_text())
    assert record["splits"]["train"]["tokens"] == 20_000 and record["format"] == "bin"
    shutil.move(tmp_path / "d", tmp_path / "moved")  # the same data elsewhere is the same data
    train.main([*args, f"--data_dir={tmp_path / 'moved'}", "--max_duration=3ba", "--autoresume=True"])
    assert "resumed at batch 2" in capsys.readouterr().out

    write_token_files(tmp_path / "moved", {"train": rng.integers(0, 50257, 12_000),  # rebuilt: other, shorter text
                                           "val": rng.integers(0, 50257, 3_000)})
    refused = run_train([*args, f"--data_dir={tmp_path / 'moved'}", "--max_duration=4ba", "--autoresume=True"],
                        tmp_path)
    assert failed_with_one_line(refused) == refused[1].strip().splitlines()[-1] == (
        f"error: autoresume: {tmp_path / 'run'} was trained on other data: train.bin holds 12,000 tokens (the run had "
        f"20,000); val.bin holds other tokens (same count, another fingerprint) ({tmp_path / 'run' / 'data.json'}); "
        "resume on the data it was trained on, start a new run with another --run_name, or pass "
        "--data_changed_ok=True if the change is intended")
    assert sorted(losses_by_batch(tmp_path / "run")) == [1, 2, 3]  # nothing trained on the new data
    train.main([*args, f"--data_dir={tmp_path / 'moved'}", "--max_duration=4ba", "--autoresume=True",
                "--data_changed_ok=True"])
    out = capsys.readouterr().out
    assert "note: the data changed since the run's checkpoints (train.bin holds 12,000 tokens" in out
    assert "resumed at batch 3" in out
    assert json.loads((tmp_path / "run" / "data.json").read_text())["splits"]["train"]["tokens"] == 12_000


def test_a_rebuilt_mds_dataset_is_refused_on_resume_and_its_stale_cache_refreshed(tmp_path, capsys):
    """A rebuilt MDS folder trained on the stale cache of the old one."""
    root, cache = tmp_path / "mds", tmp_path / "cache"
    write_mds_splits(root, np.random.default_rng(6).integers(0, 50257, 20_000).astype(np.uint16))
    args = [f"--data_dir={root}", *TRAIN, "--max_duration=2ba", f"--save_folder={tmp_path / 'run'}",
            f"--data_local={cache}", "--run_name=rebuilt"]
    train.main(args)
    cached_index = next(cache.rglob("train/index.json"))
    assert cached_index.read_bytes() == (root / "train" / "index.json").read_bytes()
    shutil.rmtree(root)  # to_mds --overwrite with other data: the same shard names, other bytes
    write_mds_splits(root, np.random.default_rng(7).integers(0, 50257, 20_000).astype(np.uint16))
    refused = run_train([*args, "--max_duration=3ba", "--autoresume=True"], tmp_path)
    assert failed_with_one_line(refused) == refused[1].strip().splitlines()[-1]
    assert refused[1].strip().splitlines()[-1].startswith(
        f"error: autoresume: {tmp_path / 'run'} was trained on other data: {root}/train/index.json lists other "
        f"shards; {root}/val/index.json lists other shards ({tmp_path / 'run' / 'data.json'}); resume on the data")
    train.main([*args, "--max_duration=3ba", "--autoresume=True", "--data_changed_ok=True"])
    out = capsys.readouterr().out
    assert f"note: {cached_index.parent} held shards of an older version of the data: emptied" in out
    assert cached_index.read_bytes() == (root / "train" / "index.json").read_bytes()  # read from the new dataset
    assert "resumed at batch 2" in out




def test_two_runs_on_one_mds_dataset_with_one_data_local_is_one_line_naming_data_local(tmp_path):
    """A second run on the dataset, started while the first trains through the same cache (a local root, no
    remote), trained to its end beside it: Streaming's own check skips a dataset that has read a shard. It is one
    line naming data_local (not Streaming's advice to clean shared memory other runs hold); with a data_local of its
    own it trains beside the first, which trains on."""
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(8).integers(0, 50257, 20_000).astype(np.uint16))
    cache = tmp_path / "cache"
    args = [f"--data_dir={root}", *TRAIN, f"--data_local={cache}"]
    first = start_train([*args, "--max_duration=100000ba", "--eval_interval=100000ba", "--save_interval=100000ba",
                         f"--save_folder={tmp_path / 'run1'}", "--run_name=first",
                         "--callbacks={'faults:SlowBatches': {'seconds': 0.2}}"], tmp_path)
    try:
        wait_until((tmp_path / "run1" / "metrics.jsonl").exists, first, "the first run's first batch", seconds=240)
        second = [*args, f"--save_folder={tmp_path / 'run2'}", "--run_name=second"]
        line = failed_with_one_line(run_train(second, tmp_path))
        assert line == (f"error: MDS split train/ of {root}: another process on this machine reads it through the "
                        f"same cache under data_local={cache} (two runs on one dataset cannot share a cache): pass "
                        "this run --data_local=ANOTHER_FOLDER")
        # on 2 processes (issue 65): the local leader's refusal reaches every rank before Streaming's barrier, so
        # each says the same line and exits 2 (none fails waiting there for the leader), well within dist_timeout
        started = time.monotonic()
        code, out = run_train(second, tmp_path, nproc=2, launcher="pilegpt")
        assert code == 2 and "Traceback" not in out and "Connection closed" not in out, out[-4000:]
        assert {ln for ln in out.splitlines() if ln.startswith("error: ")} == {line}, out[-4000:]
        assert time.monotonic() - started < 120
        succeeded(run_train([*second, f"--data_local={tmp_path / 'cache2'}"], tmp_path))
        assert first.poll() is None  # the first run trains on
        assert len(read_jsonl(tmp_path / "run1" / "metrics.jsonl")) >= 1
    finally:
        kill_group(first)  # the run this test started, by its process group
        finish(first)


def test_a_run_on_an_s3_mds_root_another_process_reads_through_one_data_local_is_one_line(s3_env, tmp_path):
    """The same for an s3:// root: a StreamingDataset of this process (another run) has read its first sample
    through the cache a run on that root would use; the run is one line naming data_local."""
    from pilegpt.train.data.loaders import mds_cache_dir

    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(7).integers(0, 50257, 20_000).astype(np.uint16))
    remote = s3_env.upload_tree(root, f"shared-{os.getpid()}/mds")
    cache = tmp_path / "cache"
    other_run = streaming_dataset(remote=f"{remote}/train", local=mds_cache_dir(str(cache), remote, "train"),
                                  shuffle=False, batch_size=1)
    assert len(other_run[0]["x"]) == 32  # read, as a run reads its first sample at start
    args = [f"--data_remote={remote}", *TRAIN, f"--save_folder={tmp_path / 'run'}", f"--data_local={cache}"]
    line = failed_with_one_line(run_train(args, tmp_path))
    assert line == (f"error: MDS split train/ of {remote}: another process on this machine reads it through the same "
                    f"cache under data_local={cache} (two runs on one dataset cannot share a cache): pass this run "
                    "--data_local=ANOTHER_FOLDER")
    assert len(list(other_run)) == other_run.epoch_size  # the other run reads on


def test_an_mds_root_named_twice_in_one_run_and_roots_of_one_slug_train(tmp_path, one_torch_thread):
    """data_dir also named in eval_data (one val/ read by two eval sets), and data_mix roots `x/a_b` and `x/a/b`
    (one name once "/" is "_"): each reads through a cache folder of its own."""
    tokens = np.random.default_rng(9).integers(0, 50257, 20_000).astype(np.uint16)
    root = write_mds_splits(tmp_path / "x" / "a_b", tokens)
    write_mds_splits(tmp_path / "x" / "a" / "b", tokens[::-1].copy())
    common = [*TRAIN, f"--data_local={tmp_path / 'cache'}"]
    train.main([f"--data_dir={root}", *common, f"--eval_data={{'again': '{root}'}}",  # in this process, as it runs
                f"--save_folder={tmp_path / 'run1'}", "--run_name=twice"])
    last = read_jsonl(tmp_path / "run1" / "metrics.jsonl")[-1]
    assert last["again_loss"] == pytest.approx(last["val_loss"], rel=1e-6)  # the same samples, the same weights
    mix = {str(root): {"repeat": 1.0}, str(tmp_path / "x" / "a" / "b"): {"repeat": 1.0}}
    train.main([f"--data_mix={mix!r}", *common, f"--save_folder={tmp_path / 'run2'}", "--run_name=slugs"])
    last = read_jsonl(tmp_path / "run2" / "metrics.jsonl")[-1]
    assert {"val_loss", "a_b_loss", "b_loss"} <= set(last) and last["a_b_loss"] != last["b_loss"]
