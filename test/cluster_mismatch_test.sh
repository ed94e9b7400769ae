#!/usr/bin/env bash
# A worker started with another cluster than the chief's (--worker_hosts,
# --ps_hosts, the worker count) is refused when it joins (waitReady), with
# both lists in one line, not found out at the end barrier.
#   test/cluster_mismatch_test.sh BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/trainer_test_lib.sh"
trainer="$build/examples/mnist_trainer"

python3 "$here/tiny_mnist.py" "$tmp/data" 600 100
common=(--data_dir "$tmp/data" --validation_size 100 --log_every 0 --train_steps 2000 --connect_timeout 10)
"$build/server/psd" --port 0 --port_file "$tmp/port" >"$tmp/psd.log" 2>&1 &
pids+=($!)
for i in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port")
two=127.0.0.1:1,127.0.0.1:2
"$trainer" --job_name=worker --task_index 0 --ps_hosts "127.0.0.1:$port" --worker_hosts "$two" "${common[@]}" \
  >"$tmp/chief.out" 2>&1 &
pids+=($!)

# expect NAME MESSAGE_REGEX -- worker 1's flags...
expect() {
  local name=$1 want=$2
  shift 3
  timeout 30 "$trainer" --job_name=worker --task_index 1 "${common[@]}" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  if [ "$rc" != 2 ] || ! grep -qE -- "$want" "$tmp/$name.err" || [ "$(wc -l <"$tmp/$name.err")" != 1 ]; then
    fail "$name: exit $rc (want 2), want one line /$want/: $(cat "$tmp/$name.err")"
  else
    echo "ok   $name: $(cat "$tmp/$name.err")"
  fi
}
expect "three workers for the chief's two" \
  "worker 1 was started with --worker_hosts=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3 \(3\), the chief with --worker_hosts=$two \(2\)" -- \
  --ps_hosts "127.0.0.1:$port" --worker_hosts "$two,127.0.0.1:3"
expect "other worker list" \
  "worker 1 was started with --worker_hosts=127.0.0.1:1,127.0.0.1:9 \(2\), the chief with --worker_hosts=$two \(2\)" -- \
  --ps_hosts "127.0.0.1:$port" --worker_hosts "127.0.0.1:1,127.0.0.1:9"
expect "other ps list" \
  "worker 1 was started with --ps_hosts=localhost:$port \(1\), the chief with --ps_hosts=127.0.0.1:$port \(1\)" -- \
  --ps_hosts "localhost:$port" --worker_hosts "$two"

[ "$failures" = 0 ] && echo "PASS: a worker with another cluster than the chief's is refused at the start" || exit 1
