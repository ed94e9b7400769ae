#!/usr/bin/env bash
# scripts/launch_local.sh on a terminal follows the chief with a progress
# bar and ETA (docs/first-hour.md), though the chief's streams go through
# tee into its log: run in a pseudo-terminal, the bar shows there, and the
# log holds the lines without the bar; the launcher names psd's status page,
# the TensorBoard command for the chief's summaries and the cluster_status command.
#   test/progress_bar_test.sh BUILD_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$here/tiny_mnist.py" "$tmp/data" 600 100
python3 - "$tmp" "$build" <<'PY'
import os, pty, select, sys, time
tmp, build = sys.argv[1], sys.argv[2]
env = dict(os.environ, TERM="xterm", BUILD_DIR=build, DATA_DIR=f"{tmp}/data")
argv = ["scripts/launch_local.sh", "--workers", "1", "--run_dir", f"{tmp}/run", "--timeout", "100", "--",
        "--train_steps", "3000", "--validation_size", "100", "--log_every", "1000", "--eval_every", "1000000"]
pid, fd = pty.fork()
if pid == 0:
    os.execvpe(argv[0], argv, env)
out = b""
deadline = time.time() + 110
while time.time() < deadline:
    r, _, _ = select.select([fd], [], [], 1)
    if not r:
        continue
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
_, status = os.waitpid(pid, 0)
text = out.decode(errors="replace")
log = open(f"{tmp}/run/worker0.log", errors="replace").read()
fails = []
if os.waitstatus_to_exitcode(status) != 0:
    fails.append(f"launch_local exited {os.waitstatus_to_exitcode(status)}")
if "ETA" not in text or "[#" not in text:
    fails.append("no progress bar on the terminal")
if "worker 0 | epoch" not in text:
    fails.append("no progress lines on the terminal")
if "ETA" in log or "\r" in log:
    fails.append("the bar went into the log")
if "launch_local: ps0 status page: http://127.0.0.1:" not in text:
    fails.append("no status page address on the terminal")
# Where the summaries are, and the one table of every shard (docs/first-hour.md).
if f"launch_local: TensorBoard: tensorboard --logdir {tmp}/run/tb" not in text:
    fails.append("no TensorBoard command on the terminal")
elif not any(n.startswith("events.out.tfevents.") for n in os.listdir(f"{tmp}/run/tb")):
    fails.append(f"no event files in {tmp}/run/tb, where the TensorBoard command points")
if f"launch_local: every shard in one table: scripts/cluster_status.py {tmp}/run" not in text:
    fails.append("no cluster_status command on the terminal")
if "worker 0 | epoch" not in log:
    fails.append("no progress lines in the log")
if fails:
    print("FAIL: " + "; ".join(fails))
    print("--- terminal (tail) ---\n" + text[-1500:])
    sys.exit(1)
print("PASS: progress bar on the terminal, plain lines in the log")
PY
