"""prepare_data.py's subsets through the command line: --include-subset with a name the input does not hold (the one
line names the subsets seen and the closest name), and --by-subset with several tokenizer processes (its
in-process tests: tests/unit/test_prepare_by_subset.py)."""

import prepare_data
from helpers import (
    PILE_SAMPLE,
    SUBSETS,
    failed_with_one_line,
    pile_by_component,
    read_bin,
    run_command,
    script,
    succeeded,
    write_records,
)
from pilegpt.data import read_subsets


def test_a_subset_name_in_the_wrong_case_names_the_subsets_seen_and_the_closest(tmp_path):
    cmd = script("prepare_data.py", "--input", PILE_SAMPLE / "train_00_head.jsonl.zst", "--include-subset", "pile-cc",
                 "--out-dir", tmp_path / "out")
    line = failed_with_one_line(run_command(cmd))
    assert "filtered out: 1" in line and "the subsets seen (documents): Pile-CC (1)" in line
    assert "did you mean --include-subset 'Pile-CC' for 'pile-cc'?" in line
    assert not (tmp_path / "out").exists()  # nothing written


def test_by_subset_through_the_command_line_with_two_processes_equals_include_subset_runs(tmp_path):
    """One command line, two tokenizer processes: each component folder holds the bytes a --include-subset run of
    that component writes, subsets.json lists them, and the summary is one line."""
    pile = pile_by_component(tmp_path / "pile")
    out = succeeded(run_command(script("prepare_data.py", "--input", pile, "--by-subset", "--num-proc", 2,
                                       "--out-dir", tmp_path / "out")))
    listed = read_subsets(tmp_path / "out")
    assert f"in {len(SUBSETS)} subsets from 3 files -> {tmp_path / 'out'}" in out
    assert sorted(e["name"] for e in listed) == sorted(SUBSETS)
    for entry in listed:
        alone = tmp_path / entry["folder"]
        prepare_data.main([str(a) for a in ("--input", pile, "--include-subset", entry["name"], "--out-dir", alone,
                                            "--num-proc", 1)])
        for split in ("train", "val"):
            mine = tmp_path / "out" / entry["folder"] / f"{split}.bin"
            assert mine.exists() == (alone / f"{split}.bin").exists()
            assert not mine.exists() or mine.read_bytes() == (alone / f"{split}.bin").read_bytes()


def test_a_component_named_like_a_file_the_run_writes_gets_a_folder_of_its_own(tmp_path):
    """Components named subsets.json and META.JSON (the names a prepared root holds): each goes to a folder no other
    name gives ("subsets.json_"), with a note; the run finishes, and its subsets.json is the index, not a folder."""
    names = ["subsets.json", "META.JSON", "Pile-CC"]
    write_records(tmp_path / "in.jsonl", [{"text": f"document {i} of {n}", "meta": {"pile_set_name": n}}
                                          for i in range(6) for n in names])
    args = ("--input", tmp_path / "in.jsonl", "--by-subset", "--num-proc", 1, "--out-dir", tmp_path / "out")
    out = succeeded(run_command(script("prepare_data.py", *args)))
    assert "note: subset 'subsets.json' goes to the folder subsets.json_ (subsets.json is a name" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "meta.json_", "pile-cc", "subsets.json", "subsets.json_"]
    assert (tmp_path / "out" / "subsets.json").is_file()
    listed = {e["name"]: e["folder"] for e in read_subsets(tmp_path / "out")}
    assert listed == {"subsets.json": "subsets.json_", "META.JSON": "meta.json_", "Pile-CC": "pile-cc"}
    for folder in listed.values():
        assert len(read_bin(tmp_path / "out" / folder / "train.bin")) > 0
    again = succeeded(run_command(script("prepare_data.py", *args, "--overwrite")))  # a rerun works too
    assert "in 3 subsets" in again


def test_a_subset_name_of_300_characters_gets_a_shortened_folder_or_one_line(tmp_path):
    """A 300-character subset name: its folder is the first 191 characters, "-" and 8 hex digits of the name's
    hash (a folder name the filesystem takes). Where even that is too long (an --out-dir near the path limit): one
    line naming the subset and --exclude-subset, and nothing left behind."""
    long_name = "Q" * 300
    write_records(tmp_path / "in.jsonl", [{"text": f"document {i}", "meta": {"pile_set_name": n}}
                                          for i in range(4) for n in (long_name, "Pile-CC")])
    args = ("--input", tmp_path / "in.jsonl", "--by-subset", "--num-proc", 1)
    out = succeeded(run_command(script("prepare_data.py", *args, "--out-dir", tmp_path / "out")))
    listed = {e["name"]: e["folder"] for e in read_subsets(tmp_path / "out")}
    assert len(listed[long_name]) == 200 and listed[long_name].startswith("q" * 191 + "-")
    assert f"goes to the folder {listed[long_name]} (its name has 300 characters, a folder at most 200)" in out
    assert len(read_bin(tmp_path / "out" / listed[long_name] / "train.bin")) == 4 * 3  # "document i" + EOT
    deep = tmp_path
    while len(str(deep)) < 3950:  # a path of 3,950 characters: its folder of 200 passes the 4,096 limit
        deep = deep / ("d" * min(200, 3950 - len(str(deep)) - 1))
    deep.mkdir(parents=True)
    line = failed_with_one_line(run_command(script("prepare_data.py", *args, "--out-dir", deep / "out")))
    assert line.startswith(f"error: subset {long_name!r}: its folder ") and "is a name too long" in line
    assert f"leave the subset out with --exclude-subset {long_name}, or choose a shorter --out-dir" in line
    assert not (deep / "out").exists()
