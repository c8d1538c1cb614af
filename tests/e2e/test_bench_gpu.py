"""bench/bench_gpu.py: its --smoke run on CPU (main() in this process; each variant a train.py process, as on a GPU)
writes its rows, and every variant's train.py settings are ones train.py takes, so the GPU script cannot rot. The
pieces only a GPU run exercises: tests/unit/test_bench_gpu.py."""

import train
from helpers import REPO, load_module
from pilegpt.train.config_load import read_config_file

SCRIPT = REPO / "bench" / "bench_gpu.py"
bench = load_module(SCRIPT, "bench_gpu")


RUN = ("eager-50257-fixed", "eager-50304-modern", "compile-50304-fixed")  # the baseline, a preset file, a GPU row


def test_smoke_run_has_its_variants_and_loader_rows(tmp_path, one_torch_thread):
    out = tmp_path / "x.md"
    # in this process; each variant is its own train.py process (two run on CPU: the others differ from them only
    # in values, which test_every_variants_settings_are_ones_train_py_takes checks)
    assert bench.main(["--smoke", "--out", str(out), "--only", *RUN]) == 0
    text = out.read_text()
    rows = table_rows(text)
    for v in bench.VARIANTS:
        if v.name not in RUN:
            assert v.name not in rows
        elif v.gpu_only:
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


def test_every_variants_settings_are_ones_train_py_takes(tmp_path):
    setup = bench.Setup(tmp_path / "data", tmp_path, None, 64, 8, 4, 8, 3, True, [])
    for v in bench.VARIANTS:
        cfg, _ = train.read_config(bench.variant_settings(setup, v, "amp_bf16"))
        preset = read_config_file(str(REPO / "config" / v.preset)) if v.preset else {}
        assert (cfg.vocab_size, cfg.compile, cfg.precision) == (v.vocab_size, v.compile, "amp_bf16"), v.name
        assert cfg.optimizer == preset.get("optimizer", v.optimizer), v.name  # the preset file comes last
        assert all(getattr(cfg, k) == preset[k] for k in ("pos_emb", "norm", "mlp") if k in preset), v.name
        assert cfg.device_train_microbatch_size == ("auto" if v.auto_microbatch else 4), v.name
        assert (cfg.max_duration, cfg.global_batch_size, cfg.block_size) == ("8ba", 8, 64), v.name
    assert any(v.preset for v in bench.VARIANTS) and any(v.optimizer == "muon" for v in bench.VARIANTS)


def table_rows(markdown: str) -> dict[str, dict[str, str]]:
    """The markdown table's rows by their first cell, each as {column: cell}."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("| ")]
    columns = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(columns, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]]
    return {r["variant"]: r for r in rows}


def number(cell: str) -> float:
    return float(cell.replace(",", ""))
