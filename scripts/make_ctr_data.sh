#!/usr/bin/env bash
# Writes N synthetic click examples in the Criteo TSV layout to OUT and prints
# the planted model's log-loss and AUC on the held-out part (the last 10%).
#
#   scripts/make_ctr_data.sh OUT N [make_ctr_data flags...]
#   scripts/make_ctr_data.sh data/ctr/synthetic.tsv 1000000
#   scripts/make_ctr_data.sh /tmp/small.tsv 10000 --seed 7 --max_distinct 100000
#
# Environment: BUILD_DIR (default build), where examples/make_ctr_data is built.
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;; esac  # the comment block above
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
out=$1 n=$2
shift 2
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${BUILD_DIR:-$root/build}/examples/make_ctr_data"
if [ ! -x "$bin" ]; then
  echo "make_ctr_data.sh: $bin not built; run: ninja -C ${BUILD_DIR:-build} examples/make_ctr_data" >&2
  exit 2
fi
mkdir -p "$(dirname "$out")"
exec "$bin" --out "$out" --examples "$n" "$@"
