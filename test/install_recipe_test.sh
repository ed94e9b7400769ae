#!/usr/bin/env bash
# docs/first-hour.md's install recipe after scripts/setup.sh: the build
# directory's prefix set with `meson configure`, then `ninja install` puts
# psd and libpsclient under that prefix, without root and without
# "Directory already configured". The build's own prefix is put back after.
#   test/install_recipe_test.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
old=$(meson introspect "$build" --buildoptions |
      python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
trap 'meson configure "$build" --prefix="$old" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
prefix="$tmp/psd"
{ meson configure "$build" --prefix="$prefix" && ninja -C "$build" install; } >"$tmp/out" 2>&1 ||
  { echo "FAIL: the recipe failed"; tail -n 20 "$tmp/out"; exit 1; }
if grep -q "already configured" "$tmp/out"; then echo "FAIL: $(grep "already configured" "$tmp/out")"; exit 1; fi
[ -x "$prefix/bin/psd" ] || { echo "FAIL: no $prefix/bin/psd"; tail -n 20 "$tmp/out"; exit 1; }
pc=$(find "$prefix" -name psclient.pc | head -1)
[ -n "$pc" ] || { echo "FAIL: no psclient.pc under $prefix"; exit 1; }
PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs psclient >/dev/null ||
  { echo "FAIL: pkg-config psclient"; exit 1; }
"$prefix/bin/psd" --help >/dev/null || { echo "FAIL: the installed psd does not run"; exit 1; }
echo "PASS: meson configure --prefix + ninja install put psd and libpsclient under $prefix"
