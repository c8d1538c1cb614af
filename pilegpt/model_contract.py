"""The contract every model meets, model.py's GPT included: a torch.nn.Module whose `forward(idx, targets=None)` returns
`(logits, loss)` (optional: hidden_matrices() for Muon, optim_groups(), param_parts(), flops_per_token()), checked at
the run's block_size; and your own model by import path, named "package.module:Class" with its constructor's keyword
arguments, trained, saved and sampled like model.py's GPT. The class is imported only where the user names it
(train.py's model_class, sample.py's and eval.py's --model-class), never because a file records it. Details:
docs/extending.md."""

from __future__ import annotations

import importlib
import inspect
from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from pilegpt.common import UserError, one_line

# Optional methods, used when the module has them: optim_groups(weight_decay) (AdamW's groups; else weight decay on
# the dim >= 2 parameters: pilegpt/train/optim/groups.py), param_parts() (which parameters are the embedding tables
# and the head, for embedding_lr and head_lr), flops_per_token() (else no MFU), generate(idx, max_new_tokens,
# temperature, top_k) (else generate_tokens' loop over forward). The context length is `block_size` or
# `config.block_size`, when there is one.


class ModelSpec(NamedTuple):
    """A custom model as checkpoints record it: its import path and its constructor's keyword arguments."""
    model_class: str  # "package.module:Class"
    model_args: dict  # Class(**model_args)


def import_class(path: str, setting: str) -> type:
    """The class that "package.module:Class" names; a one-line UserError, prefixed with `setting`, when it is
    written wrong, its module cannot be imported or has no such class."""
    module_name, colon, class_name = path.partition(":")
    if not colon or not module_name or not class_name.isidentifier():
        raise UserError(f"{setting}: {path!r} is not an import path: write it 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module failing while it runs
        raise UserError(f"{setting}: cannot import {module_name} ({type(e).__name__}: {one_line(e)}); write it as "
                        "'module.path:ClassName' with the module on PYTHONPATH") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise UserError(f"{setting}: module {module_name} has no class {class_name}")
    return cls


def build(spec: ModelSpec, setting: str = "model_class") -> nn.Module:
    """Class(**model_args), checked to be an nn.Module with parameters (one line per broken rule)."""
    cls = import_class(spec.model_class, setting)
    if not issubclass(cls, nn.Module):
        raise UserError(f"{setting}: {spec.model_class} is not a torch.nn.Module subclass")
    try:
        module = cls(**spec.model_args)
    except (TypeError, ValueError) as e:
        raise UserError(f"{setting}: {spec.model_class}(**{spec.model_args}) failed: {one_line(e)}; set its "
                        "constructor's arguments with model_args") from None
    if not any(p.requires_grad for p in module.parameters()):
        raise UserError(f"{setting}: {spec.model_class} has no trainable parameters")
    return module


def check_forward(module: nn.Module, name: str, block_size: int, vocab_size: int) -> None:
    """Tiny forward passes with targets (a private RNG stream, no gradient), on a (1, 4) batch and on one of the run's
    block_size: each must return (logits (B, T, V), scalar loss) with V >= vocab_size; a context length, when the
    module states one, must be >= block_size. A model right at T=4 but wrong at block_size (a position table of 16
    rows, logits for fewer positions) is one line here, not a traceback in the first batch or in sample.py."""
    context = context_length(module)
    if context is not None and context < block_size:
        raise UserError(f"model_class: {name} has a context of {context} tokens, less than block_size={block_size}: "
                        "raise it in model_args or lower --block_size")
    for T in dict.fromkeys((min(block_size, 4), block_size)):
        check_forward_at(module, name, T, vocab_size,
                         "" if T <= 4 else f" (block_size: fix {name}.forward for the run's sequences or lower "
                                           "--block_size)")


def check_forward_at(module: nn.Module, name: str, T: int, vocab_size: int, fix: str) -> None:
    """One forward pass on a (1, T) batch of token 0, checked against the contract; `fix` ends each error line."""
    idx = torch.zeros((1, T), dtype=torch.long)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            out = module(idx, targets=idx)
        except Exception as e:
            raise UserError(f"model_class: {name}.forward(idx, targets) failed on a (1, {T}) batch: "
                            f"{type(e).__name__}: {one_line(e)}{fix}") from None
    if not (isinstance(out, tuple) and len(out) == 2 and torch.is_tensor(out[0]) and torch.is_tensor(out[1])):
        raise UserError(f"model_class: {name}.forward(idx, targets) must return (logits, loss), two tensors; it "
                        f"returned {type(out).__name__}")
    logits, loss = out
    if logits.dim() != 3 or tuple(logits.shape[:2]) != (1, T) or loss.numel() != 1:
        raise UserError(f"model_class: {name}.forward(idx, targets) must return logits (B, T, V) and a scalar loss; "
                        f"on a (1, {T}) batch they were {tuple(logits.shape)} and {tuple(loss.shape)}{fix}")
    if logits.size(-1) < vocab_size:
        raise UserError(f"model_class: {name} predicts {logits.size(-1)} tokens, fewer than vocab_size={vocab_size} "
                        "(the data's): raise its vocabulary in model_args")


def unused_settings_note(cls: type, name: str, unused: list[str]) -> str:
    """The line that says train.py's GPT settings (`unused`: "n_layer=7", ...) do nothing for model_class `name`, and
    which of them its constructor takes, to set in model_args instead."""
    params = inspect.signature(cls.__init__).parameters
    takes = [setting.split("=")[0] for setting in unused if setting.split("=")[0] in params]
    where = (f"; {cls.__name__} takes {', '.join(takes)}: set {'them' if len(takes) > 1 else 'it'} in model_args"
             if takes else "; set the model's own shape in model_args")
    return (f"note: model_class={name}: {', '.join(unused)} shape model.py's GPT only and are not used (config.json "
            f"leaves them out){where}")


def stated(module: nn.Module, name: str) -> Optional[int]:
    """An int the model states about itself as `name` or `config.name` (block_size, vocab_size), else None."""
    for owner in (module, getattr(module, "config", None)):
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def context_length(module: nn.Module) -> Optional[int]:
    """The most tokens the model reads at once (`block_size`, or `config.block_size`); None when it states none."""
    return stated(module, "block_size")


def flops_per_token(module: nn.Module) -> Optional[int]:
    """Training FLOPs per token when the module counts them (flops_per_token()), else None: no MFU."""
    count = getattr(module, "flops_per_token", None)
    return int(count()) if callable(count) else None


@torch.no_grad()
def generate_tokens(module: nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                    top_k: Optional[int] = None) -> torch.Tensor:
    """idx (B, T) extended by max_new_tokens sampled tokens: the module's generate() when it has one, else a loop of
    forward(idx) over the last context_length tokens, sampling from the last position's logits."""
    if hasattr(module, "generate"):
        return module.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k)
    from model import sample_next

    context = context_length(module)
    for _ in range(max_new_tokens):
        logits, _ = module(idx if context is None else idx[:, -context:])
        idx = torch.cat((idx, sample_next(logits[:, -1, :].float(), temperature, top_k)), dim=1)
    return idx
