"""Reads the chief's TensorBoard event files with TensorBoard's own reader
(EventAccumulator) and checks them against what the chief printed.

  VENV/bin/python test/tensorboard_events_check.py LOGDIR CHIEF_STDOUT TRAIN_STEPS

The chief ran with --summary_every 1 --log_every 1, so every step's `loss`
and `accuracy/train` scalar is the loss and accuracy its log line printed
(4 and 3 decimals), and each evaluation line gives accuracy/test,
cross_entropy/test and accuracy/validation at its global step. Also: every
tag the trainer documents is there, steps 1..TRAIN_STEPS each once and in
order, wall times never go back, and scripts/check_events.py's own decoder
reads the same (tag, step, value) triples. Exit 1 with every mismatch listed.
"""
import math
import os
import re
import sys

from tensorboard.backend.event_processing import event_accumulator as ea

logdir, stdout_path, train_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "scripts"))
import check_events  # noqa: E402  the project's own decoder, for the cross-check

problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


files = check_events.event_files(logdir)
check(len(files) == 1, f"expected one event file under {logdir}, found {files}")
acc = ea.EventAccumulator(files[0], size_guidance={ea.SCALARS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
per_step = {"loss", "accuracy/train", "learning_rate", "global_step/sec", "samples/sec", "stale_gradients"}
per_eval = {"accuracy/test", "cross_entropy/test", "accuracy/validation", "cross_entropy/validation"}
check(tags == per_step | per_eval, f"scalar tags {sorted(tags)}, expected {sorted(per_step | per_eval)}")
ours, file_walls = {}, []
for tag, step, wall, value in check_events.builtin_scalars(files[0]):
    ours.setdefault(tag, []).append((step, value, wall))
    file_walls.append(wall)
# Events are written as they happen: wall times never go back in the file.
check(all(b >= a for a, b in zip(file_walls, file_walls[1:])), "wall times go back in the file")

# What the chief printed: per step (loss, acc), per evaluated step the three figures.
logged, evals = {}, {}
step_line = re.compile(r"global step (\d+)/\d+ \| local step \d+ \| loss ([0-9.]+) \| acc ([0-9.]+)")
eval_line = re.compile(r"^eval .*\| global step (\d+) \| validation accuracy ([0-9.]+) \| "
                       r"test accuracy ([0-9.]+) \| test cross-entropy ([0-9.]+)")
with open(stdout_path) as f:
    for line in f:
        if m := step_line.search(line):
            logged[int(m[1])] = (float(m[2]), float(m[3]))
        if m := eval_line.search(line):
            evals[int(m[1])] = {"accuracy/validation": float(m[2]), "accuracy/test": float(m[3]),
                                "cross_entropy/test": float(m[4])}
check(sorted(logged) == list(range(1, train_steps + 1)),
      f"the chief logged steps {sorted(logged)}, expected 1..{train_steps}")
check(len(evals) >= 2, f"the chief logged {len(evals)} evaluations, expected at least 2")

for tag in sorted(tags):
    events = acc.Scalars(tag)
    steps = [e.step for e in events]
    walls = [e.wall_time for e in events]
    if tag in per_step:
        check(steps == list(range(1, train_steps + 1)), f"{tag}: steps {steps}, expected 1..{train_steps}")
    else:
        check(steps == sorted(evals), f"{tag}: steps {steps}, the chief evaluated at {sorted(evals)}")
    check(all(b >= a for a, b in zip(walls, walls[1:])), f"{tag}: wall times go back: {walls}")
    check(all(w > 1.5e9 for w in walls), f"{tag}: wall times are not seconds since 1970: {walls[:3]}")
    check(all(math.isfinite(e.value) for e in events), f"{tag}: non-finite values")
    mine = [(s, v) for s, v, _ in ours.get(tag, [])]
    check(mine == [(e.step, e.value) for e in events],
          f"{tag}: TensorBoard reads {[(e.step, e.value) for e in events][:4]}..., our decoder {mine[:4]}...")
    for e in events:
        if tag == "loss" and e.step in logged:
            check(abs(e.value - logged[e.step][0]) <= 5.1e-5,
                  f"loss at step {e.step}: event {e.value}, the chief printed {logged[e.step][0]}")
        if tag == "accuracy/train" and e.step in logged:
            check(abs(e.value - logged[e.step][1]) <= 5.1e-4,
                  f"accuracy/train at step {e.step}: event {e.value}, the chief printed {logged[e.step][1]}")
        if tag in ("accuracy/test", "cross_entropy/test", "accuracy/validation") and e.step in evals:
            check(abs(e.value - evals[e.step][tag]) <= 5.1e-5,
                  f"{tag} at step {e.step}: event {e.value}, the chief printed {evals[e.step][tag]}")
        if tag == "learning_rate":
            check(0 < e.value < 1, f"learning_rate at step {e.step}: {e.value}")
        if tag == "stale_gradients":
            check(e.value == 0, f"stale_gradients at step {e.step}: {e.value} with one worker")

for p in problems:
    print("FAIL:", p)
print(f"{len(tags)} tags, {sum(len(acc.Scalars(t)) for t in tags)} scalars read by TensorBoard "
      f"EventAccumulator; {len(problems)} problems")
sys.exit(1 if problems else 0)
