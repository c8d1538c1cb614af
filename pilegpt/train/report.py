"""A run in one page: report.md (and loss.png) from a run folder's config.json, metrics and eval.py results.

    write_report("runs/quickstart")              # -> runs/quickstart/report.md, loss.png
    write_report("s3://my-bucket/runs/pile")     # read from S3; report.md and loss.png uploaded beside the run
    plot(metrics, Path("loss.png"), "title")     # the loss curve of a run's metrics (plot_loss.py's too)

report.py is the command; train.py calls write_report at the end of every run. What the report holds and where
each figure comes from: report.py's docstring.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from array import array
from pathlib import Path
from typing import Optional

import numpy as np

from pilegpt import core_eval, pile_bpb, storage
from pilegpt.common import UserError, atomic_path, atomic_write_text
from pilegpt.hellaswag import ANCHORS

REPORT = "report.md"
PLOT = "loss.png"
WINDOW = 20  # batches in the moving average of the loss curve
SPEED_ROWS = 50  # the last logged batches whose median tokens/s and MFU are reported


class Metrics:
    """What the report needs of metrics.jsonl rows, taken one row at a time: the memory held is a few numbers per
    logged batch, not the rows. A resumed run repeats the batches after its checkpoint: the later row wins."""

    def __init__(self) -> None:
        self._train = (array("q"), array("d"))  # (batch, train loss) of every row, in file order: 16 bytes a row
        self._val = (array("q"), array("d"))  # (batch, val loss)
        self._grad = (array("q"), array("d"))  # (batch, gradient norm before clipping) of the logged batches
        self._sets: dict[str, tuple[array, array]] = {}  # every other eval set: (batch, its loss)
        self.tail: dict[int, dict] = {}  # the rows of the last logged batches (speed, MFU, the final loss)
        self.evals: dict[str, dict[str, tuple[float, int]]] = {}  # eval set -> {"loss"|"bpb": (value, batch)}
        self.hellaswag: Optional[dict] = None  # the last row with in-training HellaSwag figures
        self.core: Optional[dict] = None  # the last row with an in-training CORE figure
        self.skipped = 0  # lines that are not a metrics row (cut by a kill, garbage)

    def add_line(self, line: bytes | str) -> None:
        if not line.strip():
            return
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not is_row(row):
            self.skipped += 1
            return
        batch = row["batch"]
        for key, (batches, values) in (("loss", self._train), ("val_loss", self._val), ("grad_norm", self._grad)):
            if key in row:
                batches.append(batch)
                values.append(row[key])
        self.tail[batch] = row
        if len(self.tail) > 4 * SPEED_ROWS:  # only the highest batches can be among the last ones
            self.tail = {b: self.tail[b] for b in sorted(self.tail)[-2 * SPEED_ROWS:]}
        for k, v in row.items():
            if k.endswith(("_loss", "_bpb")) and k != "loss":
                self.evals.setdefault(k.rsplit("_", 1)[0], {})[k.rsplit("_", 1)[1]] = (v, batch)
            if k.endswith("_loss") and k not in ("loss", "val_loss"):
                batches, values = self._sets.setdefault(k[:-len("_loss")], (array("q"), array("d")))
                batches.append(batch)
                values.append(v)
        if "hellaswag_acc" in row and "hellaswag_acc_norm" in row:
            self.hellaswag = row
        if "core" in row:
            self.core = row

    @property
    def train(self) -> tuple[np.ndarray, np.ndarray]:
        """(batches, train losses) in batch order, the last row of each batch."""
        return last_per_batch(*self._train)

    @property
    def val(self) -> tuple[np.ndarray, np.ndarray]:
        """(batches, val losses) in batch order, the last row of each batch."""
        return last_per_batch(*self._val)

    @property
    def grad_norm(self) -> tuple[np.ndarray, np.ndarray]:
        """(batches, gradient norms before clipping) in batch order: the batches the step line was written at."""
        return last_per_batch(*self._grad)

    def eval_sets(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Every eval set but val (eval_data's, a mix's components): (batches, losses) in batch order."""
        return {label: last_per_batch(*series) for label, series in self._sets.items()}

    def last_rows(self) -> list[dict]:
        """The rows of the last SPEED_ROWS logged batches, in batch order."""
        return [self.tail[b] for b in sorted(self.tail)[-SPEED_ROWS:]]


def last_per_batch(batches: array, values: array) -> tuple[np.ndarray, np.ndarray]:
    """Each batch's last value, in batch order (np.unique on the reversed columns finds the last occurrences)."""
    b = np.frombuffer(batches, dtype=np.int64)[::-1] if batches else np.zeros(0, np.int64)
    v = np.frombuffer(values, dtype=np.float64)[::-1] if values else np.zeros(0)
    unique, first = np.unique(b, return_index=True)
    return unique, v[first]


def is_row(row) -> bool:
    """A metrics.jsonl row: a JSON object with an integer batch and numbers for the figures the report reads."""
    number = (int, float)
    return (isinstance(row, dict) and isinstance(row.get("batch"), int) and not isinstance(row["batch"], bool)
            and all(isinstance(v, number) and not isinstance(v, bool) for k, v in row.items()
                    if k in ("loss", "tokens", "time_s", "tokens_per_sec", "mfu", "grad_norm", "hellaswag_acc",
                             "hellaswag_acc_norm", "core") or k.endswith("_loss")
                    or (k.endswith("_bpb") and v is not None)))  # a bpb of no bytes is null: no figure


def read_metrics(folder, names: list[str]) -> Metrics:
    """Metrics of the files `names` of a storage folder, in order, one line at a time (a local folder's files
    where they are; S3: each file downloaded to a temporary file first)."""
    metrics = Metrics()
    with tempfile.TemporaryDirectory(prefix="report-metrics-") as tmp:
        for name in names:
            if isinstance(folder, storage.LocalDir):
                read_metrics_file(folder.path / name, metrics)
                continue
            folder.download(name, Path(tmp) / "metrics.jsonl")
            read_metrics_file(Path(tmp) / "metrics.jsonl", metrics)
    return metrics


def read_metrics_file(path: Path, metrics: Metrics) -> Metrics:
    """Add every line of the local metrics file `path` to `metrics`, one line at a time."""
    with open(path, "rb") as f:
        for line in f:
            metrics.add_line(line)
    return metrics


def read_results(folder, names: list[str]) -> tuple[dict[str, dict], list[str]]:
    """eval.py's results saved in the run folder (hellaswag*.json, pile*.json, core*.json), and the names of those
    that are not."""
    results, skipped = {}, []
    for n in names:
        if "/" in n or not (n.startswith(("hellaswag", "pile", "core")) and n.endswith(".json")):
            continue
        try:
            r = json.loads(folder.read(n))
        except (ValueError, UserError):
            r = None
        if is_hellaswag_result(r) or is_pile_result(r) or is_core_result(r):
            results[n] = r
        else:
            skipped.append(n)
    return results, skipped


def is_hellaswag_result(r) -> bool:
    return (isinstance(r, dict) and r.get("task", "hellaswag") == "hellaswag" and isinstance(r.get("n"), int)
            and all(isinstance(r.get(k), (int, float)) for k in ("acc", "acc_norm")))


def is_core_result(r) -> bool:
    tasks = r.get("tasks") if isinstance(r, dict) else None
    return (isinstance(r, dict) and r.get("task") == "core" and isinstance(r.get("core"), (int, float))
            and isinstance(r.get("n"), int) and isinstance(tasks, dict)
            and all(isinstance(t, dict) and isinstance(t.get("centered"), (int, float)) for t in tasks.values()))


def is_pile_result(r) -> bool:
    components = r.get("components") if isinstance(r, dict) else None
    return (isinstance(r, dict) and r.get("task") == "pile" and isinstance(r.get("bpb"), (int, float))
            and isinstance(components, dict) and all(isinstance(c, dict) and (c.get("bpb") is None or isinstance(
                c.get("bpb"), (int, float))) for c in components.values()))


def read_run(src: str) -> tuple[dict, Metrics, dict[str, dict], dict[str, str]]:
    """(config.json, metrics, eval.py results by file name, where each came from) of a local or s3:// run."""
    folder = storage.folder(src)
    config_text = folder.get("config.json")
    if config_text is None:
        raise UserError(f"{storage.join(src, 'config.json')} not found: pass the save folder of a train.py run")
    try:
        info = json.loads(config_text)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        raise UserError(f"{storage.join(src, 'config.json')} is damaged (not a JSON object): the report needs the "
                        "config.json train.py wrote")
    names = folder.names()
    metric_files = ["metrics.jsonl"] if "metrics.jsonl" in names else sorted(
        n for n in names if n.startswith("logs/") and n.endswith("-metrics.jsonl"))
    results, bad_results = read_results(folder, names)
    sources = {"config": storage.join(src, "config.json"),
               "metrics": ", ".join(storage.join(src, n) for n in metric_files) or "(none)",
               "skipped_results": ", ".join(bad_results)}
    return info, read_metrics(folder, metric_files), results, sources


def changed_settings(config: dict) -> list[tuple[str, object, object]]:
    """(setting, the run's value, the default) of each setting the run changed; a removed one (removed.REMOVED_SETTINGS)
    too, as a run from before its removal ran with it."""
    from pilegpt.removed import REMOVED_SETTINGS
    from pilegpt.train.config import TrainConfig, setting_default

    defaults = {**{k: default for k, (default, _) in REMOVED_SETTINGS.items()},
                **{f.name: setting_default(f.name) for f in dataclasses.fields(TrainConfig)}}
    return [(k, v, defaults[k]) for k, v in config.items() if k in defaults and v != defaults[k]]


def render(info: dict, metrics: Metrics, results: dict[str, dict], sources: dict[str, str],
           plot: Optional[str]) -> str:
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    lines = [f"# Run report: {config.get('run_name')}", "",
             f"Started {info.get('started')} on {info.get('host')}, git commit {info.get('git_commit')}; "
             f"{info.get('world_size')} process(es) on {info.get('device')} ({info.get('gpu') or 'no GPU'}), precision "
             f"{info.get('precision')}. Source: `{sources['config']}`.", "",
             "## Settings that differ from train.py's defaults", "",
             "| setting | this run | default |", "|---|---|---|"]
    lines += [f"| {k} | `{v!r}` | `{d!r}` |" for k, v, d in changed_settings(config)]
    lines += ["", "## Environment", "", "| | version |", "|---|---|"]
    for k in ("python", "torch", "composer", "streaming", "numpy"):
        lines.append(f"| {k} | {info.get(k)} |")
        if k == "torch" and isinstance(info.get("torch_earlier"), list):  # resumed on another torch (run/folder.py)
            lines.append(f"| other torch this run trained on | {', '.join(map(str, info['torch_earlier']))} |")
    lines += mix_lines(info.get("data_mix"))
    lines += ["", f"## Training (source: `{sources['metrics']}`)", ""] + training_lines(metrics)
    lines += ["", "## HellaSwag", ""] + hellaswag_lines(config, metrics, results, sources)
    lines += ["", "## CORE", ""] + core_lines(config, metrics, results, sources)
    lines += ["", "## Pile bits per byte", ""] + pile_lines(results)
    if plot:
        lines += ["", "## Loss curve", "", f"![loss curve]({PLOT})", "", f"`{PLOT}`: {plot.rsplit(' -> ', 1)[0]}"]
    return "\n".join(lines) + "\n"


def training_lines(metrics: Metrics) -> list[str]:
    """The training section: batches, speed, MFU, the final train loss, every eval set's last figures."""
    rows = metrics.last_rows()
    lines = [] if rows else ["No batch was logged."]
    if rows:
        last = rows[-1]
        speed = [r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r]
        mfu = [r["mfu"] for r in rows if "mfu" in r]
        losses = [r["loss"] for r in rows[-20:] if "loss" in r]
        lines += [f"- {last['batch']:,} batches, {last.get('tokens', 0):,} tokens, {last.get('time_s', 0):,.0f} s "
                  "of the last start",
                  f"- throughput: {statistics.median(speed):,.0f} tokens/s (median of the last {len(speed)} logged "
                  "batches)" if speed else "- throughput: not logged",
                  f"- MFU: {100 * statistics.median(mfu):.1f}%" if mfu else "- MFU: not logged (CPU, or no FLOP count)",
                  f"- train loss: {statistics.fmean(losses):.4f} (mean of the last {len(losses)} batches)"
                  if losses else "- train loss: not logged"]
    lines += grad_norm_lines(metrics)
    if metrics.skipped:
        lines.append(f"- {metrics.skipped:,} unreadable line(s) of the metrics skipped (cut by a kill, or not a "
                     "metrics row)")
    if metrics.evals:
        lines += ["", "| eval set | loss | bits per byte | at batch |", "|---|---|---|---|"]
        for label, figures in metrics.evals.items():
            loss, batch = figures.get("loss", (float("nan"), "-"))
            bpb = figures.get("bpb", (float("nan"), ""))[0]
            bpb = "none (no bytes)" if bpb is None else f"{bpb:.4f}"
            lines.append(f"| {label} | {loss:.4f} | {bpb} | {batch} |")
    return lines


def grad_norm_lines(metrics: Metrics) -> list[str]:
    """The gradient norm before clipping (metrics.jsonl's grad_norm, at the logged batches): its last value and its
    largest, with their batches; nothing for a run that logged none (from before grad_norm)."""
    batches, norms = metrics.grad_norm
    if not len(norms):
        return []
    finite = np.isfinite(norms)
    top = int(np.argmax(norms)) if finite.all() else int(np.flatnonzero(~finite)[0])
    worst = "the largest" if finite.all() else "first NaN or infinite:"
    return [f"- gradient norm before clipping: {norms[-1]:.4f} at batch {batches[-1]:,}, {worst} {norms[top]:.4f} "
            f"at batch {batches[top]:,} (of {len(norms):,} logged batches)"]


def mix_lines(shares) -> list[str]:
    """The data mix's table (config.json's data_mix: train.py's realised shares), or nothing without a mix."""
    if not isinstance(shares, dict) or not shares:
        return []
    lines = ["", "## Data mix", "", "Each component's share of the tokens of one epoch (its per-component loss and "
             "bits per byte: the eval set of its name below).", "",
             "| component | weight | samples in its train split | samples per epoch | share of an epoch's tokens |",
             "|---|---|---|---|---|"]
    for name, s in shares.items():
        if isinstance(s, dict):
            weight = ", ".join(f"{k} {v}" for k, v in s.get("weight", {}).items())
            lines.append(f"| {name} | {weight} | {s.get('size', 0):,} | {s.get('samples', 0):,} | "
                         f"{100 * s.get('share', 0):.2f}% |")
    return lines


def hellaswag_lines(config: dict, metrics: Metrics, results: dict[str, dict], sources: dict[str, str]) -> list[str]:
    """The HellaSwag table: in training, eval.py's saved results, the published anchors."""
    lines = ["| model | acc | acc_norm | source |", "|---|---|---|---|"]
    if (hs := metrics.hellaswag) is not None:
        lines.append(f"| this run, batch {hs['batch']} (first {config.get('hellaswag_examples')} examples, in "
                     f"training) | {100 * hs['hellaswag_acc']:.2f} | {100 * hs['hellaswag_acc_norm']:.2f} | "
                     f"`{sources['metrics']}` |")
    for name, r in sorted((n, r) for n, r in results.items() if is_hellaswag_result(r)):
        lines.append(f"| this run, eval.py on {r.get('source')} ({r['n']:,} examples) | {100 * r['acc']:.2f} | "
                     f"{100 * r['acc_norm']:.2f} | `{name}` |")
    lines += [f"| {model} | {acc:.2f} | {acc_norm:.2f} | {source} |" for model, acc, acc_norm, source in ANCHORS]
    if sources.get("skipped_results"):
        lines += ["", f"Not eval.py results, skipped: {sources['skipped_results']}."]
    return lines


def core_lines(config: dict, metrics: Metrics, results: dict[str, dict], sources: dict[str, str]) -> list[str]:
    """The CORE table: in training, eval.py --task core's saved results (CORE, then each task's centered accuracy),
    the published anchors."""
    mine = sorted((n, r) for n, r in results.items() if is_core_result(r))
    lines = ["| model | CORE | items | source |", "|---|---|---|---|"]
    if (row := metrics.core) is not None:
        n = config.get("core_examples")
        lines.append(f"| this run, batch {row['batch']} ({'all' if n == -1 else f'the first {n} of each task'}, in "
                     f"training) | {row['core']:.4f} | | `{sources['metrics']}` |")
    for name, r in mine:
        per = f" (first {r['max_per_task']} of each task)" if isinstance(r.get("max_per_task"), int) else ""
        lines.append(f"| this run, eval.py on {r.get('source')}{per} | {r['core']:.4f} | {r['n']:,} | `{name}` |")
    lines += [f"| {model} | {core:.4f} | | {source} |" for model, core, source in core_eval.ANCHORS]
    for name, r in mine:
        lines += ["", f"Per task (`{name}`): centered accuracy (accuracy).", "", "| task | centered | acc | items |",
                  "|---|---|---|---|"]
        lines += [f"| {label} | {t['centered']:+.4f} | {t.get('acc', 0):.4f} | {t.get('n', 0):,} |"
                  for label, t in r["tasks"].items()]
    if not mine and metrics.core is None:
        lines += ["", "`python eval.py RUN --task core --out RUN/core.json` adds this run's (docs/evaluation.md#core)."]
    return lines


def pile_lines(results: dict[str, dict]) -> list[str]:
    """The Pile BPB tables: eval.py --task pile's saved results overall beside the paper's overall figures, then
    each result's components beside the paper's per-component ones; a run scored on no Pile file shows none of them,
    only how to add its own."""
    if not any(is_pile_result(r) for r in results.values()):
        return ["Not scored on the Pile: `python eval.py RUN --task pile --out RUN/pile.json` adds this run's, beside "
                "GPT-2's and GPT-3's published figures (docs/evaluation.md#pile-bits-per-byte)."]
    pile = sorted((n, r) for n, r in results.items() if is_pile_result(r))
    lines = ["| model | documents | bits per byte | source |", "|---|---|---|---|"]
    lines += [f"| this run, eval.py on {r.get('source')}: all components (all bits over all bytes) | "
              f"{r.get('documents', 0):,} | {r['bpb']:.4f} | `{name}` |" for name, r in pile]
    lines += [f"| {model}, the Pile's test set | | {bpb:.4f} | {source} |" for model, bpb, source in pile_bpb.ANCHORS]
    for name, r in pile:
        lines += ["", f"Per component (`{name}`), beside Table 2 of {pile_bpb.PAPER} (test set; blank: not a "
                  "component of the Pile):", "",
                  "| component | documents | this run | " + " | ".join(pile_bpb.COMPONENT_MODELS) + " |",
                  "|---|---|---|" + "---|" * len(pile_bpb.COMPONENT_MODELS)]
        for component, c in r["components"].items():
            ours = "none (all empty)" if c["bpb"] is None else f"{c['bpb']:.4f}"
            paper = pile_bpb.component_anchors(component) or ("",) * len(pile_bpb.COMPONENT_MODELS)
            lines.append(f"| {component} | {c.get('documents', 0):,} | {ours} | "
                         + " | ".join(f"{v:.4f}" if v else "" for v in paper) + " |")
    return lines + ["", "The paper scored the test set's documents (one tenth of them) with untuned models; a run "
                    "scored on other documents (the val set, a sample) compares only roughly. `python eval.py RUN "
                    "--task pile --out RUN/pile.json` adds this run's."]


def write_report(src: str) -> str:
    """Write report.md and loss.png into the run folder `src` (local or s3://); returns the report's location."""
    with tempfile.TemporaryDirectory(prefix="report-") as tmp:
        info, metrics, results, sources = read_run(src)
        local = Path(tmp) if storage.is_remote(src) else Path(storage.local_path(src))
        config = info.get("config") if isinstance(info.get("config"), dict) else {}
        plot_file = plot(metrics, local / PLOT, str(config.get("run_name"))) if len(metrics.train[0]) else None
        atomic_write_text(local / REPORT, render(info, metrics, results, sources, plot_file))
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


def first_to_last(losses: list[float]) -> str:
    """"train loss A -> B": the means of the first and the last WINDOW batches, or of two halves that do not overlap
    when the run is shorter than two windows; a run no longer than one window compares its first and last batch (two
    overlapping windows would compare its batches with themselves)."""
    if len(losses) <= WINDOW:
        return f"train loss {losses[0]:.3f} -> {losses[-1]:.3f} (first and last batch)"
    n = min(WINDOW, len(losses) // 2)
    return (f"train loss {statistics.fmean(losses[:n]):.3f} -> {statistics.fmean(losses[-n:]):.3f} (means of the "
            f"first and last {n} batches)")


def plot(metrics: Metrics, out: Path, title: str) -> str:
    """Write the loss curve of these metrics to the PNG `out`; return the one-line summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    train, val, sets, (grad_xs, grad_ys) = metrics.train, metrics.val, metrics.eval_sets(), metrics.grad_norm
    (xs, ys), (val_xs, val_ys) = train, val
    smooth = moving_average(ys.tolist(), WINDOW)
    if len(grad_xs):  # the gradient norm in a panel below, on the same batches
        fig, (ax, grad_ax) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=100, sharex=True,
                                          gridspec_kw={"height_ratios": [3, 1]})
        grad_ax.plot(grad_xs, grad_ys, ".-", color="tab:green", linewidth=1.0, markersize=3)
        grad_ax.set_yscale("log")  # a spike stands out over a norm that falls by orders of magnitude
        for set_formatter in (grad_ax.yaxis.set_major_formatter, grad_ax.yaxis.set_minor_formatter):
            set_formatter(matplotlib.ticker.LogFormatter(minor_thresholds=(1, 0.4)))  # 1.45, not 1.45 x 10^0
        grad_ax.set_ylabel("grad norm (before clipping)")
        grad_ax.set_xlabel("batch")
        grad_ax.grid(alpha=0.3)
    else:
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(xs, ys, color="tab:blue", alpha=0.25, linewidth=0.8, label="train loss")
    ax.plot(xs, smooth, color="tab:blue", linewidth=1.8, label=f"train loss ({WINDOW}-batch mean)")
    if len(val_xs):
        ax.plot(val_xs, val_ys, "o-", color="tab:orange", label="val loss")
    for label, (set_xs, set_ys) in sorted(sets.items()):  # eval_data's sets, a mix's components
        ax.plot(set_xs, set_ys, ".--", linewidth=1.0, label=f"{label} loss")
    if not len(grad_xs):
        ax.set_xlabel("batch")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncol=1 + len(sets) // 8)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return (f"plot_loss: {len(xs)} batch{'es' if len(xs) != 1 else ''}, {first_to_last(ys.tolist())}"
            + (f", last val loss {val_ys[-1]:.3f}" if len(val_xs) else "")
            + (f", {len(sets)} more eval set(s)" if sets else "")
            + (f", grad norm at {len(grad_xs)} batch{'es' if len(grad_xs) != 1 else ''}" if len(grad_xs) else "")
            + f" -> {out}")
