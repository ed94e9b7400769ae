#!/usr/bin/env bash
# psd takes its shard from TF_CONFIG or Slurm's SLURM_* variables as the
# trainers do (server/psd_environment.h): it listens on its task's port on
# 127.0.0.1, says where the place came from, refuses a task that is not a
# ps task in one line (exit 2), and says so when cluster flags make it
# ignore the environment.
#   test/psd_environment_test.sh BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/trainer_test_lib.sh"
psd="$build/server/psd"
# Two free loopback ports, P and P+1 (Slurm's local ranks 0 and 1).
read -r p0 p1 < <(python3 - <<'PY'
import socket
for _ in range(200):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1)); print(p, p + 1); break
    except OSError:
        pass
    finally:
        a.close(); b.close()
PY
)
# start NAME [FLAGS...] (environment from the caller): psd in the background,
# waits for its port file; prints nothing, fails when psd does not listen.
start() {
  local name=$1; shift
  "$psd" --port_file "$tmp/$name.port" "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
  wait_for "$tmp/$name.port" '^[0-9]+$' 10 || fail "$name: psd did not start: $(cat "$tmp/$name.log")"
}
stop() { kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null; unset 'pids[-1]'; }

# 1. TF_CONFIG: ps 1 of 2 listens on ps 1's port.
tf='{"cluster":{"ps":["127.0.0.1:'$p0'","127.0.0.1:'$p1'"],"worker":["127.0.0.1:1"]},"task":{"type":"ps","index":1}}'
TF_CONFIG=$tf start tf
[ "$(cat "$tmp/tf.port" 2>/dev/null)" = "$p1" ] || fail "TF_CONFIG ps 1: listens on $(cat "$tmp/tf.port" 2>/dev/null), not $p1"
grep -q "shard 1 of 2 at 127.0.0.1:$p1, from TF_CONFIG" "$tmp/tf.log" || fail "TF_CONFIG: no word of the place: $(cat "$tmp/tf.log")"
grep -q "listening on 127.0.0.1:$p1" "$tmp/tf.log" || fail "TF_CONFIG: not on 127.0.0.1: $(cat "$tmp/tf.log")"
stop

# 2. Slurm: task 1 of 3 with --slurm_num_ps=2 is shard 1, on port base + local rank 1.
SLURM_PROCID=1 SLURM_NTASKS=3 SLURM_LOCALID=1 SLURM_JOB_NODELIST=127.0.0.1 SLURM_TASKS_PER_NODE=3 \
  start slurm --slurm_num_ps=2 --port_base="$p0"
[ "$(cat "$tmp/slurm.port" 2>/dev/null)" = "$p1" ] || fail "Slurm task 1: listens on $(cat "$tmp/slurm.port" 2>/dev/null), not $p1"
grep -q "shard 1 of 2 at 127.0.0.1:$p1, from Slurm" "$tmp/slurm.log" || fail "Slurm: no word of the place: $(cat "$tmp/slurm.log")"
stop

# 3. Cluster flags win, and psd says it ignores the environment.
TF_CONFIG=$tf start flags --port "$p0"
[ "$(cat "$tmp/flags.port" 2>/dev/null)" = "$p0" ] || fail "--port $p0 with TF_CONFIG: listens on $(cat "$tmp/flags.port" 2>/dev/null)"
grep -q -- "--port given on the command line: ignoring TF_CONFIG" "$tmp/flags.log" || fail "no word that TF_CONFIG is ignored: $(cat "$tmp/flags.log")"
stop

# 4. Not a ps task, or a TF_CONFIG that does not parse: one line, exit 2.
refused() {  # NAME EXPECTED_REGEX (environment from the caller)
  timeout 10 "$psd" >"$tmp/$1.log" 2>&1; local rc=$?
  [ "$rc" -eq 2 ] || fail "$1: exit $rc, expected 2: $(cat "$tmp/$1.log")"
  [ "$(wc -l <"$tmp/$1.log")" -eq 1 ] || fail "$1: not one line: $(cat "$tmp/$1.log")"
  grep -qE "$2" "$tmp/$1.log" || fail "$1: says $(cat "$tmp/$1.log")"
}
TF_CONFIG=${tf/\"ps\",\"index\":1/\"worker\",\"index\":0} refused worker "TF_CONFIG: this task is worker:0, not a ps task: psd serves ps tasks only"
TF_CONFIG='{"cluster":' refused badjson "TF_CONFIG is not valid JSON"
SLURM_PROCID=2 SLURM_NTASKS=3 SLURM_LOCALID=2 SLURM_JOB_NODELIST=127.0.0.1 refused slurmworker "Slurm's SLURM_\* variables: this task is worker:1, not a ps task"

[ "$failures" -eq 0 ] && echo "PASS: psd reads TF_CONFIG and Slurm's variables"
exit $((failures > 0))
