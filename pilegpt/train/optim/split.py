"""Muon's Newton-Schulz work shared across data-parallel ranks: each of N ranks orthogonalises about 1/N of the
matrices (balanced by size, one batched chain per shape) and an all-gather brings every result to every rank; under
FSDP, where each rank holds a block of rows of every matrix, an all-to-all brings each matrix whole to its rank
alone, and a second one sends every rank back its rows of each result (orthogonalize_sharded).

The gather runs over the default process group (the one Composer made: NCCL on GPUs, gloo on CPU). Everything else
in Muon's step (momentum, NorMuon, the update) is elementwise and runs on every rank alike, so every rank keeps the
same weights and the same state.

    owners = assign([p.shape for p in params], world)     # the rank that orthogonalises each matrix
    updates = orthogonalize_shared(directions, orthogonalize_stack, world, rank)
    update_rows = orthogonalize_sharded(direction_rows, shapes, orthogonalize_stack, group)   # FSDP
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as torch_dist


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: an FSDP2 parameter's (a DTensor) local shard, or the tensor itself (its rows r*c
    to r*c + c under FSDP's split: orthogonalize_sharded)."""
    return t.to_local() if is_sharded(t) else t


def is_sharded(t: torch.Tensor) -> bool:
    """Whether t is a DTensor (an FSDP2 parameter, gradient or optimizer state)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


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
    return by_shape_of([m.shape for m in matrices])


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


def orthogonalize_sharded(rows: Sequence[torch.Tensor], shapes: Sequence[tuple], orthogonalize_stack: Callable,
                          group) -> list[torch.Tensor]:
    """orthogonalize_shared for matrices split by rows over the group's ranks as FSDP2 shards them (torch.chunk of
    dim 0: rank r holds rows r*c to r*c + c, c = ceil(m / N)): rows[i] is this rank's block of matrix i, of full
    shape shapes[i]. Per shape, one all-to-all sends each block to the matrix's owner (assign's), which stacks the
    blocks into its own whole matrices (no rank holds more of them than its share) and orthogonalises them in one
    batched chain; a second all-to-all sends each rank back its block of every result. This rank's blocks of the
    results, in the matrices' order."""
    world = torch_dist.get_world_size(group)
    owners, results = assign(shapes, world), [None] * len(rows)
    for shape, indices in by_shape_of(shapes).items():
        (m, n), c, held = shape, -(-shape[0] // world), rows[indices[0]].size(0)
        per_rank = [[i for i in indices if owners[i] == r] for r in range(world)]
        width = max(len(owned) for owned in per_rank)
        mine = len(per_rank[torch_dist.get_rank(group)])
        zero = rows[indices[0]].new_zeros((held, n))
        sent = torch.stack([rows[i] if i is not None else zero for owned in per_rank
                            for i in owned + [None] * (width - len(owned))])  # (N * width, held, n): slot j of rank r
        if held < c:
            sent = torch.nn.functional.pad(sent, (0, 0, 0, c - held))
        blocks = torch.empty_like(sent)
        torch_dist.all_to_all_single(blocks, sent, group=group)  # block s*width + j: rank s's rows of my j-th
        whole = blocks.view(world, width, c, n).transpose(0, 1).reshape(width, world * c, n)[:mine, :m]
        done = orthogonalize_stack(whole) if mine else whole.new_zeros((0, m, n))
        done = torch.nn.functional.pad(done, (0, 0, 0, world * c - m, 0, width - mine))
        back = torch.empty_like(done.view(width, world, c, n).transpose(0, 1).reshape(world * width, c, n))
        torch_dist.all_to_all_single(back, done.view(width, world, c, n).transpose(0, 1).reshape(world * width, c, n)
                                     .contiguous(), group=group)  # block s*width + j: my rows of rank s's j-th
        for s, owned in enumerate(per_rank):
            for j, i in enumerate(owned):
                results[i] = back[s * width + j, :held]
    return results


def by_shape_of(shapes: Sequence[tuple]) -> dict[tuple, list[int]]:
    """The indices of `shapes` grouped by shape, in order of first appearance."""
    found: dict[tuple, list[int]] = {}
    for i, shape in enumerate(shapes):
        found.setdefault(tuple(shape), []).append(i)
    return found
