# A tiny GPT that trains in seconds on a CPU: smoke tests, debugging, the golden-loss test.
#   python prepare_data.py --input tests/fixtures/tinyshakespeare.txt --out-dir data/shakespeare
#   (one .txt file is one document, so this gives no val split and no evaluation; give prepare_data a
#   .jsonl of many documents and a --val-fraction to evaluate)
#   python train.py config/tiny.py                      # or: composer -n 2 train.py config/tiny.py
# Most of its 3.3M parameters are the 50257 x 64 token embedding, and most of its time goes to the
# (8 x 64, 50257) logits; see bench/bench_train.py for its speed.

n_layer = 2
n_head = 2
n_embd = 64
block_size = 64
dropout = 0.0

data_dir = "data/shakespeare"  # a prepare_data.py folder (or an MDS folder with train/ and val/)

global_batch_size = 8
device_train_microbatch_size = 8
learning_rate = 3e-3
min_lr = 3e-4
warmup = "10ba"
max_duration = "100ba"
eval_interval = "50ba"
eval_subset_num_batches = 4
save_interval = "50ba"
sample_length = 24

progress_bar = False
log_interval = 10
speed_window = 10
