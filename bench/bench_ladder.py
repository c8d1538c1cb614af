"""The preset against the GPT-2 recipe as the model grows: a ladder of model sizes on CPU, two seeds a run.

Usage:
    python bench/bench_ladder.py                                # every rung, the 3 recipes, seeds 0 and 1
    python bench/bench_ladder.py --rungs 4x128 --steps 600     # the smallest rung alone (~9 min on 2 cores)
    python bench/bench_ladder.py --rungs 6x256 --try "lr2=config/modern.py --muon_lr=0.01"
    python bench/bench_ladder.py --corpus data/ladder --corpus-only   # write the corpus and stop

The corpus is one the quickstart never trains on: tiny Shakespeare (tests/fixtures) and the Python standard
library's own top-level source files (this interpreter's, sorted by name), each file a document, tokenized by
prepare_data.py (GPT-2 BPE) with whole documents held out for val (2.47M tokens with Python 3.11.7's).
Every rung trains config/quickstart.py's batch and schedule (4 x 128 tokens a step, its learning rates) at one
model size through the plain loop that bench_recipe.py uses (pinned to train.py's losses), for --steps steps: a
run sees fewer tokens than the train split holds, so no rung repeats its data. Recipes: `gpt2` (GPT-2's
architecture and AdamW), `modern` (config/modern.py after the size) and `nanochat` (config/nanochat.py after it),
plus any --try. Columns per rung and seed: the final val loss (every val window), the val loss at equal CPU time
(each run's curve where it had spent the CPU time of the seed's quickest run, linear between evaluations), the step
where the seed's GPT-2 run's final val loss is first reached (linear between evaluations), its ratio to GPT-2's
steps, the training FLOPs and CPU seconds to that loss and their ratios. The plot (--plot) draws val loss against
training FLOPs for every run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import bench_recipe  # noqa: E402

from pilegpt.common import UserError, run_main  # noqa: E402

SHAKESPEARE = REPO / "tests" / "fixtures" / "tinyshakespeare.txt"
RUNGS = {"4x128": (4, 4, 128), "5x192": (5, 3, 192), "6x256": (6, 4, 256), "8x384": (8, 6, 384)}  # layers, heads, width
DEFAULT_RUNGS = "4x128,5x192,6x256"  # 0.79M to 4.7M parameters in the blocks (6x); 8x384 (14M) takes ~35 min a rung
RECIPES = {"gpt2": [], "modern": [str(REPO / "config" / "modern.py")],
           "nanochat": [str(REPO / "config" / "nanochat.py")]}
VOCAB, BLOCK, TOKENS_PER_STEP = 50304, 128, 4 * 128  # config/quickstart.py's


def write_corpus(folder: Path) -> Path:
    """The corpus as a prepare_data.py --input folder: Shakespeare in 40 parts, then one file per library module."""
    text = folder / "text"
    text.mkdir(parents=True, exist_ok=True)
    lines = SHAKESPEARE.read_text().splitlines(keepends=True)
    for i in range(40):
        (text / f"a-shakespeare-{i:02d}.txt").write_text("".join(lines[i * len(lines) // 40:(i + 1) * len(lines)
                                                                         // 40]))
    library = Path(sysconfig.get_paths()["stdlib"])
    for source in sorted(library.glob("*.py")):
        (text / f"b-python-{source.stem}.txt").write_text(source.read_text(encoding="utf-8", errors="replace"))
    return text


def make_data(folder: Path) -> Path:
    """The corpus tokenized (prepare_data.py, 5% of the documents for val), in folder/tokens."""
    out = folder / "tokens"
    if (out / "meta.json").is_file():
        return out
    return bench_recipe.tokenize(write_corpus(folder), out, 0.05)


def flops_per_step(n_layer: int, n_embd: int, recipe: str) -> float:
    """Training FLOPs of one step (forward and backward, 6 per weight per token, plus attention's 12 x L x d x T per
    token): the blocks' matrices, the output head (untied or not, it is one matmul); ReLU² and GELU MLPs alike."""
    blocks = 12 * n_layer * n_embd ** 2
    head = n_embd * VOCAB
    attention = 12 * n_layer * n_embd * BLOCK
    return (6 * (blocks + head) + attention) * TOKENS_PER_STEP


def recipes_for(tries: list[str]) -> dict[str, list[str]]:
    recipes = dict(RECIPES)
    for text in tries:
        name, sep, settings = text.partition("=")
        if not sep or not name.isidentifier() or not settings.strip() or name in recipes:
            raise UserError(f"--try {text!r}: give a new name, then the settings, e.g. "
                            "--try \"lr2=config/modern.py --muon_lr=0.01\"")
        recipes[name] = [str(REPO / s) if s.endswith(".py") and not s.startswith("--") else s
                         for s in settings.split()]
    return recipes


def rung_settings(rung: str, seed: int) -> list[str]:
    n_layer, n_head, n_embd = RUNGS[rung]
    return [f"--n_layer={n_layer}", f"--n_head={n_head}", f"--n_embd={n_embd}", f"--seed={seed}"]


def rung_table(rung: str, results: dict[tuple[str, int], bench_recipe.Result], seeds: list[int],
               steps: int) -> list[str]:
    """One row per recipe and seed, each against the same seed's GPT-2 run."""
    n_layer, _, n_embd = RUNGS[rung]
    lines = [f"| {rung} | recipe | seed | val @{steps} | val @equal CPU | step to GPT-2's final | x steps | "
             "GFLOPs to it | s CPU to it | x time |", "|---|---|---|---|---|---|---|---|---|---|"]
    order = {name: i for i, name in enumerate(RECIPES)}
    for (name, seed), r in sorted(results.items(), key=lambda item: (item[0][1], order.get(item[0][0], 99))):
        base = results[("gpt2", seed)]
        budget = min(other.curve[-1][0] * other.step_s for (_, s), other in results.items() if s == seed)
        target, base_steps = base.curve[-1][1], base.reaches(base.curve[-1][1])
        reached = r.reaches(target)
        flops = flops_per_step(n_layer, n_embd, name)
        cells = ["not reached", "-", "-", "-", "-"] if reached is None else [
            f"{reached:.0f}", f"{reached / base_steps:.2f}", f"{reached * flops / 1e9:,.0f}",
            f"{reached * r.step_s:.0f}", f"{reached * r.step_s / (base_steps * base.step_s):.2f}"]
        lines.append(f"| | {name} | {seed} | {r.curve[-1][1]:.4f} | {val_at(r, budget / r.step_s):.4f} | "
                     + " | ".join(cells) + " |")
    return lines


def val_at(r: bench_recipe.Result, step: float) -> float:
    """The run's val loss at `step` (a fraction of one too), linear between its evaluations (and from its first
    evaluation's loss before it)."""
    previous = r.curve[0]
    for point in r.curve:
        if point[0] >= step:
            if point[0] == previous[0]:
                return point[1]
            return previous[1] + (point[1] - previous[1]) * (step - previous[0]) / (point[0] - previous[0])
        previous = point
    return r.curve[-1][1]


def plot(all_results: dict, out: Path) -> None:
    """Val loss against training FLOPs, every rung, recipe and seed (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {"gpt2": "tab:blue", "modern": "tab:red", "nanochat": "tab:green"}
    for (rung, name, seed), r in sorted(all_results.items()):
        n_layer, _, n_embd = RUNGS[rung]
        flops = flops_per_step(n_layer, n_embd, name)
        ax.plot([s * flops for s, _ in r.curve], [v for _, v in r.curve], color=colors.get(name),
                linestyle=("-", "--", ":")[list(RUNGS).index(rung)], alpha=0.8 if seed == 0 else 0.5,
                label=f"{rung} {name}" if seed == 0 else None)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("val loss")
    ax.set_title("GPT-2's recipe, config/modern.py and config/nanochat.py, by model size (lines: seeds)")
    ax.legend()
    fig.savefig(out, dpi=100, bbox_inches="tight")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rungs", default=DEFAULT_RUNGS, help=f"comma-separated, of {', '.join(RUNGS)}")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds: each run is made once per seed")
    p.add_argument("--steps", type=int, default=600, help="training steps per run")
    p.add_argument("--eval-every", type=int, default=50, help="steps between val evaluations")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run")
    p.add_argument("--corpus", type=Path, help="keep the corpus in this folder (default: a temporary one)")
    p.add_argument("--corpus-only", action="store_true", help="write and tokenize the corpus, then stop")
    p.add_argument("--try", dest="tries", action="append", default=[], metavar="NAME=SETTINGS",
                   help="one more recipe: a name, then train.py settings after the size (space-separated)")
    p.add_argument("--plot", type=Path, help="write the loss-vs-FLOPs plot here (PNG)")
    p.add_argument("--json", type=Path, help="write every run's curve and step time here")
    p.add_argument("--reuse", type=Path, help="an earlier --json of the same --steps and --eval-every: its runs "
                   "are taken as they are, only the others are made (e.g. a --try added to a measured ladder)")
    return p.parse_args(argv)


def reused_runs(args: argparse.Namespace) -> dict[str, "bench_recipe.Result"]:
    """--reuse's runs by "rung|recipe|seed" (none without it); a file of other steps is one line."""
    if not args.reuse:
        return {}
    try:
        record = json.loads(args.reuse.read_text())
        runs = {k: bench_recipe.Result([tuple(p) for p in r["curve"]], r["step_s"], r["wall_s"])
                for k, r in record["runs"].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--reuse {args.reuse}: not a bench_ladder.py --json file ({e})") from None
    if (record.get("steps"), record.get("eval_every")) != (args.steps, args.eval_every):
        raise UserError(f"--reuse {args.reuse}: its runs are {record.get('steps')} steps evaluated every "
                        f"{record.get('eval_every')}, not {args.steps} and {args.eval_every}: give the same")
    return runs


def checked(args: argparse.Namespace) -> tuple[list[str], list[int]]:
    rungs = [r for r in args.rungs.split(",") if r]
    unknown = [r for r in rungs if r not in RUNGS]
    if unknown or not rungs:
        raise UserError(f"--rungs {args.rungs!r}: choose among {', '.join(RUNGS)}")
    try:
        seeds = sorted({int(s) for s in args.seeds.split(",")})
    except ValueError:
        raise UserError(f"--seeds {args.seeds!r}: whole numbers, comma-separated (e.g. 0,1)") from None
    if args.eval_every < 1:
        raise UserError(f"--eval-every {args.eval_every}: steps between evaluations, 1 or more")
    if args.steps < 2 * args.eval_every:
        raise UserError(f"--steps {args.steps} needs at least two evaluations: raise it or lower --eval-every")
    if args.jobs < 1 or args.threads < 1:
        raise UserError("--jobs and --threads are 1 or more")
    return rungs, seeds


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    rungs, seeds = checked(args)
    recipes = recipes_for(args.tries)
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="bench_ladder_") as tmp:
        data_dir = make_data(args.corpus or Path(tmp) / "corpus")
        if args.corpus_only:
            print(f"corpus: {data_dir} ({json.loads((data_dir / 'meta.json').read_text()).get('splits')})")
            return 0
        reused = reused_runs(args)
        runs = {f"{rung}|{name}|{seed}": [*rung_settings(rung, seed), *settings]
                for rung in rungs for seed in seeds for name, settings in recipes.items()
                if f"{rung}|{name}|{seed}" not in reused}
        work = Path(tmp) / "runs"
        work.mkdir()
        opts = argparse.Namespace(rounds=1, jobs=args.jobs, threads=args.threads, steps=args.steps,
                                  eval_every=args.eval_every)
        made = {k: rs[0] for k, rs in bench_recipe.run_all(runs, data_dir, work, opts).items()} if runs else {}
    wanted = {f"{rung}|{name}|{seed}" for rung in rungs for seed in seeds for name in recipes}
    all_results = {(k.split("|")[0], k.split("|")[1], int(k.split("|")[2])): r
                   for k, r in {**reused, **made}.items() if k in wanted}
    print(f"\n{args.steps} steps of {TOKENS_PER_STEP} tokens (config/quickstart.py's batch and schedule) on "
          f"Shakespeare + Python {sys.version.split()[0]}'s library, {os.cpu_count()} CPU cores, {args.jobs} run(s) "
          f"at a time, {args.threads} thread(s) each, {time.time() - start:.0f} s in all:\n")
    for rung in rungs:
        print("\n".join(rung_table(rung, {(n, s): r for (g, n, s), r in all_results.items() if g == rung}, seeds,
                                   args.steps)) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "eval_every": args.eval_every, "runs": {
            "|".join(map(str, k)): r._asdict() for k, r in all_results.items()}}))
    if args.plot:
        plot(all_results, args.plot)
    return 0


if __name__ == "__main__":
    run_main(main)
