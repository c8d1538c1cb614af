"""Putting a complete MDS dataset in place, locally or on S3, so that no reader ever sees a partial one: a local
dataset is written under OUT.tmp-<pid> and renamed into place, an S3 one uploaded with every index.json last;
an old dataset is replaced only once the new one is complete. Details: docs/mds-and-s3.md."""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
from pathlib import Path

from pilegpt.common import UserError, fsync, pid_alive
from pilegpt.data import INDEX_NAME, SPLITS, TO_MDS_META
from pilegpt.mds import s3_upload
from pilegpt.s3 import S3Dir

log = logging.getLogger("to_mds")  # the command these messages come from

# ----------------------------------------------------------------------------------------------------------
# local


def clean_stale_local(out: Path) -> None:
    """Remove OUT.tmp-<pid> folders of runs that died; put back an OUT.old-<pid> a dead run had moved aside."""
    if not out.parent.is_dir():
        return
    for p in sorted(out.parent.glob(f"{out.name}.old-*")) + sorted(out.parent.glob(f"{out.name}.tmp-*")):
        pid = p.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        if p.name.startswith(f"{out.name}.old-") and not out.exists():
            os.rename(p, out)  # killed between moving the old dataset aside and renaming the new one in
            log.warning("restored %s from %s left by an interrupted run", out, p)
        else:
            shutil.rmtree(p, ignore_errors=True)


def is_dataset_dir(path: Path) -> bool:
    """True for a folder to_mds.py (or any MDS writer) produced: index.json in it, in its split folders, or in
    its components' split folders (to_mds.py on a prepare_data --by-subset folder)."""
    return (path / INDEX_NAME).is_file() or (path / TO_MDS_META).is_file() or any(
        (path / s / INDEX_NAME).is_file() for s in SPLITS) or any(
        (path / c / s / INDEX_NAME).is_file() for c in os.listdir(path) if (path / c).is_dir() for s in SPLITS)


def local_exists(out: Path) -> bool:
    """Whether OUT holds something that --overwrite would replace (an empty folder does not count)."""
    if out.is_file():
        raise UserError(f"--out {out} is a file; give a folder path")
    return out.is_dir() and any(out.iterdir())


def fsync_tree(root: Path) -> None:
    """Flush the files under `root` to disk, so a rename never publishes empty files after a crash."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fsync(os.path.join(dirpath, name))
        fsync(dirpath)


def publish_local(staging: Path, out: Path, overwrite: bool) -> None:
    """Rename the complete dataset `staging` to `out`; an old one there is moved aside, then deleted."""
    fsync_tree(staging)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if out.exists():
        if not overwrite:  # another run published meanwhile
            raise UserError(f"{out} appeared while converting; pass --overwrite to replace it")
        old = out.with_name(f"{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(staging, out)
        shutil.rmtree(old)
    else:
        os.rename(staging, out)


# ----------------------------------------------------------------------------------------------------------
# S3


def names_below(names: list[str], sub: str) -> set[str]:
    """The names in `names` that lie in folder `sub`, relative to it ("" = all of them)."""
    return {n[len(sub) + 1:] for n in names if n.startswith(sub + "/")} if sub else set(names)


def remove_stale_shards(target: S3Dir, keep: set[str]) -> None:
    """Delete shard files under `target` that its index does not list (left by an interrupted run)."""
    stale = [n for n in target.names() if "/" not in n and n.startswith("shard.") and n not in keep]
    if stale:
        target.delete(stale)


def withdraw(target: S3Dir, names: list[str]) -> None:
    """Delete these objects under `target`, every index.json first: no reader finds a dataset missing shards."""
    target.delete([n for n in names if posixpath.basename(n) == INDEX_NAME])
    target.delete([n for n in names if posixpath.basename(n) != INDEX_NAME])


def promote_remote(staging: S3Dir, final: S3Dir) -> None:
    """Replace the dataset at `final` with the complete one at `staging` (server-side copies).

    The old index.json goes first, so no reader ever pairs an index with shards of another dataset; the new
    index.json comes last, once every file it names is in place.
    """
    names = [n for n in staging.names() if "/" not in n]
    final.delete([INDEX_NAME])
    for name in names:
        if name != INDEX_NAME:
            final.copy_from(staging, name)
    final.copy_from(staging, INDEX_NAME)
    remove_stale_shards(final, set(names))
    staging.delete(names)


def publish_remote(staging: Path, remote: S3Dir, subs: list[str], replace: bool) -> str:
    """Upload the complete dataset(s) in `staging` (one per subfolder in `subs`, "" = staging itself) to `remote`,
    index.json last; return the upload's summary.

    With `replace` (a dataset is there already) the new one goes to <remote>.tmp-<pid> first and is then swapped
    in, so the old one stays whole until the new one is complete on S3. A failure removes what was uploaded.
    """
    pid = os.getpid()
    target = remote
    if replace:
        stage_url = f"{remote.url}.tmp-{pid}" if remote.prefix else f"{remote.url}/to_mds.tmp-{pid}"
        target = S3Dir(stage_url, remote.client)
    names = [f.rel for f in s3_upload.collect_files(staging).files]
    try:
        result = s3_upload.upload_folder(staging, target.url, client=remote.client)
        if replace:
            for sub in subs:
                promote_remote(target.child(sub), remote.child(sub))
        else:
            for sub in subs:  # shards a killed run left beside the new dataset
                remove_stale_shards(remote.child(sub), names_below(names, sub))
    except BaseException as e:
        try:  # all splits or none
            withdraw(target, target.names() if replace else names)
        except Exception as cleanup_error:  # best effort: the index went first, so no broken dataset is visible
            log.warning("could not remove the partial upload from %s: %s", target.url, cleanup_error)
        if isinstance(e, UserError):
            raise UserError(f"{e}; nothing was published") from None
        raise
    line = s3_upload.summary(result, target.url)
    return f"{line}; moved into place at {remote.url}" if replace else line
