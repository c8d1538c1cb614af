"""GPT in plain PyTorch: the model that train.py trains and sample.py samples from; GPT-2 by default.

Importable alone (no Composer). The default architecture and parameter names are GPT-2's, so a state dict maps
one to one onto OpenAI's GPT-2 weights (transformer.wte, transformer.wpe, transformer.h.N.ln_1,
.attn.c_attn, .attn.c_proj, .ln_2, .mlp.c_fc, .mlp.c_proj, transformer.ln_f, lm_head). GPTConfig's
architecture fields switch in RoPE, RMSNorm, ReLU² or SwiGLU, grouped-query attention, QK-norm, an untied
head, a logit softcap, per-block residual and x0 scalars, gated value embeddings, and nanochat's parameter-free
RMSNorm, normed embeddings, smear gate, backout and q/k scale
(docs/training.md#architecture).

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256))
    logits, loss = model(x, targets=y)           # x, y: LongTensor (B, T)
    out = model.generate(x, max_new_tokens=50, top_k=200)

Saving and loading trained weights (model.pt exports, Composer checkpoints) is checkpoint.py's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

RMS_NORM_EPS = 1e-5  # RMSNorm's eps (nn.LayerNorm's default too); export_hf.py writes it into the HF config
POS_EMBS, NORMS, MLPS = ("learned", "rope"), ("layernorm", "rmsnorm", "rmsnorm_free"), ("gelu", "relu2", "swiglu")


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest context in tokens (size of the position embedding table)
    vocab_size: int = 50257  # GPT-2 BPE vocabulary; 50304 (a multiple of 64) is faster on GPU
    n_layer: int = 12  # number of transformer blocks
    n_head: int = 12  # attention heads per block; n_embd must be a multiple of it
    n_embd: int = 768  # width of the residual stream (C)
    dropout: float = 0.0  # dropout probability in training; 0.0 for pretraining, 0.1+ for finetuning
    bias: bool = True  # biases in Linear and LayerNorm layers, like GPT-2; False is a bit faster
    pos_emb: str = "learned"  # "learned" (GPT-2's wpe table) or "rope" (rotary, no position parameters)
    rope_theta: float = 10000.0  # RoPE's base: pair i of a head turns by pos * rope_theta^(-2i/head_size)
    norm: str = "layernorm"  # "layernorm" (GPT-2), "rmsnorm" (no mean subtraction, no bias) or "rmsnorm_free" (no gain)
    mlp: str = "gelu"  # "gelu" (GPT-2, 4*n_embd), "relu2" (ReLU², 4*n_embd) or "swiglu" (swiglu_hidden(n_embd))
    n_kv_head: Optional[int] = None  # key/value heads; None = n_head, fewer = grouped-query attention
    qk_norm: bool = False  # normalize each head's q and k (with `norm`'s kind) before RoPE and attention
    tie_embeddings: bool = True  # one matrix for wte and lm_head, like GPT-2; False gives lm_head its own
    logit_softcap: float = 0.0  # logits = softcap * tanh(logits / softcap); 0 = off
    x0_scalars: bool = False  # before block i: x = resid_lambdas[i] * x + x0_lambdas[i] * x0 (learned, from 1 and 0)
    value_embeds: bool = False  # alternating layers (the last too) add a gated token embedding of their own to v
    embed_norm: bool = False  # the token embeddings RMS-normalised (no gain) before anything else sees them
    smear: bool = False  # each position adds a gated share of the previous token's embedding to its own (bigrams)
    backout: bool = False  # the final norm reads x - backout_lambda * (the residual after block n_layer // 2)
    qk_scale: float = 1.0  # q and k times this after QK-norm: 1.2 sharpens attention (scores x 1.44)

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
        for name in ("bias", "qk_norm", "tie_embeddings", "x0_scalars", "value_embeds", "embed_norm", "smear",
                     "backout"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPTConfig.{name} must be True or False, got {getattr(self, name)!r}")
        self._check_architecture()

    def _check_architecture(self) -> None:
        """The architecture fields: known names, and combinations that can be built."""
        for name, allowed in (("pos_emb", POS_EMBS), ("norm", NORMS), ("mlp", MLPS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {getattr(self, name)!r}")
        kv = self.n_kv_head
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.n_head % kv):
            raise ValueError(f"GPTConfig.n_kv_head must be None or a positive divisor of n_head ({self.n_head}), "
                             f"got {kv!r}")
        if self.pos_emb == "rope" and self.head_size % 2:
            raise ValueError(f"GPTConfig: RoPE turns pairs of channels, so the head size n_embd/n_head "
                             f"({self.head_size}) must be even; change n_embd or n_head")
        if not (isinstance(self.rope_theta, (int, float)) and not isinstance(self.rope_theta, bool)
                and self.rope_theta > 0):
            raise ValueError(f"GPTConfig.rope_theta must be a number > 0, got {self.rope_theta!r}")
        if not 1 <= self.rope_theta < math.inf:  # inf: every pair but the first never turns; < 1: the speeds overflow
            raise ValueError(f"GPTConfig.rope_theta must be finite and >= 1 (RoPE's base; 10000 is usual), got "
                             f"{self.rope_theta!r}")
        cap = self.logit_softcap
        if not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap >= 0):
            raise ValueError(f"GPTConfig.logit_softcap must be a number >= 0 (0 = off), got {cap!r}")
        if cap == math.inf:  # inf * tanh(logits / inf) is nan
            raise ValueError("GPTConfig.logit_softcap must be finite (0 = off), got inf")
        scale = self.qk_scale
        if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale < math.inf):
            raise ValueError(f"GPTConfig.qk_scale must be a finite number > 0 (1 = off), got {scale!r}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def mlp_hidden(self) -> int:
        return swiglu_hidden(self.n_embd) if self.mlp == "swiglu" else 4 * self.n_embd


def has_value_embed(layer: int, n_layer: int) -> bool:
    """value_embeds: whether block `layer` has one. Every other block, counted back from the last, which always has
    one (nanochat's choice; modded-nanogpt puts its few at the first and last blocks)."""
    return layer % 2 == (n_layer - 1) % 2


VE_GATE_CHANNELS = 32  # value_embeds: the gate reads the first 32 channels of the block's normed input
SMEAR_CHANNELS = 24  # smear: the gate reads the first 24 channels of the position's embedding


def swiglu_hidden(n_embd: int, multiple_of: int = 256) -> int:
    """SwiGLU's hidden width as Llama chooses it: 2/3 of 4*n_embd (its three matrices then hold about the
    parameters of GELU's two at 4*n_embd), rounded up to a multiple of 256."""
    hidden = int(2 * 4 * n_embd / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


# ---------------------------------------------------------------------------------------------------------
# The parts that GPTConfig switches

# the parameters scalar_lr rates: each mixes another stream into the residual (x0, the previous token, the middle)
MIXING_SCALARS = ("x0_lambdas", "smear_gate.weight", "smear_lambda", "backout_lambda")


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) * weight, over the last dimension (no mean subtraction, no bias); gain=False:
    no weight, y = x / sqrt(mean(x²) + eps) (norm="rmsnorm_free": nothing to learn)."""

    def __init__(self, dim: int, eps: float = RMS_NORM_EPS, gain: bool = True):
        super().__init__()
        self.eps, self.dim = eps, dim
        self.weight = nn.Parameter(torch.ones(dim)) if gain else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the gain in x's dtype: under bf16 autocast an fp32 gain beside bf16 activations takes the unfused path
        weight = None if self.weight is None else self.weight.to(x.dtype)
        return F.rms_norm(x, (self.dim,), weight, self.eps)


def make_norm(config: GPTConfig, dim: int) -> nn.Module:
    if config.norm == "layernorm":
        return nn.LayerNorm(dim, bias=config.bias)
    return RMSNorm(dim, gain=config.norm == "rmsnorm")


def rope_tables(head_size: int, length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (length, head_size/2) of RoPE's angles pos * theta^(-2i/head_size), in fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, T, nh, hs) by position: channel i and i + hs/2 form a pair (a, b) that turns by angle θ,
    (a, b) -> (a cos θ - b sin θ, b cos θ + a sin θ): Llama's (and Hugging Face's) layout of the pairs. Computed in
    x's dtype (bf16 under autocast, as nanochat does): the fp32 tables are cast, (T, hs/2) each, not x upcast."""
    a, b = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype)[None, :, None, :], sin.to(x.dtype)[None, :, None, :]  # (1, T, 1, hs/2)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class CausalSelfAttention(nn.Module):
    """Causal multi-head attention; with n_kv_head < n_head, groups of n_head/n_kv_head query heads share one
    key/value head (grouped-query attention). With a value embedding ve (value_embeds; ResFormer's value residual,
    as nanochat has it): v <- v + gate * ve, one gate in (0, 2) per key/value head and token, 2 sigmoid(ve_gate(x)),
    read from x's first VE_GATE_CHANNELS channels; ve_gate starts at 0, so every gate starts at 1."""

    def __init__(self, config: GPTConfig, value_embed: bool = False):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = config.n_head, config.kv_heads, config.head_size
        self.dropout = config.dropout
        kv_dim = self.n_kv_head * self.head_size
        # q (n_embd), k and v (n_kv_head * head_size each) in one matmul
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        if config.qk_norm:
            self.q_norm, self.k_norm = make_norm(config, self.head_size), make_norm(config, self.head_size)
        self.qk_norm, self.qk_scale = config.qk_norm, config.qk_scale
        if value_embed:
            self.ve_gate = nn.Linear(min(VE_GATE_CHANNELS, config.n_embd), self.n_kv_head, bias=False)

    def forward(self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                ve: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, T, C = x.size()
        kv_dim = self.n_kv_head * self.head_size
        q, k, v = self.c_attn(x).split([C, kv_dim, kv_dim], dim=2)
        q = q.view(B, T, self.n_head, self.head_size)  # (B, T, nh, hs)
        k = k.view(B, T, self.n_kv_head, self.head_size)
        v = v.view(B, T, self.n_kv_head, self.head_size)
        if ve is not None:  # (B, T, kv_dim) from the model's table for this block
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., :self.ve_gate.in_features]))  # (B, T, n_kv_head)
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_kv_head, self.head_size)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.qk_scale != 1.0:
            q, k = q * self.qk_scale, k * self.qk_scale
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        # (B, T, nh, hs) -> (B, nh, T, hs): heads become a batch dimension
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        # Causal mask inside the kernel: flash / memory-efficient attention on GPU, no (T, T) mask tensor.
        # enable_gqa: key/value head j serves query heads j*g .. j*g+g-1 (g = n_head / n_kv_head).
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True,
                                           enable_gqa=self.n_kv_head != self.n_head)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """gelu: c_proj(gelu(c_fc(x))); relu2: c_proj(relu(c_fc(x))²); swiglu: c_proj(silu(gate) * up) where
    c_fc holds gate and up in one matmul (gate the first mlp_hidden rows, up the next)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.kind, hidden = config.mlp, config.mlp_hidden
        self.c_fc = nn.Linear(config.n_embd, (2 if self.kind == "swiglu" else 1) * hidden, bias=config.bias)
        if self.kind == "gelu":
            self.gelu = nn.GELU(approximate="tanh")  # GPT-2's tanh approximation: GPT-2 weights give GPT-2 outputs
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "gelu":
            h = self.gelu(h)
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GPTConfig, value_embed: bool = False):
        super().__init__()
        self.ln_1 = make_norm(config, config.n_embd)
        self.attn = CausalSelfAttention(config, value_embed)
        self.ln_2 = make_norm(config, config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                ve: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), rope, ve)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT needs a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.checkpoint_blocks = False  # True: each Block's activations recomputed in the backward pass, not kept
        parts = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))  # token embeddings
        if config.pos_emb == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd)  # learned position embeddings
        self.transformer = nn.ModuleDict(dict(
            **parts,
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, config.value_embeds and has_value_embed(i, config.n_layer))
                             for i in range(config.n_layer)]),
            ln_f=make_norm(config, config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:  # (as in GPT-2): one (V, C) matrix embeds tokens and scores the next one
            self.transformer.wte.weight = self.lm_head.weight
        if config.x0_scalars:  # modded-nanogpt's and nanochat's: each block also sees the embeddings x0 directly
            self.resid_lambdas = nn.Parameter(torch.ones(config.n_layer))
            self.x0_lambdas = nn.Parameter(torch.zeros(config.n_layer))
        if config.value_embeds:  # one (V, kv_dim) table per block that has a value embedding, keyed by its index
            kv_dim = config.kv_heads * config.head_size
            self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, kv_dim)
                                               for i in range(config.n_layer) if has_value_embed(i, config.n_layer)})
        if config.smear:  # the gate reads the position's own embedding; smear_lambda (from 0) scales it
            self.smear_gate = nn.Linear(min(SMEAR_CHANNELS, config.n_embd), 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        if config.backout:  # how much of the middle block's residual the head stops seeing, learned from 0.2
            self.backout_lambda = nn.Parameter(torch.full((1,), 0.2))
        if config.pos_emb == "rope":  # computed, not learned: not in the state dict
            cos, sin = rope_tables(config.head_size, config.block_size, config.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        # GPT-2 init: each residual branch's output projection gets std 0.02/sqrt(2*n_layer), so the
        # variance added to the residual stream by its 2*n_layer branches does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            elif name.endswith("ve_gate.weight"):
                nn.init.zeros_(p)

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
        x, rope = self.transformer.wte(idx), None  # (B, T, C)
        if self.config.pos_emb == "learned":
            x = x + self.transformer.wpe(torch.arange(0, T, dtype=torch.long, device=idx.device))
        else:
            rope = (self.rope_cos[:T], self.rope_sin[:T])  # (T, hs/2) each
        if self.config.embed_norm:
            x = F.rms_norm(x, (x.size(-1),), eps=RMS_NORM_EPS)
        if self.config.smear:  # position t >= 1: x_t + smear_lambda * sigmoid(smear_gate(x_t)) * x_{t-1}
            gate = self.smear_lambda * torch.sigmoid(self.smear_gate(x[:, 1:, :self.smear_gate.in_features]))
            x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)  # gate: (B, T-1, 1)
        x = x0 = self.transformer.drop(x)
        value_embeds = self.value_embeds if self.config.value_embeds else {}  # block index (str) -> its table
        for i, block in enumerate(self.transformer.h):
            if self.config.x0_scalars:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = value_embeds[str(i)](idx) if str(i) in value_embeds else None
            if self.checkpoint_blocks and torch.is_grad_enabled():  # memory for compute: ~1/3 more FLOPs a step
                x = checkpoint(block, x, rope, ve, use_reentrant=False)
            else:
                x = block(x, rope, ve)
            if self.config.backout and i == self.config.n_layer // 2:
                middle = x
        if self.config.backout:
            x = x - self.backout_lambda * middle
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.softcap(self.lm_head(x))  # (B, T, V)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        logits = self.softcap(self.lm_head(x[:, [-1], :]))  # (B, 1, V); the list index keeps the time dimension
        return logits, None

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """softcap * tanh(logits / softcap): logits kept smoothly inside (-softcap, softcap); 0 = unchanged."""
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

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
        """Number of parameters, a tied wte/lm_head matrix counted once.

        non_embedding=True leaves out the lookup tables: the position embeddings (wpe), as nanoGPT and the
        scaling-law papers count, the value embeddings, and wte when it is untied. A tied wte stays in: as lm_head it
        does a real matmul per token; an untied lm_head is counted as the matmul it is.
        """
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once
        if non_embedding:
            if "wpe" in self.transformer:
                n -= self.transformer.wpe.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.transformer.wte.weight.numel()
            if self.config.value_embeds:
                n -= sum(p.numel() for p in self.value_embeds.parameters())
        return n

    def flops_per_token(self) -> int:
        """Training FLOPs (forward + backward) per token: 6*N + 12*L*H*Q*T.

        N = non-embedding parameters (each does a multiply-add forward, twice that backward: 6 FLOPs); it
        holds the MLP's real width and GQA's smaller k/v projections. The second term is attention's QK^T and
        AV matmuls over a full block of T = block_size tokens with L layers, H query heads of size Q (PaLM
        paper, appendix B; nanoGPT's estimate_mfu). Multiply by tokens per second, divide by the peak: MFU.
        """
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        return 6 * self.num_params(non_embedding=True) + 12 * L * H * Q * T

    def param_parts(self) -> dict[str, list[nn.Parameter]]:
        """Which trainable parameters are which part, for the optimizer's groups (pilegpt/train/optim/groups.py):
        "matrices" the 2-D weights inside the blocks (Muon's), "embedding" the embedding tables (wte once when tied,
        wpe, the value_embeds tables), "head" the untied output head, "scalars" the scalars that mix other streams
        into the residual (x0_lambdas, the smear gate and its lambda, backout_lambda; scalar_lr's)."""
        tables = [m.weight for m in self.modules() if isinstance(m, nn.Embedding) and m.weight.requires_grad]
        return {"matrices": self.hidden_matrices(), "embedding": list({id(p): p for p in tables}.values()),
                "head": [] if self.config.tie_embeddings else [self.lm_head.weight],
                "scalars": [p for name, p in self.named_parameters() if p.requires_grad and name in MIXING_SCALARS]}

    def crop_block_size(self, block_size: int) -> None:
        """Shrink the context length (e.g. to finetune a 1024-context model at 256): cuts wpe's table (RoPE has
        no table to cut, only its angle buffers)."""
        if not 1 <= block_size <= self.config.block_size:
            raise ValueError(f"block_size must be in [1, {self.config.block_size}], got {block_size}")
        self.config.block_size = block_size
        if "wpe" in self.transformer:
            self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())
        else:
            self.rope_cos, self.rope_sin = self.rope_cos[:block_size], self.rope_sin[:block_size]

    @torch.no_grad()
    def zero_output_projections(self) -> None:
        """Set every block's output projections (attention's and the MLP's c_proj) to 0, as nanochat and
        modded-nanogpt initialise them: each block starts as the identity on the residual stream."""
        for block in self.transformer.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.zero_()

    @torch.no_grad()
    def nanochat_init(self) -> None:
        """Re-initialise a new model at nanochat's scales (weight_init="nanochat"): token embeddings N(0, 0.8), an
        untied head N(0, 0.001); the blocks' input matrices (and the value embeddings) uniform with std
        1/sqrt(n_embd), the MLP's c_fc at 0.4 of that, the output projections 0; the residual scalars from 1.15 down to
        1.05 and the x0 scalars from 0.2 down to 0.05 over the blocks; the smear and value-embedding gates uniform in
        [0, 0.02], smear_lambda 0 and backout_lambda 0.2."""
        cfg, bound = self.config, (3 / self.config.n_embd) ** 0.5  # uniform on [-b, b] has std b / sqrt(3)
        nn.init.normal_(self.transformer.wte.weight, std=0.8)
        if not cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=0.001)
        for block in self.transformer.h:
            nn.init.uniform_(block.attn.c_attn.weight, -bound, bound)
            nn.init.uniform_(block.mlp.c_fc.weight, -0.4 * bound, 0.4 * bound)
            if hasattr(block.attn, "ve_gate"):
                nn.init.uniform_(block.attn.ve_gate.weight, 0.0, 0.02)
        self.zero_output_projections()
        depth = torch.arange(cfg.n_layer) / max(cfg.n_layer - 1, 1)  # 0 at the first block, 1 at the last
        if cfg.x0_scalars:
            self.resid_lambdas.copy_(1.15 - 0.10 * depth)
            self.x0_lambdas.copy_(0.20 - 0.15 * depth)
        for table in (self.value_embeds.values() if cfg.value_embeds else ()):
            nn.init.uniform_(table.weight, -bound, bound)
        if cfg.smear:
            nn.init.uniform_(self.smear_gate.weight, 0.0, 0.02)
            self.smear_lambda.zero_()
        if cfg.backout:
            self.backout_lambda.fill_(0.2)

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
