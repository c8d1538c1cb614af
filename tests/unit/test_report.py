"""report.py: a run's report.md, from a local run folder and from one on S3, with every figure and its source."""

import json

import pytest

import report
from pilegpt.train.config import TrainConfig

ROWS = [{"batch": 1, "tokens": 4096, "time_s": 1.0, "loss": 10.5, "tokens_per_sec": 4000.0},
        {"batch": 2, "tokens": 8192, "time_s": 2.0, "loss": 9.5, "tokens_per_sec": 5000.0, "val_loss": 9.25,
         "val_bpb": 4.125, "owt_loss": 9.75, "owt_bpb": 4.375, "hellaswag_acc": 0.25, "hellaswag_acc_norm": 0.3125},
        {"batch": 2, "tokens": 8192, "time_s": 2.5, "loss": 9.0, "tokens_per_sec": 6000.0, "val_loss": 9.0,
         "val_bpb": 4.0}]  # batch 2 again: a resumed run; the later row wins


def write_run(folder, metrics_name="metrics.jsonl"):
    config = {"config": {**TrainConfig(data_dir="d").__dict__, "n_layer": 2, "run_name": "r"}, "world_size": 2,
              "device": "cpu", "precision": "fp32", "gpu": None, "git_commit": "abc123", "python": "3.11.7",
              "torch": "2.7.0", "composer": "0.32.1", "streaming": "0.13.0", "numpy": "2.1.3", "host": "h",
              "started": "2026-12-01 00:00:00"}
    (folder / metrics_name).parent.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / metrics_name).write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (folder / "hellaswag.json").write_text(json.dumps({"task": "hellaswag", "n": 100, "acc": 0.27, "acc_norm": 0.28,
                                                       "source": "runs/r/model.pt", "predictions": []}))


def check(text: str, metrics_source: str) -> None:
    assert "| n_layer | `2` | `12` |" in text and "| data_dir | `'d'` | `None` |" in text
    assert "| n_head |" not in text  # unchanged settings are not listed
    assert "| val | 9.0000 | 4.0000 | 2 |" in text  # the later row of batch 2
    assert "| owt | 9.7500 | 4.3750 | 2 |" in text
    assert "throughput: 5,000 tokens/s" in text and "train loss: 9.7500 (mean of the last 2 batches)" in text
    assert f"| 25.00 | 31.25 | `{metrics_source}` |" in text  # in-training HellaSwag, with its source
    assert "eval.py on runs/r/model.pt (100 examples) | 27.00 | 28.00 | `hellaswag.json` |" in text
    assert "| OpenAI GPT-2 124M, this scoring | 28.59 | 29.55 |" in text and "![loss curve](loss.png)" in text


def test_report_of_a_local_run(tmp_path):
    write_run(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    check((tmp_path / "report.md").read_text(), str(tmp_path / "metrics.jsonl"))
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.s3
def test_report_of_a_run_on_s3_is_uploaded_beside_it(tmp_path, s3_env):
    write_run(tmp_path / "run", "logs/20261201-000000-metrics.jsonl")
    s3_env.upload_tree(tmp_path / "run", "runs/r")
    client = s3_env.client()
    assert report.main([f"s3://{s3_env.bucket}/runs/r"]) == 0
    text = client.get_object(Bucket=s3_env.bucket, Key="runs/r/report.md")["Body"].read().decode()
    check(text, f"s3://{s3_env.bucket}/runs/r/logs/20261201-000000-metrics.jsonl")
    assert client.head_object(Bucket=s3_env.bucket, Key="runs/r/loss.png")["ContentLength"] > 1000
