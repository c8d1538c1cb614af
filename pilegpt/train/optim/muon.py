"""Muon for the hidden 2-D weights and AdamW for the rest, as one torch.optim.Optimizer (Composer's Trainer takes
one): groups flagged muon=True take Nesterov momentum orthogonalised by a Newton-Schulz iteration, the others
torch.optim.AdamW's exact step. Pure PyTorch; details in docs/training.md."""

from __future__ import annotations

import functools
import math

import torch
from torch.optim.adamw import adamw

from pilegpt.train.optim.split import (
    by_shape,
    by_shape_of,
    is_sharded,
    local_shard,
    orthogonalize_sharded,
    orthogonalize_shared,
    split_line,
    world_and_rank,
)

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
    Polar Express's five per-step coefficients instead of Newton-Schulz's one triple (steps is then at most 5).
    A (k, m, n) stack of same-shape matrices is orthogonalised matrix by matrix in one batched chain."""
    return newton_schulz(grad, steps, polar_express).to(grad.dtype)


def newton_schulz(grad: torch.Tensor, steps: int = NS_STEPS, polar_express: bool = False) -> torch.Tensor:
    """orthogonalize's iteration, its result left in the compute dtype (bf16 on GPU: half the bytes to gather)."""
    coeffs = POLAR_EXPRESS_COEFFS[:steps] if polar_express else (NS_COEFFS,) * steps
    x = grad.to(torch.bfloat16 if grad.is_cuda else torch.float32)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide orientation: X X^T is then the smaller square
        x = x.mT
    # the Frobenius norm bounds the spectral norm: every singular value now <= 1 (Polar Express: <= 1 / 1.02)
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * (POLAR_EXPRESS_SAFETY if polar_express else 1.0) + 1e-7)
    for a, b, c in coeffs:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def warmed_momentum(group: dict, step: int | None) -> float:
    """The group's momentum at a parameter's step (1 on the first; None, a checkpoint from before the count: as set),
    nanochat's schedule: rising from MOMENTUM_START over momentum_warmup's steps, then `momentum`, then under
    momentum_warmdown = [end, first, last] falling linearly to `end` from step `first` to `last` (steps from 0, as
    the learning rate's warmdown; the warmup wins where the two overlap)."""
    m = group["momentum"]
    if step is None:
        return m
    it, warmup, fall = step - 1, group.get("momentum_warmup", 0), group.get("momentum_warmdown") or 0
    if warmup and it < warmup:
        return MOMENTUM_START + it / warmup * (m - MOMENTUM_START) if m > MOMENTUM_START else m
    if fall and it >= fall[1]:
        end, first, last = fall
        return m + min(1.0, (it - first) / max(1, last - first)) * (end - m)
    return m


def decayed(group: dict, step: int | None) -> float:
    """The group's weight decay at a parameter's step under wd_cosine (off, or no step count: as set)."""
    steps, decay = group.get("wd_cosine", 0), group["weight_decay"]
    if not steps or step is None:
        return decay
    return decay * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - 1) / steps)))


def neuron_update(update: torch.Tensor, state: dict, beta2: float) -> torch.Tensor:
    """NorMuon's step (Li et al. 2025): each row of the orthogonalised update (an output neuron of nn.Linear's
    (out, in) weight) divided by the root of an EMA (beta2) of its mean square, kept in state["neuron_sq"]; the
    result rescaled to the update's own Frobenius norm, so that muon_lr means what it means without it (and the EMA
    needs no bias correction: a factor common to every row cancels)."""
    if "neuron_sq" not in state:
        state["neuron_sq"] = torch.zeros(update.size(0), dtype=torch.float32, device=update.device)
    return neuron_updates([update], [state], beta2)[0]


def neuron_updates(updates: list[torch.Tensor], states: list[dict], beta2: float, shapes: list[tuple] | None = None,
                   group=None) -> list[torch.Tensor]:
    """neuron_update of each update (its state's neuron_sq already there): the EMAs in one foreach lerp, the
    rescaling of each shape's updates as one stack. Under FSDP (group: the ranks that hold the other rows) the
    updates and neuron_sq are this rank's rows of matrices of full shapes `shapes`, and the Frobenius norms are
    summed over the ranks."""
    torch._foreach_lerp_([local_shard(s["neuron_sq"]) for s in states],
                         [u.float().square().mean(dim=1) for u in updates], 1 - beta2)
    out: list = [None] * len(updates)
    for indices in by_shape_of(shapes or [u.shape for u in updates]).values():
        u = torch.stack([updates[i] for i in indices])
        sq = torch.stack([local_shard(states[i]["neuron_sq"]) for i in indices])
        normed = u / (sq.sqrt()[:, :, None] + 1e-12).to(u.dtype)
        normed = normed * (frobenius(u, group) / (frobenius(normed, group) + 1e-12))
        for j, i in enumerate(indices):
            out[i] = normed[j]
    return out


def frobenius(stack: torch.Tensor, group=None) -> torch.Tensor:
    """Each matrix's Frobenius norm in a (k, m, n) stack, (k, 1, 1); with a group, of the matrices whose rows the
    group's ranks hold between them (one all-reduce)."""
    if group is None:
        return stack.norm(dim=(1, 2), keepdim=True)
    squares = stack.float().square().sum(dim=(1, 2), keepdim=True)
    torch.distributed.all_reduce(squares, group=group)
    return squares.sqrt().to(stack.dtype)


def shard_group(p: torch.Tensor):
    """The process group over which FSDP splits p's rows, or None: p is whole on this rank (no FSDP, or one rank)."""
    if not is_sharded(p) or p.device_mesh.size() == 1:
        return None
    return p.device_mesh.get_group()


def rows_like(p: torch.Tensor) -> torch.Tensor:
    """A float32 zero per row of p (NorMuon's neuron_sq), split over the ranks as p's rows are (FSDP: a DTensor, so
    that a checkpoint holds each rank's part)."""
    local = torch.zeros(local_shard(p).size(0), dtype=torch.float32, device=local_shard(p).device)
    if not is_sharded(p):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=(p.size(0),), stride=(1,))


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
    to 0 over that many of its steps (nanochat's), then stays 0; momentum_warmdown = [end, first, last]: the momentum
    falls linearly to `end` over those steps (nanochat's, over the learning rate's warmdown; 0 = off)."""

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, fused: bool = True, momentum_warmup: int = 0,
                 cautious_wd: bool = False, normuon: bool = False, polar_express: bool = False, wd_cosine: int = 0,
                 momentum_warmdown: list | float = 0.0):
        defaults = dict(lr=lr, momentum=momentum, betas=betas, eps=eps, weight_decay=weight_decay, muon=False,
                        fused=fused, momentum_warmup=momentum_warmup, cautious_wd=cautious_wd, normuon=normuon,
                        polar_express=polar_express, wd_cosine=wd_cosine,
                        momentum_warmdown=momentum_warmdown)
        super().__init__(params, defaults)
        self._steps: dict = {}  # parameter -> its Muon step count as a Python int (None: not counted)
        self.register_load_state_dict_post_hook(Muon._read_steps)
        for group in self.param_groups:
            if group["muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon orthogonalises matrices: a muon=True group holds a parameter that is not 2-D")

    @staticmethod
    def _read_steps(self: "Muon") -> None:
        """After load_state_dict: the Python step counts from the loaded state (read once here, not in the step)."""
        self._steps = {p: (int(self.state[p]["step"]) if "step" in self.state[p] else None)
                       for group in self.param_groups if group["muon"] for p in group["params"] if p in self.state}

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
        """buf <- m buf + (1 - m) g; the Nesterov direction (1 - m) g + m buf, orthogonalised (each shape's matrices
        in one batched chain, shared across ranks: optim/split.py) and scaled. Foreach ops and stacks throughout,
        and no host sync: the step counts momentum_warmup reads are kept as Python ints too (_counted). Under FSDP
        every tensor is this rank's rows (local_shard) and only the orthogonalisation sees whole matrices."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        states, grads = [self._counted(p) for p in params], [local_shard(p.grad) for p in params]
        bufs = [local_shard(s["momentum_buffer"]) for s in states]
        directions: list = [None] * len(params)
        for m, indices in self._by_momentum(group, params).items():
            torch._foreach_lerp_([bufs[i] for i in indices], [grads[i] for i in indices], 1 - m)
            for i, d in zip(indices, torch._foreach_lerp([grads[i] for i in indices], [bufs[i] for i in indices], m)):
                directions[i] = d
        orthogonalize_stack = functools.partial(newton_schulz, polar_express=group.get("polar_express", False))
        shapes, rows_of = [tuple(p.shape) for p in params], shard_group(params[0])
        updates = [u.to(p.dtype) for u, p in zip(
            orthogonalize_sharded(directions, shapes, orthogonalize_stack, rows_of) if rows_of is not None
            else orthogonalize_shared(directions, orthogonalize_stack, *world_and_rank()), params)]
        if group.get("normuon"):
            for p, state in zip(params, states):
                if "neuron_sq" not in state:
                    state["neuron_sq"] = rows_like(p)
            updates = neuron_updates(updates, states, group["betas"][1], shapes, rows_of)
        self._apply(group, params, updates)

    def _counted(self, p: torch.Tensor) -> dict:
        """p's state, its step count one up (state["step"], a CPU tensor for the checkpoint; self._steps, the same
        number as a Python int, or None for a checkpoint from before the count)."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
            state["step"] = torch.tensor(0.0)  # Muon's steps, for momentum_warmup
            self._steps[p] = 0
        if "step" in state:
            if p not in self._steps:  # a state put in by hand, not by load_state_dict: read once (a CPU tensor)
                self._steps[p] = int(state["step"])
            state["step"] += 1
            self._steps[p] += 1
        else:
            self._steps[p] = None
        return state

    def _by_momentum(self, group: dict, params: list) -> dict[float, list[int]]:
        """The params' indices by their momentum now (one value, unless their step counts differ)."""
        found: dict[float, list[int]] = {}
        for i, p in enumerate(params):
            found.setdefault(warmed_momentum(group, self._steps.get(p)), []).append(i)
        return found

    def _apply(self, group: dict, params: list, updates: list) -> None:
        """p <- p (1 - lr decay) - lr scale update, as foreach ops over each shape's params (cautious_wd: the decay
        only where the update also pulls the weight to 0; wd_cosine: the decay at each param's step)."""
        lr, by_decay = group["lr"], {}
        for i, p in enumerate(params):
            by_decay.setdefault(decayed(group, self._steps.get(p)), []).append(i)
        for decay, indices in by_decay.items():
            ps, us = [local_shard(params[i]) for i in indices], [updates[i] for i in indices]
            if group.get("cautious_wd") and decay:  # mask = 1 where update * p > 0, else 0
                masks = torch._foreach_clamp_min(torch._foreach_sign(torch._foreach_mul(us, ps)), 0.0)
                torch._foreach_add_(ps, torch._foreach_mul(ps, masks), alpha=-lr * decay)
            else:
                torch._foreach_mul_(ps, 1 - lr * decay)
        for indices in by_shape(params).values():
            # An m x n semi-orthogonal matrix has RMS 1/sqrt(max(m, n)); times sqrt(max(1, m/n)) every update has
            # RMS 1/sqrt(n), n = the fan-in (nn.Linear's weight is (out, in)), so one lr suits every shape.
            rows, cols = params[indices[0]].shape
            torch._foreach_add_([local_shard(params[i]) for i in indices], [updates[i] for i in indices],
                                alpha=-lr * max(1.0, rows / cols) ** 0.5)

    def split_line(self) -> str:
        """How this rank shares the orthogonalisation (train.py prints it at start-up, on each rank)."""
        groups = [[tuple(p.shape) for p in group["params"]] for group in self.param_groups if group["muon"]]
        return split_line(groups, *world_and_rank())

    def _adamw_step(self, group: dict) -> None:
        """torch.optim.AdamW's step for this group, through its functional form, with the same state keys."""
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p, state in self._with_gradients(group):
            if not state:  # as AdamW: a CPU float step counter, unless fused (then on the parameter's device)
                state["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if group["fused"]
                                 else torch.tensor(0.0))
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(local_shard(p))  # FSDP: this rank's part of each (AdamW's step is elementwise)
            grads.append(local_shard(p.grad))
            exp_avgs.append(local_shard(state["exp_avg"]))
            exp_avg_sqs.append(local_shard(state["exp_avg_sq"]))
            steps.append(state["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        adamw(params, grads, exp_avgs, exp_avg_sqs, [], steps, fused=group["fused"] or None, amsgrad=False,
              beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
              maximize=False)

