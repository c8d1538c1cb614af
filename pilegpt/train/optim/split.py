"""Muon's Newton-Schulz work shared across data-parallel ranks: each of N ranks orthogonalises about 1/N of the
matrices (balanced by size, one batched chain per shape) and an all-gather brings every result to every rank.

The gather runs over the default process group (the one Composer made: NCCL on GPUs, gloo on CPU). Everything else
in Muon's step (momentum, NorMuon, the update) is elementwise and runs on every rank alike, so every rank keeps the
same weights and the same state.

    owners = assign([p.shape for p in params], world)     # the rank that orthogonalises each matrix
    updates = orthogonalize_shared(directions, orthogonalize_stack, world, rank)
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as torch_dist


def world_and_rank() -> tuple[int, int]:
    """(processes, this one's rank) of the default process group, (1, 0) without one."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_world_size(), torch_dist.get_rank()
    return 1, 0


def assign(shapes: Sequence[tuple], world: int) -> list[int]:
    """Each matrix's rank, balanced by size. Each shape's k matrices go k // world to every rank (in their order:
    the first ones to rank 0), and the k % world left over, one each, to the ranks with the least work so far (the
    lowest such rank on a tie), the largest shapes first: every rank holds as many of a shape as any other, give or
    take one (so the gather pads little), and the work (elements: Newton-Schulz's cost grows with them) evens out.
    Deterministic: every rank computes the same list from the same shapes."""
    load, owners = [0] * world, [0] * len(shapes)
    groups: dict[tuple, list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(tuple(shape), []).append(i)
    for shape in sorted(groups, key=lambda s: (-torch.Size(s).numel(), s)):
        indices, size = groups[shape], torch.Size(shape).numel()
        extra = set(sorted(range(world), key=lambda r: (load[r], r))[:len(indices) % world])
        counts = [len(indices) // world + (r in extra) for r in range(world)]
        ranks = [r for r in range(world) for _ in range(counts[r])]
        for i, r in zip(indices, ranks):
            owners[i] = r
            load[r] += size
    return owners


def by_shape(matrices: Sequence[torch.Tensor]) -> dict[tuple, list[int]]:
    """The matrices' indices grouped by shape, in order of first appearance (one batched chain each)."""
    shapes: dict[tuple, list[int]] = {}
    for i, m in enumerate(matrices):
        shapes.setdefault(tuple(m.shape), []).append(i)
    return shapes


def split_line(groups: Sequence[Sequence[tuple]], world: int, rank: int) -> str:
    """What train.py says at start-up on each rank: how many of the matrices (the shapes of each Muon group's, split
    group by group as the step splits them) this rank orthogonalises, and of how many shapes."""
    mine = [s for shapes in groups for s, r in zip(shapes, assign(shapes, world)) if r == rank]
    total = sum(len(shapes) for shapes in groups)
    return f"muon: this rank orthogonalises {len(mine)} of {total} matrices ({len(set(mine))} shapes)"


def orthogonalize_shared(directions: Sequence[torch.Tensor], orthogonalize_stack: Callable, world: int,
                         rank: int) -> list[torch.Tensor]:
    """orthogonalize_stack (a (k, m, n) stack -> its k orthogonalised matrices) of every direction: this rank runs
    its own share, shape by shape, and with world > 1 each shape's results are all-gathered (every rank sends as
    many as the rank with the most of that shape, padded with zeros). The results in the directions' order."""
    owners = assign([tuple(d.shape) for d in directions], world)
    results: list = [None] * len(directions)
    pending = []
    for shape, indices in by_shape(directions).items():
        per_rank = [[i for i in indices if owners[i] == r] for r in range(world)]
        mine = per_rank[rank]
        done = (orthogonalize_stack(torch.stack([directions[i] for i in mine])) if mine
                else directions[indices[0]].new_zeros((0, *shape)))
        if world == 1:
            results = place(results, mine, done)
            continue
        width = max(len(owned) for owned in per_rank)
        sent = torch.cat([done, done.new_zeros((width - len(mine), *shape))]) if len(mine) < width else done
        gathered = [torch.empty_like(sent) for _ in range(world)]
        pending.append((torch_dist.all_gather(gathered, sent, async_op=True), per_rank, gathered))
    for work, per_rank, gathered in pending:  # every shape's gather in flight while the next shapes ran
        work.wait()
        for owned, stack in zip(per_rank, gathered):
            results = place(results, owned, stack)
    return results


def place(results: list, indices: Sequence[int], stack: torch.Tensor) -> list:
    """results with stack's first len(indices) matrices put at those indices."""
    for j, i in enumerate(indices):
        results[i] = stack[j]
    return results
