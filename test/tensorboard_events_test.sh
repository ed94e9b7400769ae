#!/usr/bin/env bash
# The chief's TensorBoard event files read by TensorBoard's own reader
# (EventAccumulator), installed into a virtual environment by
# scripts/tensorboard_venv.sh: every tag, step and value as the chief printed
# them (test/tensorboard_events_check.py). SKIP (77) when the environment
# cannot be made (no network to PyPI), never a silent pass.
#   test/tensorboard_events_test.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
source "$(dirname "$0")/trainer_test_lib.sh"
src=$(cd "$2" && pwd)
venv="$build/venv-tb"

if ! "$src/scripts/tensorboard_venv.sh" "$venv"; then
  echo "SKIP: no TensorBoard virtual environment (scripts/tensorboard_venv.sh $venv failed)"
  exit 77
fi

python3 "$here/tiny_mnist.py" "$tmp/data" 600 100
steps=30
"$build/server/psd" --port 0 --port_file "$tmp/port" --exit_when_done true >"$tmp/psd.log" 2>&1 &
pids+=($!)
wait_for "$tmp/port" '^[0-9]+$' 10 || { echo "FAIL: psd did not start: $(cat "$tmp/psd.log")"; exit 1; }
port=$(cat "$tmp/port")
timeout 120 "$build/examples/mnist_trainer" --job_name=worker --task_index=0 --ps_hosts "127.0.0.1:$port" \
  --data_dir "$tmp/data" --validation_size 100 --batch_size 50 --train_steps "$steps" \
  --log_every 1 --summary_every 1 --eval_every 10 --logdir "$tmp/logs" >"$tmp/chief.out" 2>"$tmp/chief.err" ||
  fail "the chief failed: exit $? $(tail -n 5 "$tmp/chief.err")"
"$venv/bin/python" "$here/tensorboard_events_check.py" "$tmp/logs" "$tmp/chief.out" "$steps" ||
  fail "TensorBoard's reader disagrees with the chief (output above); chief: $(head -n 5 "$tmp/chief.out")"
[ "$failures" -eq 0 ] && echo "PASS: TensorBoard's EventAccumulator reads what the chief wrote"
exit $((failures > 0))
