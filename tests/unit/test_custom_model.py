"""Your own model by import path (pilegpt/model_contract.py): the resolver's and the contract's one-line errors,
train.py's wrapper around a tiny module of this file, and its weights saved and rebuilt only with the class named.
End to end (train, kill, autoresume, sample, eval): tests/e2e/test_custom_model.py."""

import sys
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import train
from helpers import main_error, param_groups
from pilegpt import model_contract
from pilegpt.checkpoint import load_model_file, save_export
from pilegpt.common import UserError
from pilegpt.model_contract import ModelSpec
from pilegpt.train.config_load import make_config


class TinyLM(nn.Module):
    """A bigram model: the smallest module of the contract (no optional methods)."""

    def __init__(self, vocab_size: int = 16, block_size: int = 8):
        super().__init__()
        self.block_size = block_size
        self.table = nn.Embedding(vocab_size, vocab_size)
        self.gain = nn.Parameter(torch.ones(vocab_size))

    def forward(self, idx, targets=None):
        logits = self.table(idx) * self.gain
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss


class CountedLM(TinyLM):
    """TinyLM with the optional methods."""

    def flops_per_token(self):
        return 1000

    def optim_groups(self, weight_decay):
        return [{"params": list(self.parameters()), "weight_decay": 0.5}]


class LogitsOnly(TinyLM):
    def forward(self, idx, targets=None):
        return super().forward(idx, targets)[0]


class NoParameters(nn.Module):
    def forward(self, idx, targets=None):
        return idx.float(), idx.float().sum()


@pytest.fixture
def toy(monkeypatch):
    """A module "toy" with the classes above (and one that is no nn.Module), importable by path."""
    module = types.ModuleType("toy")
    for cls in (TinyLM, CountedLM, LogitsOnly, NoParameters):
        setattr(module, cls.__name__, cls)
    module.NotAModule = type("NotAModule", (), {})
    monkeypatch.setitem(sys.modules, "toy", module)
    return module


@pytest.mark.parametrize("path, error", [
    ("toy.TinyLM", "model_class: 'toy.TinyLM' is not an import path: write it 'package.module:ClassName'"),
    ("no_such_pkg.mod:X", "model_class: cannot import no_such_pkg.mod (ModuleNotFoundError: No module named "
                          "'no_such_pkg'); write it as 'module.path:ClassName' with the module on PYTHONPATH"),
    ("toy:Missing", "model_class: module toy has no class Missing"),
])
def test_the_resolver_names_what_is_wrong_in_one_line(toy, path, error):
    with pytest.raises(UserError) as e:
        model_contract.import_class(path, "model_class")
    assert str(e.value) == error


@pytest.mark.parametrize("name, args, error", [
    ("NotAModule", {}, "model_class: toy:NotAModule is not a torch.nn.Module subclass"),
    ("NoParameters", {}, "model_class: toy:NoParameters has no trainable parameters"),
    ("TinyLM", {"depth": 3}, "model_class: toy:TinyLM(**{'depth': 3}) failed: TinyLM.__init__() got an unexpected "
                             "keyword argument 'depth'; set its constructor's arguments with model_args"),
])
def test_a_class_that_breaks_the_contract_is_refused_when_built(toy, name, args, error):
    with pytest.raises(UserError) as e:
        model_contract.build(ModelSpec(f"toy:{name}", args))
    assert str(e.value) == error


@pytest.mark.parametrize("module, block_size, vocab_size, error", [
    (LogitsOnly(), 8, 16, "must return (logits, loss), two tensors; it returned Tensor"),
    (TinyLM(block_size=4), 8, 16, "has a context of 4 tokens, less than block_size=8: raise it in model_args"),
    (TinyLM(vocab_size=16), 8, 50257, "predicts 16 tokens, fewer than vocab_size=50257 (the data's)"),
    (NoParameters(), 8, 16, "must return logits (B, T, V) and a scalar loss; on a (1, 4) batch they were (1, 4)"),
])
def test_a_forward_that_breaks_the_contract_is_one_line(module, block_size, vocab_size, error):
    with pytest.raises(UserError) as e:
        model_contract.check_forward(module, "toy:X", block_size, vocab_size)
    assert str(e.value).startswith("model_class: toy:X") and error in str(e.value)


@pytest.mark.parametrize("values, error", [
    ({"model_class": "toy.TinyLM"}, "model_class='toy.TinyLM' is not an import path"),
    ({"model_args": {"n": 1}}, "model_args are a model_class's constructor arguments, but model_class is ''"),
    ({"model_class": "toy:TinyLM", "init_from": "gpt2"}, "init_from=gpt2 loads weights into model.py's GPT"),
])
def test_the_config_refuses_a_custom_model_written_wrong(values, error):
    with pytest.raises(UserError, match="bad config: " + error.replace("(", r"\(").replace(")", r"\)")):
        make_config({"data_dir": "d", **values})


def test_the_wrapper_trains_a_custom_module_with_the_default_groups_and_no_mfu(toy):
    torch.manual_seed(0)
    spec = ModelSpec("toy:TinyLM", {"vocab_size": 16})
    model = train.ComposerGPT(train.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16),
                              module=model_contract.build(spec), spec=spec)
    batch = {"x": torch.randint(0, 16, (2, 8)), "y": torch.randint(0, 16, (2, 8))}
    logits, loss = model(batch)
    assert logits.shape == (2, 8, 16) and model.loss((logits, loss), batch) is loss
    assert torch.allclose(loss, F.cross_entropy(logits.flatten(0, 1), batch["y"].flatten()))
    decay, no_decay = param_groups(model.model, weight_decay=0.1)
    assert [p.shape for p in decay["params"]] == [(16, 16)] and decay["weight_decay"] == 0.1
    assert [p.shape for p in no_decay["params"]] == [(16,)] and no_decay["weight_decay"] == 0.0
    assert not hasattr(model, "flops_per_batch")  # SpeedMonitor then reports no FLOPs and no MFU
    assert model.get_extra_state() == {"model_class": "toy:TinyLM", "model_args": {"vocab_size": 16}}


def test_the_wrapper_uses_a_custom_modules_own_groups_and_flops(toy):
    spec = ModelSpec("toy:CountedLM", {})
    model = train.ComposerGPT(train.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16),
                              module=model_contract.build(spec), spec=spec)
    assert [g["weight_decay"] for g in param_groups(model.model, weight_decay=0.1)] == [0.5]
    assert model.flops_per_batch({"x": torch.zeros((3, 8), dtype=torch.long)}) == 3 * 8 * 1000
    gpt = train.ComposerGPT(train.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16))
    assert gpt.flops_per_batch({"x": torch.zeros((1, 8), dtype=torch.long)}) == 8 * gpt.model.flops_per_token()


def test_a_custom_export_is_rebuilt_only_with_the_class_named(toy, tmp_path):
    torch.manual_seed(0)
    spec = ModelSpec("toy:TinyLM", {"vocab_size": 16})
    module = model_contract.build(spec)
    save_export(module, tmp_path / "model.pt", spec)
    path = str(tmp_path / "model.pt")
    with pytest.raises(UserError, match=r"holds your own model toy:TinyLM: pass --model-class toy:TinyLM to rebuild "
                                        r"it \(a class named in a file is never imported\)"):
        load_model_file(path)
    with pytest.raises(UserError, match="--model-class toy:CountedLM, but .* holds toy:TinyLM: pass that one"):
        load_model_file(path, model_class="toy:CountedLM")
    with pytest.raises(UserError, match="holds your own model toy:TinyLM: export_hf.py refuses it"):
        load_model_file(path, model_class="toy:TinyLM", custom_refused="export_hf.py refuses it")
    loaded = load_model_file(path, model_class="toy:TinyLM")
    assert type(loaded) is TinyLM and not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), module.state_dict().values()))


def test_a_gpt_file_with_a_model_class_is_one_line(tmp_path):
    from helpers import tiny_export

    with pytest.raises(UserError, match="holds model.py's GPT, not toy:TinyLM: drop --model-class"):
        load_model_file(str(tiny_export(tmp_path)), model_class="toy:TinyLM")


def test_a_composer_checkpoint_of_a_custom_model_is_rebuilt_from_its_model_state(toy, tmp_path):
    spec = ModelSpec("toy:TinyLM", {"vocab_size": 16})
    model = train.ComposerGPT(train.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16),
                              module=model_contract.build(spec), spec=spec)
    torch.save({"state": {"model": model.state_dict()}}, tmp_path / "ep0-ba1-rank0.pt")
    loaded = load_model_file(str(tmp_path / "ep0-ba1-rank0.pt"), model_class="toy:TinyLM")
    assert torch.equal(loaded.table.weight, model.model.table.weight)


def test_without_generate_the_sampler_loops_over_forward(toy):
    torch.manual_seed(0)
    module = TinyLM(vocab_size=16, block_size=3).eval()
    idx = torch.tensor([[1, 2]])
    out = model_contract.generate_tokens(module, idx, 4, top_k=1)  # greedy: each token the argmax of the last logits
    expected = idx
    for _ in range(4):
        expected = torch.cat((expected, module(expected[:, -3:])[0][:, -1].argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(out, expected) and out.shape == (1, 6)


def test_sample_py_without_model_class_on_a_custom_export_is_one_line(toy, tmp_path, capsys):
    import sample

    save_export(TinyLM(), tmp_path / "model.pt", ModelSpec("toy:TinyLM", {}))
    error = main_error(sample.main, ["--checkpoint", tmp_path, "--device", "cpu"], capsys)
    assert error == (f"error: {tmp_path / 'model.pt'} holds your own model toy:TinyLM: pass --model-class toy:TinyLM "
                     "to rebuild it (a class named in a file is never imported)")


def test_export_hf_and_init_from_refuse_a_custom_model_in_one_line(toy, tmp_path, capsys):
    import export_hf
    from pilegpt.hf import load_pretrained

    (tmp_path / "run").mkdir()
    save_export(TinyLM(), tmp_path / "run" / "model.pt", ModelSpec("toy:TinyLM", {}))
    error = main_error(export_hf.main, [tmp_path / "run", tmp_path / "hf"], capsys)
    assert error == (f"error: {tmp_path / 'run' / 'model.pt'} holds your own model toy:TinyLM: export_hf.py writes "
                     "Hugging Face GPT-2 from model.py's GPT only")
    with pytest.raises(UserError, match="holds your own model toy:TinyLM: init_from loads weights into model.py's "
                                        "GPT; your own model trains from scratch"):
        load_pretrained(str(tmp_path / "run"))
