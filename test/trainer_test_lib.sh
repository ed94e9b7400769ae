# Shared set-up of the trainer shell tests, sourced after `set -uo pipefail`
# with the build directory as $1: build, here (test/), a temporary directory
# removed at exit with every process whose PID is added to pids, and the
# failure counter the test ends on.
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# wait_for FILE REGEX SECONDS: whether REGEX shows up in FILE in time.
wait_for() {
  local i
  for i in $(seq $(($3 * 10))); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
