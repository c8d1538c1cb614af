"""Tokenize The Pile (or any Hugging Face dataset, or local text) with GPT-2 BPE into flat numpy memmap files
train.bin / val.bin.

Usage:
    python prepare_data.py                                  # The Pile from the HF Hub, streamed, into data/pile
    python prepare_data.py --max-tokens 1000000000 --out-dir data/pile_1b     # a 1B-token slice
    python prepare_data.py --exclude-subset "Books3" --exclude-subset "Github"  # drop Pile subsets
    python prepare_data.py --dataset HuggingFaceFW/fineweb --dataset-config sample-10BT --out-dir data/fineweb
    python prepare_data.py --input ~/pile/train/00.jsonl.zst ~/pile/val.jsonl.zst --out-dir data/pile00
    python prepare_data.py --input tests/fixtures/tinyshakespeare.txt --out-dir data/shakespeare
    python prepare_data.py --shard-index 3 --num-shards 8 --out-dir data/pile/part-03   # one of 8 jobs

Output (in --out-dir):
    train.bin, val.bin   every document as tiktoken `encode_ordinary(text) + [EOT]`, concatenated, as a
                         flat array (uint16 for GPT-2): np.memmap("train.bin", dtype=np.uint16, mode="r")
    meta.json            tokenizer, vocab size, EOT id, dtype, token and document counts per split, sources

Sources: `--dataset` takes a Hugging Face Hub dataset name (default: The Pile mirror
monology/pile-uncopyrighted), an fsspec URL (s3://, file://) or a local folder. A dataset made of .jsonl.zst /
.jsonl / .jsonl.gz / .txt files (the Pile's layout) is read file by file; any other (Parquet: FineWeb and most
of the Hub) goes through `datasets.load_dataset(..., streaming=True)` split by split, with --dataset-config
for its configuration and --text-column for its column. Both stream: no Arrow cache is written. `--input`
reads local paths, globs or folders of .jsonl.zst / .jsonl / .jsonl.gz files (one JSON object per line with a
text field) and .txt files (one file = one document; --text-suffix .py reads other files as plain text too).

Documents: an empty or whitespace-only text (`str.isspace`) is skipped and counted (meta.json
"empty_documents"): it would only add an EOT. A corpus without a single token is an error.

Splits: a file named like val.jsonl.zst / validation.* / dev.* (or under a val/ folder), or a `datasets`
split named so, is validation data; test files and splits are skipped; the rest is train. Inputs without
their own validation data get a deterministic --val-fraction of documents (chosen by a hash of each
document's text, so the split does not depend on file order or --num-proc).

A run is resumable: stop it any way (Ctrl-C, kill -9, a full disk, a bad line, a dropped connection) and run
the same command again: it continues from its last record of progress and ends byte-identical to an
uninterrupted run. Progress is recorded about once a second, at a document boundary, after the tokens are
on disk: within a JSONL file a resumed run skips the bytes already tokenized (decompressing them again,
which is fast, but re-downloading them for a remote file); a .txt document starts over; a `datasets` split
re-reads the rows already tokenized (re-downloading them for a Hub dataset) without tokenizing them. Files
not read yet may change between the runs (e.g. a truncated file downloaded again); a file that changed after
it was partly read is read again from its start. Until the run finishes, the folder holds only
train.bin.partial / val.bin.partial and a state file, never a train.bin; with --overwrite the old dataset
stays until the new one replaces it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from pilegpt.common import UserError, one_line, run_main
from pilegpt.data import Meta
from pilegpt.prepare import out_folder, sources, tokenize_pool

DEFAULT_OUT_DIR = "data/pile"
DEFAULT_VAL_FRACTION = 0.0005  # used only when the input has no validation files of its own


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring (python -c 'import prepare_data; "
                                       "help(prepare_data)') for examples.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dataset", default=None,
                     help=f"HF Hub dataset name, fsspec URL or local folder (default {sources.DEFAULT_DATASET} when no "
                          "--input)")
    src.add_argument("--input", nargs="+", metavar="PATH_OR_GLOB", help="local files, globs or folders")
    p.add_argument("--dataset-config", default=None, metavar="NAME",
                   help="the configuration of a --dataset read through `datasets` (e.g. sample-10BT for FineWeb)")
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help=f"output folder (default {DEFAULT_OUT_DIR})")
    p.add_argument("--num-proc", type=int, default=os.cpu_count() or 1, help="tokenizer processes (default: all cores)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help=f"fraction of documents for validation when the input has no validation files "
                        f"(default {DEFAULT_VAL_FRACTION}; 0 = no validation split)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many train tokens")
    p.add_argument("--text-column", default="text",
                   help="JSON field or dataset column that holds the text (default: text)")
    p.add_argument("--include-subset", action="append", default=[], metavar="NAME",
                   help="keep only documents whose meta.pile_set_name is NAME (repeatable)")
    p.add_argument("--exclude-subset", action="append", default=[], metavar="NAME",
                   help="drop documents whose meta.pile_set_name is NAME (repeatable), e.g. 'Books3'")
    p.add_argument("--text-suffix", action="append", default=[], metavar="SUFFIX",
                   help="also read files ending in SUFFIX as plain text, one file = one document "
                        "(repeatable), e.g. --text-suffix .py")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip malformed JSON lines / invalid UTF-8 / missing text fields and count them")
    p.add_argument("--encoding", default="gpt2", help="tiktoken encoding (default gpt2)")
    p.add_argument("--shard-index", type=int, default=0, help="this job's index when the input is split "
                                                               "across --num-shards parallel jobs")
    p.add_argument("--num-shards", type=int, default=1, help="number of parallel jobs (files assigned "
                                                              "round-robin by sorted name; the rows of a "
                                                              "`datasets` split are divided)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished dataset in --out-dir")
    args = p.parse_args(argv)
    if args.num_proc < 1:
        raise UserError(f"--num-proc {args.num_proc}: must be at least 1")
    if args.val_fraction is not None and not 0 <= args.val_fraction < 1:
        raise UserError(f"--val-fraction {args.val_fraction}: must be in [0, 1)")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UserError(f"--max-tokens {args.max_tokens}: must be positive")
    if not 0 <= args.shard_index < args.num_shards:
        raise UserError(f"--shard-index {args.shard_index}: must be in [0, --num-shards={args.num_shards})")
    if args.dataset_config and args.input:
        raise UserError("--dataset-config goes with --dataset, not --input")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    with ExitStack() as cleanup:
        return prepare(args, cleanup)


def prepare(args: argparse.Namespace, cleanup: ExitStack) -> int:
    from tqdm import tqdm

    t0 = time.time()
    enc = tokenize_pool.load_encoding(args.encoding)
    dtype = np.dtype(np.uint16 if enc.n_vocab <= 2**16 else np.uint32)  # uint16 holds ids 0..65535
    text_suffixes = sources.TEXT_SUFFIXES + tuple(s if s.startswith(".") else "." + s for s in args.text_suffix)

    n_test = 0
    if args.input:
        files = sources.list_local_inputs(args.input, text_suffixes)
        source_info = {"input": args.input}
    else:
        dataset = args.dataset or sources.DEFAULT_DATASET
        source_info = {"dataset": dataset, **({"config": args.dataset_config} if args.dataset_config else {})}
        files = [] if args.dataset_config else sources.list_dataset_files(dataset, text_suffixes)
        if not files:  # not the Pile's layout: any dataset `datasets` can stream (Parquet, ...)
            cache_dir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="prepare_data_hf_"))
            files, n_test = sources.list_dataset_splits(dataset, args.dataset_config, args.text_column, cache_dir,
                                                        args.shard_index, args.num_shards)
    files, n_test_files = sources.plan_files(files, args.shard_index, args.num_shards)
    n_test += n_test_files
    if not files:
        raise UserError(f"shard {args.shard_index} of {args.num_shards} gets no train or validation files "
                        f"(the input has fewer files than --num-shards); use fewer shards")
    has_own_val = any(f.split == "val" for f in files)
    if has_own_val:
        if args.val_fraction:
            print(f"note: the input has validation files ({', '.join(f.name for f in files if f.split == 'val')}); "
                  "--val-fraction is ignored", file=sys.stderr)
        val_fraction = 0.0
    else:
        val_fraction = DEFAULT_VAL_FRACTION if args.val_fraction is None else args.val_fraction
    settings = {
        "encoding": args.encoding, "eot": enc.eot_token, "n_vocab": enc.n_vocab, "dtype": dtype.name,
        "val_fraction": val_fraction, "text_column": args.text_column, "include": sorted(set(args.include_subset)),
        "exclude": sorted(set(args.exclude_subset)), "skip_bad_lines": args.skip_bad_lines,
        "dataset_config": args.dataset_config,
    }
    fingerprint = out_folder.state_fingerprint(files, settings, args.max_tokens)
    sizes = [f.size for f in files]
    out_dir = Path(args.out_dir)
    state = out_folder.check_out_dir(out_dir, fingerprint, files, args.overwrite)
    if state is not None and state.get("publish"):  # killed while publishing: finish that
        out_folder.publish(out_dir, state)
        report(out_dir, json.loads(state["publish"]), time.time() - t0, 0)
        return 0

    created = not out_dir.exists()
    try:
        out_folder.make_out_dir(out_dir, fresh=state is None)
        progress = out_folder.resume_progress(state, files) if state else out_folder.fresh_progress()
        writer = out_folder.Writer(out_dir, fingerprint, sizes, progress, dtype)
    except UserError:
        if state is None:
            out_folder.discard(out_dir, created)
        raise
    resumed = copy.deepcopy(writer.done)
    if state:
        i, (offset, line) = resumed["files_done"], resumed["position"]
        where = f", {files[i].name} from {'row' if files[i].kind == 'rows' else 'line'} {line}" if offset else ""
        print(f"resuming: {i} of {len(files)} files already done{where} "
              f"({resumed['tokens']['train']:,} train tokens)", file=sys.stderr)
    progress = tqdm(total=args.max_tokens, initial=sum(resumed["tokens"].values()), unit="tok",
                    unit_scale=True, desc="tokenizing", dynamic_ncols=True, file=sys.stderr,
                    mininterval=0.5 if sys.stderr.isatty() else 30)  # a log file gets a line per 30 s
    pipeline = tokenize_pool.Pipeline(min(args.num_proc, 64), settings)
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)  # preemption: stop as cleanly as Ctrl-C
    try:
        reached = tokenize(files, writer, pipeline, args.max_tokens, progress, settings)
    except BaseException as e:
        pipeline.close(terminate=True)
        progress.close()
        writer.save_progress()  # keep every finished document for the next run
        writer.close()
        kept = writer.committed["files_done"] or writer.committed["position"][0]
        if not kept:
            out_folder.discard(out_dir, created)  # nothing worth resuming: leave the folder as it was
        where = (f"{writer.committed['files_done']} of {len(files)} files done; run the same command again to "
                 "resume" if kept else "nothing written")
        if isinstance(e, sources.BadInput):
            raise UserError(f"{e} ({where})") from None
        if isinstance(e, UserError):
            raise type(e)(f"{e} ({where})") from None
        if isinstance(e, KeyboardInterrupt):
            print(f"interrupted: {writer.committed['files_done']} of {len(files)} files done; run the same "
                  "command again to resume", file=sys.stderr)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    pipeline.close(terminate=reached)
    progress.close()

    totals = writer.pending
    if totals["tokens"]["train"] == 0:
        writer.close()
        out_folder.discard(out_dir, created)
        what = ", ".join(source_info.get("input") or [source_info["dataset"]])
        raise UserError(f"empty corpus: no text in {what} (documents empty or whitespace-only: {totals['empty']}, "
                        f"filtered out: {totals['filtered']}, bad lines: {totals['bad_lines']}); check the input, "
                        "--text-column and the subset filters")
    splits = {s: {"file": f"{s}.bin", "tokens": totals["tokens"][s], "documents": totals["documents"][s]}
              for s in ("train", "val") if totals["tokens"][s]}
    meta = Meta(tokenizer=args.encoding, vocab_size=enc.n_vocab, eot_token=enc.eot_token, dtype=dtype.name,
                splits=splits, info={
        "sources": {**source_info, "files": [f.name for f in files[: totals["files_done"] + (1 if reached else 0)]],
                    "test_files_skipped": n_test},
        "val_split": "the dataset's validation files" if has_own_val else
                     (f"hash of each document, fraction {val_fraction}" if val_fraction else "none"),
        "text_column": args.text_column, "include_subsets": settings["include"],
        "exclude_subsets": settings["exclude"], "max_tokens": args.max_tokens, "stopped_at_max_tokens": reached,
        "shard": {"index": args.shard_index, "count": args.num_shards},
        "skipped_bad_lines": totals["bad_lines"], "filtered_documents": totals["filtered"],
        "empty_documents": totals["empty"],
    })
    try:
        out_folder.publish(out_dir, writer.finish(meta))
    except out_folder.OutputError as e:
        raise out_folder.OutputError(f"{e} (every file is tokenized; run the same command again to finish)") from None
    if val_fraction and not totals["tokens"]["val"]:
        print(f"note: --val-fraction {val_fraction} picked none of the {totals['documents']['train']:,} documents "
              "(a .txt file is one document), so there is no val.bin; use more documents or a larger fraction",
              file=sys.stderr)
    report(out_dir, json.loads(meta.to_json()), time.time() - t0,
           sum(totals["tokens"].values()) - sum(resumed["tokens"].values()))
    return 0


def tokenize(files: list[sources.SourceFile], writer: out_folder.Writer, pipeline: tokenize_pool.Pipeline,
             max_tokens: Optional[int], progress, settings: dict) -> bool:
    """Tokenize from writer.done's position to the end, in order. Returns True if stopped at --max-tokens."""

    def handle(file_index: int, resume_at: Optional[tuple], result: Optional[dict]) -> bool:
        if result is None:
            writer.file_done()
            progress.set_postfix_str(f"files {writer.done['files_done']}/{len(files)} "
                                     f"docs {sum(writer.pending['documents'].values()):,}", refresh=False)
            return False
        reached = writer.write(result, max_tokens)
        progress.update(len(result["train"]) + len(result["val"]))
        if resume_at is not None and not reached:
            writer.mark(resume_at)
        return reached

    with_subsets = bool(settings["include"] or settings["exclude"])
    for i in range(writer.done["files_done"], len(files)):
        src = files[i]
        for attempt in range(1, 4):
            start = tuple(writer.done["position"]) if writer.done["files_done"] == i else (0, 1)
            try:
                for task in sources.read_tasks(src, start, settings["text_column"], with_subsets):
                    pipeline.submit(i, task)
                    while pipeline.full():
                        if handle(*pipeline.pop()):
                            return True
            except (sources.BadInput, UserError, KeyboardInterrupt):
                raise
            except Exception as e:  # reading the file failed (tokenizer errors come from pop(), not here)
                error = sources.classify_read_error(src, e)
                if error is not None:
                    raise error from None
                if attempt == 3:
                    raise UserError(f"{src.name}: reading failed 3 times ({type(e).__name__}: {one_line(e)}); "
                                    "check the connection and run the same command again to resume") from None
                # A dropped connection: keep every task already read, forget a text document's first pieces,
                # and read on from the last boundary.
                while pipeline.queue:
                    if handle(*pipeline.pop()):
                        return True
                writer.rollback()
                print(f"\n{src.name}: {type(e).__name__}: {one_line(e)}; reading on (attempt {attempt + 1}/3)",
                      file=sys.stderr)
                time.sleep(2 ** attempt)
                continue
            pipeline.submit(i, None)
            break
    while pipeline.queue:
        if handle(*pipeline.pop()):
            return True
    return False


def report(out_dir: Path, meta: dict, seconds: float, new_tokens: int) -> None:
    splits = meta["splits"]
    val = splits.get("val", {"tokens": 0, "documents": 0})
    print(f"prepare_data: {splits['train']['tokens']:,} train tokens ({splits['train']['documents']:,} docs), "
          f"{val['tokens']:,} val tokens ({val['documents']:,} docs) from {len(meta['sources']['files'])} files "
          f"-> {out_dir} in {seconds:.1f}s ({new_tokens / max(seconds, 1e-9):,.0f} tok/s)"
          + (f"; skipped {meta['skipped_bad_lines']} bad lines" if meta["skipped_bad_lines"] else "")
          + (f"; filtered {meta['filtered_documents']} docs" if meta["filtered_documents"] else "")
          + (f"; skipped {meta['empty_documents']} empty docs" if meta["empty_documents"] else ""))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    run_main(main)
