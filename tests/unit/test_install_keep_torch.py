"""scripts/install_keep_torch.py (make install-keep-torch): what it installs around the installed torch, and that
it never asks pip for torch, torchvision or numpy. pip itself is not run here (.ci/run runs the real install)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def keep():
    spec = importlib.util.spec_from_file_location("install_keep_torch", ROOT / "scripts" / "install_keep_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pinned_stack_is_left_out_of_what_goes_in_around_torch(keep):
    for name in ("requirements.txt", "requirements-dev.txt"):
        names = {keep.requirement_name(line) for line in keep.around_torch(ROOT / name)}
        assert names and not names & {"torch", "torchvision", "numpy", "mosaicml", "mosaicml-streaming"}
    dev = {keep.requirement_name(line) for line in keep.around_torch(ROOT / "requirements-dev.txt")}
    assert {"pytest", "lm-eval", "tiktoken", "boto3"} <= dev  # -r includes followed
    kept = {keep.requirement_name(line) for line in keep.requirement_lines(ROOT / keep.DEPS_FILE)}
    assert kept and not kept & {"torch", "torchvision", "numpy"}


def test_composer_and_streaming_go_in_at_requirements_txts_versions(keep):
    assert keep.pins(ROOT / "requirements.txt", keep.NO_DEPS) == ["mosaicml==0.32.1", "mosaicml-streaming==0.13.0"]


def test_requirements_lines_are_read_by_name(keep):
    assert keep.requirement_name("torch==2.7.0  # pinned") == "torch"
    assert keep.requirement_name("Torch_Optimizer>=0.3") == "torch-optimizer"
    assert keep.requirement_name("moto[s3]") == "moto"
    assert keep.requirement_name("-r requirements.txt") is None
    assert keep.requirement_name("   # a comment") is None and keep.requirement_name("") is None


@pytest.mark.parametrize("torch_version, torchvision", [("2.7.0", "0.22.0"), ("2.14.1", "0.29.1"),
                                                        ("2.11.0+cu130", "0.26.0"), ("2.9.1+cpu", "0.24.1")])
def test_the_torchvision_built_with_torch(keep, torch_version, torchvision):
    assert keep.matching_torchvision(torch_version) == torchvision


def test_no_torchvision_for_an_unknown_torch_is_one_line(keep):
    with pytest.raises(keep.UserError, match="install the torchvision built with this torch"):
        keep.matching_torchvision("3.0.0")


def test_pip_is_constrained_to_the_installed_torch_and_the_marker_is_written(keep, monkeypatch, tmp_path):
    calls, versions = [], {"torch": "2.14.1", "torchvision": None, "numpy": "2.5.5"}

    def pip(args):
        constraint = Path(args[args.index("-c") + 1]).read_text()
        calls.append((args, constraint))

    monkeypatch.setattr(keep, "pip", pip)
    monkeypatch.setattr(keep, "installed", versions.get)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert keep.main([]) == 0
    (first, constraint), (second, _) = calls
    assert constraint == "torch==2.14.1\nnumpy==2.5.5\n"  # torch and numpy stay; no torchvision to keep
    assert "--no-deps" in second and second[-3:] == ["mosaicml==0.32.1", "mosaicml-streaming==0.13.0",
                                                       "torchvision==0.29.1"]
    assert (tmp_path / keep.MARKER).read_text() == "2.14.1\n"


def test_without_torch_it_refuses_in_one_line(keep, monkeypatch, tmp_path):
    monkeypatch.setattr(keep, "installed", lambda name: None)
    monkeypatch.setattr(keep, "pip", lambda args: pytest.fail("pip ran"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(keep.UserError, match="no torch to keep.*make install"):
        keep.main([])
    assert not (tmp_path / keep.MARKER).exists()


def test_the_makefile_takes_the_keep_torch_path_only_where_the_marker_is(keep, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    keep.main(["--marked"])
    assert capsys.readouterr().out == ""
    (tmp_path / keep.MARKER).write_text("2.14.1\n")
    keep.main(["--marked"])
    assert capsys.readouterr().out.strip() == str(tmp_path / keep.MARKER)
