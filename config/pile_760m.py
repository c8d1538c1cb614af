# GPT-2 large width (760M parameters, GPT-3 "Large") on The Pile, one node of 8 GPUs.
#   composer -n 8 train.py config/pile_760m.py
import os

base = "pile.py"
n_layer = 24
n_head = 16
n_embd = 1536
learning_rate = 2.5e-4  # GPT-3 paper, table 2.1
min_lr = 2.5e-5
device_train_microbatch_size = 6  # 60 per GPU = 10 microbatches of 6
run_name = os.environ.get("RUN_NAME", "pile-gpt2-760m")
