"""data_mix: several datasets (components) mixed by weight, as Streaming's Stream(proportion=, repeat=, choose=)
weights them: the weights checked, each component's samples per epoch and name, and the shares a run reports
(loaders.MixedOrder interleaves .bin components).
Details: docs/training.md#mixing-components."""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from pilegpt import storage

WEIGHT_KINDS = ("proportion", "repeat", "choose")  # Streaming's Stream arguments, one per component
RESERVED_LABELS = ("train", "val", "hellaswag")  # eval set names train.py uses itself


def component_name(root: str) -> str:
    """A component's name: its folder's name (the last part of a path or s3:// URL), as an eval set label: every
    character other than a letter, a digit or "_" becomes "_" (logged as <name>_loss, <name>_bpb)."""
    last = storage.without_scheme(root).rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"\W", "_", last, flags=re.ASCII) or "_"


def check_mix(data_mix: dict) -> list[str]:
    """The rules of a data_mix, as config errors naming the root: one weight per root, of Streaming's kinds, each
    positive (choose a whole number), proportion never beside repeat/choose (Streaming refuses it too), the roots'
    names distinct and not train.py's own eval set names."""
    errors, names = [], {}
    for root, weight in data_mix.items():
        if not isinstance(root, str) or not root:
            errors.append(f"data_mix: {root!r} is not a folder or an s3:// MDS root")
            continue
        kind, value = next(iter(weight.items())) if isinstance(weight, dict) and len(weight) == 1 else (None, None)
        if kind not in WEIGHT_KINDS:
            errors.append(f"data_mix: {root}: {weight!r} must be one of {{'proportion': p}}, {{'repeat': r}}, "
                          "{'choose': n}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            errors.append(f"data_mix: {root}: {kind} must be a number > 0, got {value!r} (drop the root to leave "
                          "it out)")
        elif kind == "choose" and not isinstance(value, int):
            errors.append(f"data_mix: {root}: choose is a number of samples, a whole number, got {value!r}")
        name = component_name(root)
        if name in RESERVED_LABELS or name in names:
            errors.append(f"data_mix: {root} and {names.get(name, 'train.py')} have the same name {name!r}, which "
                          "names its eval set: rename one folder")
        names[name] = root
    kinds = {next(iter(w)) for w in data_mix.values() if isinstance(w, dict) and len(w) == 1}
    if "proportion" in kinds and kinds & {"repeat", "choose"}:
        first = next(r for r, w in data_mix.items() if isinstance(w, dict) and "proportion" not in w)
        errors.append(f"data_mix: {first}: proportion (relative) and repeat/choose (absolute) cannot be mixed, as in "
                      "Streaming: give every root a proportion, or every root a repeat or a choose")
    return errors


def sample_counts(weights: Sequence[dict], sizes: Sequence[int]) -> list[int]:
    """Each component's samples per epoch, from its weight and its size (samples, i.e. windows), by Streaming's
    rules (Stream.apply_weights): repeat r -> int(r * size); choose n -> n; proportion p -> shares of an epoch of
    sum(sizes) samples, floor(total * p / sum(p)), the remainder one each to the largest fractional parts (Streaming
    gives it to random streams)."""
    if "proportion" not in weights[0]:
        return [int(w["repeat"] * n) if "repeat" in w else int(w["choose"]) for w, n in zip(weights, sizes)]
    p = np.array([w["proportion"] for w in weights], dtype=np.float64)
    exact = sum(sizes) * p / p.sum()
    counts = np.floor(exact).astype(np.int64)
    shortfall = int(sum(sizes) - counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:shortfall]] += 1
    return counts.tolist()


def shares_line(shares: dict[str, dict]) -> str:
    """The run's line on its mix: each component's samples per epoch and share of the epoch's tokens."""
    parts = [f"{name} {s['share']:.2%} ({s['samples']:,} samples)" for name, s in shares.items()]
    total = sum(s["samples"] for s in shares.values())
    return f"data_mix: one epoch = {total:,} samples; share of its tokens: " + ", ".join(parts)


def realised_shares(data_mix: dict, counts: Sequence[int], sizes: Sequence[int]) -> dict[str, dict]:
    """{component name: {root, weight, size, samples, share}}: share = samples / all samples of the epoch (every
    sample is block_size tokens, so it is also the share of the epoch's tokens)."""
    total = max(1, sum(counts))
    return {component_name(root): {"root": root, "weight": weight, "size": int(n), "samples": int(c),
                                   "share": c / total}
            for (root, weight), c, n in zip(data_mix.items(), counts, sizes)}
