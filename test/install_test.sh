#!/usr/bin/env bash
# meson install into a temporary prefix; examples/custom_trainer/my_trainer.cc
# (the README's own-trainer example) builds with pkg-config against it alone
# and trains against the installed psd.
#   test/install_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$(cd "$1" && pwd); src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
meson install -C "$build" --destdir "$tmp/dest" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
  { echo "FAIL: meson install"; tail "$tmp/install.log"; exit 1; }
option() { meson introspect "$build" --buildoptions | python3 -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]==sys.argv[1]][0])' "$1"; }
prefix=$(option prefix)
# A sanitizer build's library needs the trainer built with the same
# sanitizer (its runtime must come first), and that runtime's link-time
# notices are not ours.
sanitize=$(option b_sanitize)
extra=()
[ "$sanitize" != none ] && extra=("-fsanitize=$sanitize")
root="$tmp/dest$prefix"
pc=$(dirname "$(find "$root" -name psclient.pc | head -1)")
[ -n "$pc" ] || { echo "FAIL: no psclient.pc installed"; exit 1; }
# The .pc names the real prefix; point it at the staged one.
export PKG_CONFIG_PATH="$pc" PKG_CONFIG_SYSROOT_DIR="$tmp/dest"
echo "pkg-config --cflags --libs psclient: $(pkg-config --cflags --libs psclient)"
c++ -std=c++20 -Wall -Wextra "${extra[@]}" "$src/examples/custom_trainer/my_trainer.cc" $(pkg-config --cflags --libs psclient) \
  -Wl,-rpath,"$(pkg-config --variable=libdir psclient)" -o "$tmp/my_trainer" 2>"$tmp/cc.log" ||
  { echo "FAIL: compiling against the installed library"; cat "$tmp/cc.log"; exit 1; }
grep -v -E '/lib(a|ub)san\.so' "$tmp/cc.log" >"$tmp/ours.log"
[ -s "$tmp/ours.log" ] && { echo "FAIL: warnings"; cat "$tmp/ours.log"; exit 1; }
# No include path into the source tree: only the staged prefix.
"$root/bin/psd" --port 0 --port_file "$tmp/port" --log_level warn &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.05; done
timeout 60 "$tmp/my_trainer" --job_name worker --task_index 0 --ps_hosts "127.0.0.1:$(cat "$tmp/port")" \
  --worker_hosts 127.0.0.1:1 >"$tmp/out" 2>&1 || { echo "FAIL: my_trainer"; cat "$tmp/out"; exit 1; }
cat "$tmp/out"
grep -q "w = 3.0" "$tmp/out" || { echo "FAIL: did not converge"; exit 1; }
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$pid" 2>/dev/null && { echo "FAIL: psd still running after the job finished"; exit 1; }
pid=""
echo "PASS: installed libpsclient + pkg-config builds and runs a trainer"
