#!/usr/bin/env bash
# bench_load.sh — the start-up read of a model's weights against a plain
# sequential read of the same file. It saves the model once (fp32, and a
# bf16 copy), then reads each with `dd` (16 MiB reads into one buffer) and has `regc train` load it in
# one process and at N ranks under ZeRO-3, where each rank reads only the
# byte ranges of its own shards. Every read comes from the page cache (the
# files were just written), so the figures compare the readers, not the
# disk.
#
#   tools/bench_load.sh [--model gpt2-124m] [--ranks 2] [--regc build/regc]
#                       [--dir /tmp/regc-bench-load]
set -euo pipefail

model=gpt2-124m ranks=2 regc=build/regc dir=${TMPDIR:-/tmp}/regc-bench-load
while [ $# -gt 0 ]; do
    case "$1" in
    --model) model=$2 ;;
    --ranks) ranks=$2 ;;
    --regc) regc=$2 ;;
    --dir) dir=$2 ;;
    *) echo "bench_load.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -x "$regc" ] || { echo "bench_load.sh: $regc not built (cmake --build build)" >&2; exit 1; }

mpi=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np "$ranks")
[ "$(id -u)" = 0 ] && mpi=(mpirun --allow-run-as-root "${mpi[@]:1}")
rm -rf "$dir" && mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT

# The model's weights as a Hugging Face directory (one step of training
# from the seeded init), and the same weights in bf16.
"$regc" train --model "$model" --steps 1 --batch 1 --seq 32 --no-cache \
    --save "$dir/fp32" >/dev/null 2>&1
/usr/bin/python3 - "$dir/fp32" "$dir/bf16" <<'EOF'
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
shutil.copy(os.path.join(src, "config.json"), dst)
with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    data = f.read()
out, body, at = {}, bytearray(), 0
for name, t in head.items():
    if name == "__metadata__":
        out[name] = t
        continue
    raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
    # round to nearest even, as regc's writer does
    halves = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        halves += struct.pack("<H", u & 0xFFFF)
    out[name] = {"dtype": "BF16", "shape": t["shape"], "data_offsets": [at, at + len(halves)]}
    body += halves
    at += len(halves)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + body)
EOF

# "weights: ... (N bytes) read from ... in X ms" -> "N X"
loaded() { sed -n 's/^weights: .*(\([0-9]*\) bytes) read from .* in \([0-9.]*\) ms.*/\1 \2/p'; }

printf '%-6s %-34s %12s %10s %10s\n' dtype reader bytes ms 'GB/s'
for kind in fp32 bf16; do
    file="$dir/$kind/model.safetensors"
    bytes=$(stat -c %s "$file")
    dd if="$file" of=/dev/null bs=16M status=none # into the page cache
    t0=$(date +%s%N)
    dd if="$file" of=/dev/null bs=16M status=none
    us=$((($(date +%s%N) - t0) / 1000))
    awk -v k="$kind" -v b="$bytes" -v us="$us" \
        'BEGIN { printf "%-6s %-34s %12d %10.1f %10.2f\n", k, "dd bs=16M (sequential)", b, us / 1e3, b / us / 1e3 }'
    for n in 1 "$ranks"; do
        args=(--model "$dir/$kind" --steps 1 --batch 1 --seq 32 --no-cache --json)
        if [ "$n" = 1 ]; then
            line=$("$regc" train "${args[@]}" --threads 1 2>&1 >/dev/null | loaded)
            name="regc, 1 process"
        else
            line=$("${mpi[@]}" "$regc" train "${args[@]}" --zero-stage 3 2>&1 >/dev/null | loaded)
            name="regc, $n ranks, ZeRO-3 shards"
        fi
        read -r b ms <<<"$line"
        awk -v k="$kind" -v name="$name" -v b="$b" -v ms="$ms" \
            'BEGIN { printf "%-6s %-34s %12d %10.1f %10.2f\n", k, name, b, ms, b / ms / 1e6 }'
    done
done
