#!/usr/bin/env bash
# A host that vanishes without a word (powered off, cut off by the network:
# no FIN, no RST) is taken for gone after --dead_peer_secs, on both sides:
#  1. a sync job of two workers, worker 1's host cut off mid-training: psd
#     lets it go and worker 0 trains to the end alone (before, worker 0
#     waited for worker 1's gradient for good);
#  2. a worker whose psd's host is cut off: its call fails, and the worker
#     exits with an error naming psd, instead of waiting for call_timeout
#     (5 minutes).
# Each host is a network namespace (test/netns_lib.sh).
#   test/dead_peer_test.sh BUILD_DIR      (root only; exits 77 = SKIP otherwise)
set -uo pipefail
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
psd="$build/server/psd"
worker="$build/test/sync_worker"
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; tail -n 20 "$run"/*.log; exit 1; }
source test/netns_lib.sh
why=$(netns_can_run)
[ -z "$why" ] || skip "$why"

tag="dp$$"
nodes=(ps w0 w1)
declare -A addr=([ps]=10.200.0.10 [w0]=10.200.0.11 [w1]=10.200.0.12)
pids=()
run=$(mktemp -d)
trap 'netns_teardown "$tag" "$run" "${nodes[@]}"' EXIT
trap 'exit 130' INT TERM
netns_up "$tag" ps="${addr[ps]}" w0="${addr[w0]}" w1="${addr[w1]}" || fail "could not create the namespaces"

# start_psd NAME PORT: psd in the ps namespace, waits until it listens.
start_psd() {
  ip netns exec "$tag-ps" "$psd" --bind 0.0.0.0 --port "$2" --dead_peer_secs 3 --port_file "$run/$1.port" \
    >"$run/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do [ -s "$run/$1.port" ] && return; sleep 0.05; done
  fail "psd $1 did not listen"
}
# wait_for PATTERN FILE SECONDS
wait_for() {
  for _ in $(seq $(($3 * 10))); do grep -q "$1" "$2" && return 0; sleep 0.1; done
  return 1
}
# seconds_until_exit PID LIMIT: how long PID took to end (LIMIT+1 if it did not).
seconds_until_exit() {
  local start=$SECONDS
  for _ in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || { echo $((SECONDS - start)); return; }; sleep 0.1; done
  echo $(($2 + 1))
}

echo "== 1. a worker's host vanishes; the other trains on"
start_psd sync 2222
ps_hosts="${addr[ps]}:2222"
for i in 0 1; do
  ip netns exec "$tag-w$i" "$worker" --ps_hosts "$ps_hosts" --worker "$i" --workers 2 --replicas 2 \
    --steps 300 --sleep_ms 20 >"$run/w$i.log" 2>&1 &
  pids+=($!)
done
w0=${pids[-2]}
wait_for "as worker 1" "$run/sync.log" 20 || fail "worker 1 never connected"
sleep 1.5
grep -q "sync step .* completed with 1 of 2" "$run/sync.log" && fail "a step completed without worker 1 before the cut"
netns_cut "$tag" w1
took=$(seconds_until_exit "$w0" 40)
[ "$took" -le 40 ] || fail "worker 0 still waiting 40 s after worker 1's host vanished"
wait "$w0" || fail "worker 0 failed"
grep -q "done at global step 300" "$run/w0.log" || fail "worker 0 did not reach step 300"
grep -q "worker 1 (.*) disconnected" "$run/sync.log" || fail "psd never let worker 1 go"
grep -q "completed with 1 of 2 replicas" "$run/sync.log" || fail "no step completed without worker 1"
echo "worker 0 finished ${took} s after worker 1's host vanished (psd --dead_peer_secs 3)"

echo "== 2. psd's host vanishes; the worker fails instead of waiting"
start_psd alone 2223
ip netns exec "$tag-w0" "$worker" --ps_hosts "${addr[ps]}:2223" --worker 0 --workers 1 --replicas 1 \
  --steps 1000000 --sleep_ms 20 --dead_peer_secs 2 >"$run/alone-w0.log" 2>&1 &
pids+=($!)
w=$!
wait_for "as worker 0" "$run/alone.log" 20 || fail "the worker never connected"
sleep 1
netns_cut "$tag" ps
# Found dead after 2 s, then reconnection tried for its 10 s (sync_worker's
# reconnect_timeout) and the 5 s a connection may take to answer hello.
took=$(seconds_until_exit "$w" 40)
[ "$took" -le 40 ] || fail "the worker still waiting 40 s after psd's host vanished"
wait "$w" && fail "the worker exited 0 without its psd"
grep -q "${addr[ps]}:2223" "$run/alone-w0.log" || fail "the worker's error does not name psd: $(cat "$run/alone-w0.log")"
echo "the worker gave up ${took} s after psd's host vanished: $(tail -n 1 "$run/alone-w0.log")"
echo "PASS"
