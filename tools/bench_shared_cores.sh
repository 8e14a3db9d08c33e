#!/usr/bin/env bash
# bench_shared_cores.sh — CPU step time on an idle machine and beside busy
# processes (a benchmark, not a test).
#
#   tools/bench_shared_cores.sh [STEPS]       STEPS >= 3, default 12
#
# For a small Llama step (llama-tiny, batch 2 x 32 tokens) and a GPT-2 124M
# step (batch 4 x 64), with regc's threads on every core: the median step
# time idle and beside BUSY other processes (default: one per core), for
# each setting in WAITS (default: regc's own, and "fixed": libgomp's default
# spin of 300000 and the idle thresholds of going parallel whatever the
# load, as regc ran before it fitted its team to shared cores).
# "loaded/idle" is the slowdown; sharing the cores fairly with BUSY
# single-threaded neighbours on as many cores is 2x.
#
# Environment: REGC (the binary, default build/regc, built first), BUSY,
# NEIGHBOR ("loop": a shell loop spinning on one core, the default; "regc":
# another `regc train` of gpt2-tiny on every core, with the same wait
# setting — several runs started side by side), WAITS (space-separated:
# "regc", "fixed", "spin=N" for GOMP_SPINCOUNT=N, "passive"), MODELS
# (default "llama gpt2"), GPT2_STEPS (default 5).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

STEPS="${1:-12}"
CORES="$(nproc)"
BUSY="${BUSY:-$CORES}"
WAITS="${WAITS:-regc fixed}"
MODELS="${MODELS:-llama gpt2}"
GPT2_STEPS="${GPT2_STEPS:-5}"
NEIGHBOR="${NEIGHBOR:-loop}"
[[ "$STEPS" =~ ^[0-9]+$ && "$STEPS" -ge 3 ]] ||
    { echo "bench_shared_cores.sh: STEPS must be an integer >= 3" >&2; exit 2; }

if [ -z "${REGC:-}" ]; then
    bash tools/setup.sh build >&2
    REGC=build/regc
fi

busy_pids=()
stop_busy() {
    [ "${#busy_pids[@]}" -eq 0 ] || kill "${busy_pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    busy_pids=()
}
trap stop_busy EXIT
start_busy() { # wait setting
    for _ in $(seq "$BUSY"); do
        case "$NEIGHBOR" in
            loop) bash -c 'while :; do :; done' & ;;
            regc) wait_env "$1"
                  "${env[@]}" "$REGC" train --model gpt2-tiny --steps 1000000 --no-cache \
                      >/dev/null 2>&1 & ;;
            *) echo "bench_shared_cores.sh: NEIGHBOR is loop or regc" >&2; exit 2 ;;
        esac
        busy_pids+=("$!")
    done
    sleep 1
}

# The median ms of the steps after the first (which pays for allocation).
median_step_ms() {
    awk -F'"ms": ' 'NF > 1 { split($2, a, ","); if (n++ > 0) print a[1] + 0 }' | sort -g |
        awk '{ ms[NR] = $1 } END { if (NR < 1) exit 1;
              print (NR % 2) ? ms[(NR + 1) / 2] : (ms[NR / 2] + ms[NR / 2 + 1]) / 2 }'
}

wait_env() { # wait setting -> env=(...)
    case "$1" in
        regc) env=(env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u REGC_FIXED_TEAM) ;;
        fixed) env=(env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=300000 REGC_FIXED_TEAM=1) ;;
        passive) env=(env -u GOMP_SPINCOUNT -u REGC_FIXED_TEAM OMP_WAIT_POLICY=passive) ;;
        spin=*) env=(env -u OMP_WAIT_POLICY -u REGC_FIXED_TEAM GOMP_SPINCOUNT="${1#spin=}") ;;
        *) echo "bench_shared_cores.sh: unknown wait setting $1" >&2; exit 2 ;;
    esac
}

run_step() { # model wait -> median ms
    local model="$1" env=()
    wait_env "$2"
    local args
    case "$model" in
        llama) args=(--model llama-tiny --batch 2 --seq 32 --steps "$STEPS") ;;
        gpt2) args=(--model gpt2-124m --batch 4 --seq 64 --steps "$GPT2_STEPS") ;;
    esac
    "${env[@]}" OMP_NUM_THREADS="$CORES" "$REGC" train "${args[@]}" --json --no-cache 2>/dev/null |
        median_step_ms
}

echo "cores: $CORES, neighbours: $BUSY x $NEIGHBOR, steps: llama $STEPS, gpt2 $GPT2_STEPS"
printf '%-6s %-14s %12s %12s %12s\n' model wait idle_ms loaded_ms loaded/idle
for model in $MODELS; do
    for wait in $WAITS; do
        idle="$(run_step "$model" "$wait")"
        start_busy "$wait"
        loaded="$(run_step "$model" "$wait")"
        stop_busy
        printf '%-6s %-14s %12.3f %12.3f %12.2f\n' "$model" "$wait" "$idle" "$loaded" \
            "$(awk -v a="$loaded" -v b="$idle" 'BEGIN { print a / b }')"
    done
done
