#!/usr/bin/env bash
# gpu_bundle.sh — the Debian packages a bare GPU machine lacks, downloaded here
# into .gpu-bundle/ (ignored by git), so that tools/gpu_check.sh builds and
# runs there with no package registry and no package manager.
#
# What goes in: the libraries the CUDA build, its tests and its benchmarks
# link (cJSON, xxHash, zlib, CMocka, OpenBLAS on OpenMP, OpenMPI), their
# headers, and the run-time dependencies of those libraries that a machine
# with only gcc, make, CMake, git and Python would not have. The dependency
# closure follows each package's Depends and Pre-Depends, taking the first of
# alternatives, as apt would on a minimal system; a -dev package comes without
# its own dependencies (its headers and link names are all the build reads).
# Packages that the minimal system holds (Debian's required ones and the
# closure of build-essential, cmake, git and python3) are left out, and so
# are two that nothing here uses (SKIP below).
#
# Usage: bash tools/gpu_bundle.sh      (on an amd64 Debian or Ubuntu machine)
# The result is at most 40 MiB, so the tree and the bundle travel together
# within 64 MiB; the script fails if it would be larger.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=.gpu-bundle
LIMIT_MIB=40

# the runtime libraries and programs, and the headers and link names
RUNTIME=(libcjson1 libxxhash0 zlib1g libcmocka0 libopenblas0-openmp libopenmpi3 openmpi-bin
         openmpi-common)
DEV=(libcjson-dev libxxhash-dev zlib1g-dev libcmocka-dev libopenblas-openmp-dev libopenmpi-dev)
# what the minimal machine has: the packages marked required, and these
BASE=(build-essential cmake git python3)
# openssh-client: mpirun's remote launch (one host needs none);
# libhwloc-plugins: hwloc's X11, OpenCL and NVML probes, optional to hwloc
SKIP=(openssh-client libhwloc-plugins)

die() { printf 'gpu_bundle.sh: %s\n' "$*" >&2; exit 1; }

command -v apt-get >/dev/null && command -v apt-cache >/dev/null ||
    die "needs apt-get and apt-cache (a Debian or Ubuntu machine)"
[ "$(dpkg --print-architecture)" = amd64 ] ||
    die "the GPU machines are amd64; this machine is $(dpkg --print-architecture)"
if ! apt-cache show --no-all-versions libcjson1 >/dev/null 2>&1; then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
    ${sudo[@]+"${sudo[@]}"} apt-get update >&2 || die "apt-get update failed"
fi

# The closure of the packages named on the command line under Depends and
# Pre-Depends, one package a line, from the archive's index (one pass over
# `apt-cache dumpavail`): a dependency group stands for its first alternative,
# or for the first package that provides it when it is virtual; a -dev
# package (DEV) adds itself, not its dependencies; SKIP is never entered.
closure() {
    apt-cache dumpavail | awk -v roots="$*" -v dev="${DEV[*]}" -v skip="${SKIP[*]}" '
        function flush() { if (pkg != "" && !(pkg in deps)) deps[pkg] = d; pkg = ""; d = "" }
        /^Package:/ { flush(); pkg = $2 }
        /^(Pre-)?Depends:/ { sub(/^[^:]*: /, ""); d = d (d == "" ? "" : ", ") $0 }
        /^Provides:/ { sub(/^Provides: /, ""); n = split($0, pr, /, /)
                       for (i = 1; i <= n; i++) { sub(/ .*/, "", pr[i])
                                                  if (!(pr[i] in provider)) provider[pr[i]] = pkg } }
        END {
            flush()
            split(dev, dv, " "); for (i in dv) isdev[dv[i]] = 1
            split(skip, sk, " "); for (i in sk) seen[sk[i]] = 1
            n = split(roots, q, " "); head = 1
            while (head <= n) {
                p = q[head++]; sub(/:.*/, "", p)
                if (!(p in deps) && (p in provider)) p = provider[p]
                if (p == "" || (p in seen)) continue
                seen[p] = 1; print p
                if (p in isdev) continue
                m = split(deps[p], g, /, /)
                for (i = 1; i <= m; i++) { sub(/ *\|.*/, "", g[i]); sub(/ .*/, "", g[i]); q[++n] = g[i] }
            }
        }'
}

echo "==> the minimal system's packages" >&2
mapfile -t required < <(apt-cache dumpavail | awk '/^Package:/ { p = $2 }
                                                   /^Priority: required/ { print p }' | sort -u)
declare -A base=()
for p in $(closure "${required[@]}" "${BASE[@]}"); do base[$p]=1; done

echo "==> the closure of ${RUNTIME[*]}" >&2
want=()
for p in $(closure "${RUNTIME[@]}" "${DEV[@]}"); do
    # the named packages always (a -dev's link names point into its runtime)
    if [ -z "${base[$p]:-}" ] || [[ " ${RUNTIME[*]} ${DEV[*]} " == *" $p "* ]]; then
        want+=("$p")
    fi
done
mapfile -t want < <(printf '%s\n' "${want[@]}" | sort -u)

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
echo "==> apt-get download ${#want[@]} packages" >&2
# as root, apt's download user could not write here
as_root=()
[ "$(id -u)" -ne 0 ] || as_root=(-o APT::Sandbox::User=root)
(cd "$OUT.tmp" && apt-get ${as_root[@]+"${as_root[@]}"} download "${want[@]}" >&2) || die "apt-get download failed"
kib=$(du -sk "$OUT.tmp" | cut -f1)
if [ "$kib" -gt $((LIMIT_MIB * 1024)) ]; then
    rm -rf "$OUT.tmp"
    die "the bundle would be $((kib / 1024)) MiB, over its $LIMIT_MIB MiB"
fi
for deb in "$OUT.tmp"/*.deb; do
    dpkg-deb -f "$deb" Package Version | paste -sd ' ' | sed 's/Package: //; s/ Version: / /'
done >"$OUT.tmp/MANIFEST"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "gpu_bundle.sh: $OUT: ${#want[@]} packages, $((kib / 1024)) MiB" >&2
