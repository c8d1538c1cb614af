"""Models of the user's own (model_contract.py's contract) for train.py's command line in tests, by import path
(tests/ is on a train.py process's PYTHONPATH: helpers.train_env): one that takes a tuple, and ones that break the
contract only where the check at T=4 never looked (at block_size, in hidden_matrices())."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Widths(nn.Module):
    """A bigram model through hidden layers of the given widths (a tuple): (vocab) -> widths... -> (vocab)."""

    def __init__(self, vocab_size: int = 50257, widths: tuple = (16,), block_size: int = 32):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, widths[0])
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1], vocab_size, bias=False)

    def hidden_matrices(self) -> list:
        return [layer.weight for layer in self.hidden]

    def forward(self, idx, targets=None):
        x = self.wte(idx)
        for layer in self.hidden:
            x = F.relu(layer(x))
        logits = self.head(x)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss


class SixteenPositions(Widths):
    """A position table of 16 rows and no stated context: fine at T=4, an IndexError past 16 positions."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.block_size = None  # states no context
        self.wpe = nn.Embedding(16, self.wte.embedding_dim)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        logits = self.head(x)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss


class LastSixteen(Widths):
    """Logits for the last 16 positions only: (B, T, V) at T=4, (B, 16, V) at block_size=32."""

    def forward(self, idx, targets=None):
        idx, targets = idx[:, -16:], None if targets is None else targets[:, -16:]
        return super().forward(idx, targets)


class OneDHidden(Widths):
    """hidden_matrices() with a bias (1-D) among them."""

    def hidden_matrices(self) -> list:
        return [*super().hidden_matrices(), self.hidden[0].bias]


class ForeignHidden(Widths):
    """hidden_matrices() with a matrix that is not one of the model's parameters."""

    def hidden_matrices(self) -> list:
        return [nn.Parameter(torch.zeros(4, 4))]


class NoHidden(Widths):
    """hidden_matrices() that returns nothing: Muon would update nothing."""

    def hidden_matrices(self) -> list:
        return []


class FailingHidden(Widths):
    """hidden_matrices() that raises."""

    def hidden_matrices(self) -> list:
        raise AttributeError("'FailingHidden' object has no attribute 'blocks'")
