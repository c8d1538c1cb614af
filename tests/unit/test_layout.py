"""The shape of the code (docs/layout.md): the library's import graph has no cycle, only storage.py tells a URL from a
local path, only compat.py touches library internals, and every product function fits on a screen."""

import ast
import re
from pathlib import Path

from helpers import REPO

PRODUCT = sorted([*REPO.glob("*.py"), *(REPO / "pilegpt").rglob("*.py")])
WITH_BENCH = sorted([*PRODUCT, *(REPO / "bench").glob("*.py")])
LONGEST_FILE = 600  # lines; the unit a reader holds is the function, so the file cap is only a backstop
LONGEST_FUNCTION = 60  # lines, from `def` to the last line, nested functions included
DEEPEST = 4  # if/for/while/with/try/match blocks inside one another in a function (an elif is no deeper)
BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.TryStar, ast.Match)
# "file:function" -> why it may be longer or deeper. Keep this small: split a long function into named steps instead.
EXCEPTIONS: dict[str, str] = {}
SCHEME_TEST = re.compile(r"startswith\(\s*f?[\"'](s3|file|hf)://")


def module_name(path: Path) -> str:
    """pilegpt/mds/write.py -> pilegpt.mds.write; pilegpt/mds/__init__.py -> pilegpt.mds."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The pilegpt modules (of `modules`, dotted) a file imports, at any depth of the file (lazy imports count: they
    close cycles too). `from pilegpt.mds import write` imports pilegpt.mds.write where that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pilegpt":
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "pilegpt"}
    return found & modules


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, path + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return cycles


def test_the_library_has_no_import_cycle():
    files = {module_name(p): p for p in (REPO / "pilegpt").rglob("*.py")}
    assert {"pilegpt.mds.write", "pilegpt.prepare.sources", "pilegpt.train.config", "pilegpt.data"} <= set(files)
    graph = {name: imports_of(path, set(files)) - {name} for name, path in files.items()}
    assert "pilegpt.mds.write" in graph["pilegpt.mds.verify"]  # the graph sees the subpackages' imports
    assert not import_cycles(graph), import_cycles(graph)


def test_train_s_parts_are_grouped_and_their_imports_run_one_way():
    """pilegpt/train/ keeps a dozen modules at most at its top; data/ and optim/ read the settings and their own folder
    only, run/ never the optimizer, and no part reads plain_loop.py (docs/layout.md)."""
    train = REPO / "pilegpt" / "train"
    assert len([p for p in train.iterdir() if p.suffix == ".py" and p.name != "__init__.py" or (
        p.is_dir() and (p / "__init__.py").exists())]) <= 12
    modules = {module_name(p) for p in train.rglob("*.py")}
    own = lambda name, folder: name == folder or name.startswith(folder + ".")
    for path in train.rglob("*.py"):
        name, imported = module_name(path), imports_of(path, modules)
        folder = next((f"pilegpt.train.{f}" for f in ("data", "optim", "run") if own(name, f"pilegpt.train.{f}")), "")
        if folder.endswith(("data", "optim")):
            assert all(own(m, folder) or m == "pilegpt.train.config" for m in imported), (name, imported)
        elif folder:
            assert not any(own(m, "pilegpt.train.optim") for m in imported), (name, imported)
        assert "pilegpt.train.plain_loop" not in imported or name == "pilegpt.train.plain_loop", name


def test_an_import_cycle_through_a_subpackage_is_found():
    graph = {"pilegpt.mds.write": {"pilegpt.data"}, "pilegpt.data": {"pilegpt.mds.verify"},
             "pilegpt.mds.verify": {"pilegpt.mds.write"}, "pilegpt.common": set()}
    assert import_cycles(graph) == [["pilegpt.data", "pilegpt.mds.verify", "pilegpt.mds.write", "pilegpt.data"]]


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


def test_every_product_file_stays_under_the_file_cap():
    long = {str(p.relative_to(REPO)): n for p in PRODUCT if (n := len(p.read_text().splitlines())) > LONGEST_FILE}
    assert not long, long


def nesting(node: ast.AST, depth: int = 0) -> int:
    """How deep BLOCKS nest below `node`. An elif (an If alone in an If's else, at the same column) is the same
    level as its if; nested functions, classes and lambdas are measured on their own."""
    deepest = depth
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        is_elif = (isinstance(node, ast.If) and isinstance(child, ast.If) and node.orelse == [child]
                   and child.col_offset == node.col_offset)
        if isinstance(child, BLOCKS):
            deepest = max(deepest, nesting(child, depth if is_elif else depth + 1))
        else:
            deepest = max(deepest, nesting(child, depth))
    return deepest


def oversized_functions(source: str, filename: str) -> dict[str, str]:
    """"file:function" -> "N lines, nesting D" for every function (methods and nested ones too) over the caps."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines, depth = node.end_lineno - node.lineno + 1, nesting(node)
            if lines > LONGEST_FUNCTION or depth > DEEPEST:
                found[f"{filename}:{node.name}"] = f"{lines} lines, nesting {depth}"
    return found


def test_every_product_function_fits_on_a_screen():
    """No function over LONGEST_FUNCTION lines or nested deeper than DEEPEST, but the few EXCEPTIONS (the unit a
    reader holds is the function: split a long one into named steps that read in order)."""
    found = {}
    for path in WITH_BENCH:
        found |= oversized_functions(path.read_text(), path.relative_to(REPO).as_posix())
    assert not {name: size for name, size in found.items() if name not in EXCEPTIONS}, found
    assert not set(EXCEPTIONS) - set(found), "these EXCEPTIONS fit now: remove them"
    assert len(EXCEPTIONS) <= 3, "split the functions instead of adding exceptions"


DEEP = """
def deep(x):
    for a in x:
        if a:
            with a:
                while a:
                    try:
                        pass
                    except E:
                        pass
"""
ELIF_CHAIN = """
def chain(x):
    for a in x:
        if a:
            with a:
                if b:
                    pass
                elif c:
                    pass
                elif d:
                    pass
                else:
                    pass
"""
ELSE_IF = """
def chain(x):
    for a in x:
        if a:
            with a:
                if b:
                    pass
                else:
                    if c:
                        pass
"""
NESTED_FUNCTION = """
def outer():
    def inner():
        for a in b:
            for c in d:
                pass
    for a in b:
        for c in d:
            for e in f:
                pass
"""


def test_the_function_cap_finds_a_long_or_deep_function():
    long_method = "class C:\n    def long(self):\n" + "        x = 1\n" * 60
    assert oversized_functions(DEEP, "x.py") == {"x.py:deep": "9 lines, nesting 5"}
    assert oversized_functions(long_method, "x.py") == {"x.py:long": "61 lines, nesting 0"}
    assert oversized_functions(ELIF_CHAIN, "x.py") == {}  # an elif chain is one level, however long
    assert oversized_functions(ELSE_IF, "x.py") == {"x.py:chain": "9 lines, nesting 5"}  # an if inside an else
    assert oversized_functions(NESTED_FUNCTION, "x.py") == {}  # inner's 2 levels are not added to outer's 3


def test_the_files_the_suite_starts_first_exist():
    """conftest.LONGEST orders the suite (the longest files first, for xdist's workers): a renamed file would fall
    back to the end unnoticed."""
    from conftest import E2E, LONGEST

    assert len(set(LONGEST)) == len(LONGEST) and all((E2E / name).is_file() for name in LONGEST), LONGEST
