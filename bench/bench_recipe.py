"""Training recipes against today's GPT-2 recipe on CPU: val loss for the same data, tokens per step and steps.

Usage:
    python bench/bench_recipe.py                       # every recipe below, 600 steps each (~25 min on 2 cores)
    python bench/bench_recipe.py --only gpt2,modern    # some of them
    python bench/bench_recipe.py --steps 300 --jobs 1  # shorter runs, one at a time
    python bench/bench_recipe.py --only gpt2 --try "lr3=--learning_rate=3e-3 --min_lr=3e-4"  # a recipe of yours

Every recipe trains config/quickstart.py's model and batch (4 layers x 128, 4 x 128 tokens a step, its learning
rates and schedule) on the quickstart's data (tiny Shakespeare cut into 40 parts, 4 held out for val) through
pilegpt/train/plain_loop.py, the plain loop pinned to train.py's losses; each recipe changes one thing (or, for
`modern`, applies config/modern.py after the quickstart preset). Runs are separate processes of one thread each,
--jobs at a time, in an order that alternates between rounds. Columns: val loss (all val windows) at half and all
steps, the step at which the GPT-2 recipe's final val loss is first reached (linear between evaluations), the
median time per training step (evaluations excluded; the process's CPU time, which other load on the machine
barely moves, one thread a run; and wall-clock), and the ratios of steps and time to that loss against GPT-2's.
docs/performance.md has the table as measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pilegpt.common import UserError, run_main  # noqa: E402

QUICKSTART = REPO / "config" / "quickstart.py"
SHAKESPEARE = REPO / "tests" / "fixtures" / "tinyshakespeare.txt"
RECIPES = {  # name: train.py settings after config/quickstart.py
    "gpt2": [],  # today's recipe: GPT-2's architecture, AdamW
    "rope": ["--pos_emb=rope"],
    "rmsnorm": ["--norm=rmsnorm"],
    "relu2": ["--mlp=relu2"],
    "swiglu": ["--mlp=swiglu"],
    "qk_norm": ["--qk_norm=True"],
    "gqa": ["--n_kv_head=2"],
    "untied": ["--tie_embeddings=False"],
    "softcap": ["--logit_softcap=15.0"],
    "muon": ["--optimizer=muon"],
    "modern": [str(REPO / "config" / "modern.py")],  # the preset: what this benchmark shows best
}


def make_data(folder: Path) -> Path:
    """The quickstart's .bin data (scripts/quickstart.sh's steps 1): 40 parts, 10% of them for val."""
    text = folder / "text"
    text.mkdir(parents=True)
    lines = SHAKESPEARE.read_text().splitlines(keepends=True)
    for i in range(40):
        (text / f"part-{i:02d}.txt").write_text("".join(lines[i * len(lines) // 40:(i + 1) * len(lines) // 40]))
    return tokenize(text, folder / "tokens", 0.1)


def tokenize(text: Path, out: Path, val_fraction: float) -> Path:
    """prepare_data.py on a folder of text files (whole documents held out for val): the .bin folder `out`."""
    cmd = [sys.executable, str(REPO / "prepare_data.py"), "--input", str(text), "--val-fraction", str(val_fraction),
           "--out-dir", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"prepare_data.py failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return out


def val_windows(data_dir: Path, block_size: int):
    """Every non-overlapping window of the val split, as (x, y) LongTensors (K, T)."""
    import numpy as np
    import torch

    from pilegpt.data import Meta, read_windows, window_starts

    meta = Meta.read(data_dir)
    tokens = np.memmap(data_dir / meta.splits["val"].file, dtype=meta.dtype, mode="r")
    x, y = read_windows(tokens, window_starts(len(tokens), block_size), block_size)
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def val_loss(model, x, y, batch: int = 16) -> float:
    """Mean cross-entropy over every val window (16 at a time: a (16, T, V) logits tensor, not a page-faulting GB)."""
    import torch

    model.eval()
    with torch.no_grad():
        total = sum(model(x[i:i + batch], targets=y[i:i + batch])[1].item() * len(x[i:i + batch])
                    for i in range(0, len(x), batch))
    model.train()
    return total / len(x)


def one_run(settings: list[str], data_dir: Path, steps: int, eval_every: int, out: Path) -> None:
    """One recipe in this process: train, evaluate every eval_every steps, write the curve and the step times."""
    from pilegpt.common import tune_glibc_malloc
    from pilegpt.train import plain_loop
    from pilegpt.train.config_load import config_values, make_config

    cfg = make_config(config_values([str(QUICKSTART), *settings, f"--data_dir={data_dir}",
                                     f"--max_duration={steps}ba", "--device=cpu"]))
    tune_glibc_malloc()
    x, y = val_windows(data_dir, cfg.block_size)
    model = plain_loop.build_model(cfg)
    curve, wall, cpu, t, c = [], [], [], time.perf_counter(), time.process_time()
    for batch, _, _ in plain_loop.train(cfg, model):
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        if batch % eval_every == 0 or batch == steps:
            curve.append((batch, val_loss(model, x, y)))
        t, c = time.perf_counter(), time.process_time()
    out.write_text(json.dumps({"curve": curve, "step_s": statistics.median(cpu[5:]),
                               "wall_s": statistics.median(wall[5:])}))


class Result(NamedTuple):
    curve: list  # (step, val loss) at every evaluation
    step_s: float  # median CPU seconds per training step (one thread)
    wall_s: float  # median wall-clock seconds per training step

    def at(self, step: int) -> float:
        return min(self.curve, key=lambda point: abs(point[0] - step))[1]

    def reaches(self, loss: float) -> Optional[float]:
        """The step at which val loss first reaches `loss`, linear between evaluations; None if never."""
        previous = (0, float("inf"))
        for step, value in self.curve:
            if value <= loss:
                if previous[1] == float("inf"):
                    return float(step)
                return previous[0] + (step - previous[0]) * (previous[1] - loss) / (previous[1] - value)
            previous = (step, value)
        return None


def run_all(recipes: dict[str, list[str]], data_dir: Path, work: Path, args) -> dict[str, list[Result]]:
    """Every recipe, --rounds times, --jobs processes at a time, the order reversed every other round."""
    threads = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    names = list(recipes)
    jobs = [(r, name) for r in range(args.rounds) for name in (names if r % 2 == 0 else names[::-1])]

    def launch(job) -> tuple[str, Result]:
        r, name = job
        out = work / f"{name}-{r}.json"
        cmd = [sys.executable, __file__, "--one", json.dumps(recipes[name]), "--data-dir", str(data_dir), "--steps",
               str(args.steps), "--eval-every", str(args.eval_every), "--out", str(out)]
        done = subprocess.run(cmd, env=threads, capture_output=True, text=True)
        if done.returncode != 0:
            raise UserError(f"recipe {name} failed: {(done.stdout + done.stderr)[-3000:]}")
        record = json.loads(out.read_text())
        result = Result([tuple(p) for p in record["curve"]], record["step_s"], record["wall_s"])
        print(f"round {r + 1}: {name:<8} val {result.curve[-1][1]:.4f} at step {args.steps}, "
              f"{1000 * result.step_s:.1f} ms CPU/step, {1000 * result.wall_s:.1f} ms/step", flush=True)
        return name, result

    results: dict[str, list[Result]] = {name: [] for name in names}
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, result in pool.map(launch, jobs):
            results[name].append(result)
    return results


def median_result(results: list[Result]) -> Result:
    """Rounds merged: the median val loss at each evaluation and the median step time."""
    steps = [step for step, _ in results[0].curve]
    curve = [(s, statistics.median(r.curve[i][1] for r in results)) for i, s in enumerate(steps)]
    return Result(curve, *(statistics.median(getattr(r, k) for r in results) for k in ("step_s", "wall_s")))


def table(results: dict[str, Result], steps: int) -> str:
    """The markdown table, every recipe against the GPT-2 recipe's final val loss."""
    base = results["gpt2"]
    target = base.curve[-1][1]
    base_steps = base.reaches(target)
    lines = [f"| recipe | val @{steps // 2} | val @{steps} | step to {target:.4f} | x steps | ms CPU/step (wall) "
             "| x time |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        reached = r.reaches(target)
        step_text = f"{reached:.0f}" if reached is not None else "not reached"
        ratio = f"{reached / base_steps:.2f}" if reached is not None else "-"
        time_ratio = f"{reached * r.step_s / (base_steps * base.step_s):.2f}" if reached is not None else "-"
        lines.append(f"| {name} | {r.at(steps // 2):.4f} | {r.at(steps):.4f} | {step_text} | {ratio} | "
                     f"{1000 * r.step_s:.0f} ({1000 * r.wall_s:.0f}) | {time_ratio} |")
    return "\n".join(lines)


def chosen_recipes(only: Optional[str], tries: list[str]) -> dict[str, list[str]]:
    """--only's recipes (all by default) and --try's, gpt2 first: the baseline every other is measured against."""
    names = only.split(",") if only else list(RECIPES)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise UserError(f"--only: unknown recipe(s) {', '.join(unknown)}: choose among {', '.join(RECIPES)}")
    recipes = {"gpt2": [], **{n: RECIPES[n] for n in names}}
    for text in tries:
        name, sep, settings = text.partition("=")
        if not sep or not name or not settings.strip() or name in recipes:
            raise UserError(f"--try {text!r}: give a new name, then the settings, e.g. "
                            "--try \"lr3=--learning_rate=3e-3\"")
        recipes[name] = settings.split()
    return recipes


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated recipes (default: all of {', '.join(RECIPES)})")
    parser.add_argument("--steps", type=int, default=600, help="training steps per run (the quickstart's 600)")
    parser.add_argument("--eval-every", type=int, default=25, help="steps between val evaluations")
    parser.add_argument("--rounds", type=int, default=1, help="runs per recipe (their median is reported)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    parser.add_argument("--data-dir", type=Path, help="a prepare_data.py folder (default: the quickstart's data)")
    parser.add_argument("--try", dest="tries", action="append", default=[], metavar="NAME=SETTINGS",
                        help="one more recipe: a name, then train.py settings (--key=value or a config file), "
                             "space-separated")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one run's settings (JSON), started by run_all
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.one:
        one_run(json.loads(args.one), args.data_dir, args.steps, args.eval_every, args.out)
        return 0
    recipes = chosen_recipes(args.only, args.tries)
    if args.steps < 2 * args.eval_every:
        raise UserError(f"--steps {args.steps} needs at least two evaluations: raise it or lower --eval-every")
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="bench_recipe_") as tmp:
        data_dir = args.data_dir or make_data(Path(tmp) / "data")
        work = Path(tmp) / "runs"
        work.mkdir()
        results = {name: median_result(rs) for name, rs in run_all(recipes, data_dir, work, args).items()}
    print(f"\n{args.steps} steps of 4 x 128 tokens, config/quickstart.py's model, {os.cpu_count()} CPU cores, "
          f"{args.jobs} run(s) at a time, {args.threads} thread(s) each, median of {args.rounds} round(s), "
          f"{time.time() - start:.0f} s in all:\n")
    print(table(results, args.steps))
    return 0


if __name__ == "__main__":
    run_main(main)
