"""Real psd processes on 127.0.0.1 for the tests: a free port each (psd --port 0
--port_file), stopped by PID (SIGTERM, then SIGKILL) at the end of the test."""

import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("PS_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


def psd_bin():
    path = os.environ.get("PSD_BIN") or str(SOURCE_DIR / "build" / "server" / "psd")
    if not os.access(path, os.X_OK):
        pytest.fail(f"psd not found at {path}: build it, or set PSD_BIN (meson test sets it)")
    return path


class Psd:
    """One psd process listening on a free loopback port."""

    def __init__(self, *args):
        self.dir = tempfile.TemporaryDirectory(prefix="psd_py_")
        port_file = os.path.join(self.dir.name, "port")
        self.log_path = os.path.join(self.dir.name, "psd.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([psd_bin(), "--port", "0", "--port_file", port_file, *args],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with open(port_file) as f:
                    self.port = int(f.read())
                    break
            except (FileNotFoundError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"psd exited with {self.proc.returncode}: {self.log()}")
            time.sleep(0.02)
        else:
            self.stop()
            raise RuntimeError(f"psd did not listen within 15 s: {self.log()}")
        self.address = f"127.0.0.1:{self.port}"

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.dir.cleanup()


@pytest.fixture
def start_psd():
    """start_psd(*psd_flags) -> Psd; every psd started is stopped at the end."""
    started = []

    def start(*args):
        p = Psd(*args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


@pytest.fixture
def psd(start_psd):
    return start_psd()


@pytest.fixture
def python_env():
    """Environment for child Python processes: this interpreter's psclient."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def run_workers(address, workers, body):
    """Runs body(client, i) in `workers` threads, each with its own Client (worker i; 0 the chief);
    raises the first error any of them raised."""
    import psclient  # here: conftest itself loads before the module is known to be there
    errors = []

    def run(i):
        try:
            with psclient.Client([address], worker_index=i, is_chief=(i == 0)) as client:
                body(client, i)
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a worker did not finish"
    if errors:
        raise errors[0]


def run_example_workers(example, ps_address, env, log_dir, flags, workers=3, port_base=22330, timeout=280):
    """Starts `workers` processes of an example trainer against psd (the chief last, so the others
    already wait for it), waits for them, asserts every one exited 0; returns the chief's log."""
    worker_hosts = ",".join(f"127.0.0.1:{port_base + i}" for i in range(workers))  # nominal: workers do not listen
    procs, logs = [], []
    for i in reversed(range(workers)):
        log = open(log_dir / f"worker{i}.log", "w")
        args = [sys.executable, str(example), "--ps_hosts", ps_address, "--worker_hosts", worker_hosts,
                "--job_name", "worker", "--task_index", str(i), "--log_every", "0", *flags]
        procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
        logs.append(log)
    try:
        codes = [p.wait(timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    chief = (log_dir / "worker0.log").read_text()
    assert codes == [0] * workers, chief + "".join((log_dir / f"worker{i}.log").read_text() for i in range(1, workers))
    return chief


def pytest_sessionfinish(session, exitstatus):
    """With PS_SKIP_AS_77 set, a run whose tests all skipped exits 77: meson test reports SKIP, not OK."""
    if not os.environ.get("PS_SKIP_AS_77") or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and reporter.stats.get("skipped") and not reporter.stats.get("passed"):
        session.exitstatus = 77
