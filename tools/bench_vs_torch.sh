#!/usr/bin/env bash
# bench_vs_torch.sh — training step time of regc against PyTorch eager on the
# CPU (a benchmark, not a test): GPT-2 124M and a Llama of the same size.
#
#   tools/bench_vs_torch.sh [STEPS]     STEPS >= 1 timed steps per round, default 4
#
# For each model, tools/reference/bench_step.py writes the weights (regc's
# random init) as a Hugging Face directory and a token file, then times
# PyTorch and `regc train` on them in turns: ROUNDS rounds of STEPS steps of
# each, the first of the pair alternating, so that both see the same
# machine. It prints every round, the median step of each, the ratio, regc's
# GFLOP/s and its fraction of the sgemm rates (OpenBLAS's and regc's own
# GEMM) at the step's GEMM shapes (build/bench_sgemm).
#
# Environment: MODELS (default "gpt2-124m llama-127m"), PRECISION (fp32, the
# default, or bf16: PyTorch under CPU autocast to bfloat16, regc with
# --precision bf16, and regc's fraction of its bf16 GEMM), ROUNDS (default 3),
# WARMUP (untimed steps: PyTorch's once, regc's in each of its runs, default
# 1), THREADS (default 2), BATCH (4), SEQ (64),
# WORKDIR (model and token files, default a temporary directory, removed
# afterwards), PYTHON (default /usr/bin/python3, which has PyTorch).
# Builds build/ first (tools/setup.sh build).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

STEPS="${1:-4}"
ROUNDS="${ROUNDS:-3}"
WARMUP="${WARMUP:-1}"
THREADS="${THREADS:-2}"
BATCH="${BATCH:-4}"
SEQ="${SEQ:-64}"
MODELS="${MODELS:-gpt2-124m llama-127m}"
PRECISION="${PRECISION:-fp32}"
case "$PRECISION" in fp32 | bf16) ;; *) echo "bench_vs_torch.sh: PRECISION must be fp32 or bf16" >&2; exit 2 ;; esac
PYTHON="${PYTHON:-/usr/bin/python3}"

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
for v in "$STEPS" "$ROUNDS" "$WARMUP" "$THREADS" "$BATCH" "$SEQ"; do
    is_uint "$v" || { echo "bench_vs_torch.sh: STEPS, ROUNDS, WARMUP, THREADS, BATCH and SEQ must be integers" >&2; exit 2; }
done
[ "$STEPS" -ge 1 ] && [ "$ROUNDS" -ge 1 ] ||
    { echo "bench_vs_torch.sh: STEPS and ROUNDS must be at least 1" >&2; exit 2; }

bash tools/setup.sh build >&2
cmake --build build --target bench_sgemm >&2

if [ -z "${WORKDIR:-}" ]; then
    WORKDIR="$(mktemp -d)"
    trap 'rm -rf "$WORKDIR"' EXIT
fi
mkdir -p "$WORKDIR"

echo "command: OMP_NUM_THREADS=$THREADS $PYTHON tools/reference/bench_step.py --model M" \
     "--batch $BATCH --seq $SEQ --steps $STEPS --rounds $ROUNDS --warmup $WARMUP --threads $THREADS" \
     "--precision $PRECISION"
for model in $MODELS; do
    echo
    OMP_NUM_THREADS="$THREADS" "$PYTHON" tools/reference/bench_step.py --model "$model" \
        --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --rounds "$ROUNDS" --warmup "$WARMUP" --threads "$THREADS" \
        --precision "$PRECISION" \
        --regc build/regc --sgemm build/bench_sgemm --workdir "$WORKDIR"
    rm -rf "${WORKDIR:?}/$model" "$WORKDIR/$model.bin"
done
