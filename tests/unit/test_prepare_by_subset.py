"""prepare_data.py --by-subset in this process: each component's folder equals a --include-subset run's, token for
token, from one pass over the input; a resume after a kill or an interruption ends byte-identical; folder names,
their collisions, records without the subset field, --subset-field, refusals. Its command line with several
tokenizer processes: tests/e2e/test_prepare_subsets.py.

The input is the Pile-format fixture cut into paragraphs of several components (helpers.pile_by_component)."""

import json
import os
import shutil
from pathlib import Path

import pytest

import prepare_data
from helpers import PILE_SAMPLE, SUBSETS, main_error, pile_by_component, read_bin, saved_state, write_records
from helpers import prepare_data_main as run
from pilegpt.common import UserError
from pilegpt.data import SUBSETS_NAME, Meta, read_subsets, subset_folder
from pilegpt.prepare import components, out_folder, sources


@pytest.fixture(scope="module")
def by_component(tmp_path_factory) -> tuple[Path, Path]:
    """(the input, its --by-subset output written in one pass)."""
    root = tmp_path_factory.mktemp("by_subset")
    pile = pile_by_component(root / "pile")
    run("--input", pile, "--by-subset", "--out-dir", root / "out", "--num-proc", 1)
    return pile, root / "out"


def test_subset_folder_names_are_filesystem_safe():
    assert [subset_folder(n) for n in SUBSETS + ["NIH ExPorter", "../etc", "a/b"]] == [
        "pile-cc", "gutenberg_pg-19", "ubuntu_irc", "wikipedia_en", "nih_exporter", "etc", "a_b"]
    with pytest.raises(UserError, match="no letter or digit"):
        subset_folder("(?)")


def test_each_component_equals_an_include_subset_run_token_for_token(by_component, tmp_path):
    pile, out = by_component
    listed = read_subsets(out)
    assert [e["name"] for e in listed] == sorted(SUBSETS, key=subset_folder)
    assert sorted(os.listdir(out)) == sorted([SUBSETS_NAME] + [subset_folder(n) for n in SUBSETS])
    for entry in listed:
        alone = tmp_path / entry["folder"]
        run("--input", pile, "--include-subset", entry["name"], "--out-dir", alone, "--num-proc", 1)
        meta = Meta.read(out / entry["folder"])
        assert meta.info["subset"] == entry["name"] and meta.info["val_split"] == "the dataset's validation files"
        for split in ("train", "val"):
            mine, theirs = out / entry["folder"] / f"{split}.bin", alone / f"{split}.bin"
            assert mine.exists() == theirs.exists(), (entry, split)
            if theirs.exists():
                assert mine.read_bytes() == theirs.read_bytes()
                assert meta.splits[split].tokens == entry["tokens"][split] == len(read_bin(mine)) > 0
    assert {e["name"]: bool(e["tokens"]["val"]) for e in listed} == {n: n in SUBSETS[:2] for n in SUBSETS}


def test_the_input_is_read_once(by_component, tmp_path, monkeypatch):
    pile, out = by_component
    opened = []
    real_open = sources.open_binary
    monkeypatch.setattr(sources, "open_binary", lambda src: opened.append(src.name) or real_open(src))
    run("--input", pile, "--by-subset", "--out-dir", tmp_path / "again", "--num-proc", 1)
    assert sorted(opened) == ["train_00.jsonl.zst", "train_01.jsonl", "val.jsonl.zst"]  # test.* is not read
    assert [p.name for p in sorted((tmp_path / "again").iterdir())] == sorted(os.listdir(out))


@pytest.mark.parametrize("stop_at", [2, 5, 9])
def test_a_killed_run_resumes_byte_identical(by_component, tmp_path, monkeypatch, stop_at):
    """A kill (no progress saved beyond the last commit; the files hold tokens the state does not record, and
    components it has not seen yet) at several points, then the same command: the same bytes as one run."""
    pile, out = by_component
    monkeypatch.setattr(sources, "CHUNK_BYTES", 700)  # many tasks per file
    monkeypatch.setattr(out_folder, "COMMIT_SECONDS", 0.0)
    real_write, writes = components.SubsetWriter.write, []

    def killed_after_writing(self, result, max_train):
        real_write(self, result, max_train)
        writes.append(1)
        if len(writes) == stop_at:
            raise KeyboardInterrupt

    monkeypatch.setattr(components.SubsetWriter, "write", killed_after_writing)
    monkeypatch.setattr(prepare_data, "keep_for_resume", lambda e, output, files: None)  # as after kill -9
    args = ("--input", pile, "--by-subset", "--out-dir", tmp_path / "out", "--num-proc", 1)
    with pytest.raises(KeyboardInterrupt):
        run(*args)
    state = saved_state(tmp_path / "out")
    assert state is not None and not (tmp_path / "out" / SUBSETS_NAME).exists()
    monkeypatch.setattr(components.SubsetWriter, "write", real_write)
    run(*args)
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.listdir(out))
    for entry in read_subsets(out):
        for name in ("train.bin", "val.bin", "meta.json"):
            mine, whole = tmp_path / "out" / entry["folder"] / name, out / entry["folder"] / name
            assert mine.exists() == whole.exists() and (not mine.exists() or mine.read_bytes() == whole.read_bytes())


def test_a_run_killed_while_publishing_completes(by_component, tmp_path, monkeypatch):
    pile, out = by_component
    real_place, placed = out_folder.place, []

    def killed_on_the_third(*a):
        placed.append(1)
        if len(placed) == 3:
            raise KeyboardInterrupt
        real_place(*a)

    monkeypatch.setattr(out_folder, "place", killed_on_the_third)
    args = ("--input", pile, "--by-subset", "--out-dir", tmp_path / "out", "--num-proc", 1)
    with pytest.raises(KeyboardInterrupt):
        run(*args)
    assert not (tmp_path / "out" / SUBSETS_NAME).exists()  # not a finished run
    monkeypatch.setattr(out_folder, "place", real_place)
    run(*args)
    assert (tmp_path / "out" / SUBSETS_NAME).read_text() == (out / SUBSETS_NAME).read_text()
    with pytest.raises(UserError, match="already holds a finished dataset; pass --overwrite"):
        run(*args)


def test_two_subsets_with_one_folder_name_are_one_line(tmp_path, capsys):
    write_records(tmp_path / "in.jsonl", [{"text": "a", "meta": {"pile_set_name": "Ubuntu IRC"}},
                                          {"text": "b", "meta": {"pile_set_name": "ubuntu-irc"}},
                                          {"text": "c", "meta": {"pile_set_name": "ubuntu  irc"}}])
    line = main_error(prepare_data.main, ["--input", tmp_path / "in.jsonl", "--by-subset", "--num-proc", 1,
                                          "--out-dir", tmp_path / "out"], capsys, alone=False)
    assert "the subsets 'Ubuntu IRC' and 'ubuntu  irc' both map to the folder" in line  # ubuntu-irc does not
    assert "ubuntu_irc; leave one out with --exclude-subset" in line and "(nothing written)" in line
    assert not (tmp_path / "out").exists()


def test_a_record_without_the_subset_field_is_file_and_line(tmp_path, capsys):
    write_records(tmp_path / "in.jsonl", [{"text": "a", "meta": {"pile_set_name": "A"}}, {"text": "b", "meta": {}}])
    argv = ["--input", tmp_path / "in.jsonl", "--by-subset", "--num-proc", 1, "--out-dir", tmp_path / "out"]
    line = main_error(prepare_data.main, argv, capsys, alone=False)
    assert line.startswith("error: in.jsonl:2: no string field 'meta.pile_set_name' to sort it by for --by-subset")
    assert not (tmp_path / "out").exists()
    (tmp_path / "in.jsonl").write_text('{"text": "a", "meta": {"pile_set_name": "A"}}\n{"text": \n')
    assert "in.jsonl:2: malformed JSON" in main_error(prepare_data.main, argv, capsys, alone=False)
    run(*argv, "--skip-bad-lines")
    assert read_subsets(tmp_path / "out")[0]["documents"] == {"train": 1, "val": 0}


def test_subset_field_is_any_dotted_path(tmp_path):
    dolma = PILE_SAMPLE / "dolma_cc_en"
    run("--input", dolma, "--by-subset", "--subset-field", "metadata.bucket", "--out-dir", tmp_path / "out",
        "--val-fraction", 0.2, "--num-proc", 1)
    run("--input", dolma, "--out-dir", tmp_path / "all", "--val-fraction", 0.2, "--num-proc", 1)
    index = json.loads((tmp_path / "out" / SUBSETS_NAME).read_text())
    assert index["subset_field"] == "metadata.bucket" and [e["folder"] for e in index["subsets"]] == ["head"]
    for split in ("train", "val"):  # one component: every document, the val split by the same hash
        mine, alone = tmp_path / "out" / "head" / f"{split}.bin", tmp_path / "all" / f"{split}.bin"
        assert mine.read_bytes() == alone.read_bytes()


def test_by_subset_refusals_are_one_line(tmp_path, capsys):
    def error(*argv):
        return main_error(prepare_data.main, ["--out-dir", tmp_path / "out", *argv], capsys)

    assert "--max-tokens does not go" in error("--input", PILE_SAMPLE, "--by-subset", "--max-tokens", 9)
    (tmp_path / "x.txt").write_text("one document")
    assert "--by-subset: x.txt is a text file" in error("--input", PILE_SAMPLE, tmp_path / "x.txt", "--by-subset")
    assert "--subset-field 'meta.'" in error("--input", PILE_SAMPLE, "--by-subset", "--subset-field", "meta.")
    assert not (tmp_path / "out").exists()


def test_a_kill_before_anything_was_kept_leaves_no_component_folder(tmp_path, monkeypatch):
    pile = pile_by_component(tmp_path / "pile")

    def stopped(self, result, max_train):
        raise KeyboardInterrupt

    monkeypatch.setattr(components.SubsetWriter, "write", stopped)
    with pytest.raises(KeyboardInterrupt):
        run("--input", pile, "--by-subset", "--out-dir", tmp_path / "out", "--num-proc", 1)
    assert not (tmp_path / "out").exists()


def test_overwrite_replaces_the_components_and_removes_those_no_longer_there(by_component, tmp_path):
    pile, out = by_component
    shutil.copytree(out, tmp_path / "out")
    run("--input", pile, "--by-subset", "--out-dir", tmp_path / "out", "--num-proc", 1, "--overwrite",
        "--exclude-subset", "Pile-CC")
    kept = [subset_folder(n) for n in SUBSETS if n != "Pile-CC"]
    assert sorted(os.listdir(tmp_path / "out")) == sorted([SUBSETS_NAME] + kept)
    assert [e["folder"] for e in read_subsets(tmp_path / "out")] == sorted(kept)
    for folder in kept:
        assert (tmp_path / "out" / folder / "train.bin").read_bytes() == (out / folder / "train.bin").read_bytes()


def test_reserved_and_overlong_names_get_folders_no_other_name_gives():
    assert [subset_folder(n) for n in ("subsets.json", "Meta.JSON", "train.bin", "val.bin.partial", "index.json",
                                       "to_mds.json", "subsets.json_", "subsets")] == [
        "subsets.json_", "meta.json_", "train.bin_", "val.bin.partial_", "index.json_", "to_mds.json_",
        "subsets.json_", "subsets"]
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    assert len(subset_folder(long_a)) == 200 and subset_folder(long_a) != subset_folder(long_b)
    assert subset_folder("a" * 200) == "a" * 200  # a name that fits is its own folder, as before
    assert subset_folder("\ud800" + "a" * 300).startswith("a" * 191 + "-")  # a lone surrogate hashes too
    for name in ("subsets.json", long_a, "x" * 195 + "." * 10 + "y" * 10):
        assert subset_folder(subset_folder(name)) == subset_folder(name)  # read_subsets checks folders so


def test_an_older_run_that_published_into_a_folder_named_subsets_json_completes(tmp_path, monkeypatch):
    """An older prepare_data put the component "subsets.json" in OUT/subsets.json/ and failed to publish (Is a
    directory), every re-run alike: the same command now moves that folder to subsets.json_ and finishes."""
    write_records(tmp_path / "in.jsonl", [{"text": f"doc {i}", "meta": {"pile_set_name": n}}
                                          for i in range(4) for n in ("subsets.json", "Pile-CC")])
    args = ("--input", tmp_path / "in.jsonl", "--by-subset", "--num-proc", 1, "--out-dir", tmp_path / "out")
    real_publish = components.publish
    monkeypatch.setattr(components, "publish", lambda out_dir, state: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        run(*args)
    state = saved_state(tmp_path / "out")  # as the older run left it: its index and folder named subsets.json
    state["publish"] = state["publish"].replace('"folder": "subsets.json_"', '"folder": "subsets.json"')
    state["metas"]["subsets.json"] = state["metas"].pop("subsets.json_")
    (tmp_path / "out" / out_folder.STATE_NAME).write_text(json.dumps(state))
    os.rename(tmp_path / "out" / "subsets.json_", tmp_path / "out" / "subsets.json")
    monkeypatch.setattr(components, "publish", real_publish)
    run(*args)
    assert {e["name"]: e["folder"] for e in read_subsets(tmp_path / "out")} == {
        "subsets.json": "subsets.json_", "Pile-CC": "pile-cc"}
    assert len(read_bin(tmp_path / "out" / "subsets.json_" / "train.bin")) == 4 * 3
    assert Meta.read(tmp_path / "out" / "subsets.json_").info["subset"] == "subsets.json"
