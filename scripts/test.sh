#!/usr/bin/env bash
# Builds (installing what is missing) and runs the whole test suite.
#   scripts/test.sh
#   scripts/test.sh embedding psd_flags   # meson test's arguments: only these tests
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;; esac  # the comment block above
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The status-page test drives headless Chromium and reports SKIP without it.
# CI installs it; elsewhere it is optional (PS_INSTALL_CHROMIUM=1 to install).
if { [ "${CI:-}" = "true" ] || [ "${PS_INSTALL_CHROMIUM:-}" = "1" ]; } && ! command -v chromium >/dev/null; then
  echo "test: installing chromium for the status-page test"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q chromium  # with its recommended fonts, for readable screenshots
fi
# The Python module's PyTorch tests (python/tests) report SKIP without Debian's
# python3-torch, which pulls in about 640 MB: CI installs it, elsewhere
# PS_INSTALL_TORCH=1 does. With it, single-threaded OpenBLAS: python3-torch's
# matrix products run on whatever libblas.so.3 is, the reference BLAS
# otherwise, which makes the MLP's step about 13x slower (docs/python.md).
torch_installed() {
  for p in python3-torch libopenblas0-serial; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 1
  done
}
if { [ "${CI:-}" = "true" ] || [ "${PS_INSTALL_TORCH:-}" = "1" ]; } && ! torch_installed; then
  echo "test: installing python3-torch and OpenBLAS for the Python module's PyTorch tests"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends python3-torch libopenblas0-serial
fi
# The accuracy, network-namespace and real-data tests train on Fashion-MNIST
# (Debian's dataset-fashion-mnist); without it they would only report SKIP.
scripts/get_data.sh data/fashion-mnist >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
meson test -C "$BUILD_DIR" --print-errorlogs --num-processes 2 "$@"
