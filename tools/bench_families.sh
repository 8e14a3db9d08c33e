#!/usr/bin/env bash
# bench_families.sh — CPU step time of each decoder family at llama-127m's
# shape (a benchmark, not a test): the same GEMM FLOPs in every family, so
# each one's median step over Llama's says what its own pieces cost (biases,
# q/k norms, Gemma's extra norms and soft-capping, Phi-3's fused
# projections and their slices, Granite's multipliers, SmolLM3's layers
# without RoPE, Phi's, GPT-NeoX's and StableLM's LayerNorms and partly
# rotated heads, the first two's parallel blocks and biases; their plain
# MLPs 3,072 wide, so that two GEMMs match the gated MLP's three of
# 2,048; GPT-NeoX has no grouped-query attention: its k and v are twice
# as wide).
#
#   tools/bench_families.sh [STEPS]     STEPS >= 2, default 8
#
# Environment: PYTHON (a Python with torch and transformers >= 5, which makes
# each family's random checkpoint; default python3), THREADS (default 2),
# REGC (the binary, default build/regc), FAMILIES (default all thirteen, the
# first the one the others are compared with), ROUNDS (default 3).
# B=4, T=64, fp32; the first step is a warm-up.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

STEPS="${1:-8}"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-3}"
PYTHON="${PYTHON:-python3}"
REGC="${REGC:-build/regc}"
FAMILIES="${FAMILIES:-llama mistral qwen2 qwen3 olmo2 phi3 gemma2 gemma3_text granite smollm3 phi gpt_neox stablelm}"
[[ "$STEPS" =~ ^[0-9]+$ && "$STEPS" -ge 2 ]] || { echo "bench_families.sh: STEPS >= 2" >&2; exit 2; }
[ -x "$REGC" ] || { echo "bench_families.sh: no binary at $REGC (build first)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# every family's checkpoint first, then ROUNDS rounds of one run each, the
# order rotated each round: a family is compared with the first family's run
# of the same round, so the machine's drift between rounds cancels out of
# the ratio
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
if family == "granite":  # Granite 3's multipliers (its defaults of 1 would be Llama)
    shape.update(embedding_multiplier=12.0, residual_multiplier=0.22,
                 attention_multiplier=0.015625, logits_scaling=8.0)
if family in ("phi", "gpt_neox"):  # the same MLP FLOPs in two GEMMs
    shape.update(intermediate_size=3072)
if family in ("gpt_neox", "stablelm"):  # heads hidden_size / num_attention_heads wide
    del shape["head_dim"]
if family == "gpt_neox":  # its k and v as many heads as q
    del shape["num_key_value_heads"]
cfg = transformers.AutoConfig.for_model(family, **shape)
torch.manual_seed(0)
transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
EOF
        { cat "$work/python.log" >&2; echo "bench_families.sh: $PYTHON could not make $family" >&2; exit 1; }
done
tokens="$work/tokens.bin"
"$PYTHON" - "$tokens" <<'EOF'
import struct, sys, random
random.seed(1)
n = 100000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(32000) for _ in range(n)]))
EOF

# the median step of one run, its first (warm-up) step left out
median_step() {
    OMP_NUM_THREADS="$THREADS" "$REGC" train --model "$work/$1" --data "$tokens" --batch 4 \
        --seq 64 --steps "$STEPS" --threads "$THREADS" --json 2>/dev/null |
        sed -n 's/.*"step": \([0-9]*\),.*"ms": \([0-9.]*\).*/\1 \2/p' |
        awk '$1 >= 1 { print $2 }' | sort -g | awk '{ t[n++] = $1 } END {
            print (n % 2) ? t[int(n / 2)] : (t[n / 2 - 1] + t[n / 2]) / 2 }'
}

read -r -a list <<<"$FAMILIES"
n=${#list[@]}
for ((r = 0; r < ROUNDS; r++)); do
    for ((i = 0; i < n; i++)); do
        family="${list[$(((i + r) % n))]}"
        echo "$r $family $(median_step "$family")" >>"$work/steps"
    done
done
# per family: its median step in each round, and the median over the rounds
# of its ratio to the first family's step in the same round (with the range)
awk -v first="${list[0]}" -v rounds="$ROUNDS" -v order="$FAMILIES" '
    { ms[$2, $1] = $3 }
    END {
        k = split(order, fam, " ")
        for (i = 1; i <= k; i++) {
            f = fam[i]; m = 0; line = ""
            for (r = 0; r < rounds; r++) {
                ratio[m++] = ms[f, r] / ms[first, r]
                line = line sprintf(" %7.1f", ms[f, r])
            }
            for (a = 1; a < m; a++) for (b = a; b > 0 && ratio[b - 1] > ratio[b]; b--) {
                x = ratio[b]; ratio[b] = ratio[b - 1]; ratio[b - 1] = x }
            med = (m % 2) ? ratio[int(m / 2)] : (ratio[m / 2 - 1] + ratio[m / 2]) / 2
            printf "%-12s median step per round (ms)%s  ratio to %s: median %.3f (%.3f..%.3f)\n",
                   f, line, first, med, ratio[0], ratio[m - 1]
        }
    }' "$work/steps"
