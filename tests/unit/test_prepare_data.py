"""prepare_data.py's main() in this process: exact tokens, splits, determinism across --num-proc, subsets, shards,
resume after an interruption or an error, full disks, empty documents. Its command line (bad input, kills, other
tokenizers, Parquet datasets): tests/e2e/test_prepare_data.py."""

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

import prepare_data
from helpers import (
    PILE_SAMPLE,
    SHAKESPEARE,
    expected_tokens,
    main_error,
    read_bin,
    saved_state,
    shakespeare_docs,
    write_jsonl,
)
from helpers import (
    prepare_data_main as run,
)
from pilegpt.common import UserError, run_main
from pilegpt.prepare import out_folder, sources, tokenize_pool
from pilegpt.tokenizer import gpt2

ENC = gpt2()
EOT = 50256


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
    # --include-subset keeping nothing: tests/e2e/test_prepare_data.py


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


# ---- bad input: one line, non-zero exit, nothing written, existing output untouched ----------------------


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
    error = main_error(prepare_data.main, ["--input", corpus, "--out-dir", tmp_path / "out"], capsys)
    assert f"error: --input {corpus}: cannot read {corpus / 'part2'} (Permission denied)" in error
    assert not (tmp_path / "out").exists()


def test_skip_bad_lines_skips_and_counts(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"text": "one"}\n{"text": oops}\n{"text": "caf\xe9"}\n{"content": "x"}\n{"text": "two"}\n')
    run("--input", path, "--out-dir", tmp_path / "out", "--skip-bad-lines", "--val-fraction", 0)
    assert np.array_equal(read_bin(tmp_path / "out" / "train.bin"), expected_tokens(["one", "two"]))
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["skipped_bad_lines"] == 3


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
    error = main_error(prepare_data.main, args, capsys, alone=False)  # after the progress lines
    assert f"--out-dir {out}: No space left on device (ENOSPC)" in error
    assert "free space on that disk" in error and "run the same command again to resume" in error
    assert "check the file" not in error
    assert sorted(os.listdir(out)) == sorted(out_folder.OUR_FILES)  # no temporary file left behind

    monkeypatch.setattr(os, "fsync", real_fsync)  # space freed
    run_main_ok(args)
    assert "resuming: " in capsys.readouterr().err
    assert np.array_equal(read_bin(out / "train.bin"), expected_tokens(shakespeare_docs()[:1500]))


def run_main_ok(args):
    with pytest.raises(SystemExit) as exit_info:
        run_main(prepare_data.main, args)
    assert exit_info.value.code == 0


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


# ---- vocabularies at the limits of each dtype, and broken tokenizers ------------------------------------


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


def test_input_given_twice_reads_every_file_named():
    """`--input a --input b` reads both files: a second --input adds to the first, never replaces it."""
    assert prepare_data.parse_args(["--input", "a", "b", "--input", "c"]).input == ["a", "b", "c"]
