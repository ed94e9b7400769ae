#!/usr/bin/env python3
"""Python client benchmark: psclient beside the C++ client and beside a
torch.distributed.rpc parameter server (PyTorch's tutorial design).

    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py calls      # per-call cost
    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py training   # samples/s, 1 ps + 3 workers

calls: one psd on 127.0.0.1; pulls and pushes of 4 KiB, 4 MiB and 64 MiB from
psclient (NumPy arrays, in place) and from the C++ client
(build/bench/push_pull_bench, its psd-over-TCP rows), medians of --reps.
training: the same MLP, data, batch (100 per worker), SGD 0.1 and steps with
examples/python/torch_mnist.py, a torch.distributed.rpc parameter server
(a PS process holding the model; trainers rpc_sync to fetch parameters and
to send gradients) and build/examples/mnist_trainer, one after another.
"""

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

TOP = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("BUILD_DIR", TOP / "build"))


def start_psd():
    d = tempfile.mkdtemp(prefix="pybench_")
    port_file = os.path.join(d, "port")
    proc = subprocess.Popen([str(BUILD / "server" / "psd"), "--port", "0", "--port_file", port_file],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if os.path.exists(port_file) and open(port_file).read().strip():
            return proc, "127.0.0.1:" + open(port_file).read().strip()
        time.sleep(0.02)
    proc.kill()
    raise SystemExit("psd did not start")


def bench_calls(args):
    import psclient
    sizes = {"4K": 4 << 10, "4M": 4 << 20, "64M": 64 << 20}
    proc, address = start_psd()
    rows = []
    try:
        with psclient.Client([address]) as c:
            for label, nbytes in sizes.items():
                n = nbytes // 4
                c.create([psclient.TensorSpec("t" + label, n, optimizer=psclient.sgd(0.0))])
                buf, grad = np.zeros(n, np.float32), np.zeros(n, np.float32)
                reps = args.reps if nbytes <= (4 << 20) else max(5, args.reps // 10)
                for _ in range(3):
                    c.pull("t" + label, buf)
                    c.push("t" + label, grad)
                pulls, pushes = [], []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    c.pull("t" + label, buf)
                    t1 = time.perf_counter()
                    c.push("t" + label, grad)
                    t2 = time.perf_counter()
                    pulls.append(t1 - t0)
                    pushes.append(t2 - t1)
                rows.append((label, nbytes, statistics.median(pulls), statistics.median(pushes)))
    finally:
        proc.terminate()
        proc.wait()
    print("psclient (Python, NumPy in place), one psd over loopback TCP, medians:")
    for label, nbytes, pull, push in rows:
        print(f"  {label:>4}: pull {pull * 1e6:10.1f} us {nbytes / pull / 1e9:7.2f} GB/s | "
              f"push {push * 1e6:10.1f} us {nbytes / push / 1e9:7.2f} GB/s")
    exe = BUILD / "bench" / "push_pull_bench"
    if exe.exists():
        print(f"\nC++ client ({exe} --sizes 4K,4M,64M --reps {args.reps}):", flush=True)
        subprocess.run([str(exe), "--sizes", "4K,4M,64M", "--reps", str(args.reps)], check=False,
                       timeout=args.cpp_timeout)


# --- torch.distributed.rpc parameter server, as PyTorch's tutorial builds it ---

def rpc_ps_main(rank, world, port, steps, batch, lr, data_dir, result_file):
    import torch
    import torch.distributed.rpc as rpc
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=300)
    if rank == 0:
        rpc.init_rpc("ps", rank=0, world_size=world, rpc_backend_options=opts)
        rpc.shutdown()  # waits for the trainers
        return
    rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    sys.path.insert(0, str(TOP / "examples" / "python"))
    import torch_mnist
    train_x, train_y, _, _ = torch_mnist.load_data(data_dir, 5000)
    model = torch_mnist.Mlp()
    rng = np.random.default_rng(rank)
    start = time.monotonic()
    for _ in range(steps):
        params = rpc.rpc_sync("ps", ps_get_params, args=())
        with torch.no_grad():
            for p, v in zip(model.parameters(), params):
                p.copy_(v)
        idx = torch.from_numpy(rng.integers(0, len(train_x), batch))
        loss = torch.nn.functional.cross_entropy(model(train_x[idx]), train_y[idx])
        model.zero_grad()
        loss.backward()
        rpc.rpc_sync("ps", ps_apply_grads, args=([p.grad for p in model.parameters()], lr))
    secs = time.monotonic() - start
    with open(result_file + f".{rank}", "w") as f:
        f.write(f"{steps * batch / secs}\n")
    rpc.shutdown()


_PS_MODEL = None


def _ps_model():
    global _PS_MODEL
    if _PS_MODEL is None:
        import threading
        import torch
        sys.path.insert(0, str(TOP / "examples" / "python"))
        import torch_mnist
        torch.manual_seed(1)
        _PS_MODEL = (torch_mnist.Mlp(), threading.Lock())
    return _PS_MODEL


def ps_get_params():
    model, lock = _ps_model()
    with lock:
        return [p.detach().clone() for p in model.parameters()]


def ps_apply_grads(grads, lr):
    import torch
    model, lock = _ps_model()
    with lock, torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p.add_(g, alpha=-lr)


def bench_training(args):
    import socket
    import torch.multiprocessing as mp
    data_dir = str(TOP / "data" / "fashion-mnist")
    steps_per_worker = args.steps
    results = {}

    # psclient: the example, 1 ps + 3 workers, async, SGD 0.1.
    total = steps_per_worker * 3
    run = tempfile.mkdtemp(prefix="pybench_run_")
    trainers = [("psclient torch_mnist.py", "examples/python/torch_mnist.py")]
    if (BUILD / "examples" / "mnist_trainer").exists():
        trainers.append(("C++ mnist_trainer", str(BUILD / "examples" / "mnist_trainer")))
    for name, trainer in trainers:
        out = subprocess.run(["scripts/launch_local.sh", "--quiet", "--trainer", trainer, "--run_dir",
                              os.path.join(run, name.split()[0]), "--", "--train_steps", str(total),
                              "--optimizer", "sgd", "--learning_rate", "0.1", "--batch_size", "100",
                              "--log_every", "0"], cwd=TOP, capture_output=True, text=True)
        log = open(os.path.join(run, name.split()[0], "worker0.log")).read()
        m = re.search(r"== \S+: test accuracy ([0-9.]+).*?([0-9.]+)\s*([kM]?) samples/s", log, re.S)
        if out.returncode != 0 or not m:
            print(f"{name}: failed\n{out.stderr[-2000:]}\n{log[-2000:]}")
            continue
        rate = float(m.group(2)) * {"": 1, "k": 1e3, "M": 1e6}[m.group(3)]
        results[name] = rate
        print(f"{name}: {rate:.0f} samples/s (all workers), test accuracy {m.group(1)}", flush=True)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result_file = os.path.join(run, "rpc")
    mp.spawn(rpc_ps_main, args=(4, port, steps_per_worker, 100, 0.1, data_dir, result_file), nprocs=4, join=True)
    rate = sum(float(open(result_file + f".{r}").read()) for r in (1, 2, 3))
    results["torch.distributed.rpc PS"] = rate
    print(f"torch.distributed.rpc PS: {rate:.0f} samples/s (all workers)")
    if "psclient torch_mnist.py" in results:
        py = results["psclient torch_mnist.py"]
        print(f"\npsclient / rpc: {py / rate:.2f}x", end="")
        if "C++ mnist_trainer" in results:
            print(f"; psclient / mnist_trainer: {py / results['C++ mnist_trainer']:.2f}x", end="")
        print()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["calls", "training"])
    p.add_argument("--reps", type=int, default=200, help="calls: repetitions per size (64 MiB: a tenth)")
    p.add_argument("--steps", type=int, default=300, help="training: steps per worker")
    p.add_argument("--cpp_timeout", type=float, default=600, help="calls: seconds allowed to push_pull_bench")
    args = p.parse_args()
    bench_calls(args) if args.what == "calls" else bench_training(args)


if __name__ == "__main__":
    main()
