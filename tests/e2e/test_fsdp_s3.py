"""fsdp=True with an s3:// save_folder (the loopback S3 server), through `composer -n 2 train.py`: each rank uploads its
part of every sharded checkpoint, rank 0 the .metadata once every part is in the bucket, then the `latest` pointer; a
SIGTERMed run autoresumes from the bucket alone (another working folder, no local files) loss for loss, on 2
processes and on 1; a folder a kill left without its .metadata is set aside; no local copy stays behind."""

import os
import re
import time

import pytest

from e2e.test_fsdp import ARGS, RECIPES
from e2e.test_preemption import SLOW, started, stopped_batch
from helpers import (
    ACROSS_PROCESS_COUNTS,
    assert_same_losses,
    finish,
    losses_by_batch,
    read_jsonl,
    run_train,
    succeeded,
    wait_until,
)
from pilegpt.checkpoint import load_model, load_model_file
from pilegpt.common import UserError
from pilegpt.train.run.preemption import PREEMPTED
from pilegpt.train.run.resume import set_aside_broken_checkpoints
from pilegpt.train.run.uploads import S3Uploads, UploadSkipped

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.s3]
PARTS = [".metadata", "__0_0.distcp", "__1_0.distcp"]


def objects(s3_env, prefix: str) -> dict[str, bytes]:
    """Every object under prefix/ in the bucket, through the S3 API: name relative to the prefix -> its bytes."""
    client, found = s3_env.client(), {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_env.bucket, Prefix=f"{prefix}/"):
        for obj in page.get("Contents", []):
            body = client.get_object(Bucket=s3_env.bucket, Key=obj["Key"])["Body"].read()
            found[obj["Key"][len(prefix) + 1:]] = body
    return found


def sharded(found: dict[str, bytes]) -> dict[str, list[str]]:
    """checkpoint folder -> its object names, of the sharded checkpoints among `objects`."""
    folders: dict[str, list[str]] = {}
    for name in found:
        head, _, tail = name.partition("/")
        if head.startswith("ep0-ba") and tail:
            folders.setdefault(head, []).append(tail)
    return {k: sorted(v) for k, v in sorted(folders.items())}


def test_a_sigtermed_fsdp_run_on_s3_resumes_from_the_bucket_loss_for_loss_on_two_processes_then_one(
        shakespeare_bin, tmp_path, s3_env):
    args = [*RECIPES["adamw"], f"--data_dir={shakespeare_bin}", *ARGS, "--fsdp=True", "--max_duration=12ba"]
    prefix = f"fsdp-{os.getpid()}"
    (tmp_path / "whole").mkdir()
    succeeded(run_train([*args, f"--save_folder={tmp_path / 'whole' / 'run'}"], tmp_path / "whole", nproc=2))
    want = losses_by_batch(tmp_path / "whole" / "run")

    scratch = tmp_path / "tmp"  # the runs' TMPDIR, where Composer's saver keeps its local copies
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    save = [f"--save_folder=s3://{s3_env.bucket}/{prefix}/run", "--save_interval=2ba"]
    (tmp_path / "cut").mkdir()
    metrics = tmp_path / "cut" / "runs" / "f" / "metrics.jsonl"
    proc = started([*args, *save], tmp_path / "cut", 2, SLOW)
    wait_until(lambda: metrics.is_file() and any(r["batch"] >= 3 for r in read_jsonl(metrics)), proc, "batch 3")
    proc.send_signal(15)
    code, out = finish(proc, timeout=240)
    assert code == PREEMPTED, out[-4000:]
    stop = stopped_batch(out)
    assert 3 <= stop <= 9, out[-3000:]  # (0.3 s a batch: the stop comes a batch or two after the signal)
    found = objects(s3_env, f"{prefix}/run")
    checkpoints = sharded(found)
    assert checkpoints[f"ep0-ba{stop}"] == PARTS and all(v == PARTS for v in checkpoints.values()), checkpoints
    assert found["latest-rank0.pt.symlink"].decode() == f"{prefix}/run/ep0-ba{stop}"
    assert not [p for p in scratch.rglob("*") if not p.is_dir()]

    # a kill during the next checkpoint's upload: rank 0's part reached the bucket, its .metadata never did
    late = stop + 2 - stop % 2  # (save_interval=2ba)
    s3_env.client().put_object(Bucket=s3_env.bucket, Key=f"{prefix}/run/ep0-ba{late}/__0_0.distcp",
                               Body=found[f"ep0-ba{stop}/__0_0.distcp"])
    (tmp_path / "elsewhere").mkdir()  # another machine: nothing of the run but the bucket
    out = succeeded(run_train([*args, *save, "--autoresume=True"], tmp_path / "elsewhere", nproc=2, env=env))
    assert "incomplete sharded checkpoints set aside as *.broken-" in out and f": ep0-ba{late}; " in out, out[-3000:]
    assert f"resuming from the checkpoint at batch {stop} " in out, out[-3000:]
    assert_same_losses(losses_by_batch(tmp_path / "elsewhere" / "runs" / "f"), want, range(stop + 1, 13),
                       atol=1e-6)  # 2 processes as 2
    found = objects(s3_env, f"{prefix}/run")
    checkpoints = sharded(found)
    assert checkpoints[f"ep0-ba{late}"] == PARTS and checkpoints["ep0-ba12"] == PARTS, checkpoints
    assert [k for k in checkpoints if k.startswith(f"ep0-ba{late}.broken-")] and "model.pt" in found
    assert found["latest-rank0.pt.symlink"].decode() == f"{prefix}/run/ep0-ba12"
    assert not [p for p in scratch.rglob("*") if not p.is_dir()]

    # the run lost after its checkpoint of batch `late` (the resumed run's): that 2-process checkpoint, resumed by 1
    later = [name for name in found if (m := re.match(r"ep0-ba(\d+)/", name)) and int(m[1]) > late]
    s3_env.client().delete_objects(Bucket=s3_env.bucket, Delete={"Objects": [
        {"Key": f"{prefix}/run/{name}"} for name in later]})
    (tmp_path / "alone").mkdir()
    out = succeeded(run_train([*args, *save, "--autoresume=True"], tmp_path / "alone", env=env))
    assert (f"latest-rank0.pt.symlink was at ep0-ba12 (the run stopped before uploading it): resuming from "
            f"ep0-ba{late}") in out and f"resuming from the checkpoint at batch {late} " in out, out[-3000:]
    assert_same_losses(losses_by_batch(tmp_path / "alone" / "runs" / "f"), want, range(late + 1, 13),
                       atol=ACROSS_PROCESS_COUNTS)  # (measured: 1.9e-6; 2 processes as 2 above: 0.0)
    checkpoints = sharded(objects(s3_env, f"{prefix}/run"))
    assert checkpoints[f"ep0-ba{late}"] == PARTS and checkpoints["ep0-ba12"] == [".metadata", "__0_0.distcp"]
    assert not [p for p in scratch.rglob("*") if not p.is_dir()]
    # sample.py, eval.py and export_hf.py read the run folder in the bucket: its model.pt, the whole weights (the
    # uninterrupted run's within 1% of each tensor's largest value, as test_fsdp.py compares FSDP's with DDP's)
    mine, theirs = load_model(f"s3://{s3_env.bucket}/{prefix}/run"), load_model_file(str(tmp_path / "whole" / "run"
                                                                                         / "model.pt"))
    for (name, p), q in zip(mine.named_parameters(), theirs.parameters()):
        assert p.shape == q.shape and (p - q).abs().max() <= 1e-2 * q.abs().max() + 1e-6, name


def test_a_sharded_checkpoints_metadata_is_uploaded_once_every_ranks_part_is_in_the_bucket(s3_env, tmp_path):
    from composer.utils.remote_uploader import RemoteFilesExistingCheckStatus

    client, base = s3_env.client(), f"order-{os.getpid()}/run/ep0-ba2"
    for name in PARTS:
        (tmp_path / name).write_bytes(name.encode())
    uploads = S3Uploads(s3_env.bucket)
    try:  # rank 0's saver: its .metadata, its part, then the check of every rank's files before the pointer
        metadata = uploads.upload_file_async(f"{base}/.metadata", tmp_path / ".metadata", overwrite=False)
        mine = uploads.upload_file_async(f"{base}/__0_0.distcp", tmp_path / "__0_0.distcp", overwrite=False)
        check = uploads.check_remote_files_exist_async([f"{base}/{name}" for name in PARTS],
                                                       wait_before_next_try_in_seconds=0.05)
        assert mine.result(timeout=60) is None
        for _ in range(10):  # rank 1's part is not in yet: the .metadata stays back (the check polls meanwhile)
            assert not metadata.done() and not check.done()
            assert "Contents" not in client.list_objects_v2(Bucket=s3_env.bucket, Prefix=f"{base}/.metadata")
            uploads.check_workers()
            time.sleep(0.1)
        client.put_object(Bucket=s3_env.bucket, Key=f"{base}/__1_0.distcp", Body=b"rank 1's part")
        assert check.result(timeout=60) == RemoteFilesExistingCheckStatus.EXIST
        assert metadata.done() and metadata.exception() is None
        body = client.get_object(Bucket=s3_env.bucket, Key=f"{base}/.metadata")["Body"].read()
        assert body == b".metadata"

        # without the check (no pointer), wait() uploads a held .metadata last; a run that stops first never does
        later = uploads.upload_file_async(f"{base}4/.metadata", tmp_path / ".metadata", overwrite=False)
        uploads.wait()
        assert later.exception() is None and client.head_object(Bucket=s3_env.bucket, Key=f"{base}4/.metadata")
        never = uploads.upload_file_async(f"{base}6/.metadata", tmp_path / ".metadata", overwrite=False)
    finally:
        uploads.shutdown()
    assert isinstance(never.exception(), UploadSkipped)
    assert "Contents" not in client.list_objects_v2(Bucket=s3_env.bucket, Prefix=f"{base}6/")


def test_autoresume_points_latest_at_the_newest_complete_sharded_checkpoint_and_sets_aside_a_later_one(s3_env):
    client, bucket, prefix = s3_env.client(), s3_env.bucket, f"aside-{os.getpid()}"
    assert set_aside_broken_checkpoints(f"s3://{bucket}/{prefix}") is None  # nothing there yet
    for batch, names in ((2, PARTS), (4, PARTS), (6, PARTS[1:])):  # batch 6: a kill before its .metadata
        for name in names:
            client.put_object(Bucket=bucket, Key=f"{prefix}/ep0-ba{batch}/{name}", Body=f"{batch}{name}".encode())
    client.put_object(Bucket=bucket, Key=f"{prefix}/latest-rank0.pt.symlink", Body=f"{prefix}/ep0-ba2".encode())
    note = set_aside_broken_checkpoints(f"s3://{bucket}/{prefix}")
    assert re.fullmatch(r"incomplete sharded checkpoints set aside as \*\.broken-\d{8}-\d{6}/ \(the run stopped "
                        r"before its \.metadata was uploaded\): ep0-ba6; latest-rank0\.pt\.symlink was at ep0-ba2 "
                        r"\(the run stopped before uploading it\): resuming from ep0-ba4, the newest checkpoint",
                        note), note
    found = objects(s3_env, prefix)
    assert found["latest-rank0.pt.symlink"] == f"{prefix}/ep0-ba4".encode()
    checkpoints = sharded(found)
    aside = next(k for k in checkpoints if k.startswith("ep0-ba6.broken-"))
    assert checkpoints == {"ep0-ba2": PARTS, "ep0-ba4": PARTS, aside: PARTS[1:]}  # moved, never deleted
    assert found[f"{aside}/__1_0.distcp"] == b"6__1_0.distcp"
    assert set_aside_broken_checkpoints(f"s3://{bucket}/{prefix}") is None  # already right: nothing written

    for name in PARTS[1:]:  # only an incomplete one: set aside, and the run starts from scratch
        client.put_object(Bucket=bucket, Key=f"{prefix}-b/ep0-ba2/{name}", Body=b"part")
    note = set_aside_broken_checkpoints(f"s3://{bucket}/{prefix}-b")
    assert note.endswith(": ep0-ba2; no whole checkpoint is left: starting from scratch"), note
    found = objects(s3_env, f"{prefix}-b")
    assert [k.split(".broken-")[0] for k in sharded(found)] == ["ep0-ba2"] and "latest-rank0.pt.symlink" not in found


def test_a_sharded_checkpoint_in_the_bucket_read_by_sample_or_eval_is_one_line_naming_model_pt(s3_env):
    client, bucket, prefix = s3_env.client(), s3_env.bucket, f"read-{os.getpid()}"
    for name in PARTS:
        client.put_object(Bucket=bucket, Key=f"{prefix}/ep0-ba2/{name}", Body=b"part")
    client.put_object(Bucket=bucket, Key=f"{prefix}/latest-rank0.pt.symlink", Body=f"{prefix}/ep0-ba2".encode())
    with pytest.raises(UserError) as e:  # a run folder without its model.pt: the pointer leads to a folder of parts
        load_model(f"s3://{bucket}/{prefix}")
    assert str(e.value) == (f"cannot read s3://{bucket}/{prefix}: s3://{bucket}/{prefix}/ep0-ba2 is a sharded "
                            "checkpoint (fsdp=True), read only by train.py's autoresume: pass the run's model.pt, "
                            "which train.py writes beside it")
