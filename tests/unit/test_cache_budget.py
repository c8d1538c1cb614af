"""data_cache_limit (pilegpt/train/data/cache_budget.py): a size read as Streaming reads it, every value that is not
one refused in one line before anything runs, and the least limit it allows for a dataset equal to the least
Streaming's StreamingDataset accepts. Training through it on the loopback S3 server: tests/e2e/test_cache_budget.py."""

import json

import numpy as np
import pytest

import train
from helpers import REPO, main_error, streaming_dataset, write_mds
from pilegpt.common import UserError
from pilegpt.train.config_load import config_values, make_config
from pilegpt.train.data.cache_budget import cache_limit_for, in_flight, limit_bytes, streaming_least


def test_a_size_is_read_as_streaming_reads_it():
    from streaming.base.util import bytes_to_int

    for value in ("50gb", "50GB", " 800mb ", "1.5gb", "64kb", "100b", "2tb", "1pb", ".5mb"):
        assert limit_bytes(value) == bytes_to_int(value.strip()), value
    assert limit_bytes(123456) == 123456 and limit_bytes(None) is None
    assert limit_bytes("50gb") == 50 * 2 ** 30


@pytest.mark.parametrize("value, says", [
    (0, "above 0 bytes"), (-1, "above 0 bytes"), ("0gb", "above 0 bytes"), ("-5gb", "a size like"),
    ("nan", "a size like"), ("inf", "a size like"), ("nangb", "a size like"), ("1e30gb", "a size like"),
    ("", "a size like"), ("50", "a size like"), ("50g", "a size like"), ("50 gigs", "a size like"),
    ("5gb5", "a size like"), ("2pb", "at most 1pb"), (10 ** 30, "at most 1pb"), ("9" * 400 + "gb", "at most 1pb"),
    (True, "a size like"), (1.5e9, "a size like"), ([1], "a size like"), ({"gb": 5}, "a size like"),
])
def test_a_value_that_is_not_a_size_is_refused(value, says):
    with pytest.raises(ValueError, match=says):
        limit_bytes(value)


def test_the_setting_is_checked_with_the_others_and_on_the_command_line_is_one_line(capsys):
    tiny = str(REPO / "config" / "tiny.py")
    cfg = make_config(config_values([tiny, "--data_cache_limit=50gb"]))
    assert cfg.data_cache_limit == "50gb"
    assert make_config(config_values([tiny, "--data_cache_limit=1000000"])).data_cache_limit == 1_000_000
    with pytest.raises(UserError, match="data_cache_limit must be above 0 bytes"):
        make_config(config_values([tiny, "--data_cache_limit=-1"]))
    with pytest.raises(UserError, match="data_cache_limit must be a size like '50gb' or a number of bytes, got True"):
        make_config({**config_values([tiny]), "data_cache_limit": True})  # a config file's bool
    for argv, says in (("--data_cache_limit=nan", "data_cache_limit must be a size like '50gb'"),
                       ("--data_cache_limit=1.5e9", "data_cache_limit must be a size like '50gb'"),
                       ("--data_cache_limit=True", "data_cache_limit must be a size like '50gb', '800mb' or a "
                                                   "number of bytes (units b, kb, mb, gb, tb, pb), got 'True'")):
        assert says in main_error(train.main, [tiny, "--device=cpu", argv], capsys)


def test_the_least_limit_is_the_least_streaming_accepts_and_room_for_the_downloads(tmp_path):
    """Streaming's own refusal (4 x the largest shard, raw and zip; above the indexes' size) one byte below
    streaming_least, a dataset opened at it; the budget's least adds the index (Streaming counts it in the cache, not
    in its least) and the shards that may be downloading (three threads per loader, all but one past the limit), and
    Streaming gets the budget less those."""
    tokens = np.random.default_rng(0).integers(0, 50257, size=200 * 32 + 1, dtype=np.uint16)
    for name, compression in (("raw", None), ("zstd", "zstd")):
        write_mds(tmp_path / name, tokens, 32, size_limit=1 << 12, compression=compression)
        index = (tmp_path / name / "index.json").read_bytes()
        shards = json.loads(index)["shards"]
        assert len(shards) > 4
        biggest = max(s["raw_data"]["bytes"] + ((s.get("zip_data") or {}).get("bytes", 0)) for s in shards)
        least = streaming_least([index])
        assert least == 4 * biggest  # the other way: the index's figures by hand
        with pytest.raises(ValueError, match="Cache limit .* is too low"):
            streaming_dataset(remote=str(tmp_path / name), local=str(tmp_path / f"{name}-a"), batch_size=1,
                              cache_limit=least - 1)
        assert len(streaming_dataset(remote=str(tmp_path / name), local=str(tmp_path / f"{name}-b"), batch_size=1,
                                     cache_limit=least)) == 200
        for loaders in (1, 8, 64):  # a rank without workers; 8 ranks; 8 ranks of 8 workers
            reserve = (3 * loaders - 1) * biggest
            assert in_flight([index], loaders) == reserve
            budget = len(index) + least + reserve  # Streaming's 4 shards, and the index beside them
            assert cache_limit_for(budget, [index], loaders, "train/ of x") == len(index) + least
            assert cache_limit_for(10 * budget, [index], loaders, "train/ of x") == 10 * budget - reserve
            with pytest.raises(UserError, match=(
                    rf"data_cache_limit={budget - 1:,} bytes is too small for train/ of x: it needs at least "
                    rf"{budget:,} \(its index and 4 x its largest shard, raw and zip, as Streaming asks, and room "
                    rf"for the {3 * loaders - 1} more that {loaders} loader\(s\) may be downloading\): pass "
                    rf"--data_cache_limit={-(-budget // 2 ** 20)}mb or more \(or None: no limit\)")):
                cache_limit_for(budget - 1, [index], loaders, "train/ of x")
        assert cache_limit_for(None, [index], 1, "train/ of x") is None
        assert cache_limit_for(5, [None], 1, "train/ of x") == 5  # an index it cannot read: Streaming's to judge
