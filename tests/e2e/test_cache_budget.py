"""data_cache_limit on the loopback S3 server: an s3:// MDS root about 4 times the limit trains on, loss for loss as
the run without a limit, while the train split's cache under data_local never holds more than the limit (its
size polled through the run); a limit below what a split needs is one line before training. The runs are train.py
processes (run_train): Streaming's download threads of a run stopped mid-epoch stay in a process that goes on
(pytest's), which then waited for them at its exit now and then."""

import contextlib
import os
import threading
import time

import numpy as np
import pytest

import train
from helpers import REPO, SMALL, losses_by_batch, main_error, run_train, succeeded, write_mds
from pilegpt.train.data.cache_budget import in_flight, limit_bytes, streaming_least
from pilegpt.train.data.loaders import mds_cache_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHARD = 1 << 13  # 8 KiB shards: 64 samples of 32 tokens each, two uint16 columns (32 of them for train/)
LIMIT = "96kb"  # the shards' 256 KiB of train/ do not fit: Streaming evicts the coldest before each download


@pytest.fixture(scope="module")
def mds_root(tmp_path_factory):
    tokens = np.random.default_rng(3).integers(0, 50257, size=2300 * 32 + 1, dtype=np.uint16)
    root = tmp_path_factory.mktemp("data") / "mds"
    write_mds(root / "train", tokens[:2048 * 32 + 1], 32, size_limit=SHARD, vocab_size=50257)
    write_mds(root / "val", tokens[2048 * 32:], 32, size_limit=SHARD, vocab_size=50257)
    return root


def folder_bytes(folder) -> int:
    """The bytes of the files in one folder, listed at once (a file renamed while it is counted, Streaming's
    download.tmp to its shard, counts once; a file gone since the listing, an evicted shard, not at all)."""
    total = 0
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(os.path.join(folder, name)).st_size
    return total


def args_for(remote: str, cache) -> list:
    return [str(REPO / "config" / "tiny.py"), f"--data_remote={remote}", *SMALL, f"--data_local={cache}",
            "--max_duration=12ba", "--eval_interval=100ba", "--device=cpu", "--sample_length=0",
            "--progress_bar=False", "--run_name=c"]


def test_a_cache_smaller_than_the_dataset_trains_on_and_stays_under_its_limit(s3_env, mds_root, tmp_path):
    remote = s3_env.upload_tree(mds_root, "cache/mds")
    dataset = folder_bytes(mds_root / "train")
    index = (mds_root / "train" / "index.json").read_bytes()
    assert dataset > 2.5 * limit_bytes(LIMIT) > 2.5 * (len(index) + streaming_least([index]) + in_flight([index], 1))
    succeeded(run_train([*args_for(remote, tmp_path / "whole"), f"--save_folder={tmp_path / 'whole-run'}"], tmp_path))
    cache = tmp_path / "budget"
    train_cache = cache.parent / "budget" / mds_cache_dir(str(cache), remote, "train").split(str(cache) + "/")[1]
    most, done = [0], threading.Event()

    def watch():  # the train split's cache, polled while the run reads through it
        while not done.is_set():
            most[0] = max(most[0], folder_bytes(train_cache))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        succeeded(run_train([*args_for(remote, cache), f"--data_cache_limit={LIMIT}",
                             f"--save_folder={tmp_path / 'run'}"], tmp_path))
    finally:
        done.set()
        watcher.join()
    whole, budget = losses_by_batch(tmp_path / "whole-run"), losses_by_batch(tmp_path / "run")
    assert sorted(budget) == list(range(1, 13)) and budget == whole  # eviction changes no sample
    # 12 batches of 4 random samples reach most of the 32 shards: without a limit the cache holds far more than it
    reached = folder_bytes(tmp_path / "whole" / train_cache.relative_to(cache))
    assert reached > 1.5 * limit_bytes(LIMIT)
    # Streaming got the limit less the 2 shards its 3 download threads may hold above it (cache_budget.in_flight):
    # the cache never passed the limit, at rest or while downloading
    assert 0 < most[0] <= limit_bytes(LIMIT) and folder_bytes(train_cache) <= limit_bytes(LIMIT)


def test_a_limit_below_what_a_split_needs_is_one_line_before_training(s3_env, mds_root, tmp_path, capsys):
    remote = s3_env.upload_tree(mds_root, "cache/small")
    index = (mds_root / "train" / "index.json").read_bytes()
    least = len(index) + streaming_least([index]) + in_flight([index], 1)  # the index, 4 shards and 2 in flight
    line = main_error(train.main, [*args_for(remote, tmp_path / "cache"), f"--data_cache_limit={least - 1}",
                                   f"--save_folder={tmp_path / 'run'}"], capsys)
    assert line.endswith(f"data_cache_limit={least - 1:,} bytes is too small for train/ of {remote}: it needs at "
                         f"least {least:,} (its index and 4 x its largest shard, raw and zip, as Streaming asks, and "
                         "room for the 2 more that 1 loader(s) may be downloading): pass --data_cache_limit=1mb or "
                         "more (or None: no limit)"), line
    assert not (tmp_path / "run").exists()
    succeeded(run_train([*args_for(remote, tmp_path / "cache"), f"--data_cache_limit={least}", "--max_duration=2ba",
                         f"--save_folder={tmp_path / 'run'}"], tmp_path))  # the least it names trains
    assert sorted(losses_by_batch(tmp_path / "run")) == [1, 2]
