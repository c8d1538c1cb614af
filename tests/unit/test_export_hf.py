"""export_hf.py in this process: GPT-2's byte map, and the OUT_DIRs it refuses (inside, around or onto the run, a run
folder even with --overwrite) and vocabularies too small for GPT-2; every architecture variant that a Hugging Face
class computes exported with our logits and read back by init_from, and the others refused in one line. A train.py
run's export, loaded in transformers: tests/e2e/test_export_hf.py."""

import re

import pytest
import torch

import export_hf
from helpers import fake_run_folder, tiny_export
from model import GPT, GPTConfig
from pilegpt import hf
from pilegpt.common import UserError


def test_byte_map_is_gpt2s():
    m = export_hf.bytes_to_unicode()
    assert len(set(m.values())) == 256
    assert m[ord("A")] == "A" and m[ord(" ")] == "Ġ" and m[ord("\n")] == "Ċ" and m[0] == "Ā"


@pytest.mark.parametrize("src, out, where", [
    ("run", "run/hf", "lies inside the run folder"),
    ("run/model.pt", "run", "is the folder of"),
    ("run/model.pt", "run/sub/hf", "lies inside the folder of"),
    ("run", ".", "contains the run folder"),
    ("run", "link", "is the run folder"),  # a symlink to the run
    ("link/model.pt", "run/../run", "is the folder of"),
])
def test_an_out_dir_that_is_contains_or_lies_inside_the_source_is_refused(tmp_path, monkeypatch, src, out, where):
    before = fake_run_folder(tmp_path / "run")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=rf"^OUT_DIR {re.escape(out)} {where} {re.escape(src)} "):
        export_hf.main([src, out, "--overwrite"])
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before


def test_overwrite_never_replaces_a_run_folder(tmp_path):
    before = fake_run_folder(tmp_path / "run")
    (tmp_path / "run" / "model.safetensors").write_bytes(b"x")  # even one that looks half like an export
    (tmp_path / "other").mkdir()
    with pytest.raises(UserError, match=r"run is not an earlier export \(it holds ep0-ba3-rank0.pt, model.pt\)"):
        export_hf.main([str(tiny_export(tmp_path / "other")), str(tmp_path / "run"), "--overwrite"])
    assert {p.name for p in (tmp_path / "run").iterdir()} == {*before, "model.safetensors"}


def test_small_vocabulary_is_refused(tmp_path):
    src = tiny_export(tmp_path, vocab_size=64)
    with pytest.raises(UserError, match="vocabulary has 64 tokens, fewer than GPT-2's 50257"):
        export_hf.main([str(src), str(tmp_path / "hf")])
    assert not (tmp_path / "hf").exists()


# --------------------------------------------------------------------------------------------------------
# Architecture variants: which Hugging Face class, the same logits, and back

LLAMA = dict(pos_emb="rope", norm="rmsnorm", mlp="swiglu", bias=False)
VARIANTS = {  # name: (GPTConfig overrides, the class that computes it)
    "gpt2-untied": (dict(tie_embeddings=False), "GPT2LMHeadModel"),
    "llama": (LLAMA, "LlamaForCausalLM"),
    "llama-gqa-untied": ({**LLAMA, "n_kv_head": 2, "tie_embeddings": False, "rope_theta": 500.0}, "LlamaForCausalLM"),
    "qwen3-mqa": ({**LLAMA, "n_kv_head": 1, "qk_norm": True}, "Qwen3ForCausalLM"),
    # config/modern.py's model: ReLU² as a ReLU gated MLP with gate = up
    "modern-relu2": ({**LLAMA, "mlp": "relu2", "qk_norm": True, "tie_embeddings": False}, "Qwen3ForCausalLM"),
    "llama-relu2": ({**LLAMA, "mlp": "relu2"}, "LlamaForCausalLM"),
}


def variant(seed: int = 0, **overrides) -> GPT:
    """A tiny GPT on GPT-2's vocabulary (padded), its weights moved off their init (norm gains of 1, zero biases)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=24, vocab_size=50304, n_layer=2, n_head=4, n_embd=32, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_exportable_variant_computes_our_logits_and_reads_back(tmp_path, name):
    overrides, hf_class = VARIANTS[name]
    model = variant(**overrides)
    x = torch.randint(0, 50257, (2, 24))
    ours = model(x, targets=x)[0][..., :50257]
    export_hf.export(model, tmp_path / "hf")
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True).eval()
    assert type(loaded).__name__ == hf_class
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, ours, rtol=0, atol=1e-5)
    back, origin = hf.load_pretrained(str(tmp_path / "hf"))  # init_from's path
    assert back.config == GPTConfig(**{**model.config.__dict__, "vocab_size": 50257})
    assert origin.startswith("the Hugging Face ") and origin.endswith(f" folder {tmp_path / 'hf'}")
    torch.testing.assert_close(back(x, targets=x)[0], ours, rtol=0, atol=1e-5)


@pytest.mark.parametrize("overrides, named", [
    (dict(mlp="relu2"), "pos_emb='learned' with mlp='relu2'"),
    ({**LLAMA, "mlp": "relu2", "logit_softcap": 15.0}, "pos_emb='rope' with logit_softcap=15.0"),
    (dict(logit_softcap=30.0), "pos_emb='learned' with logit_softcap=30.0"),
    (dict(norm="rmsnorm"), "pos_emb='learned' with norm='rmsnorm'"),
    (dict(n_kv_head=2, n_embd=16), "pos_emb='learned' with n_kv_head=2"),
    ({**LLAMA, "bias": True}, "pos_emb='rope' with bias=True"),
    ({**LLAMA, "mlp": "gelu"}, "pos_emb='rope' with mlp='gelu'"),
    ({**LLAMA, "x0_scalars": True}, "pos_emb='rope' with x0_scalars=True"),
    ({**LLAMA, "value_embeds": True}, "pos_emb='rope' with value_embeds=True"),
])
def test_a_variant_no_hugging_face_class_computes_is_refused_in_one_line(tmp_path, overrides, named):
    src = tiny_export(tmp_path, **{"n_head": 4, "n_embd": 16, **overrides})
    with pytest.raises(UserError, match=rf"^no Hugging Face class computes this model \({re.escape(named)}") as e:
        export_hf.main([str(src), str(tmp_path / "hf")])
    assert "\n" not in str(e.value)
    assert not (tmp_path / "hf").exists()


def test_a_llama_folder_model_py_cannot_compute_is_refused_naming_the_setting(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=100, num_hidden_layers=1,
                         num_attention_heads=4, rms_norm_eps=1e-6, max_position_embeddings=16)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    with pytest.raises(UserError, match=r"intermediate_size=100, rms_norm_eps=1e-06 is not a llama that model.py "
                                        r"implements \(SiLU SwiGLU of width 256"):
        hf.load_pretrained(str(tmp_path / "llama"))


def test_a_relu_gated_folder_whose_gate_and_up_differ_is_refused_naming_the_layer(tmp_path):
    """A ReLU gated MLP is model.py's ReLU² only with gate = up: any other such folder is refused, not misread."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, rms_norm_eps=1e-5, max_position_embeddings=16, hidden_act="relu")
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    with pytest.raises(UserError, match=r"layer 0's mlp.gate_proj and mlp.up_proj differ: a ReLU gated MLP is "):
        hf.load_pretrained(str(tmp_path / "llama"))
