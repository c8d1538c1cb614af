"""Hugging Face weights in and out: train.py's init_from from a hub name or a folder, and export_hf.py's model
computing what a GPT computes: GPT2LMHeadModel for GPT-2 (model.py's parameter names), LlamaForCausalLM for RoPE +
RMSNorm + SwiGLU, Qwen3ForCausalLM for that with QK-norm. `transformers` is imported only inside the functions.
Details: docs/huggingface.md."""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn as nn

from model import GPT, RMS_NORM_EPS, GPTConfig, swiglu_hidden
from pilegpt import storage
from pilegpt.checkpoint import EXPORT_NAME, gpt_from_weights, load_model, load_model_file, resolve_local, unwrap
from pilegpt.common import UserError, one_line
from pilegpt.tokenizer import EOT_ID, GPT2_VOCAB_SIZE

HF_GPT2_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's GPT-2 on the Hugging Face hub
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json")  # what makes a folder a save_pretrained folder
# GPT-2 stores these matmuls as Conv1D, whose weight is (in, out): the transpose of nn.Linear's (out, in).
HF_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
LAYER_BIASES = {"ln_1.bias": 1, "attn.c_attn.bias": 3, "attn.c_proj.bias": 1, "ln_2.bias": 1, "mlp.c_fc.bias": 4,
                "mlp.c_proj.bias": 1}  # a block's biases, as multiples of n_embd (HF GPT-2 always has them)
HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}  # by model_type
# Llama's and Qwen3's names of a block's weights (model.layers.N.*) for ours (transformer.h.N.*); a fused matrix of
# ours is theirs stacked by rows: c_attn = [q; k; v], c_fc = [gate; up] (model.py's MLP). A ReLU² MLP is their gated
# MLP with hidden_act "relu" and gate = up = our c_fc: relu(z) * z is relu(z)² exactly (z > 0: z * z; else 0).
LLAMA_LAYER = {"ln_1.weight": ("input_layernorm.weight",),
               "attn.c_attn.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
               "attn.c_proj.weight": ("self_attn.o_proj.weight",), "ln_2.weight": ("post_attention_layernorm.weight",),
               "mlp.c_fc.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
               "mlp.c_proj.weight": ("mlp.down_proj.weight",)}
# What each family of Hugging Face classes needs of a GPT, by its pos_emb (any bias and tie for GPT-2; any n_kv_head
# and tie for Llama, and qk_norm makes it a Qwen3)
HF_NEEDS = {
    "learned": ("GPT2LMHeadModel needs", dict(norm="layernorm", mlp="gelu", n_kv_head=None, qk_norm=False,
                                              logit_softcap=0.0, x0_scalars=False, value_embeds=False,
                                              embed_norm=False, smear=False, backout=False, qk_scale=1.0)),
    "rope": ("LlamaForCausalLM / Qwen3ForCausalLM need", dict(norm="rmsnorm", mlp=("swiglu", "relu2"), bias=False,
                                                               logit_softcap=0.0, x0_scalars=False,
                                                               value_embeds=False, embed_norm=False, smear=False,
                                                               backout=False, qk_scale=1.0)),
}  # a tuple: any of these values
HF_ACT = {"swiglu": "silu", "relu2": "relu"}  # Llama's / Qwen3's hidden_act for our MLP
QK_NORM_LAYER = {"attn.q_norm.weight": ("self_attn.q_norm.weight",), "attn.k_norm.weight": ("self_attn.k_norm.weight",)}


def hf_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, but read now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hf_model_type(cfg: GPTConfig) -> str:
    """The Hugging Face model_type that computes what a GPT of this config computes, or a UserError naming the
    settings that none does (a logit softcap, learned positions with RMSNorm, ...)."""
    classes, needs = HF_NEEDS[cfg.pos_emb]
    have = {**{name: getattr(cfg, name) for name in needs}, "n_kv_head": None if cfg.kv_heads == cfg.n_head else
            cfg.n_kv_head}
    wrong = [f"{name}={have[name]!r}" for name, value in needs.items()
             if have[name] not in (value if isinstance(value, tuple) else (value,))]
    if wrong:
        raise UserError(f"no Hugging Face class computes this model (pos_emb={cfg.pos_emb!r} with {', '.join(wrong)}): "
                        f"{classes} {', '.join(f'{k}={v!r}' for k, v in needs.items())}; the model stays usable "
                        "with sample.py and eval.py")
    return "gpt2" if cfg.pos_emb == "learned" else "qwen3" if cfg.qk_norm else "llama"


def from_hf(hf_model: nn.Module, source: str) -> GPT:
    """Our GPT (CPU, fp32, eval mode) with the weights of a transformers GPT2LMHeadModel, LlamaForCausalLM or
    Qwen3ForCausalLM. Settings of its config that our GPT does not implement are a UserError naming the setting."""
    c = hf_model.config
    if c.model_type in ("llama", "qwen3"):
        model_args, state = llama_args(c, source), llama_state_to_ours(hf_model.state_dict(), c, source)
    else:
        model_args, state = gpt2_args(c, source), {k: (v.t() if k.endswith(HF_CONV1D) else v).float()
                                                    for k, v in hf_model.state_dict().items()}
    try:
        return gpt_from_weights(model_args, state, source)
    except ValueError as e:
        raise UserError(str(e)) from None


def gpt2_args(c, source: str) -> dict:
    """GPTConfig fields of a transformers GPT2Config; a UserError naming what model.py does not implement."""
    unsupported = [f"{name}={value!r}" for name, value, ok in (
        ("model_type", c.model_type, c.model_type == "gpt2"),
        ("activation_function", c.activation_function, c.activation_function in ("gelu_new", "gelu_pytorch_tanh")),
        ("n_inner", c.n_inner, c.n_inner in (None, 4 * c.n_embd)),
        ("layer_norm_epsilon", c.layer_norm_epsilon, c.layer_norm_epsilon == 1e-5),
        ("scale_attn_weights", c.scale_attn_weights, c.scale_attn_weights),
        ("scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx, not c.scale_attn_by_inverse_layer_idx),
        ("add_cross_attention", c.add_cross_attention, not c.add_cross_attention)) if not ok]
    if unsupported:
        raise UserError(f"{source}: {', '.join(unsupported)} is not a GPT-2 that model.py implements (GPT-2's tanh "
                        "GELU, 4*n_embd MLP, LayerNorm eps 1e-5)")
    return dict(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                n_embd=c.n_embd, dropout=0.0, bias=True, tie_embeddings=bool(c.tie_word_embeddings))


def llama_args(c, source: str) -> dict:
    """GPTConfig fields of a transformers LlamaConfig or Qwen3Config; a UserError naming what model.py does not
    implement (its SwiGLU width is computed from n_embd, its RMSNorm eps fixed)."""
    head_size = c.hidden_size // c.num_attention_heads
    mlp = {v: k for k, v in HF_ACT.items()}.get(c.hidden_act)
    width = swiglu_hidden(c.hidden_size) if mlp == "swiglu" else 4 * c.hidden_size
    unsupported = [f"{name}={value!r}" for name, value, ok in (
        ("hidden_act", c.hidden_act, mlp is not None),
        ("intermediate_size", c.intermediate_size, c.intermediate_size == width),
        ("head_dim", getattr(c, "head_dim", None), getattr(c, "head_dim", None) in (None, head_size)),
        ("rms_norm_eps", c.rms_norm_eps, c.rms_norm_eps == RMS_NORM_EPS),
        ("rope_scaling", c.rope_scaling, not c.rope_scaling),
        ("attention_bias", c.attention_bias, not c.attention_bias),
        ("mlp_bias", getattr(c, "mlp_bias", False), not getattr(c, "mlp_bias", False)),
        ("use_sliding_window", getattr(c, "use_sliding_window", False), not getattr(c, "use_sliding_window", False)),
    ) if not ok]
    if unsupported:
        raise UserError(f"{source}: {', '.join(unsupported)} is not a {c.model_type} that model.py implements "
                        f"(SiLU SwiGLU of width {swiglu_hidden(c.hidden_size)} or ReLU² of width {4 * c.hidden_size}, "
                        f"head size hidden_size/heads, RMSNorm eps {RMS_NORM_EPS}, plain RoPE, no biases)")
    kv = c.num_key_value_heads or c.num_attention_heads
    return dict(block_size=c.max_position_embeddings, vocab_size=c.vocab_size, n_layer=c.num_hidden_layers,
                n_head=c.num_attention_heads, n_embd=c.hidden_size, dropout=0.0, bias=False, pos_emb="rope",
                rope_theta=float(c.rope_theta), norm="rmsnorm", mlp=mlp,
                n_kv_head=None if kv == c.num_attention_heads else kv, qk_norm=c.model_type == "qwen3",
                tie_embeddings=bool(c.tie_word_embeddings))


def llama_layer_names(qk_norm: bool, relu2: bool = False) -> dict:
    """Our block's weight names -> theirs; with relu2, c_fc is gate_proj alone (up_proj is a copy of it)."""
    return {**LLAMA_LAYER, **(QK_NORM_LAYER if qk_norm else {}),
            **({"mlp.c_fc.weight": ("mlp.gate_proj.weight",)} if relu2 else {})}


def llama_state_to_ours(hf_state: dict, c, source: str = "the model") -> dict:
    """Our state dict from a LlamaForCausalLM's / Qwen3ForCausalLM's (fused matrices stacked back together; a ReLU
    gated MLP is our ReLU² one only where its gate and up matrices are equal)."""
    hf_state = {k: v.float() for k, v in hf_state.items()}
    if c.hidden_act == HF_ACT["relu2"]:
        for i in range(c.num_hidden_layers):
            gate, up = (hf_state.pop(f"model.layers.{i}.mlp.{n}_proj.weight") for n in ("gate", "up"))
            if not torch.equal(gate, up):
                raise UserError(f"{source}: layer {i}'s mlp.gate_proj and mlp.up_proj differ: a ReLU gated MLP is "
                                "model.py's ReLU² MLP only with gate = up (what export_hf.py writes)")
            hf_state[f"model.layers.{i}.mlp.gate_proj.weight"] = gate
    state = {"transformer.wte.weight": hf_state["model.embed_tokens.weight"],
             "transformer.ln_f.weight": hf_state["model.norm.weight"],
             "lm_head.weight": hf_state.get("lm_head.weight", hf_state["model.embed_tokens.weight"])}
    for i in range(c.num_hidden_layers):
        for ours, theirs in llama_layer_names(c.model_type == "qwen3", c.hidden_act == HF_ACT["relu2"]).items():
            state[f"transformer.h.{i}.{ours}"] = torch.cat([hf_state[f"model.layers.{i}.{t}"] for t in theirs])
    return state


def llama_state_from_ours(gpt: GPT, vocab_size: int) -> dict:
    """A LlamaForCausalLM's / Qwen3ForCausalLM's state dict from our GPT, the vocabulary cut to vocab_size."""
    cfg = gpt.config
    ours = {k: v.detach().cpu().float() for k, v in gpt.state_dict().items()}
    kv = cfg.kv_heads * cfg.head_size
    rows = {"attn.c_attn.weight": [cfg.n_embd, kv, kv], "mlp.c_fc.weight": [cfg.mlp_hidden] * 2}
    if cfg.mlp == "relu2":
        ours.update({k: torch.cat([v, v]) for k, v in ours.items() if k.endswith("mlp.c_fc.weight")})  # gate = up
    state = {"model.embed_tokens.weight": ours["transformer.wte.weight"][:vocab_size],
             "model.norm.weight": ours["transformer.ln_f.weight"],
             "lm_head.weight": ours["lm_head.weight"][:vocab_size]}
    for i in range(cfg.n_layer):
        for name, theirs in llama_layer_names(cfg.qk_norm).items():
            weight = ours[f"transformer.h.{i}.{name}"]
            parts = weight.split(rows[name]) if name in rows else [weight]
            state.update({f"model.layers.{i}.{t}": part for t, part in zip(theirs, parts)})
    return {k: v.contiguous() for k, v in state.items()}


def to_hf(model: GPT):
    """A transformers model (CPU, fp32, eval mode) that computes what `model` computes: hf_model_type's class.

    A vocabulary padded past GPT-2's 50,257 tokens (e.g. 50304) is cut back to them: the extra rows are never a
    real token.
    """
    cfg = unwrap(model).config
    model_type = hf_model_type(cfg)
    if cfg.vocab_size < GPT2_VOCAB_SIZE:
        raise UserError(f"the model's vocabulary has {cfg.vocab_size} tokens, fewer than GPT-2's {GPT2_VOCAB_SIZE}: "
                        "a Hugging Face export needs a model trained on GPT-2 tokens")
    if model_type == "gpt2":
        return to_hf_gpt2(unwrap(model))
    import transformers

    common = dict(vocab_size=GPT2_VOCAB_SIZE, hidden_size=cfg.n_embd, intermediate_size=cfg.mlp_hidden,
                  num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.kv_heads,
                  head_dim=cfg.head_size, max_position_embeddings=cfg.block_size, rms_norm_eps=RMS_NORM_EPS,
                  rope_theta=float(cfg.rope_theta), rope_scaling=None, hidden_act=HF_ACT[cfg.mlp], attention_bias=False,
                  attention_dropout=cfg.dropout, tie_word_embeddings=cfg.tie_embeddings, bos_token_id=EOT_ID,
                  eos_token_id=EOT_ID, architectures=[HF_CLASSES[model_type]])
    if model_type == "llama":
        config = transformers.LlamaConfig(**common, mlp_bias=False)
    else:
        config = transformers.Qwen3Config(**common, use_sliding_window=False)
    hf_model = getattr(transformers, HF_CLASSES[model_type])(config)
    hf_model.load_state_dict(llama_state_from_ours(unwrap(model), GPT2_VOCAB_SIZE), strict=True)
    return hf_model.eval()


def to_hf_gpt2(gpt: GPT):
    """A transformers GPT2LMHeadModel computing what a GPT-2-shaped GPT computes: Conv1D weights transposed,
    bias=False as zero biases (the same function)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = gpt.config
    state = {}
    for k, v in gpt.state_dict().items():
        v = v.detach().cpu().float()
        if k.endswith(HF_CONV1D):
            v = v.t()
        elif k in ("transformer.wte.weight", "lm_head.weight"):  # (vocab_size, n_embd), tied or not
            v = v[:GPT2_VOCAB_SIZE]
        state[k] = v.contiguous()
    if not cfg.bias:
        for i in range(cfg.n_layer):
            state.update({f"transformer.h.{i}.{name}": torch.zeros(m * cfg.n_embd) for name, m in LAYER_BIASES.items()})
        state["transformer.ln_f.bias"] = torch.zeros(cfg.n_embd)
    config = GPT2Config(vocab_size=GPT2_VOCAB_SIZE, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                        n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=None, activation_function="gelu_new",
                        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                        layer_norm_epsilon=1e-5, bos_token_id=EOT_ID, eos_token_id=EOT_ID,
                        tie_word_embeddings=cfg.tie_embeddings, architectures=["GPT2LMHeadModel"])
    hf_model = GPT2LMHeadModel(config)
    hf_model.load_state_dict(state, strict=True)
    return hf_model.eval()


def load_hf(spec: str, what: str = "init_from") -> GPT:
    """OpenAI's GPT-2 by hub name (downloaded once into the Hugging Face cache) or a local save_pretrained folder
    of a GPT-2, Llama or Qwen3 model that model.py computes."""
    try:
        from safetensors import SafetensorError
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise UserError(f"{what}={spec} needs the transformers package: pip install transformers") from None
    local = os.path.isdir(spec)
    offline = local or hf_offline()
    try:
        config = AutoConfig.from_pretrained(spec, local_files_only=offline)
        if config.model_type not in HF_CLASSES:
            raise UserError(f"{what}={spec} is a {config.model_type!r} model: model.py computes "
                            f"{', '.join(HF_CLASSES)} models only")
        hf_model = AutoModelForCausalLM.from_pretrained(spec, config=config, local_files_only=offline,
                                                        torch_dtype=torch.float32)
    except SafetensorError as e:  # a truncated or damaged model.safetensors
        raise UserError(f"init_from={spec}: its .safetensors weights cannot be read ({one_line(e)}): the file is "
                        "damaged or incomplete; copy the folder again or re-save it with save_pretrained") from None
    except OSError as e:  # transformers' error for missing files and for a hub it cannot reach
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        if local:
            raise UserError(f"{what}={spec}: cannot read this Hugging Face folder ({reason})") from None
        raise UserError(f"{what}={spec}: OpenAI's {spec} weights are not in the Hugging Face cache and the hub "
                        f"cannot be reached{' (HF_HUB_OFFLINE is set)' if hf_offline() else ''} ({reason}): download "
                        f"them once with network, or pass a local folder written by save_pretrained") from None
    return from_hf(hf_model, spec)


def is_hf_folder(spec: str) -> bool:
    return os.path.isfile(os.path.join(spec, "config.json")) and any(
        os.path.isfile(os.path.join(spec, name)) for name in HF_WEIGHT_FILES)


def load_pretrained(spec: str, endpoint_url: Optional[str] = None, what: str = "init_from",
                    model_class: Optional[str] = None) -> tuple[nn.Module, str]:
    """The GPT (CPU, eval mode) that train.py's init_from names, and where it came from, in words.

    spec: a GPT-2 hub name (HF_GPT2_NAMES), a local Hugging Face GPT-2 / Llama / Qwen3 folder, or a pile-gpt
    model.pt / Composer checkpoint / run folder, local or s3:// (a custom model's only with model_class, eval.py's
    --model-class; never for init_from). UserError (one line) when it cannot be found or read; messages name the
    spec as `what`=spec.
    """
    hub, folder = spec in HF_GPT2_NAMES and not os.path.exists(spec), is_hf_folder(spec)
    if model_class is not None and (hub or folder):
        raise UserError(f"{what}={spec} is a Hugging Face model, not {model_class}: drop --model-class")
    if hub:
        return load_hf(spec, what), f"OpenAI's {spec} (Hugging Face hub)"
    if folder:
        model = load_hf(spec, what)
        kind = {"gpt2": "GPT-2", "llama": "Llama", "qwen3": "Qwen3"}[hf_model_type(model.config)]
        return model, f"the Hugging Face {kind} folder {spec}"
    refused = ("init_from loads weights into model.py's GPT; your own model trains from scratch (or continues "
               "with autoresume)") if what == "init_from" else None
    if storage.is_remote(spec):
        return load_model(spec, endpoint_url=endpoint_url, model_class=model_class, custom_refused=refused), \
            f"the pile-gpt checkpoint {spec}"
    if not os.path.exists(spec):
        scratch = "scratch, " if what == "init_from" else ""
        raise UserError(f"{what}={spec} not found: pass {scratch}one of {', '.join(HF_GPT2_NAMES)}, a Hugging Face "
                        f"GPT-2 / Llama / Qwen3 folder, or a pile-gpt {EXPORT_NAME} / Composer checkpoint / run folder")
    path = resolve_local(spec)
    return load_model_file(path, model_class=model_class, custom_refused=refused), f"the pile-gpt checkpoint {path}"
