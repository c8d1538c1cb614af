"""mcli/ offline: MCLI's own parser accepts every YAML, and the YAMLs' commands run here on tiny data.

A YAML's `command` runs the way MCLI runs it: in a working directory that holds the repository at the git_repo
integration's `path`, with the YAML's env_variables, the AWS files an MCLI s3 secret mounts
(AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE) and the RUN_NAME the platform sets. The only changes are
listed in each test as substitutions: a tiny model, a loopback S3 server (conftest's rclone) for
s3://my-bucket, a local corpus for The Pile, no `pip install`. Every substitution has to match, so a script,
config or flag renamed in a YAML fails here, not on a paid cluster.

Run: prepare_pile.yaml (two parts at once, started by launch_prepare.sh) and pile_gpt.yaml on those parts.
pile_gpt_multinode.yaml's command is pile_gpt.yaml's plus one flag: checked to be so, and its config checked
on its 16 GPUs. (Two simulated nodes on one machine would share /dev/shm, which Streaming keys its state by.)
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, SHAKESPEARE
from pilegpt.tokenizer import gpt2
from pilegpt.train import config as train_config
from pilegpt.train.loaders import mds_cache_dir

mcli = pytest.importorskip("mcli", reason="mosaicml-cli is a dev requirement (pip install -r requirements-dev.txt)")
from mcli import FinalRunConfig, RunConfig  # noqa: E402

MCLI_DIR = REPO / "mcli"
TRAIN_YAML = MCLI_DIR / "pile_gpt.yaml"
MULTINODE_YAML = MCLI_DIR / "pile_gpt_multinode.yaml"
PREPARE_YAML = MCLI_DIR / "prepare_pile.yaml"
LAUNCH_PREPARE = MCLI_DIR / "launch_prepare.sh"

PIP_INSTALL = "pip install -r requirements.txt"
NO_PIP = "true  # pip install: requirements.txt is installed here already"
TRAIN_COMMAND = "composer train.py config/pile.py"
# A model and run small enough for a busy 2-core CPU: 2 batches of 8 sequences of 64 tokens.
TINY = ("--n_layer=2 --n_head=2 --n_embd=32 --block_size=64 --global_batch_size=8 --device_train_microbatch_size=8 "
        "--warmup=1ba --max_duration=2ba --eval_interval=2ba --eval_subset_num_batches=1 --save_interval=2ba "
        "--sample_length=0 --num_workers=0 --progress_bar=False --hellaswag_examples=0")  # offline: no download
TINY_BLOCK = 64
# Set by the MCLI platform inside a run, never by the YAML.
PLATFORM_VARS = {"RUN_NAME", "NODE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"}
# Read by the libraries (Streaming, boto3) or common.py rather than config/pile.py.
LIBRARY_VARS = {"S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_MAX_ATTEMPTS"}
GIT_REPO_FIELDS = {"integration_type", "git_repo", "git_branch", "git_commit", "path", "ssh_clone", "pip_install",
                   "host"}  # the git_repo integration's documented parameters


# --------------------------------------------------------------------------------------------------------
# Helpers


def all_yamls() -> list[Path]:
    return sorted(MCLI_DIR.glob("*.yaml"))


def mcli_config(path: Path, caplog=None) -> tuple[RunConfig, FinalRunConfig, list[str]]:
    """Parse a YAML as `mcli run -f` does; returns the configs and every warning MCLI raised or logged."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_config = RunConfig.from_file(str(path))
        final = FinalRunConfig.finalize_config(run_config)
        final.to_create_run_api_input()  # the translation to the API request, done locally
    messages = [str(w.message) for w in caught]
    if caplog is not None:
        messages += [r.getMessage() for r in caplog.records if r.name.startswith("mcli") and r.levelno >= 30]
    return run_config, final, messages


def rewrite(text: str, substitutions: dict[str, str]) -> str:
    """Replace each key of `substitutions` by its value; a key that does not occur is an error (the YAML and
    this test no longer agree)."""
    for old, new in substitutions.items():
        assert old in text, f"{old!r} no longer occurs in:\n{text}\nUpdate the YAML or this test."
        text = text.replace(old, new)
    return text


def git_repo_integration(final: FinalRunConfig) -> dict:
    repos = [i for i in final.integrations if i.get("integration_type") == "git_repo"]
    assert len(repos) == 1, final.integrations
    return repos[0]


def clone_repo(workdir: Path, final: FinalRunConfig) -> Path:
    """What MCLI's git_repo integration does: the repository at `path` in the run's working directory (here
    the working tree, without data, runs or caches)."""
    dest = workdir / git_repo_integration(final)["path"]
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(
        ".git", "data", "runs", "mds", "out", "__pycache__", ".pytest_cache", ".benchmarks", ".env", "tb_logs",
        "wandb", "mlruns", ".venv", "*.egg-info"))
    return dest


def run_env(final: FinalRunConfig, s3_server, secret_env: dict, substitutions: dict[str, str],
            extra: dict[str, str]) -> dict[str, str]:
    """The environment of an MCLI run here: this process's, less anything S3 or launcher related, plus the
    YAML's env_variables (rewritten), the s3 secret's files, the loopback endpoint and `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "S3_")) and k not in PLATFORM_VARS | {"RANK", "LOCAL_RANK", "BASE_RANK"}}
    for name, value in final.env_variables.items():
        for old, new in substitutions.items():
            value = value.replace(old, new)
        env[name] = value
    env.update(secret_env)
    env["S3_ENDPOINT_URL"] = s3_server.endpoint_url  # the YAML's commented line for S3-compatible stores
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def start(command: str, workdir: Path, env: dict) -> subprocess.Popen:
    # POSIX sh, so a bash-only construct in a YAML command fails here too.
    return subprocess.Popen(["sh", "-c", command], cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, what: str, timeout: int = 400) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{out[-6000:]}"
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


def env_names_read_by(path: Path) -> set[str]:
    """Environment variables a Python file reads: os.environ.get("X"), os.getenv("X"), os.environ["X"]."""
    pattern = r"""os\.(?:environ\.get|getenv)\(\s*["'](\w+)["']|os\.environ\[\s*["'](\w+)["']"""
    return {a or b for a, b in re.findall(pattern, path.read_text())}


def command_args_after(command: str, prefix: str) -> list[str]:
    """The arguments that follow `prefix` on its line of the command."""
    lines = [line for line in command.splitlines() if line.strip().startswith(prefix)]
    assert len(lines) == 1, f"expected one line starting with {prefix!r} in:\n{command}"
    return shlex.split(lines[0].strip()[len(prefix):])


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


# --------------------------------------------------------------------------------------------------------
# Static checks: MCLI's parser, the fields we rely on, no secrets, env variables that something reads.


def test_the_three_run_files_exist():
    assert {p.name for p in all_yamls()} >= {TRAIN_YAML.name, MULTINODE_YAML.name, PREPARE_YAML.name}


@pytest.mark.parametrize("path", all_yamls(), ids=lambda p: p.name)
def test_yaml_parses_with_mcli_without_warnings(path, caplog):
    caplog.set_level("WARNING")
    run_config, final, messages = mcli_config(path, caplog)
    assert messages == []
    assert final.name and final.command.strip()
    # The image's torch is requirements.txt's pin, so pip keeps the image's CUDA build.
    torch_pin = re.search(r"^torch==([\d.]+)$", (REPO / "requirements.txt").read_text(), re.M).group(1)
    assert final.image.startswith(f"mosaicml/pytorch:{torch_pin}_cu12"), final.image
    assert isinstance(final.compute.get("gpus"), int) and final.compute.get("cluster")
    repo = git_repo_integration(final)
    assert set(repo) <= GIT_REPO_FIELDS, set(repo) - GIT_REPO_FIELDS
    assert repo["git_branch"] and repo["git_repo"].count("/") == 1 and repo["path"]
    assert f"cd {repo['path']}\n" in final.command  # the command starts in the clone
    assert all(isinstance(v, str) for v in final.env_variables.values()), "env values must be strings"
    assert final.scheduling.get("max_retries", 0) >= 1  # a failed or preempted run is retried and resumes


def test_an_unknown_field_is_reported(tmp_path, caplog):
    # The check above can fail: a misspelt field is a warning MCLI raises.
    bad = tmp_path / "bad.yaml"
    bad.write_text(TRAIN_YAML.read_text().replace("compute:\n  cluster:", "compute:\n  clustr:")
                   .replace("integrations:", "integration:"))
    _, _, messages = mcli_config(bad, caplog)
    assert any("clustr" in m for m in messages) and any("integration" in m for m in messages)


@pytest.mark.parametrize("path", all_yamls(), ids=lambda p: p.name)
def test_no_credentials_in_yaml(path):
    text = path.read_text()
    assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text)  # AWS access key id
    assert not re.search(r"(?i)aws_secret_access_key|aws_session_token|BEGIN [A-Z ]*PRIVATE KEY", text)
    # a 40-character secret access key: mixed case and digits (a hex commit sha is not one)
    assert not re.search(r"(?<![\w/+])(?=[\w/+]*[A-Z])(?=[\w/+]*[a-z])(?=[\w/+]*\d)[A-Za-z0-9/+]{40}(?![\w/+])",
                         text)
    _, final, _ = mcli_config(path)
    assert not [k for k in final.env_variables if re.search(r"(?i)secret|token|password|key", k)]


@pytest.mark.parametrize("path", all_yamls(), ids=lambda p: p.name)
def test_every_variable_in_a_command_is_set(path):
    _, final, _ = mcli_config(path)
    used = set(re.findall(r"\$\{?(\w+)", final.command))
    assigned = set(re.findall(r"^\s*(\w+)=", final.command, re.M))
    assert used <= set(final.env_variables) | assigned | PLATFORM_VARS, used - set(final.env_variables) - assigned
    # ...and every variable the YAML sets is read by something.
    read = env_names_read_by(REPO / "config" / "pile.py") | used | LIBRARY_VARS
    assert set(final.env_variables) <= read, set(final.env_variables) - read


@pytest.mark.parametrize("path", [TRAIN_YAML, MULTINODE_YAML], ids=lambda p: p.name)
def test_training_yaml_sets_what_config_pile_reads(path, monkeypatch):

    _, final, _ = mcli_config(path)
    env = final.env_variables
    read = env_names_read_by(REPO / "config" / "pile.py")
    assert {"DATA_REMOTE", "CHECKPOINT_FOLDER"} <= read & set(env)
    assert "RUN_NAME" not in env  # MCLI sets it to the run's name; checkpoints are found by CHECKPOINT_FOLDER
    assert env["CHECKPOINT_FOLDER"].startswith("s3://")  # a node's disk does not survive a retry
    # config/pile.py with this YAML's variables and arguments, on this YAML's number of GPUs: a valid config
    # (the global batch splits evenly over the GPUs and microbatches), reading the YAML's locations.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", str(final.compute["gpus"]))
    argv = [str(REPO / "config" / "pile.py"), *command_args_after(final.command, TRAIN_COMMAND)]
    cfg = train_config.load_config(argv)
    assert (cfg.data_remote, cfg.save_folder, cfg.data_local) == (env["DATA_REMOTE"], env["CHECKPOINT_FOLDER"],
                                                                 env["DATA_LOCAL"])
    assert cfg.autoresume and cfg.global_batch_size == 480
    # MCLI names each submission anew (name-a1b2c3): the checkpoints' folder must not depend on RUN_NAME.
    monkeypatch.setenv("RUN_NAME", "another-name-d4e5f6")
    again = train_config.load_config(argv)
    assert again.run_name == "another-name-d4e5f6" and again.save_folder == cfg.save_folder
    per_gpu = cfg.global_batch_size // final.compute["gpus"]
    assert per_gpu % cfg.device_train_microbatch_size == 0


def test_multinode_yaml_differs_from_one_node_only_where_documented():
    _, one, _ = mcli_config(TRAIN_YAML)
    _, multi, _ = mcli_config(MULTINODE_YAML)
    assert multi.compute["gpus"] in (16, 32) and one.compute["gpus"] == 8
    assert multi.image == one.image and multi.integrations == one.integrations
    assert multi.env_variables["DATA_REMOTE"] == one.env_variables["DATA_REMOTE"]
    assert multi.env_variables["CHECKPOINT_FOLDER"] != one.env_variables["CHECKPOINT_FOLDER"]
    assert multi.name != one.name
    assert command_args_after(one.command, TRAIN_COMMAND) == []
    assert command_args_after(multi.command, TRAIN_COMMAND) == ["--device_train_microbatch_size=15"]


def test_prepare_yaml_block_size_is_the_training_block_size():

    _, final, _ = mcli_config(PREPARE_YAML)
    args = command_args_after(final.command, "python to_mds.py")
    block = int(args[args.index("--block-size") + 1])
    cfg = train_config.load_config([str(REPO / "config" / "pile.py")])
    assert block == cfg.block_size == 1024


def documented_mcli_commands() -> list[str]:
    """The `mcli ...` command lines written in mcli/ and README.md (a line, or a comment line, that starts with
    the command; a trailing # comment is not part of it)."""
    line = re.compile(r"^\s*(?:#\s*)?(?:\$\s*)?(mcli [a-z].*?)\s*(?:#.*)?$", re.M)
    found = set()
    for path in [*MCLI_DIR.glob("*"), REPO / "README.md"]:
        if path.is_file():
            found |= {m.group(1) for m in line.finditer(path.read_text()) if "$" not in m.group(1)}
    return sorted(found)  # launch_prepare.sh's own `mcli run ... "$@"` is run in a test below


def test_documented_mcli_commands_are_valid(tmp_path, monkeypatch):
    """Each command parses with MCLI's own argument parser; the secrets build with MCLI's own creators (all but
    the API call), from files at the documented paths."""
    from mcli.cli.cli import get_parser
    from mcli.cli.m_create.secret import CREATORS

    commands = documented_mcli_commands()
    kinds = {" ".join(c.split()[1:4]) for c in commands}
    assert {"create secret git-ssh", "create secret s3"} <= kinds and any(c.startswith("mcli run") for c in commands)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n")
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")
    (tmp_path / ".aws" / "credentials").write_text("[default]\naws_access_key_id = x\naws_secret_access_key = y\n")
    parser = get_parser()
    for command in commands:
        argv = [os.path.expanduser(a) for a in shlex.split(command)[1:]]  # the shell expands ~
        args = vars(parser.parse_args(argv))  # a wrong subcommand or option exits (SystemExit): a failure
        if argv[0] == "run":
            assert args["file"] and (REPO / args["file"]).is_file(), command
        elif argv[:2] in (["create", "secret"], ["create", "secrets"]):
            assert args["secret_name"], f"{command}: name the secret explicitly (--name)"
            if argv[2] in ("git-ssh", "s3"):  # the others ask for their value interactively
                kwargs = {k: v for k, v in args.items()
                          if k not in ("func", "secret_type", "secret_name", "no_input", "verbose")}
                secret = CREATORS[args["secret_type"]]().create(name=args["secret_name"], **kwargs)
                assert secret.name == args["secret_name"]


def test_launch_prepare_rejects_a_bad_count(tmp_path):
    for bad in ("0", "31", "ten"):
        proc = subprocess.run(["bash", str(LAUNCH_PREPARE), bad], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 2 and "1..30" in proc.stderr


# --------------------------------------------------------------------------------------------------------
# The commands, run: data prep in 2 parallel parts (launch_prepare.sh), then training on both parts.


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
    bin_dir, capture = tmp / "bin", tmp / "capture"
    bin_dir.mkdir()
    capture.mkdir()
    fake = bin_dir / "mcli"
    fake.write_text(f"#!{sys.executable}\n"
                    "import json, os, shutil, sys\n"
                    "cap = os.environ['MCLI_CAPTURE']\n"
                    "k = len([n for n in os.listdir(cap) if n.endswith('.json')])\n"
                    "args = sys.argv[1:]\n"
                    "shutil.copy(args[args.index('-f') + 1], os.path.join(cap, f'{k}.yaml'))\n"
                    "json.dump(args, open(os.path.join(cap, f'{k}.json'), 'w'))\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "MCLI_CAPTURE": str(capture)}
    proc = subprocess.run(["bash", str(LAUNCH_PREPARE), str(n), "--cluster", "test-cluster"], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"started {n} runs" in proc.stdout
    return [(json.loads((capture / f"{k}.json").read_text()), capture / f"{k}.yaml") for k in range(n)]


@pytest.fixture(scope="module")
def prepared_parts(tmp_path_factory, s3_server, secret_env):
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
        env = run_env(final, s3_server, secret_env, {**subs, "/tmp/pile-prep": str(workdir / "prep")}, {})
        runs.append({"env": env, "workdir": workdir})
        procs.append(start(command, workdir, env))
    try:
        outputs = [finish(p, f"prepare_pile.yaml part {k}") for k, p in enumerate(procs)]
    finally:
        for p in procs:  # the other part, when one failed
            if p.poll() is None:
                p.kill()
    for out in outputs:
        assert s3_server.secret_key not in out
    parts_remote = runs[0]["env"]["PARTS_REMOTE"]
    return {"corpus": corpus, "runs": runs, "outputs": outputs, "parts_remote": parts_remote,
            "parts": [f"{parts_remote}/part-{k:02d}" for k in range(2)]}


@pytest.mark.slow
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


@pytest.mark.slow
def test_training_command_trains_on_the_prepared_parts_and_checkpoints_to_s3(
        prepared_parts, s3_server, secret_env, tmp_path):
    """pile_gpt.yaml's command with the --data_remote list that prepare_pile.yaml documents: both parts as
    streams of one dataset. (pile_gpt_multinode.yaml's command is this one plus a microbatch size, checked
    above on 16 GPUs; a two-node run cannot be simulated here: both "nodes" would share /dev/shm.)"""
    _, final, _ = mcli_config(TRAIN_YAML)
    subs = bucket_substitutions(s3_server, tmp_path)
    env = run_env(final, s3_server, secret_env, subs, {"RUN_NAME": "pile-gpt2-124m-a1b2c3"})  # set by MCLI
    streams = "[" + ", ".join(f"'{part}'" for part in prepared_parts["parts"]) + "]"
    clone_repo(tmp_path, final)
    command = rewrite(final.command, {PIP_INSTALL: NO_PIP,
                                      TRAIN_COMMAND: f'{TRAIN_COMMAND} {TINY} --data_remote="{streams}"'})
    out = finish(start(command, tmp_path, env), "pile_gpt.yaml")
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
