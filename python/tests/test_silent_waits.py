"""No wait longer than a few seconds is silent, from Python too: a Client call
that blocks (barrier, pull with min_step, wait_ready, checkpoint at a step)
says every 5 s (psclient's log: spdlog, on stdout as psd's and the trainers') what it waits for and how long it will wait at most,
as TrainingSession's calls do (test/silent_waits_test.sh for the trainers)."""

import re
import subprocess
import sys

import pytest

SCRIPT = """
import sys, psclient
c = psclient.Client([sys.argv[1]], {who})
try:
    {call}
except Exception as e:
    print("error:", e, file=sys.stderr)
"""


@pytest.mark.parametrize("who,call,want", [
    ("worker_index=0, is_chief=True", 'c.barrier("py/end", 2, timeout=12)',
     r"worker 0: barrier: waiting \d+ s of 12 s; psd: barrier 'py/end' waits for 2 callers"),
    ("worker_index=1", "print(c.wait_ready(7))",
     r"worker 1: wait_ready: waiting for the chief to initialise the model: waiting 5 s of 7 s"),
])
def test_a_long_call_says_what_it_waits_for_and_how_long(psd, python_env, who, call, want):
    code = SCRIPT.format(who=who, call=call)
    out = subprocess.run([sys.executable, "-c", code, psd.address], env=python_env,
                         capture_output=True, text=True, timeout=30)
    assert re.search(want, out.stdout + out.stderr), out.stdout + out.stderr


def test_a_sync_pull_says_it_waits_for_its_step(start_psd, python_env):
    psd = start_psd()
    # A sync job of 2 workers: step 1 never comes; call_timeout bounds the pull.
    # (psd names a sync step only once it has a gradient: not said here.)
    code = """
import sys, psclient
c = psclient.Client([sys.argv[1]], worker_index=0, is_chief=True, connect_timeout=2, call_timeout=12)
c.init_job(psclient.JobConfig(mode="sync", replicas_to_aggregate=2, total_replicas=2))
c.create([psclient.TensorSpec("w", [2])])
c.set_ready()
try:
    c.pull("w", min_step=1)
except Exception as e:
    print("error:", e, file=sys.stderr)
"""
    out = subprocess.run([sys.executable, "-c", code, psd.address], env=python_env,
                         capture_output=True, text=True, timeout=60)
    assert re.search(r"worker 0: pull \(waits for min_step\): waiting 10 s of 12 s",
                     out.stdout + out.stderr), out.stdout + out.stderr


def test_a_barrier_that_times_out_names_who_never_came(start_psd, python_env):
    psd = start_psd()
    code = """
import sys, psclient
c = psclient.Client([sys.argv[1]], worker_index=0, is_chief=True)
c.init_job(psclient.JobConfig(total_replicas=2))
c.set_ready()
try:
    c.barrier("py/end", 2, timeout=2)
except Exception as e:
    print("error:", e, file=sys.stderr)
"""
    out = subprocess.run([sys.executable, "-c", code, psd.address], env=python_env,
                         capture_output=True, text=True, timeout=30)
    assert re.search(r"barrier 'py/end' timed out after 2 s waiting for 2 callers, had 1 \(workers 0\); "
                     r"missing workers 1 \(never connected\)", out.stdout + out.stderr), out.stdout + out.stderr


@pytest.mark.parametrize("who,call", [
    ("worker_index=0, is_chief=True", 'c.barrier("py/never", 2, timeout=30)'),
    ("worker_index=1", "c.wait_ready(30)"),
])
def test_ctrl_c_ends_a_long_wait(start_psd, python_env, who, call):
    # SIGINT one second into a 30 s wait: KeyboardInterrupt within a few
    # seconds, not when the wait ends.
    psd = start_psd()
    code = f"""
import os, signal, sys, threading, time, psclient
c = psclient.Client([sys.argv[1]], {who})
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    {call}
    print("returned")
except KeyboardInterrupt:
    print(f"interrupted after {{time.monotonic() - start:.1f}} s")
"""
    out = subprocess.run([sys.executable, "-c", code, psd.address], env=python_env,
                         capture_output=True, text=True, timeout=60)
    m = re.search(r"interrupted after ([0-9.]+) s", out.stdout)
    assert m, out.stdout + out.stderr
    assert 0.9 <= float(m.group(1)) < 5, out.stdout


def test_a_reconnect_says_which_setting_bounds_it(start_psd, python_env):
    # psd stopped under a connected client: the next call reconnects, and its
    # lines name reconnect_timeout (they named --connect_timeout).
    psd = start_psd()
    code = """
import sys, psclient
c = psclient.Client([sys.argv[1]], reconnect_timeout=7)
c.create([psclient.TensorSpec("w", [2])])
print("stop", flush=True)
sys.stdin.readline()
try:
    c.pull("w")
except Exception as e:
    print("error:", e, file=sys.stderr)
"""
    child = subprocess.Popen([sys.executable, "-c", code, psd.address], env=python_env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert child.stdout.readline().strip() == "stop"
    psd.stop()
    child.stdin.write("\n")
    child.stdin.flush()
    out, _ = child.communicate(timeout=60)
    assert re.search(r"waiting for ps 127\.0\.0\.1:\d+ \(shard 0\): 5 s of 7 s "
                     r"\(ClientOptions::reconnect_timeout\)", out), out
