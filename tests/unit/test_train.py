"""train.py's parts and refusals in this process: the .bin dataset and its resumable sampler, MDS batches, the
per-batch NaN check, and the clear errors before any training. Its runs: tests/e2e/test_train.py."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import train
from helpers import (
    REPO,
    SMALL,
    write_bin,
)
from pilegpt.common import UserError
from pilegpt.train.data.bin_reader import BinDataset, resumable_sampler
from pilegpt.train.data.loaders import collate_mds
from pilegpt.train.run import lifecycle


def test_bin_dataset_windows_do_not_overlap_and_y_is_x_shifted(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    write_bin(tmp_path / "d", tokens, val_fraction=0.0)
    ds = BinDataset(str(tmp_path / "d" / "train.bin"), block_size=10)
    assert len(ds) == 99  # (1000 - 1) // 10
    s = ds[3]
    assert s["x"].dtype == torch.int64 and s["x"].tolist() == list(range(30, 40))
    assert s["y"].tolist() == list(range(31, 41))
    assert ds[98]["y"][-1].item() == 990


def test_resumable_sampler_skips_what_each_rank_already_trained(tmp_path):
    write_bin(tmp_path / "d", np.arange(2000, dtype=np.uint16), val_fraction=0.0)
    ds = BinDataset(str(tmp_path / "d" / "train.bin"), block_size=10)
    full = [list(resumable_sampler(ds, world_size=2, rank=r, seed=5)) for r in (0, 1)]
    assert not set(full[0]) & set(full[1])
    ds.load_state_dict(ds.state_dict(num_samples=12, from_beginning=True))  # 12 samples over 2 ranks
    sampler = resumable_sampler(ds, world_size=2, rank=1, seed=5)
    assert list(sampler) == full[1][6:]
    assert list(sampler) == full[1]  # the skip applies once, to the resumed epoch


def test_mds_batches_are_int64_pairs():
    batch = collate_mds([{"x": np.arange(4, dtype=np.uint16), "y": np.arange(1, 5, dtype=np.uint16)}] * 3)
    assert batch["x"].dtype == torch.int64 and batch["x"].shape == (3, 4) and batch["y"][0].tolist() == [1, 2, 3, 4]


def test_auto_microbatch_on_cpu_is_a_clear_error(shakespeare_bin, tmp_path):
    with pytest.raises(UserError, match="'auto' works on GPU only"):
        train.main([f"--data_dir={shakespeare_bin}", "--device=cpu", "--device_train_microbatch_size=auto",
                    f"--save_folder={tmp_path}"])


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="data_dir .*nope not found: make it with prepare_data.py"):
        train.main([f"--data_dir={tmp_path / 'nope'}", "--device=cpu", f"--save_folder={tmp_path / 'run'}"])


def test_mds_block_size_mismatch_is_a_clear_error(shakespeare_mds, tmp_path):
    with pytest.raises(UserError, match="samples of 32 tokens but block_size is 64: pass --block_size=32"):
        train.main([f"--data_dir={shakespeare_mds}", "--device=cpu", *SMALL, "--block_size=64",
                    f"--save_folder={tmp_path / 'run'}"])


def test_existing_checkpoints_are_never_overwritten_by_a_new_run(shakespeare_bin, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "ep0-ba5-rank0.pt").write_bytes(b"precious")
    with pytest.raises(UserError, match="already holds checkpoints .*--autoresume=True"):
        train.main([f"--data_dir={shakespeare_bin}", "--device=cpu", *SMALL, f"--save_folder={run_dir}"])
    assert (run_dir / "ep0-ba5-rank0.pt").read_bytes() == b"precious"


def test_the_per_batch_nan_check_reads_the_logged_loss_and_checks_weights_only_before_a_save():
    from types import SimpleNamespace

    from composer.core import Event

    from pilegpt.train.callbacks import StopOnNonFinite

    model = train.ComposerGPT(train.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=16))
    with torch.no_grad():
        model.model.lm_head.weight[0, 0] = float("nan")
    state = SimpleNamespace(model=model, total_loss_dict={"loss/train/total": 2.5},
                            timestamp=SimpleNamespace(batch=7))
    stop = StopOnNonFinite("lower --learning_rate (now 0.001) or raise --warmup", save_interval="100ba")
    stop.batch_end(state, None)  # a finite loss: the weights are not read on an ordinary batch
    with pytest.raises(UserError, match="the weights went NaN or infinite at batch 7"):
        stop.run_event(Event.FIT_END, state, None)  # before the final checkpoint and export
    state.total_loss_dict = {"loss/train/total": math.inf}
    with pytest.raises(UserError, match="the training loss went NaN or infinite at batch 7, so the run stopped"):
        stop.batch_end(state, None)


@pytest.mark.parametrize("setting, device, used", [("auto", "gpu", True), ("auto", "cpu", False), (True, "cpu", True),
                                                   (False, "gpu", False), (True, "gpu", True)])
def test_compile_auto_is_on_for_a_gpu_and_off_on_cpu(setting, device, used, tmp_path):
    from pilegpt.train.config_load import load_config

    cfg = load_config([str(REPO / "config" / "pile.py"), f"--data_dir={tmp_path}", f"--compile={setting}"])
    assert train.resolve_compile(cfg, device).compile is used
    # the GPU presets ship "auto"; config/modern.py on top keeps it; the CPU presets stay eager
    assert load_config([str(REPO / "config" / "pile.py"), str(REPO / "config" / "modern.py"),
                        f"--data_dir={tmp_path}"]).compile == "auto"
    assert load_config([str(REPO / "config" / "quickstart.py"), f"--data_dir={tmp_path}"]).compile is False


@pytest.mark.parametrize("value", ["yes", "", "on"])
def test_compile_takes_true_false_or_auto(value, tmp_path):
    from pilegpt.train.config_load import load_config

    with pytest.raises(UserError, match=r"compile must be True, False or 'auto'"):
        load_config([f"--data_dir={tmp_path}", f"--compile={value}"])


def test_a_failed_compile_is_one_line_that_names_compile_false(tmp_path):
    from torch._dynamo.exc import InternalTorchDynamoError

    class Trainer:
        def __init__(self, error):
            self.error = error

        def fit(self):
            raise self.error

    folder = SimpleNamespace(remote=None, save_folder=str(tmp_path), run_dir=str(tmp_path))
    inner = InternalTorchDynamoError("graph break in a custom op\nlong traceback")
    with pytest.raises(UserError, match=r"^torch.compile failed \(InternalTorchDynamoError: graph break in a custom op"
                                        r".*\); train without it: --compile=False$"):
        lifecycle.fit(Trainer(inner), folder, compiled=True)
    wrapped = RuntimeError("while training")  # the compiler's error as the cause of another
    wrapped.__cause__ = inner
    with pytest.raises(UserError, match="--compile=False"):
        lifecycle.fit(Trainer(wrapped), folder, compiled=True)
    with pytest.raises(InternalTorchDynamoError):  # an eager run's error is left as it is
        lifecycle.fit(Trainer(inner), folder, compiled=False)
    with pytest.raises(ValueError, match="other"):  # and so is any other error
        lifecycle.fit(Trainer(ValueError("other")), folder, compiled=True)
