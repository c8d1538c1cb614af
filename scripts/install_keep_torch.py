"""make install-keep-torch: install what the repo needs around the torch this Python already has (a GPU image's, or a
newer one than the pinned 2.7.0), never replacing it.

    python scripts/install_keep_torch.py          # what `make install` installs, around this torch
    python scripts/install_keep_torch.py --dev    # what `make install-dev` installs (the tests too)
    python scripts/install_keep_torch.py --marked # prints the marker's path if this environment keeps its torch

requirements.txt pins the stack that resolves together (torch 2.7.0, Composer 0.32.1, Streaming 0.13.0, numpy<2.2).
Here torch, torchvision and numpy stay as they are: a constraint file pins each installed one to its version, so pip
can neither upgrade nor downgrade it. Composer and Streaming go in with --no-deps at requirements.txt's versions,
their own requirements from requirements-keep-torch.txt, and the rest of requirements.txt (requirements-dev.txt with
--dev) less those five. With no torchvision, the one built with this torch (0.29.1 for 2.14.1) is added: Composer
imports it. Torch's differences from 2.7.0 that the repo meets are handled in pilegpt/compat.py.

The marker (MARKER in the environment's sys.prefix) tells the Makefile that this environment keeps its torch:
`make install`/`install-dev` (and so quickstart, test, test-fast) then run this script instead of pip install -r
requirements.txt, which would put torch 2.7.0 back. Deleting the file returns the environment to the pinned stack.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # pilegpt (imports nothing else)
from pilegpt.common import UserError, run_main  # noqa: E402

MARKER = "pilegpt-keep-torch"  # in sys.prefix; holds the torch version it was installed around (for people only)
KEPT = ("torch", "torchvision", "numpy")  # never replaced: pinned to the installed versions
NO_DEPS = ("mosaicml", "mosaicml-streaming")  # installed without their torch/numpy pins
DEPS_FILE = "requirements-keep-torch.txt"  # what those two need besides KEPT


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str | None:
    """The project a requirements line names ("torch==2.7.0  # x" -> "torch"), or None (a comment, -r, blank)."""
    line = line.split("#", 1)[0].strip()
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line) if line and not line.startswith("-") else None
    return canonical(m.group(0)) if m else None


def requirement_lines(path: Path) -> list[str]:
    """Every requirement of `path`, following its -r includes, as written (comments and blank lines dropped)."""
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            lines += requirement_lines(path.parent / line.split(None, 1)[1])
        elif line:
            lines.append(line)
    return lines


def pins(path: Path, names: tuple[str, ...]) -> list[str]:
    """The lines of `path` that name one of `names` ("mosaicml==0.32.1"), in its order."""
    wanted = {canonical(n) for n in names}
    return [line for line in requirement_lines(path) if requirement_name(line) in wanted]


def around_torch(path: Path) -> list[str]:
    """`path`'s requirements less the pinned stack (KEPT and NO_DEPS), which the keep-torch install handles."""
    dropped = {canonical(n) for n in KEPT + NO_DEPS}
    return [line for line in requirement_lines(path) if requirement_name(line) not in dropped]


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def matching_torchvision(torch_version: str) -> str:
    """The torchvision release built with torch `torch_version`: 2.m.p -> 0.(m+15).p (2.7.0 -> 0.22.0)."""
    m = re.match(r"2\.(\d+)\.(\d+)", torch_version)
    if not m:
        raise UserError(f"install_keep_torch: no torchvision is installed and torch {torch_version} is not a 2.x "
                         "release: install the torchvision built with this torch (from where the torch came), then "
                         "run make install-keep-torch again")
    return f"0.{int(m.group(1)) + 15}.{m.group(2)}"


def pip(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", *args]
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        raise UserError(f"install_keep_torch: pip failed ({' '.join(cmd)}); torch is as it was")


def install(dev: bool) -> str:
    """The keep-torch install; returns the torch version it was done around."""
    torch_version = installed("torch")
    if torch_version is None:
        raise UserError("install_keep_torch: this Python has no torch to keep: install the torch you want first "
                         "(`pip install torch`, or your image's), or use `make install` for the pinned torch 2.7.0")
    versions = {name: installed(name) for name in KEPT}
    with tempfile.TemporaryDirectory() as tmp:
        constraints, rest = Path(tmp, "keep.txt"), Path(tmp, "around-torch.txt")
        constraints.write_text("".join(f"{name}=={v}\n" for name, v in versions.items() if v))
        rest.write_text("\n".join(around_torch(ROOT / ("requirements-dev.txt" if dev else "requirements.txt"))) + "\n")
        pip(["-c", str(constraints), "-r", str(ROOT / DEPS_FILE), "-r", str(rest)])
        extra = [] if versions["torchvision"] else [f"torchvision=={matching_torchvision(torch_version)}"]
        pip(["-c", str(constraints), "--no-deps", *pins(ROOT / "requirements.txt", NO_DEPS), *extra])
    if installed("torch") != torch_version:  # the constraint forbids it: a check that it did
        raise UserError(f"install_keep_torch: torch changed from {torch_version} to {installed('torch')}")
    return torch_version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev", action="store_true", help="also what the tests need (requirements-dev.txt)")
    parser.add_argument("--marked", action="store_true", help="print the marker's path if this environment has it")
    args = parser.parse_args(argv)
    marker = Path(sys.prefix, MARKER)
    if args.marked:
        if marker.is_file():
            print(marker)
        return 0
    torch_version = install(args.dev)
    marker.write_text(f"{torch_version}\n")
    print(f"install_keep_torch: done around torch {torch_version} (Composer and Streaming without their torch and "
          f"numpy pins); `make install`, `make test` and `make quickstart` keep it ({marker}: delete it to go back "
          "to the pinned stack)", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
