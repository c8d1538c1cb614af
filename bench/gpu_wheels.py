"""make gpu-wheels: download, here, every wheel of bench/gpu_wheels.txt for the GPU machine's image (Python 3.12,
manylinux x86_64) into one ignored folder that the device tool carries with the working tree
(docs/performance.md#on-a-gpu).

Usage:
    python bench/gpu_wheels.py                     # into .gpu-wheels/ (what bench/gpu_run.sh installs from)
    python bench/gpu_wheels.py --dest /tmp/w       # elsewhere
    python bench/gpu_wheels.py --check             # no download: the lists agree and the folder holds them all

The list holds exact pins and nothing that bench/gpu_image_packages.txt (the image as assumed) already has: a wheel
of a project the image holds would shadow the image's own build. The download goes to a fresh folder beside the
destination, which then replaces it whole, so the folder never holds two versions of one project (that would stop
gpu_run.sh's install) nor a wheel left from an older list. The folder must stay under MAX_BYTES: what travels with
the working tree is 64 MiB in all.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pilegpt.common import UserError, run_main  # noqa: E402

WHEEL_LIST = REPO / "bench" / "gpu_wheels.txt"
IMAGE_LIST = REPO / "bench" / "gpu_image_packages.txt"
DEST = REPO / ".gpu-wheels"
MAX_BYTES = 32 * 2**20  # half of what the device tool carries: the repo's own files travel too
# The image's interpreter: CPython 3.12 on x86-64 Linux (glibc 2.28 or later takes every manylinux tag below)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def canonical(name: str) -> str:
    """A project's name as PyPI compares it ("Brotli", "python_snappy" -> "brotli", "python-snappy")."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """{project: version} of a list of `name==version` lines (comments after #); anything else is refused."""
    pins: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        if not m:
            raise UserError(f"{path}:{n}: {line!r} is not an exact pin: write it as name==version")
        name = canonical(m.group(1))
        if name in pins:
            raise UserError(f"{path}:{n}: {name} is listed twice: keep one version")
        pins[name] = m.group(2)
    if not pins:
        raise UserError(f"{path} lists no wheels")
    return pins


def read_image(path: Path) -> set[str]:
    """The image's projects (one name a line, # comments)."""
    return {canonical(line.split("#", 1)[0].strip()) for line in path.read_text().splitlines()
            if line.split("#", 1)[0].strip()}


def check_lists(pins: dict[str, str], image: set[str]) -> None:
    both = sorted(set(pins) & image)
    if both:
        raise UserError(f"{WHEEL_LIST.name} lists {', '.join(both)}, which {IMAGE_LIST.name} says the image has: "
                        "remove it from one of the two lists")


def wheel_project(path: Path) -> tuple[str, str]:
    """(project, version) from a wheel's file name (name-version-...whl)."""
    name, version = path.name.split("-")[:2]
    return canonical(name), version


def check_folder(folder: Path, pins: dict[str, str]) -> int:
    """The folder holds exactly one wheel per pin, at its version, and nothing else; its size in bytes."""
    if not folder.is_dir():
        raise UserError(f"{folder} does not exist: run `make gpu-wheels`")
    wheels = sorted(folder.glob("*.whl"))
    found = {}
    for w in wheels:
        project, version = wheel_project(w)
        if project in found or pins.get(project) != version:
            raise UserError(f"{folder} holds {w.name}, which {WHEEL_LIST.name} does not pin (or holds it twice): "
                            "run `make gpu-wheels` to make the folder anew")
        found[project] = version
    missing = sorted(set(pins) - set(found))
    if missing:
        raise UserError(f"{folder} lacks {', '.join(missing)}: run `make gpu-wheels`")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    if size > MAX_BYTES:
        raise UserError(f"{folder} holds {size / 2**20:.1f} MiB of wheels, over the {MAX_BYTES // 2**20} MiB that can "
                        "travel with the working tree: carry fewer")
    return size


def download(pins: dict[str, str], dest: Path) -> None:
    """pip download of every pin for the image's Python into a fresh folder, which then replaces `dest`."""
    fresh = dest.with_name(dest.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS],
           "--dest", str(fresh), *[f"{name}=={version}" for name, version in pins.items()]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(fresh, ignore_errors=True)
        last = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
        raise UserError(f"pip download failed: {last[-1] if last else 'exit ' + str(done.returncode)}")
    shutil.rmtree(dest, ignore_errors=True)
    fresh.rename(dest)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dest", type=Path, default=DEST, help=f"the folder (default {DEST.relative_to(REPO)}/)")
    p.add_argument("--check", action="store_true", help="download nothing: check the lists and the folder")
    args = p.parse_args(argv)
    pins = read_pins(WHEEL_LIST)
    check_lists(pins, read_image(IMAGE_LIST))
    if not args.check:
        download(pins, args.dest.resolve())
    size = check_folder(args.dest, pins)
    print(f"{args.dest}: {len(pins)} wheels for CPython 3.12 manylinux x86_64, {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    run_main(main)
