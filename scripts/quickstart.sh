#!/usr/bin/env bash
# make quickstart: the whole pipeline, offline, on CPU, in 4-6 minutes on 2 cores.
# Corpus: the Python standard library's own top-level source files (on every machine with Python).
#   text -> prepare_data.py -> train.bin/val.bin -> to_mds.py -> MDS shards
#   -> composer train.py config/quickstart.py -> sample.py -> plot_loss.py -> runs/quickstart/loss.png
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stdlib=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
data=data/quickstart

# Faster CPU training where Debian's jemalloc is installed (apt-get install libjemalloc2).
for lib in /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/lib/aarch64-linux-gnu/libjemalloc.so.2; do
    if [ -e "$lib" ]; then
        export LD_PRELOAD="$lib" MALLOC_CONF="retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"
        break
    fi
done

echo "== 1/5 prepare_data: tokenize $stdlib/*.py"
"$PYTHON" prepare_data.py --input "$stdlib/*.py" --text-suffix .py --val-fraction 0.05 \
    --out-dir "$data/tokens" --overwrite
echo "== 2/5 to_mds: MDS shards of 128-token samples"
"$PYTHON" to_mds.py --bin "$data/tokens" --out "$data/mds" --block-size 128 --overwrite
echo "== 3/5 train: composer train.py config/quickstart.py (autoresume: after Ctrl-C, run it again)"
composer -n 1 train.py config/quickstart.py
echo "== 4/5 samples: the same prompt and seed after 50 batches and after 150 (the end)"
for ckpt in runs/quickstart/ep0-ba50-rank0.pt runs/quickstart/model.pt; do
    echo "-- $ckpt"
    "$PYTHON" sample.py --checkpoint "$ckpt" --prompt "def " --num-samples 2 --max-new-tokens 64 --seed 0
done
echo "== 5/5 loss curve"
"$PYTHON" plot_loss.py runs/quickstart
