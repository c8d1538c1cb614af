"""mcli/ offline: the YAMLs' commands run here on tiny data (MCLI's parser on every YAML: tests/unit/test_mcli.py).

A YAML's `command` runs the way MCLI runs it: in a working directory that holds the repository at the git_repo
integration's `path`, with the YAML's env_variables, the AWS files an MCLI s3 secret mounts
(AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE) and the RUN_NAME the platform sets. The only changes are
listed in each test as substitutions: a tiny model, a loopback S3 server (conftest's rclone) for
s3://my-bucket, a local corpus for The Pile, no `pip install`. Every substitution has to match, so a script,
config or flag renamed in a YAML fails here, not on a paid cluster.

Run: prepare_pile.yaml (two parts at once, started by launch_prepare.sh) and pile_gpt.yaml on those parts.
pile_gpt_multinode.yaml's command is pile_gpt.yaml's plus one flag: checked to be so, and its config checked
on its 16 GPUs, in tests/unit/test_mcli.py. (Two simulated nodes on one machine would share /dev/shm, which
Streaming keys its state by.) A command's bare `python` and `composer` are this interpreter's
(helpers.interpreter_bin at the front of PATH), as the image's are its own.
"""

import json
import os
import shutil
import sys
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers import (
    LAUNCH_PREPARE,
    PLATFORM_VARS,
    REPO,
    SHAKESPEARE,
    TRAIN_COMMAND,
    TRAIN_YAML,
    finish,
    git_repo_integration,
    interpreter_bin,
    mcli_config,
    run_command,
    start,
    succeeded,
)
from pilegpt.tokenizer import gpt2
from pilegpt.train.data.loaders import mds_cache_dir

pytest.importorskip("mcli", reason="mosaicml-cli is a dev requirement (pip install -r requirements-dev.txt)")

PIP_INSTALL = "pip install -r requirements.txt"


NO_PIP = "true  # pip install: requirements.txt is installed here already"


# A model and run small enough for a busy 2-core CPU: 2 batches of 8 sequences of 64 tokens.
TINY = ("--n_layer=2 --n_head=2 --n_embd=32 --block_size=64 --global_batch_size=8 --device_train_microbatch_size=8 "
        "--warmup=1ba --max_duration=2ba --eval_interval=2ba --eval_subset_num_batches=1 --save_interval=2ba "
        "--sample_length=0 --num_workers=0 --progress_bar=False --hellaswag_examples=0")  # offline: no download


TINY_BLOCK = 64


def rewrite(text: str, substitutions: dict[str, str]) -> str:
    """Replace each key of `substitutions` by its value; a key that does not occur is an error (the YAML and
    this test no longer agree)."""
    for old, new in substitutions.items():
        assert old in text, f"{old!r} no longer occurs in:\n{text}\nUpdate the YAML or this test."
        text = text.replace(old, new)
    return text


def clone_repo(workdir: Path, final) -> Path:
    """What MCLI's git_repo integration does: the repository at `path` in the run's working directory (here
    the working tree, without data, runs or caches)."""
    dest = workdir / git_repo_integration(final)["path"]
    top = {"data", "runs", "mds", "out", "tb_logs", "wandb", "mlruns", ".venv"}  # at the top only: pilegpt/mds/ stays
    anywhere = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", ".benchmarks", ".env", "*.egg-info")

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(anywhere(folder, names)) | (top & set(names) if Path(folder) == REPO else set())

    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


def run_env(final, s3_server, secret_env: dict, substitutions: dict[str, str], extra: dict[str, str],
            bin_dir: Path) -> dict[str, str]:
    """The environment of an MCLI run here: this process's, less anything S3 or launcher related, plus the
    YAML's env_variables (rewritten), the s3 secret's files, the loopback endpoint, bin_dir (interpreter_bin) at
    the front of PATH, one torch thread per process (helpers.train_env) and `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "S3_")) and k not in PLATFORM_VARS | {"RANK", "LOCAL_RANK", "BASE_RANK"}}
    for name, value in final.env_variables.items():
        for old, new in substitutions.items():
            value = value.replace(old, new)
        env[name] = value
    env.update(secret_env)
    env["S3_ENDPOINT_URL"] = s3_server.endpoint_url  # the YAML's commented line for S3-compatible stores
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


def start_command(command: str, workdir: Path, env: dict):
    """A YAML's command in POSIX sh (so a bash-only construct in it fails here too), started with helpers.start."""
    return start(["sh", "-c", command], workdir, env)


def finished(proc, what: str, timeout: int = 400) -> str:
    """The output of a command started by start_command, which must succeed within `timeout` s."""
    code, out = finish(proc, timeout)
    assert code == 0, f"{what} failed ({code}):\n{out[-6000:]}"
    return out


def s3_keys(s3_server, prefix: str) -> set[str]:
    pages = s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=s3_server.bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def s3_prefix(url: str) -> str:
    """s3://bucket/prefix -> prefix"""
    return url.split("/", 3)[3]


def s3_json(s3_server, key: str) -> dict:
    return json.loads(s3_server.client().get_object(Bucket=s3_server.bucket, Key=key)["Body"].read())


def bucket_substitutions(s3_server, tmp: Path) -> dict[str, str]:
    """s3://my-bucket/... -> a fresh prefix in the loopback bucket; /tmp/pile-gpt... -> this test's folder."""
    prefix = f"mcli-{uuid.uuid4().hex[:8]}"
    return {"s3://my-bucket/": f"s3://{s3_server.bucket}/{prefix}/", "/tmp/pile-gpt": str(tmp / "pile-gpt")}


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory) -> Path:
    return interpreter_bin(tmp_path_factory.mktemp("bin"))


@pytest.fixture(scope="module")
def secret_env(tmp_path_factory, s3_server) -> dict[str, str]:
    """The two files `mcli create secret s3 --config-file ... --credentials-file ...` mounts in a run, and the
    variables MCLI sets to them; built with MCLI's own secret creator to check they make a valid secret."""
    from mcli.objects.secrets.create.s3 import S3SecretCreator

    home = tmp_path_factory.mktemp("home")
    (home / ".aws").mkdir()
    config, credentials = home / ".aws" / "config", home / ".aws" / "credentials"
    config.write_text("[default]\nregion = us-east-1\n")
    credentials.write_text(f"[default]\naws_access_key_id = {s3_server.access_key}\n"
                           f"aws_secret_access_key = {s3_server.secret_key}\n")
    secret = S3SecretCreator().create(name="my-s3-credentials", config_file=str(config),
                                      credentials_file=str(credentials))
    assert (secret.name, secret.profile) == ("my-s3-credentials", "default")
    return {"AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(credentials)}


def test_launch_prepare_rejects_a_bad_count(tmp_path):
    for bad in ("0", "31", "ten"):
        code, out = run_command(["bash", LAUNCH_PREPARE, bad], tmp_path, timeout=60)
        assert code == 2 and "1..30" in out


def write_pile_like_corpus(root: Path) -> dict[str, list[str]]:
    """Tiny Shakespeare's paragraphs as The Pile's layout: train/00..02, val and test .jsonl.zst."""
    import zstandard

    docs = [p for p in SHAKESPEARE.read_text().split("\n\n") if p.strip()]
    names = ["train/00.jsonl.zst", "train/01.jsonl.zst", "train/02.jsonl.zst", "val.jsonl.zst", "test.jsonl.zst"]
    files = {}
    (root / "train").mkdir(parents=True)
    for i, name in enumerate(names):
        files[name] = docs[i::len(names)]
        lines = "".join(json.dumps({"text": d, "meta": {"pile_set_name": "Shakespeare"}}) + "\n" for d in files[name])
        (root / name).write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))
    return files


def launch_prepare(tmp: Path, n: int) -> list[tuple[list[str], Path]]:
    """Run mcli/launch_prepare.sh with a stand-in `mcli` that keeps each `mcli run` call's arguments and YAML."""
    fake_bin, capture = tmp / "fake_mcli", tmp / "capture"
    fake_bin.mkdir()
    capture.mkdir()
    fake = fake_bin / "mcli"
    fake.write_text(f"#!{sys.executable}\n"
                    "import json, os, shutil, sys\n"
                    "cap = os.environ['MCLI_CAPTURE']\n"
                    "k = len([n for n in os.listdir(cap) if n.endswith('.json')])\n"
                    "args = sys.argv[1:]\n"
                    "shutil.copy(args[args.index('-f') + 1], os.path.join(cap, f'{k}.yaml'))\n"
                    "json.dump(args, open(os.path.join(cap, f'{k}.json'), 'w'))\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}", "MCLI_CAPTURE": str(capture)}
    out = succeeded(run_command(["bash", LAUNCH_PREPARE, n, "--cluster", "test-cluster"], tmp, env, timeout=60))
    assert f"started {n} runs" in out
    return [(json.loads((capture / f"{k}.json").read_text()), capture / f"{k}.yaml") for k in range(n)]


@pytest.fixture(scope="module")
def prepared_parts(tmp_path_factory, s3_server, secret_env, bin_dir):
    """launch_prepare.sh 2, then both runs' commands at once, on a Pile-like corpus, into the loopback S3."""
    from mcli.cli.cli import get_parser

    tmp = tmp_path_factory.mktemp("prepare")
    corpus = write_pile_like_corpus(tmp / "corpus")
    subs = bucket_substitutions(s3_server, tmp)
    runs, procs = [], []
    for k, (argv, path) in enumerate(launch_prepare(tmp, 2)):
        args = get_parser().parse_args(argv)
        assert (args.override_name, args.override_cluster) == (f"prepare-pile-{k:02d}", "test-cluster")
        _, final, messages = mcli_config(path)
        assert messages == [] and final.env_variables["SHARD_INDEX"] == str(k)
        assert final.env_variables["NUM_SHARDS"] == "2"
        workdir = tmp / f"run{k}"
        clone_repo(workdir, final)
        command = rewrite(final.command, {
            PIP_INSTALL: NO_PIP,
            "--dataset monology/pile-uncopyrighted": f"--dataset file://{tmp / 'corpus'}",
            # one tokenizer process; a tiny part needs more than 0.05% of its documents to have any val split
            '--num-shards "$NUM_SHARDS"': '--num-shards "$NUM_SHARDS" --num-proc 1 --val-fraction 0.02',
            "--block-size 1024": f"--block-size {TINY_BLOCK}",
        })
        env = run_env(final, s3_server, secret_env, {**subs, "/tmp/pile-prep": str(workdir / "prep")}, {}, bin_dir)
        runs.append({"env": env, "workdir": workdir})
        procs.append(start_command(command, workdir, env))
    outputs = [finished(p, f"prepare_pile.yaml part {k}") for k, p in enumerate(procs)]  # conftest: the other part
    for out in outputs:
        assert s3_server.secret_key not in out
    parts_remote = runs[0]["env"]["PARTS_REMOTE"]
    return {"corpus": corpus, "runs": runs, "outputs": outputs, "parts_remote": parts_remote,
            "parts": [f"{parts_remote}/part-{k:02d}" for k in range(2)]}


def test_prepare_parts_hold_every_document_once_in_s3(prepared_parts, s3_server):

    enc = gpt2()
    eot = enc.eot_token
    expected = Counter(tuple(enc.encode_ordinary(d)) for name, docs in prepared_parts["corpus"].items()
                       if not name.startswith("test") for d in docs)
    found, files = Counter(), []
    for k, run in enumerate(prepared_parts["runs"]):
        part_dir = Path(run["env"]["PREP_DIR"]) / f"part-{k:02d}"
        meta = json.loads((part_dir / "meta.json").read_text())
        files += meta["sources"]["files"]
        for split in ("train", "val"):
            tokens = np.memmap(part_dir / f"{split}.bin", dtype=np.uint16, mode="r")
            assert len(tokens) == meta["splits"][split]["tokens"] and tokens[-1] == eot
            cuts = np.flatnonzero(np.asarray(tokens) == eot)
            found.update(tuple(int(t) for t in doc) for doc in np.split(np.asarray(tokens), cuts + 1)[:-1])
            # The part is in S3 as MDS: every whole block_size window of this split, and nothing else.
            index = s3_json(s3_server, f"{s3_prefix(prepared_parts['parts'][k])}/{split}/index.json")
            assert sum(s["samples"] for s in index["shards"]) == (len(tokens) - 1) // TINY_BLOCK
    # Documents end with EOT: strip it from what was found.
    found = Counter({doc[:-1] if doc and doc[-1] == eot else doc: n for doc, n in found.items()})
    assert found == expected
    assert sorted(files) == sorted(n for n in prepared_parts["corpus"] if not n.startswith("test"))


def test_training_command_trains_on_the_prepared_parts_and_checkpoints_to_s3(
        prepared_parts, s3_server, secret_env, bin_dir, tmp_path):
    """pile_gpt.yaml's command with the --data_remote list that prepare_pile.yaml documents: both parts as
    streams of one dataset. (pile_gpt_multinode.yaml's command is this one plus a microbatch size, checked
    above on 16 GPUs; a two-node run cannot be simulated here: both "nodes" would share /dev/shm.)"""
    _, final, _ = mcli_config(TRAIN_YAML)
    subs = bucket_substitutions(s3_server, tmp_path)
    env = run_env(final, s3_server, secret_env, subs, {"RUN_NAME": "pile-gpt2-124m-a1b2c3"}, bin_dir)  # set by MCLI
    streams = "[" + ", ".join(f"'{part}'" for part in prepared_parts["parts"]) + "]"
    clone_repo(tmp_path, final)
    command = rewrite(final.command, {PIP_INSTALL: NO_PIP,
                                      TRAIN_COMMAND: f'{TRAIN_COMMAND} {TINY} --data_remote="{streams}"'})
    out = finished(start_command(command, tmp_path, env), "pile_gpt.yaml")
    assert "train.py: 1 process(es) on cpu" in out and "done: 2 batches" in out
    assert s3_server.secret_key not in out
    folder = s3_prefix(env["CHECKPOINT_FOLDER"])
    config = s3_json(s3_server, f"{folder}/config.json")["config"]
    assert config["data_remote"] == prepared_parts["parts"] and config["run_name"] == env["RUN_NAME"]
    # Everything a retry or sample.py needs is in CHECKPOINT_FOLDER on S3, written with the s3 secret's files.
    keys = s3_keys(s3_server, folder)
    assert {f"{folder}/ep0-ba2-rank0.pt", f"{folder}/model.pt"} <= keys, keys
    # Both parts were read: each stream's shards are in its own cache folder under DATA_LOCAL.
    for part in prepared_parts["parts"]:
        cache = Path(mds_cache_dir(env["DATA_LOCAL"], part, "train"))
        assert cache.is_relative_to(env["DATA_LOCAL"]) and list(cache.glob("shard.*.mds*")), part
