"""bench/bench_gpu.py: its --smoke run on CPU (main() in this process; each variant a train.py process, as on a GPU)
writes a row for every variant, so the GPU script cannot rot. The pieces only a GPU run exercises:
tests/unit/test_bench_gpu.py."""

from helpers import REPO, load_module

SCRIPT = REPO / "bench" / "bench_gpu.py"
bench = load_module(SCRIPT, "bench_gpu")


def test_smoke_run_has_every_variant_and_loader_row(tmp_path, one_torch_thread):
    out = tmp_path / "x.md"
    assert bench.main(["--smoke", "--out", str(out)]) == 0  # in this process; each variant is its own train.py process
    text = out.read_text()
    rows = table_rows(text)
    for v in bench.VARIANTS:
        assert v.name in rows, f"no row for {v.name}:\n{text}"
        if v.gpu_only:
            assert rows[v.name]["note"] == "skipped: GPU only (--smoke)"
        else:
            assert number(rows[v.name]["tokens/s"]) > 0, rows[v.name]
    assert rows[bench.BASELINE][f"vs {bench.BASELINE}"] == "1.00x"
    for workers in (2, 0):
        assert number(rows[f"loader, {workers} workers"]["samples/s"]) > 0
    assert "Recommended for config/pile.py, from this run: " in text and "num_workers=" in text
    # every run's output, metrics and Composer log are kept beside the table
    assert (tmp_path / "x_logs" / f"{bench.BASELINE}.out.txt").is_file()
    assert (tmp_path / "x_logs" / f"{bench.BASELINE}.metrics.jsonl").is_file()


def table_rows(markdown: str) -> dict[str, dict[str, str]]:
    """The markdown table's rows by their first cell, each as {column: cell}."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("| ")]
    columns = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(columns, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]]
    return {r["variant"]: r for r in rows}


def number(cell: str) -> float:
    return float(cell.replace(",", ""))
