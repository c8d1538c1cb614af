"""A run in one page: report.md (and loss.png) from a run folder's config.json, metrics and eval.py results.

    write_report("runs/quickstart")              # -> runs/quickstart/report.md, loss.png
    write_report("s3://my-bucket/runs/pile")     # read from S3; report.md and loss.png uploaded beside the run
    plot(rows, Path("loss.png"), "title")        # the loss curve of metrics.jsonl rows (plot_loss.py's too)

report.py is the command; train.py calls write_report at the end of every run. What the report holds and where
each figure comes from: report.py's docstring.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from pathlib import Path
from typing import Optional

from pilegpt import storage
from pilegpt.common import UserError, atomic_path, atomic_write_text
from pilegpt.hellaswag import ANCHORS

REPORT = "report.md"
PLOT = "loss.png"
WINDOW = 20  # batches in the moving average of the loss curve
SPEED_ROWS = 50  # the last logged batches whose median tokens/s and MFU are reported


def read_run(src: str) -> tuple[dict, list[dict], dict[str, dict], dict[str, str]]:
    """(config.json, metrics rows, eval.py results by file name, where each came from) of a local or s3:// run."""
    folder = storage.folder(src)
    config_text = folder.get("config.json")
    if config_text is None:
        raise UserError(f"{storage.join(src, 'config.json')} not found: pass the save folder of a train.py run")
    names = folder.names()
    metric_files = ["metrics.jsonl"] if "metrics.jsonl" in names else sorted(
        n for n in names if n.startswith("logs/") and n.endswith("-metrics.jsonl"))
    rows = [json.loads(line) for name in metric_files for line in folder.read(name).decode().splitlines()
            if line.strip()]
    results = {n: json.loads(folder.read(n)) for n in names if "/" not in n and n.startswith("hellaswag")
               and n.endswith(".json")}
    sources = {"config": storage.join(src, "config.json"),
               "metrics": ", ".join(storage.join(src, n) for n in metric_files) or "(none)"}
    return json.loads(config_text), rows, results, sources


def last_rows_by_batch(rows: list[dict]) -> list[dict]:
    """One row per batch, the last written (a resumed run repeats the batches after its checkpoint)."""
    return sorted({r["batch"]: r for r in rows if "batch" in r}.values(), key=lambda r: r["batch"])


def changed_settings(config: dict) -> list[tuple[str, object, object]]:
    from pilegpt.train.config import TrainConfig

    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(TrainConfig)}
    return [(k, v, defaults[k]) for k, v in config.items() if k in defaults and v != defaults[k]]


def render(info: dict, rows: list[dict], results: dict[str, dict], sources: dict[str, str], plot: Optional[str]) -> str:
    config = info.get("config", {})
    logged, rows = rows, last_rows_by_batch(rows)  # every row in order (later figures win), one row per batch
    lines = [f"# Run report: {config.get('run_name')}", "",
             f"Started {info.get('started')} on {info.get('host')}, git commit {info.get('git_commit')}; "
             f"{info.get('world_size')} process(es) on {info.get('device')} ({info.get('gpu') or 'no GPU'}), precision "
             f"{info.get('precision')}. Source: `{sources['config']}`.", "",
             "## Settings that differ from train.py's defaults", "",
             "| setting | this run | default |", "|---|---|---|"]
    lines += [f"| {k} | `{v!r}` | `{d!r}` |" for k, v, d in changed_settings(config)]
    lines += ["", "## Environment", "", "| | version |", "|---|---|"]
    lines += [f"| {k} | {info.get(k)} |" for k in ("python", "torch", "composer", "streaming", "numpy")]
    lines += ["", f"## Training (source: `{sources['metrics']}`)", ""]
    if not rows:
        lines.append("No batch was logged.")
    else:
        last = rows[-1]
        speed = [r["tokens_per_sec"] for r in rows[-SPEED_ROWS:] if "tokens_per_sec" in r]
        mfu = [r["mfu"] for r in rows[-SPEED_ROWS:] if "mfu" in r]
        losses = [r["loss"] for r in rows[-20:] if "loss" in r]
        lines += [f"- {last['batch']:,} batches, {last.get('tokens', 0):,} tokens, {last.get('time_s', 0):,.0f} s "
                  "of the last start",
                  f"- throughput: {statistics.median(speed):,.0f} tokens/s (median of the last {len(speed)} logged "
                  "batches)" if speed else "- throughput: not logged",
                  f"- MFU: {100 * statistics.median(mfu):.1f}%" if mfu else "- MFU: not logged (CPU, or no FLOP count)",
                  f"- train loss: {statistics.fmean(losses):.4f} (mean of the last {len(losses)} batches)"
                  if losses else "- train loss: not logged"]
        evals = {}
        for r in logged:
            for k, v in r.items():
                if k.endswith(("_loss", "_bpb")) and k != "loss":
                    evals.setdefault(k.rsplit("_", 1)[0], {})[k.rsplit("_", 1)[1]] = (v, r["batch"])
        if evals:
            lines += ["", "| eval set | loss | bits per byte | at batch |", "|---|---|---|---|"]
            for label, figures in evals.items():
                loss, batch = figures.get("loss", (float("nan"), "-"))
                bpb = figures.get("bpb", (float("nan"), ""))[0]
                lines.append(f"| {label} | {loss:.4f} | {bpb:.4f} | {batch} |")
    lines += ["", "## HellaSwag", "", "| model | acc | acc_norm | source |", "|---|---|---|---|"]
    hs = [r for r in logged if "hellaswag_acc" in r]
    if hs:
        lines.append(f"| this run, batch {hs[-1]['batch']} (first {config.get('hellaswag_examples')} examples, in "
                     f"training) | {100 * hs[-1]['hellaswag_acc']:.2f} | {100 * hs[-1]['hellaswag_acc_norm']:.2f} | "
                     f"`{sources['metrics']}` |")
    for name, r in sorted(results.items()):
        lines.append(f"| this run, eval.py on {r.get('source')} ({r.get('n'):,} examples) | {100 * r['acc']:.2f} | "
                     f"{100 * r['acc_norm']:.2f} | `{name}` |")
    lines += [f"| {model} | {acc:.2f} | {acc_norm:.2f} | {source} |" for model, acc, acc_norm, source in ANCHORS]
    if plot:
        lines += ["", "## Loss curve", "", f"![loss curve]({PLOT})", "", f"`{PLOT}`: {plot.rsplit(' -> ', 1)[0]}"]
    return "\n".join(lines) + "\n"


def write_report(src: str) -> str:
    """Write report.md and loss.png into the run folder `src` (local or s3://); returns the report's location."""
    with tempfile.TemporaryDirectory(prefix="report-") as tmp:
        info, rows, results, sources = read_run(src)
        local = Path(tmp) if storage.is_remote(src) else Path(storage.local_path(src))
        plot_file = plot(rows, local / PLOT, str(info.get("config", {}).get("run_name"))) \
            if any("loss" in r for r in rows) else None
        atomic_write_text(local / REPORT, render(info, rows, results, sources, plot_file))
        if storage.is_remote(src):
            folder = storage.folder(src)
            for name in (REPORT, PLOT):
                if (local / name).is_file():
                    folder.upload(local / name, name)
    return storage.join(src, REPORT)


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot(rows: list[dict], out: Path, title: str) -> str:
    """Write the loss curve of these metrics.jsonl rows to the PNG `out`; return the one-line summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A resumed run repeats the batches after its last checkpoint: the last row of each batch wins.
    train = sorted({r["batch"]: r["loss"] for r in rows if "loss" in r}.items())
    val = sorted({r["batch"]: r["val_loss"] for r in rows if "val_loss" in r}.items())
    xs, ys = zip(*train)
    smooth = moving_average(list(ys), WINDOW)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(xs, ys, color="tab:blue", alpha=0.25, linewidth=0.8, label="train loss")
    ax.plot(xs, smooth, color="tab:blue", linewidth=1.8, label=f"train loss ({WINDOW}-batch mean)")
    if val:
        ax.plot(*zip(*val), "o-", color="tab:orange", label="val loss")
    ax.set_xlabel("batch")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    first, last = sum(ys[:WINDOW]) / len(ys[:WINDOW]), sum(ys[-WINDOW:]) / len(ys[-WINDOW:])
    return (f"plot_loss: {len(train)} batches, train loss {first:.3f} -> {last:.3f}"
            + (f", last val loss {val[-1][1]:.3f}" if val else "") + f" -> {out}")
