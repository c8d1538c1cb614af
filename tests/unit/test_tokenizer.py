"""tokenizer.py: GPT-2's BPE from the file in assets/, with the ids of tiktoken's "gpt2" (pinned here from
tiktoken 0.x's own "gpt2" encoding, so the test needs no download)."""

import hashlib

import numpy as np
import pytest

from helpers import SHAKESPEARE
from pilegpt import tokenizer

MIXED = "Hello world! It\u2019s 2026\u2014caf\u00e9 na\u00efve \u6771\u4eac \U0001F600\n\n   indented\tx<|endoftext|>"
MIXED_IDS = [15496, 995, 0, 632, 447, 247, 82, 1160, 2075, 960, 66, 1878, 2634, 41492, 10545, 251, 109, 12859, 105,
             30325, 222, 628, 220, 220, 773, 4714, 197, 87, 50256]
# tiktoken.get_encoding("gpt2").encode_ordinary(tiny Shakespeare) as uint16: count and sha256
SHAKESPEARE_TOKENS = (338025, "25c01b32b32f41897a6359dd222ec114992dc30c357bcafbfe6c56672f76cd31")


def test_gpt2_ids_equal_tiktokens_gpt2():
    enc = tokenizer.gpt2()
    assert enc.encode(MIXED, allowed_special="all") == MIXED_IDS
    assert (enc.n_vocab, enc.eot_token) == (50257, 50256)
    assert enc.decode(MIXED_IDS) == MIXED
    ids = np.array(enc.encode_ordinary(SHAKESPEARE.read_text()), dtype=np.uint16)
    assert (len(ids), hashlib.sha256(ids.tobytes()).hexdigest()) == SHAKESPEARE_TOKENS


def test_gpt2_and_r50k_base_are_the_same_encoding_and_load_once():
    assert tokenizer.get_encoding("gpt2") is tokenizer.get_encoding("r50k_base") is tokenizer.gpt2()


def test_a_damaged_vocabulary_file_is_a_clear_error(tmp_path, monkeypatch):
    damaged = tmp_path / "r50k_base.tiktoken"
    damaged.write_bytes(tokenizer.BPE_FILE.read_bytes()[:-10])
    monkeypatch.setattr(tokenizer, "BPE_FILE", damaged)
    tokenizer.gpt2.cache_clear()
    try:
        with pytest.raises(ValueError, match="damaged \\(sha256 mismatch\\)"):
            tokenizer.gpt2()
    finally:
        tokenizer.gpt2.cache_clear()
