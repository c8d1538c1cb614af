"""fsdp=True: Composer's FSDP2 (torch's `fully_shard`, the DTensor FSDP torchtitan runs), on GPUs (NCCL) and CPUs
(gloo) alike. Each transformer Block is a shard unit and the root keeps the embeddings, the final norm and the head;
every rank holds 1/N of each parameter, its gradient and its optimizer state (a DTensor sharded on its rows), and
checkpoints are sharded: each rank writes its own part (docs/clusters.md#fsdp).

Composer 0.32.1 reads FSDP2 only from parallelism_config={"fsdp": FSDP2Config(...)}: a dict under "fsdp2" is
ignored in silence (the run is plain DDP), so train.py passes the config object."""

from __future__ import annotations

import torch
from composer.core import Algorithm, Event


def fsdp_config():
    """Composer's FSDP2 config: sharded checkpoints (each rank its own part; autoresume reads them on any number of
    processes), mixed precision as the run's `precision` ('DEFAULT': bf16 compute, fp32 weights and reductions).
    FSDP2's own activation checkpointing stays off: activation_checkpointing is model.py's (GPT.checkpoint_blocks),
    with or without FSDP."""
    from composer.utils.parallelism import FSDP2Config

    return FSDP2Config(state_dict_type="sharded", mixed_precision="DEFAULT")


def mean_gradients(model: torch.nn.Module) -> bool:
    """Make FSDP2's gradients the mean over the ranks, as DDP's are, where the backend sums instead: FSDP2 reduces
    them with ReduceOp.AVG, which gloo (CPU) takes for a sum in torch 2.7, so every gradient came out N times too
    large (Adam and Muon hardly notice a scale, but eps, clipping and the grad norm do). Asked of the backend once,
    with one tiny reduce-scatter; where it sums, each shard unit divides its reduced gradients by N (FSDP2's hook
    after the reduce-scatter). Returns whether the hook was needed."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units or not dist.is_initialized() or dist.get_world_size() == 1:
        return False
    world = dist.get_world_size()
    device = next(model.parameters()).device
    probe, out = torch.ones(world, device=device), torch.zeros(1, device=device)
    dist.reduce_scatter_tensor(out, probe, op=dist.ReduceOp.AVG)
    if out.item() == 1.0:  # the backend averages: nothing to do
        return False
    for unit in units:
        unit.set_all_reduce_hook(lambda reduced: reduced.div_(world))
    return True



def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for FSDP2's sharded gradients: the global norm from every rank's shards (one
    all-reduce of the sum of squares), every gradient times min(1, max_norm / (norm + 1e-6)) as torch does; returns
    the norm before clipping. Composer's GradientClipping clips FSDP1's modules only: under FSDP2 it clips nothing."""
    import torch.distributed as dist

    from pilegpt.train.optim.split import local_shard

    grads = [local_shard(p.grad) for p in params if p.grad is not None]
    squares = torch.stack([g.float().square().sum() for g in grads]).sum() if grads else torch.zeros(())
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(squares)
    norm = squares.sqrt()
    if grads:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0).to(grads[0].dtype))
    return norm


class ShardedGradientClipping(Algorithm):
    """grad_clip under fsdp=True: clip_gradients at AFTER_TRAIN_BATCH, where Composer's GradientClipping runs."""

    def __init__(self, max_norm: float):
        self.max_norm = max_norm

    def match(self, event: Event, state) -> bool:
        return event == Event.AFTER_TRAIN_BATCH

    def apply(self, event: Event, state, logger) -> None:
        clip_gradients(list(state.model.parameters()), self.max_norm)
