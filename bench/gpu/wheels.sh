#!/usr/bin/env bash
# Download, on a machine with the package index, every wheel the GPU check needs that the GPU host lacks
# (bench/gpu/wheels.txt, pinned), for CPython 3.12 manylinux x86-64 (the host's), into DIR. Carry DIR to
# the host and run: bash bench/gpu/run.sh --wheels DIR (nothing is fetched there).
#
#   bash bench/gpu/wheels.sh DIR [--python-version 3.12]
#
# --python-version: the target interpreter (3.12 by default; the CPU test uses this machine's own).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:?usage: bash bench/gpu/wheels.sh DIR [--python-version X.Y]}"
shift
VERSION=3.12
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) VERSION="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-$(command -v python3 || command -v python)}"
mkdir -p "$DIR"
grep -v '^#' "$REPO/bench/gpu/wheels.txt" | grep -v '^$' > "$DIR/wheels.txt"
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --dest "$DIR" \
  --python-version "$VERSION" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_28_x86_64 \
  -r "$DIR/wheels.txt"
count=$(ls "$DIR"/*.whl | wc -l)
want=$(wc -l < "$DIR/wheels.txt")
if [ "$count" -ne "$want" ]; then
  echo "expected $want wheels in $DIR, found $count" >&2
  exit 1
fi
echo "$count wheels for CPython $VERSION in $DIR"
