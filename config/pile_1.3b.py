# GPT-3 XL (1.3B parameters) on The Pile, one node of 8 GPUs, sharded with FSDP.
#   composer -n 8 train.py config/pile_1.3b.py
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
fsdp = True  # parameters, gradients and AdamW state sharded over the 8 GPUs
run_name = os.environ.get("RUN_NAME", "pile-gpt3-1.3b")
