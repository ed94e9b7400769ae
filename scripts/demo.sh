#!/usr/bin/env bash
# The first thing to run: starts a psd shard on a free port, runs the
# hello_push_pull example against it and stops the shard.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
run=$(mktemp -d)
trap 'kill "$psd_pid" 2>/dev/null; wait "$psd_pid" 2>/dev/null; rm -rf "$run"' EXIT
"$BUILD_DIR/server/psd" --port 0 --port_file "$run/port" --log_level warn &
psd_pid=$!
for _ in $(seq 100); do [ -s "$run/port" ] && break; sleep 0.1; done
[ -s "$run/port" ] || { echo "demo: psd did not start" >&2; exit 1; }
"$BUILD_DIR/examples/hello_push_pull" --ps_hosts "127.0.0.1:$(cat "$run/port")"
