"""The GPT-2 tokenizer, loaded from the vocabulary file that ships with this repo (assets/r50k_base.tiktoken, checked
by its sha256): no download, ever, so tokenizing works on air-gapped clusters and in CI. `gpt2()` is a
tiktoken.Encoding with the same ids as tiktoken.get_encoding("gpt2"). Details: docs/prepare.md."""

from __future__ import annotations

import binascii
import functools
import hashlib
from pathlib import Path

GPT2_NAMES = ("gpt2", "r50k_base")  # tiktoken's names for the same vocabulary
BPE_FILE = Path(__file__).resolve().parent.parent / "assets" / "r50k_base.tiktoken"
BPE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT = "<|endoftext|>"
EOT_ID = 50256  # GPT-2's end-of-text token: ends every document, starts an unconditional sample
GPT2_VOCAB_SIZE = 50257
# GPT-2's pre-tokenizer (tiktoken_ext.openai_public.r50k_base): contractions, letters, digits, other, spaces
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.lru_cache(maxsize=None)
def gpt2():
    """GPT-2's BPE as a tiktoken.Encoding (cached per process); ValueError if the vocabulary file is damaged."""
    import tiktoken

    data = BPE_FILE.read_bytes()
    if hashlib.sha256(data).hexdigest() != BPE_SHA256:
        raise ValueError(f"{BPE_FILE} is damaged (sha256 mismatch): restore it with `git checkout -- {BPE_FILE.name}`")
    lines = (line.split() for line in data.splitlines() if line)  # "base64-token rank"
    ranks = {binascii.a2b_base64(token): int(rank) for token, rank in lines}
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: EOT_ID}, explicit_n_vocab=GPT2_VOCAB_SIZE)


def get_encoding(name: str = "gpt2"):
    """A tiktoken encoding by name: GPT-2's from this repo's file, any other through tiktoken."""
    if name in GPT2_NAMES:
        return gpt2()
    import tiktoken

    return tiktoken.get_encoding(name)
