"""report.py on a run folder on S3: report.md and the loss plot are uploaded beside it, every figure with its source
(a local run folder: tests/unit/test_report.py)."""


import pytest

import report
from helpers import check_report, write_report_run


@pytest.mark.s3
def test_report_of_a_run_on_s3_is_uploaded_beside_it(tmp_path, s3_env):
    write_report_run(tmp_path / "run", "logs/20261201-000000-metrics.jsonl")
    s3_env.upload_tree(tmp_path / "run", "runs/r")
    client = s3_env.client()
    assert report.main([f"s3://{s3_env.bucket}/runs/r"]) == 0
    text = client.get_object(Bucket=s3_env.bucket, Key="runs/r/report.md")["Body"].read().decode()
    check_report(text, f"s3://{s3_env.bucket}/runs/r/logs/20261201-000000-metrics.jsonl")
    assert client.head_object(Bucket=s3_env.bucket, Key="runs/r/loss.png")["ContentLength"] > 1000
