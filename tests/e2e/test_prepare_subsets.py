"""prepare_data.py --include-subset with a name the input does not hold (issue 31, item 10): the one line names
the subsets seen and the closest name, through the command line."""

from helpers import PILE_SAMPLE, failed_with_one_line, run_command, script


def test_a_subset_name_in_the_wrong_case_names_the_subsets_seen_and_the_closest(tmp_path):
    cmd = script("prepare_data.py", "--input", PILE_SAMPLE / "train_00_head.jsonl.zst", "--include-subset", "pile-cc",
                 "--out-dir", tmp_path / "out")
    line = failed_with_one_line(run_command(cmd))
    assert "filtered out: 1" in line and "the subsets seen (documents): Pile-CC (1)" in line
    assert "did you mean --include-subset 'Pile-CC' for 'pile-cc'?" in line
    assert not (tmp_path / "out").exists()  # nothing written
