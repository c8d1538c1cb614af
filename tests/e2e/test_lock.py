"""pilegpt/train/run/lock.py on the loopback S3 server: an s3:// save_folder is held as a local one is (those:
tests/unit/test_lock.py)."""

import json

import pytest

from pilegpt.common import UserError
from pilegpt.train.run import lock


def test_an_s3_save_folder_is_held_the_same_way(s3_env):
    folder = f"s3://{s3_env.bucket}/runs/locked"
    with lock.hold(folder, "first"):
        key = "runs/locked/.lock"
        body = s3_env.client().get_object(Bucket=s3_env.bucket, Key=key)["Body"].read()
        assert json.loads(body)["run_name"] == "first"
        with pytest.raises(UserError, match=rf"^{folder} is in use by run 'first' .*delete {folder}/.lock\)$"):
            lock.acquire(folder, "second")
    assert "Contents" not in s3_env.client().list_objects_v2(Bucket=s3_env.bucket, Prefix=key)
