#!/usr/bin/env python3
"""Runs a benchmark and prints each line it writes with the CPU time (user +
system, all threads) that it and each of its child processes spent since its
previous line: on a shared machine, wall-clock rates swing with other load,
while CPU time per phase says what the work costs.

    bench/cpu_per_line.py build/bench/embedding_bench --wide_rows 0

Each line is followed by "[cpu: NAME S s, ...]" for the benchmark and every
live child (e.g. the psd it started). A child that has exited is left out.
"""
import os
import subprocess
import sys

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def children(pid):
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except FileNotFoundError:
        pass
    return out


def name(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return str(pid)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    proc = subprocess.Popen(["stdbuf", "-oL"] + sys.argv[1:], stdout=subprocess.PIPE, text=True)
    last = {}
    for line in proc.stdout:
        pids = [proc.pid] + children(proc.pid)
        parts = []
        for pid in pids:
            now = cpu_seconds(pid)
            if now is None:
                continue
            parts.append(f"{name(pid)} {now - last.get(pid, 0.0):.2f} s")
            last[pid] = now
        print(line.rstrip("\n"), f"  [cpu: {', '.join(parts)}]", flush=True)
    sys.exit(proc.wait())


if __name__ == "__main__":
    main()
