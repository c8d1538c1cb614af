"""eval.py and pilegpt/hellaswag.py: the scoring equals an independent computation with transformers on the exported
model, padding changes nothing, 2 processes count as 1, and the data is downloaded once, checked, and refused
whole when it is not the val set."""

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import eval as eval_script
import export_hf
from helpers import FIXTURES, REPO
from model import GPT, GPTConfig
from pilegpt import hellaswag
from pilegpt.checkpoint import save_export
from pilegpt.common import UserError
from pilegpt.tokenizer import gpt2

TINY = FIXTURES / "hellaswag_tiny.jsonl"  # 64 examples made from tiny Shakespeare (make_fixtures.py)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    torch.manual_seed(3)
    model = GPT(GPTConfig(block_size=48, vocab_size=50257, n_layer=2, n_head=2, n_embd=32)).eval()
    path = tmp_path_factory.mktemp("eval") / "model.pt"
    save_export(model, path)
    return path


def test_predictions_equal_transformers_on_the_exported_model(model_file, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert eval_script.main([str(model_file), "--task", "hellaswag", "--data", str(TINY), "--batch-size", "5",
                             "--out", str(tmp_path / "r.json")]) == 0
    line = capsys.readouterr().out.strip()
    result = json.loads((tmp_path / "r.json").read_text())
    export_hf.main([str(model_file), str(tmp_path / "hf")])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    examples = hellaswag.read_examples(TINY)
    assert result["n"] == len(examples) == 64 and [p["ind"] for p in result["predictions"]] == list(range(64))
    for example, got in zip(examples, result["predictions"]):
        ctx = tok(example.ctx)["input_ids"]
        sums, means = [], []
        for ending in example.endings:  # transformers' own tokenizer and model, one ending at a time
            tail = tok(" " + ending)["input_ids"]
            ids = (ctx + tail)[-48:]
            start = max(1, len(ids) - len(tail))
            with torch.no_grad():
                logits = hf(torch.tensor([ids])).logits[0]
            losses = F.cross_entropy(logits[start - 1:-1].double(), torch.tensor(ids[start:]), reduction="none")
            sums.append(float(losses.sum()))
            means.append(float(losses.mean()))
        assert got["label"] == example.label
        assert got["pred"] == min(range(4), key=sums.__getitem__), (example.ind, sums)
        assert got["pred_norm"] == min(range(4), key=means.__getitem__), (example.ind, means)
    preds = result["predictions"]
    assert result["acc"] == sum(p["pred"] == p["label"] for p in preds) / 64
    assert result["acc_norm"] == sum(p["pred_norm"] == p["label"] for p in preds) / 64
    assert line.startswith(f"hellaswag: 64 examples, acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f}, ")


def test_a_padded_batch_gives_the_losses_of_one_example_at_a_time(model_file):
    from pilegpt.checkpoint import load_model

    model, enc = load_model(str(model_file)), gpt2()
    rows = [hellaswag.render(e, enc, 48) for e in hellaswag.read_examples(TINY)[:6]]
    assert len({len(r.tokens) for example in rows for r in example}) > 3  # rows of many lengths: padding matters
    together = hellaswag.ending_losses(model, rows, torch.device("cpu"))
    alone = torch.cat([hellaswag.ending_losses(model, [r], torch.device("cpu")) for r in rows])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)


def test_long_examples_keep_their_last_block_size_tokens():
    example = hellaswag.Example(0, "word " * 100, ["a b c", "d", "e f", "g"], 1)
    rows = hellaswag.render(example, gpt2(), block_size=16)
    assert all(len(r.tokens) == 16 for r in rows)
    assert rows[0].tokens[-3:] == gpt2().encode_ordinary(" a b c") and rows[0].start == 13


@pytest.mark.slow
def test_two_processes_count_what_one_counts(model_file, tmp_path):
    outs = {}
    for n in (1, 2):
        launcher = [sys.executable, "-m", "composer.cli.launcher", "-n", "2"] if n == 2 else [sys.executable]
        proc = subprocess.run([*launcher, str(REPO / "eval.py"), str(model_file), "--task", "hellaswag", "--data",
                               str(TINY), "--limit", "30", "--out", str(tmp_path / f"r{n}.json")],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        outs[n] = json.loads((tmp_path / f"r{n}.json").read_text())
    assert outs[1]["n"] == outs[2]["n"] == 30
    assert outs[1]["predictions"] == outs[2]["predictions"]


def test_malformed_lines_are_refused_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = TINY.read_text().splitlines()[0]
    for line, why in (("{not json", "not a JSON object"), ('{"ctx": "a", "endings": ["x"], "label": 0}', "4 strings"),
                      ('{"ctx": "a", "endings": ["w", "x", "y", "z"], "label": 7}', "'label'")):
        bad.write_text(good + "\n" + line + "\n")
        with pytest.raises(UserError, match=rf"^{bad}:2: .*{why}"):
            hellaswag.read_examples(bad)


class Server:
    """A loopback HTTP server answering every GET with `body` (and counting the requests)."""

    def __init__(self, body: bytes):
        self.body, self.requests = body, 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hellaswag_val.jsonl"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def val_set(n: int) -> bytes:
    line = TINY.read_text().splitlines()[0]
    return ("\n".join([line] * n) + "\n").encode()


def test_the_val_set_is_downloaded_once_and_reused(tmp_path):
    server = Server(val_set(hellaswag.VAL_EXAMPLES))
    try:
        path = hellaswag.download(server.url, tmp_path / "cache")
        again = hellaswag.download(server.url, tmp_path / "cache")
    finally:
        server.close()
    assert path == again and server.requests == 1
    assert len(hellaswag.read_examples(path)) == hellaswag.VAL_EXAMPLES
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["hellaswag_val.jsonl"]  # no temporary file


@pytest.mark.parametrize("body, why", [(val_set(100), "holds 100 examples, not 10042"),
                                       (val_set(hellaswag.VAL_EXAMPLES)[:-50], ":10042: not a JSON object")])
def test_a_short_or_broken_download_is_refused_and_not_kept(tmp_path, body, why):
    server = Server(body)
    try:
        with pytest.raises(UserError, match=why):
            hellaswag.download(server.url, tmp_path / "cache")
    finally:
        server.close()
    assert list((tmp_path / "cache").iterdir()) == []


def test_offline_without_data_is_one_line_naming_the_fix(model_file, tmp_path):
    from helpers import free_port

    proc = subprocess.run([sys.executable, str(REPO / "eval.py"), str(model_file), "--task", "hellaswag",
                           "--url", f"http://127.0.0.1:{free_port()}/hellaswag_val.jsonl"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PILE_GPT_CACHE": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: cannot download HellaSwag from http://127.0.0.1:") and "--data FILE" in \
        proc.stderr


@pytest.mark.slow
def test_training_reports_bpb_named_eval_sets_and_hellaswag_as_eval_py_scores_it(tmp_path):
    """One tiny run: val_bpb equals an independent computation over the same val windows, a named eval set gets its
    own figures, and the in-training HellaSwag figures equal eval.py's on the exported weights."""
    import math

    import numpy as np

    from helpers import SMALL, read_jsonl, run, shakespeare_tokens, write_bin
    from pilegpt.checkpoint import load_model
    from pilegpt.data import read_windows, window_starts

    tokens = shakespeare_tokens()
    write_bin(tmp_path / "data", tokens[:20_000])
    write_bin(tmp_path / "other", tokens[100_000:110_000])
    out = run([*SMALL, f"--data_dir={tmp_path / 'data'}", "--max_duration=4ba", "--eval_interval=4ba",
               "--eval_subset_num_batches=-1", "--progress_bar=False", "--save_folder=run", "--sample_length=0",
               f"--eval_data={{'other': {str(tmp_path / 'other')!r}}}", "--hellaswag_examples=20",
               f"--hellaswag_data={TINY}"], cwd=tmp_path)
    row = read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]
    assert {"val_loss", "val_bpb", "other_loss", "other_bpb", "hellaswag_acc", "hellaswag_acc_norm"} <= set(row)
    assert f"hellaswag acc {row['hellaswag_acc']:.4f}" in out and f"other loss {row['other_loss']:.4f}" in out

    model = load_model(str(tmp_path / "run" / "model.pt"))
    enc = gpt2()
    for label, folder in (("val", "data"), ("other", "other")):
        val = np.fromfile(tmp_path / folder / "val.bin", dtype=np.uint16)
        x, y = read_windows(val, window_starts(len(val), 32), 32)
        with torch.no_grad():
            logits, _ = model(torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))
        losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)).double(), torch.from_numpy(
            y.reshape(-1).astype(np.int64)), reduction="none")
        nbytes = torch.tensor([0 if t == enc.eot_token else len(enc.decode_single_token_bytes(int(t)))
                               for t in y.reshape(-1)])
        assert math.isclose(row[f"{label}_loss"], float(losses.mean()), rel_tol=1e-5)
        bpb = float(losses[nbytes > 0].sum() / math.log(2) / nbytes.sum())
        assert math.isclose(row[f"{label}_bpb"], bpb, rel_tol=1e-5), (label, row[f"{label}_bpb"], bpb)

    assert eval_script.main([str(tmp_path / "run" / "model.pt"), "--task", "hellaswag", "--data", str(TINY),
                             "--limit", "20", "--out", str(tmp_path / "h.json")]) == 0
    scored = json.loads((tmp_path / "h.json").read_text())
    assert (scored["acc"], scored["acc_norm"]) == (row["hellaswag_acc"], row["hellaswag_acc_norm"])


@pytest.mark.slow
def test_lm_evaluation_harness_agrees_with_eval_py_on_every_example(tmp_path, monkeypatch):
    """lm-eval (requirements-eval.txt) through its Python API, offline, on the export_hf folder, with a local task in
    HellaSwag's format rendered as ours (context, then " " + ending): its acc is ours, example by example."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(5)
    model = GPT(GPTConfig(block_size=128, vocab_size=50257, n_layer=2, n_head=2, n_embd=32)).eval()
    save_export(model, tmp_path / "model.pt")
    export_hf.main([str(tmp_path / "model.pt"), str(tmp_path / "hf")])
    data = tmp_path / "task" / "data.jsonl"
    data.parent.mkdir()
    data.write_text("\n".join(TINY.read_text().splitlines()[:24]) + "\n")
    (tmp_path / "task" / "tiny_hellaswag.yaml").write_text(
        "task: tiny_hellaswag\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{{{ctx}}}}\"\n"
        "doc_to_target: \"{{label}}\"\ndoc_to_choice: \"{{endings}}\"\ntarget_delimiter: \" \"\n"
        "metric_list:\n  - metric: acc\n")
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'hf'}", tasks=["tiny_hellaswag"],
                                      task_manager=TaskManager(include_path=str(tmp_path / "task")), log_samples=True,
                                      batch_size=4, device="cpu")
    theirs = {s["doc_id"]: s["acc"] for s in results["samples"]["tiny_hellaswag"]}
    assert eval_script.main([str(tmp_path / "model.pt"), "--task", "hellaswag", "--data", str(data), "--out",
                             str(tmp_path / "ours.json")]) == 0
    ours = {p["ind"]: float(p["pred"] == p["label"]) for p in json.loads((tmp_path / "ours.json").read_text())[
        "predictions"]}
    assert len(ours) == 24 and theirs == ours
