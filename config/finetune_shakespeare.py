# Fine-tune OpenAI's GPT-2 (124M) on tiny Shakespeare: nanoGPT's finetune_shakespeare recipe (pretrained weights,
# a small constant learning rate, a few hundred small steps). Data with a val split, 90/10 by lines:
#   mkdir -p data/shakespeare_txt && f=tests/fixtures/tinyshakespeare.txt
#   head -n 36000 $f > data/shakespeare_txt/train.txt && tail -n +36001 $f > data/shakespeare_txt/val.txt
#   python prepare_data.py --input data/shakespeare_txt --out-dir data/shakespeare_ft   # 305,971 / 32,056 tokens
#   python train.py config/finetune_shakespeare.py       # the first run downloads gpt2 (~550 MB) into the HF cache
#   python train.py config/finetune_shakespeare.py --init_from=gpt2-xl   # nanoGPT's choice: 1.5B, needs a big GPU
#   python sample.py --checkpoint runs/finetune_shakespeare --prompt "ROMEO:"
# The model's shape (layers, heads, width, vocabulary) comes from init_from; block_size crops GPT-2's 1024
# positions to 256. The loss it reaches is not measured: this was written on a machine without access to the
# Hugging Face hub (tests/e2e/test_init_from.py runs this file with a tiny stand-in for gpt2).

init_from = "gpt2"
block_size = 256
dropout = 0.1  # some regularization: 300 steps see the 306k training tokens about twice

data_dir = "data/shakespeare_ft"

global_batch_size = 8  # 8 x 256 = 2,048 tokens per step
device_train_microbatch_size = 8
learning_rate = 3e-5  # constant: min_lr = learning_rate, no warmup
min_lr = 3e-5
warmup = "0ba"
max_duration = "300ba"
eval_interval = "50ba"
eval_subset_num_batches = -1  # the whole val split (16 batches)
sample_prompt = "ROMEO:"
sample_length = 64

save_interval = "100ba"
progress_bar = False
log_interval = 10
speed_window = 10
