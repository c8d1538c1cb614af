"""report.py: a run's report.md from a local run folder, with every figure and its source (from a run folder on S3:
tests/e2e/test_report.py)."""



import report
from helpers import check_report, write_report_run


def test_report_of_a_local_run(tmp_path):
    write_report_run(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    check_report((tmp_path / "report.md").read_text(), str(tmp_path / "metrics.jsonl"))
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


