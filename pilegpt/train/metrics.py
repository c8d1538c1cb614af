"""The metrics train.py reports on its evaluation sets: cross-entropy and perplexity from the loss the forward pass
already computed, and bits per byte (bpb), the loss comparable across tokenizers (docs/evaluation.md).

    metric = BitsPerByte(token_bytes("gpt2", vocab_size=50304)); metric.update(logits, targets); metric.compute()
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from composer.metrics.nlp import LanguageCrossEntropy, LanguagePerplexity
from torchmetrics import Metric

from pilegpt.tokenizer import get_encoding


class _FromLoss:
    """Cross-entropy metric state (sum of token losses, token count) updated from the loss the forward pass
    already computed, instead of a second cross-entropy over the (B*T, V) logits."""

    def update(self, loss: torch.Tensor, num_tokens: torch.Tensor) -> None:
        self.sum_loss += loss.detach().float() * num_tokens
        self.total_items += num_tokens


class CrossEntropyFromLoss(_FromLoss, LanguageCrossEntropy):
    pass


class PerplexityFromLoss(_FromLoss, LanguagePerplexity):
    pass


@functools.lru_cache(maxsize=None)
def token_bytes(tokenizer: str, vocab_size: int) -> np.ndarray:
    """(vocab_size,) int64: the UTF-8 bytes each token id stands for; 0 for special tokens and padding ids."""
    enc = get_encoding(tokenizer)
    table = np.zeros(vocab_size, dtype=np.int64)
    special = set(enc.special_tokens_set) if hasattr(enc, "special_tokens_set") else set()
    special_ids = {enc.encode_single_token(s) for s in special}
    for i in range(min(vocab_size, enc.n_vocab)):
        if i not in special_ids:
            try:
                table[i] = len(enc.decode_single_token_bytes(i))
            except KeyError:  # an id the encoding leaves unused
                pass
    return table


class BitsPerByte(Metric):
    """Bits per byte of the targets, summed over batches and ranks: update(logits (B, T, V), targets (B, T)).

    nanochat's definition: each target token's loss in nats, divided by ln 2, summed, over the total number of
    UTF-8 bytes those tokens stand for; tokens that stand for no text (<|endoftext|>, ids past the tokenizer's
    vocabulary) are left out of both sums. With no byte at all (every target <|endoftext|>) there is no figure: NaN,
    which MetricsLog records as null and prints as none (as eval.py's Pile BPB gives none), never 0."""

    full_state_update = False

    def __init__(self, byte_table: np.ndarray):
        super().__init__(dist_sync_on_step=False)
        self.register_buffer("byte_table", torch.from_numpy(np.asarray(byte_table, dtype=np.int64)),
                             persistent=False)
        self.add_state("sum_bits", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("sum_bytes", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        targets = targets.reshape(-1)
        valid = targets >= 0
        nbytes = torch.where(valid, self.byte_table.to(targets.device)[targets.clamp(min=0)], 0)
        losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets, ignore_index=-1,
                                 reduction="none")
        counted = nbytes > 0
        self.sum_bits += (losses[counted].double().sum() / math.log(2)).to(self.sum_bits.device)
        self.sum_bytes += nbytes.sum().to(self.sum_bytes.device)

    def compute(self) -> torch.Tensor:
        if int(self.sum_bytes) == 0:
            return torch.tensor(math.nan, dtype=torch.float64, device=self.sum_bits.device)
        return self.sum_bits / self.sum_bytes
