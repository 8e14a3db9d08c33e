#!/usr/bin/env bash
# bench_families.sh — CPU step time of each decoder family at llama-127m's
# shape (a benchmark, not a test): the same GEMM FLOPs in every family, so
# each one's median step over Llama's says what its own pieces cost (biases,
# q/k norms, Gemma's extra norms and soft-capping, Phi-3's fused
# projections and their slices).
#
#   tools/bench_families.sh [STEPS]     STEPS >= 2, default 8
#
# Environment: PYTHON (a Python with torch and transformers >= 5, which makes
# each family's random checkpoint; default python3), THREADS (default 2),
# REGC (the binary, default build/regc), FAMILIES (default all eight).
# B=4, T=64, fp32; the first step is a warm-up.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

STEPS="${1:-8}"
THREADS="${THREADS:-2}"
PYTHON="${PYTHON:-python3}"
REGC="${REGC:-build/regc}"
FAMILIES="${FAMILIES:-llama mistral qwen2 qwen3 olmo2 phi3 gemma2 gemma3_text}"
[[ "$STEPS" =~ ^[0-9]+$ && "$STEPS" -ge 2 ]] || { echo "bench_families.sh: STEPS >= 2" >&2; exit 2; }
[ -x "$REGC" ] || { echo "bench_families.sh: no binary at $REGC (build first)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

llama_ms=""
for family in $FAMILIES; do
    dir="$work/$family"
    # llama-127m's shape in the family's own config, head_dim 64 given
    # (Qwen 3's default is 128); Gemma's windows and caps as its defaults
    # give them, its head tied as Gemma's is
    "$PYTHON" - "$family" "$dir" >"$work/python.log" 2>&1 <<'EOF' ||
import sys, torch, transformers
family, out = sys.argv[1], sys.argv[2]
shape = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
             num_attention_heads=12, num_key_value_heads=6, head_dim=64,
             max_position_embeddings=1024, pad_token_id=None, bos_token_id=None, eos_token_id=None)
if family.startswith("gemma"):  # its default scale is head_dim's
    shape.update(query_pre_attn_scalar=64)
cfg = transformers.AutoConfig.for_model(family, **shape)
torch.manual_seed(0)
transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
EOF
        { cat "$work/python.log" >&2; echo "bench_families.sh: $PYTHON could not make $family" >&2; exit 1; }
    tokens="$work/tokens.bin"
    [ -f "$tokens" ] || "$PYTHON" - "$tokens" <<'EOF'
import struct, sys, random
random.seed(1)
n = 100000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(32000) for _ in range(n)]))
EOF
    out="$(OMP_NUM_THREADS="$THREADS" "$REGC" train --model "$dir" --data "$tokens" --batch 4 \
        --seq 64 --steps "$STEPS" --threads "$THREADS" --json 2>/dev/null)"
    ms="$(printf '%s\n' "$out" | sed -n 's/.*"step": \([0-9]*\),.*"ms": \([0-9.]*\).*/\1 \2/p' |
        awk '$1 >= 1 { print $2 }' | sort -g | awk '{ t[n++] = $1 } END {
            print (n % 2) ? t[int(n / 2)] : (t[n / 2 - 1] + t[n / 2]) / 2 }')"
    [ -n "$llama_ms" ] || llama_ms="$ms"
    awk -v f="$family" -v ms="$ms" -v base="$llama_ms" \
        'BEGIN { printf "%-12s median step %7.1f ms  %.2fx the first family'"'"'s\n", f, ms, ms / base }'
    rm -rf "$dir"
done
