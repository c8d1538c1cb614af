"""The .bin side of train.py's data: its windows as map-style datasets,
one file's (`BinDataset`) or a data_mix's (`MixedBins`), and their training order: a keyed shuffle computed one
position at a time (`permute`), each sample once per epoch, ranks disjoint, an exact resume mid-epoch, memory and
start-up constant in the dataset's size (`resumable_sampler`, a mix's `MixedOrder`). Details: docs/training.md."""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from pilegpt.data import check_token_range, num_windows, read_windows


class BinDataset:
    """The windows of a .bin file as a map-style dataset: item i = {"x": (T,), "y": (T,)} LongTensors.

    state_dict/load_state_dict let Composer resume mid-epoch without re-reading the data (resumable_sampler).
    """

    def __init__(self, path: str, block_size: int, dtype: str = "uint16", num_tokens: Optional[int] = None,
                 vocab_size: Optional[int] = None):
        self.path, self.block_size, self.dtype, self.vocab_size = path, block_size, np.dtype(dtype), vocab_size
        self.num_tokens = os.path.getsize(path) // self.dtype.itemsize if num_tokens is None else num_tokens
        self.tokens = None  # opened lazily, once per DataLoader worker
        self.resume_samples = 0  # global samples of the current epoch already trained (set by load_state_dict)

    def __len__(self) -> int:
        return num_windows(self.num_tokens, self.block_size)

    def __getitem__(self, i: int) -> dict:
        import torch

        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        starts = np.array([i * self.block_size])
        x, y = read_windows(self.tokens, starts, self.block_size)
        if self.vocab_size is not None:
            check_token_range(x, y, starts, self.path, self.vocab_size)
        return {"x": torch.from_numpy(x[0].astype(np.int64)), "y": torch.from_numpy(y[0].astype(np.int64))}

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict:
        return {"sample_in_epoch": int(num_samples)}

    def load_state_dict(self, state: dict) -> None:
        self.resume_samples = int(state["sample_in_epoch"])


class MixedBins:
    """The windows of several BinDatasets (a data_mix's components) laid end to end as one map-style dataset: item i
    is item i - start_k of component k. `order` (mix.MixedOrder) is the mix's epoch; the resume state is BinDataset's.
    """

    def __init__(self, parts: list[BinDataset], order):
        self.parts, self.order = parts, order
        self.starts = np.cumsum([0] + [len(p) for p in parts])
        self.resume_samples = 0

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> dict:
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[k][i - int(self.starts[k])]

    state_dict = BinDataset.state_dict
    load_state_dict = BinDataset.load_state_dict


def _mix(x: np.ndarray, key: int) -> np.ndarray:
    """A 64-bit hash of each x (splitmix64's finalizer over x + key): the round function of the permutation."""
    with np.errstate(over="ignore"):
        z = (x + np.uint64(key)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def permute(positions: np.ndarray, n: int, key: int) -> np.ndarray:
    """The images of `positions` under a pseudo-random permutation of range(n) chosen by `key`.

    A bijection computed one index at a time, so shuffling n windows needs no n-long array: a balanced
    Feistel network over the smallest even number of bits that holds n (4 rounds of _mix), with
    cycle-walking (apply it again until the value falls inside range(n); on average < 4 times).
    """
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = [int(_mix(np.array([key + r], dtype=np.uint64), 0x5EED)[0]) for r in range(4)]
    x = positions.astype(np.uint64)
    todo = np.ones(len(x), dtype=bool)
    while todo.any():
        left, right = x[todo] >> np.uint64(half), x[todo] & mask
        for k in keys:
            left, right = right, left ^ (_mix(right, k) & mask)
        x[todo] = (left << np.uint64(half)) | right
        todo = x >= np.uint64(n)
    return x.astype(np.int64)


def resumable_sampler(dataset, world_size: int, rank: int, seed: int, order=None):
    """The training order of a BinDataset: a new shuffle every epoch, each window once per epoch, ranks
    disjoint (rank r takes every world_size-th position), and an exact resume mid-epoch. Positions map to windows
    through `permute`, in chunks as the DataLoader asks, so memory and start-up do not grow with the dataset; the
    order is a function of (seed, epoch) only, so on resume (BinDataset.load_state_dict) skipping each rank's
    first sample_in_epoch / world_size positions restores the exact data position. `order` (mix.MixedOrder) maps
    positions to a mix's windows instead: an epoch is then len(order) samples."""
    from torch.utils.data import DistributedSampler

    class PermutationSampler(DistributedSampler):
        chunk = 1 << 16  # positions computed at a time

        def __iter__(self):
            skip = self.dataset.resume_samples // self.num_replicas
            self.dataset.resume_samples = 0
            n, key = len(self.dataset), (self.seed << 20) + self.epoch
            for start in range(skip, self.num_samples, self.chunk):
                j = np.arange(start, min(start + self.chunk, self.num_samples), dtype=np.int64)
                positions = j * self.num_replicas + self.rank
                yield from (permute(positions, n, key) if order is None else order(positions, key)).tolist()

    sampler = PermutationSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    if order is not None:  # an epoch of the mix, not of the windows laid end to end
        sampler.num_samples = len(order) // world_size
        sampler.total_size = sampler.num_samples * world_size
    return sampler


class MixedOrder:
    """The order of one epoch of a .bin mix: position p of the epoch -> (component k, window w) as an index into the
    components' windows laid end to end. An epoch holds counts[k] slots of component k; a keyed permutation
    (permute) of all slots interleaves them, and slot t of component k reads window
    permute(t mod size_k) of it: whole repeats read every window, a fractional or partial one a keyed choice."""

    def __init__(self, counts: Sequence[int], sizes: Sequence[int]):
        self.counts, self.sizes = np.asarray(counts, np.int64), np.asarray(sizes, np.int64)
        self.slot_starts = np.concatenate([[0], np.cumsum(self.counts)])
        self.window_starts = np.concatenate([[0], np.cumsum(self.sizes)])

    def __len__(self) -> int:
        return int(self.slot_starts[-1])

    def __call__(self, positions: np.ndarray, key: int) -> np.ndarray:
        slots = permute(positions, len(self), key)
        k = np.searchsorted(self.slot_starts, slots, side="right") - 1
        out = np.empty_like(slots)
        for c in np.unique(k):
            here = k == c
            t = (slots[here] - self.slot_starts[c]) % self.sizes[c]
            # a key of its own per component (key < 2**40 for any seed < 2**20 and epoch < 2**20)
            out[here] = self.window_starts[c] + permute(t, int(self.sizes[c]), key + ((int(c) + 1) << 40))
        return out
