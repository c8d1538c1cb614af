"""AdamW's rates for parts of model.py's GPT: embedding_lr for its embedding tables (wte, wpe, the value_embeds
tables), head_lr for its untied output head and scalar_lr for the scalars that mix other streams into the residual
(x0_lambdas, the smear gate and its lambda, backout_lambda; not resid_lambdas), each in a parameter group of its
own, as nanochat gives these parts rates of their own. With none set the groups are what they were, so a run's
optimizer and its checkpoints stay as before.

    groups = with_part_rates(groups, model, cfg)     # after the optimizer's groups are built, before it is
    peak = part_peak(cfg, group)                     # the group's peak rate (None: not a part's group)

The schedule multiplies every group's own peak alike (train.py's Composer scheduler, the plain loop by hand), so a
part's rate falls to min_lr / learning_rate of its peak too. lr_base_width's factor scales these rates as it
scales learning_rate (scalar_lr's excepted: nanochat's scalar rates are the same at every width).
"""

from __future__ import annotations

from typing import Optional

from torch import nn

from pilegpt.train.config import PART_RATES, TrainConfig


def part_params(model: nn.Module, setting: str) -> list[nn.Parameter]:
    """The parameters the rate `setting` gives: embedding_lr every nn.Embedding's table (the tied matrix once),
    head_lr the output head's weight."""
    if setting == "head_lr":
        return [model.lm_head.weight]
    if setting == "scalar_lr":
        names = ("x0_lambdas", "smear_gate.weight", "smear_lambda", "backout_lambda")
        return [p for name, p in model.named_parameters() if name in names]
    tables = [m.weight for m in model.modules() if isinstance(m, nn.Embedding) and m.weight.requires_grad]
    return list({id(p): p for p in tables}.values())


def with_part_rates(groups: list[dict], model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """`groups` with each part whose rate is set moved out of its group into one of its own at that rate (times
    lr_base_width's factor), appended in PART_RATES's order; a part keeps the weight decay of the group it left,
    and a group it leaves empty is dropped. Every parameter stays in exactly one group (checked)."""
    before = sorted(id(p) for g in groups for p in g["params"])
    for setting in PART_RATES:
        rate = getattr(cfg, setting)
        if not rate:
            continue
        present = {id(p) for g in groups for p in g["params"]}  # a frozen part is in no group: nothing to rate
        params = [p for p in part_params(model, setting) if id(p) in present]
        if not params:
            continue
        ids = {id(p) for p in params}
        decay = next(g["weight_decay"] for g in groups if any(id(p) in ids for p in g["params"]))
        for group in groups:
            group["params"] = [p for p in group["params"] if id(p) not in ids]
        # a group the part emptied goes (a checkpoint keeps no settings for an empty group: torch's distributed
        # state dict keys a group by its parameters' names)
        groups = [g for g in groups if g["params"]]
        groups.append(dict(params=params, lr=rate * cfg.part_scale(setting), weight_decay=decay, part_rate=setting))
    assert sorted(id(p) for g in groups for p in g["params"]) == before, "a parameter is in no group or in two"
    return groups


def part_peak(cfg: TrainConfig, group: dict) -> Optional[float]:
    """The peak rate of a part's group (its setting times lr_base_width's factor); None for any other group."""
    setting = group.get("part_rate")
    return getattr(cfg, setting) * cfg.part_scale(setting) if setting else None
