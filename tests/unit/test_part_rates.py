"""embedding_lr and head_lr (pilegpt/train/optim/groups.py): which parameters each rate gives, in which group, at
which peak; the optimizer as before when neither is set; the settings' refusals. A run with them, resumed with them
changed: tests/e2e/test_faults.py; train.py against the plain loop with them: tests/e2e/test_muon.py."""

import math

import pytest
import torch

from model import GPT
from pilegpt.train import plain_loop
from pilegpt.train.config import TrainConfig
from pilegpt.train.optim.groups import build_optimizer, group_peak, param_groups

SIZE = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)


def config(**settings) -> TrainConfig:
    return TrainConfig(data_dir="d", **SIZE, **settings)


def names(model: torch.nn.Module, group: dict) -> list[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return sorted(by_id[id(p)] for p in group["params"])


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_unset_rates_leave_the_groups_as_they_were(optimizer):
    cfg = config(optimizer=optimizer, tie_embeddings=False)
    model = GPT(cfg.model_config())
    groups = param_groups(model, cfg)
    by_dim = lambda ps, two_d: [id(p) for p in ps if (p.dim() >= 2) == two_d]
    rest = [p for p in model.parameters() if id(p) not in {id(m) for m in model.hidden_matrices()}]
    expected = ([[id(p) for p in model.hidden_matrices()], by_dim(rest, True), by_dim(rest, False)]
                if optimizer == "muon" else [by_dim(model.parameters(), True), by_dim(model.parameters(), False)])
    assert [[id(p) for p in g["params"]] for g in groups] == expected
    assert [g["weight_decay"] for g in groups] == [0.1] * (len(groups) - 1) + [0.0]
    assert not any("part_rate" in g for g in groups)


def test_the_parts_get_their_groups_rates_and_the_width_rules_factor():
    """An untied RoPE GPT with value embeddings under Muon: the tables (wte and the value embeddings) and the head
    leave AdamW's 2-D group, which they emptied (so it goes), each at its rate x (64 / 32) ** 0.5."""
    cfg = config(optimizer="muon", pos_emb="rope", norm="rmsnorm", tie_embeddings=False, value_embeds=True,
                 embedding_lr=0.05, head_lr=0.01, lr_base_width=64, weight_decay=0.1)
    model = GPT(cfg.model_config())
    groups = build_optimizer(model, cfg).param_groups
    assert [g.get("part_rate") for g in groups] == [None, None, "embedding_lr", "head_lr"]
    assert groups[0]["muon"] and groups[1]["weight_decay"] == 0.0  # Muon's matrices; the gains, undecayed
    assert names(model, groups[2]) == ["transformer.wte.weight", "value_embeds.1.weight"]
    assert names(model, groups[3]) == ["lm_head.weight"]
    scale = math.sqrt(64 / 32)
    assert [g["lr"] for g in groups[2:]] == pytest.approx([0.05 * scale, 0.01 * scale])
    assert [group_peak(cfg, g) for g in groups] == pytest.approx([cfg.muon_lr, 6e-4 * scale, 0.05 * scale,
                                                                  0.01 * scale])
    assert [g["weight_decay"] for g in groups[2:]] == [0.1, 0.1]  # the decay of the group they left
    every = [id(p) for g in groups for p in g["params"]]
    assert sorted(every) == sorted(id(p) for p in model.parameters()) and len(every) == len(set(every))


def test_a_tied_matrix_is_the_embeddings_once_and_adamw_keeps_its_blocks():
    cfg = config(embedding_lr=0.01)  # GPT-2's architecture and AdamW: the blocks' matrices stay in the 2-D group
    model = GPT(cfg.model_config())
    groups = param_groups(model, cfg)
    assert names(model, groups[2]) == ["transformer.wpe.weight", "transformer.wte.weight"]  # lm_head is wte
    assert len(groups) == 3 and groups[2]["lr"] == 0.01 and "transformer.h.0.attn.c_attn.weight" in names(
        model, groups[0])


def test_the_plain_loop_schedules_each_part_from_its_own_peak(monkeypatch):
    """The plain loop (pinned to train.py's losses by tests/e2e/test_muon.py) gives each group its peak x the
    schedule's factor: recorded at every step through the optimizer it builds."""
    seen = []
    original = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        seen.append([g["lr"] for g in self.param_groups])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    cfg = config(tie_embeddings=False, embedding_lr=0.04, head_lr=0.02, learning_rate=1e-3, min_lr=1e-4,
                 warmup="2ba", max_duration="4ba", global_batch_size=2, device_train_microbatch_size=2)
    rows = torch.randint(0, 64, (64,), dtype=torch.uint16).numpy()
    monkeypatch.setattr(plain_loop, "build_dataloaders", lambda *a, **k: [type("D", (), {"dataloader": [
        {"x": torch.from_numpy(rows[:32].astype("int64")).view(2, 16),
         "y": torch.from_numpy(rows[1:33].astype("int64")).view(2, 16)}] * 4})()])
    list(plain_loop.train(cfg))
    for lrs in seen:  # [the 2-D group, the gains, the embeddings, the head]: one factor for all
        factor = lrs[0] / 1e-3
        assert lrs == pytest.approx([1e-3 * factor, 1e-3 * factor, 0.04 * factor, 0.02 * factor])
    assert [round(lrs[0] / 1e-3, 6) for lrs in seen] == [0.0, 0.0, 0.5, 1.0]  # warmup: batch i trains at lr(i - 1)


def test_a_checkpoint_of_another_group_layout_is_one_line_after_the_load():
    """Without config.json nothing before the load knows the run's rates; torch's distributed state dict then loads
    the checkpoint's groups by parameter names into this run's layout: a group with another part's label, or one
    left without settings, is refused in one line (it crashed in a format string, or resumed with a wrong rate)."""
    from pilegpt.common import UserError
    from pilegpt.train.optim.on_resume import apply_group_settings, group_settings

    cfg = config(tie_embeddings=False)  # this run: no part's rate; its checkpoint had head_lr's group
    model = GPT(cfg.model_config())
    optimizer = build_optimizer(model, cfg)
    built = group_settings(optimizer)
    restored = [dict(g) for g in optimizer.param_groups]
    optimizer.param_groups[:] = [restored[0] | {"part_rate": "head_lr"}, restored[1]]  # as the load left them
    with pytest.raises(UserError) as e:
        apply_group_settings(optimizer, None, built)
    assert str(e.value) == ("autoresume: the checkpoint's optimizer has its own groups for head_lr, this run's for no "
                            "part (a part's rate, embedding_lr or head_lr, set or unset adds or drops a group): resume "
                            "with the run's settings or start a new run with another --run_name")
    optimizer.param_groups[:] = [restored[0], {"params": restored[1]["params"]}]  # a group the load gave nothing
    with pytest.raises(UserError, match="own groups for no part \\(and groups it has no settings for\\), this run's "
                                        "for no part"):
        apply_group_settings(optimizer, None, built)


def test_an_autoresume_names_a_changed_shape_and_a_part_rate_set_or_unset_in_one_line(tmp_path):
    from pilegpt.common import UserError
    from pilegpt.train.config import used_settings
    from pilegpt.train.run.folder import check_same_model

    run = config(tie_embeddings=False, head_lr=0.005)
    (tmp_path / "config.json").write_text(__import__("json").dumps({"config": used_settings(run)}))
    with pytest.raises(UserError) as e:
        check_same_model(config(embedding_lr=0.01), str(tmp_path), str(tmp_path))
    assert str(e.value).startswith(
        f"autoresume: the checkpoints in {tmp_path} are of another model: tie_embeddings=True (the run has False); "
        "and have another optimizer layout: embedding_lr=0.01 (the run has 0.0), head_lr=0.0 (the run has 0.005) (a "
        "part's rate set or unset adds or drops a parameter group; only a change between rates resumes); resume with")
    check_same_model(config(tie_embeddings=False, head_lr=0.02), str(tmp_path), str(tmp_path))  # a new rate: fine


@pytest.mark.parametrize("settings, message", [
    (dict(embedding_lr=-0.1), "embedding_lr must be >= 0 (0 = learning_rate's), got -0.1"),
    (dict(head_lr=0.01), "head_lr=0.01 is for an untied output head, but tie_embeddings=True makes the head the "
                         "token embedding (embedding_lr's): set tie_embeddings=False or head_lr=0"),
    (dict(embedding_lr=0.01, model_class="pkg.mod:Model"), "embedding_lr=0.01 is the rate of a part of model.py's "
                                                           "GPT, which model_class=pkg.mod:Model does not have"),
    (dict(head_lr=float("nan"), tie_embeddings=False), "head_lr must be a finite number, got nan"),
    (dict(embedding_lr=float("inf")), "embedding_lr must be a finite number, got inf"),
    (dict(embedding_lr=1e300), "embedding_lr must be at most 1e+06 (a learning rate; AdamW's are ~1e-3, Muon's "
                               "~0.02), got 1e+300"),
    (dict(learning_rate=1e300), "learning_rate must be at most 1e+06"),  # float32's overflow, not a divergence
    (dict(muon_lr=1e7, optimizer="muon"), "muon_lr must be at most 1e+06"),
])
def test_a_bad_part_rate_is_one_config_error(settings, message):
    with pytest.raises(ValueError) as e:
        config(**settings)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("settings, message", [  # the one reason that applies, not every rule it also breaks
    (dict(head_lr=-1.0), "head_lr must be >= 0 (0 = learning_rate's), got -1.0"),
    (dict(head_lr=0.01, model_class="pkg.mod:Model"), "head_lr=0.01 is the rate of a part of model.py's GPT, which "
                                                      "model_class=pkg.mod:Model does not have: set head_lr=0"),
])
def test_a_part_rate_gets_the_one_reason_that_applies(settings, message):
    with pytest.raises(ValueError) as e:
        config(**settings)
    assert str(e.value) == message


def test_the_nan_stops_advice_names_the_part_rates_in_use():
    import train

    assert train.divergence_causes(config(tie_embeddings=False, head_lr=1e3, learning_rate=3e-3,
                                                    weight_decay=0.0)) == (
        "lower --learning_rate (now 0.003) or --head_lr (now 1000), or raise --warmup")
    assert train.divergence_causes(config(learning_rate=3e-3)) == "lower --learning_rate (now 0.003) or raise --warmup"
