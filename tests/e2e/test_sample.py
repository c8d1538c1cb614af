"""sample.py through its command line (bounded memory for any number of samples, one-line errors) and from the
loopback S3 server (an export, a run folder, a Composer checkpoint through its "latest" pointer). Sampling itself:
tests/unit/test_sample.py."""

import os
import sys

import pytest

import sample
from helpers import (
    REPO,
    composer_checkpoint,
    failed_with_one_line,
    finish_all,
    run_command,
    script,
    start,
    succeeded,
    tiny_export,
)
from helpers import (
    sample_output as run,
)
from pilegpt.checkpoint import EXPORT_NAME
from pilegpt.common import UserError

# GPT-2's vocabulary (prompts are tiktoken-encoded), everything else tiny.
CONFIG = dict(block_size=32, vocab_size=50257, n_layer=2, n_head=2, n_embd=16)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return tiny_export(tmp_path_factory.mktemp("run"), **CONFIG)


def test_memory_does_not_grow_with_the_number_of_samples(export):
    """--num-samples 100000 was killed by the kernel: every sample's logits were held at once. Peak memory of 64
    and of 2,000 samples (with the old code: ~0.4 GB of logits per token step more)."""
    code = ("import atexit, resource, runpy, sys; atexit.register(lambda: print('maxrss', resource.getrusage("
            "resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)); sys.argv[0] = 'sample.py'; "
            f"runpy.run_path({str(REPO / 'sample.py')!r}, run_name='__main__')")
    # both at once: each process's own peak (RUSAGE_SELF) does not depend on the other
    procs = [start([sys.executable, "-c", code, "--checkpoint", export, "--device", "cpu", "--max-new-tokens", "2",
                    "--num-samples", n], env={**os.environ, "OMP_NUM_THREADS": "1"}) for n in (64, 2000)]
    (small, n_small), (big, n_big) = [(int(out.split("maxrss ")[-1]) / 1024, out.count(sample.SEPARATOR + "\n"))
                                      for out in map(succeeded, finish_all(procs))]
    assert (n_small, n_big) == (64, 2000)
    assert big < small + 150, (small, big)


def test_cli_prints_one_line_error_and_exits_2(tmp_path):
    result = run_command(script("sample.py", "--checkpoint", tmp_path / "nope.pt"), tmp_path, timeout=120)
    assert failed_with_one_line(result, alone=True) == (f"error: checkpoint {tmp_path / 'nope.pt'} not found: pass a "
                                                        "model.pt export, a Composer checkpoint, or a run folder")


def test_export_on_s3(export, s3_env, capsys):
    client = s3_env.client()
    client.upload_file(str(export), s3_env.bucket, f"runs/a/{EXPORT_NAME}")
    argv = ["--prompt", "Once upon", "--max-new-tokens", "8", "--seed", "5"]
    local = run(capsys, "--checkpoint", str(export), *argv)
    assert run(capsys, "--checkpoint", f"s3://{s3_env.bucket}/runs/a/{EXPORT_NAME}", *argv) == local
    assert run(capsys, "--checkpoint", f"s3://{s3_env.bucket}/runs/a", *argv) == local  # a run folder
    with pytest.raises(UserError, match="not found"):
        sample.main(["--checkpoint", f"s3://{s3_env.bucket}/runs/missing/model.pt"])


def test_s3_without_credentials_is_a_clear_error(monkeypatch, s3_server, tmp_path):
    monkeypatch.chdir(tmp_path)  # no .env here
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(UserError, match="cannot read s3://test-bucket/x/model.pt"):
        sample.main(["--checkpoint", f"s3://{s3_server.bucket}/x/model.pt"])


def test_composer_checkpoint_on_s3_through_its_symlink(s3_env, tmp_path, capsys):
    folder = tmp_path / "composer_run"
    composer_checkpoint(folder, CONFIG, with_model_args=True)
    client = s3_env.client()
    target = os.path.basename(os.path.realpath(folder / "latest-rank0.pt"))  # ep0-ba2-rank0.pt
    client.upload_file(str(folder / target), s3_env.bucket, f"runs/c/{target}")
    # Composer's remote "latest" is a text object naming the checkpoint's object key
    client.put_object(Bucket=s3_env.bucket, Key="runs/c/latest-rank0.pt.symlink", Body=f"runs/c/{target}".encode())
    argv = ["--prompt", "A", "--max-new-tokens", "6", "--seed", "2"]
    local = run(capsys, "--checkpoint", str(folder), *argv)
    assert run(capsys, "--checkpoint", f"s3://{s3_env.bucket}/runs/c", *argv) == local
    assert run(capsys, "--checkpoint", f"s3://{s3_env.bucket}/runs/c/latest-rank0.pt", *argv) == local
