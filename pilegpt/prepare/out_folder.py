"""prepare_data's output folder while a run fills it: until the run finishes it holds only train.bin.partial /
val.bin.partial and the state that lets the run resume (files done, the position in the current file, the counts,
a fingerprint of everything that decides the output bytes); publishing renames them to train.bin / val.bin and
writes meta.json last. Every step can be repeated, so a run killed anywhere completes when run again.
Details: docs/prepare.md."""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np

from pilegpt.common import UserError, atomic_write_text, one_line
from pilegpt.data import META_NAME, META_VERSION, SUBSETS_NAME, Meta
from pilegpt.prepare.sources import SourceFile

STATE_NAME = ".prepare_state.json"  # progress of an unfinished run; removed when the run finishes
STATE_VERSION = 2  # of the state file: a state of another version is not resumed
COMMIT_SECONDS = 1.0  # record progress (after an fsync of the outputs) at most this often
PARTIAL = {"train": "train.bin.partial", "val": "val.bin.partial"}  # the outputs while the run is unfinished
OUR_FILES = {STATE_NAME, *PARTIAL.values()}
# common.atomic_path's temporary names for the state and meta.json, left behind only by a kill -9
TEMP_NAME = re.compile(r"\.(?:%s)\.tmp\d+" % "|".join(map(re.escape, (STATE_NAME, META_NAME, SUBSETS_NAME))))
COUNTERS = ("tokens", "documents", "bad_lines", "filtered", "empty")  # the counts a state records
OUTPUT_FIXES = {
    errno.ENOSPC: "free space on that disk",
    errno.EDQUOT: "free space within your disk quota",
    errno.EFBIG: "raise the file size limit (ulimit -f) or use a filesystem that allows larger files",
    errno.EROFS: "choose an --out-dir on a writable filesystem",
    errno.EACCES: "choose an --out-dir you can write to",
    errno.EPERM: "choose an --out-dir you can write to",
}


class OutputError(UserError):
    """Writing the output failed (a full disk, a read-only folder): names --out-dir and the cause, not the input."""


@contextmanager
def output_errors(out_dir: Path, doing: str):
    """Turn a filesystem error while writing the output into a one-line OutputError naming the real cause."""
    try:
        yield
    except OSError as e:
        code = errno.errorcode.get(e.errno, "")
        fix = OUTPUT_FIXES.get(e.errno, "check that folder")
        raise OutputError(f"--out-dir {out_dir}: {e.strerror or one_line(e)}{f' ({code})' if code else ''} while "
                          f"{doing}; {fix}") from None


# ----------------------------------------------------------------------------------------------------
# the output folder: fresh, resumed, or refused


def state_fingerprint(files: list[SourceFile], settings: dict, max_tokens: Optional[int]) -> dict:
    """Everything that decides the output bytes (file sizes apart, see size_change); a resumed run must
    match it."""
    return {
        "state": STATE_VERSION,
        "version": META_VERSION,
        "files": [[f.name, f.split, f.kind] + ([f.url] if f.kind == "rows" else []) for f in files],
        "settings": {k: v for k, v in settings.items() if not k.startswith("_")},
        "max_tokens": max_tokens,
    }


def fingerprint_change(saved: dict, fingerprint: dict) -> Optional[str]:
    """What differs between a saved run's fingerprint and this one, or None when this run may resume it."""
    saved = copy.deepcopy(saved)
    if fingerprint["settings"].get("skip_bad_lines") and isinstance(saved.get("settings"), dict) \
            and saved["settings"].get("skip_bad_lines") is False:
        saved["settings"]["skip_bad_lines"] = True  # a run that never skipped a line read every line the same
    if saved == fingerprint:
        return None
    if saved.get("state") != fingerprint["state"] or saved.get("version") != fingerprint["version"]:
        return "from another version of prepare_data"
    if saved.get("files") != fingerprint["files"]:
        return "with other input files"
    if saved.get("max_tokens") != fingerprint["max_tokens"]:
        return f"with --max-tokens {saved.get('max_tokens')}"
    return "with other settings"


def size_change(state: dict, files: list[SourceFile]) -> Optional[str]:
    """A file the saved run read completely that changed size since (its tokens would be stale), or None."""
    for f, old in zip(files[:state["files_done"]], state["sizes"]):
        if f.size != old:
            return f"{f.name} changed since it was read ({old} -> {f.size} bytes)"
    return None


def resume_progress(state: dict, files: list[SourceFile]) -> dict:
    """The saved progress; a file changed since it was partly read is read again from its start."""
    progress = {k: v for k, v in state.items() if k not in ("fingerprint", "sizes")}
    i = progress["files_done"]
    if i < len(files) and progress["position"][0] and files[i].size != state["sizes"][i]:
        print(f"note: {files[i].name} changed since the interrupted run read part of it; reading it again from "
              "its start", file=sys.stderr)
        progress.update(copy.deepcopy(progress["file_start"]), position=[0, 1])
    return progress


def fresh_progress(by_subset: bool = False) -> dict:
    zero = {"tokens": {"train": 0, "val": 0}, "documents": {"train": 0, "val": 0}, "bad_lines": 0, "filtered": 0,
            "empty": 0, **({"subsets": {}} if by_subset else {})}
    return {"files_done": 0, "position": [0, 1], **copy.deepcopy(zero), "file_start": zero}


def read_state(out_dir: Path, overwrite: bool) -> Optional[dict]:
    """The saved state of an unfinished run, or None; a damaged one is an error (ignored with --overwrite)."""
    path = out_dir / STATE_NAME
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or not isinstance(state.get("fingerprint"), dict):
            raise ValueError("not a state record")
        return state
    except (ValueError, OSError) as e:
        if overwrite:
            return None
        raise UserError(f"--out-dir {out_dir}: cannot read {STATE_NAME} ({one_line(e)}); pass --overwrite to "
                        "start over") from None


def check_out_dir(out_dir: Path, fingerprint: dict, files: list[SourceFile], overwrite: bool,
                  by_subset: bool = False) -> Optional[dict]:
    """Return the saved state to resume, or None for a fresh run. Refuse a folder that holds other data. With
    `by_subset`, the folders beside this command's own state are its components.

    The saved state is checked first: it is this command's own, whatever else the folder holds (an
    interrupted --overwrite run sits beside the dataset it replaces, an interrupted publish beside half the
    renamed files).
    """
    if not out_dir.exists():
        for parent in out_dir.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise UserError(f"--out-dir {out_dir}: {parent} is a file, not a folder; choose another --out-dir")
                break
        return None
    if not out_dir.is_dir():
        raise UserError(f"--out-dir {out_dir} is a file; choose a folder")
    try:
        entries = {p.name for p in out_dir.iterdir()}
    except OSError as e:
        raise UserError(f"--out-dir {out_dir}: cannot list it ({e.strerror}); choose another --out-dir") from None
    others = {n for n in entries - OUR_FILES if not TEMP_NAME.fullmatch(n)}
    state = read_state(out_dir, overwrite)
    if state is not None:
        change = fingerprint_change(state["fingerprint"], fingerprint) or size_change(state, files)
        if by_subset:
            others = {n for n in others if not (out_dir / n).is_dir()}
        if change is None:
            if state.get("publish") or not others or overwrite:
                return state
            raise UserError(f"--out-dir {out_dir} holds a finished dataset and an unfinished --overwrite run of "
                            "this command; pass --overwrite to resume it")
        if not overwrite:
            raise UserError(f"--out-dir {out_dir} holds an unfinished run {change}; re-run that command to resume "
                            "it, or pass --overwrite to start over")
        return None
    if others and not overwrite:
        what = "a finished dataset" if others & {META_NAME, SUBSETS_NAME} else "other files"
        raise UserError(f"--out-dir {out_dir} already holds {what}; pass --overwrite to replace it "
                        "or choose another folder")
    return None


def make_out_dir(out_dir: Path, fresh: bool) -> None:
    """Create the folder. A fresh run first removes an old unfinished run's files (its state first: a kill in
    between leaves files that are plainly this run's own), and any temporary file a kill -9 left behind."""
    with output_errors(out_dir, "creating the folder"):
        out_dir.mkdir(parents=True, exist_ok=True)
        stale = [STATE_NAME, *PARTIAL.values()] if fresh else []
        for name in stale + [n for n in os.listdir(out_dir) if TEMP_NAME.fullmatch(n)]:
            (out_dir / name).unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------
# writing tokens and recording progress


class Writer:
    """Appends tokens to train.bin.partial / val.bin.partial and records progress that a re-run resumes. Three
    copies of the progress: `pending` (every token written), `done` (at the last document boundary a resumed run
    can read on from) and `committed` (on disk). A commit makes the files durable first and only then records
    `done`, so the state never claims more than the files hold; a resumed run truncates the files to it."""
    counters = COUNTERS  # the counts a file's start records (file_start), for a file read again from its start

    def __init__(self, out_dir: Path, fingerprint: dict, sizes: list, progress: dict, dtype: np.dtype):
        self.out_dir, self.fingerprint, self.sizes, self.dtype = out_dir, fingerprint, sizes, dtype
        self.done, self.fds = progress, {}
        self.subsets_filtered: Counter = Counter()  # this run's filtered documents by subset, for the empty-corpus line
        try:
            with output_errors(out_dir, "opening the .partial files"):
                for split, name in PARTIAL.items():
                    self.fds[split] = os.open(out_dir / name, os.O_RDWR | os.O_CREAT, 0o644)
                    if os.fstat(self.fds[split]).st_size < progress["tokens"][split] * dtype.itemsize:
                        raise UserError(f"--out-dir {out_dir}: {name} is shorter than {STATE_NAME} records (the "
                                        "files were changed by hand?); pass --overwrite to start over")
                self.rollback()
            self.commit()  # a state from the start: a run killed in its first file is recognized and resumed
        except BaseException:
            self.close()
            raise

    def write(self, result: dict, max_train: Optional[int]) -> bool:
        """Append one task's tokens; return True when --max-tokens is reached."""
        p = self.pending
        reached = False
        for split in ("train", "val"):
            arr = result[split]
            if split == "train" and max_train is not None and p["tokens"]["train"] + len(arr) >= max_train:
                arr = arr[: max_train - p["tokens"]["train"]]
                reached = True
            with output_errors(self.out_dir, f"writing {PARTIAL[split]}"):
                view = memoryview(arr).cast("B")
                while view:  # os.write may write less than asked (a disk filling up)
                    view = view[os.write(self.fds[split], view):]
            p["tokens"][split] += len(arr)
            p["documents"][split] += result["docs"][split]
        for key in ("bad", "filtered", "empty"):
            p["bad_lines" if key == "bad" else key] += result[key]
        self.subsets_filtered.update(result.get("subsets_filtered", {}))
        return reached

    def mark(self, resume_at: tuple) -> None:
        """Everything up to resume_at = (offset, line) of the current file is written."""
        self.pending["position"] = list(resume_at)
        self.done = copy.deepcopy(self.pending)
        self.commit_if_due()

    def file_done(self) -> None:
        p = self.pending
        p["files_done"] += 1
        p["position"] = [0, 1]
        p["file_start"] = {k: copy.deepcopy(p[k]) for k in self.counters}
        self.done = copy.deepcopy(p)
        self.commit_if_due()

    def commit_if_due(self) -> None:
        if time.monotonic() - self.last_commit >= COMMIT_SECONDS:
            self.commit()

    def commit(self) -> None:
        with output_errors(self.out_dir, "writing train.bin.partial / val.bin.partial"):
            for fd in self.fds.values():
                os.fsync(fd)
        state = {"fingerprint": self.fingerprint, "sizes": self.sizes, **self.done}
        with output_errors(self.out_dir, f"writing {STATE_NAME}"):
            atomic_write_text(self.out_dir / STATE_NAME, json.dumps(state))
        self.committed = copy.deepcopy(self.done)
        self.last_commit = time.monotonic()

    def save_progress(self) -> None:
        """After an error: record `done` if it is ahead of the last commit (the disk may refuse: then the last
        commit stands, which is consistent too)."""
        if self.done != self.committed:
            try:
                self.commit()
            except OutputError:
                pass

    def rollback(self) -> None:
        """Back to `done` (at start, or when reading a file failed midway through a text document)."""
        self.pending = copy.deepcopy(self.done)
        for split, fd in self.fds.items():
            os.ftruncate(fd, self.done["tokens"][split] * self.dtype.itemsize)
            os.lseek(fd, 0, os.SEEK_END)

    def finish(self, meta: Meta) -> dict:
        """Record the finished run (its meta.json included) so that publish can complete even after a kill."""
        self.done = copy.deepcopy(self.pending)
        self.done["publish"] = meta.to_json()
        self.commit()
        self.close()
        return self.done

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = {}


def publish(out_dir: Path, state: dict) -> None:
    """The .partial files become train.bin / val.bin, then meta.json (the mark of a finished set). Each step can
    be repeated, so a run killed halfway through completes when run again."""
    with output_errors(out_dir, "publishing the finished dataset"):
        place(out_dir, state["tokens"], state["publish"])
        (out_dir / STATE_NAME).unlink()


def place(folder: Path, tokens: dict, meta_text: str) -> None:
    """In one prepared folder: the .partial files of the splits with tokens become train.bin / val.bin (the other
    splits' files are removed), then meta.json is written. Repeatable."""
    (folder / META_NAME).unlink(missing_ok=True)  # an old finished set (with --overwrite) is no longer one
    for split, name in PARTIAL.items():
        if tokens[split]:
            if (folder / name).exists():
                os.replace(folder / name, folder / f"{split}.bin")
        else:
            (folder / name).unlink(missing_ok=True)
            (folder / f"{split}.bin").unlink(missing_ok=True)
    atomic_write_text(folder / META_NAME, meta_text)


def discard(out_dir: Path, created: bool) -> None:
    """Remove this run's own unfinished files, those of its component folders (--by-subset) and the folders it
    emptied so (and --out-dir if this run made it)."""
    try:
        for p in out_dir.iterdir():
            if p.name in OUR_FILES or TEMP_NAME.fullmatch(p.name):
                p.unlink(missing_ok=True)
            elif p.is_dir() and not p.is_symlink() and any((p / name).exists() for name in PARTIAL.values()):
                for name in PARTIAL.values():
                    (p / name).unlink(missing_ok=True)
                if not any(p.iterdir()):
                    p.rmdir()
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()
    except OSError:
        pass
