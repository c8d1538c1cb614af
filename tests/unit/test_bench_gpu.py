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
    allowances = [bench.allowance(c, smoke=False) for c in bench.CONTESTANTS]
    assert allowances == [75.0, 110.0, 120.0]
    assert bench.race_seconds(args, left=3 * 100 + 305 + 30, allowances=allowances) == 100
    # 150 s short: each contestant gets 50 s less, the same for all
    assert bench.race_seconds(args, left=3 * 100 + 305 - 150, allowances=allowances) == 50
    assert bench.race_seconds(bench.parse_args([]), left=1e9, allowances=allowances[:2]) == bench.RACE_S["gpu"]
    assert bench.allowance(bench.CONTESTANTS[2], smoke=True) == bench.SMOKE_STARTUP_S


def test_each_contestant_may_run_its_allowance_and_a_share_of_the_spare_seconds():
    # 60 s each; 400 s left for allowances of 75, 110, 120: 400 - 485 < 0, nothing spare: gpt2 gets its own 135 s
    assert bench.contestant_timeout(400, 60, [75, 110, 120]) == 135
    # 90 s spare over three: 30 s more each
    assert bench.contestant_timeout(575, 60, [75, 110, 120]) == 165
    assert bench.contestant_timeout(575, 60, [120]) == 60 + 120 + 395  # the last one: whatever is left


def test_presets_have_larger_allowances_than_gpt2_for_their_larger_graphs():
    by_name = {c.name: c.startup_s for c in bench.CONTESTANTS}
    assert by_name["gpt2"] < by_name["modern"] < by_name["nanochat"]
    # the comment's arithmetic, to the nearest 10 s: 31 s + 44 s of compile scaled by the graphs' nodes (833, 906
    # against GPT-2's 460)
    assert (by_name["modern"], by_name["nanochat"]) == (round(31 + 44 * 833 / 460, -1), round(31 + 44 * 906 / 460, -1))


def test_a_jsonl_file_being_written_is_read_without_its_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"batch": 1, "time_s": 2.5}\n[1, 2]\n{"batch": 2, "time_s": 3.0}\n{"batch": 3, "ti')
    assert bench.read_jsonl(path) == [{"batch": 1, "time_s": 2.5}, {"batch": 2, "time_s": 3.0}]
    assert bench.read_jsonl(tmp_path / "none.jsonl") == []


def test_a_race_where_no_contestant_trained_says_why():
    table = bench.Table([], None)
    assert bench.no_contestant_ran(table) == "no contestant started"
    table.race = [bench.RaceRun("gpt2", "pile.py", True, note="failed (exit 1): ModuleNotFoundError: No module "
                                                               "named 'zstd'"), bench.RaceRun("modern", "x", True)]
    assert bench.no_contestant_ran(table) == ("gpt2: failed (exit 1): ModuleNotFoundError: No module named 'zstd'; "
                                              "modern: ")
    table.race[1].batches = 3
    assert bench.no_contestant_ran(table) is None


def test_logs_folder_is_beside_the_table_or_named_and_never_holds_it(tmp_path):
    out = tmp_path / "t.md"
    assert bench.logs_folder(bench.parse_args(["--out", str(out)])) == tmp_path / "t_logs"
    assert bench.logs_folder(bench.parse_args(["--out", str(out), "--logs", str(tmp_path / "l")])) == tmp_path / "l"
    assert bench.logs_folder(bench.parse_args([])) is None
    from pilegpt.common import UserError

    with pytest.raises(UserError, match="lies in --logs"):
        bench.logs_folder(bench.parse_args(["--out", str(out), "--logs", str(tmp_path)]))
    out.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        bench.logs_folder(bench.parse_args(["--logs", str(out)]))


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


# ----------------------------------------------------------------------------------------------------------
# make gpu-wheels (bench/gpu_wheels.py) and its two lists

wheels = load_module(REPO / "bench" / "gpu_wheels.py", "gpu_wheels")


def test_the_wheel_list_holds_nothing_the_image_has_and_composer_at_requirements_pins():
    pins = wheels.read_pins(wheels.WHEEL_LIST)
    image = wheels.read_image(wheels.IMAGE_LIST)
    wheels.check_lists(pins, image)
    assert not set(pins) & image
    assert {"torch", "numpy", "tiktoken", "transformers", "torchmetrics", "torchvision", "tqdm"} <= image
    required = {wheels.canonical(n): v for n, v in (line.split("#")[0].strip().split("==")
                for line in (REPO / "requirements.txt").read_text().splitlines() if "==" in line.split("#")[0])}
    assert pins["mosaicml"] == required["mosaicml"] and pins["mosaicml-streaming"] == required["mosaicml-streaming"]
    # Composer's own bounds (requirements-keep-torch.txt): coolname<3, importlib-metadata<9
    assert int(pins["coolname"].split(".")[0]) < 3 and int(pins["importlib-metadata"].split(".")[0]) < 9


@pytest.mark.parametrize("text, message", [("orjson>=3\n", "is not an exact pin"),
                                           ("zstd==1\nZSTD==2\n", "listed twice"),
                                           ("# only a comment\n", "lists no wheels")])
def test_a_wheel_list_line_that_is_not_one_exact_pin_is_refused(tmp_path, text, message):
    from pilegpt.common import UserError

    (tmp_path / "w.txt").write_text(text)
    with pytest.raises(UserError, match=message):
        wheels.read_pins(tmp_path / "w.txt")


def test_a_project_in_both_lists_is_refused():
    from pilegpt.common import UserError

    with pytest.raises(UserError, match="lists numpy, which"):
        wheels.check_lists({"numpy": "2.5.2", "orjson": "3"}, {"numpy", "torch"})


def test_the_wheel_folder_must_hold_each_pin_once_and_nothing_else(tmp_path, monkeypatch):
    from pilegpt.common import UserError

    pins = {"python-snappy": "0.7.3", "orjson": "3.13.0"}
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "python_snappy-0.7.3-py3-none-any.whl").write_bytes(b"x" * 10)
    with pytest.raises(UserError, match="lacks orjson"):
        wheels.check_folder(folder, pins)
    (folder / "orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.whl").write_bytes(b"y" * 20)
    assert wheels.check_folder(folder, pins) == 30
    monkeypatch.setattr(wheels, "MAX_BYTES", 29)
    with pytest.raises(UserError, match="over the 0 MiB"):
        wheels.check_folder(folder, pins)
    (folder / "orjson-3.12.0-cp312-cp312-manylinux_2_17_x86_64.whl").write_bytes(b"z")  # a stale second version
    with pytest.raises(UserError, match="orjson-3.12.0.*does not pin"):
        wheels.check_folder(folder, pins)
    with pytest.raises(UserError, match="does not exist: run `make gpu-wheels`"):
        wheels.check_folder(tmp_path / "none", pins)
