"""The pieces of nanochat's recipe that config/nanochat.py needed and model.py / Muon lacked, each against its formula
computed here: the parameter-free RMSNorm, the normed embeddings, the smear gate, backout, q and k scaled after
QK-norm, weight_init="nanochat"'s scales, scalar_lr's group, Muon's own weight decay and its cosine; their one-line
refusals; config/nanochat.py loads. Training through train.py: tests/e2e/test_train.py's nanochat run."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import TINY_GPT, tiny_gpt
from model import GPTConfig
from pilegpt.common import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]
ROPE = dict(pos_emb="rope", norm="rmsnorm_free", mlp="relu2", bias=False, n_head=4)
DATA = ["--data_dir=data/x", "--n_layer=3", "--n_head=4", "--n_embd=32", "--block_size=16", "--vocab_size=64"]


def rms(x):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


def identity_blocks(model):
    """The model with every block the identity on the residual (its output projections 0)."""
    model.zero_output_projections()
    return model


def test_rmsnorm_free_has_no_parameters_and_is_its_formula():
    model = tiny_gpt(**ROPE, qk_norm=True)
    assert not [n for n, _ in model.named_parameters() if "ln_" in n or "_norm" in n]
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(model.transformer.ln_f(x), rms(x))


def test_embed_norm_and_smear_are_their_formulas():
    model = identity_blocks(tiny_gpt(seed=3, **ROPE, embed_norm=True, smear=True))
    x = torch.randint(0, 64, (2, 16))
    e = rms(model.transformer.wte(x))
    plain = model.lm_head(rms(e))  # smear_lambda starts at 0: no smear at all
    torch.testing.assert_close(model(x, targets=x)[0], plain)
    with torch.no_grad():
        model.smear_lambda.fill_(0.7)
    gate = 0.7 * torch.sigmoid(e[:, 1:, :24] @ model.smear_gate.weight.T)  # (B, T-1, 1)
    smeared = torch.cat([e[:, :1], e[:, 1:] + gate * e[:, :-1]], dim=1)
    torch.testing.assert_close(model(x, targets=x)[0], model.lm_head(rms(smeared)))
    assert model(x[:, :1])[0].shape == (2, 1, 64)  # one token: nothing to smear


def test_backout_subtracts_a_share_of_the_middle_blocks_residual():
    model = tiny_gpt(seed=4, **ROPE, n_layer=3, backout=True)
    x = torch.randint(0, 64, (2, 16))
    rope = (model.rope_cos[:16], model.rope_sin[:16])
    h = model.transformer.wte(x)
    for i, block in enumerate(model.transformer.h):
        h = block(h, rope)
        middle = h if i == 1 else locals().get("middle")  # n_layer // 2 = block 1
    torch.testing.assert_close(model(x, targets=x)[0], model.lm_head(rms(h - 0.2 * middle)))
    assert model.backout_lambda.requires_grad and model.backout_lambda.item() == pytest.approx(0.2)


def test_qk_scale_multiplies_the_normed_q_and_k():
    from model import apply_rope

    model = tiny_gpt(seed=5, **ROPE, qk_norm=True, qk_scale=1.2)
    attn, x = model.transformer.h[0].attn, torch.randn(2, 16, 32)
    rope = (model.rope_cos[:16], model.rope_sin[:16])
    q, k, v = (t.view(2, 16, 4, 8) for t in attn.c_attn(x).split(32, dim=2))
    q, k = (apply_rope(1.2 * rms(t), *rope).transpose(1, 2) for t in (q, k))
    y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
    torch.testing.assert_close(attn(x, rope), attn.c_proj(y.transpose(1, 2).reshape(2, 16, 32)))


@pytest.mark.parametrize("overrides, message", [
    (dict(qk_scale=0.0), r"qk_scale must be a finite number > 0 \(1 = off\), got 0.0"),
    (dict(qk_scale=-1.2), "qk_scale must be a finite number > 0"),
    (dict(qk_scale=math.inf), "qk_scale must be a finite number > 0"),
    (dict(qk_scale=math.nan), "qk_scale must be a finite number > 0"),
    (dict(qk_scale="1.2"), "qk_scale must be a finite number > 0"),
    (dict(qk_scale=True), "qk_scale must be a finite number > 0"),
    (dict(smear=1), "smear must be True or False"),
    (dict(backout="yes"), "backout must be True or False"),
    (dict(embed_norm=None), "embed_norm must be True or False"),
    (dict(norm="rmsnorm_nogain"), "norm must be one of 'layernorm', 'rmsnorm', 'rmsnorm_free'"),
])
def test_bad_settings_of_the_pieces_are_one_line_errors(overrides, message):
    with pytest.raises(ValueError, match=message) as e:
        GPTConfig(**{**TINY_GPT, **overrides})
    assert "\n" not in str(e.value)


def test_nanochat_init_gives_its_scales():
    from pilegpt.train import plain_loop
    from pilegpt.train.config_load import load_config

    cfg = load_config([*DATA, "--n_embd=128", "--vocab_size=4096", "--pos_emb=rope", "--norm=rmsnorm_free",
                       "--tie_embeddings=False", "--x0_scalars=True", "--value_embeds=True", "--smear=True",
                       "--backout=True", "--weight_init=nanochat", "--bias=False"])
    model = plain_loop.build_model(cfg)
    std = 128 ** -0.5
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.8, rel=0.02)
    assert model.lm_head.weight.std().item() == pytest.approx(0.001, rel=0.02)
    for block in model.transformer.h:
        assert block.attn.c_attn.weight.std().item() == pytest.approx(std, rel=0.02)
        assert block.attn.c_attn.weight.abs().max().item() <= 3 ** 0.5 * std
        assert block.mlp.c_fc.weight.std().item() == pytest.approx(0.4 * std, rel=0.02)
        assert block.attn.c_proj.weight.eq(0).all() and block.mlp.c_proj.weight.eq(0).all()
    torch.testing.assert_close(model.resid_lambdas.data, torch.tensor([1.15, 1.10, 1.05]))
    torch.testing.assert_close(model.x0_lambdas.data, torch.tensor([0.20, 0.125, 0.05]))
    gate = model.smear_gate.weight
    assert gate.min() >= 0 and gate.max() <= 0.02 and model.smear_lambda.item() == 0
    assert model.value_embeds["0"].weight.std().item() == pytest.approx(std, rel=0.05)
    with pytest.raises(UserError, match=r"weight_init='nanochat' initialises a new model, but init_from=gpt2 gives"):
        load_config([*DATA, "--weight_init=nanochat", "--init_from=gpt2"])
    with pytest.raises(UserError, match=r"weight_init must be 'gpt2' or 'nanochat', got 'muP'"):
        load_config([*DATA, "--weight_init=muP"])


def test_scalar_lr_groups_the_mixing_scalars_at_one_rate_at_every_width():
    from pilegpt.train import plain_loop
    from pilegpt.train.config_load import load_config
    from pilegpt.train.optim.groups import build_optimizer

    cfg = load_config([*DATA, "--optimizer=muon", "--x0_scalars=True", "--smear=True", "--backout=True",
                       "--scalar_lr=0.5", "--lr_base_width=128", "--embedding_lr=0.3", "--learning_rate=0.004"])
    model = plain_loop.build_model(cfg)
    groups = {g.get("part_rate"): g for g in build_optimizer(model, cfg).param_groups}
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in groups["scalar_lr"]["params"]) == [
        "backout_lambda", "smear_gate.weight", "smear_lambda", "x0_lambdas"]
    assert groups["scalar_lr"]["lr"] == 0.5  # not x (128 / 32) ** 0.5, as embedding_lr is
    assert groups["embedding_lr"]["lr"] == pytest.approx(0.6)
    with pytest.raises(UserError, match=r"scalar_lr=0.5 is the rate of the x0_scalars, smear and backout scalars, but"):
        load_config([*DATA, "--scalar_lr=0.5"])
    with pytest.raises(UserError, match=r"scalar_lr must be >= 0 \(0 = learning_rate's\), got -1"):
        load_config([*DATA, "--scalar_lr=-1", "--smear=True"])


def test_muon_weight_decay_is_muons_alone_and_falls_as_a_cosine():
    from pilegpt.train import plain_loop
    from pilegpt.train.config_load import load_config, make_config
    from pilegpt.train.optim.groups import build_optimizer
    from pilegpt.train.optim.muon import Muon, decayed

    cfg = load_config([*DATA, "--optimizer=muon", "--weight_decay=0", "--muon_weight_decay=0.28",
                       "--muon_wd_cosine=True", "--max_duration=8ba"])
    opt = build_optimizer(plain_loop.build_model(cfg), cfg)
    muon = next(g for g in opt.param_groups if g["muon"])
    assert (muon["weight_decay"], muon["wd_cosine"]) == (0.28, 8)
    assert {g["weight_decay"] for g in opt.param_groups if not g["muon"]} == {0.0}
    factors = [decayed(muon, s) / 0.28 for s in (1, 3, 5, 9, 20)]
    assert factors == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.0, 0.0])
    p = torch.nn.Parameter(torch.ones(4, 4))  # no gradient signal: the decay alone moves p, by lr * wd(step)
    opt = Muon([dict(params=[p], muon=True)], lr=0.1, weight_decay=0.5, wd_cosine=2)
    for expected in (0.95, 0.95 * (1 - 0.025), 0.95 * (1 - 0.025)):  # wd x 1, then x 0.5, then x 0
        p.grad = torch.zeros(4, 4)
        opt.step()
        torch.testing.assert_close(p.data, torch.full((4, 4), expected))
    tokens = load_config([*DATA, "--max_duration=1000tok", "--warmup=0.1dur", "--global_batch_size=4"])
    assert tokens.max_batches() == 16  # ceil(1000 / (4 x 16))
    with pytest.raises(UserError, match=r"muon_wd_cosine=True falls over the run's optimizer steps, which max_dura"):
        load_config([*DATA, "--muon_wd_cosine=True", "--max_duration=1ep"])
    with pytest.raises(UserError, match=r"muon_weight_decay must be >= 0 \(or None: weight_decay's\), got -0.1"):
        load_config([*DATA, "--muon_weight_decay=-0.1"])
    with pytest.raises(UserError, match=r"muon_weight_decay must be a finite number, got 'nan'"):
        load_config([*DATA, "--muon_weight_decay=nan"])
    with pytest.raises(UserError, match=r"muon_weight_decay must be a finite number, got inf"):
        make_config(dict(data_dir="d", muon_weight_decay=math.inf))


def test_muon_momentum_falls_over_the_warmdown_as_nanochats():
    from pilegpt.train import plain_loop
    from pilegpt.train.config_load import load_config, make_config
    from pilegpt.train.optim.groups import build_optimizer
    from pilegpt.train.optim.muon import Muon, warmed_momentum
    from pilegpt.train.optim.on_resume import setting_changes

    cfg = load_config([*DATA, "--optimizer=muon", "--muon_momentum=0.97", "--muon_momentum_warmup=4",
                       "--muon_momentum_warmdown=0.9", "--lr_schedule=wsd", "--warmdown=0.65", "--max_duration=20ba"])
    muon = next(g for g in build_optimizer(plain_loop.build_model(cfg), cfg).param_groups if g["muon"])
    assert muon["momentum_warmdown"] == [0.9, 7, 20]  # 20 - round(0.65 x 20): the learning rate's warmdown
    # nanochat's get_muon_momentum(it), it = step - 1: 0.85 -> 0.97 over 4 steps, 0.97, then to 0.90 over 7 -> 20
    nanochat = [0.85 + it / 4 * 0.12 if it < 4 else 0.97 - (it - 7) / 13 * 0.07 if it >= 7 else 0.97
                for it in range(20)]
    assert [warmed_momentum(muon, step) for step in range(1, 21)] == pytest.approx(nanochat)
    assert warmed_momentum(muon, 40) == pytest.approx(0.9) and warmed_momentum(muon, None) == 0.97
    overlap = dict(muon, momentum_warmdown=[0.9, 2, 20])  # the warmup wins where the two overlap (nanochat's order)
    assert [warmed_momentum(overlap, s) for s in (3, 5)] == pytest.approx([0.91, 0.97 - 2 / 18 * 0.07])
    p = torch.nn.Parameter(torch.zeros(4, 4))  # the buffer shows the momentum: buf <- m buf + (1 - m) g, g = 1
    opt = Muon([dict(params=[p], muon=True)], lr=0.1, momentum=0.9, momentum_warmdown=[0.5, 1, 3])
    seen = []
    for _ in range(5):
        before = opt.state[p]["momentum_buffer"].clone() if p in opt.state else torch.zeros(4, 4)
        p.grad = torch.ones(4, 4)
        opt.step()
        seen.append(((1 - opt.state[p]["momentum_buffer"]) / (1 - before)).mean().item())
    assert seen == pytest.approx([0.9, 0.9, 0.7, 0.5, 0.5])
    before = dict(lr=0.02, weight_decay=0.1, momentum=0.97, muon=True)  # a checkpoint from before the key
    assert setting_changes(before, muon) == ["muon_momentum_warmup=4 (was 0)",
                                             "muon_momentum_warmdown=0.9 over steps 7-20 (was 0)"]
    assert setting_changes(muon, dict(muon, momentum_warmdown=[0.9, 14, 40])) == [
        "muon_momentum_warmdown=0.9 over steps 14-40 (was 0.9 over steps 7-20)"]
    for bad, message in (("--muon_momentum_warmdown=1", r"muon_momentum_warmdown must be in \[0, 1\) \(0 = off; "
                                                        r"nanochat: 0.9\), got 1.0"),
                         ("--muon_momentum_warmdown=-0.5", r"must be in \[0, 1\) .*got -0.5"),
                         ("--muon_momentum_warmdown=nan", r"muon_momentum_warmdown must be a finite number, got 'nan'"),
                         ("--muon_momentum_warmdown=fast", r"muon_momentum_warmdown must be float, got 'fast'")):
        with pytest.raises(UserError, match=message):
            load_config([*DATA, "--lr_schedule=wsd", bad])
    with pytest.raises(UserError, match=r"muon_momentum_warmdown=0.9 falls over lr_schedule='wsd''s warmdown, which "
                                        r"lr_schedule='cosine' has not: set lr_schedule='wsd' or"):
        load_config([*DATA, "--muon_momentum_warmdown=0.9"])
    with pytest.raises(UserError, match=r"muon_momentum_warmdown=0.9 falls over the run's optimizer steps, which "
                                        r"max_duration='2ep' does not give"):
        load_config([*DATA, "--lr_schedule=wsd", "--muon_momentum_warmdown=0.9", "--max_duration=2ep"])
    with pytest.raises(UserError, match=r"muon_momentum_warmdown must be a finite number, got inf"):
        make_config(dict(data_dir="d", lr_schedule="wsd", muon_momentum_warmdown=math.inf))
    assert make_config(dict(data_dir="d", lr_schedule="wsd", muon_momentum_warmdown=0.0)).muon_momentum_warmdown == 0


def test_config_nanochat_loads_after_a_size_preset_and_refuses_export():
    from pilegpt.hf import hf_model_type
    from pilegpt.train.config_load import load_config

    cfg = load_config([str(REPO / "config" / "quickstart.py"), str(REPO / "config" / "nanochat.py"),
                       "--data_dir=data/x"])
    assert (cfg.n_layer, cfg.n_embd, cfg.run_name) == (4, 128, "nanochat")
    assert cfg.min_lr == pytest.approx(0.05 * cfg.learning_rate)
    with pytest.raises(UserError, match=r"^no Hugging Face class computes this model \(pos_emb='rope' with norm='rms"):
        hf_model_type(cfg.model_config())
