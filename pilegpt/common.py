"""Small helpers the scripts share, none doing work at import time: UserError and run_main (an error the user can
fix is one line on stderr and exit code 2, not a traceback), atomic writes (a temporary name, then a rename),
.env settings and secrets kept out of every message, and CPU malloc tuning. Details: docs/robustness.md."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

SECRET_ENV_NAMES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN",
                    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


class UserError(Exception):
    """Something the user can fix (bad input, bad flag, missing credentials). Printed as one line."""


def one_line(e: BaseException) -> str:
    """An exception's message with its whitespace and newlines collapsed, for one-line errors."""
    return " ".join(str(e).split())


def run_main(main: Callable[[Optional[Sequence[str]]], int | None], argv: Optional[Sequence[str]] = None) -> None:
    """Run a script's main(); a UserError becomes 'error: ...' on stderr and exit 2, Ctrl-C exit 130."""
    try:
        code = main(argv)
    except UserError as e:
        refuse(e)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:  # Composer's SIGINT handler exits 130 (during start-up and evaluation)
        if e.code == 130:
            print("interrupted", file=sys.stderr)
        raise
    except Exception as e:
        if not interrupted(e):
            raise
        print("interrupted", file=sys.stderr)  # Ctrl-C landed inside a write, which then failed in its own way
        sys.exit(130)
    sys.exit(code or 0)


def refuse(e: UserError) -> None:
    """A user's mistake: its one line, 'error: ...', on stderr (secrets masked), and exit status 2."""
    message = str(e).strip()
    if message.startswith("Caught UserError"):  # re-raised by a DataLoader worker, with its traceback
        message = message.splitlines()[-1].partition(": ")[2]  # the last line: "common.UserError: ..."
    print(f"error: {mask_secrets(message)}", file=sys.stderr)
    sys.exit(2)


def interrupted(e: Optional[BaseException]) -> bool:
    """Whether Ctrl-C (KeyboardInterrupt, or Composer's handler exiting with 130) is behind this exception."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt) or (isinstance(e, SystemExit) and e.code == 130):
            return True
        e = e.__cause__ or e.__context__
    return False


def pid_alive(pid: int) -> bool:
    """Whether a process of this PID runs on this machine (another user's counts: kill -0 is refused, not failed)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """Yield a temporary name beside `path` to write to; on success it is fsynced and renamed to `path`,
    so readers see either the old file or the whole new one, never a part. On error it is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield str(tmp)
        fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def download_once(url: str, path: Path, what: str, check: Callable[[str], None], local: str = "") -> Path:
    """`path`, downloaded from `url` on first use: written under a temporary name, checked by check(tmp) (a UserError
    for a file that is not `what`), then renamed into place, so a partial or bad download is never used. Offline (or
    any failed download) is one line naming --data and `local` (default: a local copy of the file), the copy that
    needs no download."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        try:
            with urllib.request.urlopen(url, timeout=30) as response, open(tmp, "wb") as out:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            local = local or f"a local copy of {path.name} with --data FILE"
            raise UserError(f"cannot download {what} from {url} ({reason}): offline? pass {local}") from None
        check(tmp)
    return path


def check_writable_folder(path: str | os.PathLike, what: str, fix: str, beside: bool = False) -> None:
    """UserError unless files can be written in folder `path`, or it can be made: its deepest existing part (itself
    or an ancestor) must be a folder this process may write in; beside=True: the same of its parent (for a folder
    staged under a temporary name beside it). `what` names the setting, `fix` the remedy; nothing is created (so a
    refused run leaves nothing behind)."""
    existing = Path(os.path.abspath(path))
    existing = existing.parent if beside else existing
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{what} {path}: {existing} is a file, not a folder: {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        reason = "a read-only file system" if os.statvfs(existing).f_flag & os.ST_RDONLY else "permission denied"
        raise UserError(f"{what} {path}: cannot write in {existing} ({reason}): {fix}")


def failed_write(e: BaseException, folder: str | os.PathLike) -> Optional[str]:
    """One line for a write into `folder` that failed for want of space (ENOSPC, a quota, a file-size limit), or
    None for any other error. torch.save says only "file write failed" (then "unexpected pos" while cleaning up): for
    it the line gives the free space measured, so the user sees whether the disk is full."""
    seen: list[BaseException] = []
    while e is not None and e not in seen and len(seen) < 10:
        seen.append(e)
        e = e.__cause__ or e.__context__
    for err in seen:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return f"writing {err.filename or folder} failed: {err.strerror} ({errno.errorcode[err.errno]})"
    if any(isinstance(err, RuntimeError) and "file write failed" in str(err) for err in seen):
        existing = Path(os.path.abspath(folder))
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = shutil.disk_usage(existing).free
        return (f"writing a checkpoint or model.pt in {folder} failed (torch: file write failed; {free / 1e6:.1f} MB "
                "free)")
    return None


def fsync(path: str | os.PathLike) -> None:
    """Flush a file (or a folder's entries) to disk, so a rename after it never publishes an empty file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (see atomic_path)."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def load_dotenv_file(path: str | os.PathLike = ".env") -> bool:
    """Load KEY=VALUE lines from `.env` in the working directory; variables already set win."""
    if not Path(path).is_file():
        return False
    from dotenv import load_dotenv
    return load_dotenv(path, override=False)


def mask_secrets(text: str) -> str:
    """Replace the values of secret environment variables (and obvious key=value secrets) with '***'."""
    for name in SECRET_ENV_NAMES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return re.sub(r"(?i)((?:secret|token|password|api_key)[\w-]*\s*[=:]\s*)(\S+)", r"\1***", text)


def setup_logging(level: int = logging.INFO) -> None:
    """One-line log records on stderr, the same format for every script."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def tune_glibc_malloc() -> bool:
    """Make glibc's malloc keep large freed blocks instead of returning them to the OS (CPU training); returns
    whether it applied. M_MMAP_MAX=0 serves the (B*T, vocab) logits and their gradients from the heap rather than
    a fresh, zero-filled mmap at every step, and a 1 GB M_TRIM_THRESHOLD keeps the heap from shrinking between
    steps: the effect of jemalloc with retain:true (bench/bench_train.py measures both)."""
    # glibc serves each allocation above its mmap threshold (at most 32 MB) with a fresh mmap and unmaps it on
    # free: on CPU the page faults can cost more than the arithmetic.
    if not sys.platform.startswith("linux") or "jemalloc" in os.environ.get("LD_PRELOAD", ""):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from glibc's malloc.h
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False


def pick_device(name: Optional[str], local_rank: int = 0):
    """The torch.device of a `--device` flag: cpu, cuda or cuda:N (None: this process's GPU when there is one, else
    the CPU); a UserError for a name that is not a device, or CUDA on a machine without a GPU."""
    import torch

    if name is None or name == "cuda":
        if name is None and not torch.cuda.is_available():
            return torch.device("cpu")
        name = f"cuda:{local_rank}"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device: use cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: no CUDA GPU is visible here; use --device cpu")
    return device
