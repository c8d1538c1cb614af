"""to_mds.py in this process: .bin -> MDS shards -> StreamingDataset, every token back, byte-identical shards for
any --num-proc, random sampling as nanoGPT's, bad input and damaged datasets as one line, --overwrite, --verify.
Its command line, a kill, and S3: tests/e2e/test_to_mds.py.

The .bin fixtures are written with data.write_token_files, the contract prepare_data.py writes through
(tiny Shakespeare tokenized with the repo's GPT-2 BPE, or synthetic tokens), so these tests do not depend
on prepare_data.py. Every StreamingDataset gets a fresh `local` folder: Streaming names its shared memory
after that folder (helpers.read_mds).
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import to_mds
from helpers import main_error, read_mds, write_bin
from helpers import staging_leftovers as leftovers
from pilegpt.data import SUBSETS_NAME, Meta, subset_folder, write_token_files
from pilegpt.mds.write import folder_bytes

T = 64  # block size of most tests: small, so the tiny data still makes thousands of samples


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def small_tokens(shakespeare_tokens) -> dict:
    """A train/val pair of real text, small enough for quick round trips."""
    return {"train": shakespeare_tokens[:40_001], "val": shakespeare_tokens[40_001:45_000]}


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


def test_doc_aligned_rows_are_gone_one_line_for_a_dataset_that_has_them_and_argparses_for_the_flag(
        tmp_path, small_tokens, capsys):
    """--sampling doc_aligned was removed with train.py's doc_aligned (removed.REMOVED_SETTINGS): the flag is argparse's
    own refusal, and --verify of a dataset whose to_mds.json records such rows is one line naming the fix."""
    data = write_bin(tmp_path / "data", small_tokens)
    with pytest.raises(SystemExit) as e:
        to_mds.main(["--bin", str(data), "--out", str(tmp_path / "a"), "--sampling", "doc_aligned"])
    assert e.value.code == 2 and "invalid choice: 'doc_aligned'" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    out = tmp_path / "mds"
    assert to_mds.main(["--bin", str(data), "--out", str(out), "--block-size", str(T)]) == 0
    spec = json.loads((out / "train" / "to_mds.json").read_text())
    (out / "train" / "to_mds.json").write_text(json.dumps({**spec, "sampling": "doc_aligned", "align_rows": 32}))
    err = main_error(to_mds.main, ["--bin", data, "--out", out, "--verify"], capsys)
    assert err == (f"error: {out / 'train' / 'to_mds.json'} records --sampling doc_aligned rows: doc_aligned was "
                   "removed after ac879ff (no preset used it; docs/performance.md has its measurement): re-run "
                   "to_mds.py without --sampling doc_aligned, or verify it with pile-gpt ac879ff")


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
    block = [] if "--block-size" in argv else ["--block-size", "16"]
    err = main_error(to_mds.main, argv + ["--out", out] + block, capsys)
    assert message in err, err
    assert not out.exists() and (not out.parent.exists() or leftovers(out.parent) == [])


# ------------------------------------------------------------------------------------------------ overwrite


def test_existing_dataset_is_refused_then_replaced_with_overwrite(tmp_path, small_tokens, capsys):
    data = write_bin(tmp_path / "data", small_tokens)
    out = tmp_path / "mds"
    to_mds.main(["--bin", str(data), "--out", str(out), "--block-size", str(T)])
    before = (out / "train" / "shard.00000.mds.zstd").read_bytes()
    err = main_error(to_mds.main, ["--bin", data, "--out", out, "--block-size", "32"], capsys)
    assert "already holds a dataset; pass --overwrite" in err
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
    err = main_error(to_mds.main, ["--bin", data, "--out", precious, "--block-size", str(T), "--overwrite"], capsys)
    assert "is not an MDS dataset" in err
    assert (precious / "notes.txt").read_text() == "keep me" and len(list(precious.iterdir())) == 1


def test_verify_detects_a_changed_bin_and_a_corrupt_shard(tmp_path, small_tokens, capsys):
    data = write_bin(tmp_path / "data", {"train": small_tokens["train"]})
    out = tmp_path / "mds"
    to_mds.main(["--bin", str(data), "--out", str(out), "--block-size", str(T)])
    tokens = small_tokens["train"].copy()
    tokens[T * 10 + 3] = (tokens[T * 10 + 3] + 1) % 50257  # same length, one token differs: sample 10
    tokens.tofile(data / "train.bin")
    err = main_error(to_mds.main, ["--bin", data, "--out", out, "--verify"], capsys)
    assert "sample 10 column x differs" in err

    small_tokens["train"].tofile(data / "train.bin")
    shard = out / "train" / "shard.00000.mds.zstd"
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))
    err = main_error(to_mds.main, ["--bin", data, "--out", out, "--verify"], capsys)
    # the user's shard, not its copy in the verifier's temporary cache (deleted by the time the line is read)
    assert err == (f"error: verify failed: {shard} does not match the checksum in {out / 'train' / 'index.json'}: the "
                   "shard is damaged; re-run with --overwrite")


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
    err = main_error(to_mds.main, ["--bin", data / "train.bin", "--out", out, "--verify"], capsys)
    assert err.startswith(expected), err
    assert err.rstrip().endswith("re-run to_mds.py with --overwrite to rebuild the dataset" +
                                 (" (or put the shard back)" if case == "missing_shard" else "")), err


# ------------------------------------------------------------------------------------------------ by component


def test_a_by_subset_folder_gives_one_mds_root_per_component(tmp_path, small_tokens, capsys):
    """prepare_data --by-subset's layout (written through the contract: write_token_files per component and
    components.make_index): MDS/<folder>/train and val, every token back; --overwrite and --verify know it."""
    from pilegpt.common import atomic_write_text
    from pilegpt.prepare import components

    data, tokens = tmp_path / "by_subset", {"Pile-CC": small_tokens, "Ubuntu IRC": {"train": small_tokens["val"]}}
    counts = {}
    for name, splits in tokens.items():
        meta = write_token_files(data / subset_folder(name), splits, subset=name)
        counts[name] = {"tokens": {s: meta.splits[s].tokens if s in meta.splits else 0 for s in ("train", "val")},
                        "documents": {"train": 0, "val": 0}}
    atomic_write_text(data / SUBSETS_NAME, json.dumps(components.make_index(counts, "meta.pile_set_name", {})))
    argv = ["--bin", data, "--out", tmp_path / "mds", "--block-size", T, "--num-proc", 1]
    assert to_mds.main([str(a) for a in argv]) == 0
    assert sorted(p.relative_to(tmp_path / "mds").as_posix() for p in (tmp_path / "mds").glob("*/*")) == [
        "pile-cc/train", "pile-cc/val", "ubuntu_irc/train"]
    for name, splits in tokens.items():
        for split, toks in splits.items():
            samples = read_mds(str(tmp_path / "mds" / subset_folder(name) / split), tmp_path / f"c_{name}_{split}")
            n = (len(toks) - 1) // T
            assert np.array_equal(np.stack([s["x"] for s in samples]).reshape(-1), toks[:n * T])
    assert "already holds a dataset" in main_error(to_mds.main, argv, capsys)
    assert to_mds.main([str(a) for a in argv + ["--overwrite", "--verify"]]) == 0
    assert "verified" in capsys.readouterr().out and leftovers(tmp_path) == []
