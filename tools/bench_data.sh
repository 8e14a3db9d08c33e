#!/usr/bin/env bash
# bench_data.sh — what token data costs a run: the peak resident memory and
# the wall time of a one-step `regc train` of gpt2-tiny on one llm.c token
# file of S x N tokens, on the same tokens as S shards named by a pattern,
# and on the built-in corpus (the run without data); then bench_tokens (the
# open, and a batch's read in llm.c's order and shuffled) on both. The files come from
# the page cache (just written), so the figures compare the readers, not
# the disk. --regc names another build to compare (one without patterns
# skips the shards).
#
#   tools/bench_data.sh [--shards 4] [--tokens 100000000] [--regc build/regc]
#                       [--dir /tmp/regc-bench-data]
set -euo pipefail

shards=4 tokens=100000000 regc=build/regc dir=${TMPDIR:-/tmp}/regc-bench-data
while [ $# -gt 0 ]; do
    case "$1" in
    --shards) shards=$2 ;;
    --tokens) tokens=$2 ;;
    --regc) regc=$2 ;;
    --dir) dir=$2 ;;
    *) echo "bench_data.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -x "$regc" ] || { echo "bench_data.sh: $regc not built (cmake --build build)" >&2; exit 1; }
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

# S shards of N random byte-level tokens, and whole.bin: all of them in one
# file (llm.c's header holds an int32 count: S x N < 2^31).
/usr/bin/python3 - "$dir" "$shards" "$tokens" <<'EOF'
import os, struct, sys, random
d, shards, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def header(count):
    return struct.pack("<3i", 20240520, 1, count) + bytes(1024 - 12)
rng = random.Random(0)
block = bytes(rng.randrange(256) if i % 2 == 0 else 0 for i in range(1 << 20))
with open(os.path.join(d, "whole.bin"), "wb") as whole:
    whole.write(header(shards * n))
    for s in range(shards):
        with open(os.path.join(d, "shard_%06d.bin" % s), "wb") as f:
            f.write(header(n))
            left = 2 * n
            while left:
                piece = block[: min(left, len(block))]
                f.write(piece)
                whole.write(piece)
                left -= len(piece)
EOF

run() { # label, then regc train's data flags
    local label=$1
    shift
    /usr/bin/time -f "$label: %e s, peak resident %M KiB" "$regc" train --model gpt2-tiny \
        --steps 1 --batch 4 --seq 64 --no-cache "$@" 2>&1 >/dev/null | tail -1
}
echo "$regc: $shards x $tokens tokens ($(du -sh "$dir/whole.bin" | cut -f1) in one file)"
run "built-in corpus"
run "one file" --data "$dir/whole.bin"
help=$("$regc" train --help 2>&1 || true)
if [[ $help == *"pattern of its shards"* ]]; then
    run "$shards shards" --data "$dir/shard_*.bin"
fi
# the open and a batch's read alone, where bench_tokens is built beside regc
bench=$(dirname "$regc")/bench_tokens
if [ -x "$bench" ]; then
    "$bench" --vocab 256 "$dir/whole.bin"
    "$bench" --vocab 256 --batch 8 --seq 64 "$dir/shard_*.bin"
fi
