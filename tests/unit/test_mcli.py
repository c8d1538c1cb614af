"""mcli/ offline: MCLI's own parser accepts every YAML without warnings, no credentials, every variable set and
read, config/pile.py valid on each YAML's GPUs, the documented `mcli` commands valid. The YAMLs' commands, run
here on tiny data: tests/e2e/test_mcli.py."""

import os
import re
import shlex
from pathlib import Path

import pytest

from helpers import (
    MCLI_DIR,
    MULTINODE_YAML,
    PLATFORM_VARS,
    PREPARE_YAML,
    REPO,
    TRAIN_COMMAND,
    TRAIN_YAML,
    git_repo_integration,
    mcli_config,
)
from pilegpt.train import config_load as train_config

pytest.importorskip("mcli", reason="mosaicml-cli is a dev requirement (pip install -r requirements-dev.txt)")

# Read by the libraries (Streaming, boto3) or common.py rather than config/pile.py.
LIBRARY_VARS = {"S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_MAX_ATTEMPTS"}
GIT_REPO_FIELDS = {"integration_type", "git_repo", "git_branch", "git_commit", "path", "ssh_clone", "pip_install",
                   "host"}  # the git_repo integration's documented parameters


# --------------------------------------------------------------------------------------------------------
# Helpers


def all_yamls() -> list[Path]:
    return sorted(MCLI_DIR.glob("*.yaml"))


def env_names_read_by(path: Path) -> set[str]:
    """Environment variables a Python file reads: os.environ.get("X"), os.getenv("X"), os.environ["X"]."""
    pattern = r"""os\.(?:environ\.get|getenv)\(\s*["'](\w+)["']|os\.environ\[\s*["'](\w+)["']"""
    return {a or b for a, b in re.findall(pattern, path.read_text())}


def command_args_after(command: str, prefix: str) -> list[str]:
    """The arguments that follow `prefix` on its line of the command."""
    lines = [line for line in command.splitlines() if line.strip().startswith(prefix)]
    assert len(lines) == 1, f"expected one line starting with {prefix!r} in:\n{command}"
    return shlex.split(lines[0].strip()[len(prefix):])


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
    """The `mcli ...` command lines written in mcli/, README.md and docs/ (a line, or a comment line, that starts with
    the command; a trailing # comment is not part of it)."""
    line = re.compile(r"^\s*(?:#\s*)?(?:\$\s*)?(mcli [a-z].*?)\s*(?:#.*)?$", re.M)
    found = set()
    for path in [*MCLI_DIR.glob("*"), REPO / "README.md", *(REPO / "docs").glob("*.md")]:
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


# --------------------------------------------------------------------------------------------------------
# The commands, run: data prep in 2 parallel parts (launch_prepare.sh), then training on both parts.


