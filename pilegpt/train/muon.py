"""Muon for the hidden 2-D weights and AdamW for the rest, as one torch.optim.Optimizer (Composer's Trainer takes
one): groups flagged muon=True take Nesterov momentum orthogonalised by a Newton-Schulz iteration, the others
torch.optim.AdamW's exact step. Pure PyTorch; details in docs/training.md."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.adamw import adamw

from pilegpt.common import UserError, one_line
from pilegpt.train.config import MUON_OPTIONS
from pilegpt.train.part_rates import with_part_rates

# The quintic Newton-Schulz iteration X <- a X + b (X X^T) X + c (X X^T)^2 X of modded-nanogpt and nanochat, with
# their coefficients: a steep slope at 0 (a = 3.4445) pulls small singular values up in few steps, at the price of
# not converging to exactly 1: after 5 steps each singular value of G that is at least 0.002 of G's Frobenius norm
# lies in [0.68, 1.21] (the scalar map's range; tests/unit/test_muon.py); smaller ones, directions the gradient
# hardly has, stay smaller.
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
# Polar Express (Amsel et al. 2025, arXiv 2505.16932): the same quintic, with coefficients chosen anew for each of the
# five steps (minimax-optimal for the step's interval of singular values), as modded-nanogpt and nanochat use them,
# with their 2% safety margin on the starting norm. Steep early steps lift small singular values, late ones settle
# every value close to 1 (tests/unit/test_muon.py measures both iterations on the same matrices).
POLAR_EXPRESS_COEFFS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))
POLAR_EXPRESS_SAFETY = 1.02
MOMENTUM_START = 0.85  # momentum_warmup's first momentum (modded-nanogpt: 0.85 to 0.95 over 300 steps)


def orthogonalize(grad: torch.Tensor, steps: int = NS_STEPS, polar_express: bool = False) -> torch.Tensor:
    """G's nearest semi-orthogonal matrix U V^T (G = U S V^T), approximately: its singular values all near 1.
    fp32 on CPU (exact, deterministic), bf16 on GPU (fast; the iteration tolerates its rounding). polar_express:
    Polar Express's five per-step coefficients instead of Newton-Schulz's one triple (steps is then at most 5)."""
    coeffs = POLAR_EXPRESS_COEFFS[:steps] if polar_express else (NS_COEFFS,) * steps
    x = grad.to(torch.bfloat16 if grad.is_cuda else torch.float32)
    tall = x.size(0) > x.size(1)
    if tall:  # iterate on the wide orientation: X X^T is then the smaller square
        x = x.T
    # the Frobenius norm bounds the spectral norm: every singular value now <= 1 (Polar Express: <= 1 / 1.02)
    x = x / (x.norm() * (POLAR_EXPRESS_SAFETY if polar_express else 1.0) + 1e-7)
    for a, b, c in coeffs:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(grad.dtype)


def warmed_momentum(group: dict, state: dict) -> float:
    """The group's momentum at this parameter's step (state["step"], 1 on the first; none in a checkpoint from
    before the count: the warmup is over), under momentum_warmup."""
    warmup, m = group.get("momentum_warmup", 0), group["momentum"]
    if not warmup or "step" not in state:
        return m
    frac = min(1.0, (state["step"].item() - 1) / warmup)
    return MOMENTUM_START + frac * (m - MOMENTUM_START) if m > MOMENTUM_START else m


def decayed(group: dict, state: dict) -> float:
    """The group's weight decay at this parameter's step under wd_cosine (off, or no step count: as set)."""
    steps, decay = group.get("wd_cosine", 0), group["weight_decay"]
    if not steps or "step" not in state:
        return decay
    return decay * 0.5 * (1 + math.cos(math.pi * min(1.0, (state["step"].item() - 1) / steps)))


def neuron_update(update: torch.Tensor, state: dict, beta2: float) -> torch.Tensor:
    """NorMuon's step (Li et al. 2025): each row of the orthogonalised update (an output neuron of nn.Linear's
    (out, in) weight) divided by the root of an EMA (beta2) of its mean square, kept in state["neuron_sq"]; the
    result rescaled to the update's own Frobenius norm, so that muon_lr means what it means without it (and the EMA
    needs no bias correction: a factor common to every row cancels)."""
    if "neuron_sq" not in state:
        state["neuron_sq"] = torch.zeros(update.size(0), dtype=torch.float32, device=update.device)
    state["neuron_sq"].lerp_(update.float().square().mean(dim=1), 1 - beta2)
    normed = update / (state["neuron_sq"].sqrt()[:, None] + 1e-12).to(update.dtype)
    return normed * (update.norm() / (normed.norm() + 1e-12))


class Muon(torch.optim.Optimizer):
    """Param groups with muon=True (2-D weights): momentum, Nesterov, orthogonalised; muon=False: AdamW's step.
    Weight decay is decoupled in both (p <- p (1 - lr * weight_decay)); state_dict round-trips like AdamW's.
    fused: AdamW's step in torch's one-pass kernel (CPU and CUDA), torch.optim.AdamW(fused=True)'s numbers; on a
    CPU 4.6x faster than its per-tensor loop over the embedding and head, the bulk of the preset's AdamW
    (docs/performance.md#the-training-step-on-cpu).
    momentum_warmup > 0: Muon's momentum rises linearly from MOMENTUM_START to `momentum` over that many of its
    steps (modded-nanogpt's); cautious_wd: Muon's weight decay only where the update moves the weight towards 0
    as the decay does (sign(update) = sign(weight); Chen et al. 2025, "Cautious Weight Decay"); normuon: the
    orthogonalised update's rows (output neurons) evened out by their second moment (neuron_update); polar_express:
    orthogonalize's Polar Express coefficients; wd_cosine > 0: Muon's weight decay falls as a cosine from its value
    to 0 over that many of its steps (nanochat's), then stays 0."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, fused: bool = True, momentum_warmup: int = 0,
                 cautious_wd: bool = False, normuon: bool = False, polar_express: bool = False, wd_cosine: int = 0):
        defaults = dict(lr=lr, momentum=momentum, betas=betas, eps=eps, weight_decay=weight_decay, muon=False,
                        fused=fused, momentum_warmup=momentum_warmup, cautious_wd=cautious_wd, normuon=normuon,
                        polar_express=polar_express, wd_cosine=wd_cosine)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon orthogonalises matrices: a muon=True group holds a parameter that is not 2-D")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["muon"]:
                self._muon_step(group)
            else:
                self._adamw_step(group)
        return loss

    def _with_gradients(self, group: dict):
        """(parameter, its state) for each parameter of the group that has a gradient this step."""
        return ((p, self.state[p]) for p in group["params"] if p.grad is not None)

    def _muon_step(self, group: dict) -> None:
        """buf <- m buf + (1 - m) g; the Nesterov direction (1 - m) g + m buf, orthogonalised and scaled."""
        lr = group["lr"]
        for p, state in self._with_gradients(group):
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
                state["step"] = torch.tensor(0.0)  # Muon's steps, for momentum_warmup
            if "step" in state:
                state["step"] += 1
            m, decay = warmed_momentum(group, state), decayed(group, state)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - m)
            update = orthogonalize(p.grad.lerp(buf, m), polar_express=group.get("polar_express", False))
            if group.get("normuon"):
                update = neuron_update(update, state, group["betas"][1])
            # An m x n semi-orthogonal matrix has RMS 1/sqrt(max(m, n)); times sqrt(max(1, m/n)) every update has
            # RMS 1/sqrt(n), n = the fan-in (nn.Linear's weight is (out, in)), so one lr suits every shape.
            scale = max(1.0, p.size(0) / p.size(1)) ** 0.5
            if group.get("cautious_wd") and decay:  # decay only where the update also pulls the weight to 0
                p.sub_(p * (update * p > 0), alpha=lr * decay)
            else:
                p.mul_(1 - lr * decay)
            p.add_(update, alpha=-lr * scale)

    def _adamw_step(self, group: dict) -> None:
        """torch.optim.AdamW's step for this group, through its functional form, with the same state keys."""
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p, state in self._with_gradients(group):
            if not state:  # as AdamW: a CPU float step counter, unless fused (then on the parameter's device)
                state["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if group["fused"]
                                 else torch.tensor(0.0))
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adamw(params, grads, exp_avgs, exp_avg_sqs, [], steps, fused=group["fused"] or None, amsgrad=False,
              beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
              maximize=False)


def build_muon(model: nn.Module, cfg) -> Muon:
    """train.py's and plain_loop.py's Muon for `model` from a TrainConfig: Muon for model.hidden_matrices() at
    muon_lr, AdamW (torch's fused kernel, on CPU too) for the rest at cfg.adamw_lr() (embedding_lr and head_lr: the
    parts' own groups, part_rates.py), with the run's Muon options."""
    groups = with_part_rates(muon_groups(model, cfg.weight_decay, cfg.muon_lr, cfg.adamw_lr()), model, cfg)
    if cfg.muon_weight_decay is not None:  # AdamW's groups keep weight_decay
        next(g for g in groups if g.get("muon"))["weight_decay"] = cfg.muon_weight_decay
    options = {key: getattr(cfg, setting) for setting, (key, _) in MUON_OPTIONS.items()}
    options["wd_cosine"] = cfg.max_batches() if cfg.muon_wd_cosine else 0
    return Muon(groups, betas=(cfg.beta1, cfg.beta2), **options)


def muon_groups(model: nn.Module, weight_decay: float, muon_lr: float, adamw_lr: float) -> list[dict]:
    """Muon's group (model.hidden_matrices()) and AdamW's two (2-D weights decayed, biases and norms not): every
    trainable parameter in exactly one group (checked)."""
    params = [p for p in model.parameters() if p.requires_grad]  # a tied matrix appears once
    hidden = {id(p) for p in hidden_matrices(model, params)}
    groups = [dict(params=[p for p in params if id(p) in hidden], lr=muon_lr, weight_decay=weight_decay, muon=True),
              dict(params=[p for p in params if id(p) not in hidden and p.dim() >= 2], lr=adamw_lr,
                   weight_decay=weight_decay),
              dict(params=[p for p in params if id(p) not in hidden and p.dim() < 2], lr=adamw_lr, weight_decay=0.0)]
    listed = [id(p) for g in groups for p in g["params"]]
    assert len(listed) == len(set(listed)) == len(params), "a parameter is in no group or in two"
    return groups


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
