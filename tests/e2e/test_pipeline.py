"""The whole pipeline, each stage through its real command line: text -> prepare_data.py -> to_mds.py ->
upload_s3.py -> `python train.py` reading the shards from a real S3 server -> sample.py. (train.py through the
`composer` launcher, from S3: test_train.py's two-process run.)"""

import json

import numpy as np

from helpers import REPO, SHAKESPEARE, run_command, run_train, script, succeeded
from pilegpt.tokenizer import gpt2


def cli(*cmd, cwd=None) -> str:
    """A stage's command line, which must succeed: its output."""
    return succeeded(run_command(cmd, cwd))


def test_text_to_tokens_to_mds_to_s3_to_training_to_samples(s3_env, tmp_path):

    # 1. Shakespeare's speeches as a JSONL corpus (one document each), 10% held out by document hash.
    docs = [d for d in SHAKESPEARE.read_text().split("\n\n") if d.strip()][:3000]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    tokens_dir, mds_dir = tmp_path / "tokens", tmp_path / "mds"
    cli(*script("prepare_data.py", "--input", corpus, "--out-dir", tokens_dir, "--val-fraction", 0.1, "--num-proc", 2))
    meta = json.loads((tokens_dir / "meta.json").read_text())
    train_tokens = np.fromfile(tokens_dir / "train.bin", dtype=np.uint16)
    enc = gpt2()
    assert meta["splits"]["train"]["tokens"] == len(train_tokens) > 0 and meta["splits"]["val"]["tokens"] > 0
    assert sum(len(enc.encode_ordinary(d)) + 1 for d in docs) == sum(s["tokens"] for s in meta["splits"].values())

    # 2. MDS shards of 32-token samples; 3. uploaded to the S3 server (index.json last, verified).
    out = cli(*script("to_mds.py", "--bin", tokens_dir, "--out", mds_dir, "--block-size", 32))
    n_train = (len(train_tokens) - 1) // 32
    index = json.loads((mds_dir / "train" / "index.json").read_text())
    assert sum(shard["samples"] for shard in index["shards"]) == n_train and f"{n_train:,} samples" in out
    remote = f"s3://{s3_env.bucket}/pipeline/mds"
    cli(*script("upload_s3.py", mds_dir, remote))
    keys = {o["Key"] for o in s3_env.client().list_objects_v2(Bucket=s3_env.bucket, Prefix="pipeline/mds/")["Contents"]}
    assert {"pipeline/mds/train/index.json", "pipeline/mds/val/index.json"} <= keys

    # 4. Train from S3 for 6 batches, evaluating at the end.
    run_dir = tmp_path / "run"
    succeeded(run_train([REPO / "config" / "tiny.py", f"--data_remote={remote}", f"--data_local={tmp_path / 'cache'}",
                         "--block_size=32", "--n_embd=32", "--global_batch_size=4", "--device_train_microbatch_size=4",
                         "--max_duration=6ba", "--eval_interval=6ba", "--save_interval=6ba", "--warmup=2ba",
                         f"--save_folder={run_dir}", "--sample_length=4"], tmp_path))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert rows[-1]["tokens"] == 6 * 4 * 32  # Composer counted the x/y tokens
    assert any("val_loss" in r for r in rows)
    assert (run_dir / "ep0-ba6-rank0.pt").exists() and (run_dir / "model.pt").exists()
    assert n_train > 24

    # 5. Sample from the export.
    text = cli(*script("sample.py", "--checkpoint", run_dir / "model.pt", "--prompt", "ROMEO:", "--max-new-tokens", 5,
                       "--seed", 1, "--device", "cpu"))
    assert "ROMEO:" in text
