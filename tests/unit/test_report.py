"""report.py: a run's report.md from a local run folder, with every figure and its source (from a run folder on S3:
tests/e2e/test_report.py)."""

import json

import report
from helpers import check_report, write_report_run


def test_report_of_a_local_run(tmp_path):
    write_report_run(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    check_report((tmp_path / "report.md").read_text(), str(tmp_path / "metrics.jsonl"))
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"




def test_report_shows_eval_py_pile_results_beside_the_papers_figures(tmp_path):
    write_report_run(tmp_path)
    (tmp_path / "pile.json").write_text(json.dumps({
        "task": "pile", "bpb": 1.5, "documents": 3, "source": "runs/r/model.pt",
        "components": {"ArXiv": {"bpb": 1.25, "documents": 1, "bytes": 10, "tokens": 4},
                       "Pile-CC": {"bpb": 1.75, "documents": 2, "bytes": 10, "tokens": 5},
                       "StackExchange": {"bpb": None, "documents": 1, "bytes": 0, "tokens": 0},
                       "my_notes": {"bpb": 2.0, "documents": 1, "bytes": 10, "tokens": 6}}}))
    (tmp_path / "pile_broken.json").write_text('{"task": "pile", "bpb": "high"}')
    assert report.main([str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## Pile bits per byte"):]
    assert ("| this run, eval.py on runs/r/model.pt: all components (all bits over all bytes) | 3 | 1.5000 | "
            "`pile.json` |") in section
    # each component beside Table 2 of the paper: GPT-2 small, GPT-2 XL, GPT-3 Ada, GPT-3 Davinci
    assert "| component | documents | this run | GPT-2 small | GPT-2 XL | GPT-3 Ada | GPT-3 Davinci |" in section
    assert "| ArXiv | 1 | 1.2500 | 1.3548 | 1.1381 | 1.0304 | 0.7702 |" in section
    assert "| Pile-CC | 2 | 1.7500 | 1.0878 | 0.9355 | 0.9212 | 0.7070 |" in section
    assert "| StackExchange | 1 | none (all empty) | 1.2981 | 1.0504 | 1.0096 | 0.7321 |" in section  # "Stack Exchange"
    assert "| my_notes | 1 | 2.0000 |  |  |  |  |" in section  # not a component of the Pile
    assert "| OpenAI GPT-2 124M, the Pile's test set | | 1.2253 | Gao et al. 2020" in section
    assert "| OpenAI GPT-3 Davinci, the Pile's test set | | 0.7177 |" in section
    assert "Not eval.py results, skipped: pile_broken.json." in text
    check_report(text, str(tmp_path / "metrics.jsonl"))  # the HellaSwag table has no pile row


def test_core_results_sit_beside_the_anchors_and_a_run_never_scored_on_the_pile_lists_no_pile_figures(tmp_path):
    write_report_run(tmp_path)
    (tmp_path / "core.json").write_text(json.dumps({
        "task": "core", "core": 0.05, "n": 20, "max_per_task": 10, "source": "runs/r/model.pt",
        "tasks": {"hellaswag": {"centered": 0.1, "acc": 0.325, "n": 10},
                  "lambada_openai": {"centered": 0.0, "acc": 0.0, "n": 10}}}))
    (tmp_path / "core_old.json").write_text('{"task": "core", "core": "high"}')
    assert report.main([str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    section = text[text.index("## CORE"):text.index("## Pile bits per byte")]
    assert "| this run, eval.py on runs/r/model.pt (first 10 of each task) | 0.0500 | 20 | `core.json` |" in section
    assert "| OpenAI GPT-2 124M | 0.1139 | |" in section and "| OpenAI GPT-2 1.5B | 0.2565 | |" in section
    assert "| hellaswag | +0.1000 | 0.3250 | 10 |" in section
    assert "| lambada_openai | +0.0000 | 0.0000 | 10 |" in section
    assert "Not eval.py results, skipped: core_old.json." in text
    pile = text[text.index("## Pile bits per byte"):]
    assert "Not scored on the Pile" in pile and "1.2253" not in pile and "|" not in pile.split("## Loss")[0]


def test_the_loss_plot_has_a_curve_for_every_eval_set_beside_val(tmp_path):
    from pilegpt.train.report import Metrics, plot

    metrics = Metrics()
    for row in [{"batch": 1, "loss": 10.0}, {"batch": 2, "loss": 9.0, "val_loss": 9.5, "ArXiv_loss": 8.0,
                                             "Github_loss": 7.0},
                {"batch": 4, "loss": 8.0, "val_loss": 8.5, "ArXiv_loss": 7.5, "Github_loss": 6.5}]:
        metrics.add_line(json.dumps(row))
    sets = metrics.eval_sets()
    assert sorted(sets) == ["ArXiv", "Github"]
    assert sets["ArXiv"][0].tolist() == [2, 4] and sets["Github"][1].tolist() == [7.0, 6.5]
    line = plot(metrics, tmp_path / "loss.png", "mix")
    assert ", last val loss 8.500, 2 more eval set(s) -> " in line and (tmp_path / "loss.png").stat().st_size > 0


def test_a_run_no_longer_than_the_loss_window_compares_its_first_and_last_batch_not_itself(tmp_path, capsys):
    """plot_loss.py and report.md: 10 batches falling 10.82 -> 7.25 once read "9.682 -> 9.682" (one 20-batch window
    over the whole run, at both ends)."""
    import numpy as np

    import plot_loss
    from helpers import write_report_run

    def run_of(losses):
        write_report_run(tmp_path)  # its config.json and evals; the train losses replaced
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"batch": i + 1, "loss": v}) + "\n"
                                                        for i, v in enumerate(losses)))
        assert plot_loss.main([str(tmp_path)]) == 0
        printed = capsys.readouterr().out
        assert report.main([str(tmp_path)]) == 0
        return printed, (tmp_path / "report.md").read_text()

    short = np.linspace(10.82, 7.25, 10).tolist()
    printed, text = run_of(short)
    assert "plot_loss: 10 batches, train loss 10.820 -> 7.250 (first and last batch)" in printed
    assert "`loss.png`: plot_loss: 10 batches, train loss 10.820 -> 7.250 (first and last batch)" in text
    for n_batches, window in ((30, 15), (50, 20)):  # two halves that do not overlap; two whole windows
        losses = (10 - np.arange(n_batches) * 0.1).tolist()
        first, last = np.mean(losses[:window]), np.mean(losses[-window:])
        printed, _ = run_of(losses)
        assert (f"plot_loss: {n_batches} batches, train loss {first:.3f} -> {last:.3f} (means of the first and last "
                f"{window} batches)") in printed
    printed, _ = run_of([9.5])
    assert "plot_loss: 1 batch, train loss 9.500 -> 9.500 (first and last batch)" in printed


def test_the_gradient_norm_is_reported_and_plotted_below_the_loss(tmp_path):
    from pilegpt.train.report import Metrics, plot, training_lines

    metrics = Metrics()
    rows = [{"batch": 1, "loss": 10.0, "grad_norm": 2.0}, {"batch": 2, "loss": 9.0, "grad_norm": 5.0},
            {"batch": 3, "loss": 8.5}, {"batch": 2, "loss": 9.0, "grad_norm": 3.0},  # resumed: the later row wins
            {"batch": 3, "loss": 8.0}, {"batch": 4, "loss": 7.0, "grad_norm": 1.0}, {"batch": 5, "grad_norm": "high"}]
    for row in rows:
        metrics.add_line(json.dumps(row))
    assert metrics.skipped == 1 and metrics.grad_norm[0].tolist() == [1, 2, 4]
    assert ("- gradient norm before clipping: 1.0000 at batch 4, the largest 3.0000 at batch 2 (of 3 logged "
            "batches)") in training_lines(metrics)
    assert ", grad norm at 3 batches -> " in plot(metrics, tmp_path / "loss.png", "g")
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    metrics.add_line('{"batch": 6, "loss": 9.0, "grad_norm": NaN}')  # json.dumps writes a NaN so
    metrics.add_line('{"batch": 8, "loss": 9.0, "grad_norm": 4.5}')
    assert ("- gradient norm before clipping: 4.5000 at batch 8, first NaN or infinite: nan at batch 6 (of 5 logged "
            "batches)") in training_lines(metrics)
    plot(metrics, tmp_path / "loss.png", "g")  # a NaN is a gap in the log-scaled panel, not an error


def test_a_run_without_a_gradient_norm_reports_none_and_plots_the_loss_alone(tmp_path):
    from pilegpt.train.report import Metrics, plot, training_lines

    metrics = Metrics()
    metrics.add_line(json.dumps({"batch": 1, "loss": 10.0}))
    assert not any("gradient norm" in line for line in training_lines(metrics))
    assert "grad norm" not in plot(metrics, tmp_path / "loss.png", "g")
