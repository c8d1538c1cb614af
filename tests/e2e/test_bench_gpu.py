"""bench/bench_gpu.py: its --smoke run on CPU (main() in this process; each race contestant and variant a train.py
process, as on a GPU, started warm here: tests/warm.py) writes its tables, and every run's train.py settings are ones
train.py takes, so the GPU script cannot rot. The pieces only a GPU run exercises: tests/unit/test_bench_gpu.py."""

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest

import train
from helpers import REPO, load_module, output_of, start, wait_until
from pilegpt.train.config_load import read_config_file

SCRIPT = REPO / "bench" / "bench_gpu.py"
bench = load_module(SCRIPT, "bench_gpu")


VARIANTS = ("eager-50257-fixed", "compile-50304-fixed")  # the baseline (a process), a GPU row (skipped on CPU)


def warm_start(cmd: list[str], cwd, env: dict, out_file):
    """bench.start_process with train.py started warm (helpers.start: forked, its own process group)."""
    return start(cmd, cwd, env, out_file)


def test_a_run_ends_or_is_stopped_at_its_budget_with_its_processes(tmp_path):
    """bench.run_with_timeout itself (the smoke run below replaces it with a warm start)."""
    env = dict(os.environ)
    ran = bench.run_with_timeout([sys.executable, "-c", "print('ran')"], tmp_path, env, tmp_path / "a", 60)
    assert ran == (0, False)
    assert (tmp_path / "a").read_text() == "ran\n"
    sleeper = ["sleep", "61.25"]  # a child of the run: the budget stops it too
    child = f"import subprocess, time; subprocess.Popen({sleeper}); print('started', flush=True); time.sleep(60)"
    code, timed_out = bench.run_with_timeout([sys.executable, "-c", child], tmp_path, env, tmp_path / "b", 2)
    assert (code, timed_out) == (-9, True) and (tmp_path / "b").read_text() == "started\n"
    # SIGKILL is delivered asynchronously: on a loaded machine the sleeper can still show as running for a moment
    deadline = time.monotonic() + 10
    while (left := [p for p in psutil.process_iter(["cmdline", "status"]) if p.info["cmdline"] == sleeper
                    and p.info["status"] != psutil.STATUS_ZOMBIE]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left


def test_smoke_run_has_its_race_step_rows_and_variant_rows(tmp_path, one_torch_thread, monkeypatch):
    monkeypatch.setattr(bench, "start_process", warm_start)
    out = tmp_path / "x.md"
    # in this process; each race contestant and variant is its own train.py process, as on a GPU (the variants'
    # settings differ only in values: test_every_variants_settings_are_ones_train_py_takes)
    assert bench.main(["--smoke", "--out", str(out), "--variants", *VARIANTS, "--loader-workers", "0"]) == 0
    text = out.read_text()
    here, _ = bench.contestants()
    step, race, rows = (table_rows(part) for part in text.split("\n## ")[1:4])
    assert list(step) == list(race) == [c.name for c in here]
    for c in here:
        assert number(step[c.name]["tokens/s"]) > 0 and number(step[c.name]["optimizer ms"]) > 0, step[c.name]
        assert 0 < number(step[c.name]["optimizer share"].rstrip("%")) < 100
        assert int(race[c.name]["batches"]) >= bench.RACE_CLOCK["smoke"]["min_batches"]
        # ln(50304) = 10.8 at the start; a time race's batch count follows the machine's load, and nanochat's rates
        # first raise the loss (11.52 seen after 4 evaluations on a loaded machine): a finite, sane figure is the check
        assert 0 < number(race[c.name]["final val"]) < 2 * 10.83
    assert step["modern"]["config"] == "pile.py + modern.py"
    assert race["gpt2"]["vs gpt2"] == "1.00x"  # its own final loss, at its own last evaluation
    assert "Python sources" in text
    assert rows[bench.BASELINE][f"vs {bench.BASELINE}"] == "1.00x" and number(rows[bench.BASELINE]["tokens/s"]) > 0
    assert rows["compile-50304-fixed"]["note"] == "skipped: GPU only (--smoke)"
    assert number(rows["loader, 0 workers"]["samples/s"]) > 0
    assert "Recommended for config/pile.py, from this run: " in text
    # every run's output, race clock and save folder (less its checkpoints) are kept beside the table
    logs = tmp_path / "x_logs"
    for name in (f"{bench.BASELINE}.out.txt", f"runs/{bench.BASELINE}/metrics.jsonl", "race-modern.clock.jsonl",
                 "runs/race-gpt2/metrics.jsonl", "runs/race-gpt2/config.json", "race-gpt2.out.txt"):
        assert (logs / name).is_file(), name
    assert list(logs.rglob("*-rank0.txt")) and not list(logs.rglob("*.pt"))


def test_sigterm_keeps_the_rows_reached_and_ends_the_runs_process_group(tmp_path, one_torch_thread, monkeypatch):
    started = []
    monkeypatch.setattr(bench, "start_process", lambda *a: started.append(warm_start(*a)) or started[-1])
    monkeypatch.setattr(bench, "CONTESTANTS", bench.CONTESTANTS[:2])
    monkeypatch.setattr(bench, "POLL_S", 0.5)
    shown = bench.Table.show

    def show_then_sigterm(table, running):  # SIGTERM to this process once modern has trained (as a limit would)
        shown(table, running)
        if running.name == "modern" and running.batches >= 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(bench.Table, "show", show_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "x.md"
    assert bench.main(["--smoke", "--out", str(out)]) == 143
    assert signal.getsignal(signal.SIGTERM) is before
    step, race = race_tables(out)
    assert list(step) == ["gpt2", "modern"] and number(step["gpt2"]["tokens/s"]) > 0
    assert step["modern"]["note"].startswith("cut by SIGTERM after") and int(race["modern"]["batches"]) >= 2
    assert number(race["modern"]["final val"]) > 0  # its evaluations so far
    assert "stopped by SIGTERM" in out.read_text()
    modern = started[-1]
    assert modern.poll() is not None
    wait_until(lambda: not live_in_group(modern.pid), [], "modern's process group gone", seconds=30)


def test_race_settings_are_ones_train_py_takes_and_the_same_for_all(tmp_path):
    setup = bench.Setup(tmp_path / "data", tmp_path, None, 1024, 60, 12, 30, 10, False, [])
    race = {}
    for c in bench.CONTESTANTS:
        if not all((REPO / "config" / p).is_file() for p in c.presets):
            continue
        cfg, _ = train.read_config(bench.race_settings(setup, c, "amp_bf16", 75.0, tmp_path / "clock"))
        race[c.name] = cfg
        assert (cfg.compile, cfg.precision, cfg.max_duration, cfg.warmup) == (True, "amp_bf16", "100000ba", "50ba")
        assert (cfg.global_batch_size, cfg.device_train_microbatch_size, cfg.block_size) == (60, 12, 1024)
        assert cfg.callbacks["race_clock:RaceClock"]["seconds"] == 75.0
    assert race["gpt2"].optimizer == "adamw" and race["modern"].optimizer == "muon"
    assert (race["modern"].n_layer, race["modern"].n_embd) == (12, 768)  # 124M, as gpt2


def test_every_variants_settings_are_ones_train_py_takes(tmp_path):
    setup = bench.Setup(tmp_path / "data", tmp_path, None, 64, 8, 4, 8, 3, True, [])
    for v in bench.VARIANTS:
        cfg, _ = train.read_config(bench.variant_settings(setup, v, "amp_bf16"))
        preset = read_config_file(str(REPO / "config" / v.preset)) if v.preset else {}
        assert (cfg.vocab_size, cfg.compile, cfg.precision) == (v.vocab_size, v.compile, "amp_bf16"), v.name
        assert cfg.optimizer == preset.get("optimizer", v.optimizer), v.name  # the preset file comes last
        assert all(getattr(cfg, k) == preset[k] for k in ("pos_emb", "norm", "mlp") if k in preset), v.name
        assert cfg.device_train_microbatch_size == ("auto" if v.auto_microbatch else 4), v.name
        assert cfg.fsdp is v.fsdp, v.name
        assert (cfg.max_duration, cfg.global_batch_size, cfg.block_size) == ("8ba", 8, 64), v.name
    assert any(v.preset for v in bench.VARIANTS) and any(v.optimizer == "muon" for v in bench.VARIANTS)
    assert [v.name for v in bench.VARIANTS if v.fsdp] == ["eager-50304-fsdp"]


def live_in_group(pgid: int) -> list[int]:
    """The processes of group `pgid` that still run (a SIGKILLed one is a zombie until its parent reaps it)."""
    live = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.info["pid"]) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                live.append(p.info["pid"])
        except ProcessLookupError:
            pass
    return live


def table_rows(markdown: str) -> dict[str, dict[str, str]]:
    """The first markdown table's rows by their first cell, each as {column: cell}."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("| ")]
    columns = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(columns, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]]
    return {r[columns[0]]: r for r in rows}


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


# ----------------------------------------------------------------------------------------------------------
# The GPU script in an environment like the GPU image: only the image's packages, then the carried wheels

IMAGE_FROM = os.environ.get("PILEGPT_IMAGE_FROM", "")  # a Python 3.12 whose packages play the image's
NEEDS_IMAGE = pytest.mark.skipif(not IMAGE_FROM, reason="plays the GPU image: set PILEGPT_IMAGE_FROM to a Python 3.12 "
                                 "holding torch (.ci/keep_torch sets it to its environment's)")
LIST_FILES = """import importlib.metadata as m, json, sys, sysconfig
site = sysconfig.get_paths()["purelib"]
dists = {d.metadata["Name"]: [str(f) for f in d.files or [] if not str(f).startswith("..")]
         for d in m.distributions() if str(d.locate_file("")) == site}
json.dump({"site": site, "version": sys.version_info[:2], "dists": dists}, sys.stdout)"""


def image_like_env(source: str, dest: Path) -> Path:
    """A venv of `source`'s interpreter whose site-packages links only the distributions of `source`'s environment
    that bench/gpu_image_packages.txt names (a CUDA wheel's -cu13 suffix aside): the image as far as this machine
    can play it, without a copy of torch. A top-level folder shared with a distribution the image lacks (google/:
    protobuf's and google-cloud-storage's) is linked one level deeper, so nothing of that one shows. Its python."""
    wheels = load_module(REPO / "bench" / "gpu_wheels.py", "gpu_wheels")
    image = wheels.read_image(wheels.IMAGE_LIST)
    info = json.loads(subprocess.run([source, "-c", LIST_FILES], capture_output=True, text=True, check=True).stdout)
    assert info["version"] == [3, 12], f"{source} is Python {info['version']}, the image's is 3.12"
    subprocess.run([source, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = dest / "lib" / "python3.12" / "site-packages"

    def in_image(name: str) -> bool:
        name = wheels.canonical(name)
        return name in image or re.sub(r"-cu\d+$", "", name) in image

    kept = {n for n in info["dists"] if in_image(n)}
    others = {Path(f).parts[:k] for n, files in info["dists"].items() if n not in kept for f in files
              for k in range(1, len(Path(f).parts) + 1)}
    for name in sorted(kept):
        for f in info["dists"][name]:
            parts = Path(f).parts
            k = next((k for k in range(1, len(parts) + 1) if parts[:k] not in others), None)
            link = site.joinpath(*parts[:k]) if k else None
            if link is not None and not link.is_symlink() and not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(Path(info["site"]).joinpath(*parts[:k]))
    return dest / "bin" / "python"


def gpu_script_env(tmp_path: Path, python: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "OUT": str(tmp_path / "out"), "PYTHON": str(python), "PILEGPT_GPU_WORK": str(tmp_path / "work"),
            "OMP_NUM_THREADS": "1"}


def race_tables(table: Path) -> tuple[dict, dict]:
    """(the compiled step's rows, the race's rows) of bench_gpu.md, each by recipe."""
    parts = table.read_text().split("\n## ")
    step = next(p for p in parts if p.startswith("The compiled step"))
    race = next(p for p in parts if p.startswith("The race"))
    return table_rows(step), table_rows(race)


@pytest.fixture(scope="module")
def image_python(tmp_path_factory) -> Path:
    python = image_like_env(IMAGE_FROM, tmp_path_factory.mktemp("image") / "venv")
    for name in ("torch", "numpy", "tiktoken", "transformers", "torchmetrics", "torchvision"):
        assert subprocess.run([python, "-c", f"import {name}"]).returncode == 0, name
    for name in ("composer", "streaming", "orjson", "zstd"):  # what the wheels bring: not in the image
        assert subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode != 0, name
    return python


@pytest.mark.parametrize("wheels, says", [(None, "no wheels in"), ("mosaicml-0.0.1-py3-none-any.whl",
                                                                  "pip could not install bench/gpu_wheels.txt")])
def test_gpu_script_without_its_wheels_stops_with_the_reason_in_the_table(tmp_path, wheels, says):
    folder = tmp_path / "wheels"
    folder.mkdir()
    if wheels:
        (folder / wheels).write_bytes(b"not a wheel")
    env = {**gpu_script_env(tmp_path, Path(sys.executable)), "PILEGPT_GPU_WHEELS": str(folder)}
    done = subprocess.run(["bash", "bench/gpu_run.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["bench_gpu.md", "bench_gpu_logs.tar.gz", "gpu_run.log"]
    table = (out / "bench_gpu.md").read_text()
    assert table.startswith("# bench/bench_gpu.py: not run\n") and says in table and "make gpu-wheels" in table


@pytest.mark.parametrize("setting, says", [({"PILEGPT_GPU_RUN_S": "nan"}, "PILEGPT_GPU_RUN_S takes whole seconds"),
                                           ({"PILEGPT_GPU_RUN_S": "10"}, "PILEGPT_GPU_RUN_S takes whole seconds"),
                                           ({"OUT": ""}, "set OUT to the folder")])
def test_gpu_script_refuses_a_bad_setting_in_one_line(tmp_path, setting, says):
    env = {**gpu_script_env(tmp_path, Path(sys.executable)), **setting}
    done = subprocess.run(["bash", "bench/gpu_run.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


@NEEDS_IMAGE
def test_gpu_script_smoke_installs_the_wheels_and_brings_back_three_recipes_in_three_files(tmp_path, image_python):
    wheels = load_module(REPO / "bench" / "gpu_wheels.py", "gpu_wheels")
    wheels.check_folder(wheels.DEST, wheels.read_pins(wheels.WHEEL_LIST))  # `make gpu-wheels` ran (.ci/keep_torch)
    done = subprocess.run(["bash", "bench/gpu_run.sh", "--smoke"], cwd=REPO, env=gpu_script_env(tmp_path, image_python),
                          capture_output=True, text=True, timeout=900)
    out = tmp_path / "out"
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert sorted(p.name for p in out.iterdir()) == ["bench_gpu.md", "bench_gpu_logs.tar.gz", "gpu_run.log"]
    step, race = race_tables(out / "bench_gpu.md")
    here, _ = bench.contestants()
    assert list(step) == list(race) == [c.name for c in here] and len(here) == 3
    for c in here:
        assert number(step[c.name]["tokens/s"]) > 0 and number(step[c.name]["optimizer ms"]) > 0, step[c.name]
        assert 0 < number(race[c.name]["final val"]) < 11.5, race[c.name]
    with tarfile.open(out / "bench_gpu_logs.tar.gz") as tar:
        names = set(tar.getnames())
    for c in here:
        assert {f"bench_gpu_logs/runs/race-{c.name}/metrics.jsonl", f"bench_gpu_logs/race-{c.name}.clock.jsonl",
                f"bench_gpu_logs/race-{c.name}.out.txt"} <= names, sorted(names)
    assert "bench_gpu_logs/pip_install.txt" in names and not any(n.endswith(".pt") for n in names)
    assert "gpu_run.sh: imports fine: Python 3.12" in (out / "gpu_run.log").read_text()


@NEEDS_IMAGE
def test_gpu_script_stopped_by_sigterm_keeps_the_rows_reached_and_no_process(tmp_path, image_python):
    env = gpu_script_env(tmp_path, image_python)
    proc = start(["bash", "bench/gpu_run.sh", "--smoke"], REPO, env, tmp_path / "script.txt")
    table = tmp_path / "out" / "bench_gpu.md"

    def second_running() -> bool:  # gpt2's row done, modern's in flight (the table while it runs)
        step = race_tables(table)[0] if table.is_file() and "## The compiled step" in table.read_text() else {}
        return step.get("modern", {}).get("note", "").startswith("running")

    wait_until(second_running, proc, "modern's row while it runs", seconds=600, every=0.2)
    os.kill(proc.pid, signal.SIGTERM)  # the script alone, as a time limit would
    assert proc.wait(timeout=120) == 143, output_of(proc)[-4000:]
    step, race = race_tables(table)
    assert number(step["gpt2"]["tokens/s"]) > 0 and number(race["gpt2"]["final val"]) > 0
    assert step["modern"]["note"].startswith("cut by SIGTERM after"), step["modern"]
    assert "nanochat" not in step
    assert "stopped by SIGTERM" in table.read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bench_gpu.md", "bench_gpu_logs.tar.gz",
                                                                     "gpu_run.log"]
    left = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"]) if str(tmp_path) in " ".join(
        p.info["cmdline"] or [])]
    assert not left, left
