"""HellaSwag: the examples (the official val set, downloaded once and validated, or a local .jsonl) and the
completion-style scoring of karpathy/build-nanogpt and llm.c, so that OpenAI GPT-2 124M's 28.59 (acc) and
29.55 (acc_norm) are the numbers to compare with. Details: docs/evaluation.md."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from pilegpt.common import UserError, download_once
from pilegpt.model_contract import context_length

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
VAL_EXAMPLES = 10_042  # lines of the official hellaswag_val.jsonl
ENDINGS = 4
# Published HellaSwag val figures to compare with (model, acc %, acc_norm %, source); docs/evaluation.md cites them.
ANCHORS = [
    ("OpenAI GPT-2 124M, this scoring", 28.59, 29.55, "karpathy/build-nanogpt, karpathy/llm.c"),
    ("OpenAI GPT-2 124M, lm-evaluation-harness", 28.92, 31.14, "EleutherAI/lm-evaluation-harness"),
]
CACHE_DIR = Path(os.environ.get("PILE_GPT_CACHE", Path.home() / ".cache" / "pile-gpt")) / "hellaswag"


class Example(NamedTuple):
    ind: int  # the example's index in its file (0-based line order)
    ctx: str
    endings: list[str]  # 4 candidate endings
    label: int  # the index of the right ending


def parse(line: str, where: str, ind: int) -> Example:
    """One line of a HellaSwag jsonl file; a UserError naming `where` (file:line) when it is not one."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise UserError(f"{where}: not a JSON object ({e}); each line of a HellaSwag file is one example") from None
    if not isinstance(record, dict):
        raise UserError(f"{where}: not a JSON object; each line of a HellaSwag file is one example")
    ctx, endings, label = record.get("ctx"), record.get("endings"), record.get("label")
    if not isinstance(ctx, str):
        raise UserError(f"{where}: no text field 'ctx' (the context)")
    if not (isinstance(endings, list) and len(endings) == ENDINGS and all(isinstance(e, str) for e in endings)):
        raise UserError(f"{where}: 'endings' must be a list of {ENDINGS} strings")
    if isinstance(label, str) and label.isascii() and label.isdigit():  # not "²": isdigit() alone accepts it
        label = int(label)
    if not (isinstance(label, int) and not isinstance(label, bool) and 0 <= label < ENDINGS):
        raise UserError(f"{where}: 'label' must be the index of the right ending, 0 to {ENDINGS - 1}")
    return Example(ind, ctx, endings, label)


def read_examples(path: Path) -> list[Example]:
    """Every example of a local HellaSwag jsonl file, validated line by line."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e}); pass a HellaSwag .jsonl file") from None
    examples: list[Example] = []
    for i, raw in enumerate(data.split(b"\n")):  # JSON lines end at \n only (U+2028 may sit inside a string)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{path}:{i + 1}: not UTF-8 text (byte {e.start + 1} of the line); a HellaSwag file is "
                            "UTF-8 JSON lines") from None
        if line.strip():
            examples.append(parse(line, f"{path}:{i + 1}", len(examples)))
    if not examples:
        raise UserError(f"{path} holds no examples")
    return examples


def download(url: str = URL, cache_dir: Path = CACHE_DIR) -> Path:
    """The official val file in the cache, downloaded on first use and checked (every line an example,
    VAL_EXAMPLES of them) before it is kept (common.download_once)."""
    def check(tmp: str) -> None:
        n = len(read_examples(Path(tmp)))
        if n != VAL_EXAMPLES:
            raise UserError(f"the download from {url} holds {n} examples, not {VAL_EXAMPLES}: not the HellaSwag val "
                            f"set (nothing kept); pass a local copy with --data FILE")

    return download_once(url, cache_dir / "hellaswag_val.jsonl", "HellaSwag", check)


def load_examples(data: Optional[str], url: str = URL, limit: Optional[int] = None) -> list[Example]:
    """The examples of `data` (a local file), else of the official val set (downloaded once); the first `limit`."""
    examples = read_examples(Path(data)) if data else read_examples(download(url))
    return examples[:limit] if limit else examples


class Row(NamedTuple):
    tokens: list[int]  # context + ending, at most block_size
    start: int  # position of the ending's first token in `tokens`


def render(example: Example, enc, block_size: int) -> list[Row]:
    """The 4 token rows of an example: encode(ctx) + encode(" " + ending), cut to its last block_size tokens."""
    ctx = enc.encode_ordinary(example.ctx)
    rows = []
    for ending in example.endings:
        tail = enc.encode_ordinary(" " + ending)
        tokens = (ctx + tail)[-block_size:]
        rows.append(Row(tokens, max(1, len(tokens) - len(tail))))  # token 0 has nothing before it to predict it
    return rows


@torch.no_grad()
def ending_losses(model, batch: list[list[Row]], device: torch.device, autocast_dtype=None) -> torch.Tensor:
    """(E, 4, 2) float64: the summed and the mean cross-entropy of each ending's tokens, for E examples in one
    forward pass. Rows are right-padded: causal attention never looks right, so padding changes no loss."""
    rows = [row for example in batch for row in example]
    T = max(len(r.tokens) for r in rows)
    idx = torch.zeros((len(rows), T), dtype=torch.long)
    targets = torch.full((len(rows), T), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row.tokens)
        idx[i, :n] = torch.tensor(row.tokens)
        targets[i, row.start - 1:n - 1] = idx[i, row.start:n]  # position t predicts token t + 1
    idx, targets = idx.to(device), targets.to(device)
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits, _ = model(idx, targets)  # with targets, every position's logits: (R, T, V)
    losses = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                             reduction="none").view(len(rows), T).double()
    counts = (targets != -1).sum(dim=1).clamp(min=1)
    total = losses.sum(dim=1)
    return torch.stack((total, total / counts), dim=1).view(len(batch), ENDINGS, 2).cpu()


class Prediction(NamedTuple):
    ind: int
    label: int
    pred: int  # the ending with the lowest summed loss (acc)
    pred_norm: int  # the ending with the lowest mean loss (acc_norm)


def evaluate(model, examples: list[Example], enc, device: torch.device, batch_size: int = 8, autocast_dtype=None,
             progress=None) -> list[Prediction]:
    """Score `examples` in batches of batch_size examples (4 x batch_size rows per forward pass)."""
    block_size = context_length(model)
    if block_size is None:
        raise UserError(f"{type(model).__name__} states no block_size (nor config.block_size): HellaSwag's rows are "
                        "cut to the model's context, so give the model a block_size attribute")
    predictions = []
    for i in range(0, len(examples), batch_size):
        part = examples[i:i + batch_size]
        losses = ending_losses(model, [render(e, enc, block_size) for e in part], device, autocast_dtype)
        for example, loss in zip(part, losses):
            predictions.append(Prediction(example.ind, example.label, int(loss[:, 0].argmin()),
                                          int(loss[:, 1].argmin())))
        if progress is not None:
            progress.update(len(part))
    return predictions


def accuracy(predictions: list[Prediction]) -> tuple[float, float]:
    """(acc, acc_norm) of these predictions."""
    n = max(1, len(predictions))
    return (sum(p.pred == p.label for p in predictions) / n, sum(p.pred_norm == p.label for p in predictions) / n)
