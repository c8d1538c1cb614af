"""Tests for model.py: shapes, weight tying, causality, parameter count, optimizer groups, learning, export."""

import pickle

import pytest
import torch

from helpers import TINY_GPT, param_groups, tiny_gpt
from model import GPT, GPTConfig
from pilegpt.checkpoint import EXPORT_FORMAT, load_model, load_model_file, save_export
from pilegpt.common import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_forward_shapes_with_and_without_targets():
    model = tiny_gpt()
    idx = torch.randint(0, 64, (3, 10))
    logits, loss = model(idx, targets=torch.randint(0, 64, (3, 10)))
    assert logits.shape == (3, 10, 64)
    assert loss.ndim == 0 and torch.isfinite(loss)
    # A fresh model guesses close to uniformly: loss near ln(V).
    assert abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.5
    logits, loss = model(idx)
    assert logits.shape == (3, 1, 64) and loss is None


def test_last_position_logits_match_full_logits():
    model = tiny_gpt().eval()
    idx = torch.randint(0, 64, (2, 9))
    full, _ = model(idx, targets=torch.zeros_like(idx))
    last, _ = model(idx)
    torch.testing.assert_close(last[:, 0], full[:, -1])


def test_ignore_index_minus_one_is_left_out_of_the_loss():
    model = tiny_gpt()
    idx = torch.randint(0, 64, (2, 8))
    targets = torch.randint(0, 64, (2, 8))
    masked = targets.clone()
    masked[:, 4:] = -1
    logits, loss = model(idx, targets=masked)
    expected = torch.nn.functional.cross_entropy(logits[:, :4].reshape(-1, 64), targets[:, :4].reshape(-1))
    torch.testing.assert_close(loss, expected)


def test_sequence_longer_than_block_size_is_rejected():
    with pytest.raises(ValueError, match="block_size"):
        tiny_gpt()(torch.zeros(1, 17, dtype=torch.long))


def test_token_embedding_is_tied_to_lm_head():
    model = tiny_gpt()
    assert model.transformer.wte.weight is model.lm_head.weight
    names = [n for n, _ in model.named_parameters()]
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names  # listed once
    assert "lm_head.weight" in model.state_dict()  # but kept under both names for GPT-2 compatibility


def test_gpt2_parameter_names():
    keys = set(tiny_gpt().state_dict())
    for name in ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.1.ln_1.weight",
                 "transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_proj.bias",
                 "transformer.h.0.ln_2.bias", "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_proj.weight",
                 "transformer.ln_f.weight", "lm_head.weight"]:
        assert name in keys


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=64, n_layer=8, n_head=4, n_embd=256))
    c_proj = model.transformer.h[0].attn.c_proj.weight
    c_fc = model.transformer.h[0].mlp.c_fc.weight
    assert abs(c_fc.std().item() - 0.02) < 0.002
    assert abs(c_proj.std().item() - 0.02 / (2 * 8) ** 0.5) < 0.0005
    assert torch.all(model.transformer.h[0].attn.c_attn.bias == 0)


def test_attention_is_causal():
    model = tiny_gpt().eval()
    idx = torch.randint(0, 64, (2, 12))
    changed = idx.clone()
    t = 7
    changed[:, t] = (changed[:, t] + 1) % 64
    before, _ = model(idx, targets=torch.zeros_like(idx))
    after, _ = model(changed, targets=torch.zeros_like(idx))
    torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)  # the past ignores the future
    assert (after[:, t:] - before[:, t:]).abs().max() > 1e-4  # and the change is seen from t on


def test_gpt2_124m_parameter_count():
    with torch.device("meta"):
        model = GPT(GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768, bias=True))
    assert model.num_params() == 124_439_808
    assert model.num_params(non_embedding=True) == 124_439_808 - 1024 * 768
    # 6N + 12*L*H*Q*T with N the non-embedding count
    assert model.flops_per_token() == 6 * (124_439_808 - 1024 * 768) + 12 * 12 * 12 * 64 * 1024


def test_optim_groups_cover_each_parameter_once_and_decay_only_matrices():
    model = tiny_gpt()
    groups = param_groups(model, weight_decay=0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids))  # no parameter twice (the tied matrix once)
    assert set(ids) == {id(p) for p in model.parameters()}
    assert all(p.dim() == 2 for p in groups[0]["params"])
    assert all(p.dim() == 1 for p in groups[1]["params"])
    named = dict(model.named_parameters())
    assert any(p is named["transformer.wte.weight"] for p in groups[0]["params"])
    assert any(p is named["transformer.ln_f.weight"] for p in groups[1]["params"])
    torch.optim.AdamW(groups, lr=1e-3)  # accepted as is


def test_tiny_model_overfits_one_batch():
    model = tiny_gpt(seed=1)
    torch.manual_seed(1)
    x = torch.randint(0, 64, (4, 16))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(param_groups(model, weight_decay=0.0), lr=3e-3)
    first = None
    for _ in range(150):
        _, loss = model(x, targets=y)
        first = first if first is not None else loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert first > 3.5
    assert loss.item() < 0.1


def test_generate_length_and_greedy_determinism():
    model = tiny_gpt().eval()
    idx = torch.randint(0, 64, (2, 5))
    out = model.generate(idx, max_new_tokens=20, top_k=1)  # 25 > block_size 16: the context is cropped
    assert out.shape == (2, 25)
    assert torch.equal(out[:, :5], idx)
    torch.manual_seed(123)
    again = model.generate(idx, max_new_tokens=20, top_k=1, temperature=0.7)
    assert torch.equal(out, again)  # top_k=1 is greedy whatever the seed and temperature
    # greedy means each new token is the argmax of the model's logits for its context
    logits, _ = model(out[:, 9:16])
    assert torch.equal(logits[:, -1].argmax(-1), out[:, 16])


def test_generate_sampling_follows_the_seed():
    model = tiny_gpt().eval()
    idx = torch.zeros(1, 1, dtype=torch.long)
    torch.manual_seed(5)
    a = model.generate(idx, 30)
    torch.manual_seed(5)
    b = model.generate(idx, 30)
    torch.manual_seed(6)
    c = model.generate(idx, 30)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_embd=30, n_head=4), "multiple of n_head"),
    (dict(n_layer=0), "n_layer"),
    (dict(block_size=2.5), "block_size"),
    (dict(dropout=1.0), "dropout"),
    (dict(bias="yes"), "bias"),
])
def test_bad_config_raises_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{**TINY_GPT, **kwargs})


def test_crop_block_size():
    model = tiny_gpt()
    model.crop_block_size(8)
    assert model.config.block_size == 8 and model.transformer.wpe.weight.shape == (8, 32)
    assert model(torch.zeros(1, 8, dtype=torch.long))[0].shape == (1, 1, 64)


def test_export_round_trip(tmp_path):
    model = tiny_gpt(bias=False).eval()
    path = tmp_path / "model.pt"
    save_export(model, path)
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temporary file left behind
    loaded = load_model_file(path)
    assert loaded.config == model.config and not loaded.training
    assert loaded.transformer.wte.weight is loaded.lm_head.weight
    idx = torch.randint(0, 64, (2, 8))
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=0, atol=0)
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == EXPORT_FORMAT and raw["model_args"]["n_layer"] == 2
    assert "transformer.h.0.attn.c_attn.weight" in raw["model"]


def test_export_of_a_compiled_or_ddp_like_wrapper_uses_plain_names(tmp_path):
    class Wrapper(torch.nn.Module):  # like DistributedDataParallel: the model sits in .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    model = tiny_gpt()
    save_export(Wrapper(model), tmp_path / "model.pt")
    assert set(torch.load(tmp_path / "model.pt", weights_only=True)["model"]) == set(model.state_dict())


class Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_loading_an_export_refuses_pickled_code(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "model.pt"
    torch.save({"format": EXPORT_FORMAT, "model_args": {}, "model": Exploit(marker)}, path)
    with pytest.raises(UserError, match="not a model export or Composer checkpoint that can be read safely"):
        load_model_file(path)
    assert not marker.exists()
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps(Exploit(marker)))
    with pytest.raises(UserError):
        load_model_file(plain)
    assert not marker.exists()


def test_load_export_errors_name_the_file(tmp_path):
    with pytest.raises(UserError, match="missing.pt not found"):
        load_model(str(tmp_path / "missing.pt"))
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    with pytest.raises(UserError, match="other.pt"):
        load_model_file(other)
    bad_args = tmp_path / "bad_args.pt"
    torch.save({"format": EXPORT_FORMAT, "model_args": {**TINY_GPT, "n_layers": 3}, "model": {}}, bad_args)
    with pytest.raises(UserError, match="n_layers"):
        load_model_file(bad_args)


@pytest.mark.parametrize("preset", ["gpt2", "modern"])
def test_the_forward_compiles_into_one_graph(preset):
    # torch.compile traces the forward of GPT-2 (GPTConfig's defaults) and of config/modern.py's preset as one graph,
    # in training (with targets) and in generation (without): a graph break would split it and cost speed on a GPU
    from helpers import REPO
    from pilegpt.train.config_load import load_config

    presets = {"gpt2": [], "modern": [str(REPO / "config" / "modern.py")]}[preset]
    cfg = load_config([str(REPO / "config" / "tiny.py"), *presets, "--data_dir=data/x", "--vocab_size=64"])
    model = GPT(cfg.model_config())
    assert (model.config.norm, model.config.pos_emb) == (("rmsnorm", "rope") if preset == "modern"
                                                          else ("layernorm", "learned"))
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    for kwargs in (dict(targets=idx), {}):
        explained = torch._dynamo.explain(model)(idx, **kwargs)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
