# GPT-3 XL (1.3B parameters) on The Pile, one node of 8 GPUs, sharded with FSDP2 (pilegpt/train/fsdp.py).
#   composer -n 8 train.py config/pile_1.3b.py
#   composer -n 8 train.py config/pile_1.3b.py config/modern.py    # the modern model and Muon, also sharded
# tests/e2e/test_fsdp_presets.py runs the second command shrunk (2 layers of 32, 2 CPU processes): it trains,
# resumes loss for loss and evaluates; NCCL, several nodes and the throughput at this size only a GPU cluster shows.
import os

base = "pile.py"
n_layer = 24
n_head = 32
n_embd = 2048
learning_rate = 2e-4  # GPT-3 paper, table 2.1; its batch for 1.3B is 1M tokens
min_lr = 2e-5
global_batch_size = 960  # 960 x 1024 = 983,040 tokens per step
max_duration = "9537ba"  # the same ~9.4B tokens as pile.py
device_train_microbatch_size = 8  # 120 per GPU = 15 microbatches of 8
# Each Block is a shard unit: every GPU holds 1/8 of each weight, its gradient and its optimizer state (AdamW's
# moments, Muon's momentum), computes in bf16 and reduces gradients in fp32; each GPU writes its part of each
# checkpoint, a folder ep0-baN/ that autoresume reads on any number of GPUs (docs/clusters.md).
fsdp = True
run_name = os.environ.get("RUN_NAME", "pile-gpt3-1.3b")
