"""prepare_data --by-subset's output: one prepared folder per component under --out-dir (OUT/<subset_folder(name)>/
train.bin, val.bin, meta.json), all filled in one pass over the input, with one state at OUT that a re-run
resumes from; subsets.json, the index of the components, is written last, so a reader can tell a finished run.
Details: docs/prepare.md#the-pile-by-component."""

from __future__ import annotations

import copy
import errno
import json
import os
import shlex
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np

from pilegpt.common import UserError, atomic_write_text
from pilegpt.data import SUBSETS_NAME, SUBSETS_VERSION, read_subsets, subset_folder, subset_folder_note
from pilegpt.prepare import out_folder
from pilegpt.prepare.out_folder import PARTIAL, STATE_NAME, Writer, output_errors

SPLITS = tuple(PARTIAL)  # "train", "val"


def zero_counts() -> dict:
    return {"tokens": {"train": 0, "val": 0}, "documents": {"train": 0, "val": 0}}


class SubsetWriter(Writer):
    """A Writer whose tokens go to each component's own .partial files (opened when the component first appears)
    and whose progress also counts per component ("subsets": {name: {"tokens", "documents"}}), recorded in the
    one state at --out-dir: a commit makes every component's files durable, then records them all at once."""
    counters = out_folder.COUNTERS + ("subsets",)

    def __init__(self, out_dir: Path, fingerprint: dict, sizes: list, progress: dict, dtype: np.dtype):
        self.out_dir, self.fingerprint, self.sizes, self.dtype = out_dir, fingerprint, sizes, dtype
        self.done, self.fds, self.folders = progress, {}, {}
        self.subsets_filtered: Counter = Counter()
        try:
            with output_errors(out_dir, "opening the .partial files"):
                for name in progress["subsets"]:
                    for split in SPLITS:
                        self.open(name, split, progress["subsets"][name]["tokens"][split])
                self.rollback()
            self.commit()
        except BaseException:
            self.close()
            raise

    def open(self, name: str, split: str, recorded: int) -> int:
        """The file descriptor of a component's .partial file, which must hold at least `recorded` tokens."""
        folder = subset_folder(name)
        if self.folders.setdefault(folder, name) != name:
            raise UserError(f"the subsets {self.folders[folder]!r} and {name!r} both map to the folder "
                            f"{self.out_dir / folder}; leave one out with --exclude-subset")
        (self.out_dir / folder).mkdir(exist_ok=True)
        fd = self.fds[name, split] = os.open(self.out_dir / folder / PARTIAL[split], os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(fd).st_size < recorded * self.dtype.itemsize:
            raise UserError(f"--out-dir {self.out_dir}: {folder}/{PARTIAL[split]} is shorter than {STATE_NAME} "
                            "records (the files were changed by hand?); pass --overwrite to start over")
        return fd

    def fd(self, name: str, split: str) -> int:
        """A component's .partial file; a component seen for the first time starts empty (a killed run's leftover
        tokens beyond the last commit are cut off)."""
        fd = self.fds.get((name, split))
        if fd is None:
            note = subset_folder_note(name)
            if note and not any(n == name for n, _ in self.fds):
                print(f"\n{note}", file=sys.stderr)
            with output_errors(self.out_dir, f"creating the folder of {name!r}"), name_errors(self.out_dir, name):
                fd = self.open(name, split, 0)
                os.ftruncate(fd, 0)
        return fd

    def write(self, result: dict, max_train: Optional[int]) -> bool:
        """Append one task's tokens to the components' files (--max-tokens does not go with --by-subset)."""
        p = self.pending
        for name, part in result["parts"].items():
            counts = p["subsets"].setdefault(name, zero_counts())
            for split in SPLITS:
                arr = part[split]
                if not len(arr):
                    continue
                with output_errors(self.out_dir, f"writing {subset_folder(name)}/{PARTIAL[split]}"):
                    view = memoryview(arr).cast("B")
                    while view:  # os.write may write less than asked (a disk filling up)
                        view = view[os.write(self.fd(name, split), view):]
                for total in (counts, p):
                    total["tokens"][split] += len(arr)
                    total["documents"][split] += part["docs"][split]
        for key in ("bad", "filtered", "empty"):
            p["bad_lines" if key == "bad" else key] += result[key]
        self.subsets_filtered.update(result.get("subsets_filtered", {}))
        return False

    def rollback(self) -> None:
        """Back to `done`: every component's files cut to the tokens `done` records (0 for one it does not)."""
        self.pending = copy.deepcopy(self.done)
        for (name, split), fd in self.fds.items():
            tokens = self.done["subsets"].get(name, zero_counts())["tokens"][split]
            os.ftruncate(fd, tokens * self.dtype.itemsize)
            os.lseek(fd, 0, os.SEEK_END)

    def finish(self, metas: dict, index: dict) -> dict:
        """Record the finished run (each component's meta.json and subsets.json) so that publish can complete
        even after a kill."""
        self.done = copy.deepcopy(self.pending)
        self.done["publish"] = json.dumps(index, indent=2) + "\n"
        self.done["metas"] = {folder: meta.to_json() for folder, meta in metas.items()}
        self.commit()
        self.close()
        return self.done


@contextmanager
def name_errors(out_dir: Path, name: str):
    """A component's folder name too long for --out-dir's filesystem (or the path for the system): one line naming
    the subset and the fixes."""
    try:
        yield
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:
            raise
        raise UserError(f"subset {name!r}: its folder {out_dir / subset_folder(name)} is a name too long for this "
                        f"filesystem; leave the subset out with --exclude-subset {shlex.quote(name)}, or choose a "
                        "shorter --out-dir") from None


def make_index(subsets: dict, subset_field: str, run: dict) -> dict:
    """subsets.json: each component's name, folder and counts (sorted by folder), and the run's own meta record."""
    entries = [{"name": name, "folder": subset_folder(name), **copy.deepcopy(counts)}
               for name, counts in subsets.items()]
    return {"version": SUBSETS_VERSION, "subset_field": subset_field,
            "subsets": sorted(entries, key=lambda e: e["folder"]), "run": run}


def publish(out_dir: Path, state: dict) -> None:
    """Each component's .partial files become its train.bin / val.bin and its meta.json is written, the folders of
    an old finished run's components that this run has not are removed (--overwrite), then subsets.json (the mark
    of a finished run) is written. Each step can be repeated, so a run killed halfway through completes."""
    with output_errors(out_dir, "publishing the finished components"):
        index = current_folders(out_dir, state)
        old = read_subsets(out_dir) if (out_dir / SUBSETS_NAME).is_file() else None
        (out_dir / SUBSETS_NAME).unlink(missing_ok=True)  # an old finished run (with --overwrite) is no longer one
        for entry in index["subsets"]:
            out_folder.place(out_dir / entry["folder"], entry["tokens"], state["metas"][entry["folder"]])
        kept = {entry["folder"] for entry in index["subsets"]}
        for entry in old or []:
            if entry["folder"] not in kept:
                remove_component(out_dir / entry["folder"])
        atomic_write_text(out_dir / SUBSETS_NAME, state["publish"])
        (out_dir / STATE_NAME).unlink()


def current_folders(out_dir: Path, state: dict) -> dict:
    """The index to publish, each component in subset_folder's folder: a run of an older prepare_data, killed or
    failed while publishing, may have recorded one in a folder of a name the run writes itself (OUT/subsets.json/),
    which is renamed now. Repeatable."""
    index = json.loads(state["publish"])
    for entry in index["subsets"]:
        folder = subset_folder(entry["name"])
        if entry["folder"] != folder:
            if (out_dir / entry["folder"]).is_dir() and not (out_dir / folder).exists():
                os.rename(out_dir / entry["folder"], out_dir / folder)
            state["metas"][folder] = state["metas"].pop(entry["folder"])
            entry["folder"] = folder
    index["subsets"].sort(key=lambda e: e["folder"])
    state["publish"] = json.dumps(index, indent=2) + "\n"
    return index


def remove_component(folder: Path) -> None:
    """An old component's prepared files, and its folder once empty."""
    for name in ("train.bin", "val.bin", "meta.json", *PARTIAL.values()):
        (folder / name).unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
