#!/usr/bin/env bash
# Several hosts for real: psd (mnist_trainer --job_name=ps) and three workers,
# each in its own network namespace, joined by a bridge that lives in a
# namespace of its own (addresses 10.200.0.0/24 exist only inside the
# namespaces this test creates). The workers take the cluster from TF_CONFIG;
# training must reach >= 0.85 test accuracy. Everything is torn down on exit.
#   test/netns_test.sh BUILD_DIR          (root only; exits 77 = SKIP otherwise)
set -uo pipefail
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
trainer="$build/examples/mnist_trainer"
skip() { echo "SKIP: $*"; exit 77; }
source test/netns_lib.sh
why=$(netns_can_run)
[ -z "$why" ] || skip "$why"
data=/usr/share/datasets/fashion-mnist
[ -e "$data/train-images-idx3-ubyte.gz" ] || skip "no Fashion-MNIST in $data (scripts/get_data.sh)"

tag="pt$$"              # unique per run
nodes=(ps w0 w1 w2)
declare -A addr=([ps]=10.200.0.10 [w0]=10.200.0.11 [w1]=10.200.0.12 [w2]=10.200.0.13)
pids=()
run=$(mktemp -d)
trap 'netns_teardown "$tag" "$run" "${nodes[@]}"' EXIT
trap 'exit 130' INT TERM

netns_up "$tag" ps="${addr[ps]}" w0="${addr[w0]}" w1="${addr[w1]}" w2="${addr[w2]}" ||
  { echo "FAIL: could not create the namespaces"; exit 1; }

ps_hosts="${addr[ps]}:2222"
worker_hosts="${addr[w0]}:2222,${addr[w1]}:2222,${addr[w2]}:2222"
ip netns exec "$tag-ps" "$trainer" --job_name ps --task_index 0 --ps_hosts "$ps_hosts" \
  --worker_hosts "$worker_hosts" --port_file "$run/ps.port" >"$run/ps.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$run/ps.port" ] && break; sleep 0.05; done
[ -s "$run/ps.port" ] || { echo "FAIL: ps did not listen"; cat "$run/ps.log"; exit 1; }
# The ps is reachable from a worker's namespace (and only over the bridge).
ip netns exec "$tag-w1" bash -c "exec 3<>/dev/tcp/${addr[ps]}/2222" ||
  { echo "FAIL: ps not reachable from namespace $tag-w1"; exit 1; }

for i in 2 1 0; do
  tf="{\"cluster\":{\"ps\":[\"$ps_hosts\"],\"worker\":[\"${worker_hosts//,/\",\"}\"]},\"task\":{\"type\":\"worker\",\"index\":$i}}"
  ip netns exec "$tag-w$i" env TF_CONFIG="$tf" "$trainer" --data_dir "$data" --epochs 4 --log_every 0 \
    >"$run/w$i.log" 2>&1 &
  pids+=($!)
done
# Connections between hosts keep Linux's send-buffer autotuning; only those
# within one host get the fixed buffer (common/socket_stream.h), whose size
# the ps's start-up line gives (as net.core.wmem_max allows it). psd's side
# of the three workers' connections, sampled while they train.
# (The line comes just after the port file: wait for it, boundedly.)
for _ in $(seq 50); do grep -q "same-host TCP send buffer" "$run/ps.log" && break; sleep 0.1; done
fixed_kb=$(sed -n 's/.*same-host TCP send buffer \([0-9]*\) KiB.*/\1/p' "$run/ps.log")
[ -n "$fixed_kb" ] || { echo "FAIL: no same-host send buffer size in the ps's log"; cat "$run/ps.log"; exit 1; }
wmem_max=$(cat /proc/sys/net/core/wmem_max)
fixed=$(( 2 * (fixed_kb * 512 < wmem_max ? fixed_kb * 512 : wmem_max) ))
send_buffers=""
for _ in $(seq 300); do
  send_buffers=$(ip netns exec "$tag-ps" ss -tmnH state established "( sport = :2222 )" 2>/dev/null |
                 grep -o 'tb[0-9]*' | sed 's/^tb//')
  [ "$(echo "$send_buffers" | grep -c .)" -ge 3 ] && break
  sleep 0.1
done
[ "$(echo "$send_buffers" | grep -c .)" -ge 3 ] ||
  { echo "FAIL: fewer than 3 worker connections seen at the ps: '$send_buffers'"; exit 1; }
if echo "$send_buffers" | grep -qx "$fixed"; then
  echo "FAIL: a connection between hosts got the same-host send buffer ($fixed): $(echo $send_buffers)"; exit 1
fi
echo "send buffers of psd's connections to the workers (autotuned, same-host size $fixed): $(echo $send_buffers)"

failed=0
for p in "${pids[@]}"; do
  # Each process must end by itself (the ps once the chief finished the job).
  for _ in $(seq 1200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$p" 2>/dev/null; then echo "FAIL: process $p still running after 120 s"; failed=1; break; fi
  wait "$p" || { echo "FAIL: process $p exited with $?"; failed=1; }
done
grep -h -E "^(==|RESULT)" "$run/w0.log"
grep -h "connected as worker" "$run/ps.log"
if [ $failed != 0 ]; then tail -n 5 "$run"/*.log; exit 1; fi
acc=$(sed -n 's/^RESULT .*test_accuracy=\([0-9.]*\).*/\1/p' "$run/w0.log")
python3 -c "import sys; sys.exit(0 if float('${acc:-0}') >= 0.85 else 1)" ||
  { echo "FAIL: test accuracy ${acc:-none} < 0.85"; exit 1; }
echo "PASS: 1 ps + 3 workers in 4 network namespaces, test accuracy $acc"
