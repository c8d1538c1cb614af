"""What a run trains on, recorded in its save_folder (`data.json`, local or s3://) and compared when it resumes: an
autoresume on other data is refused in one line unless `data_changed_ok=True` says the change is intended.

    record = describe(cfg); note = check_resume(record, "runs/x", ok=False); write(record, "runs/x")
What counts as "the same data": `describe`; docs/training.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from pilegpt import storage
from pilegpt.common import UserError
from pilegpt.data import META_NAME, SPLITS, Meta, nanogpt_meta
from pilegpt.removed import REMOVED_SETTINGS
from pilegpt.train.data import loaders

DATA_JSON = "data.json"  # in the save_folder, beside the checkpoints
FINGERPRINT_PIECES = 8  # pieces of a .bin hashed for its fingerprint
FINGERPRINT_PIECE = 1 << 20  # bytes per piece


def fingerprint(path: str | os.PathLike) -> str:
    """sha256 of a file's size and of FINGERPRINT_PIECES evenly spread pieces of it (all of it when small)."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    span = max(0, size - FINGERPRINT_PIECE)
    offsets = sorted({span * k // (FINGERPRINT_PIECES - 1) for k in range(FINGERPRINT_PIECES)})
    with open(path, "rb") as f:
        for offset in offsets if span else [0]:
            f.seek(offset)
            h.update(f.read(FINGERPRINT_PIECE if span else size))
    return h.hexdigest()


def index_digest(index: bytes) -> str:
    """sha256 of the shard list of an MDS index.json (names, sizes, hashes), whatever its formatting."""
    shards = json.loads(index).get("shards")
    return hashlib.sha256(json.dumps(shards, sort_keys=True).encode()).hexdigest()


def describe(cfg) -> dict:
    """The identity of the data a TrainConfig reads. For MDS, every split's index of every root is read and its
    shard names checked (loaders.read_mds_indexes) before Streaming touches anything.

    What counts as "the same data" is the content, not where it lies (a dataset moved or copied to another disk or
    bucket is the same data):
    - .bin: meta.json's tokenizer, vocab_size, eot_token and dtype, and per split its token count and a fingerprint:
      the file's size and the sha256 of FINGERPRINT_PIECES pieces of FINGERPRINT_PIECE bytes spread evenly over it
      (the first and the last included). Cheap on the Pile's 600 GB; a change that keeps the size and all those
      pieces (a rewrite of a few tokens in between) is not seen.
    - MDS: per root, in order, per split: the sha256 of the shard list its index.json gives (every shard's name,
      size and the hashes to_mds stored), which changes with any rebuilt shard."""
    if loaders.data_format_of(cfg) == "bin" and not cfg.data_mix:
        return describe_bin(Path(cfg.data_dir))
    if cfg.data_mix and loaders.data_format_of(cfg) == "bin":  # per root, in order: its weight and its data
        return {"format": "bin_mix", "roots": [{"root": root, "weight": weight, **describe_bin(Path(root))}
                                               for root, weight in cfg.data_mix.items()]}
    indexes = loaders.read_mds_indexes(cfg)
    return {"format": "mds", "roots": [
        {"root": root, **{s: index_digest(indexes[s][k]) if indexes[s] and indexes[s][k] is not None else None
                          for s in SPLITS}, **({"weight": cfg.data_mix[root]} if cfg.data_mix else {})}
        for k, root in enumerate(loaders.mds_roots(cfg))]}


def describe_bin(folder: Path) -> dict:
    """The record of one .bin folder (describe's rules)."""
    meta = Meta.read(folder) if (folder / META_NAME).is_file() else nanogpt_meta(folder)
    return {"format": "bin", "tokenizer": meta.tokenizer, "vocab_size": meta.vocab_size,
            "eot_token": meta.eot_token, "dtype": meta.dtype,
            "splits": {s: {"file": meta.splits[s].file, "tokens": meta.token_count(folder, s),
                           "fingerprint": fingerprint(folder / meta.splits[s].file)}
                       for s in SPLITS if s in meta.splits}}


def differences(saved: dict, now: dict) -> list[str]:
    """What differs between two records, in words (where the data lies is not compared)."""
    if saved.get("format") != now["format"]:
        return [f"{now['format']} data (the run trained on {saved.get('format')})"]
    if saved.get("doc_aligned"):  # the packed train rows of doc_aligned=True, a removed setting: windows now
        return [f"windows of its train tokens (it trained on doc_aligned=True's packed rows; doc_aligned was removed "
                f"after {REMOVED_SETTINGS['doc_aligned'][1]})"]
    if now["format"] == "bin":
        found = [f"{k}={now[k]!r} (the run had {saved.get(k)!r})" for k in ("tokenizer", "vocab_size", "eot_token",
                                                                             "dtype") if saved.get(k) != now[k]]
        was = saved.get("splits", {})
        return found + [change for split in SPLITS
                        if (change := split_change(split, was.get(split), now["splits"].get(split)))]
    was_roots, new_roots = saved.get("roots", []), now["roots"]
    if len(was_roots) != len(new_roots):
        return [f"{len(new_roots)} {'MDS roots' if now['format'] == 'mds' else 'data_mix roots'} (the run had "
                f"{len(was_roots)})"]
    if reordered(was_roots, new_roots):
        was_order = ", ".join(str(r["root"]) for r in was_roots)
        return [f"the order of the {'MDS roots' if now['format'] == 'mds' else 'data_mix roots'}: "
                f"{', '.join(r['root'] for r in new_roots)} (the run had {was_order}; list them in the run's order: "
                "the sample order follows it)"]
    found = [f"{new['root']}: weight {new['weight']} (the run had {was.get('weight')})"
             for was, new in zip(was_roots, new_roots) if "weight" in new and was.get("weight") != new["weight"]]
    if now["format"] == "bin_mix":
        return found + [f"{new['root']}: {change}" for was, new in zip(was_roots, new_roots)
                        for change in differences({**was, "format": "bin"}, {**new, "format": "bin"})]
    return found + [f"{new['root']}/{split}/index.json lists other shards" for was, new in zip(was_roots, new_roots)
                    for split in SPLITS if was.get(split) != new[split]]


def reordered(was_roots: list, new_roots: list) -> bool:
    """Whether the roots are the run's, data and weights, in another order (where each lies is not compared)."""
    def content(record) -> str:
        return json.dumps({k: v for k, v in record.items() if k != "root"}, sort_keys=True, default=str)

    was, new = [content(r) for r in was_roots], [content(r) for r in new_roots]
    return was != new and sorted(was) == sorted(new)


def damage(saved) -> Optional[str]:
    """What is missing from a data.json that train.py wrote, or None when it is whole: a record with a field gone
    (an edit, a cut file) is damaged, not a record of other data."""
    if not isinstance(saved, dict) or saved.get("format") not in ("bin", "mds", "bin_mix"):
        return "not a data record (no format 'bin', 'mds' or 'bin_mix')"
    if saved["format"] == "bin":
        missing = [k for k in ("tokenizer", "vocab_size", "eot_token", "dtype", "splits") if k not in saved]
        splits = saved.get("splits")
        if not missing and not (isinstance(splits, dict) and all(
                isinstance(s, dict) and {"file", "tokens", "fingerprint"} <= set(s) for s in splits.values())):
            missing = ["a split's file, tokens or fingerprint"]
    else:
        roots = saved.get("roots")
        missing = [] if isinstance(roots, list) and all(isinstance(r, dict) and "root" in r for r in roots) \
            else ["roots"]
        if not missing and saved["format"] == "bin_mix":
            missing = [f"{r['root']}: {d}" for r in roots if (d := damage({**r, "format": "bin"}))]
    return f"{', '.join(missing)} missing" if missing else None


def split_change(split: str, was: Optional[dict], new: Optional[dict]) -> Optional[str]:
    """How one split of a .bin record differs from the run's (`was`), or None."""
    if was is None or new is None:
        return f"{split} split {'added' if was is None else 'removed'}" if was != new else None
    if was.get("tokens") != new["tokens"]:
        return f"{new['file']} holds {new['tokens']:,} tokens (the run had {was.get('tokens'):,})"
    if was.get("fingerprint") != new["fingerprint"]:
        return f"{new['file']} holds other tokens (same count, another fingerprint)"
    return None


def check_resume(record: dict, save_folder: str, ok: bool) -> Optional[str]:
    """On autoresume: a UserError when the data differs from the run's data.json, unless `ok`; a note (or None)."""
    where = storage.join(save_folder, DATA_JSON)
    saved = storage.folder(save_folder).get(DATA_JSON)
    if saved is None:
        return f"note: {where} not found (a run from before data records): recording the data it resumes on"
    try:
        saved = json.loads(saved)
    except ValueError:
        saved = None
    broken = "not JSON" if saved is None else damage(saved)
    if broken and ok:
        return f"note: {where} is damaged ({broken}): recording the data it resumes on, as data_changed_ok=True says"
    if broken:
        raise UserError(f"autoresume: {where} is damaged ({broken}): it records what the run trained on; restore it "
                        "from a copy, or pass --data_changed_ok=True to continue on the data given and record it anew")
    changed = differences(saved, record)
    if not changed:
        return None
    if ok:
        return f"note: the data changed since the run's checkpoints ({'; '.join(changed)}): continuing on it, as " \
               "data_changed_ok=True says"
    what = "its data in another order" if changed[0].startswith("the order of ") else "other data"
    raise UserError(f"autoresume: {save_folder} was trained on {what}: {'; '.join(changed)} ({where}); resume "
                    "on the data it was trained on, start a new run with another --run_name, or pass "
                    "--data_changed_ok=True if the change is intended")


def canonical_nodes(cfg, save_folder: Optional[str], nodes: int) -> int:
    """Streaming's num_canonical_nodes for an MDS run on `nodes` nodes: the one in the run's data.json when it
    resumes (`save_folder`), else cfg.num_canonical_nodes, else `nodes`. Streaming shuffles and partitions the
    samples as for that many nodes, so the order is the run's, whatever number of nodes a resume runs on; it can
    keep it on P nodes when P divides it or is a multiple of it, and a resume that cannot is refused in one line."""
    saved = None
    if save_folder is not None:
        try:
            saved = json.loads(storage.folder(save_folder).get(DATA_JSON) or b"{}").get("num_canonical_nodes")
        except (ValueError, AttributeError):
            saved = None
    where = storage.join(save_folder, DATA_JSON) if save_folder else ""
    if saved is not None and cfg.num_canonical_nodes not in (None, saved):
        raise UserError(f"num_canonical_nodes={cfg.num_canonical_nodes}, but the run's MDS sample order was fixed "
                        f"with {saved} ({where}): leave num_canonical_nodes unset to continue the run, or start a new "
                        "run with another --run_name")
    value = saved or cfg.num_canonical_nodes or nodes
    if value % nodes and nodes % value:
        raise UserError(f"the run's MDS sample order is fixed for num_canonical_nodes={value}"
                        f"{f' ({where})' if saved else ''}, which {nodes} nodes cannot keep (Streaming needs one to "
                        f"divide the other): run on a number of nodes that divides {value} or is a multiple of it")
    return value


def write(record: dict, save_folder: str) -> None:
    """data.json := record (locally written whole, or one PUT on S3)."""
    storage.folder(save_folder).write(DATA_JSON, (json.dumps(record, indent=2) + "\n").encode())
