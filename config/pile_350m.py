# GPT-2 medium (350M parameters) on The Pile, one node of 8 GPUs. Everything else comes from pile.py.
#   composer -n 8 train.py config/pile_350m.py
import os

base = "pile.py"
n_layer = 24
n_head = 16
n_embd = 1024
learning_rate = 3e-4  # GPT-3 paper, table 2.1
min_lr = 3e-5
device_train_microbatch_size = 12
run_name = os.environ.get("RUN_NAME", "pile-gpt2-350m")
