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


def test_race_curve_is_read_between_evaluations():
    curve = [(10.0, 6.0), (20.0, 5.0), (30.0, 4.0)]
    assert bench.reaches(curve, 5.5) == 15.0  # halfway from 6.0 at 10 s to 5.0 at 20 s
    assert bench.reaches(curve, 6.5) == 10.0  # already below at the first evaluation
    assert bench.reaches(curve, 4.0) == 30.0
    assert bench.reaches(curve, 3.9) is None  # never reached
    assert bench.loss_at(curve, 25.0) == 4.5
    assert bench.loss_at(curve, 10.0) == 6.0
    assert bench.loss_at(curve, 5.0) is None and bench.loss_at(curve, 31.0) is None and bench.loss_at([], 1.0) is None


def test_race_seconds_shrink_alike_to_fit_the_budget():
    args = bench.parse_args(["--race-s", "100"])
    assert bench.race_seconds(args, left=3 * (100 + bench.RACE_OVERHEAD_S["gpu"]) + 30, n=3) == 100
    # 150 s short: each contestant gets 50 s less, the same for all
    assert bench.race_seconds(args, left=3 * (100 + bench.RACE_OVERHEAD_S["gpu"]) - 150, n=3) == 50
    assert bench.race_seconds(bench.parse_args([]), left=1e9, n=2) == bench.RACE_S["gpu"]


@pytest.mark.parametrize("flags, message", [(["--race-s", "nan"], "--race-s takes seconds >= 0"),
                                            (["--race-s", "-1"], "--race-s takes seconds >= 0"),
                                            (["--budget-s", "inf"], "--budget-s takes seconds > 0"),
                                            (["--budget-s", "0"], "--budget-s takes seconds > 0"),
                                            (["--race-tokens", "10"], "--race-tokens takes at least"),
                                            (["--loader-workers", "2,x"], "--loader-workers takes counts")])
def test_bad_bench_flags_are_one_line_errors(flags, message):
    from pilegpt.common import UserError
    from pilegpt.train.config_load import read_config_file

    with pytest.raises(UserError, match=message):
        bench.make_plan(bench.parse_args(["--smoke", *flags]), read_config_file(str(REPO / "config" / "pile.py")))


def test_race_has_nanochat_when_its_config_exists():
    here, notes = bench.contestants()
    names = [c.name for c in here]
    assert names[:2] == ["gpt2", "modern"]
    if (REPO / "config" / "nanochat.py").is_file():
        assert names == ["gpt2", "modern", "nanochat"] and notes == []
    else:
        assert names == ["gpt2", "modern"]
        assert notes == ["nanochat: skipped, config/nanochat.py is not in this checkout"]


def test_race_text_is_python_sources_not_random_ids():
    sources = bench.python_sources()
    assert len(sources) > 100 and all(p.suffix == ".py" for p in sources[:100])
    assert any(p.name == "os.py" for p in sources)  # the standard library's own
