#!/usr/bin/env bash
# scripts/cluster_status.py against real psds: every shard of a two-shard job
# in one table (step, progress, workers seen, state) read from a run directory
# as launch_local.sh leaves it; a sync step waiting for a worker that never
# connected shows as a wait line; an unreachable shard is named, exit 1.
#   test/cluster_status_test.sh BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/trainer_test_lib.sh"
status="$here/../scripts/cluster_status.py"
linreg="$build/examples/linreg_trainer"

# start_psd NAME [FLAGS...]: psd on a free port and HTTP port; sets psd_pid, port.
start_psd() {
  local name=$1; shift
  "$build/server/psd" --port 0 --port_file "$tmp/$name.port" --http_port any --http_port_file "$tmp/run/$name.http" \
    --exit_when_done false "$@" >"$tmp/$name.log" 2>&1 &
  psd_pid=$!; pids+=("$psd_pid")
  wait_for "$tmp/$name.port" '^[0-9]+$' 20 || { fail "$name did not start: $(cat "$tmp/$name.log")"; exit 1; }
  port=$(cat "$tmp/$name.port")
}
mkdir -p "$tmp/run"

# 1. Two shards, as launch_local.sh names them (ps0.http, ps1.http): no job yet.
start_psd ps0 --shard_index 0 --num_shards 2; p0=$port
start_psd ps1 --shard_index 1 --num_shards 2; p1=$port
python3 "$status" "$tmp/run" >"$tmp/idle.txt" 2>&1 || fail "idle cluster: exit $? $(cat "$tmp/idle.txt")"
cat "$tmp/idle.txt"
[ "$(grep -c 'no job yet' "$tmp/idle.txt")" = 2 ] || fail "idle shards not both shown as 'no job yet'"

# 2. A finished job of 150 steps over both shards, one worker.
timeout 60 "$linreg" --job_name=worker --task_index=0 --ps_hosts "127.0.0.1:$p0,127.0.0.1:$p1" \
  --worker_hosts 127.0.0.1:1 --train_steps 150 --log_every 0 >"$tmp/linreg.out" 2>&1 ||
  fail "linreg job: exit $? $(tail -n 3 "$tmp/linreg.out")"
python3 "$status" "$tmp/run" >"$tmp/done.txt" 2>&1 || fail "finished cluster: exit $? $(cat "$tmp/done.txt")"
cat "$tmp/done.txt"
for shard in 0 1; do
  http=$(cat "$tmp/run/ps$shard.http")
  grep -qE "^$shard +127\.0\.0\.1:$http +150 of 150 +100\.0% .* 0 of 1 +0 +finished$" "$tmp/done.txt" ||
    fail "shard $shard's row is not 'step 150 of 150, 100.0%, 0 of 1 workers, finished'"
done
grep -q "^job: async, 1 workers, stop at step 150, finished$" "$tmp/done.txt" || fail "no job line with the ETA"

# 3. A sync job whose second worker never starts: the wait is shown.
start_psd sync0
rm -f "$tmp/run/ps0.http" "$tmp/run/ps1.http"
mv "$tmp/run/sync0.http" "$tmp/run/ps0.http"
"$linreg" --job_name=worker --task_index=0 --ps_hosts "127.0.0.1:$port" --worker_hosts 127.0.0.1:1,127.0.0.1:2 \
  --sync_replicas --train_steps 50 --log_every 0 >"$tmp/sync.out" 2>&1 &
w_pid=$!; pids+=("$w_pid")
seen=0
for _ in $(seq 40); do
  python3 "$status" "$tmp/run" >"$tmp/sync.txt" 2>&1
  if grep -q "^waiting: shard 0: .*workers 1 (never connected)" "$tmp/sync.txt"; then seen=1; break; fi
  sleep 0.5
done
cat "$tmp/sync.txt"
[ "$seen" = 1 ] || fail "the sync wait for worker 1 is not shown"
grep -qE "^0 +127\.0\.0\.1:[0-9]+ +0 of 50 +0\.0% .* 1 of 1 +1 +training$" "$tmp/sync.txt" ||
  fail "the waiting shard's row is not 'step 0 of 50, 1 of 1 workers, 1 wait, training'"
kill "$w_pid" 2>/dev/null

# 4. An address where nothing listens: named, exit 1.
free=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 "$status" "127.0.0.1:$free" >"$tmp/none.txt" 2>&1; rc=$?
[ "$rc" = 1 ] || fail "an unreachable shard: exit $rc, not 1"
grep -qE "127\.0\.0\.1:$free +unreachable: connection refused" "$tmp/none.txt" || fail "the unreachable shard is not named: $(cat "$tmp/none.txt")"

# 4b. A psd whose HTTP port wants a token: said so, not "unreachable"; with the token, shown.
printf 'sekrit\n' >"$tmp/token"
start_psd tok --auth_token_file "$tmp/token"
tok_http=$(cat "$tmp/run/tok.http")
python3 "$status" "127.0.0.1:$tok_http" >"$tmp/tok.txt" 2>&1; rc=$?
[ "$rc" = 1 ] || fail "a psd that wants a token: exit $rc, not 1"
grep -qE "127\.0\.0\.1:$tok_http +psd needs a token: --token_file FILE" "$tmp/tok.txt" ||
  fail "the missing token is not named: $(cat "$tmp/tok.txt")"
python3 "$status" --token_file "$tmp/token" "127.0.0.1:$tok_http" >"$tmp/tok2.txt" 2>&1 ||
  fail "with --token_file: exit $? $(cat "$tmp/tok2.txt")"
grep -q "no job yet" "$tmp/tok2.txt" || fail "with --token_file the shard is not shown: $(cat "$tmp/tok2.txt")"

# 5. Bad arguments: one line naming the argument, exit 2, no traceback.
bad() {  # NAME MESSAGE_REGEX ARGS...
  local name=$1 want=$2; shift 2
  timeout 20 python3 "$status" "$@" >"$tmp/bad.txt" 2>&1; local rc=$?
  if [ "$rc" != 2 ] || [ "$(wc -l <"$tmp/bad.txt")" != 1 ] || ! grep -qE -- "$want" "$tmp/bad.txt"; then
    fail "$name: exit $rc (want 2), want one line /$want/: $(cat "$tmp/bad.txt")"
  fi
}
mkdir -p "$tmp/badrun" "$tmp/norun"
echo garbage >"$tmp/badrun/ps0.http"
bad "missing --token_file" "^cluster_status: --token_file $tmp/nope: No such file" --token_file "$tmp/nope" "127.0.0.1:$free"
bad "--timeout 0" "^cluster_status: --timeout must be" --timeout 0 "127.0.0.1:$free"
bad "--timeout nan" "^cluster_status: --timeout must be" --timeout nan "127.0.0.1:$free"
bad "--watch nan" "^cluster_status: --watch must be" --watch nan "127.0.0.1:$free"
bad "port 99999" "^cluster_status: '127.0.0.1:99999': the port must be" 127.0.0.1:99999
bad "garbage in ps0.http" "^cluster_status: .*ps0.http holds 'garbage', not a port number" "$tmp/badrun"
bad "no ps<i>.http" "^cluster_status: .* has no ps<i>.http files" "$tmp/norun"

[ "$failures" = 0 ] && echo "cluster_status: all checks passed"
exit "$failures"
