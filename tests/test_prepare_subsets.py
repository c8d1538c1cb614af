"""prepare_data.py --include-subset with a name the input does not hold (issue 31, item 10): the one line names
the subsets seen and the closest name, through the command line."""

import subprocess
import sys

from helpers import PILE_SAMPLE, REPO


def test_a_subset_name_in_the_wrong_case_names_the_subsets_seen_and_the_closest(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "prepare_data.py"), "--input",
                        str(PILE_SAMPLE / "train_00_head.jsonl.zst"), "--include-subset", "pile-cc", "--out-dir",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "filtered out: 1" in errors[0] and "the subsets seen (documents): Pile-CC (1)" in errors[0]
    assert "did you mean --include-subset 'Pile-CC' for 'pile-cc'?" in errors[0]
    assert not (tmp_path / "out").exists()  # nothing written
