#!/usr/bin/env bash
# bench_export_size.sh — the exporter on a model of any size (a benchmark,
# not a test): a Hugging Face directory shaped as Llama 3.1 70B (or the
# config given), with its checkpoint's shards written sparse (their headers
# whole, their data never written, so they take no disk), exported by
# tools/export_torch.py on the meta device; prints the export's wall time
# and the exporter's peak resident memory, then what `regc detect` finds in
# the graph and the bytes `regc train` would read from the shards.
#
#   tools/bench_export_size.sh [CONFIG.json]
#
# Environment: PYTHON (a python with PyTorch 2.x and transformers,
# required), SEQ (default 4096), BATCH (default 1), REGC (the binary,
# default build/regc; built first unless given).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

SEQ="${SEQ:-4096}"
BATCH="${BATCH:-1}"
[ -n "${PYTHON:-}" ] ||
    { echo "bench_export_size.sh: set PYTHON to a python with PyTorch 2.x and transformers" >&2; exit 2; }
if [ -z "${REGC:-}" ]; then
    bash tools/setup.sh build >&2
    REGC=build/regc
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
hf="$work/hf" out="$work/export"

# the directory: config.json and a sharded bf16 checkpoint, sparse
"$PYTHON" - "$hf" "${1:-}" <<'EOF'
import json, os, struct, sys
import torch, transformers
sys.path.insert(0, "tools")
import export_torch
hf, given = sys.argv[1], sys.argv[2]
if given:
    config = transformers.AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(given)))
else:  # Llama 3.1 70B's shape
    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"])
os.makedirs(hf)
config.save_pretrained(hf)
with export_torch.parameters_on_meta():
    model = transformers.AutoModelForCausalLM.from_config(config)
shard_bytes, shards, cur, size = 5 << 30, [], [], 0
for name, p in model.state_dict().items():
    n = p.numel() * 2
    if cur and size + n > shard_bytes:
        shards.append(cur); cur, size = [], 0
    cur.append((name, list(p.shape), n)); size += n
shards.append(cur)
weight_map, total = {}, 0
for k, tensors in enumerate(shards):
    fname = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, n in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
        weight_map[name] = fname
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(hf, fname), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + off)  # sparse: the data is never written
    total += off
with open(os.path.join(hf, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
print("checkpoint: %d shards, %.1f GB of bf16 weights (sparse: %s on disk)" % (
    len(shards), total / 1e9, os.popen("du -sh " + hf).read().split()[0]))
EOF

# the export, timed, its peak memory measured
start=$(date +%s.%N)
/usr/bin/time -f "%M" -o "$work/rss" "$PYTHON" tools/export_torch.py "$hf" "$out" \
    --batch "$BATCH" --seq "$SEQ" >"$work/export.log" 2>&1 ||
    { cat "$work/export.log" >&2; exit 1; }
end=$(date +%s.%N)
awk -v s="$start" -v e="$end" -v kb="$(cat "$work/rss")" -v t="$SEQ" -v b="$BATCH" \
    'BEGIN { printf "export (B=%d, T=%d): %.1f s, peak resident %.2f GB\n", b, t, e - s, kb * 1024 / 1e9 }'
ls -l "$out" | awk 'NR > 1 { printf "  %s %s bytes\n", $9, $5 }'

# what regc sees in the graph: one layer kind times the depth
"$REGC" detect --model "$out/graph.json" --batch "$BATCH" --seq "$SEQ" --json |
    "$PYTHON" -c 'import json, sys
d = json.load(sys.stdin)
print("regc detect: " + ", ".join("%d instances of a %d-node layer" % (r["instances"], r["nodes"])
                                  for r in d["regions"]))'
