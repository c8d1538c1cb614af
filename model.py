"""GPT-2 in plain PyTorch: the model that train.py trains and sample.py samples from.

Importable alone (no Composer). The architecture and parameter names are GPT-2's, so a state dict maps
one to one onto OpenAI's GPT-2 weights (transformer.wte, transformer.wpe, transformer.h.N.ln_1,
.attn.c_attn, .attn.c_proj, .ln_2, .mlp.c_fc, .mlp.c_proj, transformer.ln_f, lm_head).

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256))
    logits, loss = model(x, targets=y)           # x, y: LongTensor (B, T)
    out = model.generate(x, max_new_tokens=50, top_k=200)

Saving and loading trained weights (model.pt exports, Composer checkpoints) is checkpoint.py's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest context in tokens (size of the position embedding table)
    vocab_size: int = 50257  # GPT-2 BPE vocabulary; 50304 (a multiple of 64) is faster on GPU
    n_layer: int = 12  # number of transformer blocks
    n_head: int = 12  # attention heads per block; n_embd must be a multiple of it
    n_embd: int = 768  # width of the residual stream (C)
    dropout: float = 0.0  # dropout probability in training; 0.0 for pretraining, 0.1+ for finetuning
    bias: bool = True  # biases in Linear and LayerNorm layers, like GPT-2; False is a bit faster

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}); "
                             f"e.g. n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))}")
        dropout_ok = isinstance(self.dropout, (int, float)) and not isinstance(self.dropout, bool)
        if not (dropout_ok and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"GPTConfig.dropout must be a number in [0, 1), got {self.dropout!r}")
        if not isinstance(self.bias, bool):
            raise ValueError(f"GPTConfig.bias must be True or False, got {self.bias!r}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        # Causal mask inside the kernel: flash / memory-efficient attention on GPU, no (T, T) mask tensor.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's tanh approximation, so GPT-2 weights give GPT-2 outputs
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT needs a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),  # token embeddings, shared with lm_head
            wpe=nn.Embedding(config.block_size, config.n_embd),  # learned position embeddings
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying (as in GPT-2): one (V, C) matrix embeds tokens and scores the next one.
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2 init: each residual branch's output projection gets std 0.02/sqrt(2*n_layer), so the
        # variance added to the residual stream by its 2*n_layer branches does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx: LongTensor (B, T) of token ids, T <= block_size.

        With targets (B, T) (the next token at each position; -1 = ignore): returns logits (B, T, V) and
        the mean cross-entropy over the non-ignored positions. Without targets: returns logits for the
        last position only, shape (B, 1, V), and loss None; that is all generation needs, and it skips
        the (B, T, V) lm_head matmul.
        """
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)  # (B, T, V)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        logits = self.lm_head(x[:, [-1], :])  # (B, 1, V); the list index keeps the time dimension
        return logits, None

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens sampled tokens; returns (B, T + max_new_tokens).

        The context is cropped to the last block_size tokens. temperature > 0 scales the logits (lower =
        more conservative); top_k keeps only the k most likely tokens (top_k=1 is greedy decoding). Call
        model.eval() first if the model has dropout.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature} (use top_k=1 for greedy decoding)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            idx = torch.cat((idx, sample_next(logits[:, -1, :], temperature, top_k)), dim=1)
        return idx

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of parameters, the tied wte/lm_head matrix counted once.

        non_embedding=True leaves out the position embeddings (wpe), as nanoGPT and the scaling-law papers
        count; the token embeddings stay in because, tied to lm_head, they do a real matmul per token.
        """
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self) -> int:
        """Training FLOPs (forward + backward) per token: 6*N + 12*L*H*Q*T.

        N = non-embedding parameters (each does a multiply-add forward, twice that backward: 6 FLOPs);
        the second term is attention's QK^T and AV matmuls over a full block of T = block_size tokens
        with L layers, H heads of size Q (PaLM paper, appendix B; nanoGPT's estimate_mfu). Multiply by
        tokens per second and divide by the hardware peak for MFU.
        """
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        return 6 * self.num_params(non_embedding=True) + 12 * L * H * Q * T

    def optim_groups(self, weight_decay: float) -> list[dict]:
        """AdamW parameter groups: weight decay on the 2-D weights (matmuls, embeddings), none on biases
        and LayerNorm gains. Every trainable parameter lands in exactly one group (checked)."""
        params = [p for p in self.parameters() if p.requires_grad]  # the tied matrix appears once
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        ids_decay, ids_no_decay = {id(p) for p in decay}, {id(p) for p in no_decay}
        assert len(ids_decay) == len(decay) and len(ids_no_decay) == len(no_decay), "a parameter is listed twice"
        assert not ids_decay & ids_no_decay, "a parameter is in both groups"
        assert ids_decay | ids_no_decay == {id(p) for p in params}, "a parameter is in no group"
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context length (e.g. to finetune a 1024-context model at 256): cuts wpe's table."""
        if not 1 <= block_size <= self.config.block_size:
            raise ValueError(f"block_size must be in [1, {self.config.block_size}], got {block_size}")
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The 2-D weights inside the transformer blocks (attention and MLP matmuls): what Muon updates
        (optimizer="muon"). Everything else (embeddings, the output head, norms, biases) is AdamW's."""
        return [p for block in self.transformer.h for p in block.parameters() if p.dim() == 2]


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
    """One token id per row of logits (B, V), drawn from softmax(logits / temperature) restricted to the top_k
    most likely tokens (None: all of them); returns (B, 1)."""
    scaled = logits / temperature
    if not torch.isfinite(scaled).all():  # a tiny temperature overflows: scale the gaps to each row's max instead
        gaps = logits - logits.amax(dim=-1, keepdim=True)  # <= 0: the likeliest token 0, the others -inf at worst
        scaled = torch.where(gaps == 0, 0.0, gaps / temperature)  # (0 / 0 when temperature rounds to 0 in fp32)
    logits = scaled
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
