# The quickstart (make quickstart): a small GPT trained for about 2.5 minutes on a 2-core CPU on tiny
# Shakespeare (1.1 MB, ships in tests/fixtures), read as MDS (prepare_data.py -> to_mds.py --block-size 128).
#   composer -n 1 train.py config/quickstart.py          # or: python train.py config/quickstart.py
# Small batches (4 x 128 tokens), so that one pass over the 321k train tokens is 600 optimizer steps: on this
# little data, steps matter more than batch size. Measured on 2 cores: val loss 5.87 at batch 200, 5.29 at 600
# (a uniform guess is 10.82, the train split's word frequencies alone 6.5); the samples printed at each
# evaluation go from fragments to speakers' names, verse lines and English words.
import os

n_layer = 4
n_head = 4
n_embd = 128
block_size = 128  # must match to_mds.py --block-size
dropout = 0.0

data_dir = os.environ.get("QUICKSTART_DATA", "data/quickstart/mds")  # to_mds.py output: train/ and val/
global_batch_size = 4
device_train_microbatch_size = 4
learning_rate = 2e-3
min_lr = 2e-4
warmup = "30ba"
max_duration = "600ba"
eval_interval = "100ba"
eval_subset_num_batches = 32
sample_prompt = "JULIET:"
sample_length = 48

seed = 7  # the samples below are this seed's
run_name = "quickstart"
save_folder = "runs/{run_name}"  # runs/quickstart
save_interval = "200ba"
autoresume = True  # after Ctrl-C, the same command continues where it stopped
progress_bar = False
log_interval = 50
speed_window = 20
