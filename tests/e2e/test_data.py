"""data.py, the contract between the stages: meta.json, the window, the training order of .bin data at any
size, and what train.py's loaders refuse (ids outside the vocabulary, damaged shards) or never do (write
into a user's dataset folder)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from helpers import REPO, SMALL, losses_by_batch, read_jsonl, write_mds
from pilegpt import data
from pilegpt.common import UserError
from pilegpt.data import Meta, SplitInfo, read_windows, window_starts, write_token_files
from pilegpt.train import loaders
from pilegpt.train.loaders import permute, resumable_sampler

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


# ------------------------------------------------------------------------------------------ hostile indexes

def hostile_index(split_dir: Path, name: str, kind: str = "zip_data") -> None:
    """Rewrite the index.json of split_dir so that its first shard's `kind` file is called `name`."""
    index = json.loads((split_dir / data.INDEX_NAME).read_text())
    index["shards"][0][kind]["basename"] = name
    (split_dir / data.INDEX_NAME).write_text(json.dumps(index))


@pytest.mark.parametrize("name", ["/etc/passwd", "../victim", "a/../../victim", "sub\\..\\..\\victim", "", ".", "a//b",
                                  "./shard.00000.mds", "x\0y"])
def test_a_shard_name_reaching_outside_its_folder_makes_the_index_unreadable(name):
    index = json.dumps({"version": 2, "shards": [{"raw_data": {"basename": "shard.00000.mds", "bytes": 1},
                                                  "zip_data": {"basename": name, "bytes": 1}}]})
    with pytest.raises(UserError, match=r"^mds/train/index.json lists the shard file .* not a plain name inside its "
                                        r"folder .* nothing was read by that name; re-run to_mds.py$"):
        data.listed_shards(index, "mds/train/index.json", "re-run to_mds.py")
    assert not data.is_plain_name(name)
    assert data.is_plain_name("shard.00000.mds.zstd") and data.is_plain_name("sub/shard.00000.mds")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["zip_data", "raw_data"])
def test_an_index_naming_a_file_outside_its_folder_is_refused_and_the_file_kept(tmp_path, kind):
    """A shared dataset whose index names an existing file of the user's: training used to decompress the shard
    outside data_local and, the file failing the shard's checksum, delete it."""
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(3).integers(0, 50257, 20_000).astype(np.uint16))
    victim = tmp_path / "precious.txt"
    victim.write_text("the user's own file")
    hostile_index(root / "val", str(victim), kind)  # val: train/ is read first, so the whole index set is checked
    before = tree(tmp_path)
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"--data_dir={root}", *TRAIN,
                             f"--save_folder={tmp_path / 'run'}", f"--data_local={tmp_path / 'cache'}"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {root / 'val' / 'index.json'} lists the shard file {str(victim)!r}, which is not a plain name inside "
        "its folder (an absolute path, '..', a backslash or an empty name): the index is damaged or hostile, nothing "
        "was read by that name; re-run to_mds.py")
    assert victim.read_text() == "the user's own file"
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith(("run/", "cache/"))} == before
    assert not (tmp_path / "cache").exists()  # refused before Streaming made its cache


def test_a_checksum_failure_never_deletes_a_file_outside_the_cache(tmp_path):
    from pilegpt.train.mds_reader import describe_read_failure

    cache, victim = tmp_path / "cache" / "mds" / "train", tmp_path / "precious.txt"
    cache.mkdir(parents=True)
    victim.write_text("keep")
    for path in (victim, cache / ".." / ".." / ".." / "precious.txt"):
        line = describe_read_failure(ValueError(f"Checksum failure: {path}"), "mds/train", [str(cache)])
        assert line.startswith("shard precious.txt of mds/train does not match the checksum")
        assert victim.read_text() == "keep"
    (cache / "shard.00000.mds.zstd").write_bytes(b"damaged")  # a damaged cache copy is removed: it is downloaded again
    describe_read_failure(ValueError(f"Checksum failure: {cache / 'shard.00000.mds.zstd'}"), "x", [str(cache)])
    assert not (cache / "shard.00000.mds.zstd").exists()


@pytest.mark.slow
def test_an_s3_index_naming_a_key_outside_its_prefix_is_one_line(s3_env, tmp_path):
    """From S3, a '..' key made Streaming retry forever (10 minutes, 100% CPU, ~1,000 sockets) until killed."""
    root = write_mds_splits(tmp_path / "mds", np.random.default_rng(4).integers(0, 50257, 20_000).astype(np.uint16))
    hostile_index(root / "train", "../../outside.mds.zstd")
    remote = s3_env.upload_tree(root, f"hostile-{os.getpid()}/mds")
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"--data_remote={remote}", *TRAIN,
                             f"--save_folder={tmp_path / 'run'}", f"--data_local={tmp_path / 'cache'}"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={**os.environ, **s3_env.env()})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {remote}/train/index.json lists the shard file '../../outside.mds.zstd', which is not "
                      "a plain name inside its folder (an absolute path, '..', a backslash or an empty name): the "
                      "index is damaged or hostile, nothing was read by that name; re-run to_mds.py"]
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------------------------- data changed under a run

def train_cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "train.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.slow
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
    refused = train_cli(*args, f"--data_dir={tmp_path / 'moved'}", "--max_duration=4ba", "--autoresume=True",
                        cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
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


@pytest.mark.slow
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
    refused = train_cli(*args, "--max_duration=3ba", "--autoresume=True", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1].startswith(
        f"error: autoresume: {tmp_path / 'run'} was trained on other data: {root}/train/index.json lists other "
        f"shards; {root}/val/index.json lists other shards ({tmp_path / 'run' / 'data.json'}); resume on the data")
    train.main([*args, "--max_duration=3ba", "--autoresume=True", "--data_changed_ok=True"])
    out = capsys.readouterr().out
    assert f"note: {cached_index.parent} held shards of an older version of the data: emptied" in out
    assert cached_index.read_bytes() == (root / "train" / "index.json").read_bytes()  # read from the new dataset
    assert "resumed at batch 2" in out


def test_the_mds_sample_order_is_the_runs_on_any_number_of_nodes_that_can_keep_it(tmp_path):
    """num_canonical_nodes: a new run's node count (or the config's), then the one in data.json on every resume;
    a node count that cannot keep it, or a config that contradicts it, is one line."""
    from types import SimpleNamespace

    from pilegpt.train import data_record

    unset, four = SimpleNamespace(num_canonical_nodes=None), SimpleNamespace(num_canonical_nodes=4)
    assert data_record.canonical_nodes(unset, None, 2) == 2 and data_record.canonical_nodes(four, None, 2) == 4
    data_record.write({"format": "mds", "num_canonical_nodes": 4}, str(tmp_path))
    assert [data_record.canonical_nodes(unset, str(tmp_path), n) for n in (1, 2, 4, 8)] == [4, 4, 4, 4]
    assert data_record.canonical_nodes(four, str(tmp_path), 1) == 4
    with pytest.raises(UserError, match=r"num_canonical_nodes=4 .*which 3 nodes cannot keep .*divides 4"):
        data_record.canonical_nodes(unset, str(tmp_path), 3)
    with pytest.raises(UserError, match=r"num_canonical_nodes=2, but the run's MDS sample order was fixed with 4"):
        data_record.canonical_nodes(SimpleNamespace(num_canonical_nodes=2), str(tmp_path), 2)
    data_record.write({"format": "mds"}, str(tmp_path))  # a data.json from before: the node count of the resume
    assert data_record.canonical_nodes(unset, str(tmp_path), 2) == 2
