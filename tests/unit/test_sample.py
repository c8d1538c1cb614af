"""sample.py in this process: reproducible sampling from a model.pt export or a real Composer checkpoint, and refusal
of files that would run code when unpickled. Its command line, its memory, and S3: tests/e2e/test_sample.py."""

import os
import pickle

import pytest
import torch

import sample
from helpers import composer_checkpoint
from helpers import sample_output as run
from model import GPT, GPTConfig
from pilegpt import checkpoint
from pilegpt.checkpoint import EXPORT_NAME, save_export
from pilegpt.common import UserError

# GPT-2's vocabulary (prompts are tiktoken-encoded), everything else tiny.
CONFIG = dict(block_size=32, vocab_size=50257, n_layer=2, n_head=2, n_embd=16)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def gpt() -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(**CONFIG))
    with torch.no_grad():  # sharper than the 0.02-std init, so greedy and sampled text differ clearly
        model.transformer.wte.weight.mul_(50)
    return model


@pytest.fixture(scope="module")
def export(gpt, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    save_export(gpt, run_dir / EXPORT_NAME)
    return run_dir / EXPORT_NAME


def test_same_seed_gives_same_samples_and_another_seed_others(export, capsys):
    argv = ["--checkpoint", str(export), "--prompt", "Hello world", "--num-samples", "2", "--max-new-tokens", "12"]
    a = run(capsys, *argv, "--seed", "3")
    b = run(capsys, *argv, "--seed", "3")
    c = run(capsys, *argv, "--seed", "4")
    assert a == b
    assert a != c
    samples = a.split(sample.SEPARATOR + "\n")
    assert len(samples) == 3 and samples[2] == ""  # two samples, each followed by the dash line
    assert all(s.startswith("Hello world") for s in samples[:2])
    assert samples[0] != samples[1]  # the samples of one batch differ


def test_top_k_1_is_greedy_whatever_the_seed(export, gpt, capsys):
    argv = ["--checkpoint", str(export), "--prompt", "The", "--max-new-tokens", "10", "--top-k", "1"]
    a = run(capsys, *argv, "--seed", "1")
    b = run(capsys, *argv, "--seed", "2", "--temperature", "0.5")
    assert a == b
    prompt = sample.encode_prompt("The", 50257)
    expected = gpt.eval().generate(torch.tensor([prompt]), 10, top_k=1)[0].tolist()
    assert a == sample.decode(expected) + "\n" + sample.SEPARATOR + "\n"


def test_a_temperature_so_small_that_the_logits_overflow_samples_greedily(export, capsys):
    """--temperature 1e-45 made the scaled logits inf and multinomial fail: it is greedy decoding in the limit."""
    argv = ["--checkpoint", str(export), "--prompt", "The", "--max-new-tokens", "10", "--num-samples", "2"]
    greedy = run(capsys, *argv, "--top-k", "1")
    assert run(capsys, *argv, "--temperature", "1e-45") == greedy
    assert run(capsys, *argv, "--temperature", "1e-300", "--top-k", "0") == greedy  # 0 in float32: 0 / 0 avoided


def test_samples_come_in_batches_and_the_first_batch_is_what_one_batch_gives(export, capsys):
    argv = ["--checkpoint", str(export), "--prompt", "Hello world", "--max-new-tokens", "6", "--seed", "3"]
    two = run(capsys, *argv, "--num-samples", "2")
    five = run(capsys, *argv, "--num-samples", "5", "--batch-size", "2")
    assert five.startswith(two) and five.count(sample.SEPARATOR + "\n") == 5
    assert run(capsys, *argv, "--num-samples", "2", "--batch-size", "64") == two  # the default: as before


def test_run_folder_resolves_to_its_export(export, capsys):
    argv = ["--prompt", "x", "--max-new-tokens", "5", "--seed", "9"]
    assert run(capsys, "--checkpoint", str(export.parent), *argv) == run(capsys, "--checkpoint", str(export), *argv)


class Exploit:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("kind", ["torch_save", "raw_pickle", "inside_composer_layout"])
def test_file_with_pickled_code_is_refused_and_the_code_never_runs(tmp_path, gpt, kind):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    if kind == "torch_save":
        torch.save({"format": "pile-gpt-export-v1", "model_args": CONFIG, "model": Exploit(marker)}, path)
    elif kind == "raw_pickle":
        path.write_bytes(pickle.dumps(Exploit(marker)))
    else:  # a real-looking Composer checkpoint with one poisoned entry
        state = {f"model.{k}": v for k, v in gpt.state_dict().items()}
        torch.save({"state": {"model": state, "callbacks": {"x": Exploit(marker)}}, "rng": []}, path)
    with pytest.raises(UserError, match="evil.pt .*can be read safely"):
        sample.main(["--checkpoint", str(path), "--device", "cpu"])
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError):  # the guard is real: an unrestricted load would run it
        torch.load(path, weights_only=True)
    assert not marker.exists()


def test_missing_and_wrong_files_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="checkpoint .*nope.pt not found"):
        sample.main(["--checkpoint", str(tmp_path / "nope.pt")])
    with pytest.raises(UserError, match="holds neither model.pt nor latest-rank0.pt"):
        sample.main(["--checkpoint", str(tmp_path)])
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(UserError, match="junk.pt is not a model export"):
        sample.main(["--checkpoint", str(junk)])
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    with pytest.raises(UserError, match="other.pt is neither"):
        sample.main(["--checkpoint", str(other)])
    with pytest.raises(UserError, match="--temperature must be > 0"):
        sample.main(["--checkpoint", str(other), "--temperature", "0"])


# ---------------------------------------------------------------------------------------------------------
# A real Composer checkpoint (Composer 0.32 Trainer, 2 batches on CPU: helpers.composer_checkpoint)


@pytest.fixture(scope="module")
def composer_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("composer_run")
    gpt = composer_checkpoint(folder, CONFIG, with_model_args=True)
    return folder, gpt


def test_composer_checkpoint_loads_with_the_allow_list(composer_run, tmp_path, capsys):
    folder, gpt = composer_run
    assert (folder / "latest-rank0.pt").exists() and not (folder / EXPORT_NAME).exists()
    loaded = checkpoint.load_model(str(folder / "latest-rank0.pt"))
    assert loaded.config == gpt.config
    for name, tensor in gpt.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    # sampling from the checkpoint (via its run folder) = sampling from an export of the same weights
    save_export(gpt, tmp_path / EXPORT_NAME)
    argv = ["--prompt", "A", "--max-new-tokens", "6", "--seed", "2"]
    assert run(capsys, "--checkpoint", str(folder), *argv) == run(capsys, "--checkpoint", str(tmp_path), *argv)


def test_composer_checkpoint_needs_the_allow_list(composer_run):
    folder, _ = composer_run
    with pytest.raises(pickle.UnpicklingError):  # plain weights_only=True refuses it: the list is needed
        torch.load(folder / "latest-rank0.pt", weights_only=True)
    unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(folder / "latest-rank0.pt"))
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in checkpoint.COMPOSER_SAFE_GLOBALS}
    assert unsafe <= allowed, f"allow-list COMPOSER_SAFE_GLOBALS misses {unsafe - allowed}"


def test_composer_checkpoint_without_model_args_needs_n_head(tmp_path, capsys):
    gpt = composer_checkpoint(tmp_path, CONFIG, with_model_args=False)
    ckpt = str(tmp_path / "latest-rank0.pt")
    with pytest.raises(UserError, match="pass --n-head"):
        checkpoint.load_model(ckpt)
    loaded = checkpoint.load_model(ckpt, n_head=2)
    assert loaded.config == gpt.config
    assert torch.equal(loaded.lm_head.weight, gpt.lm_head.weight)


def test_wrapper_prefixes_are_stripped_from_composer_state():
    state = {"model._orig_mod.transformer.wte.weight": torch.zeros(2), "module.model.lm_head.weight": torch.ones(1),
             "_extra_state": {"model_args": {"n_head": 3}}, "other.buffer": torch.zeros(1)}
    weights, model_args = checkpoint.gpt_state_from_composer(state, "ckpt")
    assert set(weights) == {"transformer.wte.weight", "lm_head.weight"}
    assert model_args == {"n_head": 3}
    with pytest.raises(UserError, match="holds no GPT"):
        checkpoint.gpt_state_from_composer({"model.fc.weight": torch.zeros(1)}, "ckpt")


def test_padded_vocabulary_ids_are_dropped_when_decoding():
    hello = sample.encode_prompt("Hello", 50304)
    assert sample.decode(hello + [50300]) == "Hello"
    with pytest.raises(UserError, match="vocabulary has only 64 tokens"):
        sample.encode_prompt("Hello", 64)
