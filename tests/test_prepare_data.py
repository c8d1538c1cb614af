"""prepare_data.py: exact tokens, splits, determinism across --num-proc, resume after a kill, bad input."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tiktoken

import prepare_data
from common import UserError
from conftest import PILE_SAMPLE, REPO, SHAKESPEARE

ENC = tiktoken.get_encoding("gpt2")
EOT = 50256


def expected_tokens(texts):
    out = []
    for t in texts:
        out += ENC.encode_ordinary(t) + [EOT]
    return np.array(out, dtype=np.uint16)


def read_bin(path):
    return np.fromfile(path, dtype=np.uint16)


def shakespeare_docs(n=None):
    """Tiny Shakespeare cut into documents at blank lines (speeches)."""
    docs = [d for d in SHAKESPEARE.read_text().split("\n\n") if d.strip()]
    return docs[:n] if n else docs


def write_jsonl(path, texts, compress=None, extra=None):
    lines = "".join(json.dumps({"text": t, **(extra or {})}) + "\n" for t in texts).encode()
    if compress == "zst":
        import zstandard

        lines = zstandard.ZstdCompressor().compress(lines)
    elif compress == "gz":
        lines = gzip.compress(lines)
    Path(path).write_bytes(lines)
    return path


def run(*args):
    return prepare_data.main([str(a) for a in args])


def test_txt_tokens_are_exactly_encode_ordinary_plus_eot_and_decode_back(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_data, "CHUNK_BYTES", 1 << 14)  # many pieces: the BPE-safe cuts are exercised
    run("--input", SHAKESPEARE, "--out-dir", tmp_path / "out", "--val-fraction", 0, "--num-proc", 1)
    text = SHAKESPEARE.read_text()
    got = read_bin(tmp_path / "out" / "train.bin")
    assert np.array_equal(got, expected_tokens([text]))
    assert ENC.decode(got[:-1].tolist()) == text
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["splits"] == {"train": {"file": "train.bin", "tokens": len(got), "documents": 1}}
    assert (meta["vocab_size"], meta["eot_token"], meta["dtype"]) == (50257, EOT, "uint16")
    assert not (tmp_path / "out" / "val.bin").exists()
    assert sorted(os.listdir(tmp_path / "out")) == ["meta.json", "train.bin"]


def test_text_suffix_reads_source_files_as_documents_split_by_name(tmp_path):
    import sysconfig

    stdlib = Path(sysconfig.get_path("stdlib"))
    names = ["abc.py", "bisect.py", "colorsys.py", "heapq.py", "keyword.py", "this.py"]
    for name in names:
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / name).write_bytes((stdlib / name).read_bytes())
    run("--input", tmp_path / "src", "--text-suffix", ".py", "--val-fraction", 0.3, "--out-dir", tmp_path / "out")
    in_val = [n for n in names if prepare_data.goes_to_val(n.encode(), 0.3)]
    in_train = [n for n in names if n not in in_val]
    assert in_val and in_train  # this fixed set of names lands on both sides
    texts = {n: (tmp_path / "src" / n).read_text() for n in names}
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens([texts[n] for n in in_train]))
    assert np.array_equal(read_bin(tmp_path / "out" / "val.bin"), expected_tokens([texts[n] for n in in_val]))


def test_pile_sample_uses_its_own_val_split_and_skips_test(tmp_path):
    import zstandard

    run("--input", PILE_SAMPLE, "--out-dir", tmp_path / "out", "--num-proc", 1)

    def docs(name):
        with open(PILE_SAMPLE / name, "rb") as f:
            raw = zstandard.ZstdDecompressor().stream_reader(f).read()
        return [json.loads(l)["text"] for l in raw.decode().splitlines()]

    dolma = []
    for name in sorted(os.listdir(PILE_SAMPLE / "dolma_cc_en")):
        dolma += [json.loads(l)["text"] for l in (PILE_SAMPLE / "dolma_cc_en" / name).read_text().splitlines()]
    out = tmp_path / "out"
    # sorted by name: dolma_cc_en/... before train_00_head.jsonl.zst
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(dolma + docs("train_00_head.jsonl.zst")))
    assert np.array_equal(read_bin(out / "val.bin"), expected_tokens(docs("val.jsonl.zst")))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["documents"] == 21 and meta["splits"]["val"]["documents"] == 1
    assert meta["sources"]["test_files_skipped"] == 1
    assert ENC.decode(read_bin(out / "val.bin")[:-1].tolist()) == docs("val.jsonl.zst")[0]


def test_pile_subset_filters_drop_and_keep_documents(tmp_path):
    dolma = PILE_SAMPLE / "dolma_cc_en" / "cc_en_head-0091.jsonl"
    dolma_texts = [json.loads(l)["text"] for l in dolma.read_text().splitlines()]
    run("--input", PILE_SAMPLE / "train_00_head.jsonl.zst", dolma, "--exclude-subset", "Pile-CC",
        "--out-dir", tmp_path / "a", "--num-proc", 1, "--val-fraction", 0)
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["filtered_documents"] == 1  # the Pile-CC document; Dolma documents have no pile_set_name
    assert np.array_equal(read_bin(tmp_path / "a" / "train.bin"), expected_tokens(dolma_texts))
    r = run_cli("--input", PILE_SAMPLE / "train_00_head.jsonl.zst", "--include-subset", "Github",
                "--out-dir", tmp_path / "b")
    assert_one_line_error(r, "empty corpus", "filtered out: 1")


def test_output_is_byte_identical_for_any_num_proc_and_val_split_is_stable(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_data, "CHUNK_BYTES", 1 << 15)
    docs = shakespeare_docs()
    write_jsonl(tmp_path / "a.jsonl.zst", docs[:3000], "zst")
    write_jsonl(tmp_path / "b.jsonl.gz", docs[3000:], "gz")
    for n in (1, 2):
        run("--input", tmp_path / "*.jsonl.*", "--out-dir", tmp_path / f"out{n}", "--num-proc", n,
            "--val-fraction", 0.05)
    for split in ("train.bin", "val.bin"):
        assert (tmp_path / "out1" / split).read_bytes() == (tmp_path / "out2" / split).read_bytes()
    # the split is a function of each document's text alone
    in_val = [d for d in docs if prepare_data.goes_to_val(d.encode(), 0.05)]
    assert 0.03 < len(in_val) / len(docs) < 0.07
    assert np.array_equal(read_bin(tmp_path / "out1" / "val.bin"), expected_tokens(in_val))
    assert np.array_equal(read_bin(tmp_path / "out1" / "train.bin"),
                          expected_tokens([d for d in docs if d not in set(in_val)]))


def test_dataset_url_reads_files_like_local_input(tmp_path):
    root = tmp_path / "hub"
    (root / "train").mkdir(parents=True)
    docs = shakespeare_docs(300)
    write_jsonl(root / "train" / "00.jsonl.zst", docs[:200], "zst")
    write_jsonl(root / "val.jsonl.zst", docs[200:250], "zst")
    write_jsonl(root / "test.jsonl.zst", docs[250:], "zst")
    run("--dataset", f"file://{root}", "--out-dir", tmp_path / "out", "--num-proc", 1)
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(docs[:200]))
    assert np.array_equal(read_bin(tmp_path / "out" / "val.bin"), expected_tokens(docs[200:250]))


def test_max_tokens_writes_exactly_that_many_train_tokens(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", shakespeare_docs(500))
    run("--input", tmp_path / "c.jsonl", "--out-dir", tmp_path / "out", "--max-tokens", 1234, "--val-fraction", 0)
    got = read_bin(tmp_path / "out" / "train.bin")
    assert np.array_equal(got, expected_tokens(shakespeare_docs(500))[:1234])
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["stopped_at_max_tokens"] is True


def test_shards_hold_every_document_exactly_once(tmp_path):
    docs = shakespeare_docs(700)
    for k in range(7):
        write_jsonl(tmp_path / f"{k:02d}.jsonl", docs[k * 100:(k + 1) * 100])
    parts = []
    for i in range(3):
        run("--input", tmp_path / "*.jsonl", "--out-dir", tmp_path / f"part{i}", "--num-proc", 1,
            "--val-fraction", 0, "--shard-index", i, "--num-shards", 3)
        parts.append(json.loads((tmp_path / f"part{i}" / "meta.json").read_text())["sources"]["files"])
    assert sorted(sum(parts, [])) == [f"{k:02d}.jsonl" for k in range(7)]
    total = sum(len(read_bin(tmp_path / f"part{i}" / "train.bin")) for i in range(3))
    assert total == len(expected_tokens(docs))


def resume_corpus_texts(n_files):
    docs = shakespeare_docs()
    return [docs if k % 2 else docs[::-1] for k in range(n_files)]


def _make_resume_corpus(root, n_files):
    root.mkdir()
    for k, texts in enumerate(resume_corpus_texts(n_files)):
        write_jsonl(root / f"{k:02d}.jsonl.zst", texts, "zst")
    return root


def test_killed_run_never_looks_complete_and_resumes_byte_identical(tmp_path):
    corpus = _make_resume_corpus(tmp_path / "corpus", 12)
    cmd = [sys.executable, str(REPO / "prepare_data.py"), "--input", str(corpus), "--num-proc", "2",
           "--val-fraction", "0.01"]
    ref = tmp_path / "ref"
    subprocess.run(cmd + ["--out-dir", str(ref)], check=True, capture_output=True)

    out = tmp_path / "out"
    proc = subprocess.Popen(cmd + ["--out-dir", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = out / prepare_data.STATE_NAME
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if state.exists() and json.loads(state.read_text())["files_done"] >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: make the corpus larger"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = json.loads(state.read_text())["files_done"]
    assert 2 <= done < 12
    assert not (out / "train.bin").exists() and not (out / "meta.json").exists()

    resumed = subprocess.run(cmd + ["--out-dir", str(out)], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: {done} of 12 files already done" in resumed.stderr
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (ref / name).read_bytes()
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_ctrl_c_stops_cleanly_and_resumes(tmp_path):
    corpus = _make_resume_corpus(tmp_path / "corpus", n_files=6)
    cmd = [sys.executable, str(REPO / "prepare_data.py"), "--input", str(corpus), "--num-proc", "1",
           "--out-dir", str(tmp_path / "out"), "--val-fraction", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = tmp_path / "out" / "train.bin.partial"
    while proc.poll() is None and not (partial.exists() and partial.stat().st_size > 0):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "run the same command again to resume" in err
    assert not (tmp_path / "out" / "train.bin").exists()
    subprocess.run(cmd, check=True, capture_output=True)
    expected = expected_tokens(sum(resume_corpus_texts(6), []))
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected)


# ---- bad input: one line, non-zero exit, nothing written, existing output untouched ----------------------


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, str(REPO / "prepare_data.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def assert_one_line_error(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_no_files_matched_is_a_clear_error(tmp_path):
    r = run_cli("--input", tmp_path / "nothing*.jsonl", "--out-dir", tmp_path / "out")
    assert_one_line_error(r, "nothing*.jsonl", "no files matched")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["truncated_zst", "malformed_json", "missing_text", "invalid_utf8_jsonl",
                                  "invalid_utf8_txt"])
def test_bad_input_names_the_file_and_writes_nothing(tmp_path, case):
    good = [json.dumps({"text": "hello world"})] * 3
    if case == "truncated_zst":
        import zstandard

        data = zstandard.ZstdCompressor().compress(("\n".join(good * 2000) + "\n").encode())
        path = tmp_path / "bad.jsonl.zst"
        path.write_bytes(data[: len(data) // 2])
        needles = ["bad.jsonl.zst", "truncated or corrupt zstd"]
    elif case == "txt":
        pass
    elif case == "malformed_json":
        path = tmp_path / "bad.jsonl"
        path.write_text("\n".join(good + ['{"text": "oops"'] + good) + "\n")
        needles = ["bad.jsonl:4", "malformed JSON", "--skip-bad-lines"]
    elif case == "missing_text":
        path = tmp_path / "bad.jsonl"
        path.write_text("\n".join(good + [json.dumps({"content": "x"})]) + "\n")
        needles = ["bad.jsonl:4", "'text'", "--text-column"]
    elif case == "invalid_utf8_jsonl":
        path = tmp_path / "bad.jsonl"
        path.write_bytes(("\n".join(good) + "\n").encode() + b'{"text": "caf\xe9"}\n')
        needles = ["bad.jsonl:4", "invalid UTF-8"]
    else:
        path = tmp_path / "bad.txt"
        path.write_bytes(b"caf\xe9 au lait\n")
        needles = ["bad.txt", "invalid UTF-8"]
    out = tmp_path / "out"
    r = run_cli("--input", path, "--out-dir", out, "--num-proc", 1)
    assert_one_line_error(r, *needles)
    assert not (out / "train.bin").exists() and not (out / "meta.json").exists()


def test_skip_bad_lines_skips_and_counts(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"text": "one"}\n{"text": oops}\n{"text": "caf\xe9"}\n{"content": "x"}\n{"text": "two"}\n')
    run("--input", path, "--out-dir", tmp_path / "out", "--skip-bad-lines", "--val-fraction", 0)
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(["one", "two"]))
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["skipped_bad_lines"] == 3


def test_empty_corpus_is_an_error_and_leaves_no_folder(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", ["", "", ""])
    r = run_cli("--input", path, "--out-dir", tmp_path / "out")
    assert_one_line_error(r, "empty corpus", "empty.jsonl")
    assert not (tmp_path / "out").exists()


def test_existing_output_is_refused_untouched_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    run("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 100)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    r = run_cli("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 50)
    assert_one_line_error(r, str(out), "already holds a finished dataset", "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert_one_line_error(run_cli("--input", SHAKESPEARE, "--out-dir", other), "other files")
    assert sorted(os.listdir(other)) == ["notes.txt"]

    run("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 50, "--overwrite")
    assert len(read_bin(out / "train.bin")) == 50


def test_bad_input_keeps_an_existing_dataset_when_overwriting(tmp_path):
    out = tmp_path / "out"
    run("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 100)
    before = (out / "train.bin").read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{broken\n')
    with pytest.raises(UserError, match="bad.jsonl:2"):
        run("--input", bad, "--out-dir", out, "--overwrite", "--val-fraction", 0)
    assert (out / "train.bin").read_bytes() == before and (out / "meta.json").exists()
