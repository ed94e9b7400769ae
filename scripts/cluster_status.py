#!/usr/bin/env python3
"""Every ps shard of a job in one table: step, progress and ETA, throughput,
workers seen, and what the job waits for, read from each psd's /status.json.

  scripts/cluster_status.py runs/20261125-231500          # a launch_local.sh run directory
  scripts/cluster_status.py 127.0.0.1:40405 127.0.0.1:40406 # psd HTTP addresses (--http_port)
  scripts/cluster_status.py --watch 2 runs/20261125-231500  # again every 2 s until Ctrl-C

Exit code: 0 when every shard answered, 1 when one did not, 2 for bad arguments.
"""
import argparse
import glob
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request


def fmt_rate(v):
    """As the trainers print rates (ps::format_rate): 40.7k, 1.25M."""
    if v is None:
        return "-"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.2f}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}" if abs(v) >= 10 or v == 0 else f"{v:.1f}"


def fmt_duration(s):
    """As ps::format_duration: 42.0s, 3m05s, 1h02m03s."""
    if s is None or s < 0:
        return "?"
    if s < 60:
        return f"{s:.1f}s"
    t = int(s + 0.5)
    if t < 3600:
        return f"{t // 60}m{t % 60:02}s"
    return f"{t // 3600}h{t // 60 % 60:02}m{t % 60:02}s"


def bad_argument(message):
    print(f"cluster_status: {message}", file=sys.stderr)
    sys.exit(2)


def port_of(text):
    """A port number in 1..65535, or None."""
    return int(text) if re.fullmatch(r"[1-9]\d{0,4}", text) and int(text) <= 65535 else None


def addresses(args):
    """The HTTP addresses to ask: from a run directory's ps<i>.http files, or as given."""
    out = []
    for a in args:
        if os.path.isdir(a):
            files = sorted(glob.glob(os.path.join(a, "ps*.http")),
                           key=lambda p: int(re.sub(r"\D", "", os.path.basename(p)) or 0))
            if not files:
                bad_argument(f"{a} has no ps<i>.http files (launch_local.sh writes "
                             "them when the ps tasks serve HTTP)")
            for f in files:
                try:
                    text = open(f).read().strip()
                except OSError as e:
                    bad_argument(f"cannot read {f}: {e.strerror}")
                if port_of(text) is None:
                    bad_argument(f"{f} holds '{text[:20]}', not a port number (written by psd "
                                 "--http_port_file)")
                out.append(f"127.0.0.1:{text}")
        else:
            a = a.rstrip("/")
            a = a[len("http://"):] if a.startswith("http://") else a
            m = re.fullmatch(r"([^/:\s]+):(\d+)", a)
            if not m:
                bad_argument(f"'{a}' is neither a run directory nor host:port")
            if port_of(m.group(2)) is None:
                bad_argument(f"'{a}': the port must be a number in 1..65535")
            out.append(a)
    return out


def fetch(address, token, timeout):
    req = urllib.request.Request(f"http://{address}/status.json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def report(addrs, token, timeout):
    """Prints the table; returns the number of shards that did not answer."""
    rows, waits, jobs, failed = [], [], set(), 0
    etas = []
    for a in addrs:
        try:
            s = fetch(a, token, timeout)
        except urllib.error.HTTPError as e:
            # psd answered, and refused: say what it wants.
            why = ("psd needs a token: --token_file FILE (its --http_auth_token_file or "
                   "--auth_token_file)" if e.code == 401 else f"psd answered HTTP {e.code} {e.reason}")
            rows.append(["?", a, why])
            failed += 1
            continue
        except (OSError, ValueError, urllib.error.URLError) as e:
            reason = getattr(e, "reason", e)
            reason = getattr(reason, "strerror", None) or str(reason)
            rows.append(["?", a, f"unreachable: {reason.lower()}"])
            failed += 1
            continue
        steps = (f"{s['global_step']} of {s['train_steps']}" if s["train_steps"] > 0
                 else str(s["global_step"]))
        progress = "-" if s.get("progress") is None else f"{100 * s['progress']:.1f}%"
        if s.get("finished"):
            state = "finished"
        elif not s.get("configured"):
            state = "no job yet"
        else:
            state = "training"
        rows.append([str(s["shard"]), a, steps, progress, fmt_rate(s.get("steps_per_sec")),
                     fmt_rate(s.get("samples_per_sec")) if s.get("workers_connected") else "-",
                     f"{s.get('workers_connected', 0)} of {s.get('workers_seen', 0)}",
                     str(len(s.get("waits", []))), state])
        if s.get("configured"):
            jobs.add(s["job"])
        if s.get("eta_secs") is not None:
            etas.append(s["eta_secs"])
        waits += [f"shard {s['shard']}: {w}" for w in s.get("waits", [])]
    head = ["shard", "address", "global step", "progress", "steps/s", "samples/s", "workers",
            "waits", "state"]
    table = [head] + rows
    # An unreachable shard's message spans the columns after its address.
    widths = [max(len(r[i]) for r in table if i < len(r) and (len(r) > 3 or i < 2))
              for i in range(len(head))]
    for r in table:
        if len(r) == 3:  # unreachable
            print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}")
        else:
            print("  ".join(f"{c:<{w}}" for c, w in zip(r, widths)).rstrip())
    if jobs:
        # The ETA of the job is the slowest shard's.
        eta = f", ETA {fmt_duration(max(etas))}" if etas else ""
        if rows and all(r[-1] == "finished" for r in rows):
            eta = ", finished"
        print(f"job: {'; '.join(sorted(jobs))}{eta}")
        if len(jobs) > 1:
            print("warning: the shards disagree on the job (started by different chiefs?)")
    for w in waits:
        print(f"waiting: {w}")
    return failed


def main():
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("where", nargs="+", help="a launch_local.sh run directory, or psd HTTP host:port")
    p.add_argument("--watch", type=float, default=0, help="print again every this many seconds")
    p.add_argument("--token_file", help="psd --auth_token_file (or --http_auth_token_file)")
    p.add_argument("--timeout", type=float, default=3, help="seconds to wait for each psd")
    a = p.parse_args()
    if not (math.isfinite(a.timeout) and a.timeout > 0):
        bad_argument(f"--timeout must be a number of seconds > 0, not {a.timeout}")
    if not (math.isfinite(a.watch) and a.watch >= 0):
        bad_argument(f"--watch must be a number of seconds >= 0 (0: once), not {a.watch}")
    token = ""
    if a.token_file:
        try:
            token = open(a.token_file).read().strip()
        except OSError as e:
            bad_argument(f"--token_file {a.token_file}: {e.strerror}")
    addrs = addresses(a.where)
    while True:
        failed = report(addrs, token, a.timeout)
        if a.watch <= 0:
            return 1 if failed else 0
        sys.stdout.flush()
        time.sleep(a.watch)
        print()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
