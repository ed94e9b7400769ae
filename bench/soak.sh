#!/usr/bin/env bash
# Memory soak: 1 psd + 3 workers pushing and pulling a ~1 MB model (Adam) for
# DURATION seconds (default 600), psd checkpointing every 30 s. Samples psd's
# resident memory (VmRSS in /proc/PID/status) every 10 s, prints the series
# and whether it is flat after warm-up (the first 60 s): growth after warm-up
# under 5% and under 8 MiB.
#
#   bench/soak.sh [build dir] [duration secs]
# Stops only the processes it started (by PID).
case "${1:-}" in -h | --help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;; esac  # the comment block above
set -euo pipefail
BUILD=${1:-build}
DURATION=${2:-600}
WARMUP=${WARMUP:-60}
PSD=$BUILD/server/psd
WORKER=$BUILD/bench/soak_worker
[[ -x $PSD && -x $WORKER ]] || { echo "build first: ninja -C $BUILD server/psd bench/soak_worker" >&2; exit 2; }

TMP=$(mktemp -d /tmp/psd-soak-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

"$PSD" --port 0 --port_file "$TMP/port" --threads 2 --checkpoint_dir "$TMP/ckpt" --checkpoint_secs 30 \
  --exit_when_done false > "$TMP/psd.log" 2>&1 &
PSD_PID=$!
PIDS+=("$PSD_PID")
for _ in $(seq 100); do [[ -s $TMP/port ]] && break; sleep 0.1; done
PORT=$(cat "$TMP/port")
echo "psd pid $PSD_PID on 127.0.0.1:$PORT; 3 workers for $DURATION s"

for w in 0 1 2; do
  "$WORKER" --ps_hosts "127.0.0.1:$PORT" --worker "$w" --seconds "$DURATION" > "$TMP/worker$w.log" 2>&1 &
  PIDS+=("$!")
done

rss() { awk '/^VmRSS:/ {print $2}' "/proc/$PSD_PID/status"; }
SAMPLES=()
START=$(date +%s)
while :; do
  NOW=$(( $(date +%s) - START ))
  R=$(rss)
  SAMPLES+=("$NOW:$R")
  printf '%5d s  VmRSS %8d KiB\n' "$NOW" "$R"
  (( NOW + 10 > DURATION )) && break
  sleep 10
done
for p in "${PIDS[@]:1}"; do wait "$p" || echo "a worker failed (pid $p)" >&2; done
cat "$TMP"/worker*.log

# Flat after warm-up? Compare the first sample past WARMUP with the largest after it.
BASE=""; MAX=0
for s in "${SAMPLES[@]}"; do
  t=${s%%:*}; r=${s##*:}
  (( t < WARMUP )) && continue
  [[ -z $BASE ]] && BASE=$r
  (( r > MAX )) && MAX=$r
done
echo "checkpoints written: $(grep -c 'checkpoint of step' "$TMP/psd.log" || true)"
GROWTH=$(( MAX - BASE ))
PCT=$(awk -v g="$GROWTH" -v b="$BASE" 'BEGIN { printf "%.1f", 100 * g / b }')
echo "after ${WARMUP} s warm-up: VmRSS from $BASE KiB to a peak of $MAX KiB (+$GROWTH KiB, +$PCT%)"
if (( GROWTH < 8192 )) && awk -v p="$PCT" 'BEGIN { exit !(p < 5) }'; then
  echo "FLAT: psd's memory is stable"
else
  echo "GROWING: psd's memory kept rising after warm-up" ; exit 1
fi
