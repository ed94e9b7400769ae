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
if grep -qxF "$want" "$run/err"; then
  echo "PASS: $want"
else
  echo "FAIL: expected the line '$want'; launch_local said:"; grep "launch_local:" "$run/err"; exit 1
fi
