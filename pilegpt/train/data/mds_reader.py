"""The StreamingDataset train.py reads MDS shards with: a failure in Streaming's download threads ends the run with
one line naming its cause (a checksum mismatch, a lost connection), not "Background thread failed". A module of
its own because it subclasses Streaming's class at import, and Streaming is slow to import: loaders.py imports
it only when a run reads MDS. Details: docs/robustness.md."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from streaming import StreamingDataset

from pilegpt.common import UserError
from pilegpt.compat import KeepStreamingFailure
from pilegpt.data import INDEX_NAME
from pilegpt.s3 import lost_connection


class CheckedStreamingDataset(KeepStreamingFailure, StreamingDataset):
    """StreamingDataset that keeps the first failure of its background threads (compat.KeepStreamingFailure) and
    raises it from __iter__ as a UserError."""

    def __iter__(self):
        try:
            yield from super().__iter__()
        except (RuntimeError, ValueError) as e:
            where = ", ".join(s.remote or s.local for s in self.streams)
            message = describe_read_failure(self.failure or e, where, [s.local for s in self.streams])
            if message is None:
                raise
            raise UserError(message) from None


def describe_read_failure(e: BaseException, where: str, caches: Sequence[str]) -> Optional[str]:
    """One line for a failure while reading MDS shards (checksum, lost connection), or None if unknown.

    A shard that fails its checksum is removed when it lies inside one of the `caches` (the streams' folders under
    data_local), so that the next run downloads it again; a path anywhere else is never deleted."""
    text = str(e)
    if isinstance(e, ValueError) and text.startswith("Checksum failure: "):
        cached = text.partition(": ")[2]
        if any(is_inside(cached, cache) for cache in caches):
            Path(cached).unlink(missing_ok=True)
        return (f"shard {Path(cached).name} of {where} does not match the checksum in its {INDEX_NAME}: the dataset "
                f"is damaged; rebuild it with to_mds.py --overwrite (or upload it again)")
    return lost_connection(e, f"while reading {where}")


def is_inside(path: str, folder: str) -> bool:
    """Whether `path` lies strictly inside `folder`, symlinks and '..' resolved."""
    return Path(folder).resolve() in Path(path).resolve().parents
