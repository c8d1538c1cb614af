"""bench/bench_gpu.py: the pieces that only a GPU run exercises (peak memory from Composer's file log, step timing,
the MFU peak table) read what they should. Its --smoke run on CPU: tests/e2e/test_bench_gpu.py."""

import pytest

from helpers import REPO, load_module

SCRIPT = REPO / "bench" / "bench_gpu.py"
bench = load_module(SCRIPT, "bench_gpu")


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
