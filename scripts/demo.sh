#!/usr/bin/env bash
# The first thing to run: a short distributed Fashion-MNIST training on this
# machine, 1 psd + 3 workers through scripts/launch_local.sh (async, 3
# epochs of the 784-100-10 MLP), ending with the test accuracy.
#   scripts/demo.sh [-- more trainer flags]
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;; esac  # the comment block above
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
data=$(scripts/get_data.sh data/fashion-mnist)
[ "${1:-}" = -- ] && shift
exec scripts/launch_local.sh --workers 3 --ps 1 -- --data_dir "$data" --epochs 3 --log_every 100 "$@"
