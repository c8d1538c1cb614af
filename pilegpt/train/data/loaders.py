"""The datasets and loaders train.py reads, on data.py's contract: batches {"x": (B, T), "y": (B, T)} of token
ids, read from .bin windows or rows in a keyed shuffle (bin_reader.py's datasets and order) or from MDS shards
through Streaming (local or s3://, through a local cache). Streaming is imported only when MDS is read. Details:
docs/training.md."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional

import numpy as np

from pilegpt import compat, storage
from pilegpt.common import UserError, check_writable_folder
from pilegpt.data import (
    INDEX_NAME,
    META_NAME,
    SPLITS,
    TO_MDS_META,
    Meta,
    ids_outside,
    listed_shards,
    nanogpt_meta,
    validation_hash,
)
from pilegpt.removed import removed_setting_error
from pilegpt.train.data.bin_reader import BinDataset, MixedBins, MixedOrder, permute, resumable_sampler
from pilegpt.train.data.mix import check_epoch, component_name, realised_shares, sample_counts


def collate_mds(samples: list[dict], vocab_size: Optional[int] = None) -> dict:
    """MDS samples (numpy x, y of any integer dtype) -> {"x": LongTensor (B, T), "y": LongTensor (B, T)};
    with vocab_size, an id outside the vocabulary is a UserError (not an IndexError deep in the model)."""
    import torch

    x, y = (np.stack([s[k] for s in samples]) for k in ("x", "y"))
    if vocab_size is not None:
        for arr in (x, y):
            outside = ids_outside(arr, vocab_size)
            if outside is not None and outside.any():
                bad = arr[outside].flat[0]
                raise UserError(f"the MDS data holds token id {bad}, outside the model's vocab_size {vocab_size}: "
                                "was it made with another tokenizer? pass the right --vocab_size or re-run to_mds.py")
    return {"x": torch.from_numpy(x.astype(np.int64)), "y": torch.from_numpy(y.astype(np.int64))}


def detect_format(data_dir: str, data_format: str) -> str:
    """"bin" or "mds": what data_dir holds (prepare_data's train.bin or to_mds's train/index.json)."""
    root = Path(data_dir)
    if not root.is_dir():
        raise UserError(f"data_dir {root} not found: make it with prepare_data.py --out-dir {root} (.bin) or "
                        f"to_mds.py --out {root} (MDS), or pass --data_dir=FOLDER")
    has_bin, has_mds = (root / "train.bin").is_file(), (root / "train" / INDEX_NAME).is_file()
    if data_format == "bin" or (data_format == "auto" and has_bin):
        if not has_bin:
            raise UserError(f"{root / 'train.bin'} not found: run prepare_data.py --out-dir {root}")
        return "bin"
    if data_format == "mds" or (data_format == "auto" and has_mds):
        if not has_mds:
            raise UserError(f"{root / 'train' / INDEX_NAME} not found: run to_mds.py --out {root}")
        return "mds"
    raise UserError(f"data_dir {root} holds neither train.bin (prepare_data.py) nor train/{INDEX_NAME} "
                    f"(to_mds.py)")


def bin_split(data_dir: str, meta: Meta, split: str, block_size: int,
              too_short: Optional[bool] = None) -> Optional[BinDataset]:
    """The BinDataset of one split, or None when the dataset has no such split. A split shorter than one sample is a
    UserError, or with too_short set as none (a data_mix root's val split: no eval set for that root, with a note when
    too_short is True)."""
    if split not in meta.splits:
        return None
    n = meta.token_count(data_dir, split)
    dataset = BinDataset(str(Path(data_dir) / meta.splits[split].file), block_size, meta.dtype, num_tokens=n,
                         vocab_size=meta.vocab_size)
    if len(dataset) == 0 and too_short is not None:
        if too_short:
            print(f"note: {dataset.path} has {n} tokens, fewer than one sample of block_size+1 = {block_size + 1}: "
                  f"{data_dir} trains without an eval set of its own (as without a val split)", flush=True)
        return None
    if len(dataset) == 0:
        raise UserError(f"{dataset.path} has {n} tokens, fewer than one sample of block_size+1 = "
                        f"{block_size + 1}: use more data or a smaller --block_size")
    return dataset


def mds_roots(cfg) -> list[str]:
    if cfg.data_mix:
        return list(cfg.data_mix)
    if cfg.data_remote is None:
        return [cfg.data_dir]
    return [cfg.data_remote] if isinstance(cfg.data_remote, str) else list(cfg.data_remote)


def mds_cache_dir(data_local: str, root: str, split: str, role: str = "") -> str:
    """A local cache folder of its own for each root and split (Streaming needs distinct ones), always inside
    data_local: the root's name (its last 80 characters as letters, digits, ".", "_" and "-") and a hash of the
    root itself (a local one resolved: its real path), so that two roots never share one (`a_b` and `a/b`) and two
    spellings of one root do. role: a named eval set's own folder beside the split's (split.role): Streaming
    refuses two datasets of one process that share a cache folder, and a data_mix root's eval set (or an eval_data
    set naming the data's own root) reads the val/ that the run's val set reads too."""
    resolved = root.rstrip("/") if storage.is_remote(root) else os.path.realpath(root)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", storage.without_scheme(resolved)).strip("_")[-80:].lstrip(".")
    key = hashlib.sha256(resolved.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return os.path.join(data_local, f"{slug}-{key}" if slug else key, f"{split}.{role}" if role else split)


def mds_caches(cfg, root: str, split: str) -> list[str]:
    """Every cache folder a run reads split/ of an MDS root through: the data's own, and its data_mix eval set's."""
    own = [mds_cache_dir(cfg.data_local, root, split)]
    return own + ([mds_cache_dir(cfg.data_local, root, split, component_name(root))] if cfg.data_mix else [])


def refresh_mds_cache(cfg) -> list[str]:
    """Empty each cache folder whose index.json differs from its source's (a rebuilt dataset: Streaming would read
    the old shards it cached); returns the folders emptied. Only folders inside data_local are touched."""
    from pilegpt.train.data.mds_reader import is_inside

    emptied = []
    for split, found in read_mds_indexes(cfg).items():
        for root, index in zip(mds_roots(cfg), found or []):
            for cache in mds_caches(cfg, root, split):
                cached = storage.folder(cache).get(INDEX_NAME) if index is not None else None
                if cached is not None and cached != index and is_inside(cache, cfg.data_local):
                    shutil.rmtree(cache)
                    emptied.append(cache)
    return emptied


def read_split_file(root: str, split: str, name: str) -> Optional[bytes]:
    """The bytes of root/split/name (local path or s3://), or None when it is missing (other stores: None)."""
    if storage.is_remote(root) and not storage.is_s3(root):
        return None
    return storage.folder(storage.join(root, split)).get(name)


def split_indexes(cfg, split: str) -> Optional[list[Optional[bytes]]]:
    """The index.json of split/ under every root (None where a root has none or, on stores other than S3, where it
    cannot be read here), or None when no root has the split; every shard name checked (data.listed_shards: a plain
    name inside its folder) before Streaming reads or writes anything by those names. A split missing under some
    roots only is an error."""
    roots = mds_roots(cfg)
    indexes = [read_split_file(r, split, INDEX_NAME) for r in roots]
    for root, index in zip(roots, indexes):
        if index is not None:
            listed_shards(index, storage.join(root, split, INDEX_NAME), "re-run to_mds.py")
    # whether root/split exists (on stores other than S3 it cannot be checked here: Streaming will tell)
    present = [i is not None or (storage.is_remote(r) and not storage.is_s3(r)) for r, i in zip(roots, indexes)]
    if any(present) and not all(present):
        missing = [r for r, ok in zip(roots, present) if not ok]
        raise UserError(f"MDS split {split}/ is missing under {missing} but present under the other roots")
    return indexes if any(present) else None


def read_mds_indexes(cfg) -> dict[str, Optional[list[Optional[bytes]]]]:
    """split_indexes of every split: all of a dataset's shard names checked before Streaming opens any split."""
    return {split: split_indexes(cfg, split) for split in SPLITS}


def mds_split(cfg, split: str, batch_size: int, shuffle: bool, weighted: bool = False, role: str = ""):
    """A StreamingDataset over split/ of every MDS root (several roots: several streams), or None. Every root,
    local or remote, is read through a cache under data_local (Streaming decompresses shards where it reads them,
    and a dataset folder must stay as to_mds wrote it); shard names are checked first (split_indexes), checksums
    as shards enter the cache (xxh64 when the index has it), so a corrupt shard is refused. weighted: each root's
    data_mix weight goes to its Stream (proportion=, repeat= or choose=); role: a named eval set's (mds_cache_dir)."""
    from streaming import Stream

    from pilegpt.train.data.cache_budget import cache_limit_for, limit_bytes
    from pilegpt.train.data.mds_reader import CheckedStreamingDataset

    indexes = split_indexes(cfg, split)
    if indexes is None:
        return None
    roots = mds_roots(cfg)
    loaders = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) * max(1, cfg.num_workers)  # the node's, sharing its cache
    limit = cache_limit_for(limit_bytes(cfg.data_cache_limit), indexes, loaders, f"{split}/ of {', '.join(roots)}")
    streams = []
    for root, index in zip(roots, indexes):
        made = read_split_file(root, split, TO_MDS_META)
        check_not_aligned(storage.join(root, split), made)
        vocab = json.loads(made).get("vocab_size") if made else None
        if vocab is not None and vocab > cfg.vocab_size:
            raise UserError(f"{root}/{split} was made with a vocabulary of {vocab} tokens but vocab_size is "
                            f"{cfg.vocab_size}: pass --vocab_size={vocab}")
        streams.append(Stream(remote=storage.join(root, split), local=mds_cache_dir(cfg.data_local, root, split, role),
                              validate_hash=validation_hash(index) if index is not None else None,
                              **(cfg.data_mix.get(root, {}) if weighted else {})))
    try:
        with compat.streaming_start_lock():  # two runs starting at once; shared memory a crash left
            leader = os.environ.get("LOCAL_RANK", "0") == "0"  # the others attach to its block: only it can tell
            if any_rank(leader and compat.caches_read_elsewhere([s.local for s in streams])):
                raise shared_cache_error(cfg, split, roots)  # another run reads it (Streaming's check misses one)
            return CheckedStreamingDataset(streams=streams, batch_size=batch_size, shuffle=shuffle,
                                           shuffle_seed=cfg.seed, num_canonical_nodes=cfg.num_canonical_nodes,
                                           cache_limit=limit)
    except (FileNotFoundError, ValueError) as e:
        if str(e).startswith("Reused local directory") and " vs " in str(e):  # a live dataset of another process
            raise shared_cache_error(cfg, split, roots) from None
        raise UserError(f"cannot open MDS split {split}/ of {roots}: {e}") from None


def any_rank(flag: bool) -> bool:
    """Whether `flag` holds on any process of the job (every process asks at the same point; one process: itself),
    so that a refusal one local leader finds ends every rank, none left waiting at Streaming's barrier for it."""
    from composer.utils import dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    return any(dist.all_gather_object(bool(flag)))


def shared_cache_error(cfg, split: str, roots: list[str]) -> UserError:
    """Another run on this machine reads split/ of these roots through this run's cache folders (one data_local)."""
    where = roots[0] if len(roots) == 1 else f"{len(roots)} roots"
    return UserError(f"MDS split {split}/ of {where}: another process on this machine reads it through the same cache "
                     f"under data_local={cfg.data_local} (two runs on one dataset cannot share a cache): pass this run "
                     "--data_local=ANOTHER_FOLDER")


def check_not_aligned(where: str, made: Optional[bytes]) -> None:
    """A split whose to_mds.json (`made`) says to_mds wrote document-aligned rows (--sampling doc_aligned, removed
    with doc_aligned): one line naming the fix."""
    try:
        sampling = json.loads(made).get("sampling") if made else None
    except (ValueError, AttributeError):
        sampling = None
    if sampling == "doc_aligned":
        raise removed_setting_error("doc_aligned", f"{where} holds to_mds.py --sampling doc_aligned rows",
                                    "re-run to_mds.py without --sampling doc_aligned, or train on it with")


def check_sample_length(dataset, block_size: int, what: str) -> None:
    try:
        length = len(dataset[0]["x"])
    except (RuntimeError, ValueError) as e:
        from pilegpt.train.data.mds_reader import describe_read_failure

        caches = [s.local for s in dataset.streams]
        raise UserError(describe_read_failure(e, what, caches) or f"cannot read the first sample of {what}: {e}") \
            from None
    if length != block_size:
        raise UserError(f"{what} holds samples of {length} tokens but block_size is {block_size}: pass "
                        f"--block_size={length} or re-run to_mds.py --block-size {block_size}")


def data_format_of(cfg) -> str:
    """"bin" or "mds": what a TrainConfig's data is (data_mix: every root of one format, else a one-line error)."""
    if not cfg.data_mix:
        return "bin" if cfg.data_remote is None and detect_format(cfg.data_dir, cfg.data_format) == "bin" else "mds"
    found = {}
    for root in cfg.data_mix:
        if not storage.is_remote(root) and not Path(root).is_dir():
            raise UserError(f"data_mix: {root} not found: make it with prepare_data.py (.bin) or to_mds.py (MDS), "
                            "or drop it from data_mix")
        found.setdefault("mds" if storage.is_remote(root) else detect_format(root, cfg.data_format), root)
    if len(found) > 1:
        raise UserError(f"data_mix: {found['bin']} is .bin but {found['mds']} is MDS: one format per run (to_mds.py "
                        "makes MDS of a .bin folder)")
    return next(iter(found))


def bin_roots(cfg) -> list[str]:
    return list(cfg.data_mix) if cfg.data_mix else [cfg.data_dir]


def bin_train_set(cfg, rank: int):
    """(the train dataset, its order): one BinDataset (order None: permute its windows), or the MixedBins of a
    data_mix with its MixedOrder (each root's samples per epoch from its weight: mix.sample_counts)."""
    parts, tokenizers = [], {}
    for root in bin_roots(cfg):
        meta = read_meta(root, cfg.vocab_size, rank)
        part = bin_split(root, meta, "train", cfg.block_size)
        if part is None:
            raise UserError(f"{Path(root) / META_NAME} lists no train split: run prepare_data.py")
        parts.append(part)
        tokenizers.setdefault(meta.tokenizer, root)
    if len(tokenizers) > 1:
        raise UserError(f"data_mix: {' and '.join(f'{r} ({t})' for t, r in tokenizers.items())} were made with "
                        "different tokenizers: prepare every component with the same one")
    if not cfg.data_mix:
        return parts[0], None
    check_epoch(cfg.data_mix, [len(p) for p in parts])
    order = MixedOrder(sample_counts(list(cfg.data_mix.values()), [len(p) for p in parts]), [len(p) for p in parts])
    return MixedBins(parts, order), order


def bin_val_set(cfg, rank: int):
    """The val split of the .bin data (data_mix: every root's val windows, each once, in a keyed order fixed by the
    seed, so that eval_subset_num_batches reads from every root in proportion to its val split), or None."""
    short = (rank == 0) if cfg.data_mix else None  # a mix's root too short for one sample: left out, with a note
    parts = [bin_split(r, read_meta(r, cfg.vocab_size, rank), "val", cfg.block_size, short) for r in bin_roots(cfg)]
    parts = [p for p in parts if p is not None]
    if not cfg.data_mix or not parts:
        return eval_subset(parts[0], cfg) if parts else None
    mixed = MixedBins(parts, None)
    return mixed_eval_subset(mixed, len(mixed), cfg)


def mixed_eval_subset(val_set, size: int, cfg):
    """The samples a data_mix's evaluation reads from its roots' val samples laid end to end (`size` of them, root
    by root): the first eval_subset_num_batches x eval batch size (all with -1) positions of a permutation keyed by
    the seed, so that every root is read in proportion to its val split (not the first root alone), the same
    samples on any number of processes (DistributedSampler splits them; Composer drops its padding)."""
    from torch.utils.data import Subset

    n = size if cfg.eval_subset_num_batches < 0 else min(size, cfg.eval_subset_num_batches * eval_batch_size(cfg))
    return Subset(val_set, permute(np.arange(n, dtype=np.int64), size, cfg.seed << 20).tolist())


def bin_loaders(cfg, world_size: int, rank: int, loader_args: dict):
    """(train DataLoader, val DataLoader or None) of .bin data: the keyed shuffle of resumable_sampler."""
    from composer.utils import dist
    from torch.utils.data import DataLoader

    train_set, order = bin_train_set(cfg, rank)
    epoch = len(order) if order is not None else len(train_set)
    if epoch < cfg.global_batch_size:
        raise UserError(f"the train data has {epoch} samples of {cfg.block_size} tokens per epoch, fewer than one "
                        f"global batch ({cfg.global_batch_size}): lower --global_batch_size or --block_size")
    sampler = resumable_sampler(train_set, world_size, rank, cfg.seed, order)
    train = DataLoader(train_set, batch_size=cfg.per_rank_batch(world_size), sampler=sampler, drop_last=True,
                       **loader_args)
    val_set = bin_val_set(cfg, rank)
    if val_set is None:
        return train, None
    val_sampler = dist.get_sampler(val_set, shuffle=False, drop_last=False)
    return train, DataLoader(val_set, batch_size=eval_batch_size(cfg), sampler=val_sampler, **loader_args)


def mds_loaders(cfg, world_size: int, loader_args: dict):
    """(train DataLoader, val DataLoader or None) of MDS data, through Streaming (data_mix: weighted streams, and the
    val samples of every root in a keyed order: mixed_eval_subset)."""
    from composer.utils import dist
    from torch.utils.data import DataLoader

    per_rank, eval_bs = cfg.per_rank_batch(world_size), eval_batch_size(cfg)
    check_writable_folder(cfg.data_local, "data_local", "pass another --data_local (the local MDS cache)")
    indexes = read_mds_indexes(cfg)  # every shard name of every split checked before Streaming starts
    if cfg.data_mix and indexes["train"] and all(i is not None for i in indexes["train"]):
        check_epoch(cfg.data_mix, [sum(s["samples"] for s in json.loads(i)["shards"]) for i in indexes["train"]])
    train_set = mds_split(cfg, "train", per_rank, shuffle=True, weighted=True)
    if train_set is None:
        raise UserError(f"no MDS train split: expected train/{INDEX_NAME} under {mds_roots(cfg)} "
                        f"(to_mds.py --out ROOT writes ROOT/train)")
    check_sample_length(train_set, cfg.block_size, f"MDS {mds_roots(cfg)}")
    if train_set.epoch_size < cfg.global_batch_size:  # Streaming would then yield no batch at all (or hang)
        raise UserError(f"the MDS train split of {mds_roots(cfg)} has {train_set.epoch_size} samples of "
                        f"{cfg.block_size} tokens, fewer than one global batch ({cfg.global_batch_size}): lower "
                        "--global_batch_size or use more data")
    collate = functools.partial(collate_mds, vocab_size=cfg.vocab_size)
    train = DataLoader(train_set, batch_size=per_rank, collate_fn=collate, drop_last=True, **loader_args)
    val_set = mds_split(cfg, "val", eval_bs, shuffle=False)
    if val_set is None:
        return train, None
    if not cfg.data_mix:
        return train, DataLoader(val_set, batch_size=eval_bs, collate_fn=collate, **loader_args)
    # a mix: its val samples read by index (StreamingDataset is map-style too), drawn across every root's val/
    val_set = mixed_eval_subset(val_set, val_set.num_samples, cfg)
    sampler = dist.get_sampler(val_set, shuffle=False, drop_last=False)
    return train, DataLoader(val_set, batch_size=eval_bs, sampler=sampler, collate_fn=collate, **loader_args)


def build_dataloaders(cfg, world_size: int, rank: int, pin_memory: bool):
    """(train DataSpec, val DataSpec or None) for this rank, from a TrainConfig's data and batch settings."""
    loader_args = dict(num_workers=cfg.num_workers, pin_memory=pin_memory, persistent_workers=cfg.num_workers > 0)
    if data_format_of(cfg) == "bin":
        train, val = bin_loaders(cfg, world_size, rank, loader_args)
    else:
        train, val = mds_loaders(cfg, world_size, loader_args)
    return data_spec(train), (data_spec(val) if val is not None else None)


def mix_shares(cfg, train_set) -> dict[str, dict]:
    """The realised share of each data_mix component in one epoch of the train dataset built for it ({} without a
    mix): a MixedBins' counts, or the samples Streaming chose per stream (Stream.choose, after its weighting)."""
    if not cfg.data_mix:
        return {}
    if isinstance(train_set, MixedBins):
        return realised_shares(cfg.data_mix, train_set.order.counts.tolist(), train_set.order.sizes.tolist())
    return realised_shares(cfg.data_mix, [int(s.choose) for s in train_set.streams],
                           [int(n) for n in train_set.samples_per_stream])


def data_spec(loader):
    """A Composer DataSpec that counts a batch's samples and tokens from its x."""
    from composer.core import DataSpec

    return DataSpec(loader, get_num_tokens_in_batch=lambda b: int(b["x"].numel()),
                    get_num_samples_in_batch=lambda b: int(b["x"].shape[0]))


def eval_subset(val_set, cfg):
    """The samples an evaluation reads from a .bin val split: the first eval_subset_num_batches x eval batch size
    (all with -1), whatever the number of processes, which split them (DistributedSampler; Composer drops its
    padding from the metrics): the val loss of given weights does not depend on the process count."""
    from torch.utils.data import Subset

    if cfg.eval_subset_num_batches < 0:
        return val_set
    return Subset(val_set, range(min(len(val_set), cfg.eval_subset_num_batches * eval_batch_size(cfg))))


def eval_batches_per_rank(cfg, spec, world_size: int) -> int:
    """The Evaluator's subset_num_batches for an eval set's DataSpec: -1 for a .bin split (eval_subset has cut it to
    the global amount already); for MDS, the global eval_subset_num_batches split over the ranks (rounded up), which
    keeps the number of samples but not which ones: Streaming partitions them by rank."""
    from torch.utils.data import Subset

    if cfg.eval_subset_num_batches < 0 or isinstance(spec.dataloader.dataset, Subset):
        return -1
    return -(-cfg.eval_subset_num_batches // world_size)


def eval_batch_size(cfg) -> int:
    mb = cfg.device_train_microbatch_size
    return cfg.device_eval_batch_size or (mb if isinstance(mb, int) else 8)


def read_meta(data_dir: str, vocab_size: int, rank: int) -> Meta:
    """meta.json of a .bin folder (a nanoGPT folder without one: GPT-2 uint16), checked against the model's vocab."""
    if (Path(data_dir) / META_NAME).is_file():
        meta = Meta.read(data_dir)
    else:
        meta = nanogpt_meta(data_dir)
        if rank == 0:
            print(f"note: {data_dir} has no {META_NAME}: reading its .bin files as nanoGPT's (uint16 GPT-2 "
                  f"tokens, vocab {meta.vocab_size})", flush=True)
    if meta.vocab_size > vocab_size:
        raise UserError(f"{data_dir} uses a vocabulary of {meta.vocab_size} tokens but vocab_size is "
                        f"{vocab_size}: pass --vocab_size={meta.vocab_size}")
    return meta


def data_tokenizer(cfg) -> str:
    """The tokenizer the training data was made with (meta.json, or to_mds.json for MDS); "gpt2" when unrecorded."""
    if data_format_of(cfg) == "bin":
        return read_meta(bin_roots(cfg)[0], cfg.vocab_size, rank=-1).tokenizer
    made = read_split_file(mds_roots(cfg)[0], "train", TO_MDS_META)
    return (json.loads(made).get("tokenizer") if made else None) or "gpt2"


def build_eval_loader(cfg, location: str, world_size: int, rank: int, pin_memory: bool, required: bool = True,
                      label: str = "eval"):
    """The val split of another dataset (a prepare_data folder, or an MDS root, local or s3://) as a DataSpec:
    train.py's named evaluation sets (eval_data, and each data_mix root's), read as train.py reads its own val split.
    Without one: a UserError, or None when not `required`. An MDS set is cached in a folder of its own (`label`'s)."""
    from composer.utils import dist
    from torch.utils.data import DataLoader

    local = not storage.is_remote(location)
    other = dataclasses.replace(cfg, data_dir=location if local else None, data_remote=None if local else location,
                                data_format="auto", data_mix={})
    loader_args = dict(num_workers=cfg.num_workers, pin_memory=pin_memory, persistent_workers=cfg.num_workers > 0)
    eval_bs = eval_batch_size(cfg)
    if local and detect_format(location, "auto") == "bin":
        val_set = bin_split(location, read_meta(location, cfg.vocab_size, rank), "val", cfg.block_size,
                            None if required else False)  # a data_mix root's: bin_val_set gave the note
        val_set = None if val_set is None else eval_subset(val_set, cfg)
        how = dict(sampler=None if val_set is None else dist.get_sampler(val_set, shuffle=False, drop_last=False))
    else:
        val_set = mds_split(other, "val", eval_bs, shuffle=False, role=label)
        how = dict(collate_fn=functools.partial(collate_mds, vocab_size=cfg.vocab_size))
    if val_set is None and not required:
        return None
    if val_set is None:
        raise UserError(f"eval_data: {location} has no val split (val.bin from prepare_data.py, or val/ from "
                        "to_mds.py): make one, or drop it from eval_data")
    return data_spec(DataLoader(val_set, batch_size=eval_bs, **how, **loader_args))
