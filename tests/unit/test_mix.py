"""data_mix's parts in this process: the weights as Streaming reads them, the .bin mix's order (each component's
share of an epoch exactly its weight, ranks disjoint, an exact resume), the names and the refusals. Its runs:
tests/e2e/test_mix.py."""

import numpy as np
import pytest

from helpers import write_bin
from pilegpt.common import UserError
from pilegpt.train.config_load import load_config
from pilegpt.train.data.bin_reader import BinDataset, MixedBins, MixedOrder, resumable_sampler
from pilegpt.train.data.loaders import mix_shares
from pilegpt.train.data.mix import check_mix, component_name, sample_counts


def test_sample_counts_follow_streamings_rules():
    sizes = [100, 30, 7]
    assert sample_counts([{"repeat": 2.5}, {"repeat": 0.5}, {"choose": 20}], sizes) == [250, 15, 20]
    counts = sample_counts([{"proportion": 1}, {"proportion": 1}, {"proportion": 1}], sizes)
    assert sum(counts) == 137 and sorted(counts) == [45, 46, 46]  # floor(137/3) each, 2 left to the largest parts
    assert sample_counts([{"proportion": 0.75}, {"proportion": 0.25}], [60, 20]) == [60, 20]


def test_streaming_derives_the_same_counts_for_repeat_and_choose():
    from streaming import Stream

    streams = [Stream(local="/nonexistent/a", repeat=2.5), Stream(local="/nonexistent/b", choose=20)]
    Stream.apply_weights(streams, np.array([100, 7]), None, 0)
    assert [int(s.choose) for s in streams] == sample_counts([{"repeat": 2.5}, {"choose": 20}], [100, 7])


@pytest.mark.parametrize("counts, sizes", [([250, 15, 20], [100, 30, 7]), ([3, 1000], [1000, 1000])])
def test_an_epoch_of_a_mix_holds_each_component_exactly_its_count(counts, sizes):
    order = MixedOrder(counts, sizes)
    epoch = order(np.arange(len(order)), key=11)
    starts = np.cumsum([0] + sizes)
    component = np.searchsorted(starts, epoch, side="right") - 1
    assert np.bincount(component, minlength=len(sizes)).tolist() == counts
    for k, (c, n) in enumerate(zip(counts, sizes)):  # each window floor(c/n) or ceil(c/n) times
        seen = np.bincount(epoch[component == k] - starts[k], minlength=n)
        assert seen.min() == c // n and seen.max() == -(-c // n)
    assert not np.array_equal(epoch, order(np.arange(len(order)), key=12))  # another epoch, another order


def mixed(tmp_path, weights):
    """A MixedBins of two .bin folders (1000 and 300 windows of 10 tokens) and its order."""
    parts = []
    for name, n in (("a", 10_001), ("b", 3_001)):
        write_bin(tmp_path / name, {"train": np.arange(n) % 50_000})
        parts.append(BinDataset(str(tmp_path / name / "train.bin"), block_size=10))
    sizes = [len(p) for p in parts]
    order = MixedOrder(sample_counts(weights, sizes), sizes)
    return MixedBins(parts, order), order


def test_the_mixed_sampler_is_disjoint_over_ranks_resumes_exactly_and_reads_every_component(tmp_path):
    ds, order = mixed(tmp_path, [{"repeat": 1.0}, {"repeat": 2.0}])  # 1000 + 600 samples an epoch
    samplers = [resumable_sampler(ds, world_size=4, rank=r, seed=5, order=order) for r in range(4)]
    epoch = [list(s) for s in samplers]
    assert [len(e) for e in epoch] == [400] * 4
    everything = np.array(sum(epoch, []))
    assert (everything < 1000).sum() == 1000 and (everything >= 1000).sum() == 600
    assert sorted(epoch[0] + epoch[2]) != sorted(epoch[1] + epoch[3])
    ds.load_state_dict(ds.state_dict(num_samples=40, from_beginning=True))  # 40 samples over 4 ranks
    assert list(samplers[1]) == epoch[1][10:]
    # the same global positions at 2 processes: a resume on another process count keeps the global batches
    two = [resumable_sampler(ds, world_size=2, rank=r, seed=5, order=order) for r in range(2)]
    assert sorted(sum((list(s) for s in two), [])) == sorted(everything.tolist())
    sample = ds[1000 + 7]  # the second component's window 7
    assert sample["x"].tolist() == list(range(70, 80))


def test_the_shares_a_run_reports_are_the_counts(tmp_path):
    ds, _ = mixed(tmp_path, [{"proportion": 3}, {"proportion": 1}])
    cfg = load_config([f"--data_mix={{'{tmp_path / 'a'}': {{'proportion': 3}}, '{tmp_path / 'b'}': "
                       "{'proportion': 1}}", "--block_size=10"])
    shares = mix_shares(cfg, ds)
    assert {k: (v["samples"], v["share"]) for k, v in shares.items()} == {"a": (975, 0.75), "b": (325, 0.25)}


def test_component_names_are_folder_names_usable_as_eval_labels():
    assert component_name("data/pile/Pile-CC/") == "Pile_CC"
    assert component_name("s3://bucket/mds/pubmed_central") == "pubmed_central"


@pytest.mark.parametrize("mix, message", [
    ({"a": {"repeat": 0}}, "data_mix: a: repeat must be a number > 0, got 0"),
    ({"a": {"proportion": -1.0}}, "data_mix: a: proportion must be a number > 0, got -1.0"),
    ({"a": {"choose": 2.5}}, "data_mix: a: choose is a number of samples, a whole number, got 2.5"),
    ({"a": {"weight": 1}}, "data_mix: a: {'weight': 1} must be one of"),
    ({"a": {"proportion": 1}, "b": {"repeat": 1}}, "data_mix: b: proportion (relative) and repeat/choose"),
    ({"x/a": {"repeat": 1}, "y/a": {"repeat": 1}}, "data_mix: y/a and x/a have the same name 'a'"),
    ({"a": {"repeat": "2"}}, "data_mix: a: repeat must be a number > 0, got '2'"),
    ({"x/a": {"repeat": 1}, "x/./a/": {"repeat": 1}}, "data_mix: x/a and x/./a/ are one folder"),
])
def test_bad_weights_are_errors_naming_the_root(mix, message):
    assert any(e.startswith(message) for e in check_mix(mix)), check_mix(mix)
    with pytest.raises(UserError, match="^bad config: " + message.replace("(", r"\(").replace(")", r"\)")
                       .replace("{", r"\{").replace("}", r"\}").replace(".", r"\.")):
        load_config([f"--data_mix={mix!r}"])


def test_data_mix_replaces_data_dir_and_refuses_both(tmp_path):
    (tmp_path / "c.py").write_text("data_dir = 'data/x'\n")
    cfg = load_config([str(tmp_path / "c.py"), "--data_mix={'data/a': {'repeat': 1}}"])
    assert cfg.data_dir is None and cfg.data_mix == {"data/a": {"repeat": 1}}
    (tmp_path / "both.py").write_text("data_dir = 'data/x'\ndata_mix = {'data/a': {'repeat': 1}}\n")
    with pytest.raises(UserError, match="data_mix names the data: pass --data_dir=None"):
        load_config([str(tmp_path / "both.py")])


def test_pile_mix_config_gives_the_papers_epochs_to_the_components_present(tmp_path, monkeypatch, capsys):
    from pilegpt.data import subset_folder
    from pilegpt.train.config_load import read_config_file

    for name in ("Pile-CC", "Gutenberg (PG-19)", "Wikipedia (en)"):  # as prepare_data.py --by-subset names them
        write_bin(tmp_path / subset_folder(name), np.arange(200) % 50)
    monkeypatch.setenv("PILE_MIX_DATA", str(tmp_path))
    values = read_config_file("config/pile_mix.py")
    assert values["data_mix"] == {str(tmp_path / "pile-cc"): {"repeat": 1.0},
                                  str(tmp_path / "gutenberg_pg-19"): {"repeat": 2.5},
                                  str(tmp_path / "wikipedia_en"): {"repeat": 3.0}}
    line = capsys.readouterr().out
    assert "3 of 22 components" in line and "Books3" in line and "Pile-CC" not in line.split("left out")[1]

    (tmp_path / "shakespeare").mkdir()  # not a Pile component: one line naming the folder
    with pytest.raises(UserError, match="shakespeare is not a Pile component"):
        read_config_file("config/pile_mix.py")


def test_numpy_weights_are_read_as_python_numbers():
    cfg = load_config(["--data_mix={'a': {'choose': 100}}"])
    from pilegpt.train.config import TrainConfig

    cfg = TrainConfig(**{**cfg.__dict__, "data_mix": {"a": {"choose": np.int64(100)}, "b": {"choose": np.uint8(7)}}})
    assert cfg.data_mix == {"a": {"choose": 100}, "b": {"choose": 7}}
    assert all(type(next(iter(w.values()))) is int for w in cfg.data_mix.values())


@pytest.mark.parametrize("weight, message", [  # values a config file can give but the command line cannot
    ({"repeat": float("nan")}, "data_mix: a: repeat must be a number > 0, got nan"),
    ({"choose": -np.int64(3)}, "data_mix: a: choose must be a number > 0, got np.int64(-3)"),
    ({"choose": np.float64(2.5)}, "data_mix: a: choose is a number of samples, a whole number"),
    ({"repeat": np.bool_(True)}, "data_mix: a: repeat must be a number > 0, got np.True_"),
    ({"repeat": np.float32("inf")}, "data_mix: a: repeat must be a finite number > 0, got np.float32(inf)"),
])
def test_nan_numpy_bools_and_numpy_non_integers_are_errors(weight, message):
    assert any(e.startswith(message) for e in check_mix({"a": weight})), check_mix({"a": weight})


def test_an_epoch_beyond_2_48_samples_or_a_root_without_a_sample_is_refused():
    from pilegpt.train.data.mix import check_epoch

    with pytest.raises(UserError, match=r"^data_mix: its weights give an epoch of 1\.41e\+15 samples, more than "):
        check_epoch({"a": {"repeat": 2.0 ** 47}, "b": {"repeat": 1.0}}, [10, 10])
    with pytest.raises(UserError, match=r"^data_mix: b: \{'proportion': 1e-06\} gives it 0\.000101 of its 1 samples"):
        check_epoch({"a": {"proportion": 1.0}, "b": {"proportion": 1e-6}}, [100, 1])
    check_epoch({"a": {"choose": 1}, "b": {"repeat": 0.5}}, [5, 2])  # one sample each: fine
