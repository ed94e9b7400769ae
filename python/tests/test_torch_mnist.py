"""examples/python/torch_mnist.py: 1 ps + 3 workers reach >= 0.85 test accuracy
on Fashion-MNIST in 5 epochs, async and sync, on the CPU and on a GPU. SKIP
without PyTorch or the data, and the GPU cases without a CUDA device."""

import os
import re
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR

EXAMPLE = SOURCE_DIR / "examples" / "python" / "torch_mnist.py"


def data_dir():
    for d in (os.environ.get("DATA_DIR"), SOURCE_DIR / "data" / "fashion-mnist", "/usr/share/datasets/fashion-mnist"):
        if d and (os.path.exists(os.path.join(d, "train-images-idx3-ubyte.gz")) or
                  os.path.exists(os.path.join(d, "train-images-idx3-ubyte"))):
            return str(d)
    pytest.skip("no Fashion-MNIST (scripts/get_data.sh data/fashion-mnist installs it)")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_three_workers_reach_085(psd, python_env, tmp_path, mode, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    data = data_dir()
    workers = 3
    worker_hosts = ",".join(f"127.0.0.1:{22330 + i}" for i in range(workers))  # nominal: workers do not listen
    procs, logs = [], []
    for i in reversed(range(workers)):  # the chief last: the others already wait for it
        log = open(tmp_path / f"worker{i}.log", "w")
        args = [sys.executable, str(EXAMPLE), "--ps_hosts", psd.address, "--worker_hosts", worker_hosts,
                "--job_name", "worker", "--task_index", str(i), "--epochs", "5", "--data_dir", data,
                "--log_every", "0", "--device", device]
        # Adam (the default optimizer), 1e-3 in sync mode (x sqrt(3) for the 3 replicas averaged); async with
        # constant 1e-3 or 2e-3 ends anywhere in 0.82-0.86 (the last updates' noise), so it decays here.
        args += ["--sync_replicas"] if mode == "sync" else ["--learning_rate", "0.002", "--lr_decay", "0.7"]
        procs.append(subprocess.Popen(args, env=python_env, stdout=log, stderr=subprocess.STDOUT))
        logs.append(log)
    try:
        codes = [p.wait(280) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    chief = (tmp_path / "worker0.log").read_text()
    assert codes == [0] * workers, chief + "".join((tmp_path / f"worker{i}.log").read_text() for i in (1, 2))
    found = re.search(rf"== {mode}: test accuracy ([0-9.]+)", chief)
    assert found, chief
    print(chief[chief.find("=="):])
    assert float(found.group(1)) >= 0.85, chief
