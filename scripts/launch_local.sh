#!/usr/bin/env bash
# Starts a whole training job on this machine: ps tasks, then workers, each a
# process with its own log in a run directory; follows the chief on the
# terminal; stops everything it started (by PID) on Ctrl-C or on the first
# failure. Exit code: 0 when every worker and ps task ended well.
#
#   scripts/launch_local.sh                                  # 1 ps + 3 workers, async, 5 epochs
#   scripts/launch_local.sh --sync -- --epochs 3
#   scripts/launch_local.sh --workers 2 --ps 2 --max_staleness 4 -- --hidden_units 256,128
#   scripts/launch_local.sh --trainer build/examples/linreg_trainer -- --train_steps 300
#
# Options (before --; what follows -- goes to every worker):
#   --workers N        workers (default 3)               --ps N         ps tasks (default 1)
#   --sync             --sync_replicas (replicas = workers)
#   --max_staleness N  bounded staleness
#   --ps_mode M        psd (default: the standalone daemon on a free port) or
#                      trainer (the trainer itself with --job_name=ps, on --port_base ports)
#   --port_base P      first port for --ps_mode trainer and the workers' nominal ports (default 22220)
#   --trainer PATH     default build/examples/mnist_trainer; a .py trainer (examples/python/torch_mnist.py)
#                      runs with /usr/bin/python3 and PYTHONPATH=$BUILD_DIR/python
#   --run_dir DIR      default runs/<timestamp> (runs/<timestamp>-2 ... for a second run that second)
#   --psd_flags "F"    extra flags for every ps task (e.g. "--threads 1")
#   --tcp              workers and psd use TCP only. Otherwise (psd mode) each psd also listens
#                      on a Unix socket in the run directory, and the workers, being on its
#                      host, switch to it and move tensors through shared memory
#   --unix             workers name psd by that socket (unix:PATH) instead of its TCP port
#   --timeout S        stop everything after S seconds (default 0: none)
#   --quiet            do not follow the chief on the terminal
# The chief writes TensorBoard summaries to <run_dir>/tb unless a --logdir follows --;
# the launcher prints the tensorboard command, each ps's status page, and the
# scripts/cluster_status.py command that shows every shard in one table.
# Environment: BUILD_DIR (default build), DATA_DIR (default data/fashion-mnist,
# made by scripts/get_data.sh when missing; mnist_trainer and torch_mnist only).
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
workers=3 num_ps=1 sync=0 staleness=0 ps_mode=psd port_base=22220 timeout=0 quiet=0 unix=0 tcp=0 psd_flags=""
trainer="$BUILD_DIR/examples/mnist_trainer"
run_dir=""
die() { echo "launch_local: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --workers | --ps | --max_staleness | --ps_mode | --port_base | --trainer | --run_dir | --timeout | --psd_flags)
      [ $# -ge 2 ] || die "$1 needs a value" ;;
  esac
  case "$1" in
    --workers) workers=${2:?}; shift 2 ;;
    --ps) num_ps=${2:?}; shift 2 ;;
    --sync) sync=1; shift ;;
    --max_staleness) staleness=${2:?}; shift 2 ;;
    --ps_mode) ps_mode=${2:?}; shift 2 ;;
    --port_base) port_base=${2:?}; shift 2 ;;
    --trainer) trainer=${2:?}; shift 2 ;;
    --run_dir) run_dir=${2:?}; shift 2 ;;
    --timeout) timeout=${2:?}; shift 2 ;;
    --quiet) quiet=1; shift ;;
    --unix) unix=1; shift ;;
    --tcp) tcp=1; shift ;;
    --psd_flags) psd_flags=${2?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;  # the comment block above
    *) die "unknown option '$1' (trainer flags go after --)" ;;
  esac
done
trainer_flags=("$@")
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer"
[[ "$num_ps" =~ ^[1-9][0-9]*$ ]] || die "--ps must be a positive integer"
[[ "$ps_mode" == psd || "$ps_mode" == trainer ]] || die "--ps_mode must be psd or trainer"
[[ "$staleness" =~ ^(0|[1-9][0-9]*)$ ]] || die "--max_staleness must be a whole number (0: async)"
[[ "$timeout" =~ ^(0|[1-9][0-9]*)$ ]] || die "--timeout must be a whole number of seconds (0: none)"
{ [[ "$port_base" =~ ^[1-9][0-9]{0,4}$ ]] && [ $((port_base + num_ps + workers - 1)) -le 65535 ]; } ||
  die "--port_base must leave room for $((num_ps + workers)) ports in 1..65535"
trainer_cmd=("$trainer")
if [[ "$trainer" == *.py ]]; then
  [ -f "$trainer" ] || die "$trainer not found"
  trainer_cmd=(/usr/bin/python3 "$trainer")
  export PYTHONPATH="$BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}" PSD_BIN="$BUILD_DIR/server/psd"
else
  [ -e "$trainer" ] || die "$trainer not found: build first (scripts/setup.sh)"
  [ -f "$trainer" ] && [ -x "$trainer" ] || die "$trainer is not an executable file (--trainer)"
fi
psd="$BUILD_DIR/server/psd"
[ "$ps_mode" = trainer ] || [ -x "$psd" ] || die "$psd not found: build first (scripts/setup.sh)"

data_flags=()
if [[ "$(basename "$trainer")" == mnist_trainer* || "$(basename "$trainer")" == torch_mnist* ]] && ! printf '%s\n' "${trainer_flags[@]}" | grep -q -- '--data_dir'; then
  data_dir=${DATA_DIR:-data/fashion-mnist}
  [ -e "$data_dir/train-images-idx3-ubyte.gz" ] || [ -e "$data_dir/train-images-idx3-ubyte" ] ||
    scripts/get_data.sh "$data_dir" >/dev/null || die "no data in $data_dir (scripts/get_data.sh failed)"
  data_flags=(--data_dir "$data_dir")
fi

if [ -n "${run_dir:-}" ]; then
  mkdir -p "$run_dir" || die "cannot create $run_dir"
else
  # One folder per run, even for two launched in the same second: mkdir
  # (not -p) fails for the second, which takes the next suffix.
  mkdir -p runs || die "cannot create runs/"
  base=runs/$(date +%Y%m%d-%H%M%S) run_dir=""
  for n in $(seq 1 100); do
    try=$base; [ "$n" = 1 ] || try=$base-$n
    if mkdir "$try" 2>/dev/null; then run_dir=$try; break; fi
  done
  [ -n "$run_dir" ] || die "cannot create a run directory $base[-N] under runs/"
fi

pids=()
names=()
timer_pid=""  # --timeout's sleep: waited on with the processes, so it ends the wait
cleanup() {
  local pid
  [ -n "$timer_pid" ] && kill "$timer_pid" 2>/dev/null
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
}
on_signal() {
  echo "launch_local: interrupted, stopping every process" >&2
  cleanup
  exit 130
}
# A hang-up (the terminal closed, `kill -HUP`) stops the job too, and so does
# the script ending any other way: no psd or worker outlives it.
trap on_signal INT TERM HUP
trap cleanup EXIT

# --- ps tasks ---
ps_hosts=()
# Each psd's Unix socket; a path over the kernel's 107 bytes cannot be bound: TCP only then.
socket_paths=()
for ((i = 0; i < num_ps; i++)); do socket_paths+=("$(cd "$run_dir" && pwd)/ps$i.sock"); done
if [ "$tcp" = 0 ] && [ "$ps_mode" = psd ] && [ ${#socket_paths[$((num_ps - 1))]} -gt 100 ]; then
  [ "$unix" = 1 ] && die "--unix: the socket path ${socket_paths[$((num_ps - 1))]} is too long (over 100 bytes); use a shorter --run_dir"
  echo "launch_local: the run directory's path is too long for a Unix socket; workers use TCP only" >&2
  tcp=1
fi
# Each ps serves its status page on a free port (several never clash), unless --psd_flags sets
# one; either way it writes the port to ps<i>.http, where the lines below and cluster_status.py read it.
any_http_port=1
[[ " $psd_flags " == *" --http_port "* || " $psd_flags " == *" --http_port="* ]] && any_http_port=0
for ((i = 0; i < num_ps; i++)); do
  port_file="$run_dir/ps$i.port"
  rm -f "$port_file" "$run_dir/ps$i.http"
  http_flags=(--http_port_file "$run_dir/ps$i.http")
  [ "$any_http_port" = 1 ] && http_flags=(--http_port any "${http_flags[@]}")
  if [ "$ps_mode" = psd ]; then
    unix_flags=()
    [ "$tcp" = 0 ] && unix_flags=(--unix_socket "${socket_paths[$i]}")
    # shellcheck disable=SC2086
    "$psd" --port 0 --port_file "$port_file" --shard_index "$i" --num_shards "$num_ps" "${unix_flags[@]}" \
      "${http_flags[@]}" $psd_flags \
      >"$run_dir/ps$i.log" 2>&1 &
  else
    hosts=""
    for ((j = 0; j < num_ps; j++)); do hosts+="${hosts:+,}127.0.0.1:$((port_base + j))"; done
    whosts=""
    for ((j = 0; j < workers; j++)); do whosts+="${whosts:+,}127.0.0.1:$((port_base + num_ps + j))"; done
    # shellcheck disable=SC2086
    "${trainer_cmd[@]}" --job_name ps --task_index "$i" --ps_hosts "$hosts" --worker_hosts "$whosts" \
      --port_file "$port_file" "${http_flags[@]}" $psd_flags >"$run_dir/ps$i.log" 2>&1 &
  fi
  pids+=($!)
  names+=("ps$i")
done
for ((i = 0; i < num_ps; i++)); do
  port_file="$run_dir/ps$i.port"
  for n in $(seq 300); do
    [ -s "$port_file" ] && break
    kill -0 "${pids[$i]}" 2>/dev/null || break
    [ "$n" = 60 ] && echo "launch_local: waiting for ps$i to listen (3 s of 15 s; its log: $run_dir/ps$i.log)" >&2
    sleep 0.05
  done
  if [ ! -s "$port_file" ]; then
    echo "launch_local: ps$i did not start listening; its log ($run_dir/ps$i.log):" >&2
    tail -n 5 "$run_dir/ps$i.log" >&2
    cleanup
    exit 1
  fi
  [ -s "$run_dir/ps$i.http" ] && echo "launch_local: ps$i status page: http://127.0.0.1:$(cat "$run_dir/ps$i.http")/" >&2
  if [ "$unix" = 1 ] && [ "$tcp" = 0 ] && [ "$ps_mode" = psd ]; then
    ps_hosts+=("unix:${socket_paths[$i]}")
  else
    ps_hosts+=("127.0.0.1:$(cat "$port_file")")
  fi
done
ps_list=$(IFS=,; echo "${ps_hosts[*]}")
worker_list=""
for ((j = 0; j < workers; j++)); do worker_list+="${worker_list:+,}127.0.0.1:$((port_base + num_ps + j))"; done

# The chief's TensorBoard summaries go to the run directory unless the flags name a --logdir.
logdir=""
for ((k = 0; k < ${#trainer_flags[@]}; k++)); do
  case "${trainer_flags[$k]}" in
    --logdir=* | --log_dir=*) logdir=${trainer_flags[$k]#*=} ;;
    --logdir | --log_dir) logdir=${trainer_flags[$((k + 1))]:-} ;;
  esac
done
if [ -z "$logdir" ]; then
  logdir="$run_dir/tb"
  trainer_flags+=(--logdir "$logdir")
fi

mode_flags=()
[ "$sync" = 1 ] && mode_flags+=(--sync_replicas)
[ "$staleness" != 0 ] && mode_flags+=(--max_staleness "$staleness")
echo "launch_local: ps $ps_list, $workers workers, run directory $run_dir" >&2
echo "launch_local: $trainer ${mode_flags[*]} ${data_flags[*]} ${trainer_flags[*]}" >&2
echo "launch_local: TensorBoard: tensorboard --logdir $logdir" >&2
[ ${#http_flags[@]} -gt 0 ] && echo "launch_local: every shard in one table: scripts/cluster_status.py $run_dir" >&2
# psd 0's page with every other shard's page in ?shards=: one page for the cluster.
if [ "$num_ps" -gt 1 ] && [ -s "$run_dir/ps0.http" ]; then
  peers=""
  for ((i = 1; i < num_ps; i++)); do
    [ -s "$run_dir/ps$i.http" ] && peers+="${peers:+,}127.0.0.1:$(cat "$run_dir/ps$i.http")"
  done
  echo "launch_local: all shards on one page: http://127.0.0.1:$(cat "$run_dir/ps0.http")/?shards=$peers" >&2
fi

# --- workers (the chief last, so the others are already waiting for it) ---
start_worker() {
  local i=$1
  local cmd=("${trainer_cmd[@]}" --job_name worker --task_index "$i" --ps_hosts "$ps_list" --worker_hosts "$worker_list"
             "${mode_flags[@]}" "${data_flags[@]}" "${trainer_flags[@]}")
  if [ "$i" = 0 ] && [ "$quiet" = 0 ]; then
    # The chief: its output on the terminal too (progress bar on stderr when a
    # tty), and both streams in its log (its error lines with them).
    if [ -t 2 ]; then
      : >"$run_dir/worker$i.log"
      # Its streams reach the terminal through tee: the progress bar goes
      # to the terminal itself (PS_PROGRESS_TTY), and stays out of the log.
      PS_PROGRESS_TTY=$(readlink /proc/self/fd/2) \
        "${cmd[@]}" > >(tee -a "$run_dir/worker$i.log") 2> >(tee -a "$run_dir/worker$i.log" >&2) &
    else
      "${cmd[@]}" > >(tee "$run_dir/worker$i.log") 2>&1 &
    fi
  else
    "${cmd[@]}" >"$run_dir/worker$i.log" 2>&1 &
  fi
  pids+=($!)
  names+=("worker$i")
}
for ((i = workers - 1; i >= 0; i--)); do start_worker "$i"; done

# --- wait: the first failure stops everything ---
declare -A status
remaining=${#pids[@]}
start=$SECONDS
failed=""
# `wait -n` returns only when a process ends: a sleep beside them ends it
# at the timeout even when none does (a hung job).
if [ "$timeout" != 0 ]; then
  sleep "$timeout" &
  timer_pid=$!
fi
while [ "$remaining" -gt 0 ]; do
  if [ "$timeout" != 0 ] && [ $((SECONDS - start)) -ge "$timeout" ]; then
    failed="timeout after ${timeout}s"
    break
  fi
  done_pid=""
  live=()
  for k in "${!pids[@]}"; do [ -z "${status[$k]:-}" ] && live+=("${pids[$k]}"); done
  wait -n -p done_pid "${live[@]}" ${timer_pid:+"$timer_pid"} 2>/dev/null
  rc=$?
  if [ -z "$done_pid" ]; then sleep 0.1; continue; fi
  if [ "$done_pid" = "$timer_pid" ]; then
    timer_pid=""
    failed="timeout after ${timeout}s"
    break
  fi
  for k in "${!pids[@]}"; do
    if [ "${pids[$k]}" = "$done_pid" ]; then
      status[$k]=$rc
      remaining=$((remaining - 1))
      if [ "$rc" != 0 ]; then
        failed="${names[$k]} exited with status $rc"
      fi
    fi
  done
  [ -n "$failed" ] && break
  # Once every worker is done the ps tasks should exit on their own
  # (--exit_when_done); give them a while.
  workers_left=0
  for k in "${!pids[@]}"; do [[ "${names[$k]}" == worker* && -z "${status[$k]:-}" ]] && workers_left=1; done
  if [ "$workers_left" = 0 ] && [ "$remaining" -gt 0 ]; then
    for n in $(seq 100); do
      alive=0
      for k in "${!pids[@]}"; do [ -z "${status[$k]:-}" ] && kill -0 "${pids[$k]}" 2>/dev/null && alive=1; done
      [ $alive = 0 ] && break
      [ "$n" = 30 ] && echo "launch_local: the workers are done; waiting for the ps tasks to exit (3 s of 10 s)" >&2
      sleep 0.1
    done
    for k in "${!pids[@]}"; do
      if [ -z "${status[$k]:-}" ]; then
        if kill -0 "${pids[$k]}" 2>/dev/null; then
          failed="${names[$k]} did not exit after the job finished"
        else
          wait "${pids[$k]}"; rc=$?
          [ "$rc" != 0 ] && failed="${names[$k]} exited with status $rc"
        fi
        status[$k]=${rc:-0}
      fi
    done
    remaining=0
  fi
done

if [ -n "$failed" ]; then
  echo "launch_local: FAILED: $failed; stopping every process" >&2
  for k in "${!pids[@]}"; do
    if [ "${status[$k]:-0}" != 0 ]; then
      echo "--- last lines of $run_dir/${names[$k]}.log:" >&2
      tail -n 5 "$run_dir/${names[$k]}.log" >&2
    fi
  done
  cleanup
  exit 1
fi
[ -n "$timer_pid" ] && kill "$timer_pid" 2>/dev/null
wait 2>/dev/null  # the tee of the chief's output
echo "launch_local: job done; logs in $run_dir" >&2
exit 0
