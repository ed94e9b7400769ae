#!/usr/bin/env bash
# Makes a Python virtual environment with TensorBoard in it (Debian 12 does
# not package tensorboard), for reading the trainers' event files with
# TensorBoard's own reader and for `tensorboard --logdir`.
#
#   scripts/tensorboard_venv.sh [DIR]      # default: build/venv-tb
#   build/venv-tb/bin/tensorboard --logdir runs/tb
#
# Does nothing when DIR already imports tensorboard. Needs PyPI (pip); exits
# 1 with one line on stderr when the environment cannot be made.
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;; esac  # the comment block above
set -euo pipefail
dir=${1:-build/venv-tb}
py=${PYTHON:-python3}
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import tensorboard' 2>/dev/null; then
  exit 0
fi
if ! "$py" -m venv "$dir" >"${TMPDIR:-/tmp}/tensorboard_venv.$$.log" 2>&1; then
  echo "tensorboard_venv: '$py -m venv $dir' failed (Debian: apt-get install python3-venv): $(tail -n 1 "${TMPDIR:-/tmp}/tensorboard_venv.$$.log")" >&2
  rm -f "${TMPDIR:-/tmp}/tensorboard_venv.$$.log"
  exit 1
fi
rm -f "${TMPDIR:-/tmp}/tensorboard_venv.$$.log"
# A bounded wait: without network pip would retry for minutes.
if ! "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 20 --retries 1 \
    tensorboard >"$dir/pip-install.log" 2>&1; then
  echo "tensorboard_venv: pip could not install tensorboard into $dir (no network to PyPI?): $(tail -n 1 "$dir/pip-install.log")" >&2
  exit 1
fi
"$dir/bin/python" -c 'import tensorboard' || { echo "tensorboard_venv: tensorboard installed but not importable from $dir" >&2; exit 1; }
