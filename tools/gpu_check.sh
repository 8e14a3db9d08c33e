#!/usr/bin/env bash
# gpu_check.sh — everything that needs a GPU, in one command, on a bare GPU
# machine: no package registry and no package manager are used. The
# libraries come from .gpu-bundle/ (tools/gpu_bundle.sh, made beforehand on a
# machine that has a registry), unpacked into a private prefix; the CUDA
# toolkit, CMake, gcc and Python are the machine's.
#
# The parts, in order of value, each with its own time limit (seconds; 16
# cores), and the whole within DEADLINE (default 480 s), so that a run leaves
# time to fix something and run again:
#   prefix        20  unpack the bundle (dpkg -x; ar and tar where there is
#                     no dpkg)
#   configure     90  CUDA for this machine's GPU; the bundle's libraries;
#                     NCCL from the toolkit or Python's nvidia-nccl package;
#                     MPI from the bundle (OPAL_PREFIX); either left out, and
#                     said, where it cannot be had
#   build        180  the target gpu_tests only (the command and the gpu
#                     label's programs), every core, ninja where present
#   gpu tests    300  the label `gpu`, one test at a time: the kernel
#                     reference suite through the CUDA backend (60), the
#                     backend against the CPU (60), training against the CPU
#                     with regional == full, two runs, O1 == O2, the offloaded
#                     optimizer, recomputation and bf16, bit for bit, the
#                     logits in chunks (150), the communicators (30)
#   benchmarks   280  tokens/s of gpt2-124m in bf16 (B=16, T=1024) at O1 and
#                     O2, in fp32 (B=8, T=1024), llama-127m, gpt2-124m with
#                     every layer recomputed and with its activations
#                     offloaded, the GEMMs' share and GEMM TFLOP/s of a
#                     profiled run, device_peak against the plan (40 each)
#   torch        150  PyTorch on the same model and shapes: eager and
#                     torch.compile regional, the first step with its compile
#                     and the steady step (tools/coldstart_vs_torch.py)
#   coldstart     60  `regc coldstart --backend cuda` at O1 and O2: compile,
#                     cuBLASLt's set-up and the first step, cold and from the
#                     compile cache
#   mpirun        30  two ranks of a small CPU run through the bundle's mpirun
# A part that fails or runs out of time is recorded and the next one runs.
#
# Usage: REPORT_DIR=DIR bash tools/gpu_check.sh
# Writes DIR/report.txt (the summary), DIR/check.log (every part's output)
# and DIR/torch/ (PyTorch's figures). REPORT_DIR defaults to BUILD.
# Environment: BUILD (default build-gpu), BUNDLE (default .gpu-bundle),
# DEADLINE (seconds, default 480), STEPS (benchmark steps, default 8).
# Exit status: 0 when every part passed, 1 otherwise (the report says which).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
SRC="$PWD"
BUILD="${BUILD:-build-gpu}"
BUNDLE="${BUNDLE:-.gpu-bundle}"
DEADLINE="${DEADLINE:-480}"
STEPS="${STEPS:-8}"
REPORT_DIR="${REPORT_DIR:-$BUILD}"
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 3 ] ||
    { echo "gpu_check.sh: STEPS must be an integer >= 3" >&2; exit 2; }
[[ "$DEADLINE" =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: DEADLINE must be seconds" >&2; exit 2; }
mkdir -p "$BUILD" "$REPORT_DIR" || exit 2
BUILD="$(cd "$BUILD" && pwd)"
REPORT_DIR="$(cd "$REPORT_DIR" && pwd)"
REPORT="$REPORT_DIR/report.txt"
LOG="$REPORT_DIR/check.log"
: >"$REPORT"
: >"$LOG"
failed=0

say() { echo "$*" | tee -a "$REPORT" >>"$LOG"; echo "$*" >&2; }
note() { echo "$*" >>"$LOG"; }

# part NAME LIMIT CMD...: run CMD under its own time limit, cut to what is
# left of the deadline; its output goes to the log, its verdict to the report.
part() {
    local what="$1" limit="$2"
    shift 2
    local left=$((DEADLINE - SECONDS))
    [ "$limit" -le "$left" ] || limit="$left"
    if [ "$limit" -lt 5 ]; then
        say "== $what: SKIPPED (no time left of the ${DEADLINE} s)"
        failed=1
        return 1
    fi
    note ""
    note "== $what ($limit s): $*"
    local t0=$SECONDS rc=0
    # through bash -c, so that CMD may be one of the functions exported below
    timeout -k 10 "$limit" bash -c '"$@"' part "$@" >>"$LOG" 2>&1 || rc=$?
    if [ "$rc" = 0 ]; then
        say "== $what: passed ($((SECONDS - t0)) s)"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        say "== $what: TIMED OUT after $limit s"
        failed=1
    else
        say "== $what: FAILED, exit $rc ($((SECONDS - t0)) s)"
        failed=1
    fi
    return "$rc"
}

say "regc gpu check, $(date -u '+%Y-%m-%d %H:%M UTC'), source $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')"
gpu_name="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
say "gpu: ${gpu_name:-none seen (nvidia-smi: $(command -v nvidia-smi || echo 'not found'))}"
say "cpu: $(nproc) cores; deadline ${DEADLINE} s"

# ---- the private prefix: the bundle's packages, unpacked without installing
PREFIX="$BUILD/prefix"
export SRC BUILD BUNDLE STEPS REPORT LOG PREFIX
unpack() {
    rm -rf "$PREFIX" && mkdir -p "$PREFIX" || return 1
    local deb n=0
    for deb in "$SRC/$BUNDLE"/*.deb; do
        [ -f "$deb" ] || { echo "no packages in $BUNDLE: run tools/gpu_bundle.sh first"; return 1; }
        if command -v dpkg >/dev/null; then
            dpkg -x "$deb" "$PREFIX" || return 1
        else # a .deb is an ar archive holding data.tar.{xz,zst,gz}
            local data
            data="$(ar t "$deb" | grep '^data\.tar')" || return 1
            ar p "$deb" "$data" | tar -x --auto-compress -C "$PREFIX" -f - || return 1
        fi
        n=$((n + 1))
    done
    echo "$n packages unpacked into $PREFIX"
}
export -f say note unpack
if [ -d "$SRC/$BUNDLE" ]; then
    part "prefix" 20 unpack
else
    say "== prefix: no $BUNDLE; the machine's own libraries are used"
fi
ARCH_DIR="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
LIBS="$PREFIX/usr/lib/$ARCH_DIR"
# (some packages still install into /lib, not /usr/lib)
export LD_LIBRARY_PATH="$LIBS:$LIBS/openblas-openmp:$LIBS/openmpi/lib:$PREFIX/lib/$ARCH_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# OpenMPI relocated: its wrappers, launcher and components under PREFIX
export OPAL_PREFIX="$PREFIX/usr" OPAL_SYSCONFDIR="$PREFIX/etc/openmpi"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one host: mpirun starts its ranks itself, but refuses to start without a
# remote shell to name (the machine has no ssh)
export OMPI_MCA_plm_rsh_agent=false
export PATH="$PATH:$PREFIX/usr/bin"

# ---- configure
nvcc="$(command -v nvcc || true)"
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
if [[ "$cc" =~ ^[0-9]+$ ]]; then
    arch="$cc"
else
    arch=90
    say "configure: no GPU's compute capability read; building for sm_90 (H100, H200)"
fi
flags=(-DCMAKE_BUILD_TYPE=Release -DREGC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch"
       -DCMAKE_PREFIX_PATH="$PREFIX/usr")
[ -z "$nvcc" ] || flags+=(-DCMAKE_CUDA_COMPILER="$nvcc")
command -v ninja >/dev/null && [ ! -f "$BUILD/Makefile" ] && flags+=(-G Ninja)
if [ -x "$PREFIX/usr/bin/mpicc.openmpi" ]; then
    flags+=(-DMPI_C_COMPILER="$PREFIX/usr/bin/mpicc.openmpi"
            -DMPIEXEC_EXECUTABLE="$PREFIX/usr/bin/mpirun.openmpi")
fi
# NCCL: the toolkit's (CMake finds it there), else the Python package's
toolkit="$(dirname "$(dirname "${nvcc:-/usr/local/cuda/bin/nvcc}")")"
if [ ! -f "$toolkit/include/nccl.h" ]; then
    nccl="$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null)"
    nccl_lib="$(ls "$nccl"/lib/libnccl.so* 2>/dev/null | head -1)"
    if [ -n "$nccl" ] && [ -f "$nccl/include/nccl.h" ] && [ -n "$nccl_lib" ]; then
        flags+=(-DNCCL_INCLUDE_DIR="$nccl/include" -DNCCL_LIBRARY="$nccl_lib")
        say "configure: NCCL from Python's nvidia-nccl package ($nccl_lib)"
    fi
fi
say "cuda: ${nvcc:-no nvcc} ($("${nvcc:-false}" --version 2>/dev/null | grep -i release | head -1))"
part "configure" 90 cmake -S "$SRC" -B "$BUILD" "${flags[@]}"
found="$(grep -h '^-- regc: ' "$LOG" | tail -2 | sed 's/^-- regc: //' | paste -sd ';' -)"
say "configure: ${found:-nothing reported}"
case "$found" in *"NCCL OFF"*) say "configure: built without NCCL (neither the toolkit nor Python has it): the NCCL test must fail" ;; esac
case "$found" in *"MPI OFF"*) say "configure: built without MPI: one process only" ;; esac

part "build" 180 cmake --build "$BUILD" --target gpu_tests -j "$(nproc)"
REGC="$BUILD/regc"
if [ ! -x "$REGC" ]; then
    say "no regc binary: nothing more can run"
    say "gpu check: FAILED (above)"
    exit 1
fi
say "regc: $("$REGC" version 2>&1 | head -1)"

# ---- the gpu label, the most telling test first
for t in "gpu_kernel_reference 60" "test_cuda_backend 60" "test_cuda_nf4 30" "test_train_gpu 150" \
    "test_comm_gpu 30"; do
    set -- $t
    part "gpu test $1" "$2" ctest --test-dir "$BUILD" -R "^$1\$" --output-on-failure \
        --timeout "$2" --no-tests=error
    # a failure's reasons into the report too: from this part's output only
    [ "$?" = 0 ] || awk -v h="== gpu test $1 (" 'index($0, h) == 1 { on = 1; next } on' "$LOG" |
        grep -E 'no CUDA device|fail|FAIL|differ|beyond' | grep -v '^==' |
        tail -5 | sed 's/^/    /' | tee -a "$REPORT" >&2
done

# ---- benchmarks: the mean tokens/s over the steps after the first two (the
# first compiles and warms up; at O2 the second captures), device_peak
# beside the plan's figure; at O1, from a profiled run apart, the GEMMs'
# share and rate and the offload copies' time (with the step times of the
# rows with and without offload: how much of the copies compute hid).
bench() {
    local model="$1" batch="$2" seq="$3" precision="$4" level="$5"
    shift 5 # the rest: more flags (a recomputation, an offload)
    local out="$BUILD/bench.out" prof="$BUILD/bench.profile"
    local run=("$REGC" train --model "$model" --backend cuda --batch "$batch" --seq "$seq"
               --json --precision "$precision" --level "$level" --no-cache "$@")
    "${run[@]}" --steps "$STEPS" >"$out" 2>&1 || { cat "$out"; return 1; }
    cat "$out"
    : >"$prof"
    # at O1 a profiled run apart: each kernel timed alone (the GEMMs' share,
    # the copies' time), which the steps timed above must not pay for
    if [ "$level" = O1 ]; then
        "${run[@]}" --steps 3 --profile >"$prof" 2>&1 || { cat "$prof"; return 1; }
        grep -E 'total|copy_|gemm' "$prof" | head -12
    fi
    awk -v what="$model $precision $level $*" -v b="$batch" -v t="$seq" '
        FNR == NR && /"tokens_per_s"/ { n++; s = $0; sub(/.*"tokens_per_s": */, "", s); sub(/[,}].*/, "", s)
                           if (n > 2) { tok += s; k++ }
                           p = $0; if (sub(/.*"device_peak": */, "", p)) { sub(/[,}].*/, "", p); peak = p } }
        FNR == NR && /^device memory per rank/ { plan = $(NF - 1) " " $NF }
        FNR != NR && /total \(GEMMs/ { g = $0; sub(/.*total \(/, "", g); sub(/\).*/, "", g) }
        FNR != NR && / copy_(d2h|h2d) start$/ { copy += $1 }
        END { if (k == 0) exit 1
              printf "%-26s B=%-2d T=%-5d %9.0f tok/s", what, b, t, tok / k
              if (g != "") printf "  GEMMs: %s", g
              if (copy > 0) printf "  copies %.2f ms a step, timed alone", copy
              if (peak != "") printf "  device_peak %.1f MiB", peak / 1048576
              if (plan != "") printf " (planned %s)", plan
              printf "\n" }' "$out" "$prof"
}
run_bench() {
    local line
    line="$(bench "$@")" && { echo "$line" | tail -1 | tee -a "$REPORT" >&2; note "$line"; return 0; }
    note "$line"
    return 1
}
export REGC
export -f bench run_bench
say ""
say "== benchmarks (regc train --backend cuda, $STEPS steps; the mean of steps 3..)"
part "bench gpt2-124m bf16 O1" 40 run_bench gpt2-124m 16 1024 bf16 O1
part "bench gpt2-124m bf16 O2" 40 run_bench gpt2-124m 16 1024 bf16 O2
part "bench gpt2-124m fp32 O1" 40 run_bench gpt2-124m 8 1024 fp32 O1
part "bench llama-127m bf16 O1" 40 run_bench llama-127m 16 1024 bf16 O1
part "bench llama-127m fp32 O1" 40 run_bench llama-127m 8 1024 fp32 O1
part "bench gpt2-124m bf16 O1, recompute full" 40 run_bench gpt2-124m 16 1024 bf16 O1 \
    --recompute full
part "bench gpt2-124m bf16 O1, activations offloaded" 40 run_bench gpt2-124m 16 1024 bf16 O1 \
    --offload-activation on

# ---- PyTorch on the same model and shapes (the machine's torch, if any)
gpt2_config() {
    mkdir -p "$BUILD/gpt2-124m" && cat >"$BUILD/gpt2-124m/config.json" <<'EOF'
{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257,
 "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": null,
 "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "tie_word_embeddings": true,
 "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
EOF
}
say ""
if python3 -c 'import torch, transformers, accelerate; assert torch.cuda.is_available()' 2>>"$LOG"; then
    gpt2_config
    part "torch gpt2-124m bf16" 150 python3 "$SRC/tools/coldstart_vs_torch.py" "$BUILD/gpt2-124m" \
        --device cuda --precision bf16 --layers 12 --batch 16 --seq 1024 --steps 6 \
        --modes eager,regional,regc --regc "$REGC" --out "$REPORT_DIR/torch" &&
        sed 's/^/    /' "$REPORT_DIR/torch/coldstart.md" | tee -a "$REPORT" >&2
else
    say "== torch: SKIPPED (no python3 with torch, transformers and accelerate seeing a GPU)"
fi

# ---- the cold start: compile, cuBLASLt's set-up, the first step; cold and warm
coldstart() {
    "$REGC" coldstart --model gpt2-124m --backend cuda --batch 8 --seq 1024 --layers 12 \
        --repeat 3 --precision bf16 --level "$1" --json
}
export -f coldstart
part "coldstart O1" 30 coldstart O1 && grep '"mode"' "$LOG" | tail -3 | sed 's/^/    /' >>"$REPORT"
part "coldstart O2" 30 coldstart O2 && grep '"mode"' "$LOG" | tail -3 | sed 's/^/    /' >>"$REPORT"

# ---- the launcher from the bundle: two ranks of a small CPU run, so that a
# later run on several processes (the staged communicator over one GPU)
# finds mpirun working
if grep -q '^-- regc: MPI ON' "$LOG"; then
    part "mpirun" 30 mpirun.openmpi -np 2 --oversubscribe --bind-to none "$REGC" train \
        --model gpt2-tiny --steps 2 --threads 1 --no-cache
fi

say ""
say "total: $SECONDS s"
if [ "$failed" = 0 ]; then say "gpu check: every part passed"; else say "gpu check: FAILED (above)"; fi
exit "$failed"
