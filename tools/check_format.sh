#!/usr/bin/env bash
# check_format.sh — every C, header and CUDA file in the repository is as
# clang-format (with the repository's .clang-format) writes it.
#
#   tools/check_format.sh          list the files that differ; exit 1 if any
#   tools/check_format.sh --fix    reformat them in place
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format >/dev/null 2>&1 || { echo "check_format.sh: clang-format not found (apt-get install clang-format)" >&2; exit 1; }
# tracked files and new ones not yet added (a new harness in tests/fuzz/,
# say), but nothing git ignores (build trees)
mapfile -t listed < <(git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu')
files=()
for f in "${listed[@]}"; do
    [ -f "$f" ] && files+=("$f") # a file deleted but not yet from the index
done
if [ "${1:-}" = "--fix" ]; then
    clang-format -i "${files[@]}"
    exit 0
fi
bad=0
for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "check_format.sh: $f is not formatted (tools/check_format.sh --fix)" >&2
        bad=1
    fi
done
exit "$bad"
