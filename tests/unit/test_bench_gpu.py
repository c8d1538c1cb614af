"""bench/bench_gpu.py: its --smoke run on CPU writes a row for every variant (so the GPU script cannot rot), and the
pieces that only a GPU run exercises (peak memory from Composer's file log, the MFU peak table) read what they should.
"""

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "bench" / "bench_gpu.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = load_bench()


def table_rows(markdown: str) -> dict[str, dict[str, str]]:
    """The markdown table's rows by their first cell, each as {column: cell}."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("| ")]
    columns = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(columns, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]]
    return {r["variant"]: r for r in rows}


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.mark.slow
def test_smoke_run_has_every_variant_and_loader_row(tmp_path):
    out = tmp_path / "x.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
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


def test_peak_memory_and_auto_microbatch_are_read_from_composer_file_log():
    from composer.loggers.logger import format_log_data_value

    # what composer.loggers.FileLogger.log_metrics writes for MemoryMonitor and the trainer's microbatch size
    def line(batch, name, value):
        return f"[metric][batch={batch}]: {name}: {format_log_data_value(value)} \n"

    text = "".join([line(1, "trainer/device_train_microbatch_size", 60),
                    line(1, "memory/peak_allocated_mem", 131.2345), line(1, "memory/current_allocated_mem", 2.5),
                    line(2, "trainer/device_train_microbatch_size", 30),
                    line(2, "memory/peak_allocated_mem", 131.2345), line(3, "loss/train/total", 10.9)])
    assert bench.read_file_log(text) == (131.2345, 30)
    assert bench.read_file_log(line(1, "loss/train/total", 10.9)) == (None, None)  # a CPU run


def test_step_timing_leaves_out_warmup_and_last_step():
    # 100 tokens per step; steps 1-2 slow (warm-up), step 5 slow (the final eval and checkpoint)
    times = {1: 9.0, 2: 10.0, 3: 10.5, 4: 11.0, 5: 20.0}
    rows = [{"batch": b, "tokens": 100 * b, "time_s": t} for b, t in times.items()]
    assert bench.step_timing(rows, warmup=2, last_step=5) == (200.0, 2)
    assert bench.step_timing(rows[:2], warmup=2, last_step=5) == (None, 0)


@pytest.mark.parametrize("name, tflops", [("NVIDIA H200", 989), ("NVIDIA H100 80GB HBM3", 989),
                                          ("NVIDIA H100 PCIe", 756), ("NVIDIA A100-SXM4-80GB", 312),
                                          ("NVIDIA L4", 121), ("NVIDIA L40S", 362), ("Tesla T4", None)])
def test_mfu_peak_is_found_by_device_name(name, tflops):
    assert bench.peak_tflops(name) == tflops
