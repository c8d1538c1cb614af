"""The docs stay true: every relative link and anchor resolves, every command README.md names exists, every test
function the docs name exists, every repository path a docstring or comment names exists, docs/layout.md's
module table is the modules' own docstrings, and README.md stays a front door: at most 130 lines, at most 22 words
a sentence on average (docs/testing.md).

Reads files only: no subprocess, no network, no torch.

    python tests/unit/test_docs.py --write-layout    # rewrite docs/layout.md's module table from the docstrings
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shlex
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Iterator, Optional

REPO = next(p for p in Path(__file__).resolve().parents if (p / "Makefile").is_file() and (p / "pilegpt").is_dir())
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
LINKED = [README, REPO / "CHANGELOG.md", *PAGES]  # every relative link in these must resolve
LAYOUT = REPO / "docs" / "layout.md"
STEP_SOURCE, STEP_PAGE = REPO / "pilegpt" / "train" / "plain_loop.py", REPO / "docs" / "training.md"
STEP_START, STEP_END = "# ---- one training step", "# ---- end of the step"  # the rulers in plain_loop.py
TABLE_START = "<!-- module table:"
TABLE_END = "<!-- end of module table -->"
README_MAX_LINES = 130
README_MAX_WORDS_PER_SENTENCE = 22  # nanoGPT's and nanochat's READMEs: ~20 (words_and_sentences)
# Module groups of the table, in the pipeline's order; a folder not listed here gets its path as its title.
GROUPS = {"": "the model", "pilegpt": "shared by the stages", "pilegpt/prepare": "prepare_data.py's parts",
          "pilegpt/mds": "to_mds.py's and upload_s3.py's parts", "pilegpt/train": "train.py's parts"}
# `python -m X` for these runs another tool, not a module of this repo.
OTHER_MODULES = {"pip", "venv", "pytest", "ruff", "cProfile", "http.server", "json.tool"}

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
TEST_NAME = re.compile(r"\b(test_\w+)\b(?!\.py|/)")
PATH = re.compile(r"[\w.-]+(/[\w.-]+)*\.(py|sh|sbatch|yaml|txt|jsonl)")  # a repo file a command names
SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)[.!?](?=\s|$)")
FOLDERS = ("assets", "bench", "config", "docs", "examples", "mcli", "pilegpt", "scripts", "tests")  # the repo's own
REPO_PATH = re.compile(r"(?<![\w./$-])((?:%s)/[\w./*-]*(?:\.\w+|/))" % "|".join(FOLDERS))  # tests/helpers.py, docs/
BARE_FILE = re.compile(r"(?<![\w./${-])(\w+\.(?:py|sh|sbatch|yaml))\b")  # helpers.py: some file of the repo
# bare names of other projects' files
NOT_OURS = {"prepare.py": "nanoGPT's", "early_stopper.py": "Composer's", "core.yaml": "DCLM's eval bundle's"}


# ---- reading markdown ----------------------------------------------------------------------------------------


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the text outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield number, line


def words_and_sentences(text: str) -> tuple[int, int]:
    """(words, sentences) of the text's prose: outside fenced code, headings and tables, without list markers or
    link targets. A word is a token with a letter or digit; a sentence is an end mark (. ! ?) before a space or the
    line's end, "e.g." and "i.e." not counting, so a list item without one adds words and no sentence."""
    kept = []
    for _, line in prose_lines(text):
        line = line.strip()
        if line.startswith(("#", "|")):
            continue
        line = re.sub(r"^(?:[-*+]|\d+\.)\s+", "", line)
        kept.append(re.sub(r"\]\([^)]*\)", "]", line))
    prose = " ".join(kept)
    words = sum(1 for token in prose.split() if re.search(r"\w", token))
    return words, len(SENTENCE_END.findall(prose))


def code_blocks(text: str) -> Iterator[tuple[str, list[str]]]:
    """(language, lines) of each fenced code block."""
    language, lines = None, []
    for line in text.splitlines():
        if FENCE.match(line):
            if language is None:
                language, lines = line.strip().strip("`~").strip().lower(), []
            else:
                yield language, lines
                language = None
        elif language is not None:
            lines.append(line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path.read_text()):
        if m := HEADING.match(line):
            base = slug(m.group(2))
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def relative_links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose_lines(path.read_text()):
        for target in LINK.findall(re.sub(r"`[^`]*`(?!\])", "``", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not files
                yield number, target


def broken_link(path: Path, target: str) -> Optional[str]:
    name, _, anchor = target.partition("#")
    file = (path.parent / name).resolve() if name else path
    if not file.exists():
        return "no such file"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"no heading with the anchor #{anchor} in {file.relative_to(REPO)}"
    return None


# ---- paths in docstrings and comments -------------------------------------------------------------------------


def repo_files() -> list[Path]:
    """The repository's own files: those at the top and in FOLDERS (no virtual environment, data or runs)."""
    found = [p for p in REPO.iterdir() if p.is_file()]
    found += [p for f in FOLDERS for p in (REPO / f).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted(found)


def notes_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of what a reader takes as prose about the code: a Python file's comments and docstrings
    (strings that stand alone as statements), every line of a shell script, YAML or a markdown page outside docs/."""
    text = path.read_text()
    if path.suffix != ".py":
        yield from enumerate(text.splitlines(), 1)
        return
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    alone = (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)
    for before, token in zip([None, *tokens], tokens):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
        elif token.type == tokenize.STRING and (before is None or before.type in alone):
            yield from enumerate(token.string.splitlines(), token.start[0])


def missing_paths(path: Path, basenames: set[str]) -> Iterator[str]:
    for number, line in notes_of(path):
        for named in REPO_PATH.findall(line):
            if not (any(REPO.glob(named)) if "*" in named else (REPO / named).exists()):
                yield f"{path.relative_to(REPO)}:{number}: {named}"
        for named in BARE_FILE.findall(line):
            if named not in basenames and named not in NOT_OURS:
                yield f"{path.relative_to(REPO)}:{number}: {named} (no file of that name in the repository)"


# ---- commands --------------------------------------------------------------------------------------------------


def strip_comment(line: str) -> str:
    """The line without its shell comment: a # at the start or after a space, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def shell_commands(markdown: str) -> Iterator[list[str]]:
    """The words of each command in the file's bash blocks (continued lines joined, split at && ; |)."""
    for language, lines in code_blocks(markdown):
        if language not in ("bash", "sh", "shell", "console"):
            continue
        text = "\n".join(strip_comment(line) for line in lines).replace("\\\n", " ")
        for line in text.splitlines():
            lexer = shlex.shlex(line.strip().removeprefix("$ "), posix=True, punctuation_chars=";&|")
            lexer.whitespace_split, lexer.commenters = True, ""
            words: list[str] = []
            for word in lexer:
                if word in ("&&", "||", ";", "|", "&"):
                    yield words
                    words = []
                else:
                    words.append(word.strip("[]"))
            yield words


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", (REPO / "Makefile").read_text(), re.M))


def train_settings() -> set[str]:
    """TrainConfig's field names, read from its source (importing it would import torch)."""
    tree = ast.parse((REPO / "pilegpt" / "train" / "config.py").read_text())
    config = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "TrainConfig")
    return {n.target.id for n in config.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def module_file(name: str) -> Optional[Path]:
    for candidate in (REPO / (name.replace(".", "/") + ".py"), REPO / name.replace(".", "/") / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def sources_of(script: Path) -> str:
    """The script's source and that of the repo modules it imports: where its argparse flags are written."""
    text = script.read_text()
    found = [text]
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found += [file.read_text() for name in names if (file := module_file(name)) and name.startswith("pilegpt")]
    return "\n".join(found)


def command_problems(words: list[str]) -> list[str]:
    """What in one command does not exist: a script, module, config file, make target or flag it names."""
    if not words:
        return []
    if words[0] == "make":
        return [f"make {t}: no such target in the Makefile" for t in words[1:]
                if not t.startswith("-") and "=" not in t and t not in make_targets()]
    problems, script = [], None
    for i, word in enumerate(words):
        if i and words[i - 1] == "-m" and words[0].startswith("python"):
            if word not in OTHER_MODULES and not module_file(word):
                problems.append(f"python -m {word}: no such module")
        elif PATH.fullmatch(word) and ("/" not in word or (REPO / word.split("/")[0]).is_dir()):
            if not (REPO / word).is_file():
                problems.append(f"{word}: no such file")
            elif word.endswith(".py") and not word.startswith("config/") and script is None:
                script = REPO / word
        elif script and word.startswith("--") and len(word) > 2:
            flag = word.split("=")[0]
            if script.name == "train.py":
                if flag[2:] not in train_settings() | {"help"}:
                    problems.append(f"train.py {flag}: not a TrainConfig setting")
            elif script.name == "plan.py" and "=" in word and flag[2:] in train_settings():
                pass  # plan.py takes train.py's --key=value settings beside its own options
            elif f'"{flag}"' not in sources_of(script):
                problems.append(f"{script.relative_to(REPO)} {flag}: no such option in its argparse")
    return problems


# ---- the module table -------------------------------------------------------------------------------------------


def modules() -> list[Path]:
    """model.py and every module of pilegpt/ but the packages' __init__.py, as the table lists them."""
    found = [REPO / "model.py", *(p for p in (REPO / "pilegpt").rglob("*.py")
                                  if p.name != "__init__.py" and "__pycache__" not in p.parts)]
    order = list(GROUPS)
    return sorted(found, key=lambda p: (order.index(folder(p)) if folder(p) in order else len(order), folder(p),
                                        p.name))


def folder(module: Path) -> str:
    """The module's folder relative to the repository: "" for model.py, "pilegpt/train" for its parts."""
    where = module.parent.relative_to(REPO).as_posix()
    return "" if where == "." else where


def summary(module: Path) -> str:
    """The first sentence of the module's docstring (its first paragraph's lines joined)."""
    doc = ast.get_docstring(ast.parse(module.read_text())) or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    end = SENTENCE_END.search(paragraph)
    return paragraph[: end.end()] if end else paragraph


def module_table() -> str:
    rows = ["| module | what it is (the first sentence of its docstring) |", "|---|---|"]
    group = None
    for module in modules():
        if folder(module) != group:
            group = folder(module)
            where = f"`{group}/`: " if group else ""
            rows.append(f"| **{where}{GROUPS.get(group, group)}** | |")
        name = module.relative_to(REPO).as_posix()
        text = summary(module).replace("|", "\\|") or "(no docstring)"
        rows.append(f"| [`{name}`](../{name}) | {text} |")
    return "\n".join(rows)


def layout_parts() -> tuple[str, str, str]:
    """docs/layout.md as (before the table, the table, after it)."""
    text = LAYOUT.read_text()
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"{LAYOUT}: the markers {TABLE_START!r} ... {TABLE_END!r} are missing")
    start = text.index("\n", start) + 1
    return text[:start], text[start:end].strip("\n"), text[end:]


def write_layout() -> None:
    before, _, after = layout_parts()
    LAYOUT.write_text(f"{before}{module_table()}\n{after}")


# ---- the tests ----------------------------------------------------------------------------------------------


def test_every_relative_link_and_anchor_resolves():
    broken = [f"{path.relative_to(REPO)}:{number}: ({target}) {why}" for path in LINKED if path.is_file()
              for number, target in relative_links(path) if (why := broken_link(path, target))]
    assert not broken, "\n".join(broken)


def test_every_command_readme_names_exists():
    commands = list(shell_commands(README.read_text()))
    assert any(words[:2] == ["make", "test"] for words in commands), "README must name the test command: make test"
    problems = [f"README.md: {' '.join(words)}: {p}" for words in commands for p in command_problems(words)]
    assert not problems, "\n".join(problems)


def test_every_command_in_the_docs_names_existing_scripts_and_flags():
    problems = [f"{page.relative_to(REPO)}: {' '.join(words)}: {p}" for page in PAGES
                for words in shell_commands(page.read_text()) for p in command_problems(words)]
    assert not problems, "\n".join(problems)


def test_every_test_function_the_docs_name_exists():
    defined = {m for p in (REPO / "tests").rglob("*.py")
               for m in re.findall(r"^\s*(?:async\s+)?def (test_\w+)", p.read_text(), re.M)}
    missing = [f"{page.relative_to(REPO)}:{number}: {name}" for page in [README, *PAGES]
               for number, line in enumerate(page.read_text().splitlines(), 1)
               for name in TEST_NAME.findall(line) if name not in defined]
    assert not missing, "no such test function under tests/:\n" + "\n".join(missing)


def test_every_repository_path_a_docstring_or_comment_names_exists():
    files = repo_files()
    basenames = {p.name for p in files}
    prose = [p for p in files if p.suffix in (".py", ".sh", ".sbatch", ".yaml")
             or (p.suffix == ".md" and p.parent not in (REPO, REPO / "docs"))]  # README, CHANGELOG, docs/: links
    missing = [problem for p in prose for problem in missing_paths(p, basenames)]
    assert not missing, "no such file in the repository (moved or renamed?):\n" + "\n".join(missing)


def test_every_row_of_what_survives_what_names_its_test_and_the_count_is_right():
    text = (REPO / "docs" / "robustness.md").read_text()
    rows = [line for _, line in prose_lines(text)
            if line.startswith("| ") and not line.startswith("| fault or bad input |")]
    assert rows and all(TEST_NAME.search(row.split(" | ")[-1]) for row in rows), \
        [row[:80] for row in rows if not TEST_NAME.search(row.split(" | ")[-1])]
    counted = re.search(r"Counted over the (\d+) rows", text)
    assert counted and int(counted.group(1)) == len(rows), f"the counts line should say {len(rows)} rows"


def test_the_module_table_is_the_modules_own_docstrings():
    _, table, _ = layout_parts()
    expected = module_table()
    if table != expected:
        print(expected)
    assert table == expected, ("docs/layout.md's module table differs from the modules: run "
                               f"`python tests/unit/test_docs.py --write-layout`, or paste this table:\n\n{expected}\n")
    assert "(no docstring)" not in expected, "every module needs a docstring"


def test_the_step_on_one_page_is_plain_loop_pys_own_lines():
    source = STEP_SOURCE.read_text().splitlines()
    start = next(i for i, line in enumerate(source) if line.strip().startswith(STEP_START))
    end = next(i for i, line in enumerate(source) if line.strip().startswith(STEP_END))
    step = textwrap.dedent("\n".join(source[start + 1:end]))
    section = STEP_PAGE.read_text().split("## The training step on one page", 1)[1].split("\n## ", 1)[0]
    shown = next(lines for lang, lines in code_blocks(section) if lang == "python")
    assert "\n".join(shown) == step, (f"{STEP_PAGE.relative_to(REPO)}'s step differs from the lines between the "
                                     f"rulers of {STEP_SOURCE.relative_to(REPO)}: paste them:\n\n{step}\n")


def test_readme_fits_on_a_few_screens():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_readmes_sentences_are_short():
    words, sentences = words_and_sentences(README.read_text())
    assert sentences and words / sentences <= README_MAX_WORDS_PER_SENTENCE, (
        f"README.md: {words} words in {sentences} sentences, {words / max(sentences, 1):.1f} a sentence (at most "
        f"{README_MAX_WORDS_PER_SENTENCE}): split the long ones")


def test_words_and_sentences_counts_prose_only():
    text = textwrap.dedent("""\
        # A heading is not counted.

        One two three, e.g. four. Five [six](docs/x.md#seven) seven!
        - a list item without an end mark
        1. Numbered, with one.

        ```bash
        make test   # code is not prose.
        ```

        | a table | is not prose. |
        """)
    # by hand: "One two three, e.g. four." 5, "Five six seven!" 3 (the link's text, not its target), the item 7
    # and no end mark, "Numbered, with one." 3: 18 words; the ends are "four." "seven!" "one.", not "e.g."
    assert words_and_sentences(text) == (18, 3)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-layout", action="store_true", help="rewrite docs/layout.md's module table")
    args = parser.parse_args(argv)
    if not args.write_layout:
        parser.print_help()
        return 2
    write_layout()
    print(f"wrote the module table of {LAYOUT.relative_to(REPO)} ({len(modules())} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
