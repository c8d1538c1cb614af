"""The run folder's pre-flight: where the run's files go, its lock, checkpoint repairs, the refusals, the data record.

    folder = prepare(cfg, world, device, held)   # before the model exists; every refusal is one line
See docs/robustness.md for what each check guards against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import NamedTuple, Optional

import torch
from composer.utils import dist

from pilegpt import compat, storage
from pilegpt.checkpoint import existing_checkpoints
from pilegpt.common import UserError, atomic_write_text, check_writable_folder
from pilegpt.removed import drop_removed
from pilegpt.s3 import S3Dir
from pilegpt.train.config import (
    GPT_ONLY_FIELDS,
    INIT_ONLY,
    ON_RESUME,
    PART_GROUP,
    REFUSED,
    TrainConfig,
    saved_form,
    setting_default,
)
from pilegpt.train.data.loaders import refresh_mds_cache
from pilegpt.train.run import cluster, data_record, lock
from pilegpt.train.run.resume import set_aside_broken_checkpoints

CONFIG_JSON = "config.json"  # in run_dir: the run's settings, versions and commit (train.py writes it)
STAGED_FOR = ".save_folder"  # in an s3:// run's local run_dir: the save_folder whose files it stages


class RunFolder(NamedTuple):
    """What the steps after the pre-flight need to know of the run's folders."""
    cfg: TrainConfig  # the run's config (MDS: num_canonical_nodes fixed, see data_record.canonical_nodes)
    save_folder: str  # the checkpoints (local or s3://)
    run_dir: str  # config.json, model.pt, metrics and logs: save_folder, or runs/{run_name} uploaded beside it
    remote: Optional[S3Dir]  # save_folder when it is remote, else None
    found: list[str]  # the checkpoints already in save_folder
    data: dict  # data.json's record of what the run trains on (data_record.py), written as training begins
    made: MadeFolders  # the folders this run made: removed if it stops before training

    @property
    def resuming(self) -> bool:
        """Whether the Trainer's autoresume continues from a checkpoint in save_folder."""
        return bool(self.found) and self.cfg.autoresume

    def remote_name(self, name: str) -> Optional[str]:
        """The object key of a run file when save_folder is remote (its uploads), else None."""
        return self.remote.key(name) if self.remote else None


def prepare(cfg: TrainConfig, world: cluster.World, device: str, held: contextlib.ExitStack) -> RunFolder:
    """Check, lock and repair the run's folders before training; `held` keeps the lock until the run ends."""
    save_folder = cfg.save_folder.format(run_name=cfg.run_name)
    remote = storage.folder(save_folder) if storage.is_remote(save_folder) else None  # an s3.S3Dir
    run_dir = os.path.join("runs", cfg.run_name or "run") if remote else save_folder
    check_writable_folder(run_dir, "save_folder" if run_dir == save_folder else "the run's local folder",
                          "choose another --save_folder or --run_name" if run_dir == save_folder else
                          "run train.py from a folder you can write in")
    made = MadeFolders([run_dir] if remote else [save_folder])  # before anything makes them
    if world.nodes > 1:  # a local save_folder must be one folder every node sees (rank 0 alone writes it), else refused
        cluster.check_shared_save_folder(save_folder, device, world.size, world.local_size)
        held.enter_context(compat.node_signal_files_per_node())  # Composer's waits across nodes (compat.py)
    if world.rank == 0:  # before anything in the folder is read or repaired
        held.push(made)  # on the way out, after the lock is released: a refused run leaves nothing behind
        held.enter_context(lock.hold(save_folder, cfg.run_name))  # a second run into save_folder is refused
        made.owned = True  # (a run refused by the lock removes nothing: the folder is another run's)
        if remote:
            claim_staging_folder(run_dir, save_folder)
    if cfg.autoresume:
        repair_checkpoints(cfg, save_folder, world, device)
    found = existing_checkpoints(save_folder)  # one listing (a request on S3) serves every check below
    if found and not cfg.autoresume and not cfg.save_overwrite:
        raise UserError(f"{save_folder} already holds checkpoints ({found[0]}...): pass --autoresume=True to "
                        "continue that run, --save_overwrite=True to start over, or another --run_name/--save_folder")
    folder = RunFolder(cfg, save_folder, run_dir, remote, found, {}, made)
    if folder.resuming:
        check_same_model(cfg, run_dir, save_folder)
        if world.rank == 0 and (note := other_torch_note(run_dir)):
            print(f"{cfg.run_name}: {note}", flush=True)
        cfg, note = keep_initial_settings(cfg, run_dir)
        if note and world.rank == 0:
            print(note, flush=True)
        folder = folder._replace(cfg=cfg)
    folder = record_data(folder, world)
    if folder.data["format"] == "mds":
        refresh_cache(folder.cfg, world, device)
    return folder


class MadeFolders:
    """The local folders a run makes before it trains (save_folder with its lock, or an s3:// run's runs/{run_name}),
    each named by its first part that did not exist. An exit callback (ExitStack.push): a run refused or stopped
    before training (before `started()`) removes them, so that it leaves nothing behind; a folder that was there
    before the run, and everything in it, is never touched."""

    def __init__(self, folders: list[str]):
        self.folders = list(dict.fromkeys(first_missing(f) for f in folders if first_missing(f)))
        self.owned, self.training = False, False  # owned: this run holds the lock of the folders it made

    def started(self) -> None:
        """Training begins (config.json and data.json are written): from here on the folders are the run's."""
        self.training = True

    def __call__(self, exc_type, exc, tb) -> None:  # None: the exception, if any, goes on
        if exc_type is not None and self.owned and not self.training:
            for made in self.folders:  # unless a run that started since holds it
                if not any(Path(made).rglob(lock.LOCK_NAME)):
                    shutil.rmtree(made, ignore_errors=True)


def first_missing(path: str) -> Optional[str]:
    """The outermost folder of `path` (itself or an ancestor) that does not exist yet, or None when it exists."""
    path = os.path.abspath(path)
    if os.path.lexists(path):
        return None
    while not os.path.lexists(os.path.dirname(path)):
        path = os.path.dirname(path)
    return path


def claim_staging_folder(run_dir: str, save_folder: str) -> None:
    """The local runs/{run_name} of an s3:// run stages that run's files alone: it records whose it is (STAGED_FOR),
    and a run into another save_folder with the same run_name is refused in one line (its metrics and report would
    mix with the other run's)."""
    marker = os.path.join(run_dir, STAGED_FOR)
    owner = Path(marker).read_text().strip() if os.path.isfile(marker) else None
    if owner is not None and owner != save_folder:
        raise UserError(f"{run_dir} holds the local files of the run in {owner} (same run_name): choose another "
                        f"--run_name for {save_folder}, or move {run_dir} away")
    if owner is None:
        os.makedirs(run_dir, exist_ok=True)
        atomic_write_text(marker, save_folder + "\n")


def barrier(world: cluster.World, device: str) -> None:
    """Every rank waits here for the others (nothing to wait for in a one-process run)."""
    if world.size > 1:
        dist.initialize_dist(device)
        dist.barrier()


def repair_checkpoints(cfg: TrainConfig, save_folder: str, world: cluster.World, device: str) -> None:
    """A kill during a checkpoint write leaves a truncated file that autoresume trips over: rank 0 sets it aside
    (resume.py) and the other ranks wait for that before anyone reads a checkpoint."""
    if world.rank == 0 and (note := set_aside_broken_checkpoints(save_folder)):
        print(f"{cfg.run_name}: {note}", flush=True)
    barrier(world, device)


def check_same_model(cfg: TrainConfig, run_dir: str, save_folder: str) -> None:
    """Autoresume loads the checkpoint into this config's model and optimizer: refuse, in one line, each setting that
    config.ON_RESUME marks refused (another model, optimizer or seed) or, for a part's rate, set or unset, when it
    differs from the run's config.json (Composer itself fails with a KeyError deep in the load, or loads AdamW's
    learning rates into Muon's groups)."""
    path = os.path.join(run_dir, CONFIG_JSON)
    if not os.path.isfile(path):
        return
    saved = saved_config(path)
    fix = f"resume with the run's settings ({path}) or start a new run with another --run_name"
    if (optimizer := recorded(saved, "optimizer")) != cfg.optimizer:
        raise UserError(f"autoresume: the checkpoints in {save_folder} are of optimizer {optimizer}; this run asks "
                        f"for {cfg.optimizer}: {fix}")
    by_rule: dict[str, list[str]] = {}  # "another model" -> ["n_layer=3 (the run has 2)", ...]
    for k in compared(saved, REFUSED):
        if saved_form(recorded(saved, k)) != saved_form(getattr(cfg, k)):  # (64,) went in as [64]
            by_rule.setdefault(ON_RESUME[k][1], []).append(f"{k}={getattr(cfg, k)!r} (the run has "
                                                           f"{recorded(saved, k)!r})")
    # a part's own rate is a parameter group of its own in the checkpoints, or none: set or unset, it cannot load
    toggled = [f"{k}={getattr(cfg, k)!r} (the run has {recorded(saved, k)!r})" for k in compared(saved, PART_GROUP)
               if bool(recorded(saved, k)) != bool(getattr(cfg, k))]
    problems = [f"are of {rule}: {', '.join(changed)}" for rule, changed in by_rule.items()]
    problems += [f"have another optimizer layout: {', '.join(toggled)} (a part's rate set or unset adds or drops a "
                 "parameter group; only a change between rates resumes)"] if toggled else []
    if problems:
        raise UserError(f"autoresume: the checkpoints in {save_folder} {'; and '.join(problems)}; {fix}")


def compared(saved: dict, kind: str) -> list[str]:
    """The settings of one kind of config.ON_RESUME that a resume compares with the run's config.json: a key it lacks
    is a setting added since the run began (it ran with the default), or, in a run of a model_class, one of the GPT's
    own, which shape nothing of it (used_settings leaves them out)."""
    return [k for k, (rule_kind, _) in ON_RESUME.items() if rule_kind == kind and k != "optimizer"
            and (k in saved or not (saved.get("model_class") and k in GPT_ONLY_FIELDS))]


def keep_initial_settings(cfg: TrainConfig, run_dir: str) -> tuple[TrainConfig, Optional[str]]:
    """The settings config.ON_RESUME marks init-only act only when a run starts (a resume's weights come from its
    checkpoint): changed on autoresume, the run keeps the value it started with, in config.json too, and a note says
    so. Returns the config and the note (None when nothing changed or there is no config.json)."""
    path = os.path.join(run_dir, CONFIG_JSON)
    if not os.path.isfile(path):
        return cfg, None
    saved = saved_config(path)
    kept = {k: recorded(saved, k) for k in compared(saved, INIT_ONLY)
            if saved_form(recorded(saved, k)) != saved_form(getattr(cfg, k))}
    if not kept:
        return cfg, None
    asked = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in kept)
    try:
        cfg = dataclasses.replace(cfg, **kept)
    except (ValueError, TypeError) as e:
        raise UserError(f"{path} records {kept} ({e}): restore it from a copy") from None
    return cfg, (f"note: autoresume: {asked} act{'s' if len(kept) == 1 else ''} only when a run starts (the weights "
                 f"come from the checkpoint): the run keeps {', '.join(f'{k}={v!r}' for k, v in kept.items())}, as "
                 f"it started ({path})")


def torch_history(run_dir: str) -> list[str]:
    """The torch versions a run has trained on so far, oldest first, as its config.json records them ("torch_earlier",
    then "torch"); [] without a readable record (check_same_model refuses a damaged one before any resume)."""
    try:
        info = json.loads(Path(run_dir, CONFIG_JSON).read_text())
        earlier = info.get("torch_earlier", [])
        versions = [*(earlier if isinstance(earlier, list) else []), info.get("torch")]
    except (OSError, ValueError, AttributeError):
        return []
    return [v for v in versions if isinstance(v, str)]


def other_torch_note(run_dir: str) -> Optional[str]:
    """One line when a run resumes on another torch than the one it last trained on; it is not refused: the
    checkpoint loads, but kernels (and so the numerics) may differ from a run on one torch."""
    history = torch_history(run_dir)
    if not history or history[-1] == torch.__version__:
        return None
    return (f"resuming on torch {torch.__version__}; the run trained so far on torch {history[-1]} "
            f"({os.path.join(run_dir, CONFIG_JSON)}): it goes on, but the numerics may differ from a run on one torch")


def recorded(saved: dict, name: str) -> object:
    """A setting as a run's config.json records it; one it lacks (added to TrainConfig since) as its default."""
    return saved[name] if name in saved else setting_default(name)


def saved_config(path: str) -> dict:
    """The settings a run's config.json records (a removed one at its default left out); a damaged file, or a removed
    setting on, is one line."""
    try:
        saved = json.loads(Path(path).read_text()).get("config")
    except (ValueError, AttributeError):
        saved = None
    if not isinstance(saved, dict):
        raise UserError(f"{path} is damaged (not train.py's record of the run): restore it from a copy, or move it "
                        "away to resume without comparing the run's settings")
    return drop_removed(saved, path, "the run has {name}={value!r}; resume it with")


def check_optimizer_state(checkpoint: object, optimizer: torch.optim.Optimizer, name: str) -> object:
    """A checkpoint autoresume reads must hold the state of this run's optimizer: Composer only warns that it is
    missing and trains on with a fresh one in the checkpoint's schedule (a backstop for a run without config.json,
    e.g. an s3:// run resumed on another machine). Returns the checkpoint."""
    state = checkpoint.get("state") if isinstance(checkpoint, dict) else None
    saved = state.get("optimizers") if isinstance(state, dict) else None
    ours = type(optimizer).__qualname__
    if isinstance(saved, dict) and saved and ours not in saved:
        raise UserError(f"autoresume: the checkpoint {name} is of optimizer {optimizer_setting(next(iter(saved)))}; "
                        f"this run asks for {optimizer_setting(ours)}: resume with the run's --optimizer or start a "
                        "new run with another --run_name")
    return checkpoint


def optimizer_setting(class_name: str) -> str:
    """The optimizer setting that makes an optimizer class (train.py's AdamW or Muon), else the class name."""
    return {"AdamW": "adamw", "Muon": "muon"}.get(class_name, class_name)


def record_data(folder: RunFolder, world: cluster.World) -> RunFolder:
    """Compare the data with the run's data.json when resuming (data_record.py), and describe it for the data.json
    written as training begins (train.py), so that a run refused before then writes none. Returns the folder with the
    record and the config (MDS: num_canonical_nodes fixed, so that the sample order is the run's on any number of
    nodes)."""
    cfg, save_folder = folder.cfg, folder.save_folder
    data = data_record.describe(cfg)  # what the run trains on (MDS: every index read, its shard names checked)
    note = data_record.check_resume(data, save_folder, cfg.data_changed_ok) if folder.resuming else None
    if data["format"] == "mds":
        cfg = dataclasses.replace(cfg, num_canonical_nodes=data_record.canonical_nodes(
            cfg, save_folder if folder.resuming else None, world.nodes))
        data["num_canonical_nodes"] = cfg.num_canonical_nodes
    if note and world.rank == 0:
        print(note, flush=True)
    return folder._replace(cfg=cfg, data=data)


def refresh_cache(cfg: TrainConfig, world: cluster.World, device: str) -> None:
    """A cache of an older version of the MDS data is emptied (by each node's first process) before Streaming
    reads it; the other ranks wait for that."""
    if world.local_rank == 0:
        for cache in refresh_mds_cache(cfg):
            print(f"note: {cache} held shards of an older version of the data: emptied, to be read again")
    barrier(world, device)
