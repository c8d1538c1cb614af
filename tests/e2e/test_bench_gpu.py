"""bench/bench_gpu.py: its --smoke run on CPU (main() in this process; each race contestant and variant a train.py
process, as on a GPU, started warm here: tests/warm.py) writes its tables, and every run's train.py settings are ones
train.py takes, so the GPU script cannot rot. The pieces only a GPU run exercises: tests/unit/test_bench_gpu.py."""

import os
import subprocess
import sys

import psutil

import train
from helpers import REPO, kill_group, load_module, start
from pilegpt.train.config_load import read_config_file

SCRIPT = REPO / "bench" / "bench_gpu.py"
bench = load_module(SCRIPT, "bench_gpu")


VARIANTS = ("eager-50257-fixed", "compile-50304-fixed")  # the baseline (a process), a GPU row (skipped on CPU)


def warm_run_with_timeout(cmd: list[str], cwd, env: dict, out_file, timeout_s: float) -> tuple[int, bool]:
    """bench.run_with_timeout with the train.py process started warm (helpers.start)."""
    proc = start(cmd, cwd, env, out_file)
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return proc.returncode, True
    finally:
        proc.log.close()


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
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == sleeper]


def test_smoke_run_has_its_race_step_rows_and_variant_rows(tmp_path, one_torch_thread, monkeypatch):
    monkeypatch.setattr(bench, "run_with_timeout", warm_run_with_timeout)
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
        assert 0 < number(race[c.name]["final val"]) < 11.5  # ln(50304) = 10.8 at the start
    assert step["modern"]["config"] == "pile.py + modern.py"
    assert race["gpt2"]["vs gpt2"] == "1.00x"  # its own final loss, at its own last evaluation
    assert "Python sources" in text
    assert rows[bench.BASELINE][f"vs {bench.BASELINE}"] == "1.00x" and number(rows[bench.BASELINE]["tokens/s"]) > 0
    assert rows["compile-50304-fixed"]["note"] == "skipped: GPU only (--smoke)"
    assert number(rows["loader, 0 workers"]["samples/s"]) > 0
    assert "Recommended for config/pile.py, from this run: " in text
    # every run's output, metrics, race clock and Composer log are kept beside the table
    for name in (f"{bench.BASELINE}.out.txt", f"{bench.BASELINE}.metrics.jsonl", "race-modern.clock.jsonl",
                 "race-gpt2.metrics.jsonl", "race-gpt2.out.txt"):
        assert (tmp_path / "x_logs" / name).is_file(), name


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
        assert (cfg.max_duration, cfg.global_batch_size, cfg.block_size) == ("8ba", 8, 64), v.name
    assert any(v.preset for v in bench.VARIANTS) and any(v.optimizer == "muon" for v in bench.VARIANTS)


def table_rows(markdown: str) -> dict[str, dict[str, str]]:
    """The first markdown table's rows by their first cell, each as {column: cell}."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("| ")]
    columns = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(columns, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]]
    return {r[columns[0]]: r for r in rows}


def number(cell: str) -> float:
    return float(cell.replace(",", ""))
