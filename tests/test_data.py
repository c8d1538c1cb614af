"""data.py, the contract between the stages: meta.json, the window, the training order of .bin data at any
size, and what train.py's loaders refuse (ids outside the vocabulary, damaged shards) or never do (write
into a user's dataset folder)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from helpers import REPO, SMALL, losses_by_batch, read_jsonl, write_mds
from pilegpt import data, loaders
from pilegpt.common import UserError
from pilegpt.data import Meta, SplitInfo, read_windows, window_starts, write_token_files
from pilegpt.loaders import permute, resumable_sampler

TRAIN = [*SMALL, "--device=cpu", "--sample_length=0", "--max_duration=2ba", "--eval_interval=2ba",
         "--eval_subset_num_batches=1", "--progress_bar=False"]


def write_mds_splits(root: Path, tokens: np.ndarray, block_size: int = 32, vocab_size: int = 50257) -> Path:
    """train/ (90%) and val/ (10%) MDS datasets as to_mds writes them: zstd shards with sha1/xxh64 hashes."""
    cut = len(tokens) * 9 // 10
    for split, part in (("train", tokens[:cut]), ("val", tokens[cut:])):
        write_mds(root / split, part, block_size, size_limit=1 << 14, compression="zstd", hashes=["sha1", "xxh64"],
                  vocab_size=vocab_size)
    return root


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ meta.json

def test_meta_round_trips_and_keeps_provenance_flat(tmp_path):
    meta = write_token_files(tmp_path, {"train": np.array([1, 50256, 2, 50256]), "val": np.array([3, 50256])},
                             sources={"input": ["a.txt"]})
    record = json.loads((tmp_path / data.META_NAME).read_text())
    assert record["splits"]["train"] == {"file": "train.bin", "tokens": 4, "documents": 2}
    assert record["sources"] == {"input": ["a.txt"]} and "info" not in record
    again = Meta.read(tmp_path)
    assert again == meta and again.token_count(tmp_path, "val") == 2


@pytest.mark.parametrize("change, message", [
    ({"dtype": "float32"}, "dtype 'float32' is not one of"),
    ({"vocab_size": 70000}, "vocab_size 70000 does not fit in uint16"),
    ({"eot_token": 50257}, "eot_token 50257 is outside the vocabulary"),
    ({"splits": None}, "not a valid meta.json"),
])
def test_a_bad_meta_json_is_one_clear_error(tmp_path, change, message):
    write_token_files(tmp_path, {"train": np.arange(10)})
    record = {**json.loads((tmp_path / data.META_NAME).read_text()), **change}
    (tmp_path / data.META_NAME).write_text(json.dumps(record))
    with pytest.raises(UserError, match=message):
        Meta.read(tmp_path)


def test_vocab_sizes_at_the_limit_of_each_dtype():
    Meta("x", 65536, 0, "uint16", {})  # ids 0..65535 fit in uint16
    with pytest.raises(ValueError, match="does not fit in uint16"):
        Meta("x", 65537, 0, "uint16", {})
    Meta("x", 65537, 0, "uint32", {})


def test_a_truncated_bin_is_refused_naming_the_file(tmp_path):
    write_token_files(tmp_path, {"train": np.arange(100)})
    with open(tmp_path / "train.bin", "r+b") as f:
        f.truncate(101)
    with pytest.raises(UserError, match="train.bin is 101 bytes, not a multiple of 2"):
        Meta.read(tmp_path).token_count(tmp_path, "train")


def test_the_window_is_t_plus_one_tokens_and_y_is_x_shifted():
    tokens = np.arange(100, dtype=np.uint16)
    starts = window_starts(len(tokens), 10)
    assert starts.tolist() == list(range(0, 90, 10))  # (100 - 1) // 10 = 9 windows
    x, y = read_windows(tokens, starts, 10)
    assert x[3].tolist() == list(range(30, 40)) and y[3].tolist() == list(range(31, 41))
    xr, yr = read_windows(tokens, np.array([7, 2]), 10)  # scattered starts read the same way
    assert xr[0].tolist() == list(range(7, 17)) and yr[1].tolist() == list(range(3, 13))


# ------------------------------------------------------------------------------------- training order

@pytest.mark.parametrize("n", [1, 2, 3, 10, 1000, 4097])
def test_permute_is_a_permutation_that_depends_on_the_key(n):
    p = permute(np.arange(n), n, key=7)
    assert sorted(p.tolist()) == list(range(n))
    if n >= 1000:
        assert (p != permute(np.arange(n), n, key=8)).mean() > 0.9
        assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.1  # no trace of the input order


def test_sampler_covers_every_window_once_per_epoch_ranks_disjoint_and_resumes_exactly(tmp_path):
    write_token_files(tmp_path, {"train": np.arange(10_001)})
    ds = loaders.BinDataset(str(tmp_path / "train.bin"), block_size=10)  # 1000 windows
    samplers = [resumable_sampler(ds, world_size=3, rank=r, seed=5) for r in range(3)]
    epoch0 = [list(s) for s in samplers]
    assert [len(e) for e in epoch0] == [333] * 3
    everything = sum(epoch0, [])
    assert len(set(everything)) == 999 and set(everything) <= set(range(1000))  # drop_last: 1 left out
    for s in samplers:
        s.set_epoch(1)
    epoch1 = list(samplers[0])
    assert sorted(epoch1) != sorted(epoch0[0]) and len(epoch1) == 333  # a new shuffle each epoch
    samplers[0].set_epoch(0)
    ds.load_state_dict(ds.state_dict(num_samples=30, from_beginning=True))  # 30 samples over 3 ranks
    assert list(samplers[0]) == epoch0[0][10:]
    assert list(samplers[0]) == epoch0[0]  # the skip applies once, to the resumed epoch


@pytest.mark.slow
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
    out = subprocess.run([sys.executable, "-c", script, sys.executable, str(REPO / "train.py"), f"--data_dir={folder}",
                          *TRAIN, f"--save_folder={tmp_path / 'run'}"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    maxrss_gb = int(out.stdout.split("maxrss_kb")[1].split()[0]) / 2**20
    assert maxrss_gb < 3.0, f"peak RSS {maxrss_gb:.2f} GB"  # measured here: ~1 GB (torch + Composer themselves)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["batch"] for r in rows] == [1, 2]
    # From the Trainer's start to the end of batch 1 (it was 109 s for 3 batches with the index list).
    assert rows[0]["time_s"] < 30


# --------------------------------------------------------------------------------- what train.py reads

@pytest.mark.slow
def test_a_nanogpt_data_folder_trains_as_uint16_gpt2_tokens(tmp_path, capsys):
    folder = tmp_path / "nanogpt"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 5000), ("val", 1000)):
        rng.integers(0, 50257, n).astype(np.uint16).tofile(folder / f"{split}.bin")  # nanoGPT's prepare.py
    train.main([f"--data_dir={folder}", *TRAIN, f"--save_folder={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert f"note: {folder} has no meta.json: reading its .bin files as nanoGPT's" in out
    assert sorted(losses_by_batch(tmp_path / "run")) == [1, 2]
    assert not (folder / data.META_NAME).exists()


@pytest.mark.slow
def test_token_ids_outside_the_vocabulary_are_one_line_errors(tmp_path):
    tokens = np.full(4000, 60000, dtype=np.uint16)  # a .bin made with another (bigger) vocabulary
    write_token_files(tmp_path / "bin", {"train": tokens}, vocab_size=50257)  # ... but recorded as GPT-2's
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"--data_dir={tmp_path / 'bin'}", *TRAIN,
                             f"--save_folder={tmp_path / 'run'}"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.search(r"^error: \S+train.bin: token id 60000 at position \d+ is out of range for vocab_size 50257",
                     result.stderr, re.MULTILINE)
    write_mds_splits(tmp_path / "mds", tokens[:2000])  # MDS without a record of its vocabulary: checked per batch
    (tmp_path / "mds" / "train" / data.TO_MDS_META).unlink()
    with pytest.raises(UserError, match="MDS data holds token id 60000, outside the model's vocab_size 50257"):
        train.main([f"--data_dir={tmp_path / 'mds'}", *TRAIN, f"--save_folder={tmp_path / 'run2'}",
                    f"--data_local={tmp_path / 'cache'}"])


def test_an_mds_dataset_made_with_a_bigger_vocabulary_is_refused(tmp_path):
    write_mds_splits(tmp_path / "mds", np.arange(2000, dtype=np.uint16), vocab_size=50304)
    with pytest.raises(UserError, match="made with a vocabulary of 50304 tokens but vocab_size is 50257: pass "
                                        "--vocab_size=50304"):
        train.main([f"--data_dir={tmp_path / 'mds'}", *TRAIN, f"--save_folder={tmp_path / 'run'}",
                    f"--data_local={tmp_path / 'cache'}"])


@pytest.mark.slow
def test_training_never_writes_into_a_local_mds_dataset_folder(tmp_path):
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(1).integers(0, 50257, 20_000).astype(np.uint16))
    before = tree(root)
    with pytest.raises(UserError, match="block_size is 64"):  # a refused run reads a sample first
        train.main([f"--data_dir={root}", *TRAIN, "--block_size=64", f"--save_folder={tmp_path / 'r1'}",
                    f"--data_local={tmp_path / 'cache'}"])
    train.main([f"--data_dir={root}", *TRAIN, f"--save_folder={tmp_path / 'r2'}", f"--data_local={tmp_path / 'cache'}"])
    assert sorted(losses_by_batch(tmp_path / "r2")) == [1, 2]
    assert tree(root) == before  # the same files, byte for byte: the shards were decompressed in the cache
    assert list((tmp_path / "cache").rglob("shard.*.mds"))


@pytest.mark.slow
def test_a_damaged_shard_stops_training_with_one_line(tmp_path):
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(2).integers(0, 50257, 20_000).astype(np.uint16))
    shard = sorted((root / "train").glob("shard.*.mds.zstd"))[1]
    damaged = bytearray(shard.read_bytes())
    damaged[-10] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"--data_dir={root}", *TRAIN,
                             "--max_duration=30ba", f"--save_folder={tmp_path / 'run'}",
                             f"--data_local={tmp_path / 'cache'}"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"shard {shard.name} of {root / 'train'} does not match the checksum in its index.json" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("duration", ["1ep", "5ba"])
def test_mds_data_smaller_than_one_global_batch_is_refused_before_training(tmp_path, duration):
    """3 samples, a global batch of 4: "5ba" waited forever for a batch, "1ep" ended "done: 0 batches" with an
    untrained model.pt."""
    root = tmp_path / "mds"
    assert write_mds(root / "train", np.arange(3 * 32 + 1, dtype=np.uint16), 32, vocab_size=50257) == 3
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"--data_dir={root}", *TRAIN,
                             f"--max_duration={duration}", "--warmup=0ba" if duration == "5ba" else "--warmup=0ep",
                             f"--save_folder={tmp_path / 'run'}", f"--data_local={tmp_path / 'cache'}"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: the MDS train split of ['{root}'] has 3 samples of 32 tokens, fewer than one global batch (4): "
        "lower --global_batch_size or use more data")
    assert not (tmp_path / "run" / "model.pt").exists()
