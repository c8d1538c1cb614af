"""Hugging Face GPT-2 weights in and out (transformers' GPT2LMHeadModel has model.py's parameter names): train.py's
init_from from a hub name or a folder, and export_hf.py's GPT2LMHeadModel computing what a GPT computes.
`transformers` is imported only inside the functions. Details: docs/huggingface.md."""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn as nn

from model import GPT
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


def hf_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, but read now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def from_hf(hf_model: nn.Module, source: str) -> GPT:
    """Our GPT (CPU, fp32, eval mode) with the weights of a transformers GPT2LMHeadModel.

    Settings of its GPT2Config that our GPT does not implement are a UserError naming the setting.
    """
    c = hf_model.config
    unsupported = [f"{name}={value!r}" for name, value, ok in (
        ("model_type", c.model_type, c.model_type == "gpt2"),
        ("activation_function", c.activation_function, c.activation_function in ("gelu_new", "gelu_pytorch_tanh")),
        ("n_inner", c.n_inner, c.n_inner in (None, 4 * c.n_embd)),
        ("layer_norm_epsilon", c.layer_norm_epsilon, c.layer_norm_epsilon == 1e-5),
        ("scale_attn_weights", c.scale_attn_weights, c.scale_attn_weights),
        ("scale_attn_by_inverse_layer_idx", c.scale_attn_by_inverse_layer_idx, not c.scale_attn_by_inverse_layer_idx),
        ("add_cross_attention", c.add_cross_attention, not c.add_cross_attention),
        ("tie_word_embeddings", c.tie_word_embeddings, c.tie_word_embeddings)) if not ok]
    if unsupported:
        raise UserError(f"{source}: {', '.join(unsupported)} is not a GPT-2 that model.py implements (GPT-2's tanh "
                        "GELU, 4*n_embd MLP, LayerNorm eps 1e-5, tied embeddings)")
    model_args = dict(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                      n_embd=c.n_embd, dropout=0.0, bias=True)
    state = {k: (v.t() if k.endswith(HF_CONV1D) else v).float() for k, v in hf_model.state_dict().items()}
    try:
        return gpt_from_weights(model_args, state, source)
    except ValueError as e:
        raise UserError(str(e)) from None


def to_hf(model: GPT):
    """A transformers GPT2LMHeadModel (CPU, fp32, eval mode) that computes what `model` computes.

    Conv1D weights are transposed; bias=False becomes zero biases (the same function); a vocabulary padded past
    GPT-2's 50,257 tokens (e.g. 50304) is cut back to them: the extra rows are never a real token.
    """
    cfg = unwrap(model).config
    if cfg.vocab_size < GPT2_VOCAB_SIZE:
        raise UserError(f"the model's vocabulary has {cfg.vocab_size} tokens, fewer than GPT-2's {GPT2_VOCAB_SIZE}: "
                        "a Hugging Face GPT-2 export needs a model trained on GPT-2 tokens")
    from transformers import GPT2Config, GPT2LMHeadModel

    state = {}
    for k, v in unwrap(model).state_dict().items():
        v = v.detach().cpu().float()
        if k.endswith(HF_CONV1D):
            v = v.t()
        elif k in ("transformer.wte.weight", "lm_head.weight"):  # one tied matrix, (vocab_size, n_embd)
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
                        tie_word_embeddings=True, architectures=["GPT2LMHeadModel"])
    hf_model = GPT2LMHeadModel(config)
    hf_model.load_state_dict(state, strict=True)
    return hf_model.eval()


def load_hf(spec: str, what: str = "init_from") -> GPT:
    """OpenAI's GPT-2 by hub name (downloaded once into the Hugging Face cache) or a local save_pretrained folder."""
    try:
        from safetensors import SafetensorError
        from transformers import AutoConfig, GPT2LMHeadModel
    except ImportError:
        raise UserError(f"{what}={spec} needs the transformers package: pip install transformers") from None
    local = os.path.isdir(spec)
    offline = local or hf_offline()
    try:
        config = AutoConfig.from_pretrained(spec, local_files_only=offline)
        if config.model_type != "gpt2":
            raise UserError(f"{what}={spec} is a {config.model_type!r} model: model.py is GPT-2 only")
        hf_model = GPT2LMHeadModel.from_pretrained(spec, config=config, local_files_only=offline)
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

    spec: a GPT-2 hub name (HF_GPT2_NAMES), a local Hugging Face GPT-2 folder, or a pile-gpt model.pt / Composer
    checkpoint / run folder, local or s3:// (a custom model's only with model_class, eval.py's --model-class; never
    for init_from). UserError (one line) when it cannot be found or read; messages name the spec as `what`=spec.
    """
    hub, folder = spec in HF_GPT2_NAMES and not os.path.exists(spec), is_hf_folder(spec)
    if model_class is not None and (hub or folder):
        raise UserError(f"{what}={spec} is a Hugging Face GPT-2, not {model_class}: drop --model-class")
    if hub:
        return load_hf(spec, what), f"OpenAI's {spec} (Hugging Face hub)"
    if folder:
        return load_hf(spec, what), f"the Hugging Face GPT-2 folder {spec}"
    refused = ("init_from loads weights into model.py's GPT; your own model trains from scratch (or continues "
               "with autoresume)") if what == "init_from" else None
    if storage.is_remote(spec):
        return load_model(spec, endpoint_url=endpoint_url, model_class=model_class, custom_refused=refused), \
            f"the pile-gpt checkpoint {spec}"
    if not os.path.exists(spec):
        scratch = "scratch, " if what == "init_from" else ""
        raise UserError(f"{what}={spec} not found: pass {scratch}one of {', '.join(HF_GPT2_NAMES)}, a Hugging Face "
                        f"GPT-2 folder, or a pile-gpt {EXPORT_NAME} / Composer checkpoint / run folder")
    path = resolve_local(spec)
    return load_model_file(path, model_class=model_class, custom_refused=refused), f"the pile-gpt checkpoint {path}"
