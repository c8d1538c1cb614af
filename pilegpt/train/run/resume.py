"""What Composer's autoresume needs of a save_folder (local or s3://) before the Trainer reads it: truncated
checkpoints set aside, the `latest` pointer repaired; on rank 0, before any rank reads (docs/robustness.md).

    note = set_aside_broken_checkpoints("runs/x")    # after a crash: truncated files set aside, `latest` repaired
"""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path
from typing import Optional

from pilegpt import storage
from pilegpt.checkpoint import CHECKPOINT_FILE, LATEST_CHECKPOINT, SHARDED_CHECKPOINT, SHARDED_COMPLETE


def set_aside_broken_checkpoints(save_folder: str) -> Optional[str]:
    """Make a local save_folder safe for Composer's autoresume after a crash; returns a line saying what changed.

    Composer writes checkpoints in place, so a kill during a write leaves a truncated file: autoresume then
    either fails to read it (when latest-rank0.pt points at it) or refuses to overwrite it later. Checkpoint
    files (newest first) are checked until one is whole (every zip record passes its CRC; a sharded checkpoint's
    folder: its .metadata, written once every rank's part is); those that are not are renamed
    `<name>.broken-<time>` (set aside, never deleted), and latest-rank0.pt is pointed at the newest whole one.
    On S3 a checkpoint file is uploaded whole or not at all and a sharded one part by part, its .metadata last, and
    the `latest` pointer after either: see point_latest_at_newest_s3.
    """
    if storage.is_s3(save_folder):
        return point_latest_at_newest_s3(save_folder)
    folder = Path(save_folder)
    if storage.is_remote(save_folder) or not folder.is_dir():
        return None
    by_batch: dict[int, list[Path]] = {}
    for p in folder.iterdir():
        m = CHECKPOINT_FILE.fullmatch(p.name) or (SHARDED_CHECKPOINT.fullmatch(p.name) if p.is_dir() else None)
        if m and not p.is_symlink():
            by_batch.setdefault(int(m["batch"]), []).append(p)
    broken, good = [], None
    for batch in sorted(by_batch, reverse=True):
        whole = [p for p in by_batch[batch] if is_whole_sharded(p) or (p.name.endswith("-rank0.pt")
                                                                         and is_whole_checkpoint(p))]
        if whole:
            good = whole[0]
            break
        broken += by_batch[batch]
    latest = folder / LATEST_CHECKPOINT
    points_at = os.readlink(latest) if latest.is_symlink() else None
    if not broken and (good is None or points_at == good.name):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for p in broken:
        os.rename(p, p.with_name(f"{p.name}.broken-{stamp}"))
    if latest.is_symlink() or latest.exists():
        latest.unlink()  # a symlink (Composer's), re-made below when a whole checkpoint is left
    if good is not None:
        os.symlink(good.name, latest)
    names = ", ".join(p.name for p in broken) or "none"
    return (f"checkpoints set aside as *.broken-{stamp} (truncated or damaged): {names}; "
            + (f"resuming from {good.name}" if good else "no whole checkpoint is left: starting from scratch"))


def point_latest_at_newest_s3(save_folder: str) -> Optional[str]:
    """Point the `latest-rank0.pt.symlink` object of an s3:// save_folder at the newest checkpoint in it.

    Composer's autoresume follows that pointer, which is uploaded after its checkpoint: a run stopped between
    the two (S3 lost, a kill) leaves it missing or at an older checkpoint, and the resumed run would retrain
    from there (or from scratch) and then refuse to overwrite the newer checkpoint. S3 objects appear whole or
    not at all, so the newest one listed is safe to resume from; a sharded checkpoint's folder counts once its
    .metadata is there (uploaded after every rank's part), and one newer than that without it (a run stopped
    mid-upload) is set aside as `<name>.broken-<time>/`, or the resumed run could not save there again. Returns a
    line saying what changed, or None."""

    folder = storage.folder(save_folder)
    names = folder.names()
    by_batch = {int(m["batch"]): n for n in names if (m := CHECKPOINT_FILE.fullmatch(n)) and m["rank"] == "0"}
    parts = sharded_parts(names)
    by_batch.update({batch: name for batch, (name, keys) in parts.items() if SHARDED_COMPLETE in keys})
    newest = by_batch[max(by_batch)] if by_batch else None
    broken = [parts[b] for b in sorted(parts) if b not in by_batch and (newest is None or b > max(by_batch))]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name, keys in broken:
        set_aside_s3(folder, name, keys, f"{name}.broken-{stamp}")
    set_aside = (f"incomplete sharded checkpoints set aside as *.broken-{stamp}/ (the run stopped before its "
                 f".metadata was uploaded): {', '.join(name for name, _ in broken)}; " if broken else "")
    if newest is None:
        return set_aside + "no whole checkpoint is left: starting from scratch" if broken else None
    pointer = f"{LATEST_CHECKPOINT}.symlink"
    current = folder.read(pointer).decode().strip() if pointer in names else None
    if current == folder.key(newest):
        return set_aside + f"resuming from {newest}" if broken else None
    folder.write(pointer, folder.key(newest).encode())
    was = f"at {current.rsplit('/', 1)[-1]}" if current else "missing"
    return (set_aside + f"{pointer} was {was} (the run stopped before uploading it): resuming from {newest}, the "
            "newest checkpoint")


def sharded_parts(names: list[str]) -> dict[int, tuple[str, list[str]]]:
    """batch -> (folder name, the names of its objects) of the sharded checkpoints among a folder's object names."""
    found: dict[int, tuple[str, list[str]]] = {}
    for name in names:
        head, _, tail = name.partition("/")
        if tail and "/" not in tail and (m := SHARDED_CHECKPOINT.fullmatch(head)):
            found.setdefault(int(m["batch"]), (head, []))[1].append(tail)
    return found


def set_aside_s3(folder, name: str, keys: list[str], aside: str) -> None:
    """Move the objects `name`/KEY of an S3 folder to `aside`/KEY (server-side copies, then the originals deleted)."""
    source, target = folder.child(name), folder.child(aside)
    for key in keys:
        target.copy_from(source, key)
    source.delete(keys)


def is_whole_sharded(path: Path) -> bool:
    """Whether a sharded checkpoint's folder is complete: torch.distributed.checkpoint writes its .metadata (by a
    rename) only after every rank has written its part."""
    return path.is_dir() and (path / SHARDED_COMPLETE).is_file()


def is_whole_checkpoint(path: Path) -> bool:
    """Whether a torch.save zip file is complete and undamaged (reads it once; no unpickling)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False
