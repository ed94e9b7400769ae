#!/usr/bin/env bash
# docs/first-hour.md's install recipe after scripts/setup.sh: the build
# directory's prefix set with `meson configure`, then `ninja install` puts
# psd and libpsclient under that prefix, without root and without
# "Directory already configured". The build's own prefix is put back after.
# Then README's C++ example (the block after "## Using libpsclient") is
# saved as hello.cc, built with README's pkg-config line against that prefix
# alone, and run against the installed psd: its loss must fall and w reach
# the line it fits (y = 3x + 1).
#   test/install_recipe_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
psd_pid=
old=$(meson introspect "$build" --buildoptions |
      python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
# The prefix put back, and the install plan made anew from it (ninja build.ninja):
# a later `meson install --no-rebuild` read the plan left with the temporary prefix.
trap '[ -n "$psd_pid" ] && kill "$psd_pid" 2>/dev/null; meson configure "$build" --prefix="$old" >/dev/null 2>&1 && ninja -C "$build" build.ninja >/dev/null 2>&1; rm -rf "$tmp"' EXIT
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

# README's C++ example, built and run against the install.
python3 - "$src/README.md" "$tmp/hello.cc" <<'PY' || { echo "FAIL: no C++ block after '## Using libpsclient' in README.md"; exit 1; }
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"## Using libpsclient\n.*?```cpp\n(.*?)```", text, re.S)
if not m:
    sys.exit(1)
open(sys.argv[2], "w").write(m.group(1))
PY
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir psclient)
PKG_CONFIG_PATH=$(dirname "$pc") c++ -std=c++20 -Wall -Wextra "$tmp/hello.cc" \
  $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs psclient) -o "$tmp/hello" 2>"$tmp/cc.log" ||
  { echo "FAIL: README's example does not build against the install"; cat "$tmp/cc.log"; exit 1; }
[ -s "$tmp/cc.log" ] && { echo "FAIL: README's example builds with warnings"; cat "$tmp/cc.log"; exit 1; }
"$prefix/bin/psd" --port 0 --port_file "$tmp/port" --log_level warn >"$tmp/psd.log" 2>&1 &
psd_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
[ -s "$tmp/port" ] || { echo "FAIL: the installed psd did not start: $(cat "$tmp/psd.log")"; exit 1; }
LD_LIBRARY_PATH="$libdir" timeout 60 "$tmp/hello" "127.0.0.1:$(cat "$tmp/port")" >"$tmp/hello.out" 2>&1 ||
  { echo "FAIL: README's example failed: exit $?"; cat "$tmp/hello.out"; exit 1; }
cat "$tmp/hello.out"
# step 0 loss L0 w = a b ... step 200 loss L w = a b: a real gradient brings the loss
# from 6.265 (w = 0) to nothing, and w to (3, 1).
python3 - "$tmp/hello.out" <<'PY' || exit 1
import re, sys
rows = [(int(s), float(l), float(a), float(b)) for s, l, a, b in
        re.findall(r"step (\d+) loss (\S+) w = (\S+) (\S+)", open(sys.argv[1]).read())]
problems = []
if [r[0] for r in rows] != [0, 50, 100, 150, 200]:
    problems.append(f"steps printed {[r[0] for r in rows]}, expected 0, 50, ..., 200")
else:
    losses = [r[1] for r in rows]
    if abs(losses[0] - 6.265) > 0.006:  # printed with 3 digits
        problems.append(f"loss at w = 0 is {losses[0]}, expected 6.265 (mean of (3x+1)^2)")
    if any(b >= a for a, b in zip(losses, losses[1:])) or losses[-1] > 1e-6:
        problems.append(f"the loss does not fall to 0: {losses}")
    if abs(rows[-1][2] - 3) > 1e-3 or abs(rows[-1][3] - 1) > 1e-3:
        problems.append(f"w = {rows[-1][2:]}, expected (3, 1)")
for p in problems:
    print("FAIL:", p)
sys.exit(1 if problems else 0)
PY
echo "PASS: README's C++ example, built against the install, fits y = 3x + 1 against the installed psd"
