#!/usr/bin/env bash
# Resume and extend a job (TensorFlow users re-run with a larger --train_steps):
# a trainer's in-process ps checkpoints with --checkpoint_dir like psd; a job
# restored from it takes a raised --train_steps and trains on to it; re-running
# a finished job says so and exits 0 without training; --restore_from seeds a
# fresh ps from the checkpoint.
#   test/resume_extend_test.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
trainer="$build/examples/mnist_trainer"
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
ps_pid=
cleanup() { [ -n "$ps_pid" ] && kill "$ps_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

python3 "$here/tiny_mnist.py" "$tmp/data" 600 100
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cluster=(--ps_hosts "127.0.0.1:$port" --worker_hosts 127.0.0.1:1)
common=(--data_dir "$tmp/data" --validation_size 100 --log_every 0 --batch_size 50 --connect_timeout 20)

# start_ps NAME [FLAGS...]: an in-process ps task in the background.
start_ps() {
  local name=$1; shift
  "$trainer" --job_name=ps --task_index=0 "${cluster[@]}" "$@" >"$tmp/$name.log" 2>&1 &
  ps_pid=$!
}
# chief NAME STEPS [FLAGS...]: worker 0 to the end; its exit code.
chief() {
  local name=$1 steps=$2; shift 2
  timeout 60 "$trainer" --job_name=worker --task_index=0 "${cluster[@]}" "${common[@]}" --train_steps "$steps" "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err"
}
# wait_ps: the ps task exits by itself once the chief finished the job.
wait_ps() {
  local i
  for i in $(seq 100); do kill -0 "$ps_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$ps_pid" 2>/dev/null; then fail "the ps task did not exit after the job"; kill "$ps_pid"; fi
  wait "$ps_pid" 2>/dev/null
  ps_pid=
}

# 1. A first job of 20 steps, checkpointed by its ps task.
start_ps ps1 --checkpoint_dir "$tmp/ck"
chief first 20 || fail "first job: exit $? $(cat "$tmp/first.err")"
wait_ps
grep -q "== 20 global steps" "$tmp/first.out" || fail "first job did not train 20 steps: $(cat "$tmp/first.out")"
# Start-up says what it does while the data loads, before it trains.
grep -q "worker 0: loading data from $tmp/data" "$tmp/first.out" || fail "no word while the data loads: $(head -n 3 "$tmp/first.out")"
ls "$tmp/ck"/shard-0-of-1/*.psckpt >/dev/null 2>&1 || fail "no checkpoint in $tmp/ck: $(cat "$tmp/ps1.log")"

# 2. The same job again: finished, exit 0, no training, no rates.
start_ps ps2 --checkpoint_dir "$tmp/ck"
chief again 20 || fail "finished job re-run: exit $? $(cat "$tmp/again.err")"
wait_ps
grep -q "already finished at global step 20" "$tmp/again.out" ||
  fail "a finished job re-run does not say it is finished: $(cat "$tmp/again.out" "$tmp/again.err")"
if grep -q "samples/s" "$tmp/again.out"; then fail "a finished job re-run printed rates: $(cat "$tmp/again.out")"; fi

# 3. Extended to 35 steps: trains on from 20.
start_ps ps3 --checkpoint_dir "$tmp/ck"
chief extend 35 || fail "extended job: exit $? $(cat "$tmp/extend.err")"
wait_ps
grep -q "== 35 global steps" "$tmp/extend.out" || fail "extended job did not reach 35 steps: $(cat "$tmp/extend.out" "$tmp/extend.err")"
grep -q "15 local steps" "$tmp/extend.out" || fail "extended job did not train 15 steps from 20: $(cat "$tmp/extend.out")"
grep -q "chief: job configured (.*), going on from global step 20 with the 4 variables and 0 tables psd restored" \
  "$tmp/extend.out" "$tmp/extend.err" || fail "the chief of a resumed job does not say so: $(cat "$tmp/extend.out" "$tmp/extend.err")"

# 4. A fresh ps (no checkpoint of its own), the chief restoring from the first's.
start_ps ps4
chief restore 45 --restore_from "$tmp/ck" || fail "--restore_from: exit $? $(cat "$tmp/restore.err")"
wait_ps
grep -q "== 45 global steps" "$tmp/restore.out" || fail "--restore_from did not go on to 45: $(cat "$tmp/restore.out" "$tmp/restore.err")"
grep -q "10 local steps" "$tmp/restore.out" || fail "--restore_from did not go on from 35: $(cat "$tmp/restore.out")"
grep -q "chief: job configured (.*), 4 variables and 0 tables restored from $tmp/ck (global step 35)" \
  "$tmp/restore.out" "$tmp/restore.err" || fail "the chief restoring does not say so: $(cat "$tmp/restore.out" "$tmp/restore.err")"

# 5. A lower stop step than where the job is: refused with the step it is at.
start_ps ps5 --checkpoint_dir "$tmp/ck"
chief lower 10; rc=$?
kill "$ps_pid" 2>/dev/null; wait "$ps_pid" 2>/dev/null; ps_pid=
[ "$rc" = 2 ] || fail "a stop step below the job's step: exit $rc, not 2 (a flag to change)"
grep -q "error: the job is at global step 35, past the stop step 10" "$tmp/lower.err" ||
  fail "a stop step below the job's step: $(cat "$tmp/lower.err")"

# 5b. --restore_from a directory that does not exist: said so.
start_ps ps5b
chief missing 10 --restore_from "$tmp/no_such_ck"; rc=$?
kill "$ps_pid" 2>/dev/null; wait "$ps_pid" 2>/dev/null; ps_pid=
[ "$rc" != 0 ] || fail "--restore_from a missing directory: exit 0"
grep -q "no checkpoint directory $tmp/no_such_ck (it does not exist)" "$tmp/missing.err" ||
  fail "--restore_from a missing directory: $(cat "$tmp/missing.err")"

# 6. A worker started after the chief trained the job through finds it
# finished, and meets the chief at the end barrier instead of leaving it
# waiting there for a minute.
pair=(--ps_hosts "127.0.0.1:$port" --worker_hosts 127.0.0.1:1,127.0.0.1:2)
start_ps ps6
timeout 60 "$trainer" --job_name=worker --task_index=0 "${pair[@]}" "${common[@]}" --train_steps 10 \
  >"$tmp/early.out" 2>&1 &
early_pid=$!
for i in $(seq 200); do grep -q "worker 0: done after" "$tmp/early.out" && break; sleep 0.1; done
grep -q "worker 0: done after" "$tmp/early.out" || fail "late worker: the chief did not train: $(cat "$tmp/early.out")"
late_start=$(date +%s)
timeout 60 "$trainer" --job_name=worker --task_index=1 "${pair[@]}" "${common[@]}" --train_steps 10 \
  >"$tmp/late.out" 2>&1 || fail "late worker: exit $?: $(tail -n 3 "$tmp/late.out")"
wait "$early_pid" || fail "late worker: the chief exited $?: $(tail -n 3 "$tmp/early.out")"
took=$(( $(date +%s) - late_start ))
grep -q "already finished at global step" "$tmp/late.out" || fail "late worker: $(cat "$tmp/late.out")"
[ "$took" -le 15 ] || fail "late worker: the chief waited ${took} s at its end barrier for the late worker"
wait_ps

# 7. Two workers go on with a job their ps restored at its stop step, the
# other worker started first: it waits for the chief, which raises the stop
# step, and trains on too. Before, it took the restored job for finished,
# sat in the end barrier, and the chief trained the rest alone after waiting
# a minute for it.
start_ps ps7a --checkpoint_dir "$tmp/ck7"
run1_pids=()
for w in 1 0; do
  timeout 60 "$trainer" --job_name=worker --task_index=$w "${pair[@]}" "${common[@]}" --sync_replicas \
    --train_steps 10 >"$tmp/run1_w$w.out" 2>&1 &
  run1_pids+=($!)
done
wait "${run1_pids[@]}"
wait_ps
grep -q "== 10 global steps" "$tmp/run1_w0.out" || fail "two workers, first run: $(cat "$tmp/run1_w0.out")"
start_ps ps7b --checkpoint_dir "$tmp/ck7"
go_on_start=$(date +%s)
timeout 60 "$trainer" --job_name=worker --task_index=1 "${pair[@]}" "${common[@]}" --sync_replicas \
  --train_steps 10 >"$tmp/run2_w1.out" 2>&1 &
w1_pid=$!
sleep 1
timeout 60 "$trainer" --job_name=worker --task_index=0 "${pair[@]}" "${common[@]}" --sync_replicas \
  --train_steps 20 >"$tmp/run2_w0.out" 2>&1 || fail "going on: the chief exited $?: $(tail -n 3 "$tmp/run2_w0.out")"
wait "$w1_pid" || fail "going on: worker 1 exited $?: $(tail -n 3 "$tmp/run2_w1.out")"
took=$(( $(date +%s) - go_on_start ))
wait_ps
grep -q "== 20 global steps" "$tmp/run2_w0.out" || fail "going on: the job did not reach 20: $(cat "$tmp/run2_w0.out")"
if grep -q "already finished" "$tmp/run2_w1.out"; then fail "going on: worker 1 took the job for finished: $(cat "$tmp/run2_w1.out")"; fi
grep -q "worker 1: done after 10 local steps" "$tmp/run2_w1.out" || fail "going on: worker 1 did not train its 10 steps: $(cat "$tmp/run2_w1.out")"
[ "$took" -le 30 ] || fail "going on took ${took} s (a worker waited for another at a step or the end barrier)"

# 8. The ps restarted from its checkpoint while the chief waits at the end
# barrier, then a late worker: the chief, back on the restarted ps, is no
# run's new chief to wait for. The late worker says the job is finished and
# meets it there at once (with the first fix for 7 alone, both waited a
# minute for each other).
start_ps ps8a --checkpoint_dir "$tmp/ck8"
timeout 60 "$trainer" --job_name=worker --task_index=0 "${pair[@]}" "${common[@]}" --train_steps 10 \
  >"$tmp/ck8_w0.out" 2>&1 &
chief_pid=$!
for i in $(seq 200); do grep -q "worker 0: done after" "$tmp/ck8_w0.out" && break; sleep 0.1; done
kill -TERM "$ps_pid"; wait "$ps_pid" 2>/dev/null; ps_pid=
start_ps ps8b --checkpoint_dir "$tmp/ck8"
sleep 1
late_start=$(date +%s)
timeout 60 "$trainer" --job_name=worker --task_index=1 "${pair[@]}" "${common[@]}" --train_steps 10 \
  >"$tmp/ck8_w1.out" 2>&1 || fail "restarted ps, late worker: exit $?: $(tail -n 3 "$tmp/ck8_w1.out")"
wait "$chief_pid" || fail "restarted ps, late worker: the chief exited $?: $(tail -n 3 "$tmp/ck8_w0.out")"
took=$(( $(date +%s) - late_start ))
wait_ps
grep -q "already finished at global step 10" "$tmp/ck8_w1.out" || fail "restarted ps, late worker: $(cat "$tmp/ck8_w1.out")"
[ "$took" -le 15 ] || fail "restarted ps, late worker: ${took} s to end (the two waited for each other)"

[ "$failures" = 0 ] && echo "PASS: resume, extend, finished re-run, --restore_from, a late worker, two workers going on, a late worker after a ps restart" || exit 1
