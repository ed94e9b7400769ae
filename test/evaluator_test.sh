#!/usr/bin/env bash
# The evaluator task (mnist_trainer --job_name=evaluator): it evaluates the
# job's parameters from the ps's checkpoints, or pulled from psd, in a process
# of its own at nice 10, writes <logdir>/eval event files, and stops after the
# job's last parameters. Its accuracy on the job's final parameters must equal
# the chief's own evaluation of the same parameters (the chief pulls them
# after the end barrier; no update comes after).
#   test/evaluator_test.sh BUILD_DIR
set -uo pipefail
. "$(dirname "$0")/trainer_test_lib.sh" "$1"
trainer="$build/examples/mnist_trainer"
psd="$build/server/psd"

python3 "$here/tiny_mnist.py" "$tmp/data" 600 200
common=(--data_dir "$tmp/data" --validation_size 100 --batch_size 50 --log_every 0 --connect_timeout 20)

# start_psd NAME [FLAGS...]: psd on a free port; sets port and psd_pid.
start_psd() {
  local name=$1; shift
  "$psd" --port 0 --port_file "$tmp/$name.port" "$@" >"$tmp/$name.log" 2>&1 &
  psd_pid=$!
  pids+=("$psd_pid")
  wait_for "$tmp/$name.port" '^[0-9]+$' 20 || { fail "$name did not start: $(cat "$tmp/$name.log")"; exit 1; }
  port=$(cat "$tmp/$name.port")
}
# final_figures FILE: the chief's final "test accuracy X | test cross-entropy Y", as the evaluator prints them.
final_figures() {
  sed -n 's/^== async: test accuracy \([0-9.]*\), test cross-entropy \([0-9.]*\),.*/test accuracy \1 | test cross-entropy \2/p' "$1"
}
# eval_line FILE STEP: the evaluator's line for STEP.
eval_line() { grep -E "^evaluator \| global step $2 \|" "$1" | tail -n 1; }

# 1. Checkpoints: the evaluator starts first and waits for them.
start_psd ckpt_psd --checkpoint_dir "$tmp/ck" --checkpoint_secs 1
"$trainer" --job_name=evaluator --checkpoint_dir "$tmp/ck" --logdir "$tmp/tb" --eval_secs 0.3 \
  --eval_timeout_secs 60 "${common[@]}" >"$tmp/ev1.out" 2>"$tmp/ev1.err" &
ev_pid=$!
pids+=("$ev_pid")
sleep 0.5
nice_value=$(ps -o ni= -p "$ev_pid" | tr -d ' ')
[ "$nice_value" = 10 ] || fail "the evaluator runs at nice '$nice_value', not 10"
timeout 120 "$trainer" --job_name=worker --task_index=0 --ps_hosts "127.0.0.1:$port" --worker_hosts 127.0.0.1:1 \
  "${common[@]}" --train_steps 120 --logdir "$tmp/tb" >"$tmp/chief1.out" 2>"$tmp/chief1.err" ||
  fail "chief (checkpoints): exit $? $(tail -n 3 "$tmp/chief1.err")"
for _ in $(seq 300); do kill -0 "$ev_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$ev_pid" 2>/dev/null; then fail "the evaluator did not stop after the final checkpoint"; kill "$ev_pid"; fi
wait "$ev_pid"; rc=$?
[ "$rc" = 0 ] || fail "evaluator (checkpoints): exit $rc $(tail -n 3 "$tmp/ev1.err")"
chief_figures=$(final_figures "$tmp/chief1.out")
chief_acc=$(echo "$chief_figures" | sed -n 's/^test accuracy \([0-9.]*\) .*/\1/p')
line=$(eval_line "$tmp/ev1.out" 120)
echo "chief: $chief_figures; evaluator: $line"
[ -n "$chief_acc" ] || fail "no final accuracy from the chief: $(cat "$tmp/chief1.out")"
[[ "$line" == *"| $chief_figures |"*"| final" ]] ||
  fail "the evaluator's final line does not show the chief's $chief_figures: $(cat "$tmp/ev1.out")"
grep -q "evaluated the job's last parameters (global step 120)" "$tmp/ev1.out" ||
  fail "the evaluator does not say why it stopped: $(tail -n 2 "$tmp/ev1.out")"
# The same figure in its event files, under <logdir>/eval, beside the chief's.
python3 "$here/../scripts/check_events.py" --builtin "$tmp/tb/eval" >"$tmp/events1.txt" ||
  fail "check_events on $tmp/tb/eval: $(cat "$tmp/events1.txt")"
ev_value=$(sed -n 's/^accuracy\/test\tstep=120\tvalue=\([0-9.e-]*\).*/\1/p' "$tmp/events1.txt" | tail -n 1)
python3 -c "import sys; sys.exit(abs(float('$ev_value' or 'nan') - float('$chief_acc')) > 6e-5)" ||
  fail "accuracy/test at step 120 in the evaluator's events is '$ev_value', the chief's $chief_acc: $(cat "$tmp/events1.txt")"
ls "$tmp/tb"/events.out.tfevents.* >/dev/null 2>&1 || fail "the chief's own events are not in $tmp/tb"
# It said what it waited for while no checkpoint was there.
grep -q "evaluating checkpoints in $tmp/ck" "$tmp/ev1.out" || fail "the evaluator did not say what it reads: $(head -n 5 "$tmp/ev1.out")"

# 2. Pulling from psd: psd stays up after the job (--exit_when_done false), so
#    the evaluator pulls the final parameters once the job has finished.
start_psd pull_psd --exit_when_done false
"$trainer" --job_name=evaluator --ps_hosts "127.0.0.1:$port" --eval_secs 0.2 --eval_timeout_secs 60 \
  "${common[@]}" >"$tmp/ev2.out" 2>"$tmp/ev2.err" &
ev_pid=$!
pids+=("$ev_pid")
timeout 120 "$trainer" --job_name=worker --task_index=0 --ps_hosts "127.0.0.1:$port" --worker_hosts 127.0.0.1:1 \
  "${common[@]}" --train_steps 300 >"$tmp/chief2.out" 2>"$tmp/chief2.err" ||
  fail "chief (pull): exit $? $(tail -n 3 "$tmp/chief2.err")"
for _ in $(seq 300); do kill -0 "$ev_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$ev_pid" 2>/dev/null; then fail "the pulling evaluator did not stop after the job"; kill "$ev_pid"; fi
wait "$ev_pid"; rc=$?
[ "$rc" = 0 ] || fail "evaluator (pull): exit $rc $(tail -n 3 "$tmp/ev2.err")"
chief_figures=$(final_figures "$tmp/chief2.out")
line=$(eval_line "$tmp/ev2.out" 300)
echo "chief: $chief_figures; evaluator: $line"
# (Its last line is marked final unless it had pulled that step before the chief ended the job.)
[[ -n "$chief_figures" && "$line" == *"| $chief_figures |"* ]] ||
  fail "the pulling evaluator's final line does not show the chief's $chief_figures: $(cat "$tmp/ev2.out")"
grep -q "evaluated the job's last parameters (global step 300)" "$tmp/ev2.out" ||
  fail "the pulling evaluator does not say it evaluated the last parameters: $(tail -n 2 "$tmp/ev2.out")"
# It evaluated while the job trained too (steps increasing, none twice).
steps=$(sed -n 's/^evaluator | global step \([0-9]*\) .*/\1/p' "$tmp/ev2.out" | tr '\n' ' ')
sorted=$(echo "$steps" | tr ' ' '\n' | grep . | sort -n -u | tr '\n' ' ')
[ "$steps" = "$sorted" ] || fail "evaluated steps not increasing (or repeated): $steps"
kill "$psd_pid" 2>/dev/null

# 3. Neither source: one line, exit 2.
"$trainer" --job_name=evaluator "${common[@]}" >"$tmp/ev3.out" 2>&1; rc=$?
[ "$rc" = 2 ] || fail "an evaluator with no source: exit $rc, not 2"
grep -q "give one" "$tmp/ev3.out" || fail "an evaluator with no source does not say what to give: $(cat "$tmp/ev3.out")"

# 4. A checkpoint directory nobody writes (a typo): said within 5 s, by name.
timeout 30 "$trainer" --job_name=evaluator --checkpoint_dir "$tmp/no_such_dir" --eval_secs 0.5 \
  --eval_timeout_secs 7 "${common[@]}" >"$tmp/ev4.out" 2>&1; rc=$?
[ "$rc" = 1 ] || fail "an evaluator of a missing directory: exit $rc, not 1 (nothing evaluated) $(tail -n 3 "$tmp/ev4.out")"
grep -q "evaluator: done after 0 evaluations: nothing new for 7 s" "$tmp/ev4.out" ||
  fail "an evaluator that evaluated nothing: $(tail -n 1 "$tmp/ev4.out")"
grep -qE "evaluator: waiting for the first checkpoint in $tmp/no_such_dir \(it does not exist yet: the ps tasks' --checkpoint_dir\?\) \([56] s of 7 s\)" "$tmp/ev4.out" ||
  fail "an evaluator of a missing directory does not say so within 5 s: $(cat "$tmp/ev4.out")"

[ "$failures" = 0 ] && echo "evaluator: all checks passed"
exit "$failures"
