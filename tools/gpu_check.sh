#!/usr/bin/env bash
# gpu_check.sh — everything that needs a GPU, in one command of at most ten
# minutes, written to one report file:
#   1. configure with the CUDA backend (for this machine's GPU) and build;
#   2. the ctest label `gpu`: the kernel reference suite through the CUDA
#      backend, the backend against the CPU, the communicators, and five
#      training steps of GPT-2, Llama, BERT and T5 on CUDA against the CPU
#      (regional == full bit for bit, two GPU runs bit for bit);
#   3. the benchmark: tokens/s of gpt2-124m and llama-127m at B=8, T=1024
#      and B=4, T=64, with the share of the step's time in GEMMs (from
#      `regc train --profile`), gpt2-124m in bf16 at B=16, T=1024 at O1 and
#      at O2 (the step captured as CUDA graphs; not profiled, which would
#      time each kernel apart), and `regc coldstart --backend cuda` at O1
#      and O2 (capture_ms). The `gpu` label also holds O2 to O1's bits.
#
# Usage: bash tools/gpu_check.sh [REPORT]   (default build-gpu/gpu_report.txt)
# Environment: BUILD (default build-gpu), STEPS (benchmark steps, default 8).
# Exit status: 0 when every part passed, 1 otherwise (the report says which).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD="${BUILD:-build-gpu}"
REPORT="${1:-$BUILD/gpu_report.txt}"
STEPS="${STEPS:-8}"
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 3 ] ||
    { echo "gpu_check.sh: STEPS must be an integer >= 3" >&2; exit 2; }
mkdir -p "$BUILD" "$(dirname "$REPORT")"
: >"$REPORT"
failed=0

say() { echo "$*" | tee -a "$REPORT"; }
# Run a command, its output into the report; a failure is recorded, not fatal.
part() {
    local what="$1"
    shift
    say ""
    say "== $what: $*"
    local t0=$SECONDS
    if "$@" >>"$REPORT" 2>&1; then
        say "== $what: passed ($((SECONDS - t0)) s)"
    else
        say "== $what: FAILED ($((SECONDS - t0)) s)"
        failed=1
    fi
}

say "regc gpu check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"

part "packages" bash tools/setup.sh test
part "configure" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DREGC_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=native
part "build" cmake --build "$BUILD" -j "$(nproc)"
if [ ! -x "$BUILD/regc" ]; then
    say "no regc binary: nothing more can run"
    exit 1
fi
part "gpu tests" ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 300

# One benchmark: the mean tokens/s over the steps after the first two (the
# first compiles and warms up; at O2 the second captures), and at O1 the
# GEMMs' share of the profiled step.
bench() {
    local model="$1" batch="$2" seq="$3" precision="${4:-fp32}" level="${5:-O1}"
    local log="$BUILD/bench-$1-$2x$3-$precision-$level.log" profile=(--profile)
    [ "$level" = O2 ] && profile=()
    "$BUILD/regc" train --model "$model" --backend cuda --batch "$batch" --seq "$seq" \
        --precision "$precision" --level "$level" --steps "$STEPS" "${profile[@]}" --no-cache \
        >"$log" 2>&1 || { cat "$log"; return 1; }
    awk -v model="$model $precision $level" -v b="$batch" -v t="$seq" '
        /^step/ { n++; if (n > 2) { tok += $(NF - 1); k++ } }
        /gemm\[/ { share += $2 + 0 }
        END { if (k == 0) exit 1
              printf "%-20s B=%-2d T=%-5d %10.0f tok/s", model, b, t, tok / k
              if (share > 0) printf "  GEMMs %.1f%% of the step", share
              printf "\n" }' "$log"
}

say ""
say "== benchmark (regc train --backend cuda --profile, $STEPS steps; the mean of steps 2..)"
for model in gpt2-124m llama-127m; do
    for shape in "8 1024" "4 64"; do
        # shellcheck disable=SC2086
        if line=$(bench "$model" $shape); then say "$line"; else say "$model $shape: FAILED"; say "$line"; failed=1; fi
    done
done
for level in O1 O2; do
    if line=$(bench gpt2-124m 16 1024 bf16 $level); then say "$line"; else say "gpt2-124m bf16 $level: FAILED"; say "$line"; failed=1; fi
done
part "coldstart" "$BUILD/regc" coldstart --model gpt2-124m --backend cuda --batch 8 --seq 1024
part "coldstart O2" "$BUILD/regc" coldstart --model gpt2-124m --backend cuda --batch 8 --seq 1024 \
    --level O2 --json

say ""
if [ "$failed" = 0 ]; then say "gpu check: every part passed"; else say "gpu check: FAILED (above)"; fi
exit "$failed"
