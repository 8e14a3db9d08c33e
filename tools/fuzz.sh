#!/usr/bin/env bash
# fuzz.sh — build the libFuzzer harnesses (preset fuzz, clang, ASan + UBSan)
# and run each for a while; any crash, leak, UBSan report, timeout or
# out-of-memory fails the script.
#
#   tools/fuzz.sh [SECONDS] [NAME...]   each harness (or the named ones: graph_json,
#                                       safetensors, ...) for SECONDS (default 30)
#
# Harness fuzz_<name> starts from its seeds in tests/fuzz/corpus/<name>/,
# copied to a scratch directory: what the fuzzer adds stays out of the
# repository. A finding is written to build-fuzz/findings/<name>/ (crash-*,
# leak-*, timeout-*, oom-*); reproduce it with
#   build-fuzz/fuzz_<name> build-fuzz/findings/<name>/crash-...
# Harnesses run one after another: libFuzzer keeps one core busy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SECONDS_EACH="${1:-30}"
[ "$#" -gt 0 ] && shift
case "$SECONDS_EACH" in
    '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, got '$SECONDS_EACH'" >&2; exit 2 ;;
esac

log() { printf '==> %s\n' "$*" >&2; }

log "configuring and building (preset fuzz)"
cmake --preset fuzz >&2
cmake --build --preset fuzz -j"$(nproc 2>/dev/null || echo 2)" >&2

if [ "$#" -gt 0 ]; then
    names=("$@")
else
    names=()
    for src in tests/fuzz/fuzz_*.c; do
        n="$(basename "$src" .c)"
        names+=("${n#fuzz_}")
    done
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
for name in "${names[@]}"; do
    bin="build-fuzz/fuzz_$name"
    [ -x "$bin" ] || { echo "fuzz.sh: no harness $bin (tests/fuzz/fuzz_$name.c)" >&2; exit 2; }
    corpus="$scratch/$name"
    findings="build-fuzz/findings/$name"
    mkdir -p "$corpus" "$findings"
    if [ -d "tests/fuzz/corpus/$name" ]; then
        cp -R "tests/fuzz/corpus/$name/." "$corpus/"
    fi
    # inputs up to 64 KiB, but a whole checkpoint's model.safetensors: the
    # nf4_checkpoint harness starts from the test data's 4-bit checkpoint
    # (161 KiB: a longer seed would be cut short)
    max_len=65536
    case "$name" in
        nf4_checkpoint)
            max_len=262144
            cp tests/data/qlora_checkpoint/model.safetensors "$corpus/qlora.safetensors"
            ;;
    esac
    log "fuzz_$name for ${SECONDS_EACH}s"
    # -timeout: one input taking 10 s is a hang; -rss_limit_mb: a parser
    # that allocates what its input claims is a finding, not a slow run.
    if ! ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1" \
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
        -malloc_limit_mb=1024 -max_len="$max_len" -print_final_stats=1 \
        -artifact_prefix="$findings/" "$corpus" 2>"$scratch/$name.log"; then
        tail -n 60 "$scratch/$name.log" >&2
        failed+=("$name")
        continue
    fi
    grep -E '^stat::number_of_executed_units|^Done' "$scratch/$name.log" >&2 || true
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz.sh: findings in ${failed[*]} (see build-fuzz/findings/)" >&2
    exit 1
fi
log "no findings"
