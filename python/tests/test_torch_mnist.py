"""examples/python/torch_mnist.py: 1 ps + 3 workers reach >= 0.85 test accuracy
on Fashion-MNIST in 5 epochs, async and sync, on the CPU and on a GPU. SKIP
without PyTorch or the data, and the GPU cases without a CUDA device."""

import gzip
import os
import re
import socket
import struct
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR, run_example_workers

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
    # Adam (the default optimizer), 1e-3 in sync mode (x sqrt(3) for the 3 replicas averaged); async with
    # constant 1e-3 or 2e-3 ends anywhere in 0.82-0.86 (the last updates' noise), so it decays here.
    flags = ["--epochs", "5", "--data_dir", data, "--device", device]
    flags += ["--sync_replicas"] if mode == "sync" else ["--learning_rate", "0.002", "--lr_decay", "0.7"]
    chief = run_example_workers(EXAMPLE, psd.address, python_env, tmp_path, flags)
    found = re.search(rf"== {mode}: test accuracy ([0-9.]+)", chief)
    assert found, chief
    print(chief[chief.find("=="):])
    assert float(found.group(1)) >= 0.85, chief


def tiny_mnist(d, train=600, test=100):
    """A small valid data set in the MNIST format, as test/tiny_mnist.py writes it."""
    d.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        (d / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 0x803, n, 28, 28) + (bytes(range(256)) * (n * 784 // 256 + 1))[: n * 784])
        (d / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
    return d


def bad_data(tmp_path, case):
    d = tiny_mnist(tmp_path / case)
    images = d / "train-images-idx3-ubyte"
    if case == "empty":
        images.write_bytes(b"")
    elif case == "truncated":
        images.write_bytes(images.read_bytes()[:100000])
    elif case == "magic":
        images.write_bytes(b"\0\0\x08\x04" + images.read_bytes()[4:])
    elif case == "gzip":
        (d / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(images.read_bytes())[:1000])
        images.unlink()
    elif case == "labels":
        (d / "train-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, 600) + bytes([12] * 600))
    elif case == "missing":
        images.unlink()
    return d


@pytest.mark.parametrize("flags, want", [
    (["--batch_size", "0"], "--batch_size must be >= 1"),
    (["--learning_rate", "nan"], "--learning_rate must be > 0"),
    (["--train_steps", "-5"], "--train_steps must be >= 0"),
    (["--validation_size", "5000"], "--validation_size 5000 must be in 0..599"),
    (["data:missing"], "train-images-idx3-ubyte\\[.gz\\] not found"),
    (["data:empty"], "train-images-idx3-ubyte: truncated"),
    (["data:truncated"], "train-images-idx3-ubyte: truncated"),
    (["data:magic"], "train-images-idx3-ubyte: wrong magic number"),
    (["data:gzip"], "train-images-idx3-ubyte.gz: cannot read"),
    (["data:labels"], "train-labels-idx1-ubyte: label 12 out of range"),
])
def test_bad_input(python_env, tmp_path, flags, want):
    """Bad flags and data files: one line, exit code 2, before anything connects (no psd here)."""
    pytest.importorskip("torch")
    data = tiny_mnist(tmp_path / "ok")
    if flags[0].startswith("data:"):
        data, flags = bad_data(tmp_path, flags[0][5:]), []
    port = socket.socket()
    port.bind(("127.0.0.1", 0))  # nothing listens there
    args = [sys.executable, str(EXAMPLE), "--job_name", "worker", "--ps_hosts", f"127.0.0.1:{port.getsockname()[1]}",
            "--worker_hosts", "127.0.0.1:1",
            "--data_dir", str(data), "--validation_size", "100", "--train_steps", "2", "--connect_timeout", "1", *flags]
    r = subprocess.run(args, env=python_env, capture_output=True, text=True, timeout=60)
    port.close()
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and re.search(f"^torch_mnist: error: .*{want}", r.stderr), r.stderr


def test_ps_hosts_alone_means_one_worker(psd, python_env, tmp_path):
    """--ps_hosts without --worker_hosts: one worker, as mnist_trainer takes it."""
    pytest.importorskip("torch")
    args = [sys.executable, str(EXAMPLE), "--job_name", "worker", "--ps_hosts", psd.address,
            "--data_dir", str(tiny_mnist(tmp_path / "ok")), "--validation_size", "100", "--train_steps", "5",
            "--log_every", "0"]
    r = subprocess.run(args, env=python_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "== async: test accuracy" in r.stdout, r.stdout
