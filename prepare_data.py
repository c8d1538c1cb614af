"""Tokenize The Pile (or any Hugging Face dataset, or local text) with GPT-2 BPE into train.bin / val.bin
(every document as `encode_ordinary(text) + [EOT]`, concatenated, uint16) and meta.json. A stopped run
resumes when the same command runs again, and ends byte-identical to an uninterrupted one. Sources, splits,
filters, sharding and resuming: docs/prepare.md.

Usage:
    python prepare_data.py                                  # The Pile from the HF Hub, streamed, into data/pile
    python prepare_data.py --max-tokens 1000000000 --out-dir data/pile_1b     # a 1B-token slice
    python prepare_data.py --exclude-subset "Books3" --exclude-subset "Github"  # drop Pile subsets
    python prepare_data.py --dataset HuggingFaceFW/fineweb --dataset-config sample-10BT --out-dir data/fineweb
    python prepare_data.py --input ~/pile/train/00.jsonl.zst ~/pile/val.jsonl.zst --out-dir data/pile00
    python prepare_data.py --input tests/fixtures/tinyshakespeare.txt --out-dir data/shakespeare
    python prepare_data.py --shard-index 3 --num-shards 8 --out-dir data/pile/part-03   # one of 8 jobs
    python prepare_data.py --by-subset --out-dir data/pile_by_subset     # OUT/pile-cc/, OUT/arxiv/, ... in one pass
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from pilegpt.common import UserError, one_line, run_main
from pilegpt.data import META_NAME, Meta
from pilegpt.prepare import components, out_folder, sources, tokenize_pool

DEFAULT_OUT_DIR = "data/pile"
DEFAULT_VAL_FRACTION = 0.0005  # used only when the input has no validation files of its own


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--dataset", default=None,
                     help=f"HF Hub dataset name, fsspec URL or local folder (default {sources.DEFAULT_DATASET} when no "
                          "--input)")
    src.add_argument("--input", nargs="+", action="extend", metavar="PATH_OR_GLOB",
                     help="local files, globs or folders (repeatable)")
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
    p.add_argument("--by-subset", action="store_true",
                   help="one prepared folder per subset under --out-dir (OUT/<name>/train.bin, val.bin, meta.json; "
                        "OUT/subsets.json lists them), from one pass over the input")
    p.add_argument("--subset-field", default=sources.DEFAULT_SUBSET_FIELD, metavar="FIELD",
                   help=f"the record's field (a dotted path) that names its subset, for --by-subset and the subset "
                        f"filters (default {sources.DEFAULT_SUBSET_FIELD})")
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
    if args.by_subset and args.max_tokens is not None:
        raise UserError("--max-tokens does not go with --by-subset (whose components each hold all their "
                        "documents); prepare a slice per component with --include-subset NAME --max-tokens N")
    sources.subset_path(args.subset_field)  # a malformed --subset-field fails before any work
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    with ExitStack() as cleanup:
        return prepare(args, cleanup)


class Inputs(NamedTuple):
    """What this job reads: its files (or `datasets` splits) in order, and how they were named."""
    files: list[sources.SourceFile]
    test_skipped: int  # test files and splits left out
    source_info: dict  # meta.json's "sources": {"input": [...]} or {"dataset": name[, "config": name]}


class Output(NamedTuple):
    """The folder being written and its writer; `created`: this run made the folder (a failure removes it)."""
    dir: Path
    writer: out_folder.Writer
    created: bool

    def discard(self) -> None:
        out_folder.discard(self.dir, self.created)


def prepare(args: argparse.Namespace, cleanup: ExitStack) -> int:
    """Tokenize the input into --out-dir (or resume a stopped run, or finish one killed while publishing)."""
    t0 = time.time()
    enc = tokenize_pool.load_encoding(args.encoding)
    dtype = np.dtype(np.uint16 if enc.n_vocab <= 2**16 else np.uint32)  # uint16 holds ids 0..65535
    inputs = find_inputs(args, cleanup)
    val_fraction = choose_val_fraction(args, inputs.files)
    settings = {
        "encoding": args.encoding, "eot": enc.eot_token, "n_vocab": enc.n_vocab, "dtype": dtype.name,
        "val_fraction": val_fraction, "text_column": args.text_column, "include": sorted(set(args.include_subset)),
        "exclude": sorted(set(args.exclude_subset)), "skip_bad_lines": args.skip_bad_lines,
        "dataset_config": args.dataset_config,
    }
    if args.by_subset or args.subset_field != sources.DEFAULT_SUBSET_FIELD:  # absent: the fingerprint of older runs
        settings.update(by_subset=args.by_subset, subset_field=args.subset_field)
    fingerprint = out_folder.state_fingerprint(inputs.files, settings, args.max_tokens)
    out_dir = Path(args.out_dir)
    state = out_folder.check_out_dir(out_dir, fingerprint, inputs.files, args.overwrite, args.by_subset)
    if state is not None and state.get("publish"):  # killed while publishing: finish that
        (components if args.by_subset else out_folder).publish(out_dir, state)
        report(out_dir, json.loads(state["publish"]), time.time() - t0, 0)
        return 0

    output = open_output(out_dir, fingerprint, inputs.files, state, dtype, args.by_subset)
    resumed = copy.deepcopy(output.writer.done)
    if state:
        print_resume(resumed, inputs.files)
    reached = tokenize_all(inputs.files, output, args, settings, resumed)
    totals = output.writer.pending
    if totals["tokens"]["train"] == 0:
        output.writer.close()
        output.discard()
        raise empty_corpus_error(totals, inputs.source_info, args.include_subset, output.writer.subsets_filtered)
    meta = make_meta(args, enc, dtype, inputs, totals, reached, val_fraction, settings)
    try:
        if args.by_subset:
            components.publish(out_dir, finish_components(output.writer, meta, args, enc, dtype, inputs, settings))
        else:
            out_folder.publish(out_dir, output.writer.finish(meta))
    except out_folder.OutputError as e:
        raise out_folder.OutputError(f"{e} (every file is tokenized; run the same command again to finish)") from None
    if val_fraction and not totals["tokens"]["val"]:
        print(f"note: --val-fraction {val_fraction} picked none of the {totals['documents']['train']:,} documents "
              "(a .txt file is one document), so there is no val.bin; use more documents or a larger fraction",
              file=sys.stderr)
    record = json.loads((out_dir / components.SUBSETS_NAME if args.by_subset else out_dir / META_NAME).read_text())
    report(out_dir, record, time.time() - t0, sum(totals["tokens"].values()) - sum(resumed["tokens"].values()))
    return 0


def find_inputs(args: argparse.Namespace, cleanup: ExitStack) -> Inputs:
    """The files of --input or --dataset (or the splits `datasets` streams), this --shard-index's share."""
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
    text = next((f.name for f in files if f.kind == "text"), None)
    if args.by_subset and text:
        raise UserError(f"--by-subset: {text} is a text file, one document without a subset field; give JSON lines "
                        f"(or a dataset) whose records name their subset in --subset-field {args.subset_field}")
    if not files:
        raise UserError(f"shard {args.shard_index} of {args.num_shards} gets no train or validation files "
                        f"(the input has fewer files than --num-shards); use fewer shards")
    return Inputs(files, n_test + n_test_files, source_info)


def has_own_val(files: list[sources.SourceFile]) -> bool:
    return any(f.split == "val" for f in files)


def choose_val_fraction(args: argparse.Namespace, files: list[sources.SourceFile]) -> float:
    """--val-fraction (or its default), or 0 when the input has validation files of its own."""
    if not has_own_val(files):
        return DEFAULT_VAL_FRACTION if args.val_fraction is None else args.val_fraction
    if args.val_fraction:
        print(f"note: the input has validation files ({', '.join(f.name for f in files if f.split == 'val')}); "
              "--val-fraction is ignored", file=sys.stderr)
    return 0.0


def open_output(out_dir: Path, fingerprint: dict, files: list[sources.SourceFile], state: Optional[dict],
                dtype: np.dtype, by_subset: bool) -> Output:
    """Create --out-dir (or reopen a stopped run's) and its writer, at the progress `state` records."""
    created = not out_dir.exists()
    try:
        out_folder.make_out_dir(out_dir, fresh=state is None)
        progress = out_folder.resume_progress(state, files) if state else out_folder.fresh_progress(by_subset)
        make_writer = components.SubsetWriter if by_subset else out_folder.Writer
        writer = make_writer(out_dir, fingerprint, [f.size for f in files], progress, dtype)
    except UserError:
        if state is None:
            out_folder.discard(out_dir, created)
        raise
    return Output(out_dir, writer, created)


def print_resume(resumed: dict, files: list[sources.SourceFile]) -> None:
    i, (offset, line) = resumed["files_done"], resumed["position"]
    where = f", {files[i].name} from {'row' if files[i].kind == 'rows' else 'line'} {line}" if offset else ""
    print(f"resuming: {i} of {len(files)} files already done{where} "
          f"({resumed['tokens']['train']:,} train tokens)", file=sys.stderr)


def tokenize_all(files: list[sources.SourceFile], output: Output, args: argparse.Namespace, settings: dict,
                 resumed: dict) -> bool:
    """tokenize() with a progress bar and the tokenizer processes; any failure or stop (SIGTERM too) keeps every
    finished document for the next run. Returns True if stopped at --max-tokens."""
    from tqdm import tqdm

    progress = tqdm(total=args.max_tokens, initial=sum(resumed["tokens"].values()), unit="tok",
                    unit_scale=True, desc="tokenizing", dynamic_ncols=True, file=sys.stderr,
                    mininterval=0.5 if sys.stderr.isatty() else 30)  # a log file gets a line per 30 s
    pipeline = tokenize_pool.Pipeline(min(args.num_proc, 64), settings)
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)  # preemption: stop as cleanly as Ctrl-C
    try:
        reached = tokenize(files, output.writer, pipeline, args.max_tokens, progress, settings)
    except BaseException as e:
        pipeline.close(terminate=True)
        progress.close()
        replacement = keep_for_resume(e, output, files)
        if replacement is not None:
            raise replacement from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    pipeline.close(terminate=reached)
    progress.close()
    return reached


def keep_for_resume(e: BaseException, output: Output, files: list[sources.SourceFile]) -> Optional[BaseException]:
    """After tokenize() stopped with `e`: record the progress (or remove a folder with nothing worth resuming);
    the error to raise instead of `e`, naming what is kept, or None to raise `e` itself."""
    writer = output.writer
    writer.save_progress()  # keep every finished document for the next run
    writer.close()
    kept = writer.committed["files_done"] or writer.committed["position"][0]
    if not kept:
        output.discard()  # nothing worth resuming: leave the folder as it was
    where = (f"{writer.committed['files_done']} of {len(files)} files done; run the same command again to "
             "resume" if kept else "nothing written")
    if isinstance(e, sources.BadInput):
        return UserError(f"{e} ({where})")
    if isinstance(e, UserError):
        return type(e)(f"{e} ({where})")
    if isinstance(e, KeyboardInterrupt):
        print(f"interrupted: {writer.committed['files_done']} of {len(files)} files done; run the same "
              "command again to resume", file=sys.stderr)
    return None


def empty_corpus_error(totals: dict, source_info: dict, include: list[str], filtered: Counter) -> UserError:
    """The line for a run that found no text: the counts, and when the subset filters left everything out, the
    subsets the input holds and the closest name to each --include-subset that matched nothing."""
    what = ", ".join(source_info.get("input") or [source_info["dataset"]])
    hint = "check the input, --text-column and the subset filters"
    if filtered:
        seen = ", ".join(f"{name} ({n:,})" for name, n in filtered.most_common(10))
        close = {name: difflib.get_close_matches(name.lower(), [s.lower() for s in filtered], n=1, cutoff=0.5)
                 for name in include if name not in filtered}
        lower = {s.lower(): s for s in filtered}
        guesses = [f"--include-subset {lower[c[0]]!r} for {name!r}" for name, c in close.items() if c]
        hint = (f"the subsets seen (documents): {seen}; names are case-sensitive"
                + (f": did you mean {', '.join(guesses)}?" if guesses else ""))
    return UserError(f"empty corpus: no text in {what} (documents empty or whitespace-only: {totals['empty']}, "
                     f"filtered out: {totals['filtered']}, bad lines: {totals['bad_lines']}); {hint}")


def make_meta(args: argparse.Namespace, enc, dtype: np.dtype, inputs: Inputs, totals: dict, reached: bool,
              val_fraction: float, settings: dict) -> Meta:
    """meta.json of the finished dataset: the splits' files and counts, and how they were made."""
    splits = {s: {"file": f"{s}.bin", "tokens": totals["tokens"][s], "documents": totals["documents"][s]}
              for s in ("train", "val") if totals["tokens"][s]}
    read = inputs.files[: totals["files_done"] + (1 if reached else 0)]
    return Meta(tokenizer=args.encoding, vocab_size=enc.n_vocab, eot_token=enc.eot_token, dtype=dtype.name,
                splits=splits, info={
        "sources": {**inputs.source_info, "files": [f.name for f in read], "test_files_skipped": inputs.test_skipped},
        "val_split": "the dataset's validation files" if has_own_val(inputs.files) else
                     (f"hash of each document, fraction {val_fraction}" if val_fraction else "none"),
        "text_column": args.text_column, "include_subsets": settings["include"],
        "exclude_subsets": settings["exclude"], "max_tokens": args.max_tokens, "stopped_at_max_tokens": reached,
        "shard": {"index": args.shard_index, "count": args.num_shards},
        "skipped_bad_lines": totals["bad_lines"], "filtered_documents": totals["filtered"],
        "empty_documents": totals["empty"],
        **({"subset_field": args.subset_field} if args.by_subset else {}),
    })


def finish_components(writer: components.SubsetWriter, run: Meta, args: argparse.Namespace, enc, dtype: np.dtype,
                      inputs: Inputs, settings: dict) -> dict:
    """Each component's meta.json (its own splits and counts; the skipped and filtered counts are the run's) and
    subsets.json, recorded in the state for publishing."""
    totals = writer.pending
    metas = {}
    for name, counts in totals["subsets"].items():
        meta = make_meta(args, enc, dtype, inputs, {**totals, **counts}, False, settings["val_fraction"], settings)
        meta.info["subset"] = name
        metas[components.subset_folder(name)] = meta
    index = components.make_index(totals["subsets"], args.subset_field, json.loads(run.to_json()))
    return writer.finish(metas, index)


@dataclass
class _Tokenizing:
    """One pass over the files: tasks go into the pipeline in order, and its results, in the same order, to the
    writer; each file's end and each task's end boundary is recorded for a resumed run."""
    files: list[sources.SourceFile]
    writer: out_folder.Writer
    pipeline: tokenize_pool.Pipeline
    max_tokens: Optional[int]
    progress: Any  # the tqdm bar

    def handle(self, file_index: int, resume_at: Optional[tuple], result: Optional[dict]) -> bool:
        """One result of the pipeline (None: the end of a file); True when --max-tokens is reached."""
        if result is None:
            self.writer.file_done()
            self.progress.set_postfix_str(f"files {self.writer.done['files_done']}/{len(self.files)} "
                                          f"docs {sum(self.writer.pending['documents'].values()):,}", refresh=False)
            return False
        reached = self.writer.write(result, self.max_tokens)
        parts = result.get("parts", {}).values()
        self.progress.update(sum(len(r["train"]) + len(r["val"]) for r in (result, *parts)))
        if resume_at is not None and not reached:
            self.writer.mark(resume_at)
        return reached

    def drain(self, while_full: bool = False) -> bool:
        """Hand results to the writer until the pipeline has room (`while_full`) or is empty; True at --max-tokens."""
        while self.pipeline.full() if while_full else self.pipeline.queue:
            if self.handle(*self.pipeline.pop()):
                return True
        return False

    def read_file(self, i: int, text_column: str, subsets: Optional[tuple]) -> bool:
        """Submit file i's tasks from the writer's position; a failed read (a dropped connection) is retried from
        the last document boundary, 3 attempts in all. True when --max-tokens is reached."""
        src = self.files[i]
        for attempt in range(1, 4):
            start = tuple(self.writer.done["position"]) if self.writer.done["files_done"] == i else (0, 1)
            try:
                for task in sources.read_tasks(src, start, text_column, subsets):
                    self.pipeline.submit(i, task)
                    if self.drain(while_full=True):
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
                if self.drain():
                    return True
                self.writer.rollback()
                print(f"\n{src.name}: {type(e).__name__}: {one_line(e)}; reading on (attempt {attempt + 1}/3)",
                      file=sys.stderr)
                time.sleep(2 ** attempt)
                continue
            self.pipeline.submit(i, None)
            return False
        raise AssertionError("unreachable: the third failed attempt raises")


def tokenize(files: list[sources.SourceFile], writer: out_folder.Writer, pipeline: tokenize_pool.Pipeline,
             max_tokens: Optional[int], progress, settings: dict) -> bool:
    """Tokenize from writer.done's position to the end, in order. Returns True if stopped at --max-tokens."""
    run = _Tokenizing(files, writer, pipeline, max_tokens, progress)
    needs_subset = settings["include"] or settings["exclude"] or settings.get("by_subset")
    subsets = sources.subset_path(settings.get("subset_field", sources.DEFAULT_SUBSET_FIELD)) if needs_subset else None
    for i in range(writer.done["files_done"], len(files)):
        if run.read_file(i, settings["text_column"], subsets):
            return True
    return run.drain()


def report(out_dir: Path, record: dict, seconds: float, new_tokens: int) -> None:
    """The one-line summary, of meta.json's record (or of subsets.json's: its run's, and the components)."""
    meta = record.get("run", record)
    n = len(record["subsets"]) if "subsets" in record else None
    splits = meta["splits"]
    val = splits.get("val", {"tokens": 0, "documents": 0})
    print(f"prepare_data: {splits['train']['tokens']:,} train tokens ({splits['train']['documents']:,} docs), "
          f"{val['tokens']:,} val tokens ({val['documents']:,} docs)" + (f" in {n} subsets" if n else "")
          + f" from {len(meta['sources']['files'])} files "
          f"-> {out_dir} in {seconds:.1f}s ({new_tokens / max(seconds, 1e-9):,.0f} tok/s)"
          + (f"; skipped {meta['skipped_bad_lines']} bad lines" if meta["skipped_bad_lines"] else "")
          + (f"; filtered {meta['filtered_documents']} docs" if meta["filtered_documents"] else "")
          + (f"; skipped {meta['empty_documents']} empty docs" if meta["empty_documents"] else ""))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    run_main(main)
