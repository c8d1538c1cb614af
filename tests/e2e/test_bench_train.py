"""pilegpt/train/plain_loop.py, the plain PyTorch loop bench/bench_train.py measures train.py against, trains on the
same batches with the same initial weights and schedule as train.py: the same losses (so the two time the same work)."""

import importlib.util
import sys

import numpy as np
import pytest

import train
from helpers import REPO, SMALL, losses_by_batch, read_jsonl, write_bin

SCRIPT = REPO / "bench" / "bench_train.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_train"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_plain_loop_has_train_py_losses_on_the_same_batches(shakespeare_tokens, tmp_path):
    data = write_bin(tmp_path / "data", shakespeare_tokens[:40_000])
    args = [str(REPO / "config" / "tiny.py"), f"--data_dir={data}", *SMALL, "--max_duration=5ba", "--device=cpu",
            "--eval_interval=100ba", "--sample_length=0"]
    train.main([*args, f"--save_folder={tmp_path / 'train'}"])
    assert load_bench().main(["--plain-loop", *args, f"--save_folder={tmp_path / 'plain'}"]) == 0
    plain = read_jsonl(tmp_path / "plain" / "steps.jsonl")
    assert [r["batch"] for r in plain] == [1, 2, 3, 4, 5] and [r["tokens"] for r in plain] == [128 * b for b in
                                                                                                 range(1, 6)]
    assert all(b["cpu_s"] >= a["cpu_s"] and b["time_s"] >= a["time_s"] for a, b in zip(plain, plain[1:]))
    losses = losses_by_batch(tmp_path / "train")
    np.testing.assert_allclose([r["loss"] for r in plain], [losses[b] for b in range(1, 6)], rtol=1e-5)
