"""model.py's architecture options, each against its formula computed here independently: RoPE (a complex
rotation), grouped-query attention (k/v heads repeated by hand), RMSNorm, SwiGLU and ReLU², QK-norm, the logit
softcap, the untied head, short attention windows; the one-line errors of impossible combinations; flops_per_token
counted by hand; a variant through TrainConfig and a model.pt export. Defaults staying GPT-2: test_model.py and
the golden losses."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import TINY_GPT, param_groups, tiny_gpt
from model import GPT, CausalSelfAttention, GPTConfig, RMSNorm, apply_rope, rope_tables, swiglu_hidden
from pilegpt.checkpoint import load_model_file, save_export

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = {**TINY_GPT, "n_head": 4}  # 4 heads: room for grouped-query attention
LLAMA = dict(pos_emb="rope", norm="rmsnorm", mlp="swiglu", bias=False)  # the Llama-like combination


def tiny_model(seed: int = 0, **overrides) -> GPT:
    return tiny_gpt(seed, **{"n_head": 4, **overrides})


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(hs) + causal mask) v, for (B, nh, T, hs) inputs, written out."""
    T, hs = q.size(-2), q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return scores.softmax(-1) @ v


def test_rope_is_a_complex_rotation_of_channel_pairs():
    B, T, nh, hs, theta = 2, 7, 3, 8, 500.0
    x = torch.randn(B, T, nh, hs)
    cos, sin = rope_tables(hs, T, theta)
    # channel i and i + hs/2 as one complex number, turned by pos * theta^(-2i/hs)
    z = torch.complex(x[..., : hs // 2].double(), x[..., hs // 2:].double())
    angle = torch.arange(T).double()[:, None] * theta ** (-torch.arange(0, hs, 2).double() / hs)[None, :]
    turned = z * torch.polar(torch.ones_like(angle), angle)[None, :, None, :]
    expected = torch.cat((turned.real, turned.imag), dim=-1).float()
    torch.testing.assert_close(apply_rope(x, cos, sin), expected, rtol=0, atol=1e-5)


def test_rope_scores_depend_on_relative_position_only():
    hs = 16
    cos, sin = rope_tables(hs, 12, 10000.0)
    q, k = torch.randn(1, 1, 1, hs), torch.randn(1, 1, 1, hs)
    def score(i, j):
        rq = apply_rope(q.expand(1, 12, 1, hs), cos, sin)[0, i, 0]
        rk = apply_rope(k.expand(1, 12, 1, hs), cos, sin)[0, j, 0]
        return (rq * rk).sum()
    torch.testing.assert_close(score(5, 2), score(9, 6), rtol=0, atol=1e-5)
    assert abs(score(5, 2) - score(5, 4)) > 1e-4


def split_heads(model_attn, x, n_kv):
    """q, k, v (B, nh, T, hs) of a CausalSelfAttention's c_attn, k and v with n_kv heads."""
    B, T, C = x.shape
    hs = C // model_attn.n_head
    q, k, v = model_attn.c_attn(x).split([C, n_kv * hs, n_kv * hs], dim=-1)
    return (q.view(B, T, -1, hs).transpose(1, 2), k.view(B, T, -1, hs).transpose(1, 2),
            v.view(B, T, -1, hs).transpose(1, 2))


@pytest.mark.parametrize("n_kv_head", [None, 4, 2, 1])
def test_attention_with_kv_heads_is_attention_over_repeated_kv_heads(n_kv_head):
    torch.manual_seed(0)
    attn = CausalSelfAttention(GPTConfig(**{**TINY, "n_kv_head": n_kv_head})).eval()
    x = torch.randn(2, 10, 32)
    n_kv = n_kv_head or 4
    assert attn.c_attn.weight.shape == (32 + 2 * n_kv * 8, 32)  # k and v projections shrink with n_kv_head
    q, k, v = split_heads(attn, x, n_kv)
    g = 4 // n_kv  # query heads per k/v head: kv head j serves query heads j*g .. j*g+g-1
    y = causal_attention(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1))
    expected = attn.c_proj(y.transpose(1, 2).reshape(2, 10, 32))
    torch.testing.assert_close(attn(x), expected, rtol=0, atol=1e-5)


def test_rmsnorm_is_its_formula():
    norm = RMSNorm(6, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 7.0))
    x = torch.randn(3, 4, 6) * 5 + 2
    expected = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-5) * torch.arange(1.0, 7.0)
    torch.testing.assert_close(norm(x), expected)
    model = tiny_model(norm="rmsnorm")
    assert isinstance(model.transformer.ln_f, RMSNorm) and "transformer.ln_f.bias" not in model.state_dict()


def test_swiglu_is_its_formula_with_llamas_width():
    assert [swiglu_hidden(n) for n in (32, 128, 768, 4096)] == [256, 512, 2048, 11008]  # Llama 7B: 11008
    mlp = tiny_model(**LLAMA).transformer.h[0].mlp
    x = torch.randn(2, 5, 32)
    gate_w, up_w = mlp.c_fc.weight[:256], mlp.c_fc.weight[256:]
    expected = (F.silu(x @ gate_w.T) * (x @ up_w.T)) @ mlp.c_proj.weight.T
    torch.testing.assert_close(mlp(x), expected, rtol=0, atol=1e-5)


def test_relu2_is_its_formula():
    mlp = tiny_model(mlp="relu2").transformer.h[0].mlp
    x = torch.randn(2, 5, 32)
    hidden = torch.clamp(x @ mlp.c_fc.weight.T + mlp.c_fc.bias, min=0) ** 2
    torch.testing.assert_close(mlp(x), hidden @ mlp.c_proj.weight.T + mlp.c_proj.bias, rtol=0, atol=1e-5)


def test_qk_norm_makes_attention_blind_to_the_scale_of_q_and_k():
    model = tiny_model(qk_norm=True, norm="rmsnorm", bias=False).eval()
    assert "transformer.h.0.attn.q_norm.weight" in model.state_dict()
    x = torch.randint(0, 64, (2, 12))
    before, _ = model(x, targets=x)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:64] *= 7.0  # the q and k rows (32 each)
    after, _ = model(x, targets=x)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-4)


def test_logit_softcap_is_cap_tanh_of_the_logits():
    capped, plain = tiny_model(logit_softcap=0.5).eval(), tiny_model().eval()
    x = torch.randint(0, 64, (2, 12))
    logits, loss = capped(x, targets=x)
    raw, _ = plain(x, targets=x)  # the same weights: the same draws of the RNG
    torch.testing.assert_close(logits, 0.5 * torch.tanh(raw / 0.5))
    assert logits.abs().max() < 0.5 and raw.abs().max() > 0.5
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, 64), x.view(-1)))
    torch.testing.assert_close(capped(x)[0][:, 0], logits[:, -1])  # generation's path is capped too


def test_an_untied_head_has_its_own_weight():
    model = tiny_model(tie_embeddings=False)
    assert model.lm_head.weight is not model.transformer.wte.weight
    names = dict(model.named_parameters())
    assert "lm_head.weight" in names and "transformer.wte.weight" in names
    x = torch.randint(0, 64, (2, 8))
    model(x, targets=x)[1].backward()
    assert not torch.equal(model.lm_head.weight.grad, model.transformer.wte.weight.grad)
    tied = tiny_model()
    assert model.num_params() == tied.num_params() + 64 * 32


def test_rope_model_has_no_position_parameters_and_crops_and_generates():
    model = tiny_model(**LLAMA).eval()
    assert not any("wpe" in k or "rope" in k for k in model.state_dict())  # the angles are computed, not saved
    out = model.generate(torch.randint(0, 64, (2, 5)), max_new_tokens=20, top_k=1)  # past block_size: cropped
    assert out.shape == (2, 25)
    x = torch.randint(0, 64, (1, 8))
    before, _ = model(x, targets=x)
    model.crop_block_size(8)
    assert model.config.block_size == 8 and model.rope_cos.shape == (8, 4)
    torch.testing.assert_close(model(x, targets=x)[0], before)


@pytest.mark.parametrize("overrides, message", [
    (dict(n_kv_head=3), r"n_kv_head must be None or a positive divisor of n_head \(4\), got 3"),
    (dict(n_kv_head=0), "n_kv_head must be None or a positive divisor"),
    (dict(pos_emb="rope", n_embd=36, n_head=4, n_kv_head=None), r"head size n_embd/n_head \(9\) must be even"),
    (dict(pos_emb="alibi"), "pos_emb must be one of 'learned', 'rope', got 'alibi'"),
    (dict(norm="batchnorm"), "norm must be one of 'layernorm', 'rmsnorm'"),
    (dict(mlp="geglu"), "mlp must be one of 'gelu', 'relu2', 'swiglu'"),
    (dict(logit_softcap=-1.0), r"logit_softcap must be a number >= 0 \(0 = off\), got -1.0"),
    (dict(rope_theta=0.0), "rope_theta must be a number > 0"),
    (dict(qk_norm="yes"), "qk_norm must be True or False"),
    (dict(tie_embeddings=None), "tie_embeddings must be True or False"),
])
def test_impossible_combinations_are_one_line_errors(overrides, message):
    with pytest.raises(ValueError, match=message) as e:
        GPTConfig(**{**TINY, **overrides})
    assert "\n" not in str(e.value)


def test_flops_per_token_counts_the_variant_by_hand():
    L, C, V, T, H, kv, hidden = 2, 32, 64, 16, 4, 1, 256
    model = tiny_model(**LLAMA, n_kv_head=kv, tie_embeddings=False)
    per_layer = C + C * (C + 2 * kv * 8) + C * C + C + C * 2 * hidden + hidden * C  # norms, attn, swiglu
    n = L * per_layer + C + V * C  # + ln_f and the untied lm_head; wte is a lookup, no position table
    assert model.num_params(non_embedding=True) == n
    assert model.flops_per_token() == 6 * n + 12 * L * H * (C // H) * T


@pytest.mark.parametrize("overrides", [LLAMA, {**LLAMA, "n_kv_head": 2, "qk_norm": True, "tie_embeddings": False},
                                       dict(mlp="relu2", logit_softcap=15.0), {**LLAMA, "x0_scalars": True}])
def test_a_variant_learns_and_its_export_rebuilds_it(tmp_path, overrides):
    model = tiny_model(seed=1, **overrides)
    torch.manual_seed(1)
    x = torch.randint(0, 64, (4, 16))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(param_groups(model, weight_decay=0.0), lr=3e-3)
    losses = []
    for _ in range(60):
        _, loss = model(x, targets=y)
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert losses[-1] < losses[0] - 1.5
    save_export(model, tmp_path / "model.pt")
    loaded = load_model_file(str(tmp_path / "model.pt"))
    assert loaded.config == model.config
    torch.testing.assert_close(loaded(x, targets=y)[0], model.eval()(x, targets=y)[0])


def test_train_config_passes_the_architecture_to_the_model():
    from pilegpt.train.config_load import make_config

    cfg = make_config(dict(data_dir="d", **TINY, **LLAMA, n_kv_head=2, qk_norm=True, tie_embeddings=False,
                           logit_softcap=30.0, rope_theta=5e5))
    assert cfg.model_config() == GPTConfig(**TINY, **LLAMA, n_kv_head=2, qk_norm=True, tie_embeddings=False,
                                           logit_softcap=30.0, rope_theta=5e5)


def test_a_bad_architecture_setting_is_one_config_error():
    from pilegpt.common import UserError
    from pilegpt.train.config_load import make_config

    with pytest.raises(UserError, match=r"^bad config: n_kv_head must be None or a positive divisor of n_head") as e:
        make_config(dict(data_dir="d", **TINY, n_kv_head=3))
    assert "\n" not in str(e.value)


def test_init_from_fixes_the_architecture_and_n_kv_head_none_equals_n_head():
    from pilegpt.common import UserError
    from pilegpt.train.config_load import make_config

    source = GPTConfig(**TINY, **LLAMA)
    cfg = make_config(dict(data_dir="d", init_from="src", n_kv_head=4), source=source)  # 4 = n_head: agrees
    assert cfg.model_config().pos_emb == "rope" and cfg.mlp == "swiglu"  # the rest comes from the source
    with pytest.raises(UserError, match=r"the config contradicts init_from=src: mlp='relu2' but it has mlp='swiglu'"):
        make_config(dict(data_dir="d", init_from="src", mlp="relu2"), source=source)


def test_x0_scalars_start_as_the_plain_model_and_mix_the_embeddings_into_every_block():
    plain, mixed = tiny_model(seed=2, **LLAMA), tiny_model(seed=2, **LLAMA, x0_scalars=True)
    assert mixed.load_state_dict(plain.state_dict(), strict=False).missing_keys == ["resid_lambdas", "x0_lambdas"]
    x = torch.randint(0, 64, (2, 16))
    torch.testing.assert_close(mixed(x, targets=x)[0], plain(x, targets=x)[0], rtol=0, atol=0)  # 1 * x + 0 * x0
    assert all(p.dim() == 2 for p in mixed.hidden_matrices()) and len(mixed.hidden_matrices()) == len(
        plain.hidden_matrices())  # the scalars are AdamW's (no decay: 1-D), not Muon's
    with torch.no_grad():
        mixed.resid_lambdas[1], mixed.x0_lambdas[1] = 0.5, 2.0
    x0 = mixed.transformer.wte(x)  # by hand: block 1 reads 0.5 * (block 0's output) + 2 * x0
    h = mixed.transformer.h[1](0.5 * mixed.transformer.h[0](x0, mixed_rope(mixed)) + 2.0 * x0, mixed_rope(mixed))
    torch.testing.assert_close(mixed(x, targets=x)[0], mixed.lm_head(mixed.transformer.ln_f(h)))


def mixed_rope(model):
    return model.rope_cos[:16], model.rope_sin[:16]


def test_value_embeds_sit_on_every_other_block_counted_from_the_last():
    from model import has_value_embed

    assert [i for i in range(4) if has_value_embed(i, 4)] == [1, 3]
    assert [i for i in range(5) if has_value_embed(i, 5)] == [0, 2, 4]
    assert [i for i in range(1) if has_value_embed(i, 1)] == [0]
    model = tiny_model(n_layer=4, value_embeds=True, **LLAMA)
    assert sorted(model.value_embeds) == ["1", "3"] and model.value_embeds["1"].weight.shape == (64, 32)
    assert [hasattr(b.attn, "ve_gate") for b in model.transformer.h] == [False, True, False, True]
    plain = tiny_model(n_layer=4, **LLAMA)  # the tables are lookups: not in the non-embedding count
    assert model.num_params(non_embedding=True) == plain.num_params(non_embedding=True) + 2 * 4 * 32  # 2 gates
    assert model.num_params() == plain.num_params() + 2 * 64 * 32 + 2 * 4 * 32
    gates = [b.attn.ve_gate.weight for b in model.transformer.h[1::2]]  # Muon's (2-D, in a block); tables: AdamW's
    assert {id(p) for p in gates} <= {id(p) for p in model.hidden_matrices()}
    assert not {id(p) for p in model.value_embeds.parameters()} & {id(p) for p in model.hidden_matrices()}


def test_value_embeds_add_a_gated_token_table_to_v():
    plain, ve = tiny_model(seed=3, **LLAMA), tiny_model(seed=3, **LLAMA, value_embeds=True)
    missing = ve.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing == ["transformer.h.1.attn.ve_gate.weight", "value_embeds.1.weight"]
    x = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        ve.value_embeds["1"].weight.zero_()  # a zero table adds nothing: the plain model's logits
    torch.testing.assert_close(ve(x, targets=x)[0], plain(x, targets=x)[0], rtol=0, atol=0)
    torch.manual_seed(4)
    with torch.no_grad():
        ve.value_embeds["1"].weight.normal_()
        ve.transformer.h[1].attn.ve_gate.weight.normal_()
    attn, h = ve.transformer.h[1].attn, ve.transformer.h[0](ve.transformer.wte(x), mixed_rope(ve))
    a = ve.transformer.h[1].ln_1(h)  # by hand: block 1's attention with v + 2 sigmoid(gate(a)) * table[x]
    q, k, v = attn.c_attn(a).split(32, dim=2)
    gate = 2 * torch.sigmoid(a @ attn.ve_gate.weight.T)  # (B, T, 4 heads): n_embd 32 <= 32 gate channels
    v = v.view(2, 16, 4, 8) + gate[..., None] * ve.value_embeds["1"](x).view(2, 16, 4, 8)
    q, k = (apply_rope(t.view(2, 16, 4, 8), *mixed_rope(ve)) for t in (q, k))
    y = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).reshape(2, 16, 32)
    torch.testing.assert_close(attn(a, mixed_rope(ve), ve.value_embeds["1"](x)), attn.c_proj(y))
    assert attn.ve_gate.in_features == 32
    torch.testing.assert_close(tiny_model(**LLAMA, value_embeds=True).transformer.h[1].attn.ve_gate.weight,
                               torch.zeros(4, 32), rtol=0, atol=0)  # every gate starts at 2 sigmoid(0) = 1


def test_norms_and_rope_compute_in_the_activations_dtype_under_bf16():
    """No fp32 fallback beside bf16 activations (issue 54): RMSNorm's fp32 gain and RoPE's fp32 tables are cast to
    the input's dtype, so bf16 in is bf16 out, equal within bf16's rounding to the fp32 computation; in fp32 nothing
    is cast (the golden losses stay as they are)."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8)  # (B, T, nh, hs)
    cos, sin = rope_tables(8, 5, 10000.0)
    norm = RMSNorm(8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    for fn in (lambda t: apply_rope(t, cos, sin), norm):
        exact, low = fn(x), fn(x.bfloat16())
        assert exact.dtype == torch.float32 and low.dtype == torch.bfloat16
        torch.testing.assert_close(low.float(), exact, rtol=2e-2, atol=2e-2)
    a, b = x.chunk(2, dim=-1)  # RoPE by its formula, in fp32
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    assert torch.equal(apply_rope(x, cos, sin), torch.cat((a * c - b * s, b * c + a * s), dim=-1))
