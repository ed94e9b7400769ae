#!/usr/bin/env bash
# Installs what is missing (Debian packages), configures and builds psd,
# libpsclient, the examples, tests and benchmarks into ./build.
#   scripts/setup.sh              # as root, or as a user with sudo
#   BUILD_DIR=build-asan MESON_ARGS="-Db_sanitize=address,undefined" scripts/setup.sh
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;; esac  # the comment block above
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential pkg-config meson ninja-build capnproto libcapnp-dev libspdlog-dev libfmt-dev
          libcli11-dev libeigen3-dev catch2 libasio-dev zlib1g-dev python3 iproute2
          python3-dev pybind11-dev python3-numpy python3-pytest  # the psclient Python module and its tests
          python3-yaml python3-venv)  # deploy_render reads the manifests; tensorboard_venv.sh makes a venv
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# CUDA is used when nvcc is found (here or in /usr/local/cuda); otherwise the
# CPU path is built.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # shellcheck disable=SC2086
  meson setup "$BUILD_DIR" ${MESON_ARGS:-}
fi
ninja -C "$BUILD_DIR" -j"$(nproc)"
echo "setup: built into $BUILD_DIR"
