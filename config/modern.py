# The model side as the field trains in 2026, applied after a size preset:
#   python train.py config/quickstart.py config/modern.py
#   composer -n 8 train.py config/pile.py config/modern.py
# RoPE, RMSNorm, QK-norm, an untied output head, no biases and Muon for the blocks' matrices (nanochat's and
# modded-nanogpt's choices); bench/bench_recipe.py measures each against GPT-2's recipe (docs/performance.md).
pos_emb = "rope"
norm = "rmsnorm"
mlp = "relu2"
qk_norm = True
tie_embeddings = False
logit_softcap = 15.0
bias = False
optimizer = "muon"
muon_lr = 0.02
