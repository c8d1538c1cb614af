"""Turn prepare_data.py's token .bin files into MosaicML Streaming (MDS) shards of x/y samples (y = x shifted by
one token; consecutive windows by default), written into place whole, locally and/or on S3 (index.json last):
OUT[/split]/index.json, shard.NNNNN.mds.zstd and to_mds.json (how it was made, so --verify needs no flags later).
The same files for any --num-proc. Windows, storage, parallelism and safety: docs/mds-and-s3.md.

Usage:
    # a prepare_data folder: every split present (train.bin, val.bin) -> OUT/train, OUT/val
    python to_mds.py --bin data/shakespeare --out mds/shakespeare --block-size 256
    # one .bin, written to OUT itself by 16 processes; then uploaded to S3 (index.json last), read back, checked
    python to_mds.py --bin data/pile/train.bin --out mds/pile_train --block-size 1024 --num-proc 16 \\
        --remote s3://my-bucket/pile/train --verify
    # straight to S3 (no --out: written to a temp folder under TMPDIR, uploaded, then deleted)
    python to_mds.py --bin data/pile --remote s3://my-bucket/pile --block-size 1024
    # nanoGPT-style random windows instead (train split only; val stays sequential)
    python to_mds.py --bin data/shakespeare --out mds/rand --block-size 256 --sampling random \\
        --num-samples 100000 --seed 1337
    # prepare_data --by-subset's folder: one MDS root per component, OUT/<name>/train, OUT/<name>/val
    python to_mds.py --bin data/pile_by_subset --out mds/pile_by_subset --block-size 1024
    # check an existing dataset against its .bin (every sample, every token)
    python to_mds.py --bin data/shakespeare --out mds/shakespeare --verify
    # a bare .bin without meta.json
    python to_mds.py --bin tokens.bin --out mds/tokens --block-size 128 --dtype uint16 --vocab-size 50257
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from pilegpt import compat, s3
from pilegpt.common import UserError, check_writable_folder, load_dotenv_file, run_main, setup_logging
from pilegpt.data import INDEX_NAME, META_NAME, SPLITS, TOKEN_DTYPES, Meta, count_tokens, read_subsets
from pilegpt.mds.publish import clean_stale_local, is_dataset_dir, local_exists, publish_local, publish_remote
from pilegpt.mds.verify import load_spec, verify_split
from pilegpt.mds.write import SplitJob, WriterSettings, Written, make_spec, write_split
from pilegpt.s3 import S3Dir

log = logging.getLogger("to_mds")

DEFAULT_COMPRESSION = "zstd"  # Streaming's zstd = level 3: ~1.25 bytes/token on text, y nearly free
DEFAULT_HASHES = "sha1,xxh64"  # shard checksums stored in index.json (StreamingDataset validate_hash)
DEFAULT_SIZE_LIMIT = "64mb"  # uncompressed bytes per shard
DEFAULT_SEED = 1337
DEFAULT_NUM_PROC = min(8, os.cpu_count() or 1)  # each process holds ~4 shards' worth of memory


# ----------------------------------------------------------------------------------------------------------
# flags and inputs


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Usage:"):],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="a .bin of tokens, or a prepare_data folder (train.bin, val.bin)")
    p.add_argument("--out", help="local output folder (required unless --remote)")
    p.add_argument("--block-size", type=int, help="tokens per sample T (x and y each hold T tokens)")
    p.add_argument("--remote", help="s3://bucket/prefix: upload the dataset there once it is written")
    p.add_argument("--endpoint-url", help="S3-compatible endpoint (else AWS_ENDPOINT_URL / S3_ENDPOINT_URL)")
    p.add_argument("--compression", default=DEFAULT_COMPRESSION,
                   help="Streaming compression, e.g. zstd, zstd:1 (faster), zstd:9, none (default: zstd)")
    p.add_argument("--hashes", default=DEFAULT_HASHES,
                   help="shard checksums stored in index.json, comma-separated, or none (default: sha1,xxh64)")
    p.add_argument("--size-limit", default=DEFAULT_SIZE_LIMIT, help="max uncompressed shard size (64mb)")
    p.add_argument("--num-proc", "--workers", dest="num_proc", type=int, default=DEFAULT_NUM_PROC,
                   help=f"processes converting shards (default: CPU count, at most 8, here {DEFAULT_NUM_PROC}); "
                        "the output does not depend on it. --workers is the older name")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing dataset (once the new one is complete)")
    p.add_argument("--verify", action="store_true",
                   help="read the dataset back with StreamingDataset and compare every token with the .bin; "
                        "on an existing dataset (without --overwrite) only verify")
    p.add_argument("--sampling", choices=("sequential", "random"), default="sequential",
                   help="sequential: consecutive windows covering every token once (default); "
                        "random: nanoGPT-style random offsets (train split only)")
    p.add_argument("--num-samples", type=int, help="number of samples with --sampling random")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of --sampling random")
    p.add_argument("--dtype", help=f"token dtype of a bare .bin without meta.json ({', '.join(TOKEN_DTYPES)})")
    p.add_argument("--vocab-size", type=int, help="vocabulary size of a bare .bin without meta.json")
    return p.parse_args(argv)


def check_flags(args: argparse.Namespace) -> None:
    """Reject impossible flag combinations before touching any file."""
    if not args.out and not args.remote:
        raise UserError("give --out DIR (local dataset) and/or --remote s3://bucket/prefix")
    if args.block_size is not None and args.block_size < 1:
        raise UserError(f"--block-size {args.block_size} must be at least 1")
    if args.sampling == "random":
        if args.num_samples is None or args.num_samples < 1:
            raise UserError("--sampling random needs --num-samples N (N >= 1)")
    elif args.num_samples is not None:
        raise UserError("--num-samples only applies to --sampling random")
    if args.dtype is not None and args.dtype not in TOKEN_DTYPES:
        raise UserError(f"--dtype {args.dtype} is not supported; use one of {', '.join(TOKEN_DTYPES)}")
    if args.num_proc < 1:
        raise UserError(f"--num-proc {args.num_proc} must be at least 1")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise UserError(f"--vocab-size {args.vocab_size} must be at least 1")
    if args.remote:
        s3.parse_s3_url(args.remote)  # raises UserError when malformed


def check_writer_flags(args: argparse.Namespace) -> WriterSettings:
    """--compression, --hashes and --size-limit, checked against Streaming (imported now: it is slow to import)."""
    get_compressions, is_compression, is_hash, bytes_to_int = compat.mds_writer_checks()
    compression = None if args.compression.lower() in ("", "none") else args.compression
    if compression and not is_compression(compression):
        names = sorted({c.split(":")[0] for c in get_compressions()})
        raise UserError(f"--compression {compression} is unknown; use one of {', '.join(names)} "
                        f"(optionally name:level, e.g. zstd:1), or none")
    hashes = [] if args.hashes.lower() in ("", "none") else sorted({h.strip() for h in args.hashes.split(",")})
    for h in hashes:
        if not is_hash(h):
            raise UserError(f"--hashes: {h} is not a hash Streaming knows; try sha1, xxh64, md5")
    try:
        size_limit = bytes_to_int(args.size_limit)
    except ValueError:
        raise UserError(f"--size-limit {args.size_limit} is not a size; write e.g. 64mb, 512kb, 1gb") from None
    if not 0 < size_limit < 2 ** 32:
        raise UserError(f"--size-limit {args.size_limit} must be between 1 byte and 4gb")
    return WriterSettings(compression, hashes, size_limit, args.size_limit)


def token_settings(args: argparse.Namespace, meta: Optional[Meta], meta_path: Path) -> tuple[np.dtype, int, dict]:
    """The dtype and vocab size of the tokens, from meta.json or (for a bare .bin) from the flags."""
    if meta is None:
        if args.dtype is None or args.vocab_size is None:
            raise UserError(f"{meta_path} not found: give --dtype (e.g. uint16) and --vocab-size (e.g. 50257) "
                            f"for a .bin that prepare_data.py did not write")
        dtype_name, vocab, info = args.dtype, args.vocab_size, {}
    else:
        dtype_name, vocab = meta.dtype, meta.vocab_size
        info = {"tokenizer": meta.tokenizer, "eot_token": meta.eot_token}
        for flag, given, known in (("--dtype", args.dtype, dtype_name), ("--vocab-size", args.vocab_size, vocab)):
            if given is not None and given != known:
                raise UserError(f"{flag} {given} disagrees with {meta_path} ({known}); drop the flag")
    dtype = np.dtype(dtype_name)
    if vocab - 1 > np.iinfo(dtype).max:
        raise UserError(f"vocab_size {vocab} does not fit in {dtype_name}; use --dtype uint32")
    return dtype, vocab, info


def resolve_inputs(args: argparse.Namespace) -> tuple[list[SplitJob], np.dtype, int, dict]:
    """The .bin files to convert (one, each split of a prepare_data folder, or each split of each component of a
    --by-subset folder) and their token settings."""
    src = Path(args.bin)
    subsets = read_subsets(src) if src.is_dir() else None
    if subsets is not None:
        return component_jobs(args, src, subsets)
    if src.is_dir():
        jobs, dtype, vocab, info = folder_jobs(args, src, "")
        if not jobs:
            raise UserError(f"{src} holds no train.bin or val.bin: is it a folder written by prepare_data.py?")
        return jobs, dtype, vocab, info
    if not src.is_file():
        raise UserError(f"{src} not found: pass a .bin written by prepare_data.py, or its folder")
    meta_path = src.parent / META_NAME
    meta = Meta.read(src.parent) if meta_path.is_file() else None
    dtype, vocab, info = token_settings(args, meta, meta_path)
    listed = meta.splits.get(src.stem) if meta else None
    n = count_tokens(src, dtype, expected=listed.tokens if listed else None)
    return [SplitJob(src.stem, src, n, "", args.sampling)], dtype, vocab, info


def folder_jobs(args: argparse.Namespace, src: Path, prefix: str) -> tuple[list[SplitJob], np.dtype, int, dict]:
    """Each split of a prepare_data folder, written to OUT/<prefix><split>."""
    meta_path = src / META_NAME
    meta = Meta.read(src) if meta_path.is_file() else None
    dtype, vocab, info = token_settings(args, meta, meta_path)
    jobs = []
    for split in SPLITS:
        listed = meta.splits.get(split) if meta else None
        path = src / (listed.file if listed else f"{split}.bin")
        if listed is None and not path.is_file():
            continue
        n = count_tokens(path, dtype, expected=listed.tokens if listed else None)
        if n == 0:  # e.g. an input without validation documents
            log.warning("%s is empty: no %s dataset written", path, split)
            continue
        sampling = args.sampling if split == "train" else "sequential"
        jobs.append(SplitJob(prefix + split, path, n, prefix + split, sampling))
    return jobs, dtype, vocab, info


def component_jobs(args: argparse.Namespace, src: Path, subsets: list[dict]) -> tuple[list[SplitJob], np.dtype,
                                                                                         int, dict]:
    """Each split of each component of a prepare_data --by-subset folder, written to OUT/<folder>/<split>: one MDS
    root per component. The components must share their tokens' settings (one run wrote them all)."""
    jobs, settings = [], None
    for entry in subsets:
        found = folder_jobs(args, src / entry["folder"], entry["folder"] + "/")
        if settings is not None and found[1:] != settings:
            raise UserError(f"{src / entry['folder']}: its tokens' dtype or vocabulary differ from the other "
                            "components'; re-run prepare_data.py --by-subset")
        jobs, settings = jobs + found[0], found[1:]
    if not jobs:
        raise UserError(f"{src} lists no component with tokens: re-run prepare_data.py --by-subset")
    return (jobs, *settings)


# ----------------------------------------------------------------------------------------------------------
# main


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    setup_logging(logging.WARNING)
    load_dotenv_file()
    check_flags(args)
    jobs, dtype, vocab, info = resolve_inputs(args)
    settings = check_writer_flags(args)
    out = Path(args.out) if args.out else None
    remote = open_remote(args)
    exists_local, exists_remote = existing_datasets(out, remote, jobs)
    if (exists_local or exists_remote) and not args.overwrite:
        if not args.verify:
            where = out if exists_local else args.remote
            raise UserError(f"{where} already holds a dataset; pass --overwrite to replace it, or --verify to "
                            f"check it")
        return verify_all(args, jobs, dtype, remote, out if exists_local else None, exists_remote)
    if args.block_size is None:
        raise UserError("--block-size is required to convert (e.g. --block-size 1024)")

    # every spec first: a .bin too short for --block-size fails before anything is written
    specs = [make_spec(j, args.block_size, args.num_samples, args.seed, dtype, vocab, info) for j in jobs]
    results, uploaded = write_and_publish(args, jobs, specs, settings, out, remote, exists_remote)
    for job, spec, res in zip(jobs, specs, results):
        print_result(job, spec, res, dtype, out, remote)
    if uploaded:
        print(uploaded)
    if args.verify:
        return verify_all(args, jobs, dtype, remote, out, remote is not None)
    return 0


def open_remote(args: argparse.Namespace) -> Optional[S3Dir]:
    """The --remote prefix with its S3 client, its bucket and credentials checked before any work (None: none)."""
    endpoint = s3.endpoint_url(args.endpoint_url)
    if endpoint:  # Streaming's downloader (--verify) reads S3_ENDPOINT_URL only
        os.environ["S3_ENDPOINT_URL"] = endpoint
    remote = S3Dir(args.remote, s3.make_client(endpoint)) if args.remote else None
    if remote is not None:
        remote.check()
    return remote


def existing_datasets(out: Optional[Path], remote: Optional[S3Dir], jobs: list[SplitJob]) -> tuple[bool, bool]:
    """(a dataset is at --out, one is at --remote); --out must be writable and, if it exists, an MDS dataset."""
    if out is not None:
        check_writable_folder(out, "--out", "choose another folder", beside=True)  # the dataset is staged beside it
        clean_stale_local(out)
    exists_local = out is not None and local_exists(out)
    exists_remote = remote is not None and any(remote.child(j.sub).exists(INDEX_NAME) for j in jobs)
    if exists_local and not is_dataset_dir(out):
        raise UserError(f"--out {out} exists and is not an MDS dataset (no {INDEX_NAME}); choose another folder")
    return exists_local, exists_remote


def write_and_publish(args: argparse.Namespace, jobs: list[SplitJob], specs: list[dict], settings: WriterSettings,
                      out: Optional[Path], remote: Optional[S3Dir],
                      exists_remote: bool) -> tuple[list[Written], Optional[str]]:
    """Write every split into a staging folder, then put it in place: on S3 (index.json last), then at --out.
    Returns each split's write result and the upload's summary line (None without --remote)."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    else:
        staging = Path(tempfile.mkdtemp(prefix="to_mds_stage_"))
    published = False
    try:
        results = [write_split(job, spec, staging / job.sub if job.sub else staging, settings, args.num_proc)
                   for job, spec in zip(jobs, specs)]
        uploaded = publish_remote(staging, remote, [j.sub for j in jobs], exists_remote) if remote else None
        if out is not None:
            publish_local(staging, out, args.overwrite)
        published = True
    finally:
        if not published or out is None:
            shutil.rmtree(staging, ignore_errors=True)
    return results, uploaded


def print_result(job: SplitJob, spec: dict, res: Written, dtype: np.dtype, out: Optional[Path],
                 remote: Optional[S3Dir]) -> None:
    where = " and ".join(str(w) for w in (
        (out / job.sub if job.sub else out) if out is not None else None,
        remote.child(job.sub).url if remote else None) if w)
    print(f"{job.name}: {res.samples:,} samples of {spec['block_size']} tokens ({spec['sampling']}) -> "
          f"{res.shards} shard(s), {res.bytes / 1e6:.2f} MB, {res.bytes / job.n_tokens:.3f} bytes/token of "
          f"{job.bin_path.name} ({job.n_tokens:,} tokens, {spec['dropped_tail_tokens']} tail tokens dropped), "
          f"{job.n_tokens * dtype.itemsize / 1e6 / max(res.seconds, 1e-9):.1f} MB/s -> {where}")


def verify_all(args: argparse.Namespace, jobs: list[SplitJob], dtype: np.dtype, remote: Optional[S3Dir],
               out: Optional[Path], check_remote: bool) -> int:
    """--verify: read back each split's dataset (local and/or S3) and compare it with its .bin."""
    client = remote.client if remote is not None else None
    for job in jobs:
        sources = []
        if out is not None:
            sources.append(str(out / job.sub if job.sub else out))
        if check_remote:
            sources.append(remote.child(job.sub).url)
        for source in sources:
            spec = load_spec(source, client, args.block_size, job, dtype)
            n = verify_split(source, job, spec, dtype, client)
            print(f"verified {source}: {n:,} samples, every token matches {job.bin_path}")
    return 0


if __name__ == "__main__":
    run_main(main)
