"""fsdp=True: Composer's FSDP2 (torch's `fully_shard`, the DTensor FSDP torchtitan runs), on GPUs (NCCL) and CPUs
(gloo) alike. Each transformer Block is a shard unit and the root keeps the embeddings, the final norm and the head;
every rank holds 1/N of each parameter, its gradient and its optimizer state (a DTensor sharded on its rows), and
checkpoints are sharded: each rank writes its own part (docs/clusters.md#fsdp).

Composer 0.32.1 reads FSDP2 only from parallelism_config={"fsdp": FSDP2Config(...)}: a dict under "fsdp2" is
ignored in silence (the run is plain DDP), so train.py passes the config object."""

from __future__ import annotations

import torch


def fsdp_config(activation_checkpointing: bool = False):
    """Composer's FSDP2 config: sharded checkpoints (each rank its own part; autoresume reads them on any number of
    processes), mixed precision as the run's `precision` ('DEFAULT': bf16 compute, fp32 weights and reductions), and
    with activation_checkpointing each Block's activations recomputed in the backward pass."""
    from composer.utils.parallelism import FSDP2Config

    return FSDP2Config(state_dict_type="sharded", mixed_precision="DEFAULT",
                       activation_checkpointing=activation_checkpointing)


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
