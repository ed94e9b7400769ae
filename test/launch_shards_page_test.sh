#!/usr/bin/env bash
# launch_local.sh with two shards prints psd 0's page with the other shard in
# ?shards= (docs/first-hour.md, "Every shard on one page"), and both ports
# are the ones the psds wrote to the run directory.
#   test/launch_shards_page_test.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
BUILD_DIR="$build" timeout 120 scripts/launch_local.sh --ps 2 --workers 1 --run_dir "$run/run" \
  --timeout 100 --trainer "$build/examples/linreg_trainer" -- --train_steps 100 2>"$run/err" >/dev/null
rc=$?
[ $rc = 0 ] || { echo "FAIL: launch_local exited $rc"; tail -n 20 "$run/err"; exit 1; }
p0=$(cat "$run/run/ps0.http" 2>/dev/null); p1=$(cat "$run/run/ps1.http" 2>/dev/null)
[ -n "$p0" ] && [ -n "$p1" ] || { echo "FAIL: no ps0.http/ps1.http in the run directory"; exit 1; }
want="launch_local: all shards on one page: http://127.0.0.1:$p0/?shards=127.0.0.1:$p1"
grep -qxF "$want" "$run/err" ||
  { echo "FAIL: expected the line '$want'; launch_local said:"; grep "launch_local:" "$run/err"; exit 1; }

# A status page port of the user's own (--psd_flags "--http_port N"): the
# launcher still says where it is, and leaves it for cluster_status.py.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
BUILD_DIR="$build" timeout 120 scripts/launch_local.sh --workers 1 --run_dir "$run/own" --timeout 100 \
  --psd_flags "--http_port $port" --trainer "$build/examples/linreg_trainer" -- --train_steps 50 \
  2>"$run/own_err" >/dev/null
rc=$?
[ $rc = 0 ] || { echo "FAIL: launch_local --psd_flags --http_port exited $rc"; tail -n 20 "$run/own_err"; exit 1; }
[ "$(cat "$run/own/ps0.http" 2>/dev/null)" = "$port" ] || { echo "FAIL: no ps0.http of port $port"; exit 1; }
grep -qxF "launch_local: ps0 status page: http://127.0.0.1:$port/" "$run/own_err" ||
  { echo "FAIL: no status page line for --http_port $port:"; grep "launch_local:" "$run/own_err"; exit 1; }
echo "PASS: $want; a --http_port of the user's own is said too"
