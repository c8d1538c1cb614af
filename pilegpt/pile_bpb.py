"""Pile bits per byte as lm-evaluation-harness computes it for its pile_* tasks: each document scored on its own in
rolling windows of the model's block_size (the first predicted from <|endoftext|>), bpb = -sum loglik / ln 2 /
sum UTF-8 bytes, per component (meta.pile_set_name) and overall; the documents from a local Pile-format file or the
official val/test file, downloaded once. Details: docs/evaluation.md#pile-bits-per-byte."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F

from pilegpt.common import UserError, download_once
from pilegpt.model_contract import context_length
from pilegpt.zstd_reader import ZSTD_MAGIC, ZstdReader

MIRROR = "https://huggingface.co/datasets/monology/pile-uncopyrighted/resolve/main"
SPLITS = ("val", "test")
MIN_DOCUMENTS = 100_000  # a sanity floor for a download: the Pile's val and test files hold about 215,000 each
POOL = 64  # batches of windows sorted by length together, so a batch pads short first windows little
CACHE_DIR = Path(os.environ.get("PILE_GPT_CACHE", Path.home() / ".cache" / "pile-gpt")) / "pile"
# Published Pile test-set BPB (model, bpb, source); Gao et al. 2020 give these for untuned models.
PAPER = "Gao et al. 2020, The Pile (arXiv 2101.00027): test-set BPB of GPT-2 and GPT-3, untuned"
ANCHORS = [("OpenAI GPT-2 124M", 1.2253, PAPER), ("OpenAI GPT-2 355M", 1.0928, PAPER),
           ("OpenAI GPT-2 774M", 1.0828, PAPER), ("OpenAI GPT-2 1.5B", 1.0468, PAPER),
           ("OpenAI GPT-3 Ada", 0.9631, PAPER), ("OpenAI GPT-3 Babbage", 0.8718, PAPER),
           ("OpenAI GPT-3 Curie", 0.7980, PAPER), ("OpenAI GPT-3 Davinci", 0.7177, PAPER)]
# The same paper's Table 2 per component, for four of its eight columns (the smallest and largest GPT-2 and GPT-3):
# test-set BPB of the untuned models, rows by the component's name as the paper writes it. A run's components are
# matched by letters and digits alone (component_key: "StackExchange" is the paper's "Stack Exchange").
COMPONENT_MODELS = ("GPT-2 small", "GPT-2 XL", "GPT-3 Ada", "GPT-3 Davinci")
COMPONENT_ANCHORS = {
    "Pile-CC": (1.0878, 0.9355, 0.9212, 0.7070), "PubMed Central": (1.0759, 0.9044, 0.8633, 0.6544),
    "Books3": (1.1959, 1.0287, 0.9778, 0.7052), "OpenWebText2": (1.1111, 0.9171, 0.8727, 0.6242),
    "ArXiv": (1.3548, 1.1381, 1.0304, 0.7702), "Github": (1.7912, 1.6486, 0.8761, 0.5635),
    "FreeLaw": (1.0512, 0.8747, 0.8226, 0.6006), "Stack Exchange": (1.2981, 1.0504, 1.0096, 0.7321),
    "USPTO Backgrounds": (0.8288, 0.6969, 0.6799, 0.5280), "PubMed Abstracts": (0.9524, 0.7810, 0.8130, 0.6201),
    "Gutenberg (PG-19)": (1.2655, 1.0829, 0.9776, 0.7115), "OpenSubtitles": (1.2465, 1.1129, 1.1116, 0.9130),
    "Wikipedia (en)": (1.1285, 0.9655, 0.8757, 0.5953), "DM Mathematics": (2.6911, 2.4377, 2.3249, 2.0228),
    "Ubuntu IRC": (1.8466, 1.6024, 1.3139, 0.9915), "BookCorpus2": (1.1295, 0.9783, 0.9754, 0.7788),
    "EuroParl": (2.3177, 1.7650, 1.0475, 0.7519), "HackerNews": (1.4433, 1.3361, 1.1736, 0.9457),
    "YoutubeSubtitles": (2.0387, 1.6694, 1.3407, 0.9469), "PhilPapers": (1.3203, 1.1327, 1.0362, 0.8059),
    "NIH ExPorter": (0.9099, 0.7694, 0.7974, 0.6239), "Enron Emails": (1.5888, 1.4222, 1.2634, 1.0201),
}


def component_key(name: str) -> str:
    """A component's name by its letters and digits, lower case: the paper's "Stack Exchange" is the data's
    "StackExchange"."""
    return "".join(c for c in name.lower() if c.isalnum())


def component_anchors(name: str) -> Optional[tuple[float, ...]]:
    """The paper's figures (COMPONENT_MODELS' order) for a component of the Pile, or None for any other name."""
    return {component_key(k): v for k, v in COMPONENT_ANCHORS.items()}.get(component_key(name))


class Document(NamedTuple):
    ind: int  # the document's index in the data (0-based, files in name order)
    component: str  # meta.pile_set_name
    text: str


def parse(line: bytes, where: str, ind: int) -> Document:
    """One line of a Pile-format file ({"text": ..., "meta": {"pile_set_name": ...}}); a UserError naming `where`
    (file:line) when it is not one."""
    try:
        record = json.loads(line)
    except ValueError as e:
        raise UserError(f"{where}: not a JSON object ({e}); each line of a Pile file is one document") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise UserError(f"{where}: no text field 'text'; each line of a Pile file is a JSON object "
                        '{"text": ..., "meta": {"pile_set_name": ...}}')
    meta = record.get("meta")
    name = meta.get("pile_set_name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise UserError(f"{where}: no component name meta.pile_set_name; Pile BPB is reported per component")
    for field, value in (("text", record["text"]), ("meta.pile_set_name", name)):
        try:
            value.encode("utf-8")  # a JSON "\ud800" escape (a lone surrogate) is no character: it has no bytes
        except UnicodeEncodeError as e:
            raise UserError(f"{where}: the {field} holds a lone surrogate ({value[e.start]!r} at character "
                            f"{e.start + 1}), which is not Unicode text and has no UTF-8 bytes to score; fix or "
                            "remove that line") from None
    return Document(ind, name, record["text"])


def data_files(data: str) -> list[Path]:
    """The .jsonl / .jsonl.zst files of --data: the file itself, or a folder's, in name order."""
    path = Path(data)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith((".jsonl", ".jsonl.zst")))
        if not files:
            raise UserError(f"--data {data}: the folder holds no .jsonl or .jsonl.zst file; pass the Pile's "
                            "val.jsonl.zst or test.jsonl.zst")
        return files
    if not path.is_file():
        raise UserError(f"--data {data}: no such file or folder; pass the Pile's val.jsonl.zst or test.jsonl.zst")
    return [path]


def read_lines(path: Path) -> Iterator[bytes]:
    """The lines of a JSON lines file, zstd-compressed or not (told by its first bytes), without their \\n; a cut-off
    zstd file is a UserError."""
    import zstandard

    try:
        with open(path, "rb") as raw:
            f = ZstdReader(raw) if raw.peek(4)[:4] == ZSTD_MAGIC else raw
            rest = b""
            while chunk := f.read(1 << 20):
                lines = (rest + chunk).split(b"\n")  # JSON lines end at \n only (U+2028 may sit inside a string)
                rest = lines.pop()
                yield from lines
            if rest:
                yield rest
    except (OSError, zstandard.ZstdError) as e:
        raise UserError(f"cannot read {path} ({e}); the file is damaged or cut off: copy or download it "
                        "again") from None


def read_documents(files: list[Path], limit: Optional[int] = None, keep=lambda ind: True) -> Iterator[Document]:
    """The documents of `files` in order (blank lines skipped), the first `limit`; `keep(ind)` False: the line is
    counted but not parsed (another process scores it)."""
    ind = 0
    for path in files:
        for i, line in enumerate(read_lines(path)):
            if limit is not None and ind >= limit:
                return
            if not line.strip():
                continue
            if keep(ind):
                yield parse(line, f"{path}:{i + 1}", ind)
            ind += 1


def download(split: str, url: Optional[str] = None, cache_dir: Optional[Path] = None) -> Path:
    """The official `split` file (val or test) in the cache, downloaded on first use and checked (every line a
    document, at least MIN_DOCUMENTS of them) before it is kept (common.download_once)."""
    url, cache_dir = url or f"{MIRROR}/{split}.jsonl.zst", cache_dir or CACHE_DIR

    def check(tmp: str) -> None:
        n = sum(1 for _ in read_documents([Path(tmp)]))
        if n < MIN_DOCUMENTS:
            raise UserError(f"the download from {url} holds {n:,} documents, fewer than {MIN_DOCUMENTS:,}: not the "
                            f"Pile's {split} set (nothing kept); pass a local copy with --data FILE")

    return download_once(url, cache_dir / f"{split}.jsonl.zst", f"the Pile's {split} set", check)


def encode(enc, text: str) -> list[int]:
    """The document's tokens as lm-eval's Hugging Face GPT-2 tokenizer gives them: a literal "<|endoftext|>" in the
    text becomes that token, as the harness's tokenizer splits on its special tokens."""
    return enc.encode(text, allowed_special=enc.special_tokens_set)


class Window(NamedTuple):
    start: int  # the first input token, in the document's [<|endoftext|>] + tokens
    length: int  # input tokens: length <= block_size
    scored: int  # the last `scored` positions are scored (each predicts the token after it)


def rolling_windows(n_tokens: int, block_size: int) -> list[Window]:
    """lm-eval's get_rolling_token_windows(context_len=1) after make_disjoint_window, on [eot] + tokens: the first
    window predicts the first min(T, n) tokens from <|endoftext|> on; each next one predicts the next up to T tokens
    from the T tokens before each (a full window ending at the last token it predicts)."""
    first = min(block_size, n_tokens)
    windows = [Window(0, first, first)] if n_tokens else []
    done = first
    while done < n_tokens:
        scored = min(n_tokens - done, block_size)
        end = done + scored  # in [eot] + tokens, the last predicted token sits at index `end`
        windows.append(Window(end - block_size, block_size, scored))
        done = end
    return windows


class Scored(NamedTuple):
    ind: int
    component: str
    bytes: int  # UTF-8 bytes of the text
    tokens: int
    loglik: float  # natural log-likelihood of all the document's tokens (lm-eval's loglikelihood_rolling)

    @property
    def bits(self) -> float:
        return -self.loglik / math.log(2)


class Batch(NamedTuple):
    idx: torch.Tensor  # (B, T) input tokens, right-padded
    targets: torch.Tensor  # (B, T) the token each position predicts, -1 where it is not scored
    owner: list[int]  # the position in the pool of the document each row belongs to


def make_batches(streams: list[np.ndarray], block_size: int, batch_size: int) -> list[Batch]:
    """The rolling windows of these documents ([eot] + tokens each), sorted by length (less padding) and cut into
    batches of batch_size rows."""
    rows = [(owner, w) for owner, s in enumerate(streams) for w in rolling_windows(len(s) - 1, block_size)]
    rows.sort(key=lambda r: r[1].length)
    batches = []
    for i in range(0, len(rows), batch_size):
        part = rows[i:i + batch_size]
        T = max(w.length for _, w in part)
        idx = np.zeros((len(part), T), dtype=np.int64)
        targets = np.full((len(part), T), -1, dtype=np.int64)
        for r, (owner, w) in enumerate(part):
            s = streams[owner]
            idx[r, :w.length] = s[w.start:w.start + w.length]
            first = w.length - w.scored  # the first scored position
            targets[r, first:w.length] = s[w.start + first + 1:w.start + w.length + 1]
        batches.append(Batch(torch.from_numpy(idx), torch.from_numpy(targets), [owner for owner, _ in part]))
    return batches


@torch.no_grad()
def window_logliks(model, batch: Batch, device: torch.device, autocast_dtype=None) -> torch.Tensor:
    """(B,) float64: each row's summed log-likelihood of its scored tokens, in one forward pass. Rows are
    right-padded: causal attention never looks right, so padding changes no score."""
    idx, targets = batch.idx.to(device, non_blocking=True), batch.targets.to(device, non_blocking=True)
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits, _ = model(idx, targets)  # with targets, every position's logits: (B, T, V)
    losses = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1, reduction="none")
    return -losses.view(targets.shape).double().sum(dim=1).cpu()


def score_pool(model, docs: list[Document], enc, device, batch_size: int, autocast_dtype=None) -> list[Scored]:
    """Score these documents: their windows in batches of batch_size rows, the log-likelihoods summed per document."""
    block_size = context_length(model)
    if block_size is None:
        raise UserError(f"{type(model).__name__} states no block_size (nor config.block_size): Pile BPB's windows "
                        "are the model's context, so give the model a block_size attribute")
    eot = enc.eot_token
    streams = [np.array([eot] + encode(enc, d.text), dtype=np.int64) for d in docs]
    totals = torch.zeros(len(docs), dtype=torch.float64)
    for batch in make_batches(streams, block_size, batch_size):
        totals.index_add_(0, torch.tensor(batch.owner), window_logliks(model, batch, device, autocast_dtype))
    return [Scored(d.ind, d.component, len(d.text.encode("utf-8")), len(s) - 1, float(t))
            for d, s, t in zip(docs, streams, totals)]


def evaluate(model, docs, enc, device: torch.device, batch_size: int = 16, autocast_dtype=None,
             progress=None) -> list[Scored]:
    """Score an iterable of documents, POOL x batch_size windows' worth at a time (about: a pool closes once its
    documents have that many windows)."""
    block_size = context_length(model) or 1
    scored, pool, windows = [], [], 0
    for doc in docs:
        pool.append(doc)
        windows += max(1, math.ceil(len(doc.text) / 2 / block_size))  # a guess (~2 characters a token) to size pools
        if windows >= POOL * batch_size:
            scored += score_pool(model, pool, enc, device, batch_size, autocast_dtype)
            if progress is not None:
                progress.update(len(pool))
            pool, windows = [], 0
    if pool:
        scored += score_pool(model, pool, enc, device, batch_size, autocast_dtype)
        if progress is not None:
            progress.update(len(pool))
    return scored


def bits_per_byte(bits: float, n_bytes: int) -> Optional[float]:
    """bits / bytes; None (no figure, not a perfect 0.0) where there are no bytes: documents all empty."""
    return bits / n_bytes if n_bytes else None


def summarize(scored: list[Scored]) -> dict:
    """The results: bpb per component and overall (all documents' bits over all their bytes), and their counts; a
    bpb of None where every document is empty."""
    components: dict[str, dict] = {}
    for s in sorted(scored, key=lambda s: s.ind):
        c = components.setdefault(s.component, {"bits": 0.0, "documents": 0, "bytes": 0, "tokens": 0})
        c["bits"] += s.bits
        c["documents"] += 1
        c["bytes"] += s.bytes
        c["tokens"] += s.tokens
    out = {name: {"bpb": bits_per_byte(c["bits"], c["bytes"]), "documents": c["documents"], "bytes": c["bytes"],
                  "tokens": c["tokens"]} for name, c in sorted(components.items())}
    total_bytes = sum(c["bytes"] for c in components.values())
    return {"task": "pile", "bpb": bits_per_byte(sum(c["bits"] for c in components.values()), total_bytes),
            "overall": "all documents' bits over all their bytes (not a mean of the components)",
            "documents": len(scored), "bytes": total_bytes, "tokens": sum(c["tokens"] for c in components.values()),
            "components": out}
