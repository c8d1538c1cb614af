"""prepare_data.py through its command line: a kill or Ctrl-C never leaves a dataset that looks complete and the
same command resumes it byte for byte; bad input, a full disk and broken tokenizers are one line with exit status
2; other tokenizers at the limits of each dtype; any `datasets` dataset (Parquet, streamed)."""

import importlib.util
import json
import os
import resource
import signal

import numpy as np
import pytest

from helpers import (
    PILE_SAMPLE,
    SHAKESPEARE,
    expected_tokens,
    failed_with_one_line,
    finish,
    read_bin,
    run_command,
    saved_state,
    script,
    shakespeare_docs,
    start,
    succeeded,
    wait_until,
    write_jsonl,
    write_parquet_dataset,
)
from helpers import (
    prepare_data_main as run,
)
from pilegpt.common import UserError
from pilegpt.prepare import out_folder, sources, tokenize_pool


def prepare(*args, env=None, **popen) -> tuple[int, str]:
    """`python prepare_data.py ARGS`: (exit status, output)."""
    return run_command(script("prepare_data.py", *args), env=env, **popen)


def refused(result: tuple[int, str], *needles: str) -> None:
    """The command failed with exit status 2 and one error line (helpers.one_error_line) holding every needle."""
    line = failed_with_one_line(result)
    for needle in needles:
        assert needle in line, line


def kill_when(proc, ready) -> None:
    """SIGKILL proc as soon as ready() holds; fail if it finished first (then make the corpus larger)."""
    wait_until(ready, proc, "moment to kill it in: the run ended first; make the corpus larger", seconds=120)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def resume_corpus_texts(n_files, repeat=1):
    docs = shakespeare_docs() * repeat
    return [docs if k % 2 else docs[::-1] for k in range(n_files)]


def _make_resume_corpus(root, n_files, repeat=1):
    root.mkdir()
    for k, texts in enumerate(resume_corpus_texts(n_files, repeat)):
        write_jsonl(root / f"{k:02d}.jsonl.zst", texts, "zst")
    return root


def test_killed_run_never_looks_complete_and_resumes_byte_identical(tmp_path):
    corpus = _make_resume_corpus(tmp_path / "corpus", 12, repeat=4)  # long enough to be killed on an idle machine
    args = ["--input", corpus, "--num-proc", 2, "--val-fraction", 0.01]
    ref = tmp_path / "ref"
    run(*args, "--out-dir", ref)  # the uninterrupted run, in this process

    out = tmp_path / "out"
    proc = start(script("prepare_data.py", *args, "--out-dir", out))
    kill_when(proc, lambda: (saved_state(out) or {}).get("files_done", 0) >= 2)
    done = saved_state(out)["files_done"]
    assert 2 <= done < 12
    assert not (out / "train.bin").exists() and not (out / "meta.json").exists()

    resumed = succeeded(prepare(*args, "--out-dir", out))
    assert f"resuming: {done} of 12 files already done" in resumed
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (ref / name).read_bytes()
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]


def test_ctrl_c_stops_cleanly_and_resumes(tmp_path):
    corpus = _make_resume_corpus(tmp_path / "corpus", n_files=6)
    args = ["--input", corpus, "--num-proc", 1, "--out-dir", tmp_path / "out", "--val-fraction", 0]
    proc = start(script("prepare_data.py", *args))
    partial = tmp_path / "out" / "train.bin.partial"
    wait_until(lambda: partial.exists() and partial.stat().st_size > 0, proc, "train.bin.partial", seconds=120)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout=60)
    assert code == 130, out[-3000:]
    assert "run the same command again to resume" in out
    assert not (tmp_path / "out" / "train.bin").exists()
    succeeded(prepare(*args))
    expected = expected_tokens(sum(resume_corpus_texts(6), []))
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected)


def test_an_include_subset_that_keeps_nothing_is_an_empty_corpus_error(tmp_path):
    r = prepare("--input", PILE_SAMPLE / "train_00_head.jsonl.zst", "--include-subset", "Github",
                "--out-dir", tmp_path / "b")
    refused(r, "empty corpus", "filtered out: 1")


def test_no_files_matched_is_a_clear_error(tmp_path):
    r = prepare("--input", tmp_path / "nothing*.jsonl", "--out-dir", tmp_path / "out")
    refused(r, "nothing*.jsonl", "no files matched")
    assert not (tmp_path / "out").exists()


def test_an_existing_file_whose_name_has_glob_characters_is_read_as_named(tmp_path):
    path = tmp_path / "notes[v2].txt"  # a glob pattern that matches "notesv.txt", not itself
    path.write_text("the second version of the notes\n")
    (tmp_path / "notesv.txt").write_text("another file\n")
    succeeded(prepare("--input", path, "--out-dir", tmp_path / "out", "--val-fraction", "0"))
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(["the second version of the "
                                                                                        "notes\n"]))


def test_a_link_to_nothing_in_an_input_folder_is_an_error_not_a_skipped_file(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "part2").mkdir(parents=True)
    (corpus / "a.txt").write_text("kept\n")
    (corpus / "part2" / "b.txt").symlink_to(tmp_path / "moved-away.txt")  # unreadable: its target is gone
    r = prepare("--input", corpus, "--out-dir", tmp_path / "out")
    refused(r, f"{corpus / 'part2' / 'b.txt'} is a link to nothing")
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
    r = prepare("--input", path, "--out-dir", out, "--num-proc", 1)
    refused(r, *needles)
    assert not (out / "train.bin").exists() and not (out / "meta.json").exists()


def test_empty_corpus_is_an_error_and_leaves_no_folder(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", ["", "", ""])
    r = prepare("--input", path, "--out-dir", tmp_path / "out")
    refused(r, "empty corpus", "empty.jsonl")
    assert not (tmp_path / "out").exists()


def test_existing_output_is_refused_untouched_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    run("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 100)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    r = prepare("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 50)
    refused(r, str(out), "already holds a finished dataset", "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused(prepare("--input", SHAKESPEARE, "--out-dir", other), "other files")
    assert sorted(os.listdir(other)) == ["notes.txt"]

    run("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 50, "--overwrite")
    assert len(read_bin(out / "train.bin")) == 50


def test_kill_during_the_first_file_resumes_where_it_was(tmp_path):
    docs = shakespeare_docs() * 40  # one file that takes seconds however fast the machine (on the Pile, an hour)
    write_jsonl(tmp_path / "only.jsonl.zst", docs, "zst")
    out = tmp_path / "out"
    args = ["--input", tmp_path / "only.jsonl.zst", "--out-dir", out, "--num-proc", 1, "--val-fraction", 0]
    proc = start(script("prepare_data.py", *args))
    kill_when(proc, lambda: (saved_state(out) or {}).get("tokens", {}).get("train", 0) > 0)
    state = saved_state(out)
    assert state["files_done"] == 0 and state["position"][0] > 0
    assert not (out / "train.bin").exists() and not (out / "meta.json").exists()
    (out / f".{out_folder.STATE_NAME}.tmp99999").write_text("{")  # as if killed while writing the state

    resumed = succeeded(prepare(*args))
    assert f"resuming: 0 of 1 files already done, only.jsonl.zst from line {state['position'][1]} " \
           f"({state['tokens']['train']:,} train tokens)" in resumed
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(docs))
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin"]


def test_interrupted_overwrite_run_resumes_instead_of_starting_over(tmp_path):
    out = tmp_path / "out"
    run("--input", SHAKESPEARE, "--out-dir", out, "--val-fraction", 0, "--max-tokens", 100)
    old = (out / "train.bin").read_bytes()
    corpus = _make_resume_corpus(tmp_path / "corpus", 12, repeat=3)  # seconds, however fast the machine
    args = ["--input", corpus, "--out-dir", out, "--num-proc", 1, "--val-fraction", 0, "--overwrite"]
    proc = start(script("prepare_data.py", *args))
    kill_when(proc, lambda: (saved_state(out) or {}).get("tokens", {}).get("train", 0) > 0)
    done = saved_state(out)["files_done"]
    assert (out / "train.bin").read_bytes() == old and (out / "meta.json").exists()  # the old set, until the end

    refused(prepare(*args[:-1]), "pass --overwrite")  # the same command without --overwrite
    resumed = succeeded(prepare(*args))
    assert f"resuming: {done} of 12 files already done" in resumed
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(sum(resume_corpus_texts(12, 3), [])))
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin"]


def test_file_size_limit_is_one_line_naming_the_limit_and_the_run_resumes(tmp_path):
    corpus = _make_resume_corpus(tmp_path / "corpus", 4)  # about 600 KB of tokens per file
    out = tmp_path / "out"
    args = ["--input", corpus, "--out-dir", out, "--num-proc", 1, "--val-fraction", 0]

    def limit_files_to_1_mb():  # the kernel refuses to grow any file past 1 MB: EFBIG, like a disk filling up
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))

    limited = prepare(*args, preexec_fn=limit_files_to_1_mb)
    refused(limited, f"--out-dir {out}: File too large (EFBIG) while writing train.bin.partial", "ulimit -f")
    assert "corpus" not in failed_with_one_line(limited).split("while writing")[0]  # the input is not blamed
    left = set(os.listdir(out)) if out.exists() else set()
    assert left <= out_folder.OUR_FILES
    committed = saved_state(out)

    resumed = succeeded(prepare(*args))
    if committed:
        assert "resuming: " in resumed
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(sum(resume_corpus_texts(4), [])))


def test_out_dir_under_a_file_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = prepare("--input", SHAKESPEARE, "--out-dir", tmp_path / "notes.txt" / "out")
    refused(r, f"{tmp_path / 'notes.txt'} is a file, not a folder", "choose another --out-dir")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_an_empty_txt_is_an_empty_corpus_error(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    r = prepare("--input", tmp_path / "empty.txt", "--out-dir", tmp_path / "out")
    refused(r, "empty corpus", "empty.txt", "empty or whitespace-only: 1")
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
    r = prepare("--input", *inputs, "--out-dir", tmp_path / "out", "--num-proc", 1, "--val-fraction", 0)
    refused(r, f"z_bad.jsonl.{fmt}", "empty file (0 bytes)" if damage == "empty" else "truncated",
                          "download")
    assert not (tmp_path / "out" / "train.bin").exists() and not (tmp_path / "out" / "meta.json").exists()


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
    succeeded(prepare("--input", tmp_path / "a.jsonl", "--out-dir", tmp_path / "out", "--encoding",
                      f"test-vocab-{n_vocab}", "--val-fraction", 0, "--num-proc", 1, env=env))
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert (meta["vocab_size"], meta["eot_token"], meta["dtype"]) == (n_vocab, n_vocab - 1, np.dtype(dtype).name)
    expected = sum((enc.encode_ordinary(t) + [n_vocab - 1] for t in texts), [])
    assert np.fromfile(tmp_path / "out" / "train.bin", dtype=dtype).tolist() == expected


@pytest.mark.parametrize("num_proc", [1, 2])
@pytest.mark.parametrize("broken", ["at-load", "at-encode"])
def test_a_tokenizer_that_panics_is_a_one_line_error(tmp_path, test_vocabs, broken, num_proc):
    env, _ = test_vocabs
    write_jsonl(tmp_path / "a.jsonl", ["fine", "the letter q is not in this vocabulary"])
    r = prepare("--input", tmp_path / "a.jsonl", "--out-dir", tmp_path / "out", "--encoding", f"test-broken-{broken}",
                "--num-proc", num_proc, env={**env, "RUST_BACKTRACE": "0"})
    needles = ["--encoding test-broken-at-load: cannot load"] if broken == "at-load" else \
        ["a.jsonl:2: the tokenizer --encoding test-broken-at-encode failed on this document", "PanicException"]
    refused(r, *needles)
    assert not (tmp_path / "out").exists()


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
        succeeded(prepare("--dataset", dataset, "--text-column", "content", "--out-dir", out, "--num-proc", num_proc,
                          env=env))
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


def test_parquet_dataset_without_the_text_column_is_one_line_naming_the_columns(tmp_path):
    hub = write_parquet_dataset(tmp_path / "hub", {"train": [["a document"]]})
    r = prepare("--dataset", hub, "--out-dir", tmp_path / "out")
    refused(r, f"--dataset {hub}: split 'train' has no column 'text' (columns: id, content)",
                          "--text-column")
    assert not (tmp_path / "out").exists()


def test_parquet_dataset_with_an_unknown_config_or_a_null_text_is_refused(tmp_path):
    hub = write_parquet_dataset(tmp_path / "hub", {"train": [["one", None, "three"]]})
    with pytest.raises(UserError, match="BuilderConfig 'nope' not found.*--dataset-config"):
        run("--dataset", hub, "--dataset-config", "nope", "--out-dir", tmp_path / "out")
    with pytest.raises(UserError, match="train row 2: no string in column 'content'.*--skip-bad-lines"):
        run("--dataset", hub, "--text-column", "content", "--out-dir", tmp_path / "out", "--num-proc", 1)
    run("--dataset", hub, "--text-column", "content", "--out-dir", tmp_path / "out", "--skip-bad-lines",
        "--val-fraction", 0, "--num-proc", 1)
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(["one", "three"]))
