# nanochat's whole recipe (karpathy/nanochat at 92d63d4: its model, its optimizer, its base training's defaults) as
# model.py and Muon express it, applied after a size preset (it sets no size), like config/modern.py:
#   python train.py config/quickstart.py config/nanochat.py
#   composer -n 8 train.py config/pile.py config/nanochat.py
# Measured against nanochat's own code on the same tokens, batches and steps (docs/performance.md#nanochats-recipe):
# the figures there say how close it comes and which of the differences below accounts for the rest.
#
# What nanochat has that this file cannot set, and why:
# - one AdamW beta pair and eps (0.8, 0.95, 1e-8) for every AdamW group; nanochat gives each its own (betas 0.8/0.96
#   on the head, 0.8/0.995 on the embeddings, 0.96 beta1 on x0_lambdas; eps 1e-10) and small weight decays
#   (0.001-0.05, here 0): per-group knobs no other preset would use. The largest missing piece measured: 0.034 of
#   this file's 0.054 above nanochat's own code at 6 x 256, seed 0 (docs/performance.md#nanochats-recipe).
# - the value embeddings at half embedding_lr, the smear and backout scalars at 0.2 (here scalar_lr's 0.5, x0's
#   rate), resid_lambdas at 0.005 at every width (here learning_rate, which lr_base_width scales: 0.012 at 128 wide).
# - Muon: NorMuon's second moment at beta 0.9 (here beta2's 0.95) and over input columns for wide matrices (here
#   always over output rows); MuonEq's row equilibration before orthogonalising and Muon+'s renormalisation after
#   (nanochat's own notes call both slight).
# - the value-embedding gate: 3 sigmoid(.) read from 12 channels (model.py's: 2 sigmoid(.) from 32, kept so that
#   checkpoints with value_embeds still load).
# - short attention windows: nanochat's short window is a quarter of the context rounded up to 128 tokens, the whole
#   context at block_size 128. Not built here: attn_window was removed after ac879ff (within noise on the size
#   ladder, and a mask to SDPA saves nothing: docs/performance.md#short-attention-windows).
# - its rates and weight decay rescaled by batch size and run length (its training script's rules), its BOS-aligned
#   best-fit packing (not built here: doc_aligned was removed after ac879ff, within noise on the size ladder and on
#   short documents: docs/performance.md#document-aligned-batches), bf16 embeddings.
# export_hf.py refuses this model (no Hugging Face class computes smear, backout or value embeddings); sample.py and
# eval.py use it as it is.
import os

# The run is named after this file (runs/nanochat, or $RUN_NAME), so that it never autoresumes the size preset's run.
run_name = os.environ.get("RUN_NAME")  # None: the last config file's name, "nanochat"
# the architecture: RoPE (base 100000), parameter-free RMSNorm everywhere (also on the embeddings and q, k), ReLU²,
# QK-norm with q and k x 1.2, untied head, no biases, logits softcapped at 15, per-block x0 and residual scalars,
# value embeddings, the smear gate and backout
pos_emb = "rope"
rope_theta = 100000.0
norm = "rmsnorm_free"
embed_norm = True
mlp = "relu2"
qk_norm = True
qk_scale = 1.2
tie_embeddings = False
bias = False
logit_softcap = 15.0
x0_scalars = True
value_embeds = True
smear = True
backout = True
weight_init = "nanochat"  # embeddings N(0, 0.8), head N(0, 0.001), blocks uniform 1/sqrt(n_embd), projections 0
# the optimizer: Muon (Polar Express, NorMuon, cautious weight decay 0.28 falling as a cosine to 0, momentum 0.85 to
# 0.97 over 400 steps, then down to 0.90 over the warmdown) for the blocks' matrices; AdamW for the rest at
# nanochat's rates, the embeddings' and the head's stated at 768 wide and scaled by (768 / n_embd) ** 0.5; no
# gradient clipping
optimizer = "muon"
muon_lr = 0.02
muon_momentum = 0.97
muon_momentum_warmup = 400
muon_momentum_warmdown = 0.90
muon_normuon = True
muon_polar_express = True
muon_cautious_wd = True
muon_weight_decay = 0.28
muon_wd_cosine = True
weight_decay = 0.0  # AdamW's
lr_base_width = 768
learning_rate = 0.005  # AdamW's other parameters: resid_lambdas alone in this model
embedding_lr = 0.3
head_lr = 0.008
scalar_lr = 0.5
beta1 = 0.8
beta2 = 0.95
grad_clip = 0.0
# the schedule: 40 steps of warmup, the peak, then the last 65% of the run down to 5% of it
lr_schedule = "wsd"
warmup = "40ba"
warmdown = 0.65
min_lr = 0.05 * learning_rate
