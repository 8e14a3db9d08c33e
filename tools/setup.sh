#!/usr/bin/env bash
# setup.sh — install what is missing, build, and run regc or its tests.
#
#   tools/setup.sh build        install missing packages, Release build in build/
#   tools/setup.sh run [ARGS]   build, then `regc train ARGS`
#                               (default ARGS: --model gpt2-tiny --steps 20)
#   tools/setup.sh test         check the formatting, build, ctest (everything but the
#                               gpu label), the same built without -march=native in
#                               build-portable (and its weights against the
#                               native build's), then the ASan/UBSan build in
#                               build-sanitize and its ctest, then every libFuzzer
#                               harness for 30 s (tools/fuzz.sh, clang, build-fuzz)
#
# Works unattended on a fresh Debian/Ubuntu machine (as root, or with sudo).
# The CUDA backend is built when a CUDA toolkit is found; nothing here needs a GPU.
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."

# clang and libclang-rt-14-dev: the fuzz build (libFuzzer's runtime is in the
# latter, which clang only recommends on Debian bookworm).
PACKAGES=(cmake gcc make pkg-config libcjson-dev zlib1g-dev libxxhash-dev libcmocka-dev
          libopenblas-dev libopenblas-openmp-dev clang-format python3 libopenmpi-dev openmpi-bin
          clang libclang-rt-14-dev)
JOBS="$(nproc 2>/dev/null || echo 2)"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'setup.sh: %s\n' "$*" >&2; exit 1; }

install_missing() {
    command -v dpkg >/dev/null 2>&1 || die "dpkg not found: install ${PACKAGES[*]} by hand"
    local missing=() pkg
    for pkg in "${PACKAGES[@]}"; do
        # "install ok installed" rather than mere presence: a removed package
        # leaves its config behind and still answers dpkg -s.
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
            missing+=("$pkg")
        fi
    done
    [ "${#missing[@]}" -eq 0 ] && return 0

    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "not root and no sudo: install ${missing[*]}"
        sudo=(sudo -n)
    fi
    log "installing ${missing[*]}"
    ${sudo[@]+"${sudo[@]}"} apt-get update >&2
    ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}" </dev/null >&2
}

# Configuring every time is cheap once the cache exists, and picks up a
# changed preset that an incremental build alone would not. Build chatter goes
# to stderr so that `setup.sh run --json` leaves stdout to regc's JSON lines.
build_preset() {
    local preset="$1"
    log "configuring and building (preset $preset)"
    cmake --preset "$preset" >&2
    cmake --build --preset "$preset" -j"$JOBS" >&2
}

cmd_build() {
    install_missing
    build_preset default
}

cmd_run() {
    cmd_build
    if [ "$#" -eq 0 ]; then
        set -- --model gpt2-tiny --steps 20
    fi
    log "build/regc train $*"
    build/regc train "$@"
}

cmd_test() {
    install_missing
    log "tools/check_format.sh"
    bash tools/check_format.sh
    cmd_build
    log "ctest --preset default"
    ctest --preset default

    # without -march=native: one binary for every x86-64 CPU, its GEMM and
    # vector loops chosen at run time, and the native build's bits
    build_preset portable
    log "ctest --preset portable"
    ctest --preset portable
    log "tools/check_portable_bits.sh"
    bash tools/check_portable_bits.sh build/regc build-portable/regc

    build_preset sanitize
    log "ctest --preset sanitize"
    ctest --preset sanitize

    # every parser under libFuzzer, ASan and UBSan; any finding fails
    log "tools/fuzz.sh 30"
    bash tools/fuzz.sh 30
}

usage() {
    sed -n '2,13p' "$SELF" | sed 's/^# \{0,1\}//'
}

case "${1:-}" in
    build) shift; cmd_build "$@" ;;
    run) shift; cmd_run "$@" ;;
    test) shift; [ "$#" -eq 0 ] || die "test takes no arguments"; cmd_test ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
esac
