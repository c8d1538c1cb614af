"""data_mix: several datasets (components) mixed by weight, as Streaming's Stream(proportion=, repeat=, choose=)
weights them: the weights checked, each component's samples per epoch and name, the shares a run reports
(bin_reader.MixedOrder interleaves .bin components), and a mix found by folder name (config/pile_mix.py's).
Details: docs/training.md#mixing-components."""

from __future__ import annotations

import os
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


MAX_SAMPLES = 1 << 48  # samples of one epoch of a mix, at most: far beyond any dataset, and safe in int64 arithmetic


def weight_error(root: str, weight) -> str | None:
    """What is wrong with one root's weight, or None: one of Streaming's kinds, a real number (numpy's too), finite
    and > 0, choose a whole number, repeat and choose at most MAX_SAMPLES."""
    kind, value = next(iter(weight.items())) if isinstance(weight, dict) and len(weight) == 1 else (None, None)
    if kind not in WEIGHT_KINDS:
        return (f"data_mix: {root}: {weight!r} must be one of {{'proportion': p}}, {{'repeat': r}}, "
                "{'choose': n}")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not value > 0:
        return f"data_mix: {root}: {kind} must be a number > 0, got {value!r} (drop the root to leave it out)"
    if not np.isfinite(float(value)):
        return f"data_mix: {root}: {kind} must be a finite number > 0, got {value!r}"
    if kind == "choose" and not isinstance(value, (int, np.integer)):
        return f"data_mix: {root}: choose is a number of samples, a whole number, got {value!r}"
    if kind != "proportion" and value > MAX_SAMPLES:
        return (f"data_mix: {root}: {kind} {value!r} gives more than {MAX_SAMPLES:,} samples an epoch: give a "
                "smaller one")
    return None


def real_root(root: str) -> str:
    """Where a root is: a local one's real path (symlinks and '.' resolved), a URL without its trailing '/'."""
    return root.rstrip("/") if storage.is_remote(root) else os.path.realpath(root)


def check_mix(data_mix: dict) -> list[str]:
    """The rules of a data_mix, as config errors naming the root: one weight per root (weight_error), proportion
    never beside repeat/choose (Streaming refuses it too) and summing to a finite number, each root once (two
    spellings of one folder, a symlink among them, are one root), the roots' names distinct and not train.py's own
    eval set names."""
    errors, names, places = [], {}, {}
    for root, weight in data_mix.items():
        if not isinstance(root, str) or not root:
            errors.append(f"data_mix: {root!r} is not a folder or an s3:// MDS root")
            continue
        errors += [e for e in [weight_error(root, weight)] if e]
        place = real_root(root)
        if place in places:
            errors.append(f"data_mix: {places[place]} and {root} are one folder ({place}): list it once")
        places.setdefault(place, root)
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
    elif kinds == {"proportion"} and not errors:
        total = sum(float(next(iter(w.values()))) for w in data_mix.values())
        if not np.isfinite(total):
            errors.append(f"data_mix: the proportions sum to {total} (they are relative): scale them down, e.g. to "
                          "sum to 1")
    return errors


def plain_weights(data_mix: dict) -> dict:
    """The mix with numpy numbers as Python's (np.int64(100) -> 100), as data.json and config.json record them."""
    return {root: {kind: value.item() if isinstance(value, np.generic) else value for kind, value in weight.items()}
            for root, weight in data_mix.items()}


def check_epoch(data_mix: dict, sizes: Sequence[int]) -> None:
    """A UserError when the mix's weights give a root no sample in an epoch (it would still be evaluated, never
    trained on) or the epoch more than MAX_SAMPLES samples; `sizes` are the roots' samples."""
    from pilegpt.common import UserError

    weights = list(data_mix.values())
    if "proportion" not in weights[0]:
        counts = [float(w["repeat"]) * n if "repeat" in w else float(w["choose"]) for w, n in zip(weights, sizes)]
    else:
        p = np.array([float(w["proportion"]) for w in weights])
        counts = list(sum(sizes) * (p / p.sum()))
    if sum(counts) > MAX_SAMPLES:
        raise UserError(f"data_mix: its weights give an epoch of {sum(counts):.3g} samples, more than {MAX_SAMPLES:,}:"
                        " give smaller ones")
    for (root, weight), count, n in zip(data_mix.items(), counts, sizes):
        if int(count) == 0:
            raise UserError(f"data_mix: {root}: {weight!r} gives it {count:.3g} of its {n:,} samples an epoch, "
                            "fewer than one (it would be evaluated, never trained on): raise its weight, or drop it")


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


def folder_key(name: str) -> str:
    """A name's letters and digits, lower case: how a folder is matched to a component ("PileCC" -> Pile-CC)."""
    return "".join(c for c in name.lower() if c.isalnum())


def subfolders(base_dir: str) -> list[str]:
    """The folders under base_dir: local subfolders (not hidden), or the prefixes under an s3:// URL."""
    if not storage.is_remote(base_dir):
        if not os.path.isdir(base_dir):
            raise ValueError(f"PILE_MIX_DATA={base_dir} not found: prepare_data.py --by-subset --out-dir {base_dir}")
        return sorted(os.path.join(base_dir, n) for n in os.listdir(base_dir)
                      if os.path.isdir(os.path.join(base_dir, n)) and not n.startswith("."))
    return sorted({storage.join(base_dir, n.split("/", 1)[0]) for n in storage.folder(base_dir).names() if "/" in n})


def component_of(folder: str, names) -> str | None:
    """The component (one of `names`) a folder holds, by its name: prepare_data's (data.subset_folder: "pile-cc",
    "gutenberg_pg-19"), or else its letters and digits, case ignored; None if none."""
    from pilegpt.data import subset_folder

    name = folder.rstrip("/").rsplit("/", 1)[-1]
    by_folder = {subset_folder(n): n for n in names}
    return by_folder.get(name) or {folder_key(n): n for n in names}.get(folder_key(name))


def repeat_mix_of_folders(base_dir: str, repeats: dict[str, float]) -> dict[str, dict]:
    """The data_mix {folder: {"repeat": r}} of the component folders under base_dir (PILE_MIX_DATA), each matched by
    name to one of `repeats` (component -> epochs), in repeats' order. A folder that is none of them, or two folders
    of one component (`PileCC/` and `pile-cc/`), is a ValueError naming them; the absent components are left out,
    with a line (rank 0) naming them."""
    base_dir = base_dir.rstrip("/")
    found: dict[str, str] = {}
    for folder in subfolders(base_dir):
        name = component_of(folder, repeats)
        if name is None:
            raise ValueError(f"{folder} is not a Pile component (one of {', '.join(repeats)}): move it out of "
                             f"{base_dir}")
        if name in found:
            raise ValueError(f"{found[name]} and {folder} both hold the Pile component {name}: keep one, move the "
                             f"other out of {base_dir}")
        found[name] = folder
    if not found:
        raise ValueError(f"no Pile component folder under PILE_MIX_DATA={base_dir}: run prepare_data.py --by-subset")
    absent = [name for name in repeats if name not in found]
    if absent and os.environ.get("RANK", "0") == "0":
        print(f"pile_mix: {len(found)} of {len(repeats)} components under {base_dir}; absent, left out (the "
              f"others' shares renormalised over what is present): {', '.join(absent)}", flush=True)
    return {found[name]: {"repeat": epochs} for name, epochs in repeats.items() if name in found}
