# The quickstart (make quickstart): a small GPT trained for a few minutes on a laptop-class CPU on the
# Python standard library's source text, read as MDS (prepare_data.py -> to_mds.py -> data/quickstart/mds).
#   python train.py config/quickstart.py            # or: composer -n 1 train.py config/quickstart.py
import os

n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
dropout = 0.0

data_dir = os.environ.get("QUICKSTART_DATA", "data/quickstart/mds")  # to_mds.py output: train/ and val/
global_batch_size = 32
device_train_microbatch_size = 32
learning_rate = 2e-3
min_lr = 2e-4
warmup = "30ba"
max_duration = "600ba"
eval_interval = "100ba"
eval_subset_num_batches = 8
sample_prompt = "def "
sample_length = 48

save_folder = "runs/quickstart"
save_interval = "200ba"
autoresume = True  # run it again after Ctrl-C: it continues where it stopped
run_name = "quickstart"
progress_bar = False
log_interval = 20
speed_window = 20
