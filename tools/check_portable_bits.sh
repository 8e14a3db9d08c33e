#!/usr/bin/env bash
# check_portable_bits.sh — the build for no particular CPU (REGC_NATIVE=OFF)
# trains to the same bits as the native build on this machine.
#
#   tools/check_portable_bits.sh [NATIVE_REGC [PORTABLE_REGC]]
#                                   default build/regc, build-portable/regc
#                                   (relative paths from where it is run)
#
# Both pick the same GEMM by CPUID; the portable one builds its other
# vector-bound loops several times (target_clones) and the loader picks one,
# where the native one is built for this CPU alone. Every lane computes the
# same operations whatever the vectors, so the weights after a few steps of
# each architecture, in fp32 and in bf16, must be byte for byte the same.
# This compares the clones this CPU's loader picks (x86-64-v4's on an
# AVX-512 CPU, v3's on an AVX2 one), not the others. Exits 1 naming the
# first model and precision that differ.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NATIVE="${1:-$ROOT/build/regc}"
PORTABLE="${2:-$ROOT/build-portable/regc}"
for bin in "$NATIVE" "$PORTABLE"; do
    [ -x "$bin" ] || { echo "check_portable_bits.sh: $bin is not an executable" >&2; exit 2; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for model in gpt2-tiny llama-tiny bert-tiny; do
    for precision in fp32 bf16; do
        for kind in native portable; do
            bin="$NATIVE"
            [ "$kind" = portable ] && bin="$PORTABLE"
            if ! OMP_NUM_THREADS=2 "$bin" train --model "$model" --steps 4 --no-cache \
                --precision "$precision" --save "$work/$kind" >"$work/$kind.log" 2>&1; then
                echo "check_portable_bits.sh: $bin train --model $model --precision $precision failed:" >&2
                tail -n 5 "$work/$kind.log" >&2
                exit 1
            fi
        done
        if ! cmp -s "$work/native/model.safetensors" "$work/portable/model.safetensors"; then
            echo "check_portable_bits.sh: $model, $precision: the portable build's weights differ from the native build's" >&2
            exit 1
        fi
        echo "$model $precision: the same bits"
        rm -rf "$work/native" "$work/portable"
    done
done
