"""data.py, the contract between the stages: meta.json, the window, the training order of .bin data, shard names
an index may hold, the MDS sample order of a run, and an MDS vocabulary bigger than the model's refused. What
train.py's loaders refuse or never do in a run: tests/e2e/test_data.py."""

import json

import numpy as np
import pytest

import train
from helpers import SMALL, write_mds_splits
from pilegpt import data
from pilegpt.common import UserError
from pilegpt.data import Meta, read_windows, window_starts, write_token_files
from pilegpt.train.data.bin_reader import BinDataset, permute, resumable_sampler

TRAIN = [*SMALL, "--device=cpu", "--sample_length=0", "--max_duration=2ba", "--eval_interval=2ba",
         "--eval_subset_num_batches=1", "--progress_bar=False"]


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


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1000, 4097])
def test_permute_is_a_permutation_that_depends_on_the_key(n):
    p = permute(np.arange(n), n, key=7)
    assert sorted(p.tolist()) == list(range(n))
    if n >= 1000:
        assert (p != permute(np.arange(n), n, key=8)).mean() > 0.9
        assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.1  # no trace of the input order


def test_sampler_covers_every_window_once_per_epoch_ranks_disjoint_and_resumes_exactly(tmp_path):
    write_token_files(tmp_path, {"train": np.arange(10_001)})
    ds = BinDataset(str(tmp_path / "train.bin"), block_size=10)  # 1000 windows
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


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_rows_to_mds_aligned_or_a_run_on_them_are_one_line_naming_the_removed_setting(tmp_path):
    """doc_aligned was removed (removed.REMOVED_SETTINGS): MDS that to_mds.py --sampling doc_aligned wrote is refused in
    one line, after the run folder was made, which is then gone; a data.json of such a run names it on autoresume."""
    import json
    from types import SimpleNamespace

    from pilegpt.train.run import data_record

    write_mds_splits(tmp_path / "mds", np.arange(2000, dtype=np.uint16))
    (tmp_path / "mds" / "train" / data.TO_MDS_META).write_text(json.dumps({"sampling": "doc_aligned"}))
    says = (r"^.*mds/train holds to_mds.py --sampling doc_aligned rows: doc_aligned was removed after ac879ff \(no "
            r"preset used it; docs/performance.md has its measurement\): re-run to_mds.py without --sampling "
            r"doc_aligned, or train on it with pile-gpt ac879ff$")
    with pytest.raises(UserError, match=says):
        train.main([f"--data_dir={tmp_path / 'mds'}", *TRAIN, f"--save_folder={tmp_path / 'run'}",
                    f"--data_local={tmp_path / 'cache'}"])
    assert not (tmp_path / "run").exists()  # refused after the run folder was made: nothing left behind
    mine = tmp_path / "mine"  # a folder the user had: kept as it was, no data.json added
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match=says):
        train.main([f"--data_dir={tmp_path / 'mds'}", *TRAIN, f"--save_folder={mine}",
                    f"--data_local={tmp_path / 'cache'}"])
    assert [(p.name, p.read_text()) for p in mine.iterdir()] == [("notes.txt", "keep")]
    write_token_files(tmp_path / "bin", {"train": np.arange(5000) % 50257})
    now = data_record.describe(SimpleNamespace(data_dir=str(tmp_path / "bin"), data_mix={}, data_remote=None,
                                               data_format="auto"))
    assert "doc_aligned" not in now and data_record.differences(now, now) == []
    assert data_record.differences({**now, "doc_aligned": 32}, now) == [
        "windows of its train tokens (it trained on doc_aligned=True's packed rows; doc_aligned was removed after "
        "ac879ff)"]


def test_an_mds_dataset_made_with_a_bigger_vocabulary_is_refused(tmp_path):
    write_mds_splits(tmp_path / "mds", np.arange(2000, dtype=np.uint16), vocab_size=50304)
    with pytest.raises(UserError, match="made with a vocabulary of 50304 tokens but vocab_size is 50257: pass "
                                        "--vocab_size=50304"):
        train.main([f"--data_dir={tmp_path / 'mds'}", *TRAIN, f"--save_folder={tmp_path / 'run'}",
                    f"--data_local={tmp_path / 'cache'}"])


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


def test_a_checksum_failure_never_deletes_a_file_outside_the_cache(tmp_path):
    from pilegpt.train.data.mds_reader import describe_read_failure

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


def test_the_mds_sample_order_is_the_runs_on_any_number_of_nodes_that_can_keep_it(tmp_path):
    """num_canonical_nodes: a new run's node count (or the config's), then the one in data.json on every resume;
    a node count that cannot keep it, or a config that contradicts it, is one line."""
    from types import SimpleNamespace

    from pilegpt.train.run import data_record

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
