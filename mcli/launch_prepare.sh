#!/usr/bin/env bash
# Start the N parallel data-prep runs of mcli/prepare_pile.yaml: run k gets SHARD_INDEX=k and NUM_SHARDS=N and
# writes part-KK (k in two digits). `mcli run` has no option to set an environment variable, so each run gets
# its own copy of the YAML with those two lines changed.
#   bash mcli/launch_prepare.sh 10 --cluster my-cluster   # N, then any `mcli run` options
#   mcli get runs                                          # watch them; each ends with to_mds.py's summary line
set -euo pipefail
n=${1:-10}
shift || true
if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n < 1 || n > 30)); then
    echo "launch_prepare.sh: N=$n: give the number of parts, 1..30 (The Pile has 30 train files)" >&2
    exit 2
fi
yaml="$(cd "$(dirname "$0")" && pwd)/prepare_pile.yaml"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((k = 0; k < n; k++)); do
    part=$(printf '%02d' "$k")
    sed -e "s/^  SHARD_INDEX: .*/  SHARD_INDEX: \"$k\"/" -e "s/^  NUM_SHARDS: .*/  NUM_SHARDS: \"$n\"/" \
        "$yaml" > "$tmp/prepare_pile_$part.yaml"
    if ! grep -q "^  SHARD_INDEX: \"$k\"" "$tmp/prepare_pile_$part.yaml" \
        || ! grep -q "^  NUM_SHARDS: \"$n\"" "$tmp/prepare_pile_$part.yaml"; then
        echo "launch_prepare.sh: $yaml has no '  SHARD_INDEX: ...' / '  NUM_SHARDS: ...' line to set" >&2
        exit 1
    fi
    mcli run -f "$tmp/prepare_pile_$part.yaml" --name "prepare-pile-$part" "$@"
done
echo "launch_prepare.sh: started $n runs, prepare-pile-00 .. prepare-pile-$(printf '%02d' $((n - 1)))"
