"""prepare_data.py: exact tokens, splits, determinism across --num-proc, resume after a kill, bad input, full
disks, any `datasets` dataset (Parquet, streamed)."""

import errno
import functools
import gzip
import importlib.util
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import prepare_data
from conftest import PILE_SAMPLE, REPO, SHAKESPEARE
from pilegpt.common import UserError, run_main
from pilegpt.prepare import out_folder, sources, tokenize_pool
from pilegpt.tokenizer import gpt2

ENC = gpt2()
EOT = 50256


@functools.lru_cache(maxsize=None)
def encoded(text):
    return np.array(ENC.encode_ordinary(text) + [EOT], dtype=np.uint16)


def expected_tokens(texts):
    return np.concatenate([encoded(t) for t in texts] or [np.empty(0, np.uint16)])


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
    monkeypatch.setattr(sources, "CHUNK_BYTES", 1 << 14)  # many pieces: the BPE-safe cuts are exercised
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
    in_val = [n for n in names if tokenize_pool.goes_to_val(n.encode(), 0.3)]
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
        return [json.loads(line)["text"] for line in raw.decode().splitlines()]

    dolma = []
    for name in sorted(os.listdir(PILE_SAMPLE / "dolma_cc_en")):
        dolma += [json.loads(line)["text"] for line in (PILE_SAMPLE / "dolma_cc_en" / name).read_text().splitlines()]
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
    dolma_texts = [json.loads(line)["text"] for line in dolma.read_text().splitlines()]
    run("--input", PILE_SAMPLE / "train_00_head.jsonl.zst", dolma, "--exclude-subset", "Pile-CC",
        "--out-dir", tmp_path / "a", "--num-proc", 1, "--val-fraction", 0)
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["filtered_documents"] == 1  # the Pile-CC document; Dolma documents have no pile_set_name
    assert np.array_equal(read_bin(tmp_path / "a" / "train.bin"), expected_tokens(dolma_texts))
    r = run_cli("--input", PILE_SAMPLE / "train_00_head.jsonl.zst", "--include-subset", "Github",
                "--out-dir", tmp_path / "b")
    assert_one_line_error(r, "empty corpus", "filtered out: 1")


def test_output_is_byte_identical_for_any_num_proc_and_val_split_is_stable(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 1 << 15)
    docs = shakespeare_docs()
    write_jsonl(tmp_path / "a.jsonl.zst", docs[:3000], "zst")
    write_jsonl(tmp_path / "b.jsonl.gz", docs[3000:], "gz")
    for n in (1, 2):
        run("--input", tmp_path / "*.jsonl.*", "--out-dir", tmp_path / f"out{n}", "--num-proc", n,
            "--val-fraction", 0.05)
    for split in ("train.bin", "val.bin"):
        assert (tmp_path / "out1" / split).read_bytes() == (tmp_path / "out2" / split).read_bytes()
    # the split is a function of each document's text alone
    in_val = [d for d in docs if tokenize_pool.goes_to_val(d.encode(), 0.05)]
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


def resume_corpus_texts(n_files, repeat=1):
    docs = shakespeare_docs() * repeat
    return [docs if k % 2 else docs[::-1] for k in range(n_files)]


def _make_resume_corpus(root, n_files, repeat=1):
    root.mkdir()
    for k, texts in enumerate(resume_corpus_texts(n_files, repeat)):
        write_jsonl(root / f"{k:02d}.jsonl.zst", texts, "zst")
    return root


@pytest.mark.slow
def test_killed_run_never_looks_complete_and_resumes_byte_identical(tmp_path):
    corpus = _make_resume_corpus(tmp_path / "corpus", 12, repeat=4)  # long enough to be killed on an idle machine
    cmd = [sys.executable, str(REPO / "prepare_data.py"), "--input", str(corpus), "--num-proc", "2",
           "--val-fraction", "0.01"]
    ref = tmp_path / "ref"
    subprocess.run(cmd + ["--out-dir", str(ref)], check=True, capture_output=True)

    out = tmp_path / "out"
    proc = subprocess.Popen(cmd + ["--out-dir", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = out / out_folder.STATE_NAME
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


@pytest.mark.slow
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
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_no_files_matched_is_a_clear_error(tmp_path):
    r = run_cli("--input", tmp_path / "nothing*.jsonl", "--out-dir", tmp_path / "out")
    assert_one_line_error(r, "nothing*.jsonl", "no files matched")
    assert not (tmp_path / "out").exists()


def test_an_existing_file_whose_name_has_glob_characters_is_read_as_named(tmp_path):
    path = tmp_path / "notes[v2].txt"  # a glob pattern that matches "notesv.txt", not itself
    path.write_text("the second version of the notes\n")
    (tmp_path / "notesv.txt").write_text("another file\n")
    r = run_cli("--input", path, "--out-dir", tmp_path / "out", "--val-fraction", "0")
    assert r.returncode == 0, r.stderr
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(["the second version of the "
                                                                                        "notes\n"]))


def test_a_link_to_nothing_in_an_input_folder_is_an_error_not_a_skipped_file(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "part2").mkdir(parents=True)
    (corpus / "a.txt").write_text("kept\n")
    (corpus / "part2" / "b.txt").symlink_to(tmp_path / "moved-away.txt")  # unreadable: its target is gone
    r = run_cli("--input", corpus, "--out-dir", tmp_path / "out")
    assert_one_line_error(r, f"{corpus / 'part2' / 'b.txt'} is a link to nothing")
    assert not (tmp_path / "out").exists()


def test_an_unreadable_subfolder_of_the_input_is_an_error_not_skipped(tmp_path, monkeypatch, capsys):
    """As root, chmod 000 does not stop reads: the listing of one subfolder fails as it would for a user
    without permission (os.scandir raises PermissionError). It was skipped, and the run said nothing."""
    corpus = tmp_path / "corpus"
    for part in ("part1", "part2", "part3"):
        (corpus / part).mkdir(parents=True)
        (corpus / part / "doc.txt").write_text(f"text of {part}\n")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("part2"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(SystemExit) as e:
        run_main(prepare_data.main, ["--input", str(corpus), "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert f"error: --input {corpus}: cannot read {corpus / 'part2'} (Permission denied)" in err
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


@pytest.mark.slow
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


# ---- every kill resumes -----------------------------------------------------------------------------------


def cli(*args):
    return [sys.executable, str(REPO / "prepare_data.py"), *map(str, args)]


def kill_when(proc, ready, timeout=120):
    """SIGKILL proc as soon as ready() holds; fail if it finished first."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: make the corpus larger"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def saved_state(out):
    try:
        return json.loads((out / out_folder.STATE_NAME).read_text())
    except (FileNotFoundError, ValueError):
        return None


@pytest.mark.slow
def test_kill_during_the_first_file_resumes_where_it_was(tmp_path):
    docs = shakespeare_docs() * 40  # one file that takes seconds however fast the machine (on the Pile, an hour)
    write_jsonl(tmp_path / "only.jsonl.zst", docs, "zst")
    out = tmp_path / "out"
    cmd = cli("--input", tmp_path / "only.jsonl.zst", "--out-dir", out, "--num-proc", 1, "--val-fraction", 0)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(proc, lambda: (saved_state(out) or {}).get("tokens", {}).get("train", 0) > 0)
    state = saved_state(out)
    assert state["files_done"] == 0 and state["position"][0] > 0
    assert not (out / "train.bin").exists() and not (out / "meta.json").exists()
    (out / f".{out_folder.STATE_NAME}.tmp99999").write_text("{")  # as if killed while writing the state

    resumed = subprocess.run(cmd, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: 0 of 1 files already done, only.jsonl.zst from line {state['position'][1]} " \
           f"({state['tokens']['train']:,} train tokens)" in resumed.stderr
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(docs))
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin"]


@pytest.mark.slow
def test_interrupted_overwrite_run_resumes_instead_of_starting_over(tmp_path):
    out = tmp_path / "out"
    run("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 100)
    old = (out / "train.bin").read_bytes()
    corpus = _make_resume_corpus(tmp_path / "corpus", 12, repeat=3)  # seconds, however fast the machine
    cmd = cli("--input", corpus, "--out-dir", out, "--num-proc", 1, "--val-fraction", 0, "--overwrite")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_when(proc, lambda: (saved_state(out) or {}).get("tokens", {}).get("train", 0) > 0)
    done = saved_state(out)["files_done"]
    assert (out / "train.bin").read_bytes() == old and (out / "meta.json").exists()  # the old set, until the end

    refused = subprocess.run(cmd[:-1], capture_output=True, text=True)  # the same command without --overwrite
    assert_one_line_error(refused, "pass --overwrite")
    resumed = subprocess.run(cmd, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: {done} of 12 files already done" in resumed.stderr
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(sum(resume_corpus_texts(12, 3), [])))
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin"]


def test_a_run_stopped_while_publishing_completes_when_run_again(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "a.jsonl", shakespeare_docs(50))
    out = tmp_path / "out"
    real_replace = os.replace

    def stop_after_publishing_train(src, dst):
        real_replace(src, dst)
        if Path(dst).name == "train.bin":
            raise KeyboardInterrupt  # e.g. a Ctrl-C right after train.bin.partial became train.bin

    monkeypatch.setattr(os, "replace", stop_after_publishing_train)
    args = ("--input", tmp_path / "a.jsonl", "--out-dir", out, "--val-fraction", 0.2, "--num-proc", 1)
    with pytest.raises(KeyboardInterrupt):
        run(*args)
    monkeypatch.setattr(os, "replace", real_replace)
    assert (out / "train.bin").exists() and (out / "val.bin.partial").exists() and not (out / "meta.json").exists()
    run(*args)
    docs = shakespeare_docs(50)
    in_val = [d for d in docs if tokenize_pool.goes_to_val(d.encode(), 0.2)]
    assert np.array_equal(read_bin(out / "val.bin"), expected_tokens(in_val))
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens([d for d in docs if d not in in_val]))
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_a_file_fixed_after_an_error_is_read_again_and_finished_files_are_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sources, "CHUNK_BYTES", 2000)  # many tasks: progress inside b.jsonl is recorded
    monkeypatch.setattr(out_folder, "COMMIT_SECONDS", 0.0)
    docs = shakespeare_docs(400)
    a = write_jsonl(tmp_path / "a.jsonl", docs[:200])
    b = write_jsonl(tmp_path / "b.jsonl", docs[200:])
    good_b = b.read_text()
    lines = good_b.splitlines(keepends=True)
    b.write_text("".join(lines[:150] + ['{"text": "a broken line\n'] + lines[150:]))
    args = ("--input", a, b, "--out-dir", tmp_path / "out", "--val-fraction", 0, "--num-proc", 1)
    with pytest.raises(UserError, match=r"b.jsonl:151: malformed JSON.*\(1 of 2 files done"):
        run(*args)
    assert saved_state(tmp_path / "out")["position"][0] > 0  # progress inside b.jsonl was recorded

    a.write_text(a.read_text() + json.dumps({"text": "late"}) + "\n")  # a finished file must not change
    with pytest.raises(UserError, match="a.jsonl changed since it was read"):
        run(*args)
    write_jsonl(a, docs[:200])
    b.write_text(good_b)  # the user fixes the line: b.jsonl is shorter now, so it is read again from its start
    capsys.readouterr()
    run(*args)
    err = capsys.readouterr().err
    assert "b.jsonl changed since the interrupted run read part of it; reading it again from its start" in err
    assert "resuming: 1 of 2 files already done" in err
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(docs))


# ---- a full disk names the disk, and the run resumes once there is space ---------------------------------


def test_full_disk_is_one_line_naming_the_disk_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    files = [write_jsonl(tmp_path / f"{k}.jsonl", shakespeare_docs()[k * 300:(k + 1) * 300]) for k in range(5)]
    out = tmp_path / "out"
    monkeypatch.setattr(out_folder, "COMMIT_SECONDS", 0.0)  # record progress at every boundary
    real_fsync, calls = os.fsync, []

    def fsync_on_a_full_disk(fd):  # ext4 and NFS can report ENOSPC at fsync rather than at write
        if os.readlink(f"/proc/self/fd/{fd}").endswith("train.bin.partial"):
            calls.append(fd)
            if len(calls) > 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_on_a_full_disk)
    args = ["--input", *map(str, files), "--out-dir", str(out), "--num-proc", "1", "--val-fraction", "0"]
    with pytest.raises(SystemExit) as exit_info:
        run_main(prepare_data.main, args)
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert f"--out-dir {out}: No space left on device (ENOSPC)" in errors[0]
    assert "free space on that disk" in errors[0] and "run the same command again to resume" in errors[0]
    assert "check the file" not in errors[0]
    assert sorted(os.listdir(out)) == sorted(out_folder.OUR_FILES)  # no temporary file left behind

    monkeypatch.setattr(os, "fsync", real_fsync)  # space freed
    run_main_ok(args)
    assert "resuming: " in capsys.readouterr().err
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(shakespeare_docs()[:1500]))


def run_main_ok(args):
    with pytest.raises(SystemExit) as exit_info:
        run_main(prepare_data.main, args)
    assert exit_info.value.code == 0


@pytest.mark.slow
def test_file_size_limit_is_one_line_naming_the_limit_and_the_run_resumes(tmp_path):
    corpus = _make_resume_corpus(tmp_path / "corpus", 4)  # about 600 KB of tokens per file
    out = tmp_path / "out"
    cmd = cli("--input", corpus, "--out-dir", out, "--num-proc", 1, "--val-fraction", 0)

    def limit_files_to_1_mb():  # the kernel refuses to grow any file past 1 MB: EFBIG, like a disk filling up
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))

    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit_files_to_1_mb)
    assert_one_line_error(r, f"--out-dir {out}: File too large (EFBIG) while writing train.bin.partial",
                          "ulimit -f")
    assert "corpus" not in r.stderr.splitlines()[-1].split("while writing")[0]  # the input is not blamed
    left = set(os.listdir(out)) if out.exists() else set()
    assert left <= out_folder.OUR_FILES
    committed = saved_state(out)

    resumed = subprocess.run(cmd, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    if committed:
        assert "resuming: " in resumed.stderr
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(sum(resume_corpus_texts(4), [])))


def test_out_dir_under_a_file_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = run_cli("--input", SHAKESPEARE, "--out-dir", tmp_path / "notes.txt" / "out")
    assert_one_line_error(r, f"{tmp_path / 'notes.txt'} is a file, not a folder", "choose another --out-dir")
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ---- empty documents, empty and truncated files ---------------------------------------------------------


def test_empty_and_whitespace_only_documents_are_skipped_and_counted(tmp_path):
    texts = ["one", "", "  \n\t ", "two <|endoftext|> is text here", "\n", "caf\u00e9 \ud800 lone surrogate"]
    write_jsonl(tmp_path / "a.jsonl", texts)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text(" \n\n  \n")
    (tmp_path / "story.txt").write_text("Once upon a time.\n")
    run("--input", tmp_path / "a.jsonl", tmp_path / "blank.txt", tmp_path / "empty.txt", tmp_path / "story.txt",
        "--out-dir", tmp_path / "out", "--val-fraction", 0, "--num-proc", 1)
    kept = ["one", "two <|endoftext|> is text here", "caf\u00e9 \ud800 lone surrogate", "Once upon a time.\n"]
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(kept))
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["empty_documents"] == 5 and meta["splits"]["train"]["documents"] == 4


def test_an_empty_txt_is_an_empty_corpus_error(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    r = run_cli("--input", tmp_path / "empty.txt", "--out-dir", tmp_path / "out")
    assert_one_line_error(r, "empty corpus", "empty.txt", "empty or whitespace-only: 1")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("company", ["alone", "among good files"])
@pytest.mark.parametrize("fmt", ["zst", "gz"])
@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_empty_or_truncated_compressed_input_is_refused(tmp_path, damage, fmt, company):
    bad = write_jsonl(tmp_path / f"z_bad.jsonl.{fmt}", shakespeare_docs(3000), fmt)  # sorts after the good ones
    data = bad.read_bytes()
    bad.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    inputs = [bad]
    if company == "among good files":
        inputs = [write_jsonl(tmp_path / "a.jsonl", ["good"]), write_jsonl(tmp_path / f"b.jsonl.{fmt}", ["fine"], fmt),
                  bad]
    r = run_cli("--input", *inputs, "--out-dir", tmp_path / "out", "--num-proc", 1, "--val-fraction", 0)
    assert_one_line_error(r, f"z_bad.jsonl.{fmt}", "empty file (0 bytes)" if damage == "empty" else "truncated",
                          "download")
    assert not (tmp_path / "out" / "train.bin").exists() and not (tmp_path / "out" / "meta.json").exists()


# ---- vocabularies at the limits of each dtype, and broken tokenizers ------------------------------------

TEST_VOCABS = '''
def make(n_vocab, missing_byte=None, duplicate_rank=False):
    """A byte-level BPE of exactly n_vocab ids: the bytes, then byte pairs, then <|endoftext|> = n_vocab - 1."""
    singles = [bytes([b]) for b in range(256) if b != missing_byte]
    ranks = {t: r for r, t in enumerate(singles)}
    pairs = (bytes([a, b]) for a in range(256) for b in range(256))
    while len(ranks) < n_vocab - 1:
        ranks[next(pairs)] = len(ranks)
    if duplicate_rank:
        ranks[next(pairs)] = 0
    return {"name": f"v{n_vocab}", "pat_str": r"\\S+|\\s+", "mergeable_ranks": ranks,
            "special_tokens": {"<|endoftext|>": n_vocab - 1}}


ENCODING_CONSTRUCTORS = {
    "test-vocab-65536": lambda: make(65536), "test-vocab-65537": lambda: make(65537),
    "test-broken-at-encode": lambda: make(1000, missing_byte=ord("q")),
    "test-broken-at-load": lambda: make(1000, duplicate_rank=True),
}
'''


@pytest.fixture
def test_vocabs(tmp_path):
    """tiktoken plugin encodings (tiktoken_ext) for a subprocess: returns (env, module)."""
    plugin = tmp_path / "plugins" / "tiktoken_ext" / "pile_gpt_test_vocabs.py"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(TEST_VOCABS)
    spec = importlib.util.spec_from_file_location("pile_gpt_test_vocabs", plugin)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**os.environ, "PYTHONPATH": str(plugin.parent.parent)}, module


@pytest.mark.parametrize("n_vocab, dtype", [(65536, np.uint16), (65537, np.uint32)])
def test_vocab_at_the_limit_of_each_dtype(tmp_path, test_vocabs, n_vocab, dtype):
    import tiktoken

    env, module = test_vocabs
    enc = tiktoken.Encoding(**module.make(n_vocab))
    texts = ["hello world", "the top id ends every document"]
    write_jsonl(tmp_path / "a.jsonl", texts)
    r = subprocess.run(cli("--input", tmp_path / "a.jsonl", "--out-dir", tmp_path / "out", "--encoding",
                           f"test-vocab-{n_vocab}", "--val-fraction", 0, "--num-proc", 1),
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert (meta["vocab_size"], meta["eot_token"], meta["dtype"]) == (n_vocab, n_vocab - 1, np.dtype(dtype).name)
    expected = sum((enc.encode_ordinary(t) + [n_vocab - 1] for t in texts), [])
    assert np.fromfile(tmp_path / "out" / "train.bin", dtype=dtype).tolist() == expected


@pytest.mark.parametrize("num_proc", [1, 2])
@pytest.mark.parametrize("broken", ["at-load", "at-encode"])
def test_a_tokenizer_that_panics_is_a_one_line_error(tmp_path, test_vocabs, broken, num_proc):
    env, _ = test_vocabs
    write_jsonl(tmp_path / "a.jsonl", ["fine", "the letter q is not in this vocabulary"])
    r = subprocess.run(cli("--input", tmp_path / "a.jsonl", "--out-dir", tmp_path / "out", "--encoding",
                           f"test-broken-{broken}", "--num-proc", num_proc),
                       capture_output=True, text=True, env={**env, "RUST_BACKTRACE": "0"}, timeout=120)
    needles = ["--encoding test-broken-at-load: cannot load"] if broken == "at-load" else \
        ["a.jsonl:2: the tokenizer --encoding test-broken-at-encode failed on this document", "PanicException"]
    assert_one_line_error(r, *needles)
    assert not (tmp_path / "out").exists()


def test_a_token_id_outside_the_vocabulary_is_an_error_not_a_wrap_around(tmp_path, monkeypatch):
    class OutOfVocabulary:  # a broken tokenizer: ids past its own vocabulary (and past uint16)
        n_vocab, eot_token = 50257, 50256

        def encode_to_numpy(self, text, **kwargs):
            return np.array([70000], dtype=np.uint32)

        def encode_ordinary(self, text):
            return [70000]

    monkeypatch.setattr(tokenize_pool, "get_encoding", lambda name: OutOfVocabulary())
    write_jsonl(tmp_path / "a.jsonl", ["hello"])
    with pytest.raises(UserError, match=r"returned token id 70000, outside its vocabulary \[0, 50257\)"):
        run("--input", tmp_path / "a.jsonl", "--out-dir", tmp_path / "out", "--num-proc", 1, "--val-fraction", 0)
    assert not (tmp_path / "out").exists()


# ---- any Hugging Face dataset: Parquet through `datasets`, streamed --------------------------------------


def write_parquet_dataset(root, splits):
    """A Hub-style dataset folder: data/{split}-0000k-of-0000n.parquet, columns id and content."""
    import datasets

    (root / "data").mkdir(parents=True)
    for split, shards in splits.items():
        for k, texts in enumerate(shards):
            name = f"{split}-{k:05d}-of-{len(shards):05d}.parquet"
            datasets.Dataset.from_dict({"id": list(range(len(texts))), "content": texts}).to_parquet(
                str(root / "data" / name))
    return root


@pytest.mark.slow
def test_parquet_dataset_streams_through_datasets_exactly_and_caches_nothing(tmp_path):
    docs = shakespeare_docs(700)
    train = [docs[:300] + ["", "   "], docs[300:600]]
    hub = write_parquet_dataset(tmp_path / "hub", {"train": train, "validation": [docs[600:650]],
                                                   "test": [docs[650:]]})
    hf_home = tmp_path / "hf_home"
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_DATASETS_CACHE": str(hf_home / "datasets"),
           "HF_HUB_OFFLINE": "1"}
    outs = []
    for k, (dataset, num_proc) in enumerate([(hub, 1), (f"file://{hub}", 2)]):
        out = tmp_path / f"out{k}"
        r = subprocess.run(cli("--dataset", dataset, "--text-column", "content", "--out-dir", out,
                               "--num-proc", num_proc), capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(out)
    out = outs[0]
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(docs[:600]))
    assert np.array_equal(read_bin(out / "val.bin"), expected_tokens(docs[600:650]))
    for name in ("train.bin", "val.bin"):
        assert (outs[1] / name).read_bytes() == (out / name).read_bytes()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["sources"]["files"] == ["validation", "train"] and meta["sources"]["test_files_skipped"] == 1
    assert meta["empty_documents"] == 2 and meta["splits"]["train"]["documents"] == 600
    assert not hf_home.exists() or not any(hf_home.rglob("*"))  # no Arrow cache, no lock files


@pytest.mark.slow
def test_parquet_dataset_val_fraction_max_tokens_and_shards(tmp_path):
    docs = shakespeare_docs(400)
    hub = write_parquet_dataset(tmp_path / "hub", {"train": [docs[:250], docs[250:]]})
    run("--dataset", hub, "--text-column", "content", "--out-dir", tmp_path / "a", "--val-fraction", 0.1,
        "--num-proc", 1)
    in_val = [d for d in docs if tokenize_pool.goes_to_val(d.encode(), 0.1)]
    assert 20 < len(in_val) < 60
    assert np.array_equal(read_bin(tmp_path / "a" / "val.bin"), expected_tokens(in_val))
    assert np.array_equal(read_bin(tmp_path / "a" / "train.bin"), expected_tokens([d for d in docs if d not in in_val]))

    run("--dataset", hub, "--text-column", "content", "--out-dir", tmp_path / "b", "--val-fraction", 0,
        "--max-tokens", 999)
    assert np.array_equal(read_bin(tmp_path / "b" / "train.bin"), expected_tokens(docs)[:999])

    parts = []
    for i in range(2):
        run("--dataset", hub, "--text-column", "content", "--out-dir", tmp_path / f"part{i}", "--val-fraction", 0,
            "--shard-index", i, "--num-shards", 2)
        parts.append(read_bin(tmp_path / f"part{i}" / "train.bin"))
    assert sorted(np.concatenate(parts).tolist()) == sorted(expected_tokens(docs).tolist())


@pytest.mark.slow
def test_parquet_dataset_resumes_after_an_interruption(tmp_path, monkeypatch, capsys):
    docs = shakespeare_docs(600)
    hub = write_parquet_dataset(tmp_path / "hub", {"train": [docs[:300], docs[300:]]})
    monkeypatch.setattr(sources, "CHUNK_BYTES", 4000)
    monkeypatch.setattr(out_folder, "COMMIT_SECONDS", 0.0)
    real_write, writes = out_folder.Writer.write, []

    def interrupted_write(self, result, max_train):
        writes.append(1)
        if len(writes) == 6:
            raise KeyboardInterrupt
        return real_write(self, result, max_train)

    monkeypatch.setattr(out_folder.Writer, "write", interrupted_write)
    args = ("--dataset", hub, "--text-column", "content", "--out-dir", tmp_path / "out", "--val-fraction", 0,
            "--num-proc", 1)
    with pytest.raises(KeyboardInterrupt):
        run(*args)
    state = saved_state(tmp_path / "out")
    assert state["position"][0] > 0
    monkeypatch.setattr(out_folder.Writer, "write", real_write)
    run(*args)
    assert f"resuming: 0 of 1 files already done, train from row {state['position'][1]}" in capsys.readouterr().err
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(docs))


@pytest.mark.slow
def test_parquet_dataset_without_the_text_column_is_one_line_naming_the_columns(tmp_path):
    hub = write_parquet_dataset(tmp_path / "hub", {"train": [["a document"]]})
    r = run_cli("--dataset", hub, "--out-dir", tmp_path / "out")
    assert_one_line_error(r, f"--dataset {hub}: split 'train' has no column 'text' (columns: id, content)",
                          "--text-column")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_parquet_dataset_with_an_unknown_config_or_a_null_text_is_refused(tmp_path):
    hub = write_parquet_dataset(tmp_path / "hub", {"train": [["one", None, "three"]]})
    with pytest.raises(UserError, match="BuilderConfig 'nope' not found.*--dataset-config"):
        run("--dataset", hub, "--dataset-config", "nope", "--out-dir", tmp_path / "out")
    with pytest.raises(UserError, match="train row 2: no string in column 'content'.*--skip-bad-lines"):
        run("--dataset", hub, "--text-column", "content", "--out-dir", tmp_path / "out", "--num-proc", 1)
    run("--dataset", hub, "--text-column", "content", "--out-dir", tmp_path / "out", "--skip-bad-lines",
        "--val-fraction", 0, "--num-proc", 1)
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(["one", "three"]))
