#!/usr/bin/env bash
# The GPU session's one command (docs/performance.md#on-a-gpu), run by the device tool from the repo's root with
# .gpu-wheels carried (`make gpu-wheels` here first). It installs those wheels without network, checks the imports in
# one line, runs bench/bench_gpu.py inside what the command's time leaves, and packs everything into $OUT as three
# files (the device tool brings back at most 8), the table first in name and in time:
#     bench_gpu.md            the tables: written before anything else, rewritten after every row and while a
#                             contestant runs; on a failed install or import it says why
#     bench_gpu_logs.tar.gz   every run's output, save folder (metrics.jsonl, config.json, Composer's log; no
#                             checkpoints) and race clock, pip's and the import check's output
#     gpu_run.log             this script's output, the bench's included
#
# Usage:
#     bash bench/gpu_run.sh            # on the GPU machine: the bench, ~9.5 min (PILEGPT_GPU_RUN_S)
#     bash bench/gpu_run.sh --smoke    # the same steps on CPU with bench_gpu.py --smoke (the image test)
# Environment: OUT (the folder that comes back; required), PYTHON (python3), PILEGPT_GPU_WHEELS (.gpu-wheels),
# PILEGPT_GPU_SITE (where the wheels are installed, put first on PYTHONPATH; default under the work folder),
# PILEGPT_GPU_WORK (scratch and logs; default ${TMPDIR:-/tmp}/pilegpt-gpu-run), PILEGPT_GPU_RUN_S (seconds for this
# whole script, default 570: the device tool's timeout_s of 600 less room for the tar and the transfers).
# Exit: the bench's (0; 1 when no contestant trained a batch; 143 when SIGTERM or the time limit cut it), 3 when the
# wheels are missing or an import fails.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
out=${OUT:?"gpu_run.sh: set OUT to the folder whose files come back (the device tool sets it)"}
python=${PYTHON:-python3}
wheels=${PILEGPT_GPU_WHEELS:-.gpu-wheels}
work=${PILEGPT_GPU_WORK:-${TMPDIR:-/tmp}/pilegpt-gpu-run}
site=${PILEGPT_GPU_SITE:-$work/site}
run_s=${PILEGPT_GPU_RUN_S:-570}
pack_s=20  # kept back from run_s for the bench's last table and the tar
smoke=()
case "${1:-}" in
    --smoke) smoke=(--smoke) ;;
    "") ;;
    *) echo "gpu_run.sh: unknown argument $1 (usage: bash bench/gpu_run.sh [--smoke])" >&2; exit 2 ;;
esac
if ! [[ $run_s =~ ^[0-9]+$ ]] || [ "$run_s" -lt 60 ]; then
    echo "gpu_run.sh: PILEGPT_GPU_RUN_S takes whole seconds >= 60, got '$run_s'" >&2
    exit 2
fi
mkdir -p "$out"
table=$out/bench_gpu.md
printf '%s\n\n%s\n' "# bench/bench_gpu.py: not started yet" \
    "bench/gpu_run.sh began at $(date '+%Y-%m-%d %H:%M:%S'); the bench rewrites this file." >"$table"
exec > >(tee -a "$out/gpu_run.log") 2>&1
rm -rf "$work/bench_gpu_logs"
logs=$work/bench_gpu_logs
mkdir -p "$logs"

pack() {
    (cd "$work" && find bench_gpu_logs -type f ! -name '*.pt' -size -8M -print0 |
        tar --null -czf "$out/bench_gpu_logs.tar.gz" -T -)
    local n
    n=$(find "$out" -type f | wc -l)
    if [ "$n" -gt 8 ]; then echo "gpu_run.sh: $out holds $n files, more than the 8 that come back"; fi
    echo "gpu_run.sh: $(( SECONDS - start )) s; $out: $(cd "$out" && ls | tr '\n' ' ')"
}
fail() {  # the reason into the table (the file that always comes back), then stop
    printf '%s\n\n%s\n' "# bench/bench_gpu.py: not run" "bench/gpu_run.sh: $1" >"$table"
    echo "gpu_run.sh: $1"
    exit 3
}
trap pack EXIT
trap 'echo "gpu_run.sh: SIGTERM before the bench started"; exit 143' TERM

if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    fail "no wheels in $wheels/: run \`make gpu-wheels\` on the machine you call from, and carry .gpu-wheels"
fi
if ! "$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --upgrade --target "$site" --find-links "$wheels" -r bench/gpu_wheels.txt >"$logs/pip_install.txt" 2>&1; then
    fail "pip could not install bench/gpu_wheels.txt from $wheels/ ($(grep -v '^WARNING' "$logs/pip_install.txt" |
        tail -n 1)): run \`make gpu-wheels\` again and carry .gpu-wheels"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# One line: everything the bench, prepare_data.py, to_mds.py and train.py import when loaded.
if ! "$python" -c 'import sys; sys.path[:0] = [".", "bench"]; import composer, streaming, orjson, zstd, brotli, snappy, tiktoken, pilegpt.prepare.tokenize_pool, prepare_data, to_mds, train, race_clock, bench_gpu; import torch; print(f"gpu_run.sh: imports fine: Python {sys.version.split()[0]}, torch {torch.__version__}, composer {composer.__version__}, streaming {streaming.__version__}, GPU {torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}")' \
        2>"$logs/import_check.txt"; then
    fail "the import check failed: $(tail -n 1 "$logs/import_check.txt"): add the missing project to \
bench/gpu_wheels.txt (or, if the image lost it, take it out of bench/gpu_image_packages.txt), then \`make gpu-wheels\`"
fi

left=$(( run_s - (SECONDS - start) - pack_s ))
budget=$(( left - 15 ))  # the bench's own budget; `timeout` at $left is the hard stop (SIGTERM, then SIGKILL)
if [ "$budget" -lt 30 ]; then fail "only $left s left of PILEGPT_GPU_RUN_S=$run_s after the install"; fi
echo "gpu_run.sh: bench_gpu.py ${smoke[*]} --budget-s $budget (stopped at $left s)"
rows=(--variants eager-50304-fixed eager-50304-fsdp)  # after the race, while the budget lasts: FSDP2 vs DDP
if [ ${#smoke[@]} -gt 0 ]; then rows=(); fi
timeout -k 10 "$left" "$python" bench/bench_gpu.py "${smoke[@]}" "${rows[@]}" --out "$table" --logs "$logs" \
    --budget-s "$budget" &
pid=$!
trap 'echo "gpu_run.sh: SIGTERM: stopping the bench"; kill -TERM "$pid" 2>/dev/null' TERM
wait "$pid"
rc=$?
while kill -0 "$pid" 2>/dev/null; do  # the trap ended the wait: wait for the bench's own end
    wait "$pid"
    rc=$?
done
if [ "$rc" -eq 124 ]; then rc=143; fi  # timeout's status for the SIGTERM it sent at $left
echo "gpu_run.sh: bench_gpu.py exited $rc"
exit "$rc"
