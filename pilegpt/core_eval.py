"""CORE, the score of the DCLM paper (DataComp-LM, arXiv 2406.11794) that nanochat's leaderboard ranks by: 22
in-context tasks, each scored as a centered accuracy (acc - baseline) / (1 - baseline), CORE their mean. The data is
DCLM's eval bundle (core.yaml, eval_meta_data.csv, eval_data/*.jsonl; a local folder, or downloaded once), and the
scoring is karpathy/nanochat's nanochat/core_eval.py's, so a figure here sits beside its leaderboard and beside
OpenAI GPT-2's 0.1139 (124M) to 0.2565 (1.5B). Details: docs/evaluation.md#core."""

from __future__ import annotations

import csv
import itertools
import math
import os
import random
import shutil
import zipfile
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

import torch
import torch.nn.functional as F

from pilegpt.common import UserError, download_once
from pilegpt.model_contract import context_length
from pilegpt.tokenizer import EOT_ID

URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"  # nanochat's copy of DCLM's bundle
CACHE_DIR = Path(os.environ.get("PILE_GPT_CACHE", Path.home() / ".cache" / "pile-gpt")) / "core"
KINDS = ("multiple_choice", "schema", "language_modeling")
SHUFFLE_SEED = 1337  # each task's rows shuffled once with Random(1337) before --max-per-task keeps the first N
FEWSHOT_SEED = 1234  # item i's few-shot rows: Random(1234 + i).sample of the other kept rows (nanochat's)
# Published CORE figures to compare with (model, CORE, source); docs/evaluation.md#core cites them.
ANCHORS = [("OpenAI GPT-2 124M", 0.1139, "karpathy/nanochat dev/estimate_gpt3_core.ipynb"),
           ("OpenAI GPT-2 355M", 0.1849, "karpathy/nanochat dev/estimate_gpt3_core.ipynb"),
           ("OpenAI GPT-2 774M", 0.2146, "karpathy/nanochat dev/estimate_gpt3_core.ipynb"),
           ("OpenAI GPT-2 1.5B", 0.256525, "karpathy/nanochat README (the leaderboard's bar)"),
           ("nanochat's record, 8 x H100 in 1.65 h", 0.2626, "karpathy/nanochat README")]
FIELDS = {"multiple_choice": {"query": str, "choices": list, "gold": int},
          "schema": {"context_options": list, "continuation": str, "gold": int},
          "language_modeling": {"context": str, "continuation": str}}


class Task(NamedTuple):
    label: str  # core.yaml's label, eval_meta_data.csv's "Eval Task"
    kind: str  # one of KINDS
    num_fewshot: int
    delimiter: str  # the continuation delimiter (default " ")
    path: Path  # its rows: eval_data/<dataset_uri>
    baseline: float  # the random baseline, a fraction (the csv states percent)


# ----------------------------------------------------------------------------------------------------------
# The bundle: core.yaml, eval_meta_data.csv, eval_data/

def read_bundle(folder: str | os.PathLike, setting: str = "--data") -> list[Task]:
    """The tasks of an unpacked eval bundle, each checked: its type, its few-shot count, its data file (inside
    eval_data/) and its random baseline. A UserError naming the file and the fix for anything missing or damaged."""
    import yaml

    root = Path(folder)
    config_path, meta_path = root / "core.yaml", root / "eval_meta_data.csv"
    for path in (config_path, meta_path, root / "eval_data"):
        if not path.exists():
            raise UserError(f"{setting} {folder}: no {path.name} in it; pass an unpacked DCLM eval bundle (core.yaml, "
                            f"eval_meta_data.csv, eval_data/), e.g. the folder in {URL}")
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(f"{config_path}: not a readable YAML file ({str(e).splitlines()[0]})") from None
    entries = config.get("icl_tasks") if isinstance(config, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{config_path}: no icl_tasks list; a DCLM core.yaml lists its tasks under icl_tasks")
    baselines = read_baselines(meta_path)
    tasks = [task_from(entry, f"{config_path} task {i + 1}", root / "eval_data", baselines)
             for i, entry in enumerate(entries)]
    labels = [t.label for t in tasks]
    if len(set(labels)) != len(labels):
        twice = sorted({x for x in labels if labels.count(x) > 1})
        raise UserError(f"{config_path}: the label {twice[0]} names two tasks; each task's label is its own")
    return tasks


def read_baselines(path: Path) -> dict[str, float]:
    """eval_meta_data.csv's random baseline of each task ("Eval Task" -> "Random baseline", percent) as a fraction."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"{path}: not a readable CSV file ({e})") from None
    baselines = {}
    for line, row in enumerate(rows, start=2):
        name, value = row.get("Eval Task"), row.get("Random baseline")
        if name is None or value is None:
            raise UserError(f"{path}: no 'Eval Task' and 'Random baseline' columns; pass the bundle's own csv")
        try:
            percent = float(value)
        except ValueError:
            percent = math.nan
        if not 0 <= percent < 100:
            raise UserError(f"{path}:{line}: the random baseline of {name} is {value!r}, not a percentage from 0 to "
                            "below 100")
        baselines[name] = percent / 100
    return baselines


def task_from(entry, where: str, data_dir: Path, baselines: dict[str, float]) -> Task:
    """One core.yaml entry as a Task; its dataset_uri must name a file inside eval_data/ (never outside it)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("label"), str):
        raise UserError(f"{where}: no label; each icl_tasks entry names its label, dataset_uri, num_fewshot and "
                        "icl_task_type")
    label, kind, uri = entry["label"], entry.get("icl_task_type"), entry.get("dataset_uri")
    shots = entry.get("num_fewshot", [0])
    shots = shots[0] if isinstance(shots, list) and shots else shots
    delimiter = entry.get("continuation_delimiter", " ")
    if kind not in KINDS:
        raise UserError(f"{where} ({label}): icl_task_type {kind!r} is not one of {', '.join(KINDS)}")
    if not (isinstance(shots, int) and not isinstance(shots, bool) and shots >= 0):
        raise UserError(f"{where} ({label}): num_fewshot {entry.get('num_fewshot')!r} is not a count (e.g. [10])")
    if not isinstance(delimiter, str):
        raise UserError(f"{where} ({label}): continuation_delimiter {delimiter!r} is not text")
    if not isinstance(uri, str) or not uri:
        raise UserError(f"{where} ({label}): no dataset_uri (its .jsonl under eval_data/)")
    path = (data_dir / uri).resolve()
    if not path.is_relative_to(data_dir.resolve()):
        raise UserError(f"{where} ({label}): dataset_uri {uri} points outside {data_dir}; a task's data stays in "
                        "the bundle's eval_data/")
    if not path.is_file():
        raise UserError(f"{where} ({label}): its data file {data_dir / uri} does not exist; unpack the whole bundle")
    if label not in baselines:
        raise UserError(f"{where} ({label}): eval_meta_data.csv states no random baseline for it")
    return Task(label, kind, shots, delimiter, path, baselines[label])


def read_rows(task: Task) -> list[dict]:
    """Every row of a task's .jsonl, each checked for the fields its type needs; a damaged one is file:line."""
    import json

    try:
        data = task.path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {task.path} ({e.strerror or e})") from None
    rows = []
    for i, raw in enumerate(data.split(b"\n")):
        if raw.strip():
            where = f"{task.path}:{i + 1}"
            try:
                row = json.loads(raw)
            except ValueError as e:
                raise UserError(f"{where}: not a JSON object ({e}); each line of a task's file is one row") from None
            rows.append(check_row(row, task.kind, where))
    if not rows:
        raise UserError(f"{task.path} holds no rows ({task.label})")
    return rows


def check_row(row, kind: str, where: str) -> dict:
    """`row` if it holds the fields of a `kind` row (lists of text, a gold index inside them); else a UserError."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: not a JSON object; each line of a task's file is one row")
    for name, typ in FIELDS[kind].items():
        value = row.get(name)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise UserError(f"{where}: a {kind} row needs {name} ({typ.__name__}); it has {value!r:.60}")
        if typ is list and (len(value) < 2 or not all(isinstance(v, str) for v in value)):
            raise UserError(f"{where}: {name} must be a list of two or more strings")
    options = row.get("choices", row.get("context_options"))
    if "gold" in FIELDS[kind] and not 0 <= row["gold"] < len(options):
        raise UserError(f"{where}: gold {row['gold']} is not the index of one of its {len(options)} options")
    empty = nothing_to_score(row, kind)
    if empty:
        raise UserError(f"{where}: {empty}, which leaves nothing of the row to score; fix or drop the row")
    return row


def nothing_to_score(row: dict, kind: str) -> Optional[str]:
    """Why a checked row would be scored on none of its own text, or None: an empty continuation (language
    modelling would score the delimiter alone, or nothing, and count the row wrong; schema the delimiter shared by
    every option), an empty choice (its row scores nothing, so it is never picked), or options that are all one
    text (nothing tells them apart: the first would win every time)."""
    if kind in ("language_modeling", "schema") and row["continuation"] == "":
        return "its continuation is empty"
    options = row.get("choices", row.get("context_options"))
    if kind == "multiple_choice" and "" in options:
        return f"choice {options.index('')} is empty"
    if options is not None and len(set(options)) == 1:
        return f"its {len(options)} {'choices' if kind == 'multiple_choice' else 'context_options'} are one text"
    return None


def download(url: str = URL, cache_dir: Path = CACHE_DIR) -> Path:
    """The eval bundle unpacked in the cache (cache_dir/eval_bundle), downloaded once; the zip is checked (every
    member inside the folder, core.yaml readable) and unpacked under a temporary name, then renamed into place."""
    folder = cache_dir / "eval_bundle"
    if (folder / "core.yaml").is_file():
        return folder

    def check(tmp: str) -> None:
        try:
            with zipfile.ZipFile(tmp) as z:
                names = z.namelist()
        except zipfile.BadZipFile:
            raise UserError(f"the download from {url} is not a zip file (nothing kept); pass an unpacked bundle "
                            "with --data DIR") from None
        if "eval_bundle/core.yaml" not in names:
            raise UserError(f"the download from {url} holds no eval_bundle/core.yaml: not DCLM's eval bundle")

    if folder.exists():
        raise UserError(f"{folder} holds no core.yaml: not an unpacked bundle; move it away, or pass a bundle with "
                        "--data DIR")
    archive = download_once(url, cache_dir / "eval_bundle.zip", "the CORE eval bundle", check,
                            local="the unpacked bundle (core.yaml, eval_meta_data.csv, eval_data/) with --data DIR")
    unpack(archive, folder)
    archive.unlink()
    return folder


def unpack(archive: Path, folder: Path) -> None:
    """The zip's eval_bundle/ as `folder`: members are written one by one under a temporary folder beside it (a
    name that would land outside it is refused), which is checked (read_bundle), then renamed into place; on any
    error the temporary folder is removed."""
    base = folder.with_name(f".{folder.name}.tmp{os.getpid()}").resolve()
    try:
        with zipfile.ZipFile(archive) as z:
            extract(z, archive, base)
        read_bundle(base)
        os.rename(base, folder)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def extract(z: zipfile.ZipFile, archive: Path, base: Path) -> None:
    """The members under the zip's eval_bundle/ written under `base`, that prefix dropped; one whose name would
    land outside `base` is refused, the others (e.g. __MACOSX/) are not needed and skipped."""
    for info in z.infolist():
        if not info.filename.startswith("eval_bundle/"):
            continue
        target = (base / info.filename[len("eval_bundle/"):]).resolve()
        if not target.is_relative_to(base):
            raise UserError(f"{archive}: the member {info.filename} would be written outside the bundle's folder; "
                            "delete the file and download again")
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with z.open(info) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)


# ----------------------------------------------------------------------------------------------------------
# Items: the rows kept, their few-shot examples, their prompts and their token rows

def select(rows: list[dict], max_per_task: Optional[int]) -> list[dict]:
    """The rows scored: all of them shuffled with Random(SHUFFLE_SEED), the first max_per_task when given."""
    rows = list(rows)
    random.Random(SHUFFLE_SEED).shuffle(rows)
    return rows[:max_per_task] if max_per_task else rows


def fewshot(rows: list[dict], i: int, k: int) -> list[dict]:
    """Item i's k few-shot examples: Random(FEWSHOT_SEED + i).sample of the other rows' indices."""
    if k == 0:
        return []
    others = [j for j in range(len(rows)) if j != i]
    return [rows[j] for j in random.Random(FEWSHOT_SEED + i).sample(others, k)]


def render(kind: str, item: dict, shots: list[dict], delimiter: str) -> list[str]:
    """The prompts of an item: one per choice (multiple choice: shared question, the choices differ), one per
    context option (schema: the contexts differ, the continuation is shared), or the context without and with its
    continuation (language modelling). Each few-shot example is its solved prompt and a blank line."""
    d = delimiter
    if kind == "multiple_choice":
        head = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}\n\n" for s in shots)
        return [f"{head}{item['query']}{d}{choice}" for choice in item["choices"]]
    if kind == "schema":
        head = "".join(f"{s['context_options'][s['gold']]}{d}{s['continuation']}\n\n" for s in shots)
        return [f"{head}{option}{d}{item['continuation']}" for option in item["context_options"]]
    head = "".join(f"{s['context'].strip()}{d}{s['continuation']}\n\n" for s in shots)
    without = f"{head}{item['context'].strip()}{d}"
    return [without.strip(), without + item["continuation"]]


class Row(NamedTuple):
    tokens: list[int]  # <|endoftext|> + the prompt, at most block_size (its last ones)
    start: int  # the first token of the scored continuation
    end: int  # one past its last


def common_length(seqs: list[list[int]], from_end: bool = False) -> int:
    """The length of the prefix (or suffix) all of `seqs` share."""
    n = min(len(s) for s in seqs)
    for i in range(n):
        at = -1 - i if from_end else i
        if any(s[at] != seqs[0][at] for s in seqs):
            return i
    return n


def token_rows(kind: str, prompts: list[str], enc, block_size: int) -> tuple[list[Row], bool]:
    """The rows to score and whether any was cut: multiple choice scores each row after the prefix they share (at
    least the shortest row's last token),
    schema the suffix they share, language modelling the tokens the continuation adds. A row longer than block_size
    keeps its last block_size tokens (its start moved with it, and never to 0, which nothing predicts)."""
    seqs = [[EOT_ID] + enc.encode_ordinary(p) for p in prompts]
    if kind == "multiple_choice":  # a choice that is a token prefix of another ("blue", "blue sky") shares all of
        # its tokens with it: every row then starts at the shortest one's last token, or that choice scores nothing
        start = min(common_length(seqs), min(len(s) for s in seqs) - 1)
        spans = [(start, len(s)) for s in seqs]
    elif kind == "schema":
        suffix = common_length(seqs, from_end=True)
        spans = [(len(s) - suffix, len(s)) for s in seqs]
    else:  # without is a prefix of with; where BPE merges across the seam, the tokens both share
        spans = [(common_length(seqs), len(seqs[1]))]
        seqs = [seqs[1]]
    rows, cut = [], False
    for s, (start, end) in zip(seqs, spans):
        crop = max(0, len(s) - block_size)
        cut |= crop > 0
        rows.append(Row(s[crop:], max(1, start - crop), end - crop))
    return rows, cut


class Item(NamedTuple):
    task: int  # the task's index in core.yaml
    ind: int  # the row's index among the task's kept rows
    kind: str
    gold: Optional[int]  # multiple choice and schema: the right row
    rows: list[Row]
    cut: bool  # a row was longer than block_size


def items(tasks: list[Task], kept: list[list[dict]], enc, block_size: int, keep=lambda n: True) -> Iterator[Item]:
    """Every kept row of every task as an Item, in order, tokenized as it is reached (the bundle's few-shot prompts
    are never all held at once); keep(n) picks by the item's number over all tasks (a process's share)."""
    n = 0
    for t, (task, rows) in enumerate(zip(tasks, kept)):
        for i, row in enumerate(rows):
            if keep(n):
                prompts = render(task.kind, row, fewshot(rows, i, task.num_fewshot), task.delimiter)
                token_list, cut = token_rows(task.kind, prompts, enc, block_size)
                yield Item(t, i, task.kind, row.get("gold"), token_list, cut)
            n += 1


def load(folder: str | os.PathLike, max_per_task: Optional[int], settings: tuple[str, str] = ("--data",
         "--max-per-task")) -> tuple[list[Task], list[list[dict]]]:
    """(the tasks of the bundle in `folder`, each task's kept rows), every row read and checked; `settings` name the
    folder's and the limit's settings in the refusals (eval.py's flags, or train.py's core_data, core_examples)."""
    tasks = read_bundle(folder, settings[0])
    kept = [select(read_rows(t), max_per_task) for t in tasks]
    check_fewshot(tasks, kept, max_per_task, settings[1])
    return tasks, kept


def check_fewshot(tasks: list[Task], kept: list[list[dict]], max_per_task: Optional[int],
                  setting: str = "--max-per-task") -> None:
    """A UserError for a task with fewer other rows than its few-shot examples need (`setting` kept the rows)."""
    for task, rows in zip(tasks, kept):
        if task.num_fewshot >= len(rows):
            fix = (f"set {setting} to {task.num_fewshot + 1} or more" if max_per_task
                   else f"{task.path} needs more rows")
            raise UserError(f"{task.label} takes {task.num_fewshot} few-shot examples from its other rows, but "
                            f"{len(rows)} row(s) are kept: {fix}")


# ----------------------------------------------------------------------------------------------------------
# Scoring

@torch.no_grad()
def row_scores(model, rows: list[Row], device: torch.device, autocast_dtype=None) -> list[tuple[float, bool]]:
    """(the mean cross-entropy of its continuation, whether greedy decoding predicts every continuation token) of
    each row, in one forward pass. Rows are right-padded: causal attention never looks right."""
    T = max(len(r.tokens) for r in rows)
    idx = torch.full((len(rows), T), EOT_ID, dtype=torch.long)
    targets = torch.full((len(rows), T), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        idx[i, :len(r.tokens)] = torch.tensor(r.tokens)
        targets[i, r.start - 1:r.end - 1] = idx[i, r.start:r.end]  # position t predicts token t + 1
    idx, targets = idx.to(device), targets.to(device)
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits, _ = model(idx, targets)  # with targets, every position's logits: (R, T, V)
    logits = logits.float()
    losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                             reduction="none").view(len(rows), T).double()
    scored = targets != -1
    counts = scored.sum(dim=1)
    means = torch.where(counts > 0, losses.sum(dim=1) / counts.clamp(min=1), torch.full_like(losses[:, 0], math.inf))
    greedy = ((logits.argmax(dim=-1) == targets) | ~scored).all(dim=1) & (counts > 0)
    return list(zip(means.cpu().tolist(), greedy.cpu().tolist()))


class Result(NamedTuple):
    task: int
    ind: int
    correct: bool
    pred: Optional[int]  # multiple choice and schema: the row of the lowest mean loss
    cut: bool


def evaluate(model, stream: Iterator[Item], device: torch.device, batch_size: int = 16, autocast_dtype=None,
             progress=None) -> tuple[list[Result], int]:
    """Score the items of `stream`, batch_size rows a forward pass (an item's rows may span two); (the results, the
    forward passes made)."""
    if context_length(model) is None:
        raise UserError(f"{type(model).__name__} states no block_size (nor config.block_size): CORE's prompts are "
                        "cut to the model's context, so give the model a block_size attribute")
    results, pending, rows, passes = [], [], [], 0
    for item in itertools.chain(stream, [None]):
        if item is not None:
            pending.append(item)
            rows += item.rows
        if rows and (len(rows) >= batch_size or item is None):
            scores = []
            for i in range(0, len(rows), batch_size):
                scores += row_scores(model, rows[i:i + batch_size], device, autocast_dtype)
                passes += 1
            for it in pending:
                mine, scores = scores[:len(it.rows)], scores[len(it.rows):]
                results.append(judge(it, mine))
            if progress is not None:
                progress.update(len(pending))
            pending, rows = [], []
    return results, passes


def idle_passes(model, n: int, device: torch.device, autocast_dtype=None) -> None:
    """n forward passes of one two-token row, whose scores are dropped: with FSDP every rank must make as many
    forward passes as the busiest one."""
    for _ in range(n):
        row_scores(model, [Row([EOT_ID, EOT_ID], 1, 2)], device, autocast_dtype)


def judge(item: Item, scores: list[tuple[float, bool]]) -> Result:
    """An item's result from its rows' scores: language modelling is right when greedy decoding predicts the whole
    continuation; multiple choice and schema when the row of the lowest mean loss is the gold one (the first of
    equal losses)."""
    if item.kind == "language_modeling":
        return Result(item.task, item.ind, bool(scores[0][1]), None, item.cut)
    means = [m for m, _ in scores]
    pred = means.index(min(means))
    return Result(item.task, item.ind, pred == item.gold, pred, item.cut)


def centered(acc: float, baseline: float) -> float:
    """A task's centered accuracy: 0 at its random baseline, 1 when every item is right."""
    return (acc - baseline) / (1 - baseline)


def summarize(tasks: list[Task], results: list[Result]) -> dict:
    """Per task: items, correct, accuracy, centered accuracy; CORE, the mean centered accuracy of all tasks."""
    per = {}
    for t, task in enumerate(tasks):
        mine = [r for r in results if r.task == t]
        acc = sum(r.correct for r in mine) / len(mine) if mine else math.nan
        per[task.label] = {"type": task.kind, "num_fewshot": task.num_fewshot, "n": len(mine),
                           "correct": sum(r.correct for r in mine), "acc": acc, "baseline": task.baseline,
                           "centered": centered(acc, task.baseline), "cut": sum(r.cut for r in mine)}
    core = sum(v["centered"] for v in per.values()) / len(per)
    return {"core": core, "n": len(results), "cut": sum(r.cut for r in results), "tasks": per}
