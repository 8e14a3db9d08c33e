#!/usr/bin/env bash
# gpu_preflight.sh — tools/gpu_check.sh run here as a bare GPU machine would
# run it, before any time is spent on one: a minimal Debian (debootstrap:
# build-essential, cmake, git and python3, nothing else), the CUDA toolkit
# mounted read-only, the tree and .gpu-bundle/ copied in, no network
# (unshare -n). It passes when configure and build pass there and every gpu
# test fails only for want of a device (regc's one line "no CUDA device"),
# with no apt-get, apt or tools/setup.sh run inside (each is replaced there
# by a trap that records the call).
#
# Run it after any change to the build or to the check. It needs root,
# debootstrap and a package registry for the first root; it takes minutes
# and is not part of the test command.
#
# Usage: bash tools/gpu_preflight.sh [--fresh]
#   --fresh   make the minimal root again (kept in build-preflight/root)
# Environment: PREFLIGHT (default build-preflight), CUDA_HOME (default the
# target of /usr/local/cuda), MIRROR (default http://deb.debian.org/debian),
# SUITE (default bookworm).
# Writes PREFLIGHT/report.txt and PREFLIGHT/check.log; exit 0 when it passed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
SRC="$PWD"
PREFLIGHT="${PREFLIGHT:-build-preflight}"
CUDA_HOME="${CUDA_HOME:-$(readlink -f /usr/local/cuda)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SUITE="${SUITE:-bookworm}"
mkdir -p "$PREFLIGHT"
PREFLIGHT="$(cd "$PREFLIGHT" && pwd)"
ROOT="$PREFLIGHT/root"

die() { printf 'gpu_preflight.sh: %s\n' "$*" >&2; exit 1; }
log() { printf '==> %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, mounts, chroot)"
command -v debootstrap >/dev/null || die "needs debootstrap (apt-get install debootstrap)"
command -v unshare >/dev/null || die "needs unshare (util-linux)"
[ -x "$CUDA_HOME/bin/nvcc" ] || die "$CUDA_HOME: no CUDA toolkit (set CUDA_HOME)"

if [ "${1:-}" = --fresh ]; then
    rm -rf "$ROOT"
elif [ -n "${1:-}" ]; then
    die "unknown argument $1 (usage: gpu_preflight.sh [--fresh])"
fi

# ---- the bare machine: made once, reused (the check never installs into it)
if [ ! -f "$ROOT/.complete" ]; then
    rm -rf "$ROOT"
    log "debootstrap $SUITE (minbase + build-essential cmake git python3) into $ROOT"
    debootstrap --variant=minbase --include=build-essential,cmake,git,python3 \
        "$SUITE" "$ROOT" "$MIRROR" >"$PREFLIGHT/debootstrap.log" 2>&1 ||
        die "debootstrap failed (its log: $PREFLIGHT/debootstrap.log)"
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb
    touch "$ROOT/.complete"
fi

# ---- the tree as the GPU machine receives it: tracked and untracked files
# that git does not ignore, and the bundle; no build output, no .git
[ -d .gpu-bundle ] || { log "no .gpu-bundle: making it"; bash tools/gpu_bundle.sh; }
log "copying the tree and .gpu-bundle into the root"
rm -rf "$ROOT/regc" "$ROOT/report" "$ROOT/preflight-trap"
mkdir -p "$ROOT/regc" "$ROOT/report"
git ls-files -z -co --exclude-standard |
    tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$ROOT/regc"
cp -r .gpu-bundle "$ROOT/regc/"

# the traps: a package manager or the CPU set-up run inside is recorded
trap_script='#!/bin/sh
echo "$0 $*" >>/preflight-trap
echo "gpu_preflight: $0 is not available on the GPU machine" >&2
exit 1'
for t in /usr/local/sbin/apt-get /usr/local/sbin/apt /regc/tools/setup.sh; do
    printf '%s\n' "$trap_script" >"$ROOT$t"
    chmod +x "$ROOT$t"
done
mkdir -p "$ROOT/usr/local/cuda-mount"
ln -sfn cuda-mount "$ROOT/usr/local/cuda"

# ---- the check, in its own mount, network and process namespaces: the
# toolkit read-only, no network, nothing left mounted when it ends
log "tools/gpu_check.sh in the root, without network"
t0=$SECONDS
rc=0
unshare --mount --net --pid --fork bash -c '
    set -e
    root="$1" cuda="$2"
    mount --make-rprivate /
    ip link set lo up 2>/dev/null || true # a machine has its loopback (OpenMPI asks)
    mount --bind "$cuda" "$root/usr/local/cuda-mount"
    mount -o remount,bind,ro "$root/usr/local/cuda-mount"
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount --rbind /sys "$root/sys"
    mount -t tmpfs tmpfs "$root/tmp"
    exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/cuda/bin \
        bash -c "cd /regc && REPORT_DIR=/report bash tools/gpu_check.sh"
' preflight "$ROOT" "$CUDA_HOME" || rc=$?
took=$((SECONDS - t0))
cp "$ROOT/report/report.txt" "$ROOT/report/check.log" "$PREFLIGHT/" 2>/dev/null || true
log "the check took $took s (exit $rc); its report: $PREFLIGHT/report.txt"

# ---- the verdict
report="$PREFLIGHT/report.txt"
checklog="$PREFLIGHT/check.log"
[ -f "$report" ] || die "no report came back"
bad=0
fail() { printf 'gpu_preflight.sh: FAILED: %s\n' "$*" >&2; bad=1; }
for p in configure build; do
    grep -q "^== $p: passed" "$report" || fail "$p did not pass (see $checklog)"
done
# every gpu test ran and failed, and its output says no device is why
gpu_tests="gpu_kernel_reference test_cuda_backend test_cuda_nf4 test_train_gpu test_comm_gpu"
for t in $gpu_tests; do
    grep -q "^== gpu test $t: FAILED" "$report" || fail "gpu test $t did not fail as it must"
    awk -v t="$t" '$0 ~ "^== gpu test " t " " { on = 1; next } /^== / { on = 0 }
                   on && /no CUDA device/ { found = 1 } END { exit !found }' "$checklog" ||
        fail "gpu test $t failed for another reason than no CUDA device (see $checklog)"
done
[ ! -s "$ROOT/preflight-trap" ] || fail "ran what the GPU machine lacks: $(paste -sd ';' "$ROOT/preflight-trap")"
[ "$took" -le 600 ] || fail "the check took $took s, over 10 minutes"
size=$(du -sk .gpu-bundle | cut -f1)
[ "$size" -le $((40 * 1024)) ] || fail ".gpu-bundle is $((size / 1024)) MiB, over 40"
git check-ignore -q .gpu-bundle/MANIFEST || fail ".gpu-bundle is not ignored by git"
if [ "$bad" = 0 ]; then
    echo "gpu_preflight.sh: passed: configure and build passed in a bare root without network;" \
        "every gpu test failed for want of a device; the check took $took s"
fi
exit "$bad"
