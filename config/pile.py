# GPT-2 small (124M parameters) on The Pile, sized for one node of 8 GPUs (A100/H100 80 GB):
#   export DATA_REMOTE=s3://my-bucket/pile/mds CHECKPOINT_FOLDER=s3://my-bucket/runs/pile-gpt2-124m
#   composer -n 8 train.py config/pile.py
# The same command after a crash or preemption continues from the last checkpoint (autoresume).
# Larger models: config/pile_350m.py, pile_760m.py, pile_1.3b.py start from this file.
import os

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304  # GPT-2's 50257 padded to a multiple of 64: 1.48x tokens/s on one H200 (docs/performance.md)
dropout = 0.0
bias = True

# MDS written by to_mds.py (ROOT/train, ROOT/val) and pushed by upload_s3.py; a list reads several roots.
_remote = os.environ.get("DATA_REMOTE", "s3://my-bucket/pile/mds")  # "a,b,c": several roots read as streams
data_remote = [r.strip() for r in _remote.split(",")] if "," in _remote else _remote
data_local = os.environ.get("DATA_LOCAL", "/tmp/pile-gpt/mds_cache")  # shard cache on local disk
# The Pile's ~370 GB of MDS does not fit beside the checkpoints on many nodes' local disks: each split keeps at most
# 100 GB of shards, the least recently used evicted (docs/training.md#an-mds-cache-budget); None keeps them all
data_cache_limit = "100gb"
num_workers = 8

# ~0.5M tokens per optimizer step: 480 sequences x 1024 tokens = 491,520 (GPT-3 paper's batch for 125M).
# On 8 GPUs each takes 60 sequences in 5 microbatches of 12; "auto" finds the largest that fits (on one H200 it
# settled on all 60: 1.19x, at a 59.6 GB peak, too near an 80 GB card's edge to be the default; docs/performance.md).
global_batch_size = 480
device_train_microbatch_size = 12
device_eval_batch_size = 16

learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
warmup = "700ba"
max_duration = "19073ba"  # 19073 x 491,520 = 9.4B tokens (one pass over ~3% of The Pile)

eval_interval = "1000ba"
eval_subset_num_batches = 50  # 50 x 16 x 8 GPUs x 1024 = 6.6M validation tokens per evaluation
# HellaSwag (all 10,042, downloaded once; hellaswag_data=FILE offline) at every evaluation, as eval.py scores it:
# ~4M tokens forward (40,168 rows of ~100 padded tokens) per 1000 batches of 491,520 tokens forward and
# backward: 4e6 x 2 / (4.9e8 x 6) = ~0.3% of the training compute.
hellaswag_examples = -1
# More eval sets by name, e.g. OpenWebText's val split (prepare_data.py --dataset Skylion007/openwebtext):
#   eval_data = {"owt": "data/owt"}      -> owt_loss, owt_bpb beside val_loss, val_bpb in metrics.jsonl
sample_prompt = "The meaning of life is"

precision = "auto"  # amp_bf16 on GPU
# torch.compile on a GPU (1.34x on one H200 after ~30 s of compiling, docs/performance.md#on-a-gpu; not yet run on
# several GPUs), eager on CPU; --compile=False turns it off, --compile=True on everywhere
compile = "auto"
# Composer algorithms and callbacks by name (docs/extending.md), e.g.
#   algorithms = {"ema": {"half_life": "1000ba"}}

run_name = os.environ.get("RUN_NAME", "pile-gpt2-124m")
save_folder = os.environ.get("CHECKPOINT_FOLDER", "runs/{run_name}")  # or s3://bucket/prefix
save_interval = "1000ba"
save_num_checkpoints_to_keep = 2  # local copies; S3 keeps every checkpoint
autoresume = True
progress_bar = False  # one line per log_interval (step, loss, lr, tokens/s, MFU, ETA): readable in log files
log_interval = 50
speed_window = 50
