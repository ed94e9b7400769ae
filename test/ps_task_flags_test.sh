#!/usr/bin/env bash
# psd's flags are defined once (server/psd_flags.*) and a trainer run with
# --job_name=ps has them all, with psd's meaning: every psd flag but those
# the cluster decides is in each trainer's --help, and a flag both programs
# have (--auth_token_file) takes effect in the ps role.
#   test/ps_task_flags_test.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
ps_pid=
cleanup() { [ -n "$ps_pid" ] && kill "$ps_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

flags_of() { "$@" --help | grep -oE '^ +(-[a-zA-Z],)?--[a-z_]+' | sed 's/.*--/--/' | sort -u; }
flags_of "$build/server/psd" | grep -vxE -- '--(help|port|unix_socket|shard_index|num_shards|ps_hosts|task_index)' \
  >"$tmp/psd"
[ "$(wc -l <"$tmp/psd")" -gt 20 ] || fail "psd --help lists too few flags: $(cat "$tmp/psd")"
threads_help=$("$build/server/psd" --help | grep -E '^ +--threads ')
for t in mnist_trainer linreg_trainer hello_cluster; do
  flags_of "$build/examples/$t" >"$tmp/$t"
  missing=$(comm -23 "$tmp/psd" "$tmp/$t" | tr '\n' ' ')
  [ -z "$missing" ] || fail "$t lacks psd's flags: $missing"
  [ "$("$build/examples/$t" --help | grep -E '^ +--threads ' | sed 's/=[0-9]*//')" = "$(echo "$threads_help" | sed 's/=[0-9]*//')" ] ||
    fail "$t --threads is not psd's: $("$build/examples/$t" --help | grep -E '^ +--threads ')"
done

# --auth_token_file in the ps role: the in-process shard demands the token.
echo "s3cret-token-for-the-test" >"$tmp/token"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cluster=(--ps_hosts "127.0.0.1:$port" --worker_hosts 127.0.0.1:1)
"$build/examples/hello_cluster" --job_name=ps --task_index=0 "${cluster[@]}" --auth_token_file "$tmp/token" \
  --threads 0 >"$tmp/ps.log" 2>&1 &
ps_pid=$!
timeout 30 "$build/examples/hello_cluster" --job_name=worker --task_index=0 "${cluster[@]}" --connect_timeout 5 \
  >"$tmp/no_token.out" 2>&1 && fail "a worker without the token was served: $(cat "$tmp/no_token.out")"
grep -qi "token" "$tmp/no_token.out" || fail "a worker without the token: $(cat "$tmp/no_token.out")"
timeout 30 "$build/examples/hello_cluster" --job_name=worker --task_index=0 "${cluster[@]}" --connect_timeout 5 \
  --auth_token_file "$tmp/token" >"$tmp/token.out" 2>&1 || fail "a worker with the token: $(cat "$tmp/token.out")"
for i in $(seq 100); do kill -0 "$ps_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$ps_pid" 2>/dev/null && fail "the ps task did not exit after the job"
wait "$ps_pid"; rc=$?; ps_pid=
[ "$rc" = 0 ] || fail "the ps task exited $rc: $(cat "$tmp/ps.log")"

[ "$failures" = 0 ] && echo "PASS: trainers take psd's flags, with psd's meaning" || exit 1
