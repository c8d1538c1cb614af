"""uploads.S3Uploads, the training run's one uploader, against the real loopback S3 server: it is what Composer's
checkpoint saver uploads with, every upload is in the bucket when wait() returns, and the first failure is the
one error reported (tests/e2e/test_faults.py loses the server mid-training through train.py)."""

import os

import pytest

from pilegpt.common import UserError
from pilegpt.train.run.uploads import S3Uploads, checkpoint_uploads


def test_composers_checkpoint_saver_uploads_through_it(s3_env):
    from composer.callbacks import CheckpointSaver
    from composer.utils.remote_uploader import RemoteUploader

    uploads = S3Uploads(s3_env.bucket)
    with checkpoint_uploads(uploads):
        saver = CheckpointSaver(folder=f"s3://{s3_env.bucket}/runs/x")
    assert saver.remote_uploader is uploads
    assert isinstance(CheckpointSaver(folder=f"s3://{s3_env.bucket}/runs/y").remote_uploader, RemoteUploader)
    uploads.finish()


def test_every_upload_is_in_the_bucket_when_wait_returns_and_the_file_may_change_meanwhile(s3_env, tmp_path):
    from composer.utils.remote_uploader import RemoteFilesExistingCheckStatus

    uploads = S3Uploads(s3_env.bucket)
    files = []
    for i in range(6):
        files.append(tmp_path / f"ep0-ba{i}-rank0.pt")
        files[-1].write_bytes(os.urandom(100_000 + i))
        uploads.upload_file_async(f"runs/u/{files[-1].name}", files[-1], overwrite=False)
        files[-1].unlink()  # the saver deletes rotated checkpoints; the upload took a copy
    check = uploads.check_remote_files_exist_async([f"runs/u/{f.name}" for f in files])
    uploads.wait()
    assert check.result() == RemoteFilesExistingCheckStatus.EXIST
    served = s3_env.root / s3_env.bucket / "runs" / "u"
    assert sorted(p.stat().st_size for p in served.iterdir()) == [100_000 + i for i in range(6)]
    staging = uploads._staging
    uploads.finish()
    assert not os.path.exists(staging)


def test_an_existing_checkpoint_is_never_replaced_and_is_the_one_error_reported(s3_env, tmp_path):
    s3_env.client().put_object(Bucket=s3_env.bucket, Key="runs/v/ep0-ba2-rank0.pt", Body=b"the user's checkpoint")
    uploads = S3Uploads(s3_env.bucket)
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"new")
    uploads.upload_file_async("runs/v/ep0-ba2-rank0.pt", path, overwrite=False).exception()
    later = [uploads.upload_file_async(f"runs/v/log{i}.txt", path, overwrite=True) for i in range(3)]
    with pytest.raises(UserError) as e:
        uploads.wait()
    assert str(e.value).startswith(f"uploading s3://{s3_env.bucket}/runs/v/ep0-ba2-rank0.pt failed, training "
                                   "stopped: the object already exists: pass --save_overwrite=True")
    body = s3_env.client().get_object(Bucket=s3_env.bucket, Key="runs/v/ep0-ba2-rank0.pt")["Body"].read()
    assert body == b"the user's checkpoint"
    assert all(f.exception() is not None for f in later)  # skipped after the failure: the run stops promptly
    assert not (s3_env.root / s3_env.bucket / "runs" / "v" / "log0.txt").exists()
    uploads.finish()


def test_autoresume_points_latest_at_the_newest_checkpoint_the_pointer_upload_missed(s3_env):
    from pilegpt.train.run.resume import set_aside_broken_checkpoints

    client, bucket = s3_env.client(), s3_env.bucket
    assert set_aside_broken_checkpoints(f"s3://{bucket}/runs/p") is None  # nothing there yet
    for batch in (2, 4, 10):
        client.put_object(Bucket=bucket, Key=f"runs/p/ep0-ba{batch}-rank0.pt", Body=b"ckpt")
    # A run stopped after uploading ep0-ba10 but before the pointer that names it: the pointer is missing, or
    # names an older checkpoint. Composer's autoresume follows it; it must name the newest.
    for before in (None, b"runs/p/ep0-ba4-rank0.pt"):
        if before is None:
            client.delete_object(Bucket=bucket, Key="runs/p/latest-rank0.pt.symlink")
        else:
            client.put_object(Bucket=bucket, Key="runs/p/latest-rank0.pt.symlink", Body=before)
        note = set_aside_broken_checkpoints(f"s3://{bucket}/runs/p")
        assert note.endswith("resuming from ep0-ba10-rank0.pt, the newest checkpoint")
        assert ("missing" if before is None else "at ep0-ba4-rank0.pt") in note
        pointer = client.get_object(Bucket=bucket, Key="runs/p/latest-rank0.pt.symlink")["Body"].read()
        assert pointer == b"runs/p/ep0-ba10-rank0.pt"
        assert set_aside_broken_checkpoints(f"s3://{bucket}/runs/p") is None  # already right: nothing written
