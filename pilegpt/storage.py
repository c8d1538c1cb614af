"""The one seam between local folders and S3: a location is a local path (or file://) or an s3:// URL, and
`folder(location)` gives a LocalDir or an s3.S3Dir that answer the same questions (exists, get, read, write,
create, names, sizes, delete, upload, download, child). No other module tests for "://". Details: docs/layout.md."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable, Optional, Union

from pilegpt.common import UserError, atomic_path
from pilegpt.s3 import S3Dir

SEPARATOR = "://"


def scheme(location: str) -> str:
    """'s3' for s3://..., 'hf' for hf://..., 'file' for file://..., '' for a plain local path."""
    head, sep, _ = str(location).partition(SEPARATOR)
    return head.lower() if sep and head.replace("+", "").replace("-", "").isalnum() else ""


def is_remote(location: str) -> bool:
    """Whether `location` is a URL other than file:// (it names no local path)."""
    return scheme(location) not in ("", "file")


def is_s3(location: str) -> bool:
    return scheme(location) == "s3"


def read_as_url_elsewhere(location: str) -> bool:
    """Whether urllib.parse.urlparse, which Composer reads a save_folder with, gives another place than `location`:
    a '#', '?' or ';' in it ends its path there ('runs/ru n#1' is read as 'runs/ru n'), and a local path like
    'ab:c/d' reads as a URL of scheme 'ab'. Composer has no escape for them: such a location is refused."""
    import urllib.parse

    parsed = urllib.parse.urlparse(str(location))
    if is_remote(location):
        return f"{parsed.scheme}://{parsed.netloc}{parsed.path}" != str(location)
    return parsed.scheme != "" or parsed.path != str(location)


def local_path(location: str) -> str:
    """The local path of a plain path or a file:// URL."""
    return str(location)[len("file://"):] if scheme(location) == "file" else str(location)


def without_scheme(location: str) -> str:
    """'s3://bucket/x' -> 'bucket/x' (e.g. to name a cache folder after its source)."""
    return str(location).partition(SEPARATOR)[2] if scheme(location) else str(location)


def join(location: str, *parts: str) -> str:
    """location/part/...: '/'-joined for a URL, os.path.join for a local path; empty parts are skipped."""
    parts = tuple(p for p in parts if p)
    if is_remote(location):
        return "/".join([str(location).rstrip("/")] + [p.strip("/") for p in parts])
    return os.path.join(location, *parts)


class LocalDir:
    """A local folder with the methods of s3.S3Dir. Names are relative to the folder and may contain "/"; write is
    whole or not at all (an atomic rename), create writes only if the name is absent, names() lists every file
    below, sorted."""

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = Path(local_path(str(path)))
        self.url = str(self.path)

    def __repr__(self) -> str:
        return f"LocalDir({self.url!r})"

    def _file(self, name: str) -> Path:
        return self.path / name

    def child(self, sub: str) -> "LocalDir":
        return LocalDir(self.path / sub) if sub else self

    def exists(self, name: str) -> bool:
        return self._file(name).is_file()

    def read(self, name: str) -> bytes:
        try:
            return self._file(name).read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {self._file(name)} ({e.strerror or e})") from None

    def get(self, name: str) -> Optional[bytes]:
        return self.read(name) if self.exists(name) else None

    def write(self, name: str, data: bytes) -> None:
        path = self._file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            Path(tmp).write_bytes(data)

    def create(self, name: str, data: bytes) -> bool:
        """File `name` := data only if there is none (O_CREAT|O_EXCL: of two processes, one wins); whether this call
        created it."""
        path = self._file(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as e:
            raise UserError(f"cannot create {path} ({e.strerror or e}): is its folder writable?") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return True

    def sizes(self) -> dict[str, int]:
        if not self.path.is_dir():
            return {}
        return {p.relative_to(self.path).as_posix(): p.stat().st_size for p in self.path.rglob("*") if p.is_file()}

    def names(self) -> list[str]:
        return sorted(self.sizes())

    def delete(self, names: Iterable[str]) -> None:
        for name in names:
            self._file(name).unlink(missing_ok=True)

    def upload(self, local: Union[str, os.PathLike], name: str) -> None:
        path = self._file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            shutil.copyfile(local, tmp)

    def download(self, name: str, local: Union[str, os.PathLike]) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(local) as tmp:
            shutil.copyfile(self._file(name), tmp)


Folder = Union[LocalDir, S3Dir]


def folder(location: str, client=None) -> Folder:
    """The folder at `location`: an S3Dir for s3:// (on `client`, else one from s3.make_client), a LocalDir for a
    path or file://; a UserError for another scheme."""
    if is_s3(location):
        return S3Dir(location, client)
    if is_remote(location):
        raise UserError(f"{location}: only local paths and s3:// URLs are supported here (any S3-compatible store "
                        "through AWS_ENDPOINT_URL)")
    return LocalDir(location)
