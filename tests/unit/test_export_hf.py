"""export_hf.py in this process: GPT-2's byte map, and the OUT_DIRs it refuses (inside, around or onto the run, a run
folder even with --overwrite) and vocabularies too small for GPT-2. The export itself, loaded in transformers:
tests/e2e/test_export_hf.py."""

import re

import pytest

import export_hf
from helpers import fake_run_folder, tiny_export
from pilegpt.common import UserError


def test_byte_map_is_gpt2s():
    m = export_hf.bytes_to_unicode()
    assert len(set(m.values())) == 256
    assert m[ord("A")] == "A" and m[ord(" ")] == "Ġ" and m[ord("\n")] == "Ċ" and m[0] == "Ā"


@pytest.mark.parametrize("src, out, where", [
    ("run", "run/hf", "lies inside the run folder"),
    ("run/model.pt", "run", "is the folder of"),
    ("run/model.pt", "run/sub/hf", "lies inside the folder of"),
    ("run", ".", "contains the run folder"),
    ("run", "link", "is the run folder"),  # a symlink to the run
    ("link/model.pt", "run/../run", "is the folder of"),
])
def test_an_out_dir_that_is_contains_or_lies_inside_the_source_is_refused(tmp_path, monkeypatch, src, out, where):
    before = fake_run_folder(tmp_path / "run")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=rf"^OUT_DIR {re.escape(out)} {where} {re.escape(src)} "):
        export_hf.main([src, out, "--overwrite"])
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


def test_overwrite_never_replaces_a_run_folder(tmp_path):
    before = fake_run_folder(tmp_path / "run")
    (tmp_path / "run" / "model.safetensors").write_bytes(b"x")  # even one that looks half like an export
    (tmp_path / "other").mkdir()
    with pytest.raises(UserError, match=r"run is not an earlier export \(it holds ep0-ba3-rank0.pt, model.pt\)"):
        export_hf.main([str(tiny_export(tmp_path / "other")), str(tmp_path / "run"), "--overwrite"])
    assert {p.name for p in (tmp_path / "run").iterdir()} == {*before, "model.safetensors"}


def test_small_vocabulary_is_refused(tmp_path):
    src = tiny_export(tmp_path, vocab_size=64)
    with pytest.raises(UserError, match="vocabulary has 64 tokens, fewer than GPT-2's 50257"):
        export_hf.main([str(src), str(tmp_path / "hf")])
    assert not (tmp_path / "hf").exists()
