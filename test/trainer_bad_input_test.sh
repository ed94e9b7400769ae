#!/usr/bin/env bash
# Bad input to the trainers: each case must end within its timeout with a
# non-zero exit code and ONE clear line on stderr.
#   test/trainer_bad_input_test.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
trainer="$build/examples/mnist_trainer"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect NAME EXIT_CODE MESSAGE_REGEX -- COMMAND...  (and no library internals in the line)
expect() {
  local name=$1 want_rc=$2 want_msg=$3
  shift 4
  local start=$SECONDS
  timeout 30 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" = 124 ]; then
    echo "FAIL $name: hung (killed after 30 s)"; failures=$((failures + 1))
  elif [ "$rc" != "$want_rc" ] || ! grep -qE -- "$want_msg" "$tmp/err" || [ "$lines" != 1 ] ||
       grep -qE "::bind\(|gai_strerror|remote exception:" "$tmp/err"; then
    echo "FAIL $name: exit $rc (want $want_rc), $lines stderr line(s), want /$want_msg/:"; cat "$tmp/err"
    failures=$((failures + 1))
  else
    echo "ok   $name ($((SECONDS - start)) s): $(cat "$tmp/err")"
  fi
}

# A small valid data set in the MNIST format (IDX files), made here: the
# cases that get past loading the data need one, installed data set or not.
# 5,100 training images: --validation_size holds 5,000 out by default.
data="$tmp/tiny"
python3 - "$data" <<'EOF'
import os, struct, sys
d = sys.argv[1]
os.makedirs(d)
for prefix, n in (("train", 5100), ("t10k", 100)):
    with open(f"{d}/{prefix}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + (bytes(range(256)) * (n * 784 // 256 + 1))[: n * 784])
    with open(f"{d}/{prefix}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
EOF

# Data files.
expect "missing data dir" 2 "mnist_trainer: error: .*(No such file|not found|cannot open|missing)" -- \
  "$trainer" --local --data_dir "$tmp/nonexistent" --train_steps 1
mkdir -p "$tmp/trunc" "$tmp/magic"
for f in train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  ln -s "$data/$f" "$tmp/trunc/$f"; ln -s "$data/$f" "$tmp/magic/$f"
done
head -c 100000 "$data/train-images-idx3-ubyte" >"$tmp/trunc/train-images-idx3-ubyte"
{ printf '\x00\x00\x08\x04'; tail -c +5 "$data/train-images-idx3-ubyte"; } >"$tmp/magic/train-images-idx3-ubyte"
expect "truncated images" 2 "mnist_trainer: error: .*train-images-idx3-ubyte.*(truncated|short|expected)" -- \
  "$trainer" --local --data_dir "$tmp/trunc" --train_steps 1
expect "wrong magic" 2 "mnist_trainer: error: .*train-images-idx3-ubyte.*magic" -- \
  "$trainer" --local --data_dir "$tmp/magic" --train_steps 1

# Cluster.
expect "no cluster" 2 "no cluster" -- env -u TF_CONFIG -u SLURM_PROCID "$trainer" --train_steps 1
expect "malformed TF_CONFIG" 2 "TF_CONFIG" -- env TF_CONFIG='{"cluster": {"worker": ["a:1"' "$trainer" --train_steps 1
# --ps_hosts alone means one worker: past the cluster flags, to the data.
expect "--ps_hosts without --worker_hosts" 2 "mnist_trainer: error: .*(No such file|not found|cannot open|missing)" -- \
  "$trainer" --job_name worker --task_index 0 --ps_hosts 127.0.0.1:2 --data_dir "$tmp/nonexistent"
expect "--task_index against TF_CONFIG" 2 "task_index=1 contradicts the environment's task index 0" -- \
  env TF_CONFIG='{"cluster":{"worker":["127.0.0.1:1","127.0.0.1:3"],"ps":["127.0.0.1:2"]},"task":{"type":"worker","index":0}}' \
  "$trainer" --task_index 1 --train_steps 1
expect "TF_CONFIG task outside" 2 "TF_CONFIG|index" -- \
  env TF_CONFIG='{"cluster":{"worker":["127.0.0.1:1"],"ps":["127.0.0.1:2"]},"task":{"type":"worker","index":3}}' \
  "$trainer" --train_steps 1
expect "task index outside" 2 "task_index|outside|index" -- \
  "$trainer" --job_name worker --task_index 5 --ps_hosts 127.0.0.1:2222 --worker_hosts 127.0.0.1:2223,127.0.0.1:2224
expect "bad job name" 2 "job_name|job" -- \
  "$trainer" --job_name boss --task_index 0 --ps_hosts 127.0.0.1:2222 --worker_hosts 127.0.0.1:2223
expect "bad host list" 2 "port|host" -- \
  "$trainer" --job_name worker --task_index 0 --ps_hosts 127.0.0.1 --worker_hosts 127.0.0.1:2223
# A port nobody listens on: bind one, close it.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
expect "unreachable ps" 3 "mnist_trainer: error: .*(connect|reach)" -- \
  "$trainer" --job_name worker --task_index 0 --ps_hosts "127.0.0.1:$port" --worker_hosts 127.0.0.1:2223 \
  --connect_timeout 2 --data_dir "$data" --train_steps 1
# Messages for people: no library internals, what to do (docs/first-hour.md).
# psd logs to stdout: its_log turns that into the stream expect reads.
its_log=(bash -c '"$@" 1>&2' its_log)
expect "--ps_hosts= empty" 2 "mnist_trainer: error: --ps_hosts is empty" -- \
  "$trainer" --ps_hosts= --job_name=worker --task_index 0 --train_steps 1
expect "--ps_hosts separated by ;" 2 "mnist_trainer: error: .*separate hosts with ','" -- \
  "$trainer" --ps_hosts "127.0.0.1:2222;127.0.0.1:2223" --job_name=worker --task_index 0 --train_steps 1
expect "psd --ps_hosts= empty" 2 "--ps_hosts is empty" -- "${its_log[@]}" "$build/server/psd" --ps_hosts= --task_index 0
expect "psd --ps_hosts separated by ;" 2 "separate hosts with ','" -- \
  "${its_log[@]}" "$build/server/psd" --ps_hosts "127.0.0.1:2222;127.0.0.1:2223" --task_index 0
expect "unreachable ps, in words" 3 "mnist_trainer: error: .*127.0.0.1:$port: connection refused \(nothing listens there" -- \
  "$trainer" --job_name worker --task_index 0 --ps_hosts "127.0.0.1:$port" --connect_timeout 1 --data_dir "$data" \
  --train_steps 1
python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)' \
  >"$tmp/busy.port" &
busy=$!
for _ in $(seq 50); do [ -s "$tmp/busy.port" ] && break; sleep 0.1; done
expect "psd on a port in use" 2 "psd: cannot listen on 127.0.0.1:$(cat "$tmp/busy.port") \(--bind, --port\): address already in use \(another process" -- \
  "${its_log[@]}" "$build/server/psd" --port "$(cat "$tmp/busy.port")"
kill "$busy" 2>/dev/null; wait "$busy" 2>/dev/null
# --unix_socket: another psd's socket, or any other file at the path, is
# refused and left alone; a stale socket is replaced.
"$build/server/psd" --port 0 --port_file "$tmp/first.port" --unix_socket "$tmp/first.sock" >"$tmp/first.log" 2>&1 &
first=$!
for _ in $(seq 100); do [ -s "$tmp/first.port" ] && break; sleep 0.05; done
expect "psd on another psd's Unix socket" 2 "psd: cannot listen on unix:$tmp/first.sock \(--unix_socket\): another process listens there" -- \
  "${its_log[@]}" "$build/server/psd" --port 0 --unix_socket "$tmp/first.sock"
if python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$tmp/first.sock" 2>/dev/null; then
  echo "ok   the first psd still listens on its Unix socket"
else
  echo "FAIL the second psd took the first one's Unix socket away"; failures=$((failures + 1))
fi
kill "$first" 2>/dev/null; wait "$first" 2>/dev/null
printf 'keep me\n' >"$tmp/not-a-socket"
expect "psd --unix_socket on a regular file" 2 "psd: cannot listen on unix:$tmp/not-a-socket \(--unix_socket\): the path exists and is not a socket" -- \
  "${its_log[@]}" "$build/server/psd" --port 0 --unix_socket "$tmp/not-a-socket"
if [ "$(cat "$tmp/not-a-socket" 2>/dev/null)" = "keep me" ]; then
  echo "ok   psd left the file at --unix_socket as it was"
else
  echo "FAIL psd removed the file at --unix_socket"; failures=$((failures + 1))
fi
# A stale socket (its psd gone) is replaced.
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$tmp/stale.sock"
"$build/server/psd" --port 0 --port_file "$tmp/stale.port" --unix_socket "$tmp/stale.sock" >"$tmp/stale.log" 2>&1 &
stale=$!
for _ in $(seq 100); do [ -s "$tmp/stale.port" ] && break; sleep 0.05; done
if [ -s "$tmp/stale.port" ]; then
  echo "ok   psd replaces a stale socket at --unix_socket"
else
  echo "FAIL psd did not start on a stale socket's path:"; cat "$tmp/stale.log"; failures=$((failures + 1))
fi
kill "$stale" 2>/dev/null; wait "$stale" 2>/dev/null
expect "psd --bind unknown host" 2 "psd: cannot listen on no-such-host.invalid:0 \(--bind, --port\): unknown host name" -- \
  "${its_log[@]}" "$build/server/psd" --port 0 --bind no-such-host.invalid
expect "ps task --nice out of range" 2 "mnist_trainer: error: --nice must be in -20..19" -- \
  "$trainer" --job_name ps --task_index 0 --ps_hosts "127.0.0.1:$port" --worker_hosts 127.0.0.1:2223 --nice 25
expect "unknown optimizer" 2 "optimizer" -- "$trainer" --local --optimizer adamw --train_steps 1
expect "bad hidden units" 2 "hidden_units" -- "$trainer" --local --hidden_units 100,x --train_steps 1 --data_dir "$data"
expect "no steps" 2 "train_steps|epochs" -- "$trainer" --local --epochs 0 --data_dir "$data"
# Found in review: a batch larger than memory ended in "std::bad_alloc".
expect "batch larger than memory" 2 "mnist_trainer: error: .*batch of 2000000000 examples.*lower the batch size" -- \
  "$trainer" --local --batch_size 2000000000 --train_steps 1 --data_dir "$data"
# Found in review: NaN/Inf epochs trained 1 step (a cast of NaN to int64) or
# blamed the wrong flag; an unknown log level silently turned logging off;
# more replicas than workers failed at psd (exit 1).
for epochs in nan inf 1e300; do
  expect "--epochs $epochs" 2 "linreg_trainer: error: --epochs" -- \
    "$build/examples/linreg_trainer" --job_name worker --task_index 0 --ps_hosts 127.0.0.1:2 --train_steps 0 --epochs "$epochs"
done
expect "--epochs 1e300 (local)" 2 "mnist_trainer: error: --epochs 1e\+?300|--epochs .* more global steps" -- \
  "$trainer" --local --epochs 1e300 --data_dir "$data"
expect "--log_level bogus (linreg)" 2 "linreg_trainer: error: unknown --log_level 'bogus'" -- \
  "$build/examples/linreg_trainer" --log_level bogus --job_name worker --task_index 0 --ps_hosts 127.0.0.1:2
expect "more replicas than workers" 2 "replicas_to_aggregate=3 is more than the 2 workers" -- \
  "$build/examples/linreg_trainer" --job_name worker --task_index 0 --ps_hosts 127.0.0.1:2 \
  --worker_hosts 127.0.0.1:3,127.0.0.1:4 --sync_replicas --replicas_to_aggregate 3

# ctr_trainer's table flags are refused before it connects: the chief that
# psd refuses at its tables has configured the job and created the dense
# variables, and a corrected run (here with other --hidden_units) is then
# refused by that psd until it restarts.
"$build/server/psd" --port 0 --port_file "$tmp/ctr.port" >"$tmp/ctr.log" 2>&1 &
ctr_psd=$!
for _ in $(seq 100); do [ -s "$tmp/ctr.port" ] && break; sleep 0.05; done
ctr=("$build/examples/ctr_trainer" --job_name worker --task_index 0 --ps_hosts "127.0.0.1:$(cat "$tmp/ctr.port")"
     --train_steps 3 --log_every 0)
for bad in "--embedding_learning_rate 0" "--wide_learning_rate nan" "--ftrl_l1 -1" "--ftrl_l2 inf" "--embedding_init nan"; do
  # shellcheck disable=SC2086
  expect "ctr_trainer $bad" 2 "ctr_trainer: error: ${bad%% *} must be" -- "${ctr[@]}" --synthetic 2000 --hidden_units 64 $bad
done
expect "ctr_trainer --synthetic -5" 2 "ctr_trainer: error: --synthetic must be >= 0" -- "${ctr[@]}" --synthetic -5
# --num_gpus: one GPU per worker at most, and that one usable (refused before the data loads).
expect "ctr_trainer --num_gpus 2" 2 "ctr_trainer: error: --num_gpus=2: ctr_trainer computes on one GPU per worker" -- \
  "${ctr[@]}" --synthetic 2000 --num_gpus 2
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect "ctr_trainer --num_gpus 1 without a GPU" 2 \
    "ctr_trainer: error: --num_gpus=1: CudaLogisticMlp: (this build has no CUDA support|device 0 requested, 0 CUDA device)" -- \
    "${ctr[@]}" --synthetic 2000 --num_gpus 1
fi
if timeout 60 "${ctr[@]}" --synthetic 2000 >"$tmp/out" 2>&1; then
  echo "ok   ctr_trainer trains on that psd after the refusals"
else
  echo "FAIL ctr_trainer on a psd a refused run had used:"; tail -n 3 "$tmp/out"; failures=$((failures + 1))
fi
kill "$ctr_psd" 2>/dev/null; wait "$ctr_psd" 2>/dev/null

# Out-of-range flags are refused by the flag parser itself (CLI11 adds a
# "Run with --help" line, so not through expect's one-line rule).
for pair in "$trainer --local --train_steps 1|--busy_poll_us" "$build/server/psd --port 0|--busy_poll_us" \
            "$trainer --local --train_steps 1|--shared_memory_mb" "$build/server/psd --port 0|--max_shared_memory_mb"; do
  cmd=${pair%|*} flag=${pair#*|}
  timeout 10 $cmd $flag -1 >/dev/null 2>"$tmp/err"
  rc=$?
  if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q -- "$flag: Value -1 not in range" "$tmp/err"; then
    echo "FAIL negative $flag ($cmd): exit $rc:"; cat "$tmp/err"; failures=$((failures + 1))
  else
    echo "ok   negative $flag refused: ${cmd%% *}"
  fi
done

# A psd that wants a token: a trainer without it is told how to give it,
# and one with --auth_token_file trains (before, trainers had no such flag).
printf 'trainer-test-token-%s\n' "$$" >"$tmp/token"
chmod 600 "$tmp/token"
"$build/server/psd" --port 0 --port_file "$tmp/auth.port" --auth_token_file "$tmp/token" >"$tmp/auth.log" 2>&1 &
auth_psd=$!
for _ in $(seq 100); do [ -s "$tmp/auth.port" ] && break; sleep 0.05; done
auth_hosts="127.0.0.1:$(cat "$tmp/auth.port")"
expect "no token for a psd that wants one" 3 "authentication failed.*--auth_token_file" -- \
  "$build/examples/linreg_trainer" --job_name worker --task_index 0 --ps_hosts "$auth_hosts" --train_steps 20
if timeout 60 "$build/examples/linreg_trainer" --job_name worker --task_index 0 --ps_hosts "$auth_hosts" \
     --train_steps 200 --log_every 0 --auth_token_file "$tmp/token" >"$tmp/out" 2>&1; then
  echo "ok   a trainer with --auth_token_file trains against psd --auth_token_file"
else
  echo "FAIL trainer --auth_token_file:"; cat "$tmp/out"; failures=$((failures + 1))
fi
kill "$auth_psd" 2>/dev/null
wait "$auth_psd" 2>/dev/null

# launch_local.sh --help shows every option (it cut the last ones off).
help=$("$(dirname "$0")/../scripts/launch_local.sh" --help)
if grep -q -- "--quiet" <<<"$help" && grep -q "Environment:" <<<"$help"; then
  echo "ok   launch_local --help shows --quiet and the environment"
else
  echo "FAIL launch_local --help: $help"; failures=$((failures + 1))
fi

# launch_local.sh refuses a bad option value before it starts anything.
for args in "--timeout abc|--timeout must be a whole number" "--max_staleness x|--max_staleness must be a whole number" \
            "--port_base 65535|--port_base must leave room for 4 ports" "--workers|--workers needs a value" \
            "--trainer $build/examples|is not an executable file"; do
  want=${args#*|}
  # shellcheck disable=SC2086
  BUILD_DIR="$build" timeout 60 "$(dirname "$0")/../scripts/launch_local.sh" --quiet --run_dir "$tmp/never" ${args%|*} \
    >/dev/null 2>"$tmp/err"
  rc=$?
  if [ "$rc" = 2 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q -- "^launch_local: .*$want" "$tmp/err" && [ ! -e "$tmp/never" ]; then
    echo "ok   launch_local ${args%|*}: $(cat "$tmp/err")"
  else
    echo "FAIL launch_local ${args%|*}: exit $rc (want 2, one line /$want/, nothing started):"; cat "$tmp/err"
    failures=$((failures + 1))
  fi
  rm -rf "$tmp/never"
done

# launch_local.sh --timeout ends a job that runs on (before, it waited for
# some process to end before it looked at the clock: a hung job hung it).
start=$SECONDS
BUILD_DIR="$build" timeout 60 "$(dirname "$0")/../scripts/launch_local.sh" --quiet --workers 2 --timeout 2 \
  --run_dir "$tmp/run" --trainer "$build/examples/linreg_trainer" -- --train_steps 100000000 --log_every 0 \
  >/dev/null 2>"$tmp/err"
rc=$?
if [ "$rc" = 1 ] && grep -q "timeout after 2s" "$tmp/err" && [ $((SECONDS - start)) -lt 20 ]; then
  echo "ok   launch_local --timeout 2 ended a job that ran on ($((SECONDS - start)) s)"
else
  echo "FAIL launch_local --timeout: exit $rc after $((SECONDS - start)) s:"; cat "$tmp/err"; failures=$((failures + 1))
fi

# launch_local.sh gives psd a Unix socket, which its workers switch to (and
# so to shared memory); --tcp keeps them on TCP; a run directory whose
# socket path is too long falls back to TCP with a line that says so.
check_transport() {  # name, expected ("unix" or "tcp"), run dir, launch_local flags...
  local name=$1 want=$2 dir=$3
  shift 3
  BUILD_DIR="$build" timeout 60 "$(dirname "$0")/../scripts/launch_local.sh" --quiet --workers 2 \
    --run_dir "$dir" --trainer "$build/examples/linreg_trainer" "$@" -- --train_steps 300 --log_every 0 \
    >/dev/null 2>"$tmp/transport.err"
  local rc=$? got=tcp
  grep -q "unix connected as worker" "$dir/ps0.log" 2>/dev/null && got=unix
  if [ "$rc" = 0 ] && [ "$got" = "$want" ]; then
    echo "ok   launch_local $name: workers on $got"
  else
    echo "FAIL launch_local $name: exit $rc, workers on $got (wanted $want):"; cat "$tmp/transport.err"
    failures=$((failures + 1))
  fi
}
check_transport "by default" unix "$tmp/unix"
check_transport "--tcp" tcp "$tmp/tcp" --tcp
long="$tmp/$(printf 'd%.0s' $(seq 1 90))"
check_transport "with a socket path too long" tcp "$long"
if grep -q "too long for a Unix socket" "$tmp/transport.err"; then
  echo "ok   launch_local says it falls back to TCP"
else
  echo "FAIL launch_local did not say why it used TCP:"; cat "$tmp/transport.err"; failures=$((failures + 1))
fi

# A hang-up of launch_local.sh (its terminal closed) stops its processes
# too (before, only INT and TERM did: psd and the workers ran on). Not
# where SIGHUP is ignored already (under nohup): a shell cannot trap a
# signal ignored when it started, and its children ignore it as asked.
if (( 0x$(awk '/^SigIgn/ {print $2}' /proc/$$/status) & 1 )); then
  echo "skip launch_local on SIGHUP: SIGHUP is ignored here (nohup)"
else
  BUILD_DIR="$build" "$(dirname "$0")/../scripts/launch_local.sh" --quiet --workers 2 --run_dir "$tmp/hup" \
    --trainer "$build/examples/linreg_trainer" -- --train_steps 100000000 --log_every 0 >/dev/null 2>"$tmp/hup.err" &
  launcher=$!
  children_of() {  # from /proc: procps may not be installed
    local f rest ppid
    for f in /proc/[0-9]*/stat; do
      rest=$(cat "$f" 2>/dev/null) || continue
      rest=${rest##*) }  # past the command name: state, parent, ...
      read -r _ ppid _ <<<"$rest"
      [ "$ppid" = "$1" ] && { f=${f#/proc/}; echo -n "${f%/stat} "; }
    done
  }
  children=""
  for _ in $(seq 100); do  # the ps and both workers started
    children=$(children_of "$launcher")
    [ "$(echo $children | wc -w)" -ge 3 ] && [ -s "$tmp/hup/ps0.port" ] && break
    sleep 0.1
  done
  kill -HUP "$launcher"
  for _ in $(seq 100); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  left=""
  for _ in $(seq 30); do
    left=""
    for p in $children; do kill -0 "$p" 2>/dev/null && left+="$p "; done
    [ -z "$left" ] && break
    sleep 0.1
  done
  if [ -n "$children" ] && [ -z "$left" ] && ! kill -0 "$launcher" 2>/dev/null; then
    echo "ok   launch_local stopped its $(echo $children | wc -w) processes on SIGHUP"
  else
    echo "FAIL launch_local on SIGHUP: children '$children', still running '$left':"; cat "$tmp/hup.err"
    failures=$((failures + 1))
    for p in $left; do kill -KILL "$p" 2>/dev/null; done
  fi
  kill -KILL "$launcher" 2>/dev/null
  wait "$launcher" 2>/dev/null
fi

[ $failures = 0 ] && echo "all bad-input cases ok" || { echo "$failures case(s) failed"; exit 1; }
