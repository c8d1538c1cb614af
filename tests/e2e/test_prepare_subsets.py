"""prepare_data.py's subsets through the command line: --include-subset with a name the input does not hold (the one
line names the subsets seen and the closest name), and --by-subset with several tokenizer processes (its
in-process tests: tests/unit/test_prepare_by_subset.py)."""

import prepare_data
from helpers import (
    PILE_SAMPLE,
    SUBSETS,
    failed_with_one_line,
    pile_by_component,
    run_command,
    script,
    succeeded,
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
