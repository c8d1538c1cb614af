# The quickstart (make quickstart): a small GPT trained for about 3.5 minutes on a 2-core CPU on the Python
# standard library's own source text, read as MDS (prepare_data.py -> to_mds.py --block-size 128).
#   composer -n 1 train.py config/quickstart.py          # or: python train.py config/quickstart.py
# Measured on 2 cores with jemalloc: ~1.5-1.8k tokens/s; train loss 10.4 -> ~4 within 50 batches, val loss
# ~3.8 after 150 batches (307,200 tokens). Most of what it learns first is Python's indentation.
import os

n_layer = 4
n_head = 4
n_embd = 128
block_size = 128  # must match to_mds.py --block-size
dropout = 0.0

data_dir = os.environ.get("QUICKSTART_DATA", "data/quickstart/mds")  # to_mds.py output: train/ and val/
global_batch_size = 16
device_train_microbatch_size = 16
learning_rate = 3e-3
min_lr = 3e-4
warmup = "15ba"
max_duration = "150ba"
eval_interval = "50ba"
eval_subset_num_batches = 8
sample_prompt = "def "
sample_length = 48

run_name = "quickstart"
save_folder = "runs/quickstart"
save_interval = "50ba"
autoresume = True  # after Ctrl-C, the same command continues where it stopped
progress_bar = False
log_interval = 10
speed_window = 20
