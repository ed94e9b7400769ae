#!/usr/bin/env bash
# A psd restarted without a checkpoint comes back empty: its workers say so,
# with what to do, and stop (exit 1, one line), instead of "it restarted
# from a checkpoint" and then "unknown tensor".
#   test/restart_empty_test.sh BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/trainer_test_lib.sh"

python3 "$here/tiny_mnist.py" "$tmp/data" 600 100
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$build/server/psd" --port "$port" >"$tmp/psd1.log" 2>&1 &
psd=$!; pids+=("$psd")
"$build/examples/mnist_trainer" --job_name=worker --task_index 0 --ps_hosts "127.0.0.1:$port" --data_dir "$tmp/data" \
  --validation_size 100 --log_every 0 --eval_every 1000000 --train_steps 100000000 >"$tmp/chief.out" 2>"$tmp/chief.err" &
chief=$!; pids+=("$chief")
for i in $(seq 100); do grep -q "worker 0 (chief)" "$tmp/chief.out" && break; sleep 0.1; done
sleep 1
kill "$psd"; wait "$psd"
"$build/server/psd" --port "$port" >"$tmp/psd2.log" 2>&1 &
pids+=($!)
for i in $(seq 200); do kill -0 "$chief" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$chief" 2>/dev/null; then
  fail "the worker goes on with an empty psd: $(tail -n 3 "$tmp/chief.out")"
else
  wait "$chief"; rc=$?
  [ "$rc" = 1 ] || fail "exit $rc (want 1)"
  grep -q "shard 0 (127.0.0.1:$port) came back empty: psd restarted without a checkpoint.*start psd with --checkpoint_dir" \
    "$tmp/chief.err" || fail "the worker does not say what happened: $(cat "$tmp/chief.err")"
  [ "$(wc -l <"$tmp/chief.err")" = 1 ] || fail "more than one line on stderr: $(cat "$tmp/chief.err")"
  if grep -q "unknown tensor\|restarted from a checkpoint" "$tmp/chief.out" "$tmp/chief.err"; then
    fail "misleading words: $(grep "unknown tensor\|restarted from a checkpoint" "$tmp/chief.out" "$tmp/chief.err")"
  fi
fi
[ "$failures" = 0 ] && echo "PASS: a psd back empty stops its workers, saying why" || exit 1
