#!/usr/bin/env bash
# bench_export.sh — an exported model's step time next to regc's own frontend
# (a benchmark, not a test): the preset saved as a Hugging Face directory,
# exported by tools/export_torch.py at the same batch and sequence, and both
# trained with `regc train`; prints each one's median step and their ratio.
#
#   tools/bench_export.sh [PRESET...]       default: gpt2-124m llama-127m
#
# Environment: PYTHON (a python with PyTorch 2.x and transformers, required),
# BATCH (default 4), SEQ (default 64), STEPS (default 6, the first discarded),
# THREADS (default 2), REGC (the binary, default build/regc; built first
# unless given).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BATCH="${BATCH:-4}"
SEQ="${SEQ:-64}"
STEPS="${STEPS:-6}"
THREADS="${THREADS:-2}"
[ -n "${PYTHON:-}" ] ||
    { echo "bench_export.sh: set PYTHON to a python with PyTorch 2.x and transformers" >&2; exit 2; }
if [ -z "${REGC:-}" ]; then
    bash tools/setup.sh build >&2
    REGC=build/regc
fi
PRESETS=("$@")
[ ${#PRESETS[@]} -gt 0 ] || PRESETS=(gpt2-124m llama-127m)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# the median step of a `regc train --json` run, its first step left out
median_ms() {
    awk '/^\{/ && match($0, /"ms": *[0-9.eE+-]+/) {
            v = substr($0, RSTART, RLENGTH); sub(/^[^:]*: */, "", v)
            if (n++ > 0) t[m++] = v + 0
         }
         END {
            if (m == 0) { print "bench_export.sh: no timed steps" > "/dev/stderr"; exit 1 }
            for (i = 1; i < m; i++) for (j = i; j > 0 && t[j - 1] > t[j]; j--) {
                x = t[j]; t[j] = t[j - 1]; t[j - 1] = x }
            printf "%.1f\n", m % 2 ? t[(m - 1) / 2] : (t[m / 2 - 1] + t[m / 2]) / 2
         }'
}

for preset in "${PRESETS[@]}"; do
    hf="$work/$preset-hf" out="$work/$preset-export"
    # the preset's weights as a Hugging Face directory (one tiny step to save them)
    "$REGC" train --model "$preset" --batch 1 --seq 16 --steps 1 --save "$hf" >/dev/null 2>&1
    "$PYTHON" tools/export_torch.py "$hf" "$out" --batch "$BATCH" --seq "$SEQ" 2>/dev/null |
        tail -1
    common=(--batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --json --threads "$THREADS")
    own="$(OMP_NUM_THREADS=$THREADS "$REGC" train --model "$hf" "${common[@]}" 2>/dev/null |
        median_ms)"
    exported="$(OMP_NUM_THREADS=$THREADS "$REGC" train --model "$out/graph.json" \
        --weights "$out/model.safetensors" "${common[@]}" 2>/dev/null | median_ms)"
    awk -v p="$preset" -v a="$own" -v b="$exported" -v bt="$BATCH x $SEQ" 'BEGIN {
        printf "%-11s B x T %s: frontend %.1f ms/step, exported %.1f ms/step, exported/frontend %.3f\n",
               p, bt, a, b, b / a }'
done
