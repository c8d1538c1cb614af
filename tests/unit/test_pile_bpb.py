"""eval.py --task pile and pilegpt/pile_bpb.py in this process: the windows are lm-eval's, each document's bits equal
an independent computation with transformers on the exported model, batching changes nothing, malformed lines are
file:line, and the official file is downloaded once, checked, and offline is one line. lm-eval's own figures:
tests/e2e/test_pile_bpb.py."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
import zstandard

import eval as eval_script
import export_hf
from helpers import FIXTURES
from pilegpt import pile_bpb
from pilegpt.checkpoint import load_model
from pilegpt.common import UserError
from pilegpt.tokenizer import gpt2
from tests.unit.test_eval import Server

SHAKESPEARE = (FIXTURES / "tinyshakespeare.txt").read_text()


def pile_documents() -> list[dict]:
    """Documents of three components: long ones (many windows), a short one, an empty one, one holding a literal
    <|endoftext|>, and non-ASCII text (bytes, not characters, are counted)."""
    texts = [SHAKESPEARE[:3000], SHAKESPEARE[3000:3100], "", SHAKESPEARE[5000:5400] + " <|endoftext|> and on",
             "Ünïcödé — ça marche: 日本語のテキスト", SHAKESPEARE[9000:11500], "x"]
    names = ["Pile-CC", "ArXiv", "Pile-CC", "Wikipedia (en)", "ArXiv", "Wikipedia (en)", "Pile-CC"]
    return [{"text": t, "meta": {"pile_set_name": n}} for t, n in zip(texts, names)]


def write_pile(path, records: list[dict]) -> None:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(data) if path.name.endswith(".zst") else data)


@pytest.mark.parametrize("n", [0, 1, 5, 47, 48, 49, 96, 97, 130, 300])
@pytest.mark.parametrize("block_size", [1, 7, 48])
def test_windows_are_lm_evals_rolling_windows(n, block_size):
    utils = pytest.importorskip("lm_eval.utils")
    tokens = list(range(1000, 1000 + n))
    stream = [50256] + tokens
    theirs = []
    for pair in map(utils.make_disjoint_window, utils.get_rolling_token_windows(tokens, 50256, block_size, 1)):
        context, continuation = pair
        inp = (context + continuation)[-(block_size + 1):][:-1]  # what the harness's HF model feeds
        theirs.append((inp, continuation))
    ours = [(stream[w.start:w.start + w.length], stream[w.start + w.length - w.scored + 1:w.start + w.length + 1])
            for w in pile_bpb.rolling_windows(n, block_size)]
    assert ours == theirs


def test_per_document_bits_equal_transformers_on_the_exported_model(model_file, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    write_pile(tmp_path / "val.jsonl.zst", pile_documents())
    assert eval_script.main([str(model_file), "--task", "pile", "--data", str(tmp_path / "val.jsonl.zst"),
                             "--batch-size", "5", "--out", str(tmp_path / "r.json")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads((tmp_path / "r.json").read_text())
    export_hf.main([str(model_file), str(tmp_path / "hf")])
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for record, got in zip(pile_documents(), result["per_document"], strict=True):
        ids = tok(record["text"])["input_ids"]  # transformers' own tokenizer, one window at a time
        stream, bits, done = [tok.eos_token_id] + ids, 0.0, 0
        while done < len(ids):
            end = min(done + 48, len(ids))
            start = max(0, end - 48)  # the input: the (up to) 48 tokens before each predicted one
            with torch.no_grad():
                logits = hf(torch.tensor([stream[start:end]])).logits[0]
            losses = F.cross_entropy(logits.double(), torch.tensor(stream[start + 1:end + 1]), reduction="none")
            bits += float(losses[done - start:].sum()) / math.log(2)
            done = end
        assert got["tokens"] == len(ids) and got["bytes"] == len(record["text"].encode())
        assert got["bits"] == pytest.approx(bits, rel=1e-5, abs=1e-6), got
    by_name = {}
    for d in result["per_document"]:
        bits_bytes = by_name.setdefault(d["component"], [0.0, 0])
        bits_bytes[0] += d["bits"]
        bits_bytes[1] += d["bytes"]
    assert set(result["components"]) == {"Pile-CC", "ArXiv", "Wikipedia (en)"}
    for name, (bits, nbytes) in by_name.items():
        assert result["components"][name]["bpb"] == pytest.approx(bits / nbytes, rel=1e-12)
    total = sum(b for b, _ in by_name.values()) / sum(n for _, n in by_name.values())
    assert result["bpb"] == pytest.approx(total, rel=1e-12) and result["documents"] == 7
    assert line.startswith(f"pile: 7 documents, bpb {result['bpb']:.4f} (all bits over all bytes)")


def test_batches_of_any_size_give_the_same_bits(model_file):
    model, enc = load_model(str(model_file)), gpt2()
    docs = [pile_bpb.Document(i, r["meta"]["pile_set_name"], r["text"]) for i, r in enumerate(pile_documents())]
    alone = [pile_bpb.score_pool(model, [d], enc, torch.device("cpu"), 1) for d in docs]
    together = pile_bpb.evaluate(model, docs, enc, torch.device("cpu"), batch_size=6)
    assert [s.ind for s in together] == list(range(len(docs)))
    for [one], many in zip(alone, together):
        assert one.tokens == many.tokens and math.isclose(one.loglik, many.loglik, rel_tol=1e-6, abs_tol=1e-9)


@pytest.mark.parametrize("line, why", [("{not json", "not a JSON object"), ('{"meta": {}}', "no text field 'text'"),
                                       ('{"text": "a", "meta": {}}', "no component name meta.pile_set_name")])
def test_malformed_lines_are_refused_naming_file_and_line(tmp_path, line, why):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(pile_documents()[0]) + "\n" + line + "\n")
    with pytest.raises(UserError, match=rf"^{bad}:2: {why}"):
        list(pile_bpb.read_documents([bad]))


def test_a_cut_off_zst_file_is_one_line(tmp_path):
    write_pile(tmp_path / "val.jsonl.zst", pile_documents())
    data = (tmp_path / "val.jsonl.zst").read_bytes()
    (tmp_path / "val.jsonl.zst").write_bytes(data[:len(data) // 2])
    with pytest.raises(UserError, match=r"cannot read .*val.jsonl.zst .*damaged or cut off"):
        list(pile_bpb.read_documents([tmp_path / "val.jsonl.zst"]))


def pile_file(n: int) -> bytes:
    line = json.dumps(pile_documents()[1]) + "\n"
    return zstandard.ZstdCompressor().compress((line * n).encode())


def test_the_official_file_is_downloaded_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(pile_bpb, "MIN_DOCUMENTS", 20)
    server = Server(pile_file(20))
    try:
        path = pile_bpb.download("test", server.url, tmp_path / "cache")
        again = pile_bpb.download("test", server.url, tmp_path / "cache")
    finally:
        server.close()
    assert path == again == tmp_path / "cache" / "test.jsonl.zst" and server.requests == 1
    assert len(list(pile_bpb.read_documents([path]))) == 20
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["test.jsonl.zst"]  # no temporary file


@pytest.mark.parametrize("body, why", [(pile_file(5), "holds 5 documents, fewer than 20"),
                                       (pile_file(20)[:-30], "damaged or cut off")], ids=["short", "cut off"])
def test_a_short_or_broken_download_is_refused_and_not_kept(tmp_path, monkeypatch, body, why):
    monkeypatch.setattr(pile_bpb, "MIN_DOCUMENTS", 20)
    server = Server(body)
    try:
        with pytest.raises(UserError, match=why):
            pile_bpb.download("val", server.url, tmp_path / "cache")
    finally:
        server.close()
    assert list((tmp_path / "cache").iterdir()) == []


def test_offline_without_data_is_one_line_naming_the_fix(model_file, tmp_path, monkeypatch):
    from helpers import free_port

    monkeypatch.setattr(pile_bpb, "CACHE_DIR", tmp_path / "cache")
    with pytest.raises(UserError, match=r"^cannot download the Pile's test set from http://127.0.0.1:\d+/t.jsonl.zst "
                                        r"\(.*\): offline\? pass a local copy of test.jsonl.zst with --data FILE$"):
        eval_script.main([str(model_file), "--task", "pile", "--url", f"http://127.0.0.1:{free_port()}/t.jsonl.zst"])


def test_the_papers_per_component_figures_are_its_table_2_and_match_the_datas_names():
    from pilegpt.pile_bpb import COMPONENT_ANCHORS, component_anchors
    assert len(COMPONENT_ANCHORS) == 22  # the Pile's 22 components
    # the Pile's own meta.pile_set_name spellings find the paper's rows
    assert component_anchors("StackExchange") == (1.2981, 1.0504, 1.0096, 0.7321)
    assert component_anchors("Wikipedia (en)") == (1.1285, 0.9655, 0.8757, 0.5953)
    assert component_anchors("Gutenberg (PG-19)")[0] == 1.2655 and component_anchors("NIH ExPorter")[3] == 0.6239
    assert component_anchors("pile_cc") == component_anchors("Pile-CC") == (1.0878, 0.9355, 0.9212, 0.7070)
    assert component_anchors("Shakespeare") is None
    # every figure a plausible bits per byte, and GPT-3 Davinci the lowest of the four on every row (as in the paper)
    assert all(0.5 < v < 3 for row in COMPONENT_ANCHORS.values() for v in row)
    assert all(row[3] == min(row) for row in COMPONENT_ANCHORS.values())
