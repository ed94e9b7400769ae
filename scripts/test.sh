#!/usr/bin/env bash
# Builds (installing what is missing) and runs the whole test suite.
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
meson test -C "$BUILD_DIR" --print-errorlogs --num-processes 2 "$@"
