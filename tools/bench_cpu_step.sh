#!/usr/bin/env bash
# bench_cpu_step.sh — CPU step time of GPT-2 124M (a benchmark, not a test).
#
#   tools/bench_cpu_step.sh [STEPS]     STEPS >= 2, default 6
#
# Environment: WARMUP (steps discarded before timing, default 1),
# THREADS (default 2), REGC (the binary, default build/regc), ARGS (more
# `regc train` flags, e.g. "--level O0" or "--regional off"), PRECISIONS
# (compile.precision of each run in turn, default "fp32"; "fp32 bf16" also
# prints the second's median over the first's).
# Builds build/ first (tools/setup.sh build) unless REGC names a binary.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

STEPS="${1:-6}"
WARMUP="${WARMUP:-1}"
THREADS="${THREADS:-2}"
BATCH=4
SEQ=64

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_uint "$STEPS" && is_uint "$WARMUP" && is_uint "$THREADS" ||
    { echo "bench_cpu_step.sh: STEPS, WARMUP and THREADS must be integers" >&2; exit 2; }
[ "$STEPS" -gt "$WARMUP" ] ||
    { echo "bench_cpu_step.sh: STEPS ($STEPS) must exceed WARMUP ($WARMUP)" >&2; exit 2; }

if [ -z "${REGC:-}" ]; then
    bash tools/setup.sh build >&2
    REGC=build/regc
fi

PRECISIONS="${PRECISIONS:-fp32}"
first_median=""
for precision in $PRECISIONS; do
    cmd=("$REGC" train --model gpt2-124m --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --json
         --threads "$THREADS" --precision "$precision")
    # shellcheck disable=SC2206 # ARGS is a list of flags, split on purpose
    [ -n "${ARGS:-}" ] && cmd+=(${ARGS})
    echo "command: OMP_NUM_THREADS=$THREADS ${cmd[*]}"
    out="$(OMP_NUM_THREADS="$THREADS" "${cmd[@]}")"

    # The first steps pay for allocation and cold caches; the median of the
    # rest is the steady-state step time.
    summary="$(printf '%s\n' "$out" | awk -v warmup="$WARMUP" -v tokens=$((BATCH * SEQ)) '
        function field(line, key,    re) {
            re = "\"" key "\": *[-+0-9.eE]+"
            if (!match(line, re)) { print "bench_cpu_step.sh: no " key " in: " line > "/dev/stderr"; exit 1 }
            line = substr(line, RSTART, RLENGTH)
            sub(/^[^:]*: */, "", line)
            return line + 0
        }
        /^\{/ {
            step = field($0, "step"); ms = field($0, "ms")
            if (step < warmup) next
            t[n++] = ms
        }
        END {
            if (n == 0) { print "bench_cpu_step.sh: no timed steps" > "/dev/stderr"; exit 1 }
            for (i = 1; i < n; i++) {          # insertion sort: n is small
                v = t[i]
                for (j = i - 1; j >= 0 && t[j] > v; j--) t[j + 1] = t[j]
                t[j + 1] = v
            }
            med = (n % 2) ? t[int(n / 2)] : (t[n / 2 - 1] + t[n / 2]) / 2
            printf "median %.1f\n", med
            printf "timed steps: %d (after %d warm-up)\n", n, warmup
            printf "step ms: median %.1f  min %.1f  max %.1f\n", med, t[0], t[n - 1]
            printf "tokens/s at the median: %.0f  (%d tokens per step)\n", tokens * 1000 / med, tokens
        }')"
    median="$(printf '%s\n' "$summary" | sed -n 's/^median //p')"
    printf '%s\n' "$summary" | sed '1d'
    if [ -z "$first_median" ]; then
        first_median="$median"
    else
        awk -v a="$median" -v b="$first_median" -v p="$precision" \
            'BEGIN { printf "%s step / first precision'"'"'s step: %.2fx\n", p, a / b }'
    fi
done
