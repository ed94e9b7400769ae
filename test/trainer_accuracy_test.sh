#!/usr/bin/env bash
# The distributed MNIST trainer reaches the target test accuracy on
# Fashion-MNIST: 1 ps + 3 workers through scripts/launch_local.sh.
#   test/trainer_accuracy_test.sh BUILD_DIR async|sync [EPOCHS]
# Skips (77) when the data cannot be had (no dataset-fashion-mnist package).
set -uo pipefail
build=$(cd "$1" && pwd); mode=$2; epochs=${3:-4}
cd "$(dirname "$0")/.."
data=${DATA_DIR:-data/fashion-mnist}
if ! [ -e "$data/train-images-idx3-ubyte.gz" ] && ! [ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "SKIP: no Fashion-MNIST (scripts/get_data.sh installs dataset-fashion-mnist)"; exit 77
fi
[ -e "$data/train-images-idx3-ubyte.gz" ] || scripts/get_data.sh "$data" >/dev/null || exit 77
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
flags=(--quiet --run_dir "$run" --timeout 150)
[ "$mode" = sync ] && flags+=(--sync)
BUILD_DIR="$build" DATA_DIR="$data" scripts/launch_local.sh "${flags[@]}" -- --epochs "$epochs" --log_every 0 \
  --logdir "$run/tb" --summary_every 50
rc=$?
grep -h -E "^(eval|==|RESULT)" "$run/worker0.log"
[ $rc = 0 ] || { echo "FAIL: launch_local exited $rc"; tail -n 20 "$run"/*.log; exit 1; }
# The chief's summaries: valid files, each tag once per step, steps in order
# (the final evaluation repeated the last periodic one's step).
python3 scripts/check_events.py --unique "$run/tb" >"$run/events.txt" ||
  { echo "FAIL: summaries"; tail -n 3 "$run/events.txt"; exit 1; }
echo "summaries: $(grep -c step= "$run/events.txt") scalars, each tag once per step"
acc=$(sed -n 's/^RESULT .*test_accuracy=\([0-9.]*\).*/\1/p' "$run/worker0.log")
[ -n "$acc" ] || { echo "FAIL: no RESULT line"; exit 1; }
if python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.85 else 1)"; then
  echo "PASS: $mode test accuracy $acc >= 0.85 after $epochs epochs"
else
  echo "FAIL: $mode test accuracy $acc < 0.85 after $epochs epochs"; exit 1
fi
