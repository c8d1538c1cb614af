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


EOT = 50256


def documents(lengths: list[int], start: int = 0) -> np.ndarray:
    """Documents of these lengths (eot included), each token distinct (start, start+1, ...) but its last, EOT."""
    out, at = [], start
    for n in lengths:
        out += list(range(at, at + n - 1)) + [EOT]
        at += n - 1
    return np.array(out, dtype=np.int64)


def test_pack_rows_packs_documents_best_fit_longest_first_and_splits_what_fits_nowhere():
    # 4 rows of 10: a document of 25 tokens (pieces 0-9, 10-19, then 20-24), and documents at 25, 31, 35, 38
    tokens = documents([25, 6, 4, 3, 2])
    positions = data.pack_rows(tokens, EOT, 9)
    assert positions.tolist() == [list(range(0, 10)), list(range(10, 20)),
                                  list(range(25, 35)),  # 6 into an empty row, then 4 into its room of 4 (best fit)
                                  list(range(35, 40)) + list(range(20, 25))]  # 5, then 3 and 2 into the room left;
    # in a row, the documents that start there first: row 3 starts at document 35, the long one's rest after it
    rows = tokens[positions]
    assert np.array_equal(np.sort(rows.ravel()), np.sort(tokens))
    assert np.array_equal(data.pack_rows(tokens.copy(), EOT, 9), positions)  # a pure function of the tokens
    # 2 rows of 10 and documents of 7, 7, 6: the 6 fits no room of 3, so it fills both rooms, split where one ends
    assert data.pack_rows(documents([7, 7, 6]), EOT, 9).tolist() == [
        list(range(0, 7)) + [14, 15, 16], list(range(7, 14)) + [17, 18, 19]]


@pytest.mark.parametrize("seed", range(20))
def test_pack_rows_is_a_permutation_of_any_block(seed):
    rng = np.random.default_rng(seed)
    T = int(rng.integers(1, 40))
    R = int(rng.integers(1, 33))
    tokens = rng.integers(0, 4, size=R * (T + 1))  # eot = 0: documents of every length, empty ones too
    positions = data.pack_rows(tokens, 0, T)
    assert positions.shape == (R, T + 1) and np.array_equal(np.sort(positions.ravel()), np.arange(R * (T + 1)))
    with pytest.raises(ValueError, match="not a number of rows"):
        data.pack_rows(tokens[:-1], 0, T) if len(tokens) > 1 else data.pack_rows(np.zeros(T + 2), 0, T)


def test_doc_aligned_rows_cover_the_bin_once_start_at_documents_and_check_the_vocabulary(tmp_path):
    lengths = [int(n) for n in np.random.default_rng(0).integers(2, 30, size=400)]
    tokens = documents(lengths)
    write_token_files(tmp_path, {"train": tokens}, dtype="int32")
    T = 16
    ds = BinDataset(str(tmp_path / "train.bin"), block_size=T, dtype="int32", doc_aligned=True)
    assert len(ds) == len(tokens) // (T + 1) == data.num_aligned_rows(len(tokens), T)
    items = [ds[i] for i in range(len(ds))]
    assert all(torch_equal(it["x"][1:], it["y"][:-1]) for it in items)  # y = x shifted by one
    seen = np.concatenate([np.r_[it["x"].numpy(), it["y"].numpy()[-1:]] for it in items])
    kept = len(ds) * (T + 1)
    assert np.array_equal(np.sort(seen), np.sort(tokens[:kept]))  # every token of the rows' blocks once
    doc_starts = set(np.r_[0, np.flatnonzero(tokens == EOT) + 1].tolist())
    aligned = np.mean([int(np.flatnonzero(tokens == it["x"][0].item())[0]) in doc_starts for it in items])
    windows = np.mean([i * T in doc_starts for i in range(len(tokens) // T)])
    assert aligned > 0.85 and windows < 0.1  # documents of 2-29 tokens: rows start at one (0.88), windows rarely
    assert [ds[i]["x"].tolist() for i in (5, 40, 5)] == [items[5]["x"].tolist(), items[40]["x"].tolist(),
                                                          items[5]["x"].tolist()]  # any order, the same rows
    tokens[len(tokens) // 2] = 60000
    write_token_files(tmp_path, {"train": tokens}, dtype="int32")
    bad = BinDataset(str(tmp_path / "train.bin"), block_size=T, dtype="int32", vocab_size=50257,
                             doc_aligned=True)
    with pytest.raises(UserError, match=f"token id 60000 at position {len(tokens) // 2} is out of range"):
        [bad[i] for i in range(len(bad))]


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_doc_aligned_on_mds_needs_rows_to_mds_aligned_and_a_bin_run_records_it(tmp_path):
    from types import SimpleNamespace

    from pilegpt.train.run import data_record

    write_mds_splits(tmp_path / "mds", np.arange(2000, dtype=np.uint16))
    with pytest.raises(UserError, match=r"^doc_aligned=True, but .*mds/train holds to_mds.py's samples as written "
                                        r"\(no sampling recorded in a to_mds.json\): re-run to_mds.py --sampling "
                                        r"doc_aligned, or set doc_aligned=False$"):
        train.main([f"--data_dir={tmp_path / 'mds'}", *TRAIN, f"--save_folder={tmp_path / 'run'}",
                    f"--data_local={tmp_path / 'cache'}", "--doc_aligned=True"])
    assert not (tmp_path / "run").exists()  # refused after the run folder was made: nothing left behind
    mine = tmp_path / "mine"  # a folder the user had: kept as it was, no data.json added
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(UserError, match="^doc_aligned=True, but "):
        train.main([f"--data_dir={tmp_path / 'mds'}", *TRAIN, f"--save_folder={mine}",
                    f"--data_local={tmp_path / 'cache'}", "--doc_aligned=True"])
    assert [(p.name, p.read_text()) for p in mine.iterdir()] == [("notes.txt", "keep")]
    write_token_files(tmp_path / "bin", {"train": np.arange(5000) % 50257})
    record = {on: data_record.describe(SimpleNamespace(data_dir=str(tmp_path / "bin"), data_mix={}, data_remote=None,
                                                       data_format="auto", doc_aligned=on)) for on in (False, True)}
    assert "doc_aligned" not in record[False] and record[True]["doc_aligned"] == data.ALIGN_ROWS
    assert data_record.differences(record[False], record[True]) == [
        "doc_aligned=True (the run had False: its train samples are other rows of these tokens)"]
    assert data_record.differences(record[True], record[True]) == []


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
