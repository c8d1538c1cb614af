"""train.py's init_from refusals in this process: OpenAI's weights by name offline, a missing source and a truncated
.safetensors file are one line. Runs that start from Hugging Face or pile-gpt weights: tests/e2e/test_init_from.py."""

import pytest

import train
from helpers import main_error
from pilegpt.common import UserError

BATCH = ["--global_batch_size=4", "--device_train_microbatch_size=4", "--sample_length=0", "--warmup=0ba",
         "--learning_rate=1e-3", "--min_lr=1e-3", "--device=cpu", "--progress_bar=False"]


def test_gpt2_by_name_without_the_hub_is_a_one_line_error(monkeypatch, periodic_data, tmp_path):
    import huggingface_hub

    if huggingface_hub.try_to_load_from_cache("gpt2", "config.json"):
        pytest.skip("gpt2 is in this machine's Hugging Face cache: the offline error cannot happen")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as e:
        train.main(["--init_from=gpt2", f"--data_dir={periodic_data}", *BATCH, f"--save_folder={tmp_path / 'run'}"])
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("init_from=gpt2: OpenAI's gpt2 weights are not in the Hugging Face cache and the hub "
                              "cannot be reached (HF_HUB_OFFLINE is set)")
    assert message.endswith("download them once with network, or pass a local folder written by save_pretrained")


def test_missing_source_is_a_one_line_error(periodic_data, tmp_path):
    with pytest.raises(UserError, match=r"^init_from=\S+nope not found: pass scratch, one of gpt2, gpt2-medium"):
        train.main([f"--init_from={tmp_path / 'nope'}", f"--data_dir={periodic_data}", *BATCH,
                    f"--save_folder={tmp_path / 'run'}"])


def test_a_truncated_model_safetensors_is_a_one_line_error(hf_folder, periodic_data, tmp_path, capsys):
    import shutil

    damaged = tmp_path / "copied-halfway"
    shutil.copytree(hf_folder, damaged)
    weights = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(weights[: len(weights) // 2])  # a copy cut short
    error = main_error(train.main, [f"--init_from={damaged}", f"--data_dir={periodic_data}", *BATCH,
                                    f"--save_folder={tmp_path / 'run'}"], capsys)
    assert error.startswith(f"error: init_from={damaged}: its .safetensors weights cannot be read (Error while "
                            "deserializing header"), error
    assert "copy the folder again or re-save it with save_pretrained" in error
