#!/usr/bin/env bash
# The wide & deep trainer learns the planted click model: 1 ps + 3 workers
# through scripts/launch_local.sh on --synthetic examples; the held-out AUC is
# within TOL of the planted model's own AUC on the same held-out examples.
# Mode avazu: async, from a gzip-compressed file in Avazu's CSV layout
# (make_ctr_data --layout avazu; no dense features, 21 fields and the hour),
# which each worker streams its share of (--stream_data).
# Mode row_filters: async, the tables admitting ids at their 2nd push and
# dropping rows untouched for 100 global steps; some pushed ids must have
# been held back (ids_filtered) and some rows dropped (rows_expired), the
# AUC as above.
#   test/ctr_trainer_test.sh BUILD_DIR async|sync|avazu|row_filters [EXAMPLES] [MAX_DISTINCT] [TOL]
# docs/ctr.md has the 1M-example check with the generator's defaults.
set -uo pipefail
build=$(cd "$1" && pwd); mode=$2; examples=${3:-500000}; max_distinct=${4:-30000}; tol=${5:-0.01}
cd "$(dirname "$0")/.."
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
flags=(--quiet --run_dir "$run" --timeout 400 --trainer "$build/examples/ctr_trainer")
[ "$mode" = sync ] && flags+=(--sync)
data=(--synthetic "$examples" --synthetic_max_distinct "$max_distinct")
[ "$mode" = row_filters ] && data+=(--min_count 2 --count_sketch_width 262144 --expire_after_steps 100)
if [ "$mode" = avazu ]; then
  "$build/examples/make_ctr_data" --layout avazu --out "$run/train.csv" --examples "$examples" \
    --max_distinct "$max_distinct" >"$run/make_ctr_data.txt" || { echo "FAIL: make_ctr_data"; exit 1; }
  gzip "$run/train.csv"  # as Avazu's train.gz is downloaded
  data=(--train_file "$run/train.csv.gz" --stream_data)
fi
BUILD_DIR="$build" scripts/launch_local.sh "${flags[@]}" -- "${data[@]}" \
  --batch_size 512 --log_every 0 --logdir "$run/tb" --summary_every 20
rc=$?
grep -h -E "^(planted|eval|==|RESULT)" "$run/worker0.log"
grep -h "^SHARES" "$run"/worker*.log
[ $rc = 0 ] || { echo "FAIL: launch_local exited $rc"; tail -n 20 "$run"/*.log; exit 1; }
if [ "$mode" = avazu ] && [ "$(cat "$run"/worker*.log | grep -c 'training examples (of .*), streamed')" != 3 ]; then
  echo "FAIL: not every worker streamed its share"; grep -h "training examples" "$run"/worker*.log; exit 1
fi
[ "$(cat "$run"/worker*.log | grep -c '^SHARES')" = 3 ] || { echo "FAIL: not every worker reported its step shares"; exit 1; }
# The chief's summaries: loss while training, held-out AUC and log-loss at each evaluation.
python3 scripts/check_events.py --unique "$run/tb" >"$run/events.txt" ||
  { echo "FAIL: summaries"; tail -n 3 "$run/events.txt"; exit 1; }
for tag in loss auc/holdout log_loss/holdout; do
  grep -q "^$tag"$'\t'"step=" "$run/events.txt" || { echo "FAIL: no '$tag' scalar in the summaries"; head "$run/events.txt"; exit 1; }
done
result=$(grep -h '^RESULT' "$run/worker0.log")
if [ "$mode" = row_filters ]; then
  filtered=$(sed -n 's/.* ids_filtered=\([0-9]*\).*/\1/p' <<<"$result")
  [ "${filtered:-0}" -gt 0 ] || { echo "FAIL: --min_count 2 held back no pushed id (ids_filtered=${filtered:-none})"; exit 1; }
  expired=$(sed -n 's/.* rows_expired=\([0-9]*\).*/\1/p' <<<"$result")
  [ "${expired:-0}" -gt 0 ] || { echo "FAIL: --expire_after_steps 100 dropped no row (rows_expired=${expired:-none})"; exit 1; }
  echo "min_count 2: $filtered pushed ids held back; expire_after_steps 100: $expired rows dropped"
fi
auc=$(sed -n 's/.* holdout_auc=\([0-9.]*\).*/\1/p' <<<"$result")
planted=$(sed -n 's/.* planted_auc=\([0-9.]*\).*/\1/p' <<<"$result")
# From a file, the planted model's AUC is what make_ctr_data printed.
[ "$mode" = avazu ] && planted=$(sed -n 's/^planted model on the held-out part: .* AUC \([0-9.]*\)$/\1/p' "$run/make_ctr_data.txt")
[ -n "$auc" ] && [ -n "$planted" ] || { echo "FAIL: no RESULT line"; exit 1; }
if python3 -c "import sys; sys.exit(0 if float('$auc') >= float('$planted') - $tol else 1)"; then
  echo "PASS: $mode held-out AUC $auc within $tol of the planted model's $planted ($examples examples)"
else
  echo "FAIL: $mode held-out AUC $auc is more than $tol below the planted model's $planted ($examples examples)"; exit 1
fi
