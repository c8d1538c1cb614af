"""train.py's init_from (Hugging Face GPT-2 weights, a pile-gpt run) and the shape that train.py's Composer
checkpoints carry (so sample.py, export_hf.py and init_from need no shape flags). Offline: a tiny GPT-2 built
with transformers and saved with save_pretrained stands in for OpenAI's weights. The one-line refusals:
tests/unit/test_init_from.py.

The runs read a "periodic" .bin dataset: one block of text repeated, so every training window is the same
(x, y) pair and the loss of batch 1 (logged before the first update) can be recomputed from the source model.
"""

import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sample
import train
from helpers import INIT_BLOCK as T
from helpers import PERIODIC_HF_SHAPE as HF_SHAPE
from helpers import REPO, periodic_window, train_main
from model import GPTConfig
from pilegpt import checkpoint, hf
from pilegpt.common import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BATCH = ["--global_batch_size=4", "--device_train_microbatch_size=4", "--sample_length=0", "--warmup=0ba",
         "--learning_rate=1e-3", "--min_lr=1e-3", "--device=cpu", "--progress_bar=False"]
SMALL = ["--n_layer=2", "--n_head=2", "--n_embd=32", f"--block_size={T}", *BATCH]


def loss_on_window(logits_fn) -> float:
    x, y = periodic_window()
    with torch.no_grad():
        return F.cross_entropy(logits_fn(x[None]).reshape(-1, 50257), y).item()


def read_losses(run_dir) -> dict[int, float]:
    return {r["batch"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}


def hf_model(folder):
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(folder).eval()


# --------------------------------------------------------------------------------------------------------
# Hugging Face GPT-2 in

def test_hf_folder_gives_the_logits_of_transformers(hf_folder):
    gpt, origin = hf.load_pretrained(str(hf_folder))
    assert origin == f"the Hugging Face GPT-2 folder {hf_folder}"
    assert gpt.config == GPTConfig(block_size=64, vocab_size=50257, n_layer=2, n_head=2, n_embd=32, bias=True)
    idx = torch.randint(0, 50257, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = gpt(idx, targets=idx)
        theirs = hf_model(hf_folder)(idx).logits
    assert (ours - theirs).abs().max().item() < 1e-4  # measured: ~2e-6


def test_finetune_preset_from_hf_folder_starts_at_the_source_loss(hf_folder, periodic_data, tmp_path, capsys):
    source_loss = loss_on_window(lambda x: hf_model(hf_folder)(x).logits)
    assert source_loss < 5.0  # the source learned the window: far below a fresh model's ln(50257) = 10.8
    run_dir = tmp_path / "ft"
    # The preset as it is, but from the tiny folder, on the periodic data, for 2 batches, without dropout (so batch
    # 1 is the source's exact forward pass). The model's shape is not given: it comes from the folder.
    train.main([str(REPO / "config" / "finetune_shakespeare.py"), f"--init_from={hf_folder}",
                f"--data_dir={periodic_data}", f"--block_size={T}", "--dropout=0.0", *BATCH, "--max_duration=2ba",
                "--eval_interval=2ba", f"--save_folder={run_dir}", "--save_interval=2ba"])
    out = capsys.readouterr().out
    assert f"init_from={hf_folder}: 1.63M weights from the Hugging Face GPT-2 folder {hf_folder}" in out
    losses = read_losses(run_dir)
    assert abs(losses[1] - source_loss) < 1e-4, (losses[1], source_loss)
    assert losses[2] < losses[1]  # fine-tuning goes on from there
    saved = json.loads((run_dir / "config.json").read_text())["config"]
    assert (saved["n_layer"], saved["n_embd"], saved["block_size"], saved["init_from"]) == (2, 32, T, str(hf_folder))
    assert checkpoint.load_model(str(run_dir)).config.block_size == T  # the position table was cropped


def test_config_that_contradicts_the_source_is_one_error_naming_both(hf_folder, periodic_data, tmp_path):
    with pytest.raises(UserError) as e:
        train.main([f"--init_from={hf_folder}", f"--data_dir={periodic_data}", *BATCH, "--n_layer=4", "--bias=False",
                    "--block_size=128", "--n_embd=32", "--dropout=0.2", f"--save_folder={tmp_path / 'run'}"])
    message = str(e.value)
    assert "\n" not in message and "n_embd" not in message and "dropout" not in message  # these agree or are free
    assert f"the config contradicts init_from={hf_folder}" in message
    for part in ("n_layer=4 but it has n_layer=2", "bias=False but it has bias=True",
                 "block_size=128 but it has block_size=64"):
        assert part in message
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_unsupported_hf_settings_are_named(hf_folder, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "erf-gelu"
    GPT2LMHeadModel(GPT2Config(**HF_SHAPE, activation_function="gelu")).save_pretrained(folder)
    with pytest.raises(UserError, match="activation_function='gelu' is not a GPT-2 that model.py implements"):
        hf.load_pretrained(str(folder))


# --------------------------------------------------------------------------------------------------------
# A pile-gpt run in, and the shape its checkpoints carry

@pytest.fixture(scope="module")
def scratch_run(periodic_data, tmp_path_factory):
    """A tiny train.py run from scratch: 2 batches, a Composer checkpoint and model.pt at batch 2."""
    run_dir = tmp_path_factory.mktemp("scratch") / "run"
    train_main([f"--data_dir={periodic_data}", *SMALL, "--learning_rate=1e-2", "--min_lr=1e-2", "--max_duration=2ba",
                "--save_interval=2ba", f"--save_folder={run_dir}"])
    return run_dir


@pytest.mark.parametrize("which", ["run folder", "composer checkpoint"])
def test_init_from_a_pile_gpt_run_starts_at_its_loss(scratch_run, periodic_data, tmp_path, which, capsys):
    spec = scratch_run if which == "run folder" else scratch_run / "ep0-ba2-rank0.pt"
    source = checkpoint.load_model(str(spec))
    source_loss = loss_on_window(lambda x: source(x, targets=x)[0])
    run_dir = tmp_path / "ft"
    train.main([f"--init_from={spec}", f"--data_dir={periodic_data}", *BATCH, "--max_duration=1ba",
                f"--save_folder={run_dir}"])
    file = spec / "model.pt" if which == "run folder" else spec  # a run folder gives its export
    assert f"init_from={spec}: 1.63M weights from the pile-gpt checkpoint {file}" in capsys.readouterr().out
    assert abs(read_losses(run_dir)[1] - source_loss) < 1e-4
    assert checkpoint.load_model(str(run_dir)).config == source.config


@pytest.mark.s3
def test_init_from_a_run_on_s3(scratch_run, periodic_data, s3_env, tmp_path):
    s3_env.client().upload_file(str(scratch_run / "ep0-ba2-rank0.pt"), s3_env.bucket, "runs/src/ep0-ba2-rank0.pt")
    source = checkpoint.load_model(str(scratch_run / "ep0-ba2-rank0.pt"))
    train.main([f"--init_from=s3://{s3_env.bucket}/runs/src/ep0-ba2-rank0.pt", f"--data_dir={periodic_data}", *BATCH,
                "--max_duration=1ba", f"--save_folder={tmp_path / 'ft'}"])
    assert abs(read_losses(tmp_path / "ft")[1] - loss_on_window(lambda x: source(x, targets=x)[0])) < 1e-4


def test_autoresume_keeps_the_checkpoint_not_init_from(hf_folder, periodic_data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [f"--init_from={hf_folder}", f"--data_dir={periodic_data}", *BATCH, "--max_duration=4ba",
            "--save_interval=2ba", f"--save_folder={run_dir}", "--run_name=ft", "--autoresume=True"]
    train.main(args)  # a fresh start: init_from applies
    assert f"init_from={hf_folder}: 1.64M weights from the Hugging Face GPT-2 folder" in capsys.readouterr().out
    first = read_losses(run_dir)
    (run_dir / "ep0-ba4-rank0.pt").unlink()  # as if it had died after batch 2
    (run_dir / "latest-rank0.pt").unlink()
    (run_dir / "latest-rank0.pt").symlink_to("ep0-ba2-rank0.pt")
    train.main(args)
    out = capsys.readouterr().out
    assert f"init_from={hf_folder}: not loaded: autoresume continues from the checkpoint in {run_dir}" in out
    assert "resuming from the checkpoint at batch 2" in out
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    again = {r["batch"]: r["loss"] for r in lines[4:] if "loss" in r}  # the resumed run appended batches 3 and 4
    assert sorted(again) == [3, 4]
    np.testing.assert_allclose([again[3], again[4]], [first[3], first[4]], rtol=1e-5)
    assert first[3] < first[1] - 0.01  # batch 3 trains on the checkpoint's weights, not the source's again


def test_composer_checkpoints_of_train_py_carry_the_model_shape(scratch_run):
    state = torch.load(scratch_run / "ep0-ba2-rank0.pt", map_location="cpu", weights_only=False)["state"]["model"]
    assert state["_extra_state"] == {"model_args": dict(
        block_size=T, vocab_size=50257, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True, pos_emb="learned",
        rope_theta=10000.0, norm="layernorm", mlp="gelu", n_kv_head=None, qk_norm=False, tie_embeddings=True,
        logit_softcap=0.0, x0_scalars=False, value_embeds=False, embed_norm=False, smear=False,
        backout=False, qk_scale=1.0)}
    export = torch.load(scratch_run / "model.pt", weights_only=True)["model"]
    assert all(torch.is_tensor(v) for v in export.values()) and not any("extra" in k for k in export)


def test_sample_from_a_train_py_checkpoint_needs_no_shape_flags(scratch_run, capsys):
    def run(spec):
        assert sample.main(["--checkpoint", str(spec), "--device", "cpu", "--prompt", "ROMEO:", "--max-new-tokens",
                            "8", "--seed", "3"]) == 0
        return capsys.readouterr().out

    from_checkpoint = run(scratch_run / "ep0-ba2-rank0.pt")  # no --n-head
    assert from_checkpoint.startswith("ROMEO:") and from_checkpoint.endswith(sample.SEPARATOR + "\n")
    assert from_checkpoint == run(scratch_run / "model.pt")  # the same weights as the export at batch 2


def test_a_checkpoint_from_before_model_args_still_resumes(scratch_run, periodic_data, tmp_path, capsys):
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    payload = torch.load(scratch_run / "ep0-ba2-rank0.pt", map_location="cpu", weights_only=False)
    del payload["state"]["model"]["_extra_state"]  # what train.py wrote before ComposerGPT kept its shape
    torch.save(payload, run_dir / "ep0-ba2-rank0.pt")
    (run_dir / "latest-rank0.pt").symlink_to("ep0-ba2-rank0.pt")
    train.main([f"--data_dir={periodic_data}", *SMALL, "--max_duration=3ba", "--save_interval=3ba",
                f"--save_folder={run_dir}", "--run_name=old", "--autoresume=True"])
    assert "resuming from the checkpoint at batch 2" in capsys.readouterr().out
    assert sorted(read_losses(run_dir)) == [3] and math.isfinite(read_losses(run_dir)[3])
    with pytest.raises(UserError, match="pass --n-head"):
        checkpoint.load_model(str(run_dir / "ep0-ba2-rank0.pt"))
    assert checkpoint.load_model(str(run_dir / "ep0-ba3-rank0.pt")).config.n_embd == 32  # new checkpoints have it
    assert os.path.isfile(run_dir / "model.pt")
