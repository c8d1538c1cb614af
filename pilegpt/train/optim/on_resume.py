"""The run's optimizer settings on autoresume: Composer restores each parameter group's hyperparameters (lr,
weight_decay, betas, Muon's momentum and its options) and the schedule's base learning rates from the checkpoint, so
that a changed learning_rate, muon_lr, embedding_lr, head_lr, weight_decay, beta1, beta2, muon_momentum,
muon_momentum_warmup, muon_momentum_warmdown, muon_cautious_wd, muon_normuon or muon_polar_express would be ignored
in silence while config.json records the new value. Here the run's settings replace them; the optimizer's state
(moments, momentum buffers, step counts) stays the checkpoint's. warmup and min_lr need nothing: the schedule reads
them each batch (max_duration too, but where muon_wd_cosine or muon_momentum_warmdown hold its steps).

    built = group_settings(optimizer)                     # before the Trainer loads a checkpoint into it
    changes = apply_group_settings(optimizer, scheduler, built)   # after: ["learning_rate=0.001 (was 0.003)", ...]
"""

from __future__ import annotations

from typing import Any

import torch

from pilegpt.common import UserError
from pilegpt.train.config import MUON_OPTIONS

# a group's key -> the setting that gives it (betas: beta1, beta2); other keys (eps, fused) are not settings
SETTING_OF = {"weight_decay": "weight_decay", **{key: setting for setting, (key, _) in MUON_OPTIONS.items()}}
MUON_ONLY = tuple(key for key, _ in MUON_OPTIONS.values())  # AdamW's groups: unused
BEFORE_THEM = {key: old for key, old in MUON_OPTIONS.values() if old is not None}  # a checkpoint from before a key


def group_settings(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each parameter group's hyperparameters as the config built them ("lr" is the peak learning rate)."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def apply_group_settings(optimizer: torch.optim.Optimizer, scheduler: Any, built: list[dict]) -> list[str]:
    """Put the config's hyperparameters (`built`, group_settings before the checkpoint was loaded) back into the
    restored groups, and its peak learning rates into the schedule (Composer's LambdaLR: base_lrs, each group's
    initial_lr, and its lr now = peak x the schedule's factor now). Nothing is touched when none changed, so a resume
    with the run's settings continues bit for bit. Returns the changed settings, one "setting=new (was old)" each."""
    groups = optimizer.param_groups
    fix = "resume with the run's settings or start a new run with another --run_name"
    if len(groups) != len(built):
        raise UserError(f"autoresume: the checkpoint's optimizer has {len(groups)} parameter groups, this run's "
                        f"{len(built)}: {fix}")
    # torch's distributed state dict loads a checkpoint's groups by their parameters' names, into groups of another
    # layout too (embedding_lr or head_lr set or unset where no config.json told): a group that got none of the
    # checkpoint's settings, or a part's group that is not this run's, means the layouts differ
    theirs = [group.get("part_rate") if "initial_lr" in group or "lr" in group else "?" for group in groups]
    if theirs != (ours := [group.get("part_rate") for group in built]):
        raise UserError(f"autoresume: the checkpoint's optimizer has its own groups for {layout(theirs)}, this run's "
                        f"for {layout(ours)} (a part's rate, embedding_lr or head_lr, set or unset adds or drops "
                        f"a group): {fix}")
    differs = [any(group.get("initial_lr" if k == "lr" else k, BEFORE_THEM.get(k)) != v for k, v in ours.items()
                   if k != "betas")
               or tuple(group.get("betas", ())) != tuple(ours.get("betas", ())) for group, ours in zip(groups, built)]
    if not any(differs):
        return []
    changes = [change for group, ours in zip(groups, built) for change in setting_changes(group, ours)]
    for i, (group, ours) in enumerate(zip(groups, built)):
        group.update({k: v for k, v in ours.items() if k != "lr"})  # also eps, fused (a GPU run resumed on CPU)
        group["initial_lr"] = scheduler.base_lrs[i] = ours["lr"]
        group["lr"] = ours["lr"] * scheduler.lr_lambdas[i](scheduler.last_epoch)  # what LambdaLR.step computes
    return list(dict.fromkeys(changes))  # AdamW's two groups share learning_rate


def layout(part_rates: list) -> str:
    """The parts with groups of their own, from each group's part_rate ("?": a group the checkpoint has no settings
    for), as words."""
    named = list(dict.fromkeys(name for name in part_rates if name and name != "?"))
    return (" and ".join(named) or "no part") + (" (and groups it has no settings for)" if "?" in part_rates else "")


def setting_changes(group: dict, ours: dict) -> list[str]:
    """The settings in which the restored `group` differs from the config's `ours`, as "setting=new (was old)"."""
    changes = []
    peak = group.get("initial_lr", group.get("lr"))
    if peak != ours["lr"]:
        setting = ours.get("part_rate") or ("muon_lr" if ours.get("muon") else "learning_rate")
        changes.append(f"{setting}={ours['lr']:g} (was {peak:g})")
    for key, setting in SETTING_OF.items():
        old = group.get(key, BEFORE_THEM.get(key))
        if key in ours and old != ours[key] and (key not in MUON_ONLY or ours.get("muon")):
            changes.append(f"{setting}={shown(ours[key])} (was {shown(old)})")
    for name, old, new in zip(("beta1", "beta2"), group.get("betas", ()), ours.get("betas", ())):
        changes += [f"{name}={new:g} (was {old:g})"] if old != new else []
    return changes


def shown(value: Any) -> str:
    """A group's value as its setting says it: a float in %g; momentum_warmdown's [end, first, last] as its end and
    the steps it falls over."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)) and len(value) == 3:
        return f"{value[0]:g} over steps {value[1]}-{value[2]}"
    return str(value)
