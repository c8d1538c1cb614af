"""eval.py and pilegpt/hellaswag.py in this process: the scoring equals an independent computation with transformers
on the exported model, padding changes nothing, and the data is downloaded once, checked, and refused whole when it
is not the val set. Two processes, the command line, training's figures, lm-eval: tests/e2e/test_eval.py."""

import json

import pytest
import torch
import torch.nn.functional as F

import eval as eval_script
import export_hf
from helpers import HELLASWAG_TINY, Server
from pilegpt import hellaswag
from pilegpt.common import UserError
from pilegpt.tokenizer import gpt2


def test_predictions_equal_transformers_on_the_exported_model(model_file, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert eval_script.main([str(model_file), "--task", "hellaswag", "--data", str(HELLASWAG_TINY), "--batch-size", "5",
                             "--out", str(tmp_path / "r.json")]) == 0
    line = capsys.readouterr().out.strip()
    result = json.loads((tmp_path / "r.json").read_text())
    export_hf.main([str(model_file), str(tmp_path / "hf")])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    examples = hellaswag.read_examples(HELLASWAG_TINY)
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
    rows = [hellaswag.render(e, enc, 48) for e in hellaswag.read_examples(HELLASWAG_TINY)[:6]]
    assert len({len(r.tokens) for example in rows for r in example}) > 3  # rows of many lengths: padding matters
    together = hellaswag.ending_losses(model, rows, torch.device("cpu"))
    alone = torch.cat([hellaswag.ending_losses(model, [r], torch.device("cpu")) for r in rows])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)


def test_long_examples_keep_their_last_block_size_tokens():
    example = hellaswag.Example(0, "word " * 100, ["a b c", "d", "e f", "g"], 1)
    rows = hellaswag.render(example, gpt2(), block_size=16)
    assert all(len(r.tokens) == 16 for r in rows)
    assert rows[0].tokens[-3:] == gpt2().encode_ordinary(" a b c") and rows[0].start == 13


def test_malformed_lines_are_refused_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = HELLASWAG_TINY.read_text().splitlines()[0]
    for line, why in (("{not json", "not a JSON object"), ('{"ctx": "a", "endings": ["x"], "label": 0}', "4 strings"),
                      ('{"ctx": "a", "endings": ["w", "x", "y", "z"], "label": 7}', "'label'")):
        bad.write_text(good + "\n" + line + "\n")
        with pytest.raises(UserError, match=rf"^{bad}:2: .*{why}"):
            hellaswag.read_examples(bad)


def val_set(n: int) -> bytes:
    line = HELLASWAG_TINY.read_text().splitlines()[0]
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
                                       (val_set(hellaswag.VAL_EXAMPLES)[:-50], ":10042: not a JSON object")],
                         ids=["short", "cut off"])
def test_a_short_or_broken_download_is_refused_and_not_kept(tmp_path, body, why):
    server = Server(body)
    try:
        with pytest.raises(UserError, match=why):
            hellaswag.download(server.url, tmp_path / "cache")
    finally:
        server.close()
    assert list((tmp_path / "cache").iterdir()) == []


