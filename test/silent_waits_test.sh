#!/usr/bin/env bash
# No silent waits: a worker whose psd is not up says what it waits for; a
# declared worker that never starts is named, every few seconds, by the
# chief, psd's log and psd's status page, at sync step 0 and at the end
# barrier; a sync job goes on without it after --worker_timeout_secs; each
# worker line says how long it waits at most (a worker waiting for the chief too);
# launch_local.sh says when a psd is slow to start listening.
#   test/silent_waits_test.sh BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/trainer_test_lib.sh"
trainer="$build/examples/mnist_trainer"
stop() { kill "$@" 2>/dev/null; wait "$@" 2>/dev/null; }

python3 "$here/tiny_mnist.py" "$tmp/data" 600 100
common=(--data_dir "$tmp/data" --validation_size 100 --log_every 0 --train_steps 10)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# 1. No psd: the worker says what it waits for, and for how long.
port=$(free_port)
timeout 30 "$trainer" --job_name=worker --task_index 0 --ps_hosts "127.0.0.1:$port" "${common[@]}" \
  --connect_timeout 7 >"$tmp/nops.out" 2>&1
rc=$?
[ "$rc" = 3 ] || fail "no psd: exit $rc (want 3)"
grep -q "waiting for ps 127.0.0.1:$port (shard 0): 5 s of 7 s" "$tmp/nops.out" ||
  fail "no psd: no word while waiting: $(cat "$tmp/nops.out")"

# start_psd NAME [FLAGS...]: psd on a free port, HTTP on another; sets psd_pid, psd_port, http.
start_psd() {
  local name=$1; shift
  "$build/server/psd" --port 0 --port_file "$tmp/$name.port" --http_port any --http_port_file "$tmp/$name.http" "$@" \
    >"$tmp/$name.log" 2>&1 &
  psd_pid=$!; pids+=("$psd_pid")
  wait_for "$tmp/$name.http" . 10 || fail "$name did not start: $(cat "$tmp/$name.log")"
  sleep 0.2
  psd_port=$(cat "$tmp/$name.port"); http=$(cat "$tmp/$name.http")
}
# 1b. A worker given psd's HTTP port: something accepts and hangs up; the
# worker says so (not "is psd running there?"), and the error names the port mix-up.
start_psd http_port_mixup
timeout 30 "$trainer" --job_name=worker --task_index 0 --ps_hosts "127.0.0.1:$http" "${common[@]}" \
  --connect_timeout 6 >"$tmp/mixup.out" 2>&1
rc=$?
[ "$rc" = 3 ] || fail "HTTP port as ps host: exit $rc (want 3)"
grep -q "waiting for ps 127.0.0.1:$http (shard 0): 5 s of 6 s (connect_timeout); it accepts connections but closes them before answering hello" "$tmp/mixup.out" ||
  fail "HTTP port as ps host: the wait line: $(cat "$tmp/mixup.out")"
grep -q "error: could not connect to 1 of 1 ps shards: 127.0.0.1:$http accepted the connection but closed it before answering hello.*not its --http_port" "$tmp/mixup.out" ||
  fail "HTTP port as ps host: the error: $(cat "$tmp/mixup.out")"
stop "$psd_pid"

# chief NAME [FLAGS...]: worker 0 of 2 (worker 1 never starts), in the background; sets chief_pid.
chief() {
  local name=$1; shift
  "$trainer" --job_name=worker --task_index 0 --ps_hosts "127.0.0.1:$psd_port" \
    --worker_hosts 127.0.0.1:1,127.0.0.1:2 "${common[@]}" "$@" >"$tmp/$name.out" 2>&1 &
  chief_pid=$!; pids+=("$chief_pid")
}

# 2. Sync, worker 1 never connects, --worker_timeout_secs 0: named at step 0, it waits.
start_psd psd2
chief sync --sync_replicas
want="sync step 0 waits for workers 1 \(never connected\)"
wait_for "$tmp/sync.out" "worker 0: pull for the next sync step: waiting [0-9]+ s of [0-9]+ s; psd: $want" 15 ||
  fail "sync: the chief does not say what step 0 waits for: $(tail -n 5 "$tmp/sync.out")"
wait_for "$tmp/psd2.log" "$want.*--worker_timeout_secs is 0" 5 ||
  fail "sync: psd's log does not say what step 0 waits for: $(tail -n 5 "$tmp/psd2.log")"
python3 - "$http" <<'PY' || fail "sync: psd's status page does not say what step 0 waits for"
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/status.json", timeout=5))
sys.exit(0 if any("sync step 0 waits for workers 1 (never connected)" in w for w in s["waits"]) else 1)
PY
stop "$chief_pid" "$psd_pid"

# 3. The same with --worker_timeout_secs 3: the job goes on without worker 1 (the stated rule).
start_psd psd3 --worker_timeout_secs 3
chief timeout --sync_replicas
wait_for "$tmp/timeout.out" "worker 0: done after 10 local steps" 20 ||
  fail "sync with --worker_timeout_secs: the job did not go on: $(tail -n 5 "$tmp/timeout.out")"
grep -q "worker 1 never connected: sync steps no longer wait for it" "$tmp/psd3.log" ||
  fail "sync with --worker_timeout_secs: psd does not say it gave up on worker 1: $(tail -n 5 "$tmp/psd3.log")"
stop "$chief_pid" "$psd_pid"

# 4. Async: the end barrier names the worker it waits for, on the chief and in psd's log.
start_psd psd4
chief async
want="barrier 'mnist_trainer/end' waits for 2 callers, has 1 \(workers 0\); missing workers 1 \(never connected\)"
wait_for "$tmp/async.out" "worker 0: barrier: waiting [0-9]+ s of 60 s; psd: $want" 20 ||
  fail "async: the chief does not say what the end barrier waits for: $(tail -n 5 "$tmp/async.out")"
grep -qE "$want" "$tmp/psd4.log" || fail "async: psd's log does not name the missing worker: $(tail -n 5 "$tmp/psd4.log")"
stop "$chief_pid" "$psd_pid"

# 5. A worker waiting for the chief says for how long it will wait.
start_psd psd5
"$trainer" --job_name=worker --task_index 1 --ps_hosts "127.0.0.1:$psd_port" \
  --worker_hosts 127.0.0.1:1,127.0.0.1:2 "${common[@]}" >"$tmp/nochief.out" 2>&1 &
worker_pid=$!; pids+=("$worker_pid")
wait_for "$tmp/nochief.out" "worker 1: waiting for the chief \(worker 0\) to initialise the model \([0-9]+ s of 300 s\)" 15 ||
  fail "no chief: worker 1 does not say how long it waits for the chief: $(tail -n 5 "$tmp/nochief.out")"
stop "$worker_pid" "$psd_pid"

# 6. launch_local.sh waiting for a psd that is slow to listen says so.
mkdir -p "$tmp/slow/server"
printf '#!/bin/sh\nsleep 4\nexec "%s" "$@"\n' "$build/server/psd" >"$tmp/slow/server/psd"
chmod +x "$tmp/slow/server/psd"
BUILD_DIR="$tmp/slow" timeout 60 "$here/../scripts/launch_local.sh" --quiet --run_dir "$tmp/slowrun" \
  --trainer "$trainer" -- "${common[@]}" >"$tmp/slow.out" 2>&1 ||
  fail "slow psd: launch_local failed: $(tail -n 5 "$tmp/slow.out")"
grep -q "launch_local: waiting for ps0 to listen (3 s of 15 s" "$tmp/slow.out" ||
  fail "slow psd: launch_local did not say it waits: $(head -n 3 "$tmp/slow.out")"

[ "$failures" = 0 ] && echo "PASS: every long wait says what it waits for" || exit 1
