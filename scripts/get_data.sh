#!/bin/sh
# Provides Fashion-MNIST in IDX format for the examples: installs Debian's
# dataset-fashion-mnist package if needed (it puts the four .gz files in
# /usr/share/datasets/fashion-mnist) and links them into a data directory.
# Prints the directory. Any directory holding the four MNIST files (plain or
# .gz) works as --data_dir, e.g. the original MNIST.
#
# Usage: scripts/get_data.sh [DATA_DIR]     (default ./data/fashion-mnist)
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;; esac  # the comment block above
set -eu

DEST=${1:-./data/fashion-mnist}
SRC=/usr/share/datasets/fashion-mnist
FILES="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"

if [ ! -f "$SRC/train-images-idx3-ubyte.gz" ]; then
  echo "get_data.sh: installing dataset-fashion-mnist (Debian package)" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  if ! $SUDO apt-get install -y dataset-fashion-mnist >&2; then
    $SUDO apt-get update >&2
    $SUDO apt-get install -y dataset-fashion-mnist >&2
  fi
fi

mkdir -p "$DEST"
for f in $FILES; do
  if [ ! -f "$SRC/$f" ]; then
    echo "get_data.sh: $SRC/$f missing after installing dataset-fashion-mnist" >&2
    exit 1
  fi
  # A symlink costs nothing; copy where links are not wanted (LINK=0).
  if [ "${LINK:-1}" = 1 ]; then ln -sf "$SRC/$f" "$DEST/$f"; else cp -f "$SRC/$f" "$DEST/$f"; fi
done
cd "$DEST" && pwd
