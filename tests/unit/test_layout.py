"""The shape of the code (README "Layout"): the library's import graph has no cycle, only storage.py tells a URL
from a local path, only compat.py touches library internals, and every product file is readable in one sitting."""

import ast
import re
from pathlib import Path

from helpers import REPO

PRODUCT = sorted([*REPO.glob("*.py"), *(REPO / "pilegpt").rglob("*.py")])
LONGEST = 450  # lines; a dataclass of settings may be longer (train_config.py: one commented line per setting)
LONGER_ALLOWED = {"train_config.py": 500}
SCHEME_TEST = re.compile(r"startswith\(\s*f?[\"'](s3|file|hf)://")


def imports_of(path: Path) -> set[str]:
    """The pilegpt modules a file imports, at any depth of the file (lazy imports count: they close cycles too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "pilegpt":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pilegpt."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("pilegpt.")}
    return found


def test_the_library_has_no_import_cycle():
    graph = {p.stem: imports_of(p) for p in (REPO / "pilegpt").glob("*.py")}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert not cycles, cycles


def test_only_the_storage_seam_tests_for_a_url():
    """storage.py decides local-or-remote; s3.py's parse_s3_url is the one definition of an S3 URL."""
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in PRODUCT for i, line in enumerate(p.read_text().splitlines(), 1)
                 if ('"://"' in line and p.name != "storage.py")
                 or (SCHEME_TEST.search(line) and p.name not in ("storage.py", "s3.py"))]
    assert not offenders, offenders


def test_private_library_parts_are_used_in_compat_only():
    private = re.compile(r"\._ensure_ema|checkpoint_saver\.RemoteUploader|streaming\.base|\._event\b|"
                         r"extra_bytes_per_(shard|sample)|composer\.utils\.\w+\.")
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in PRODUCT if p.name != "compat.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert not offenders, offenders


def test_every_product_file_fits_in_one_sitting():
    long = {p.name: n for p in PRODUCT if (n := len(p.read_text().splitlines())) > LONGER_ALLOWED.get(p.name, LONGEST)}
    assert not long, long
