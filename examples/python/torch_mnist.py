#!/usr/bin/env python3
"""torch_mnist: the 784-100-10 Fashion-MNIST MLP in PyTorch, its parameters on psd.

Between-graph replication as examples/mnist_trainer (same flags): every step
pulls the parameters into the module's own tensors in place, runs forward and
backward in PyTorch (CUDA when there is a GPU, else CPU) and pushes the
gradients; psd applies the optimizer. The same program runs every role.

    torch_mnist.py --job_name=ps     --task_index=0 --ps_hosts=127.0.0.1:2222 --worker_hosts=...  # execs psd
    torch_mnist.py --job_name=worker --task_index=0 --ps_hosts=127.0.0.1:2222 \\
                   --worker_hosts=127.0.0.1:2230,127.0.0.1:2231 [--sync_replicas] --epochs=5
    scripts/launch_local.sh --trainer examples/python/torch_mnist.py [--sync]   # 1 ps + 3 workers

Without --ps_hosts/--worker_hosts the cluster comes from TF_CONFIG or Slurm.
Needs the psclient module (PYTHONPATH=build/python, or pip install ./python).
"""

import argparse
import gzip
import math
import os
import sys
import time
import zlib

import numpy as np
import torch

import cluster_flags  # beside this file
import psclient
import psclient.torch as pst
from cluster_flags import BadInput


def parser():
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    cluster_flags.add(p)
    p.add_argument("--epochs", type=float, default=5)
    p.add_argument("--batch_size", type=int, default=100)
    p.add_argument("--learning_rate", type=float, default=0.001)
    p.add_argument("--optimizer", default="adam", help="sgd, momentum, nesterov, adam, adagrad, rmsprop")
    p.add_argument("--lr_decay", type=float, default=1.0, help="learning rate x this per epoch (on the ps)")
    p.add_argument("--scale_lr", type=int, default=1, help="sync: learning rate x sqrt(replicas aggregated)")
    p.add_argument("--data_dir", default="data/fashion-mnist", help="the four (Fashion-)MNIST IDX files")
    p.add_argument("--validation_size", type=int, default=5000, help="training examples held out")
    p.add_argument("--device", default="auto", help="auto (CUDA when there is a GPU), cpu or cuda")
    return p


def check_flags(f):
    finite = math.isfinite
    cluster_flags.check(f, [
        (f.batch_size >= 1, "--batch_size must be >= 1"),
        (finite(f.learning_rate) and f.learning_rate > 0, "--learning_rate must be > 0"),
        (finite(f.epochs) and f.epochs >= 0, "--epochs must be a finite number >= 0"),
        (f.train_steps > 0 or f.epochs > 0, "give --train_steps or --epochs (both are 0)"),
        (f.validation_size >= 0, "--validation_size must be >= 0"),
        (0 < f.lr_decay <= 1, "--lr_decay must be in (0, 1]"),
    ])


def read_idx(path, ndim):
    """An IDX file of uint8 with `ndim` dimensions (plain or gzipped) as a NumPy array."""
    if not os.path.isfile(path) and os.path.isfile(path + ".gz"):
        path += ".gz"
    if not os.path.isfile(path):
        raise BadInput(f"{path}[.gz] not found (--data_dir; scripts/get_data.sh provides Fashion-MNIST)")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise BadInput(f"{path}: cannot read: {e}") from None
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise BadInput(f"{path}: truncated: the file ends inside the header")
    if raw[:4] != bytes([0, 0, 8, ndim]):
        raise BadInput(f"{path}: wrong magic number 0x{raw[:4].hex()} (expected 0x000008{ndim:02x}, "
                       f"uint8 with {ndim} dimension{'s' if ndim > 1 else ''})")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    if len(raw) - header < math.prod(shape):
        raise BadInput(f"{path}: truncated: the header says {'x'.join(map(str, shape))} bytes of data, "
                       f"the file has {len(raw) - header}")
    return np.frombuffer(raw, np.uint8, count=math.prod(shape), offset=header).reshape(shape)


def load_data(data_dir, validation_size):
    """Images stay bytes (a quarter of the memory, and of what a batch moves);
    to_inputs() makes a batch of them the model's float inputs."""
    def images(name):
        x = read_idx(os.path.join(data_dir, name), 3)
        if x.shape[1:] != (28, 28):
            raise BadInput(f"{os.path.join(data_dir, name)}: images of {x.shape[1]}x{x.shape[2]}, not 28x28")
        return torch.from_numpy(x.reshape(len(x), -1).copy())

    def labels(name, count):
        y = read_idx(os.path.join(data_dir, name), 1)
        if len(y) != count:
            raise BadInput(f"{os.path.join(data_dir, name)} has {len(y)} labels for {count} images")
        if len(y) and y.max() > 9:
            raise BadInput(f"{os.path.join(data_dir, name)}: label {y.max()} out of range 0..9")
        return torch.from_numpy(y.astype(np.int64))

    train_x = images("train-images-idx3-ubyte")
    train_y = labels("train-labels-idx1-ubyte", len(train_x))
    test_x = images("t10k-images-idx3-ubyte")
    test_y = labels("t10k-labels-idx1-ubyte", len(test_x))
    if len(test_x) == 0:
        raise BadInput(f"{data_dir}: the test set holds no images: there is nothing to test on")
    if validation_size >= len(train_x):
        raise BadInput(f"--validation_size {validation_size} must be in 0..{len(train_x) - 1} "
                       f"(the training set has {len(train_x)} images)")
    n = len(train_x) - validation_size
    return train_x[:n], train_y[:n], test_x, test_y


def to_inputs(images, device):
    """uint8 pixels (on the CPU) to float32 inputs in [0, 1] on `device`."""
    return images.to(device, non_blocking=True).float().mul_(1.0 / 255.0)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(784, 100)
        self.out = torch.nn.Linear(100, 10)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def evaluate(model, x, y, device):
    model.eval()  # a graphed module (CUDA) runs its own forward outside training mode: any batch size
    with torch.no_grad():
        logits = model(to_inputs(x, device))
        loss = torch.nn.functional.cross_entropy(logits, y.to(device)).item()
        return (logits.argmax(1).cpu() == y).float().mean().item(), loss


def run_worker(spec, f):
    torch.set_num_threads(f.threads)
    torch.manual_seed(f.seed)
    device = torch.device("cuda" if f.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if f.device == "auto" else f.device))
    train_x, train_y, test_x, test_y = load_data(f.data_dir, f.validation_size)
    workers, worker, chief = spec.num_workers, spec.worker_index, spec.is_chief

    replicas = (f.replicas_to_aggregate or workers) if f.sync_replicas else 1
    lr = f.learning_rate * (math.sqrt(replicas) if f.sync_replicas and f.scale_lr else 1)
    steps = f.train_steps or max(1, math.ceil(f.epochs * len(train_x) / (f.batch_size * replicas)))
    mode = "sync" if f.sync_replicas else ("bounded_staleness" if f.max_staleness > 0 else "async")

    client = psclient.Client(spec.ps_hosts, worker_index=worker, is_chief=chief, connect_timeout=f.connect_timeout)
    session = psclient.TrainingSession(client, mode=mode, replicas_to_aggregate=replicas if f.sync_replicas else 0,
                                       total_replicas=workers, max_staleness=f.max_staleness, train_steps=steps)
    optimizer = psclient.optimizer(f.optimizer, lr)
    if f.lr_decay != 1.0:  # exponential decay on psd, by the global step: x lr_decay per epoch
        optimizer.schedule = psclient.LrSchedule.EXPONENTIAL_DECAY
        optimizer.decay_rate = f.lr_decay
        optimizer.decay_steps = max(1, len(train_x) // (f.batch_size * replicas))
    model = Mlp().to(device)
    cuda = device.type == "cuda"
    # The parameters on psd (psclient.torch): on the CPU pulls land in them
    # and backward adds into the blocks push() reads; with CUDA a step moves
    # the values and the gradients with one copy each way.
    params = pst.Parameters(session, model, optimizer=optimizer, seed=f.seed)
    if cuda:
        # Forward and backward as CUDA graphs: a small batch is a few
        # launches instead of dozens (training mode, this batch size only).
        model = torch.cuda.make_graphed_callables(model, (torch.zeros(f.batch_size, 784, device=device),))
    session.initialize()
    steps = session.job.train_steps or steps
    per_global = f.batch_size * (session.job.replicas_to_aggregate if session.job.mode == psclient.SyncMode.SYNC else 1)
    if chief:
        print(f"worker {worker} (chief): 784-100-10 on {device}, {f.optimizer} lr {lr:g}, batch {f.batch_size}, "
              f"{mode}, {steps} global steps ({steps * per_global / len(train_x):.2f} epochs of {len(train_x)} "
              f"examples), {workers} workers, {spec.num_ps} ps", flush=True)
    summaries = psclient.SummaryWriter(f.logdir) if chief and f.logdir else None

    # This worker's share of the training set, reshuffled every pass.
    lo, hi = worker * len(train_x) // workers, (worker + 1) * len(train_x) // workers
    rng = np.random.default_rng(f.seed + worker)
    order, pos = rng.permutation(np.arange(lo, hi)), 0
    start = time.monotonic()
    loss = acc = 0.0
    # Where a step's time goes, as mnist_trainer reports it: the pull, forward
    # and backward (with the copies to and from the parameters), the push, the rest.
    t_pull = t_compute = t_push = t_other = 0.0
    clock = time.perf_counter
    cpu_at_start = time.process_time()  # this process's CPU, all threads: a step's cost on shared cores
    while not session.should_stop:
        t0 = clock()
        if pos + f.batch_size > len(order):
            order, pos = rng.permutation(np.arange(lo, hi)), 0
        idx = torch.from_numpy(order[pos:pos + f.batch_size])
        pos += f.batch_size
        t1 = clock()
        pst.pull(session, params)
        t2 = clock()
        if session.should_stop:
            break  # the job ended while this worker waited for its step
        x = to_inputs(torch.index_select(train_x, 0, idx), device)
        y = torch.index_select(train_y, 0, idx).to(device, non_blocking=True)
        logits = model(x)
        batch_loss = torch.nn.functional.cross_entropy(logits, y)
        pst.backward(batch_loss, params)
        params.before_push()  # what pst.push does first; here in the compute time (CUDA: waits for backward)
        t3 = clock()
        outcome = session.push()
        t4 = clock()
        t_pull, t_compute, t_push, t_other = t_pull + t2 - t1, t_compute + t3 - t2, t_push + t4 - t3, t_other + t1 - t0
        local = session.steps_run
        if f.log_every and local % f.log_every == 0:
            loss, acc = batch_loss.item(), (logits.argmax(1) == y).float().mean().item()
            rate = local * f.batch_size / (time.monotonic() - start)
            epoch = outcome.global_step * per_global / len(train_x)
            print(f"worker {worker} | local step {local} | global step {outcome.global_step} | epoch {epoch:.2f} | "
                  f"loss {loss:.4f} | batch accuracy {acc:.3f} | {rate:.0f} samples/s", flush=True)
            session.report(loss, acc, rate, lr)
            if summaries:
                summaries.add_scalar("loss", loss, outcome.global_step)
    secs = time.monotonic() - start
    n = max(1, session.steps_run)
    print(f"worker {worker}: done after {session.steps_run} local steps in {secs:.1f} s "
          f"({session.steps_run * f.batch_size / secs:.0f} samples/s on this worker, {session.stale_steps} stale); "
          f"per step: pull {1e3 * t_pull / n:.3f} ms, compute {1e3 * t_compute / n:.3f} ms, "
          f"push {1e3 * t_push / n:.3f} ms, data {1e3 * t_other / n:.3f} ms; "
          f"CPU {1e3 * (time.process_time() - cpu_at_start) / n:.3f} ms", flush=True)

    cluster_flags.end_barrier(client, "torch_mnist/end", workers, worker)  # then the chief reads the final parameters
    if chief:
        final = params.pull(client)
        accuracy, test_loss = evaluate(model, test_x, test_y, device)
        global_step = max(final.step, session.global_step)
        samples = global_step * per_global
        print(f"\n== {mode}: test accuracy {accuracy:.4f}, test cross-entropy {test_loss:.4f}")
        # This run's rate: a restored job's steps before it are not its.
        print(f"== {global_step} global steps, {samples / len(train_x):.2f} epochs in {secs:.1f} s: "
              f"{(global_step - session.start_step) * per_global / secs:.0f} samples/s", flush=True)
        if summaries:
            summaries.add_scalar("accuracy/test", accuracy, global_step)
            summaries.flush()
        session.end()  # the ps tasks exit once every worker has disconnected
    client.close()
    return 0


def main(argv):
    return cluster_flags.main("torch_mnist", parser(), check_flags, run_worker, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
