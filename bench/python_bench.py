#!/usr/bin/env python3
"""Python client benchmark: psclient beside the C++ client, mnist_trainer and a
torch.distributed.rpc parameter server (PyTorch's tutorial design), in one run.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py calls      # per-call cost
    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py exchange   # a step's exchange, vs rpc
    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py training   # samples/s, 1 ps + 3 workers (--workers)
    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py step       # one step's compute, no psd
    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py ctr        # wide & deep: torch_ctr vs ctr_trainer
    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py all

calls: one psd on 127.0.0.1 (TCP); psclient (NumPy arrays, in place) and the
C++ client (build/bench/push_pull_bench --ps_hosts, ClientOptions' defaults)
push and pull 4 KiB, 4 MiB and 64 MiB tensors on that psd, taking turns in
--blocks blocks; per size the median of the blocks' medians, and the ratios.
exchange: one trainer alone, the MLP's parameters pulled into the module and
its gradients pushed, no compute: psclient against psd, and rpc_sync against
the torch.distributed.rpc PS below, in turn.
training: examples/python/torch_mnist.py, build/examples/mnist_trainer (1 ps
+ 3 workers each, through scripts/launch_local.sh) and a torch.distributed.rpc
parameter server (a PS process holding the model; 3 trainers rpc_sync to fetch
the parameters and to send gradients), the same MLP, data, batch (100 per
worker), SGD 0.1 and global steps, taken in turn --runs times; medians, and
the workers' CPU per global step (each worker's own CPU over its loop, as it
prints it): with fewer cores than processes, that cost sets the rate.
--workers N runs 1 ps + N of each instead.
step: torch_mnist.py's forward and backward alone (its batch gather from
bytes included, no psd), written as the example writes it and in other
ways a PyTorch user might (torch.autograd.grad, torch.nn.functional calls,
TorchScript), against the same arithmetic with no autograd (the gradients
by hand), in turn for --rounds rounds of --step_reps steps; beside them
mnist_trainer's Eigen engine on the same step (build/bench/mlp_bench --cpu,
before and after). malloc is tuned as psclient.Client tunes it.
ctr: examples/python/torch_ctr.py and build/examples/ctr_trainer, 1 ps + 3
workers each through launch_local.sh, async and sync, on --ctr_examples
generated examples (batch 512 per worker, one epoch), in turn --runs times;
examples/s and held-out AUC, medians, beside the planted model's AUC.
Every PyTorch process runs with torch.set_num_threads(--threads). Prints the
load (uptime) before and after, and the BLAS that PyTorch's matrix products
run on (Debian's python3-torch uses whatever libblas.so.3 is: the reference
BLAS unless OpenBLAS is installed; see docs/python.md).
"""

import argparse
import ctypes
import math
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
SIZES = {"4K": 4 << 10, "4M": 4 << 20, "64M": 64 << 20}


def uptime():
    with open("/proc/loadavg") as f:
        return "load average " + " ".join(f.read().split()[:3])


def torch_blas(threads):
    """The shared library PyTorch's matrix products call, and their cost on this MLP."""
    import torch
    torch.set_num_threads(threads)
    a, b = torch.rand(100, 784), torch.rand(784, 100)
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    ms = (time.perf_counter() - t0) / 20 * 1e3
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "blas" in os.path.basename(path) or "mkl" in os.path.basename(path):
                libs.add(os.path.realpath(path))
    forced = os.environ.get("OPENBLAS_CORETYPE")
    how = f"as OPENBLAS_CORETYPE={forced} in the environment asks" if forced else "its choice for this CPU"
    described = []
    for lib in sorted(libs):
        try:  # OpenBLAS names the kernels it runs: its choice for this CPU, or OPENBLAS_CORETYPE's
            corename = ctypes.CDLL(lib).openblas_get_corename
            corename.restype = ctypes.c_char_p
            described.append(f"{lib} ({corename().decode()} kernels, {how})")
        except (OSError, AttributeError):
            described.append(lib)
    return ", ".join(described) or "none found", ms


def bench_step(args):
    """One training step's compute in PyTorch, several ways, and Eigen's (mlp_bench --cpu)."""
    import torch
    sys.path.insert(0, str(TOP / "examples" / "python"))
    import torch_mnist
    # As psclient.Client does (common/malloc_tuning.cc): large freed blocks kept for reuse.
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 512 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 1 << 30)    # M_TRIM_THRESHOLD
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    F = torch.nn.functional
    images = torch.randint(0, 256, (55000, 784), dtype=torch.uint8)
    labels = torch.randint(0, 10, (55000,))

    def batch():
        idx = torch.randint(0, 55000, (100,))
        return torch_mnist.to_inputs(torch.index_select(images, 0, idx), "cpu"), torch.index_select(labels, 0, idx)

    def with_grads(model):
        params = list(model.parameters())
        for p in params:
            p.grad = torch.zeros_like(p)
        return params, [p.grad for p in params]

    model = torch_mnist.Mlp()
    params, grads = with_grads(model)
    w1, b1, w2, b2 = params

    def example():  # as examples/python/torch_mnist.py writes it
        x, y = batch()
        loss = F.cross_entropy(model(x), y)
        model.zero_grad(set_to_none=False)
        loss.backward()

    def autograd_grad():
        x, y = batch()
        loss = F.cross_entropy(model(x), y)
        with torch.no_grad():
            for g, new in zip(grads, torch.autograd.grad(loss, params)):
                g.copy_(new)

    def functional():
        x, y = batch()
        loss = F.cross_entropy(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), y)
        model.zero_grad(set_to_none=False)
        loss.backward()

    scripted, traced = torch.jit.script(torch_mnist.Mlp()), torch.jit.trace(torch_mnist.Mlp(), torch.rand(100, 784))
    with_grads(scripted)
    with_grads(traced)

    def jit(module):
        def step():
            x, y = batch()
            loss = F.cross_entropy(module(x), y)
            for p in module.parameters():
                p.grad.zero_()
            loss.backward()
        return step

    rows = torch.arange(100)

    def by_hand():  # the same arithmetic, no autograd: softmax - one-hot, then three products
        x, y = batch()
        with torch.no_grad():
            h = torch.addmm(b1, x, w1.t()).relu_()
            p = torch.softmax(torch.addmm(b2, h, w2.t()), 1)
            p[rows, y] -= 1
            p *= 1.0 / len(y)
            torch.mm(p.t(), h, out=grads[2])
            torch.sum(p, 0, out=grads[3])
            dh = torch.mm(p, w2).mul_(h > 0)
            torch.mm(dh.t(), x, out=grads[0])
            torch.sum(dh, 0, out=grads[1])

    variants = [("torch_mnist.py's step (modules, loss.backward())", example),
                ("torch.autograd.grad", autograd_grad), ("torch.nn.functional calls", functional),
                ("torch.jit.script", jit(scripted)), ("torch.jit.trace", jit(traced)),
                ("by hand, no autograd", by_hand)]

    eigen_build = []  # the ISA build mlp_bench's engine ran (kernels/cpu_isa.h)

    def eigen():
        out = subprocess.run([str(BUILD / "bench" / "mlp_bench"), "--cpu"], capture_output=True, text=True)
        m = re.search(r"compute_gradients:\s+([0-9.]+) ms/step", out.stdout)
        eigen_build[:] = re.findall(r"Eigen [0-9.]+ \(([^)]*)\)", out.stdout)[:1]
        return float(m.group(1)) if m else None

    eigen_ms = [eigen()]
    times = {name: [] for name, _ in variants}
    for _ in range(args.rounds):
        for name, fn in variants:
            for _ in range(50):
                fn()
            t0 = time.perf_counter()
            for _ in range(args.step_reps):
                fn()
            times[name].append((time.perf_counter() - t0) / args.step_reps * 1e3)
    eigen_ms.append(eigen())
    print(f"step: {uptime()}; 784-100-10, batch 100, torch threads {args.threads}, "
          f"{args.rounds} rounds of {args.step_reps} steps (medians; ms per step)")
    print(f"PyTorch's BLAS: {torch_blas(args.threads)[0]}")
    for name, v in times.items():
        print(f"  {name:50s} {statistics.median(v):.3f}  [{min(v):.3f}-{max(v):.3f}]")
    known = [e for e in eigen_ms if e is not None]
    if known:
        print(f"  {'mnist_trainer engine (mlp_bench --cpu, Eigen ' + ''.join(eigen_build) + ')':50s} "
              f"{statistics.median(known):.3f}  (before and after: {', '.join(f'{e:.3f}' for e in known)})")


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


def reps_for(nbytes, reps):
    return reps if nbytes <= (4 << 10) else max(5, reps // 4) if nbytes <= (4 << 20) else max(5, reps // 20)


def python_block(c, label, buf, reps):
    """As push_pull_bench's sample_one: push then pull, the first two of each left out."""
    pushes, pulls = [], []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        c.push("py_" + label, buf)
        t1 = time.perf_counter()
        c.pull("py_" + label, buf)
        t2 = time.perf_counter()
        if i >= 2:
            pushes.append(t1 - t0)
            pulls.append(t2 - t1)
    return statistics.median(pushes), statistics.median(pulls)


def cpp_block(address, label, reps, timeout):
    exe = BUILD / "bench" / "push_pull_bench"
    out = subprocess.run([str(exe), "--ps_hosts", address, "--sizes", label, "--reps", str(reps)],
                         capture_output=True, text=True, timeout=timeout, cwd=TOP)
    m = re.search(r"^(.+) ([0-9.]+) ([0-9.]+)$", out.stdout, re.M)
    if out.returncode != 0 or not m:
        raise SystemExit(f"{exe} --ps_hosts failed: {out.stdout.strip()} {out.stderr.strip()}")
    return float(m.group(2)) * 1e-6, float(m.group(3)) * 1e-6


def bench_calls(args):
    import psclient
    if not (BUILD / "bench" / "push_pull_bench").exists():
        raise SystemExit(f"{BUILD}/bench/push_pull_bench is missing: ninja -C {BUILD} bench/push_pull_bench")
    unknown = set(args.sizes.split(",")) - set(SIZES)
    if unknown:
        raise SystemExit(f"--sizes: {','.join(sorted(unknown))} unknown (give some of {','.join(SIZES)})")
    sizes = {label: n for label, n in SIZES.items() if label in args.sizes.split(",")}
    print(f"calls: {uptime()}", flush=True)
    proc, address = start_psd()
    py = {label: ([], []) for label in sizes}
    cpp = {label: ([], []) for label in sizes}
    try:
        with psclient.Client([address]) as c:
            path = c.connection_addresses()[0]
            buffers = {}
            for label, nbytes in sizes.items():
                c.create([psclient.TensorSpec("py_" + label, nbytes // 4, optimizer=psclient.sgd(0.0))])
                buffers[label] = np.zeros(nbytes // 4, np.float32)
                buffers[label].fill(1.0)  # touched, as the C++ side's zero-filled vector
                buffers[label].fill(0.0)
            for block in range(args.blocks):
                for label, nbytes in sizes.items():
                    reps = reps_for(nbytes, args.reps)
                    # Alternate which goes first, so neither always follows the other's traffic.
                    order = [("py", lambda: python_block(c, label, buffers[label], reps)),
                             ("cpp", lambda: cpp_block(address, label, reps, args.cpp_timeout))]
                    for side, run in order if block % 2 == 0 else order[::-1]:
                        push, pull = run()
                        target = py if side == "py" else cpp
                        target[label][0].append(push)
                        target[label][1].append(pull)
    finally:
        proc.terminate()
        proc.wait()
    print(f"one psd over {path}; psclient (Python, NumPy in place) and the C++ client "
          f"(push_pull_bench --ps_hosts) in turn, {args.blocks} blocks; medians of the blocks' medians:")
    print(f"  {'size':>4} | {'push us':>9} {'C++ us':>9} {'GB/s':>6} {'C++':>6} {'py/C++':>6} | "
          f"{'pull us':>9} {'C++ us':>9} {'GB/s':>6} {'C++':>6} {'py/C++':>6}")
    for label, nbytes in sizes.items():
        cols = []
        for k in (0, 1):
            p, q = statistics.median(py[label][k]), statistics.median(cpp[label][k])
            cols.append(f"{p * 1e6:9.1f} {q * 1e6:9.1f} {nbytes / p / 1e9:6.2f} {nbytes / q / 1e9:6.2f} {p / q:6.2f}")
        print(f"  {label:>4} | {cols[0]} | {cols[1]}")
    print("  (py/C++: time ratio; the issue asks <= 1.2 for the 4 KiB pull, <= 1.05 (in GB/s) for 4M and 64M)")
    print(f"calls: {uptime()}", flush=True)


# --- torch.distributed.rpc parameter server, as PyTorch's tutorial builds it ---

def rpc_ps_main(rank, world, port, steps, batch, lr, data_dir, threads, result_file):
    import torch
    import torch.distributed.rpc as rpc
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(threads)
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
        x = torch_mnist.to_inputs(torch.index_select(train_x, 0, idx), "cpu")  # as torch_mnist's batches
        loss = torch.nn.functional.cross_entropy(model(x), torch.index_select(train_y, 0, idx))
        model.zero_grad()
        loss.backward()
        rpc.rpc_sync("ps", ps_apply_grads, args=([p.grad for p in model.parameters()], lr))
    secs = time.monotonic() - start
    with open(result_file + f".{rank}", "w") as f:
        f.write(f"{steps * batch} {secs}\n")
    rpc.shutdown()


def rpc_exchange_main(rank, port, reps, result_file):
    """One trainer alone: rpc_sync fetch of the model's parameters and rpc_sync of its gradients, no compute."""
    import torch
    import torch.distributed.rpc as rpc
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=300)
    if rank == 0:
        rpc.init_rpc("ps", rank=0, world_size=2, rpc_backend_options=opts)
        rpc.shutdown()
        return
    rpc.init_rpc("trainer1", rank=1, world_size=2, rpc_backend_options=opts)
    sys.path.insert(0, str(TOP / "examples" / "python"))
    import torch_mnist
    model = torch_mnist.Mlp()
    grads = [torch.full_like(p, 1e-6) for p in model.parameters()]
    pulls, pushes = [], []
    for i in range(reps + 5):
        t0 = time.perf_counter()
        params = rpc.rpc_sync("ps", ps_get_params, args=())
        with torch.no_grad():
            for p, v in zip(model.parameters(), params):
                p.copy_(v)
        t1 = time.perf_counter()
        rpc.rpc_sync("ps", ps_apply_grads, args=(grads, 0.1))
        t2 = time.perf_counter()
        if i >= 5:
            pulls.append(t1 - t0)
            pushes.append(t2 - t1)
    with open(result_file, "w") as f:
        f.write(f"{statistics.median(pulls)} {statistics.median(pushes)}\n")
    rpc.shutdown()


def bench_exchange(args):
    """A step's parameter exchange alone (the model's 318 KB each way, no compute), one trainer."""
    import socket
    import torch
    import torch.multiprocessing as mp
    import psclient
    sys.path.insert(0, str(TOP / "examples" / "python"))
    import torch_mnist
    torch.set_num_threads(1)
    print(f"exchange: {uptime()}", flush=True)
    py, rpc_t = [], []
    for block in range(args.blocks):
        proc, address = start_psd()
        try:
            with psclient.Client([address]) as c:
                model = torch_mnist.Mlp()
                c.create([psclient.TensorSpec(n, tuple(p.shape), optimizer=psclient.sgd(0.1))
                          for n, p in model.named_parameters()])
                params = dict(model.named_parameters())
                grads = {n: torch.full_like(p, 1e-6) for n, p in params.items()}
                pulls, pushes = [], []
                for i in range(args.reps + 5):
                    t0 = time.perf_counter()
                    c.pull(params)
                    t1 = time.perf_counter()
                    c.push(grads)
                    t2 = time.perf_counter()
                    if i >= 5:
                        pulls.append(t1 - t0)
                        pushes.append(t2 - t1)
                py.append((statistics.median(pulls), statistics.median(pushes)))
        finally:
            proc.terminate()
            proc.wait()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        result_file = tempfile.mktemp(prefix="pybench_rpc_")
        mp.spawn(rpc_exchange_main, args=(port, args.reps, result_file), nprocs=2, join=True)
        rpc_t.append(tuple(float(x) for x in open(result_file).read().split()))
    print(f"one trainer, the 784-100-10 model's 4 tensors (318 KB) pulled into the module and pushed, "
          f"no compute; {args.blocks} blocks in turn, medians of the blocks' medians of {args.reps}:")
    for name, t in (("psclient", py), ("torch.distributed.rpc", rpc_t)):
        pull, push = statistics.median(x[0] for x in t), statistics.median(x[1] for x in t)
        print(f"  {name:>22}: pull {pull * 1e6:8.1f} us, push {push * 1e6:8.1f} us, step's exchange "
              f"{(pull + push) * 1e6:8.1f} us")
    ratio = statistics.median(sum(x) for x in rpc_t) / statistics.median(sum(x) for x in py)
    print(f"  rpc / psclient: {ratio:.2f}x the time")
    print(f"exchange: {uptime()}", flush=True)


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


def launch(name, trainer, run_dir, total_steps, threads, psd_flags, launch_flags, workers):
    """1 ps + `workers` workers through launch_local.sh; (samples/s, accuracy, the workers' 'done' lines,
    the workers' CPU per global step in ms)."""
    flags = ["--train_steps", str(total_steps), "--optimizer", "sgd", "--learning_rate", "0.1",
             "--batch_size", "100", "--log_every", "0"]
    if trainer.endswith(".py"):
        flags += ["--threads", str(threads)]
    extra = (["--psd_flags", psd_flags] if psd_flags else []) + launch_flags.split() + ["--workers", str(workers)]
    out = subprocess.run(["scripts/launch_local.sh", "--quiet", "--trainer", trainer, "--run_dir", run_dir,
                          *extra, "--", *flags], cwd=TOP, capture_output=True, text=True)
    logs = [open(os.path.join(run_dir, f"worker{w}.log")).read() for w in range(workers)
            if os.path.exists(os.path.join(run_dir, f"worker{w}.log"))]
    m = re.search(r"== \S+: test accuracy ([0-9.]+).*?([0-9.]+)\s*([kM]?) samples/s", logs[0] if logs else "", re.S)
    if out.returncode != 0 or not m:
        print(f"{name}: failed\n{out.stderr[-2000:]}\n{(logs[0] if logs else '')[-2000:]}")
        return None
    rate = float(m.group(2)) * {"": 1, "k": 1e3, "M": 1e6}[m.group(3)]
    done = [re.search(r"per step: (.*)", log).group(1) for log in logs if re.search(r"per step: (.*)", log)]
    # Each worker's CPU over its loop (its "CPU x ms" per local step), summed, per global step: what a
    # step costs the workers, which sets the rate once they and psd share too few cores.
    cpu_ms = 0.0
    for log in logs:
        d = re.search(r"done after (\d+) local steps.*CPU ([0-9.]+) ms", log)
        cpu_ms += int(d.group(1)) * float(d.group(2)) if d else math.nan
    g = re.search(r"== (\d+) global steps", logs[0])
    return rate, float(m.group(1)), done, cpu_ms / int(g.group(1)) if g else math.nan


def rpc_run(run_dir, steps_per_worker, threads, data_dir, workers):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result_file = os.path.join(run_dir, "rpc")
    os.makedirs(run_dir, exist_ok=True)
    mp.spawn(rpc_ps_main, args=(workers + 1, port, steps_per_worker, 100, 0.1, data_dir, threads, result_file),
             nprocs=workers + 1, join=True)
    samples, secs = 0, 0.0
    for r in range(1, workers + 1):
        n, t = open(result_file + f".{r}").read().split()
        samples, secs = samples + int(n), max(secs, float(t))
    return samples / secs  # all trainers' samples over the slowest one's time, as the chief's line counts


def bench_training(args):
    data_dir = str(TOP / "data" / "fashion-mnist")
    if not os.path.exists(os.path.join(data_dir, "train-images-idx3-ubyte.gz")) and \
            not os.path.exists(os.path.join(data_dir, "train-images-idx3-ubyte")):
        subprocess.run(["scripts/get_data.sh", data_dir], cwd=TOP, check=True, stdout=subprocess.DEVNULL)
    # Global steps: --epochs of the 55,000 training examples at 100 per step, shared by the workers.
    n = args.workers
    total = args.steps * n if args.steps else math.ceil(args.epochs * 55000 / 100)
    per_worker = math.ceil(total / n)
    blas, ms = torch_blas(args.threads)
    print(f"training: {uptime()}; 1 ps + {n} worker{'s' if n > 1 else ''} on {os.cpu_count()} cores, "
          f"batch 100 per worker, SGD 0.1, {total} global steps "
          f"({total * 100 / 55000:.2f} epochs), torch threads {args.threads}\n"
          f"PyTorch's BLAS: {blas} (a 100x784 by 784x100 product: {ms:.2f} ms)", flush=True)
    run = tempfile.mkdtemp(prefix="pybench_run_")
    names = ["psclient torch_mnist.py", "C++ mnist_trainer", "torch.distributed.rpc PS"]
    names = [n for n, key in zip(names, ("psclient", "cpp", "rpc")) if key in args.trainers.split(",")]
    results = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for r in range(args.runs):
        for name in names:
            run_dir = os.path.join(run, f"{name.split()[0]}.{r}")
            if name.startswith("psclient"):
                got = launch(name, "examples/python/torch_mnist.py", run_dir, total, args.threads, args.psd_flags,
                             args.launch_flags, n)
            elif name.startswith("C++"):
                exe = BUILD / "examples" / "mnist_trainer"
                got = launch(name, str(exe), run_dir, total, args.threads, args.psd_flags, args.launch_flags,
                             n) if exe.exists() else None
            else:
                got = (rpc_run(run_dir, per_worker, args.threads, data_dir, n), None, [], math.nan)
            if got is None:
                continue
            results[name].append(got[0])
            if not math.isnan(got[3]):
                cpu[name].append(got[3])
            acc = f", test accuracy {got[1]:.4f}" if got[1] is not None else ""
            step_cpu = f", workers' CPU {got[3]:.3f} ms per global step" if not math.isnan(got[3]) else ""
            print(f"run {r + 1}: {name}: {got[0]:.0f} samples/s{acc}{step_cpu}", flush=True)
            for line in got[2]:
                print(f"         per step: {line}")
    print("\nmedians over the runs:")
    med = {n: statistics.median(v) for n, v in results.items() if v}
    for name, v in med.items():
        step_cpu = f"; workers' CPU {statistics.median(cpu[name]):.3f} ms per global step" if cpu[name] else ""
        print(f"  {name}: {v:.0f} samples/s ({', '.join(f'{x:.0f}' for x in results[name])}){step_cpu}")
    py = med.get("psclient torch_mnist.py")
    if py and "torch.distributed.rpc PS" in med:
        print(f"  psclient / torch.distributed.rpc: {py / med['torch.distributed.rpc PS']:.2f}x (the issue asks >= 2.5x)")
    if py and "C++ mnist_trainer" in med:
        print(f"  psclient / mnist_trainer: {py / med['C++ mnist_trainer']:.2f}x (the issue asks >= 0.8x)")
    print(f"training: {uptime()}", flush=True)


def bench_ctr(args):
    blas, ms = torch_blas(args.threads)
    print(f"ctr: {uptime()}; 1 ps + 3 workers, {args.ctr_examples} generated examples (30,000 distinct values at "
          f"most per field), batch 512 per worker, one epoch\nPyTorch's BLAS: {blas}", flush=True)
    run = tempfile.mkdtemp(prefix="pybench_ctr_")
    trainers = {"torch_ctr.py": "examples/python/torch_ctr.py", "ctr_trainer": str(BUILD / "examples" / "ctr_trainer")}
    rates = {(t, m): [] for t in trainers for m in ("async", "sync")}
    aucs = {key: [] for key in rates}
    planted = None
    for r in range(args.runs):
        for mode in ("async", "sync"):
            for name, trainer in trainers.items():
                run_dir = os.path.join(run, f"{name}.{mode}.{r}")
                flags = ["--quiet", "--trainer", trainer, "--run_dir", run_dir] + (["--sync"] if mode == "sync" else [])
                out = subprocess.run(["scripts/launch_local.sh", *flags, "--", "--synthetic", str(args.ctr_examples),
                                      "--synthetic_max_distinct", "30000", "--batch_size", "512", "--log_every", "0"],
                                     cwd=TOP, capture_output=True, text=True)
                log = open(os.path.join(run_dir, "worker0.log")).read() if os.path.exists(
                    os.path.join(run_dir, "worker0.log")) else ""
                m = re.search(r"^RESULT .*holdout_auc=([0-9.]+) .*planted_auc=([0-9.]+) .*examples_per_sec=([0-9]+)",
                              log, re.M)
                if out.returncode != 0 or not m:
                    print(f"{name} {mode}: failed\n{out.stderr[-2000:]}\n{log[-2000:]}")
                    continue
                aucs[(name, mode)].append(float(m.group(1)))
                planted = float(m.group(2))
                rates[(name, mode)].append(float(m.group(3)))
                print(f"run {r + 1}: {name} {mode}: {float(m.group(3)):.0f} examples/s, held-out AUC {m.group(1)}",
                      flush=True)
    print(f"\nmedians over the runs (the planted model's AUC: {planted}):")
    for mode in ("async", "sync"):
        med = {t: statistics.median(rates[(t, mode)]) for t in trainers if rates[(t, mode)]}
        for t in med:
            print(f"  {mode} {t}: {med[t]:.0f} examples/s ({', '.join(f'{x:.0f}' for x in rates[(t, mode)])}), "
                  f"AUC {statistics.median(aucs[(t, mode)]):.4f}")
        if len(med) == 2:
            print(f"  {mode} torch_ctr.py / ctr_trainer: {med['torch_ctr.py'] / med['ctr_trainer']:.2f}x")
    print(f"ctr: {uptime()}", flush=True)


def main():
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["calls", "exchange", "training", "step", "ctr", "all"])
    p.add_argument("--reps", type=int, default=200,
                   help="calls: repetitions per block for 4 KiB (4 MiB: a quarter, 64 MiB: a twentieth)")
    p.add_argument("--blocks", type=int, default=5, help="calls: blocks, each side in turn")
    p.add_argument("--sizes", default=",".join(SIZES), help=f"calls: which of {','.join(SIZES)}")
    p.add_argument("--cpp_timeout", type=float, default=300, help="calls: seconds allowed to one push_pull_bench block")
    p.add_argument("--runs", type=int, default=3, help="training, ctr: runs of each trainer, in turn")
    p.add_argument("--ctr_examples", type=int, default=500000, help="ctr: generated examples per run")
    p.add_argument("--epochs", type=float, default=5, help="training: epochs (global steps of 100 examples)")
    p.add_argument("--steps", type=int, default=0, help="training: steps per worker instead of --epochs")
    p.add_argument("--psd_flags", default="", help="training: more flags for psd (psclient and mnist_trainer), "
                   "e.g. \"--threads 0\"")
    p.add_argument("--launch_flags", default="", help="training: more flags for scripts/launch_local.sh "
                   "(psclient and mnist_trainer), e.g. --unix")
    p.add_argument("--workers", type=int, default=3, help="training: workers per job (1 ps + this many)")
    p.add_argument("--trainers", default="psclient,cpp,rpc", help="training: which to run (psclient, cpp, rpc)")
    p.add_argument("--threads", type=int, default=1, help="training, step: torch.set_num_threads in every PyTorch process")
    p.add_argument("--rounds", type=int, default=6, help="step: rounds, each running every variant in turn")
    p.add_argument("--step_reps", type=int, default=1500, help="step: steps per variant per round")
    args = p.parse_args()
    if args.what in ("calls", "all"):
        bench_calls(args)
    if args.what in ("exchange", "all"):
        bench_exchange(args)
    if args.what in ("training", "all"):
        bench_training(args)
    if args.what in ("step", "all"):
        bench_step(args)
    if args.what in ("ctr", "all"):
        bench_ctr(args)


if __name__ == "__main__":
    main()
