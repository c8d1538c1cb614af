"""A model of your own, trained by train.py without changing it: a small GPT variant with parallel blocks (GPT-J and
PaLM: attention and MLP read the same normalised input, x + attn(n(x)) + mlp(n(x))), RMSNorm, a ReLU² MLP and an
output head apart from the token embedding. Pure PyTorch; the contract is forward(idx, targets=None) -> (logits, loss).

    python train.py config/tiny.py --model_class=examples.my_model:MyGPT       # its defaults fit config/tiny.py
    python train.py config/my_model.py                                         # model_class and model_args in a file
    python sample.py --checkpoint runs/my_model --model-class examples.my_model:MyGPT

It has no optim_groups, flops_per_token or generate, so train.py uses its defaults for them (docs/extending.md).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * weight: LayerNorm without the mean and the bias."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class ParallelBlock(nn.Module):
    """One norm, then causal self-attention and a ReLU² MLP side by side, both added to the residual stream."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.norm = RMSNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.attn_out = nn.Linear(n_embd, n_embd, bias=False)
        self.up = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.down = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        h = self.norm(x)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.qkv(h).split(C, dim=2))  # each (B, heads, T, head size)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        return x + self.attn_out(attn) + self.down(F.relu(self.up(h)).square())


class MyGPT(nn.Module):
    """Token and position embeddings, n_layer parallel blocks, a final RMSNorm and an untied head."""

    def __init__(self, vocab_size: int = 50257, block_size: int = 64, n_layer: int = 2, n_head: int = 2,
                 n_embd: int = 64):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        self.block_size = block_size  # train.py, sample.py and eval.py read the context length here
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(ParallelBlock(n_embd, n_head) for _ in range(n_layer))
        self.norm = RMSNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2's init; the projections into the residual stream scaled by its depth
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("attn_out.weight", "down.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx (B, T) token ids -> logits (B, T, V), and with targets (B, T; -1 = ignored) their mean cross-entropy."""
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
