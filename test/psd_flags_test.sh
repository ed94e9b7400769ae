#!/usr/bin/env bash
# psd refuses a bad flag value before it serves: one line, a non-zero exit,
# never a crash, a hang or a nonsense value taken (server/psd_flags.cc). A
# trainer's ps role (--job_name=ps) takes psd's flags and refuses the same.
#   test/psd_flags_test.sh BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/trainer_test_lib.sh"
psd="$build/server/psd"
echo "not a directory" >"$tmp/afile"

# refused NAME EXPECTED_REGEX FLAGS...: psd exits non-zero at once, in one line matching the regex.
refused() {
  local name=$1 want=$2; shift 2
  timeout 5 "$psd" --port 0 "$@" >"$tmp/$name.log" 2>&1; local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -gt 128 ]; then
    fail "$name ($*): exit $rc, expected a refusal: $(tail -3 "$tmp/$name.log")"
    return
  fi
  [ "$(grep -c . "$tmp/$name.log")" -le 2 ] || fail "$name ($*): more than one line: $(cat "$tmp/$name.log")"
  grep -qE -- "$want" "$tmp/$name.log" || fail "$name ($*): no word of $want: $(cat "$tmp/$name.log")"
}

refused threads_huge '--threads' --threads 100000
refused table_threads_zero '--table_threads' --table_threads 0
refused table_threads_huge '--table_threads' --table_threads 100000
refused message_nan '--max_message_mb' --max_message_mb nan
refused message_huge '--max_message_mb' --max_message_mb 1e30
refused message_zero '--max_message_mb' --max_message_mb 0
refused message_tiny '--max_message_mb' --max_message_mb 1e-9
refused tensor_tiny '--max_tensor_mb' --max_tensor_mb 0.0001
refused tensor_inf '--max_tensor_mb' --max_tensor_mb inf
refused memory_nan '--max_memory_mb' --max_memory_mb nan
refused memory_machine '--max_memory_mb' --max_memory_mb 1e12
refused memory_negative '--max_memory_mb' --max_memory_mb -1
refused checkpoint_nan '--checkpoint_secs' --checkpoint_secs nan --checkpoint_dir "$tmp/ck"
refused checkpoint_huge '--checkpoint_secs' --checkpoint_secs 1e300 --checkpoint_dir "$tmp/ck"
refused checkpoint_negative '--checkpoint_secs' --checkpoint_secs -1 --checkpoint_dir "$tmp/ck"
refused checkpoint_busy_loop '--checkpoint_secs' --checkpoint_secs 0.0001 --checkpoint_dir "$tmp/ck"
refused hello_nan '--hello_timeout_secs' --hello_timeout_secs nan
refused hello_zero '--hello_timeout_secs' --hello_timeout_secs 0
refused request_nan '--request_timeout_secs' --request_timeout_secs nan
refused connections_zero '--max_connections' --max_connections 0
refused tensors_negative '--max_tensors_per_client' --max_tensors_per_client -1
refused busy_poll_huge '--busy_poll_us' --busy_poll_us 99999999
refused keep_zero '--keep_checkpoints' --keep_checkpoints 0
refused checkpoint_dir_file '--checkpoint_dir.*Not a directory' --checkpoint_dir "$tmp/afile"
refused checkpoint_dir_below_file '--checkpoint_dir.*Not a directory' --checkpoint_dir "$tmp/afile/ckpt"
refused port_file_dir '--port_file' --port_file "$tmp/no/such/dir/port"
refused http_port_file_dir '--http_port_file' --http_port any --http_port_file "$tmp/no/such/dir/port"
: >"$tmp/empty_token"
refused auth_empty 'empty' --auth_token_file "$tmp/empty_token"
# Read whole before its size was checked: /dev/zero filled psd's memory and a FIFO hung it at start.
refused auth_device 'is a device' --auth_token_file /dev/zero
refused auth_directory 'is a directory' --auth_token_file "$tmp"
mkfifo "$tmp/token_fifo"
refused auth_fifo 'is a FIFO' --auth_token_file "$tmp/token_fifo"
head -c 100000 /dev/zero | tr '\0' x >"$tmp/huge_token"
refused auth_huge 'more than 4096' --auth_token_file "$tmp/huge_token"
refused auth_missing 'cannot read' --auth_token_file "$tmp/missing"
refused bind_elsewhere 'not an address of this host' --bind 192.0.2.1
timeout 10 "$psd" --port 70000 >"$tmp/port.log" 2>&1 && fail "--port 70000 served"
grep -q -- "--port must be in 0..65535" "$tmp/port.log" || fail "--port 70000: $(cat "$tmp/port.log")"
timeout 10 "$psd" --port 0 --shard_index 2 --num_shards 2 >"$tmp/index.log" 2>&1 && fail "--shard_index 2 of 2 served"
grep -q "must be below --num_shards" "$tmp/index.log" || fail "--shard_index 2 of 2: $(cat "$tmp/index.log")"

# The limits still take good values: psd serves with them.
"$psd" --port 0 --port_file "$tmp/good.port" --threads 0 --max_message_mb 1 --max_memory_mb 64 \
  --checkpoint_secs 3600 --checkpoint_dir "$tmp/ckpt" --hello_timeout_secs 0.5 >"$tmp/good.log" 2>&1 &
pids+=($!)
wait_for "$tmp/good.port" '^[0-9]+$' 10 || fail "good flags: psd did not start: $(cat "$tmp/good.log")"
[ -d "$tmp/ckpt/shard-0-of-1" ] || fail "the checkpoint directory was not made at start"

# The ps role of a trainer refuses the same values.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
timeout 10 "$build/examples/hello_cluster" --job_name=ps --task_index=0 --ps_hosts "127.0.0.1:$port" \
  --worker_hosts 127.0.0.1:1 --max_message_mb nan >"$tmp/role.log" 2>&1
rc=$?
{ [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q -- "--max_message_mb" "$tmp/role.log"; } ||
  fail "ps role with --max_message_mb nan: exit $rc: $(tail -3 "$tmp/role.log")"

# A ps task whose port (from the cluster's ps hosts) is taken: the message
# names where the port came from, not flags the task has none of.
taken=$(cat "$tmp/good.port")
timeout 10 "$build/examples/hello_cluster" --job_name=ps --task_index=0 --ps_hosts "127.0.0.1:$taken" \
  --worker_hosts 127.0.0.1:1 >"$tmp/taken.log" 2>&1
grep -q "cannot listen on 127.0.0.1:$taken (ps task 0's entry '127.0.0.1:$taken' in the cluster's ps hosts .*: address already in use (another process has this port)$" "$tmp/taken.log" ||
  fail "ps task on a taken port: $(cat "$tmp/taken.log")"
timeout 10 "$psd" --port "$taken" >"$tmp/taken_psd.log" 2>&1
grep -q "cannot listen on 127.0.0.1:$taken (--bind, --port): address already in use (another process has this port: stop it, or choose another" "$tmp/taken_psd.log" ||
  fail "psd on a taken port: $(cat "$tmp/taken_psd.log")"

# A flag no program knows, or a value of the wrong type: one line naming it
# (and the flag likely meant), exit code 2 as for any configuration error.
bad_flag() {
  local name=$1 want=$2; shift 2
  timeout 10 "$@" >"$tmp/$name.log" 2>&1; local rc=$?
  [ "$rc" -eq 2 ] || fail "$name ($*): exit $rc, expected 2: $(cat "$tmp/$name.log")"
  [ "$(grep -c . "$tmp/$name.log")" -eq 1 ] || fail "$name ($*): not one line: $(cat "$tmp/$name.log")"
  grep -qE -- "$want" "$tmp/$name.log" || fail "$name ($*): no $want: $(cat "$tmp/$name.log")"
}
bad_flag psd_unknown '^psd: error: unknown flag --bogus; see --help$' "$psd" --bogus
bad_flag psd_typo 'unknown flag --max_memory \(did you mean --max_memory_mb\?\)' "$psd" --max_memory 64
bad_flag psd_not_a_number '^psd: error: --threads x: not a value it takes \(a whole number >= 0\); see --help$' "$psd" --threads x
bad_flag psd_not_a_bool '^psd: error: --exit_when_done maybe: not a value it takes \(true or false\); see --help$' \
  "$psd" --exit_when_done maybe
bad_flag trainer_typo '^mnist_trainer: error: unknown flag --epoch \(did you mean --epochs\?\)' \
  "$build/examples/mnist_trainer" --job_name worker --epoch 1
bad_flag trainer_typo_with_value 'unknown flag --learning_rat \(did you mean --learning_rate\?\)' \
  "$build/examples/ctr_trainer" --learning_rat=0.1
timeout 10 "$psd" --help >"$tmp/help.log" 2>&1 || fail "psd --help: exit $?"
grep -q -- "--max_memory_mb" "$tmp/help.log" || fail "psd --help: $(head -3 "$tmp/help.log")"

[ "$failures" = 0 ] && echo "PASS: psd refuses bad flag values in one line before it serves" || exit 1
