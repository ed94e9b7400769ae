"""No wait longer than a few seconds is silent, from Python too: a Client call
that blocks (barrier, pull with min_step, wait_ready, checkpoint at a step)
says every 5 s (psclient's log: spdlog, on stdout as psd's and the trainers') what it waits for and how long it will wait at most,
as TrainingSession's calls do (test/silent_waits_test.sh for the trainers).
psd's own log names the pulls it holds (sync, for a step no gradient has
started; bounded staleness, for the slowest worker) and, once the job is
finished, the workers it waits for to exit."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

import psclient

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
    # The second report, 10 s in (11 where a loaded machine starts the watcher a second late).
    assert re.search(r"worker 0: pull \(waits for min_step\): waiting 1[01] s of 12 s",
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


def test_an_end_barrier_does_not_wait_for_a_worker_that_died(start_psd, python_env):
    """Workers 0 and 1 meet at a barrier of 3 that skips lost workers; worker 2's
    process is killed (SIGKILL) once it has said hello: the barrier ends then with
    2 callers, not at its 30 s timeout. A plain barrier still waits for it."""
    import signal
    psd = start_psd()
    dead = subprocess.Popen([sys.executable, "-c", """
import sys, time, psclient
c = psclient.Client([sys.argv[1]], worker_index=2)
print("connected", flush=True)
time.sleep(60)
""", psd.address], env=python_env, stdout=subprocess.PIPE, text=True)
    try:
        assert dead.stdout.readline().strip() == "connected"
        code = """
import sys, threading, time, psclient
c0 = psclient.Client([sys.argv[1]], worker_index=0, is_chief=True)
c0.init_job(psclient.JobConfig(total_replicas=3))
c0.set_ready()
c1 = psclient.Client([sys.argv[1]], worker_index=1)
try:
    c0.barrier("plain", 3, timeout=1)  # without skipping: worker 2 is waited for
except psclient.Error as e:
    print("plain:", e)
print("ready", flush=True)
sys.stdin.readline()  # worker 2 is being killed
came = {}
t = threading.Thread(target=lambda: came.update(w1=c1.barrier("end", 3, timeout=30, skip_lost_workers=True)))
start = time.monotonic()
t.start()
came["w0"] = c0.barrier("end", 3, timeout=30, skip_lost_workers=True)
t.join()
print(f"end barrier: {came['w0']} and {came['w1']} came after {time.monotonic() - start:.1f} s")
"""
        job = subprocess.Popen([sys.executable, "-c", code, psd.address], env=python_env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = ""
        for line in job.stdout:
            out += line
            if line.strip() == "ready":
                break
        assert "plain: barrier: barrier 'plain' timed out after 1 s waiting for 3 callers, had 1" in out, out
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
        job.stdin.write("\n")
        job.stdin.flush()
        rest, _ = job.communicate(timeout=60)
        out += rest
        m = re.search(r"end barrier: 2 and 2 came after ([0-9.]+) s", out)
        assert m, out
        assert float(m.group(1)) < 10, out
    finally:
        if dead.poll() is None:
            dead.kill()
            dead.wait()


SYNC_JOB = ('c.init_job(psclient.JobConfig(mode="sync", replicas_to_aggregate=2, total_replicas=2)); '
            'c.create([psclient.TensorSpec("w", [2])]); c.set_ready(); ')


def interrupted_after(address, python_env, who, setup, call, sigint_at, timeout=60):
    """Runs `setup` then `call` in a child Python with Client c (`who`), sends it
    SIGINT `sigint_at` s into `call`; returns (seconds to KeyboardInterrupt, output)."""
    code = f"""
import os, signal, sys, threading, time, numpy as np, psclient
c = psclient.Client([sys.argv[1]], {who})
{setup}
threading.Timer({sigint_at}, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    {call}
    print("returned")
except KeyboardInterrupt:
    print(f"interrupted after {{time.monotonic() - start:.1f}} s")
"""
    out = subprocess.run([sys.executable, "-c", code, address], env=python_env,
                         capture_output=True, text=True, timeout=timeout)
    m = re.search(r"interrupted after ([0-9.]+) s", out.stdout)
    assert m, out.stdout + out.stderr
    return float(m.group(1)), out.stdout + out.stderr


@pytest.mark.parametrize("who,call", [
    ("worker_index=0, is_chief=True", 'c.barrier("py/never", 2, timeout=30)'),
    ("worker_index=1", "c.wait_ready(30)"),
    # A sync pull for a step that worker 1 never pushes to: a blocking pull.
    ("worker_index=0, is_chief=True, call_timeout=30", SYNC_JOB + 'c.pull("w", min_step=1)'),
    # The same wait inside a TrainingSession step.
    ("worker_index=0, is_chief=True, call_timeout=30",
     'v, g = np.zeros(2, np.float32), np.zeros(2, np.float32); '
     's = psclient.TrainingSession(c, mode="sync", replicas_to_aggregate=2, total_replicas=2); '
     's.add_variable(psclient.TensorSpec("w", [2]), v, g); s.initialize(); '
     's.pull(); s.push(); s.pull()'),
    # close() waits for async calls under way: the same pull, async.
    ("worker_index=0, is_chief=True, call_timeout=30", SYNC_JOB + 'f = c.pull_async("w", min_step=1); c.close()'),
    # The same, the Client dropped instead of closed: its destructor waits, and Ctrl-C ends
    # that wait too (KeyboardInterrupt at the next line, as nothing may be raised in it).
    ("worker_index=0, is_chief=True, call_timeout=30", SYNC_JOB + 'f = c.pull_async("w", min_step=1); del c'),
], ids=["barrier", "wait_ready", "sync_pull", "session_pull", "close_with_an_async_call",
        "drop_with_an_async_call"])
def test_ctrl_c_ends_a_long_wait(start_psd, python_env, who, call):
    # SIGINT one second into a 30 s wait: KeyboardInterrupt within a few
    # seconds, not when the wait ends.
    psd = start_psd()
    took, out = interrupted_after(psd.address, python_env, who, "", call, 1.0)
    assert 0.9 <= took < 5, out


def test_ctrl_c_ends_the_wait_for_a_ps_that_is_not_there_yet(python_env):
    # Client() retries its connection up to connect_timeout (a cluster starting):
    # Ctrl-C ends that wait too, not only the calls after it.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once bound: nothing listens there
    code = f"""
import os, signal, threading, time, psclient
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    psclient.Client(["127.0.0.1:{port}"], connect_timeout=30)
    print("connected")
except KeyboardInterrupt:
    print(f"interrupted after {{time.monotonic() - start:.1f}} s")
"""
    out = subprocess.run([sys.executable, "-c", code], env=python_env, capture_output=True, text=True, timeout=60)
    m = re.search(r"interrupted after ([0-9.]+) s", out.stdout)
    assert m, out.stdout + out.stderr
    assert 0.9 <= float(m.group(1)) < 5, out.stdout + out.stderr


def test_closing_a_client_says_what_it_waits_for(start_psd, python_env):
    # close() with an async call under way waits for it: said every 5 s.
    psd = start_psd()
    took, out = interrupted_after(psd.address, python_env, "worker_index=0, is_chief=True, call_timeout=30",
                                  "", SYNC_JOB + 'f = c.pull_async("w", min_step=1); c.close()', 6.5)
    assert 6.4 <= took < 10, out
    assert re.search(r"closing the Client: waiting for 1 async call\(s\) to finish \(5 s; each ends by its "
                     r"call_timeout; Ctrl-C stops waiting\)", out), out


def test_ctrl_c_ends_the_wait_for_the_chief_of_a_restored_job(start_psd, python_env, tmp_path):
    # A worker that finds a job restored at its stop step waits for this
    # run's chief, which may go on with it: said, and ended by Ctrl-C (the
    # first version of that wait heard no Ctrl-C until ready_timeout).
    first = start_psd("--checkpoint_dir", str(tmp_path))
    with psclient.Client(first.address, worker_index=0, is_chief=True) as c:
        v, g = np.zeros(2, np.float32), np.zeros(2, np.float32)
        s = psclient.TrainingSession(c, mode="async", total_replicas=2, train_steps=2)
        s.add_variable(psclient.TensorSpec("w", [2]), v, g)
        s.initialize()
        while not s.should_stop:
            s.pull()
            s.push()
        c.checkpoint()
    first.stop()
    psd = start_psd("--checkpoint_dir", str(tmp_path))
    setup = ('s = psclient.TrainingSession(c, mode="async", total_replicas=2, train_steps=2, ready_timeout=60)\n'
             's.add_variable(psclient.TensorSpec("w", [2]), np.zeros(2, np.float32), np.zeros(2, np.float32))')
    took, out = interrupted_after(psd.address, python_env, "worker_index=1", setup, "s.initialize()", 6.0,
                                  timeout=90)
    assert 5.9 <= took < 10, out
    assert "waiting for the chief (worker 0) to go on with more steps or end it" in out


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


def wait_for_line(psd, pattern, seconds):
    """The first match of `pattern` in psd's log within `seconds`, else None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = re.search(pattern, psd.log())
        if m:
            return m
        time.sleep(0.2)
    return None


def staged(code, address, python_env):
    """A child running `code` that prints 'waiting' when its wait has begun and
    reads a line from stdin before it ends it."""
    child = subprocess.Popen([sys.executable, "-c", code, address], env=python_env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    line = child.stdout.readline().strip()
    if line != "waiting":
        child.kill()
        pytest.fail(f"the child did not start its wait: {line}{child.communicate()[0]}")
    return child


def two_workers(job):
    """Python that starts a job of two workers on the psd at sys.argv[1]
    (JobConfig(job)): w0, the chief, creates tensor "w" of 2 floats, w1
    declares it; g is a gradient of zeros."""
    return f"""
import sys, numpy as np, psclient
w0 = psclient.Client([sys.argv[1]], worker_index=0, is_chief=True, call_timeout=30)
w0.init_job(psclient.JobConfig({job}))
w0.create([psclient.TensorSpec("w", [2])])
w0.set_ready()
w1 = psclient.Client([sys.argv[1]], worker_index=1, call_timeout=30)
w1.declare([psclient.TensorSpec("w", [2])])
g = np.zeros(2, dtype=np.float32)
"""


def go_on(child):
    child.stdin.write("\n")
    child.stdin.flush()
    return child.communicate(timeout=20)[0]


def test_a_bounded_staleness_pull_names_the_slowest_worker(start_psd, python_env, tmp_path):
    # Worker 0 at step 7 pulls; worker 1, the slowest, is at step 2; max_staleness 2.
    http_file = tmp_path / "http"
    psd = start_psd("--http_port", "any", "--http_port_file", str(http_file))
    code = two_workers('mode="bounded_staleness", total_replicas=2, max_staleness=2') + """
w1.push("w", g, step=2)
w0.push("w", g, step=7)
pulled = w0.pull_async("w", min_step=7)
print("waiting", flush=True)
sys.stdin.readline()
w1.push("w", g, step=5)
pulled.result(timeout=10)
print("released", flush=True)
"""
    child = staged(code, psd.address, python_env)
    try:
        want = (r"bounded staleness: pulls of workers 0 \(for step 7, \d+ s\) wait for the slowest, "
                r"workers 1 \(at step 2\): max_staleness is 2")
        m = wait_for_line(psd, want, 12)
        assert m, psd.log()
        line = psd.log()[m.start():].splitlines()[0]
        assert "the first goes on when the slowest reach step 5 or disconnect" in line, line
        status = json.load(urllib.request.urlopen(
            f"http://127.0.0.1:{http_file.read_text().strip()}/status.json", timeout=5))
        assert any(re.search(want, w) for w in status["waits"]), status["waits"]
    finally:
        out = go_on(child)
    assert "released" in out, out


def test_a_sync_pull_names_the_workers_its_step_waits_for_before_any_gradient(start_psd, python_env):
    # A sync job of 2 workers at step 0, no gradient yet; worker 0's pull waits for step 1.
    psd = start_psd()
    code = two_workers('mode="sync", replicas_to_aggregate=2, total_replicas=2') + """
pulled = w0.pull_async("w", min_step=1)
print("waiting", flush=True)
sys.stdin.readline()
w0.push("w", g, step=0)
w1.push("w", g, step=0)
pulled.result(timeout=10)
print("released", flush=True)
"""
    child = staged(code, psd.address, python_env)
    try:
        want = (r"sync pulls of workers 0 \(for step 1, \d+ s\) wait for step 0, which has no gradient yet: "
                r"workers 0 \(connected, not there yet\), 1 \(connected, not there yet\) have not pushed for it")
        assert wait_for_line(psd, want, 12), psd.log()
    finally:
        out = go_on(child)
    assert "released" in out, out


def test_psd_names_the_workers_it_waits_for_to_exit_once_the_job_is_done(start_psd, python_env):
    # The chief finishes the job and leaves; worker 1 stays connected until told.
    psd = start_psd()
    worker = staged("""
import sys, psclient
w1 = psclient.Client([sys.argv[1]], worker_index=1)
print("waiting", flush=True)
sys.stdin.readline()
w1.close()
print("closed", flush=True)
""", psd.address, python_env)
    try:
        chief = subprocess.run([sys.executable, "-c", """
import sys, psclient
c = psclient.Client([sys.argv[1]], worker_index=0, is_chief=True)
c.init_job(psclient.JobConfig(total_replicas=2))
c.finish()
""", psd.address], env=python_env, capture_output=True, text=True, timeout=30)
        assert chief.returncode == 0, chief.stdout + chief.stderr
        want = (r"job finished \d+ s ago \(at global step 0\); psd exits once workers 1 "
                r"\((127\.0\.0\.1:\d+|unix:[^)]*)\) disconnect: end them "
                r"\(--exit_when_done; with --exit_when_done false psd serves on instead\)")
        assert wait_for_line(psd, want, 12), psd.log()
        assert psd.proc.poll() is None
    finally:
        out = go_on(worker)
    assert "closed" in out, out
    assert psd.proc.wait(10) == 0, psd.log()


@contextlib.contextmanager
def stopped_psd_child(psd, code, python_env):
    """A child running `code`, which prints "stop" and reads a line when ready; psd is stopped
    (SIGSTOP) before the child is told to go on, and runs again (SIGCONT) when the block ends."""
    child = subprocess.Popen([sys.executable, "-c", code, psd.address], env=python_env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        line = child.stdout.readline()
        if line.strip() != "stop":
            child.kill()  # it waits on stdin: read what it said only once it is gone
            pytest.fail(f"the child did not get ready: {line}{child.communicate()[0]}")
        os.kill(psd.proc.pid, signal.SIGSTOP)
        child.stdin.write("\n")
        child.stdin.flush()
        yield child
    finally:
        os.kill(psd.proc.pid, signal.SIGCONT)
        if child.poll() is None:
            child.kill()
            child.wait()


def test_ctrl_c_ends_a_pull_from_a_stopped_psd(start_psd, python_env):
    # psd stopped (SIGSTOP) under a connected client: SIGINT 0.3 s into a pull
    # raises KeyboardInterrupt at once, not at call_timeout; the array keeps
    # what it had, and once psd runs again the next pull returns its values.
    psd = start_psd()
    code = """
import os, signal, sys, threading, time
import numpy as np, psclient
c = psclient.Client([sys.argv[1]], connect_timeout=2, call_timeout=10)
c.create([psclient.TensorSpec("w", [1000], optimizer=psclient.sgd(1.0))])
c.push("w", np.full(1000, 0.5, dtype=np.float32))
out = np.full(1000, 7.0, dtype=np.float32)
print("stop", flush=True)
sys.stdin.readline()
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    c.pull("w", out)
    print("returned", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - start:.1f} s", flush=True)
print("resume", flush=True)
sys.stdin.readline()
time.sleep(0.3)
print("untouched" if (out == 7.0).all() else "written", flush=True)
print("pulled", sorted(set(c.pull("w").tolist())), flush=True)
"""
    with stopped_psd_child(psd, code, python_env) as child:
        seen = ""
        while not re.search(r"interrupted after|returned", seen):
            line = child.stdout.readline()
            assert line, seen
            seen += line
        m = re.search(r"interrupted after ([0-9.]+) s", seen)
        assert m, seen
        assert 0.2 <= float(m.group(1)) < 2
        assert child.stdout.readline().strip() == "resume"
        os.kill(psd.proc.pid, signal.SIGCONT)
        child.stdin.write("\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=30)
        assert "untouched\npulled [-0.5]\n" in out, out


@pytest.mark.parametrize("call,context,first", [
    ("c.stats()", "stats", 5),
    ("c.step_done(1)", "stepDone", 5),
    # waitReady may rightly be held for its timeout (1 s): said after it.
    ("c.wait_ready(1)", "waitReady", 6),
    # A barrier's watcher asks psd's stats meanwhile: that probe says nothing of its own.
    ('c.barrier("b", 2, timeout=1)', "barrier", 6),
], ids=["stats", "step_done", "wait_ready", "barrier"])
def test_a_call_to_every_shard_says_it_waits_for_a_stopped_psd(start_psd, python_env, call, context, first):
    # psd stopped (SIGSTOP): calls that go to every shard said nothing until call_timeout (300 s by
    # default), where pulls and pushes said every 10 s whom they waited for.
    psd = start_psd()
    code = f"""
import sys, psclient
c = psclient.Client([sys.argv[1]], worker_index=0, connect_timeout=2, call_timeout=7)
c.stats()
print("stop", flush=True)
sys.stdin.readline()
try:
    {call}
    print("returned")
except Exception as e:
    print("error:", e)
"""
    with stopped_psd_child(psd, code, python_env) as child:
        out, _ = child.communicate(timeout=60)
    assert re.search(rf"{context}: waiting {first} s of \d+ s \(ClientOptions::call_timeout\) for psd's answer "
                     r"from shard 0 \(127\.0\.0\.1:\d+\)", out), out
    assert re.search(r"error: .*no answer from psd within \d+ ms", out), out
    if context != "stats":
        assert "stats: waiting" not in out, out
