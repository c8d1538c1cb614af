"""export_hf.py: a train.py run (model.pt, Composer checkpoint or run folder; local or s3://) becomes a Hugging Face
GPT-2 folder that transformers loads offline, computing our logits and tokenizing exactly as tiktoken does; an
existing OUT_DIR is kept unless it is an earlier export; the command line's errors are one line. The OUT_DIRs it
refuses: tests/unit/test_export_hf.py."""

import json

import numpy as np
import pytest
import torch

import export_hf
from helpers import SHAKESPEARE, failed_with_one_line, fake_run_folder, run_command, script, tiny_export, train_main
from pilegpt import checkpoint
from pilegpt.common import UserError
from pilegpt.data import write_token_files
from pilegpt.tokenizer import gpt2

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Text that exercises GPT-2's pre-tokenizer: contractions (any case), letters and digits runs, punctuation, every
# kind of whitespace run, and UTF-8 of 2, 3 and 4 bytes (accents, CJK, emoji with a skin-tone modifier, ZWJ).
VARIED_TEXT = (SHAKESPEARE.read_text()[:3000] + " It's they'RE we'll I'D 'tis o'er ''quoted''\n\n\n   \t\t x  \r\n"
               " 1234567890 3.14159 1,000,000 -42 x2 2x 0x1F\u00a0nbsp  naïve café Æsir ß İstanbul Ελληνικά русский "
               "日本語のテキスト 中文 한국어 🙂👍🏽 👩‍👩‍👧 \u200b\ufeff e\u0301 trailing spaces   \n\t")
FIRST_MERGES = ["Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he", "e r", "Ġ s", "a t"]  # GPT-2's merges.txt


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    export_hf.write_tokenizer(folder, model_max_length=1024)
    return folder


def test_exported_tokenizer_encodes_like_tiktoken(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ours = gpt2().encode_ordinary(VARIED_TEXT)
    assert tokenizer(VARIED_TEXT)["input_ids"] == ours
    assert tokenizer.decode(ours) == VARIED_TEXT
    for word in ("Hello world", " hello", "\n\n", "🙂", "  spaces  "):
        assert tokenizer.encode(word) == gpt2().encode_ordinary(word), word
    assert tokenizer.eos_token_id == tokenizer.bos_token_id == 50256 and len(tokenizer) == 50257
    vocab = json.loads((tokenizer_dir / "vocab.json").read_text())
    assert len(vocab) == 50257 and vocab["<|endoftext|>"] == 50256 and vocab["Ġthe"] == 262
    merges = (tokenizer_dir / "merges.txt").read_text().splitlines()
    assert merges[0] == "#version: 0.2" and merges[1:11] == FIRST_MERGES and len(merges) == 1 + 50000


# --------------------------------------------------------------------------------------------------------
# Models

RUNS = {  # a plain GPT-2 shape, and one with bias=False and the vocabulary padded to a multiple of 64
    "bias-vocab50257": ["--bias=True", "--vocab_size=50257"],
    "nobias-vocab50304": ["--bias=False", "--vocab_size=50304"],
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    tokens = np.array(gpt2().encode_ordinary(SHAKESPEARE.read_text()[:60_000]), dtype=np.uint16)
    write_token_files(folder, {"train": tokens})
    return folder


@pytest.fixture(scope="module", params=sorted(RUNS))
def trained_run(request, data_dir, tmp_path_factory):
    """A tiny train.py run: 3 batches at a high learning rate, so the weights are far from their init."""
    run_dir = tmp_path_factory.mktemp("runs") / request.param
    train_main([f"--data_dir={data_dir}", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32",
                "--global_batch_size=4", "--device_train_microbatch_size=4", "--sample_length=0", "--warmup=0ba",
                "--learning_rate=3e-2", "--max_duration=3ba", "--save_interval=3ba", "--device=cpu",
                "--progress_bar=False", f"--save_folder={run_dir}", *RUNS[request.param]])
    return run_dir


@pytest.mark.parametrize("src", ["run folder", "composer checkpoint"])
def test_export_loads_in_transformers_and_computes_our_logits(trained_run, src, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = trained_run if src == "run folder" else trained_run / "ep0-ba3-rank0.pt"
    out = tmp_path / "hf"
    assert export_hf.main([str(spec), str(out)]) == 0
    assert f"AutoModelForCausalLM.from_pretrained('{out}') loads it" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "generation_config.json",
                                               "vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json",
                                               "special_tokens_map.json"}
    ours = checkpoint.load_model(str(spec))
    hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert (hf.config.n_positions, hf.config.vocab_size, hf.config.n_embd) == (32, 50257, 32)
    assert hf.get_input_embeddings().weight.shape == (50257, 32)  # a padded vocabulary is cut back
    assert hf.generation_config.eos_token_id == 50256
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tokenizer.model_max_length == 32
    idx = torch.tensor([tokenizer(VARIED_TEXT)["input_ids"][i:i + 32] for i in (0, 100, 500)])
    with torch.no_grad():
        theirs = hf(idx).logits
        logits, _ = ours(idx, targets=idx)
    assert logits.shape[-1] == ours.config.vocab_size
    assert (theirs - logits[..., :50257]).abs().max().item() < 1e-4  # measured: 4e-7 to 1e-6
    greedy = hf.generate(idx[:1, :8], max_new_tokens=8, do_sample=False, pad_token_id=50256)
    assert greedy[0].tolist() == ours.generate(idx[:1, :8], 8, top_k=1)[0].tolist()


def test_existing_output_is_refused_and_overwrite_replaces_only_an_earlier_export(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    src = tiny_export(tmp_path / "src")  # not beside OUT_DIR: an OUT_DIR inside the source's folder is refused
    out = tmp_path / "hf"
    out.mkdir()
    (out / "precious.txt").write_text("keep")
    with pytest.raises(UserError, match="hf already exists and is not empty: pass --overwrite"):
        export_hf.main([str(src), str(out)])
    with pytest.raises(UserError, match=r"hf is not an earlier export \(it holds precious.txt\): --overwrite replaces "
                                        "only a folder that export_hf.py wrote"):
        export_hf.main([str(src), str(out), "--overwrite"])
    assert [p.name for p in out.iterdir()] == ["precious.txt"]
    (out / "precious.txt").unlink()
    export_hf.main([str(src), str(out)])  # an empty folder is fine
    first = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(folder, model_max_length):  # an export that dies half-way leaves nothing behind
        raise OSError("disk full")

    monkeypatch.setattr(export_hf, "write_tokenizer", broken)
    with pytest.raises(OSError, match="disk full"):
        export_hf.main([str(src), str(out), "--overwrite"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first  # the earlier export, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "src"]  # no temporary folder left
    monkeypatch.undo()

    (out / "model.safetensors").write_bytes(b"an older export")
    export_hf.main([str(src), str(out), "--overwrite"])  # an earlier export is replaced whole
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "src"]
    link = tmp_path / "link"
    link.symlink_to(out)
    export_hf.main([str(src), str(link), "--overwrite"])  # a link to an export: the link is replaced, not its target
    assert link.is_dir() and not link.is_symlink() and {p.name: p.read_bytes() for p in out.iterdir()} == first


def test_exporting_a_run_into_itself_is_one_line_and_keeps_the_run(tmp_path):
    """`export_hf.py RUN RUN --overwrite` deleted the run's checkpoints and left only the export."""
    before = fake_run_folder(tmp_path / "run")
    result = run_command(script("export_hf.py", "run", "run", "--overwrite"), tmp_path)
    assert failed_with_one_line(result, alone=True) == (
        f"error: OUT_DIR run is the run folder run ({tmp_path / 'run'}): an export there would replace or mix with "
        "the run's files; pass an OUT_DIR outside it, e.g. hf/NAME")
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


def test_cli_error_is_one_line_and_exit_code_2(tmp_path):
    result = run_command(script("export_hf.py", tmp_path / "nope.pt", tmp_path / "o"), tmp_path)
    assert failed_with_one_line(result, alone=True) == (f"error: checkpoint {tmp_path / 'nope.pt'} not found: pass a "
                                                        "model.pt export, a Composer checkpoint, or a run folder")


@pytest.mark.s3
def test_export_from_s3(s3_env, tmp_path):
    src = tiny_export(tmp_path)
    s3_env.client().upload_file(str(src), s3_env.bucket, "runs/hf/model.pt")
    export_hf.main([f"s3://{s3_env.bucket}/runs/hf", str(tmp_path / "hf")])  # a run folder on S3
    local = tmp_path / "local"
    export_hf.main([str(src), str(local)])
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == (local / "model.safetensors").read_bytes()
