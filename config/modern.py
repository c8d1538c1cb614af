# The model side as the field trains it in 2026, applied after a size preset (it sets no size):
#   python train.py config/quickstart.py config/modern.py
#   composer -n 8 train.py config/pile.py config/modern.py
# RoPE, RMSNorm, ReLU² MLP, QK-norm, an untied output head, no biases, and Muon (with NorMuon's per-neuron
# normalisation) for the blocks' matrices, AdamW's own rates for the embedding and the head (the choices of nanochat
# and modded-nanogpt). bench/bench_recipe.py and the size ladder chose them: on the quickstart this preset reaches
# GPT-2's final val loss in 0.22x its steps and 0.25x its CPU time at 2 threads (docs/performance.md#recipes).
# A logit softcap bought nothing there and cost 25% per step, so it is off; mlp = "swiglu" was within noise of
# ReLU². export_hf.py writes this model as a stock Qwen3ForCausalLM (ReLU² as a gated ReLU MLP with gate = up:
# docs/huggingface.md).
import os

# The run is named after this file (runs/modern, or $RUN_NAME), so that it never autoresumes the size preset's own
# GPT-2 run in runs/quickstart or runs/pile-gpt2-124m.
run_name = os.environ.get("RUN_NAME")  # None: the last config file's name, "modern"
pos_emb = "rope"
norm = "rmsnorm"
mlp = "relu2"
qk_norm = True
tie_embeddings = False
logit_softcap = 0.0
bias = False
# Muon (pilegpt/train/optim/muon.py) for the 2-D weights inside the blocks at muon_lr; AdamW keeps the size preset's
# learning_rate for the norms and takes embedding_lr and head_lr (below) for the embedding and the head. The warmup
# and cosine schedule scale every rate alike. The same rates at every width: on the size ladder, AdamW's scaled by
# (128 / n_embd) ** 0.5 (lr_base_width=128, nanochat's rule) lost in both seeds at 192 and 256 wide
# (docs/performance.md#the-recipes-as-the-model-grows). Muon's 0.005: of 0.0025, 0.005 and 0.01 on this preset, the
# middle one ended lowest at 4 x 128 and 6 x 256 in both seeds, as 0.01 had of 0.01, 0.02 and 0.04: the best rate
# does not move with the width (docs/performance.md#muons-rate-on-todays-preset).
optimizer = "muon"
muon_lr = 0.005
muon_momentum = 0.95
# NorMuon (each output neuron's update evened out by its second moment): on the size ladder it lowered the val loss
# at 4 x 128 and 6 x 256 in both seeds (-0.027 to -0.067); momentum warmup, zero-init projections, cautious weight
# decay and x0 scalars did not pay at both sizes in both seeds (docs/performance.md#the-2026-options-on-the-ladder)
muon_normuon = True
# AdamW's own rates for the embedding table and the untied head, and its beta1 (nanochat gives its embedding and
# unembedding rates of their own, and AdamW beta1 0.8): together they lowered the ladder's val loss by 0.23-0.24 at
# 4 x 128 and 0.11-0.14 at 6 x 256, in both seeds (docs/performance.md#the-embeddings-and-the-heads-own-rates).
# Like muon_lr, the same at every width; at 124M no run has measured them.
embedding_lr = 0.05
head_lr = 0.008
beta1 = 0.8
