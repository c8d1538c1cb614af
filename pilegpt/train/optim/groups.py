"""The optimizer's one home: the model's parts (hidden matrices, embedding tables, output head, scalars) become
parameter groups in one function, every trainable parameter in exactly one group (checked once), and one builder
makes the optimizer from them, for train.py and the plain loop alike.

    optimizer = build_optimizer(model, cfg, fused=device == "gpu")   # Muon and AdamW, or AdamW alone
    peak = group_peak(cfg, group)                                     # a group's peak learning rate

The groups, in the order a checkpoint's optimizer state keeps them:
- optimizer="muon": Muon's (the hidden matrices, at muon_lr), then AdamW's 2-D weights (decayed) and its 1-D ones
  (biases, norm gains, scalars: not decayed), at adamw_lr().
- optimizer="adamw": the 2-D weights (decayed) and the 1-D ones (not), at adamw_lr(); a custom model's own
  optim_groups(weight_decay) instead, when it has one (model_contract.py).
- then, for embedding_lr and head_lr when set, the embedding tables and the untied head each leave the group they
  were in for one of their own at that rate (nanochat gives its embedding and unembedding their own rates), keeping
  its weight decay; a group they leave empty goes. Unset, the groups are the ones above.
The schedule multiplies every group's peak alike (schedule.py), so a part's rate also ends at min_lr / learning_rate
of its peak; lr_base_width's factor scales AdamW's rates, the parts' too.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from pilegpt.common import UserError, one_line
from pilegpt.train.config import MUON_OPTIONS, PART_RATES, TrainConfig
from pilegpt.train.optim.muon import Muon


def build_optimizer(model: nn.Module, cfg: TrainConfig, fused: bool = False) -> torch.optim.Optimizer:
    """cfg's optimizer over param_groups(model, cfg): Muon (AdamW's part in torch's fused kernel, on CPU too) with the
    run's Muon options, or torch.optim.AdamW (fused on GPU)."""
    groups = param_groups(model, cfg)
    if cfg.optimizer == "muon":
        options = {key: getattr(cfg, setting) for setting, (key, _) in MUON_OPTIONS.items()}
        options["wd_cosine"] = cfg.max_batches() if cfg.muon_wd_cosine else 0  # Muon's decay falls to 0 by the end
        if cfg.muon_momentum_warmdown:  # [end, first, last]: over the learning rate's warmdown (lr_schedule="wsd")
            n = cfg.max_batches()
            options["momentum_warmdown"] = [cfg.muon_momentum_warmdown, n - round(cfg.warmdown * n), n]
        return Muon(groups, betas=(cfg.beta1, cfg.beta2), **options)
    return torch.optim.AdamW(groups, lr=cfg.adamw_lr(), betas=(cfg.beta1, cfg.beta2), fused=fused)


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """The optimizer's parameter groups for `model` under cfg (the module docstring): every trainable parameter in
    exactly one group (checked)."""
    params = list({id(p): p for p in model.parameters() if p.requires_grad}.values())  # a tied matrix once
    decayed = lambda ps: [p for p in ps if p.dim() >= 2]
    kept = lambda ps: [p for p in ps if p.dim() < 2]
    wd = cfg.weight_decay
    if cfg.optimizer == "muon":
        hidden = {id(p) for p in hidden_matrices(model, params)}
        rest = [p for p in params if id(p) not in hidden]
        muon_wd = wd if cfg.muon_weight_decay is None else cfg.muon_weight_decay  # AdamW's groups keep weight_decay
        groups = [dict(params=[p for p in params if id(p) in hidden], lr=cfg.muon_lr, weight_decay=muon_wd, muon=True),
                  dict(params=decayed(rest), lr=cfg.adamw_lr(), weight_decay=wd),
                  dict(params=kept(rest), lr=cfg.adamw_lr(), weight_decay=0.0)]
    elif hasattr(model, "optim_groups"):  # a custom model's own AdamW groups (model_contract.py)
        groups = model.optim_groups(wd)
    else:  # weight decay on the 2-D weights (matmuls, embeddings), none on biases and norm gains
        groups = [{"params": decayed(params), "weight_decay": wd}, {"params": kept(params), "weight_decay": 0.0}]
    groups = with_part_rates(groups, model, cfg)
    listed = [id(p) for g in groups for p in g["params"]]
    if len(listed) != len(set(listed)) or set(listed) != {id(p) for p in params}:
        raise UserError(f"{type(model).__name__}'s parameter groups must hold each trainable parameter exactly once "
                        "(a parameter is in no group or in two): fix its optim_groups()")
    return groups


def part_params(model: nn.Module, setting: str) -> list[nn.Parameter]:
    """The parameters the rate `setting` gives: embedding_lr every embedding table (the tied matrix once), head_lr the
    untied output head, scalar_lr the scalars that mix other streams into the residual; what the model says
    (model.py's GPT.param_parts()), else every nn.Embedding's table, `lm_head.weight` and no scalars."""
    part = {"embedding_lr": "embedding", "head_lr": "head", "scalar_lr": "scalars"}[setting]
    if callable(getattr(model, "param_parts", None)):
        return list(model.param_parts().get(part, []))
    if part == "head":
        return [model.lm_head.weight]
    if part == "scalars":  # model.py's GPT says which (a model without param_parts() has none)
        return []
    tables = [m.weight for m in model.modules() if isinstance(m, nn.Embedding) and m.weight.requires_grad]
    return list({id(p): p for p in tables}.values())


def with_part_rates(groups: list[dict], model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """`groups` with each part whose rate is set moved out of its group into one of its own at that rate (times
    lr_base_width's factor), appended in PART_RATES's order; a part keeps the weight decay of the group it left,
    and a group it leaves empty is dropped."""
    for setting in PART_RATES:
        if not getattr(cfg, setting):
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
        groups.append(dict(params=params, lr=group_peak(cfg, {"part_rate": setting}), weight_decay=decay,
                           part_rate=setting))
    return groups


def group_peak(cfg: TrainConfig, group: dict) -> float:
    """A parameter group's peak learning rate: Muon's muon_lr, a part's its own rate (times lr_base_width's factor,
    scalar_lr's excepted), AdamW's others adamw_lr()."""
    if group.get("muon"):
        return cfg.muon_lr
    setting: Optional[str] = group.get("part_rate")
    return getattr(cfg, setting) * cfg.part_scale(setting) if setting else cfg.adamw_lr()


def hidden_matrices(model: nn.Module, params: list[nn.Parameter]) -> list[nn.Parameter]:
    """model.hidden_matrices(), checked: some of the model's own trainable parameters (`params`), each 2-D; any
    other answer is one line naming the method (Muon would fail in a traceback, or update nothing at all)."""
    name = f"{type(model).__name__}.hidden_matrices()"
    if not callable(getattr(model, "hidden_matrices", None)):
        raise UserError(f"optimizer='muon' needs {name} (the 2-D weights Muon updates; model.py's GPT has one): add "
                        "the method or set optimizer='adamw'")
    try:
        hidden = list(model.hidden_matrices())
    except Exception as e:
        raise UserError(f"optimizer='muon': {name} failed: {type(e).__name__}: {one_line(e)}") from None
    ours = {id(p) for p in params}
    problems = [f"item {i} is {'not a tensor' if not torch.is_tensor(p) else 'not a trainable parameter of the model'}"
                for i, p in enumerate(hidden) if not torch.is_tensor(p) or id(p) not in ours]
    problems += [f"item {i} is {p.dim()}-D {tuple(p.shape)}" for i, p in enumerate(hidden)
                 if torch.is_tensor(p) and id(p) in ours and p.dim() != 2]
    if not hidden or problems:
        got = "; ".join(problems) if hidden else "it returned no parameters (Muon would update nothing)"
        raise UserError(f"optimizer='muon': {name} must return some of the model's own trainable 2-D weights: {got}; "
                        "fix the method or set optimizer='adamw'")
    return hidden
