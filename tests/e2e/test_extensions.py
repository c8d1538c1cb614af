"""extensions.py in whole train.py runs: EMA against the same run without it (EMA changes only what is exported), a
user callback by import path (batch_log:EventCounter) gets its events and a Composer callback by name logs. Both runs
are in this process; callbacks by import path through the `composer` launcher: test_train.py's launched_bin_run.
Names, refusals and each algorithm on this GPT: tests/unit/test_extensions.py."""

import json
import os

import numpy as np
import pytest
import torch

from helpers import REPO, SHAKESPEARE, SMALL, checkpoint_state, tokenize, train_main, write_bin


@pytest.fixture(scope="module")
def ema_runs(tmp_path_factory):
    """The same 6-batch run without EMA and with it (with a user callback and a Composer one), in this process."""
    tmp = tmp_path_factory.mktemp("ema")
    data = write_bin(tmp / "data", np.array(tokenize(SHAKESPEARE.read_text()[:60_000]), dtype=np.uint16))
    args = [str(REPO / "config" / "tiny.py"), f"--data_dir={data}", *SMALL, "--max_duration=6ba", "--eval_interval=3ba",
            "--save_interval=3ba", "--eval_subset_num_batches=2", "--sample_length=0", "--device=cpu"]
    train_main([*args, f"--save_folder={tmp / 'plain'}"])
    counts = tmp / "events.json"
    train_main([*args, f"--save_folder={tmp / 'ema'}", "--algorithms={'ema': {'half_life': '2ba'}}",
                f"--callbacks={{'batch_log:EventCounter': {{'path': {str(counts)!r}}}, "
                f"'optimizer_monitor': {{'batch_log_interval': 1}}}}"])
    return tmp


def test_ema_changes_the_exported_weights_and_nothing_else(ema_runs):
    from pilegpt.checkpoint import load_model_file

    plain = load_model_file(ema_runs / "plain" / "model.pt").state_dict()
    ema = load_model_file(ema_runs / "ema" / "model.pt").state_dict()
    name = "transformer.h.1.attn.c_attn.weight"
    assert not torch.allclose(ema[name], plain[name], atol=1e-6)  # EMA changes what is exported...
    state = checkpoint_state(ema_runs / "ema" / "ep0-ba6-rank0.pt")
    # ...to the weights Composer checkpoints as the model (EMA's), while EMA's own state holds the training
    # weights, which are those of the run without EMA: averaging never fed back into training.
    [ema_state] = [s for cls, s in state["algorithms"] if cls == "EMA"]
    assert ema_state["ema_weights_active"]
    assert torch.equal(ema[name], state["model"][f"model.{name}"])
    training = ema_state["ema_model"]["named_parameters_dict"][f"model.{name}"]
    torch.testing.assert_close(training, plain[name], rtol=1e-4, atol=1e-6)


def test_a_user_callback_by_import_path_and_a_composer_callback_by_name_run(ema_runs):
    counts = json.loads((ema_runs / "events.json").read_text())
    assert counts == {"fit_start": 1, "batch_end": 6, "eval_end": 2, "fit_end": 1}  # evaluations at batches 3, 6
    [log] = (ema_runs / "ema" / "logs").glob("*-rank0.txt")
    assert "l2_norm/grad/global" in log.read_text()  # optimizer_monitor's metrics, logged every batch
    assert os.path.isfile(ema_runs / "ema" / "config.json")
