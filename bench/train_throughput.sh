#!/usr/bin/env bash
# Training throughput of mnist_trainer on Fashion-MNIST (784-100-10 MLP, CPU
# path, batch 100): one process with no psd at all (--local), then 1 ps + 3
# workers async, then sync, all in this run; samples/s, time to the target
# test accuracy, and where a worker's step time goes (pull / compute / push).
#
#   bench/train_throughput.sh [EPOCHS] [-- extra trainer flags]     (default 5 epochs)
# Environment: BUILD_DIR (build), WORKERS (3), PSD_FLAGS (extra psd flags, e.g. "--busy_poll_us 50").
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;; esac  # the comment block above
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
epochs=${1:-5}
[ $# -gt 0 ] && shift
[ "${1:-}" = -- ] && shift
extra=("$@")
workers=${WORKERS:-3}
trainer="$BUILD_DIR/examples/mnist_trainer"
data=$(scripts/get_data.sh data/fashion-mnist) || exit 1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model 784-100-10, batch 100, $epochs epochs, CPU engine; ${extra[*]}"

field() { sed -n "s/^RESULT .*$1=\([-0-9.]*\).*/\1/p" "$2"; }
row() {  # mode logfile
  printf "%-24s %12s %10s %12s %10s\n" "$1" "$(field samples_per_sec "$2")" "$(field seconds "$2")" \
    "$(field time_to_target "$2")" "$(field test_accuracy "$2")"
}

"$trainer" --local --epochs "$epochs" --data_dir "$data" --log_every 0 "${extra[@]}" >"$out/local.log" 2>&1 ||
  { echo "local run failed:"; tail -5 "$out/local.log"; exit 1; }
for mode in async sync; do
  flags=(--workers "$workers" --quiet --run_dir "$out/$mode")
  [ $mode = sync ] && flags+=(--sync)
  [ -n "${PSD_FLAGS:-}" ] && flags+=(--psd_flags "$PSD_FLAGS")
  scripts/launch_local.sh "${flags[@]}" -- --epochs "$epochs" --data_dir "$data" --log_every 0 "${extra[@]}" \
    >"$out/$mode.launch" 2>&1 || { echo "$mode run failed:"; tail -5 "$out/$mode.launch"; exit 1; }
done

echo
printf "%-24s %12s %10s %12s %10s\n" "run" "samples/s" "train s" "s to 0.85" "test acc"
row "local (1 process)" "$out/local.log"
row "1 ps + $workers workers async" "$out/async/worker0.log"
row "1 ps + $workers workers sync" "$out/sync/worker0.log"
echo
echo "per worker step (ms): pull = waiting for parameters (RPC, the ps, in sync the slowest worker), push = gradients + step report"
for mode in async sync; do
  for f in "$out/$mode"/worker*.log; do
    printf "%-6s %-8s %s\n" "$mode" "$(basename "$f" .log)" "$(sed -n 's/.*per step: //p' "$f")"
  done
done
