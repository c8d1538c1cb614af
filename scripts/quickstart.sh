#!/usr/bin/env bash
# make quickstart: the whole pipeline, offline, on CPU, in about 3 minutes on 2 cores.
# Corpus: tiny Shakespeare (tests/fixtures/tinyshakespeare.txt, 1.1 MB, public domain), cut into 40 parts
# so that whole parts can be held out for validation (prepare_data.py: one file = one document).
#   text -> prepare_data.py -> train.bin/val.bin -> to_mds.py -> MDS shards
#   -> composer train.py config/quickstart.py -> sample.py -> plot_loss.py -> runs/quickstart/loss.png
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
data=data/quickstart

# Faster CPU training where Debian's jemalloc is installed (apt-get install libjemalloc2).
for lib in /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/lib/aarch64-linux-gnu/libjemalloc.so.2; do
    if [ -e "$lib" ]; then
        export LD_PRELOAD="$lib" MALLOC_CONF="retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"
        break
    fi
done

echo "== 1/5 prepare_data: tokenize tiny Shakespeare (40 parts, 10% of them held out for validation)"
rm -rf "$data/text" && mkdir -p "$data/text"
"$PYTHON" - "$data/text" <<'PY'
import sys
from pathlib import Path
lines = Path("tests/fixtures/tinyshakespeare.txt").read_text().splitlines(keepends=True)
for i in range(40):
    part = lines[i * len(lines) // 40:(i + 1) * len(lines) // 40]
    Path(sys.argv[1], f"part-{i:02d}.txt").write_text("".join(part))
PY
"$PYTHON" prepare_data.py --input "$data/text" --val-fraction 0.1 --out-dir "$data/tokens" --overwrite
echo "== 2/5 to_mds: MDS shards of 128-token samples"
"$PYTHON" to_mds.py --bin "$data/tokens" --out "$data/mds" --block-size 128 --overwrite
echo "== 3/5 train: composer train.py config/quickstart.py (autoresume: after Ctrl-C, run it again)"
composer -n 1 train.py config/quickstart.py
echo "== 4/5 samples: the same prompt and seed after 200 batches and after 600 (the end)"
for ckpt in runs/quickstart/ep0-ba200-rank0.pt runs/quickstart/model.pt; do
    echo "-- $ckpt"
    "$PYTHON" sample.py --checkpoint "$ckpt" --prompt "JULIET:" --num-samples 2 --max-new-tokens 64 --seed 0
done
echo "== 5/5 loss curve"
"$PYTHON" plot_loss.py runs/quickstart
echo "== done. The run in one page: runs/quickstart/report.md (train.py wrote it). Next:"
echo "   python eval.py runs/quickstart --task hellaswag --data tests/fixtures/hellaswag_tiny.jsonl --out runs/quickstart/hellaswag.json"
echo "   python report.py runs/quickstart      # the report again, with eval.py's results in it"
