#!/usr/bin/env bash
# bench_zero3.sh — a training step under mpirun: stage 0 (data parallel)
# with its bucket all-reduces in the backward and all in the update, stage 3
# with the compiler's prefetch, and stage 3 gathering each unit on demand;
# per variant the median step time (first step left out), the job's
# tokens/s, and where collectives run asynchronously the time in them and
# the share of it hidden behind compute.
#
#   tools/bench_zero3.sh [--model gpt2-124m] [--ranks 2] [--threads 1]
#                        [--batch 2] [--seq 64] [--steps 6] [--regc build/regc]
#
# Each rank runs `--threads` compute threads (one by default, as a host
# shared by the ranks should be); --batch is per rank.
set -euo pipefail

model=gpt2-124m ranks=2 threads=1 batch=2 seq=64 steps=6 regc=build/regc
while [ $# -gt 0 ]; do
    case "$1" in
    --model) model=$2 ;;
    --ranks) ranks=$2 ;;
    --threads) threads=$2 ;;
    --batch) batch=$2 ;;
    --seq) seq=$2 ;;
    --steps) steps=$2 ;;
    --regc) regc=$2 ;;
    *) echo "bench_zero3.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -x "$regc" ] || { echo "bench_zero3.sh: $regc not built (cmake --build build)" >&2; exit 1; }
[ "$steps" -ge 2 ] || { echo "bench_zero3.sh: --steps must be at least 2" >&2; exit 2; }

mpi=(mpirun --oversubscribe --bind-to none -x "OMP_NUM_THREADS=$threads" -np "$ranks")
[ "$(id -u)" = 0 ] && mpi=(mpirun --allow-run-as-root "${mpi[@]:1}")

# One variant: its --json step lines into a table row.
run() {
    local name=$1
    shift
    "${mpi[@]}" "$regc" train --model "$model" --batch "$batch" --seq "$seq" --steps "$steps" \
        --no-cache --json "$@" 2>/dev/null |
        awk -v name="$name" -v tokens="$((ranks * batch * seq))" '
        /"step"/ && /"ms"/ {
            match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0
            if (s == 0) next
            match($0, /"ms": [0-9.e+-]+/); ms[n++] = substr($0, RSTART + 6, RLENGTH - 6) + 0
            if (match($0, /"comm_ms": [0-9.e+-]+/)) comm += substr($0, RSTART + 11, RLENGTH - 11)
            if (match($0, /"comm_wait_ms": [0-9.e+-]+/)) wait += substr($0, RSTART + 16, RLENGTH - 16)
        }
        END {
            if (n == 0) { printf "%-28s failed\n", name; exit 1 }
            for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (ms[j] < ms[i]) { t = ms[i]; ms[i] = ms[j]; ms[j] = t }
            med = n % 2 ? ms[int(n / 2)] : (ms[n / 2 - 1] + ms[n / 2]) / 2
            if (comm > 0)
                printf "%-28s %9.1f %10.0f %10.1f %8.0f%%\n", name, med, tokens / med * 1e3, comm / n, 100 * (1 - wait / comm)
            else
                printf "%-28s %9.1f %10.0f %10s %9s\n", name, med, tokens / med * 1e3, "-", "-"
        }'
}

echo "$model, $ranks ranks x $threads thread(s), batch $batch per rank, seq $seq, $steps steps"
printf "%-28s %9s %10s %10s %9s\n" variant "ms/step" "tokens/s" "comm ms" hidden
run "stage 0" --zero-stage 0
run "stage 0, sums in the update" --zero-stage 0 --deepcompile off
run "stage 3, prefetch" --zero-stage 3
run "stage 3, on demand" --zero-stage 3 --prefetch-bucket-size 0
