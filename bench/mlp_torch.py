#!/usr/bin/env python3
"""The steps mlp_bench times, in PyTorch, so both can be timed on one machine.

One training step = forward + softmax cross-entropy + backward + plain SGD
update, parameters and batch already on the GPU; eager and CUDA graph; FP32
and TF32. Medians of several repetitions, as mlp_bench.

    python3 bench/mlp_torch.py [--reps 7]
"""
import argparse
import statistics
import time

import torch

CASES = [((100,), 100), ((100,), 1000), ((100,), 10000),
         ((1024, 1024), 100), ((1024, 1024), 10000), ((1024, 1024), 100000)]


def make_model(hidden, inputs=784, classes=10):
    sizes = [inputs, *hidden, classes]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).cuda()


def step_flops(hidden, batch, inputs=784, classes=10):
    sizes = [inputs, *hidden, classes]
    macs = sum((2 if i == 0 else 3) * sizes[i] * sizes[i + 1] for i in range(len(sizes) - 1))
    return 2.0 * macs * batch


def time_per_call(fn, reps, target=0.05):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    iters = max(1, min(20000, int(target / max(time.perf_counter() - t0, 1e-7))))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def bench_case(hidden, batch, reps):
    torch.manual_seed(0)
    model = make_model(hidden)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.rand(batch, 784, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    eager = time_per_call(step, reps)

    # CUDA graph of the whole step (warm up on a side stream first, as the
    # PyTorch documentation asks).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graphed = time_per_call(graph.replay, reps)
    return eager, graphed


def main():
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    print(f"PyTorch {torch.__version__}, {torch.cuda.get_device_name()}")
    n = 8192
    a = torch.rand(n, n, device="cuda")
    b = torch.rand(n, n, device="cuda")
    for tf32 in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        peak = 2.0 * n ** 3 / time_per_call(lambda: a @ b, args.reps)
        print(f"\n{'TF32' if tf32 else 'FP32'}: matmul {n}^3 {peak * 1e-12:.1f} TFLOP/s")
        for hidden, batch in CASES:
            eager, graphed = bench_case(hidden, batch, args.reps)
            name = "-".join(str(s) for s in (784, *hidden, 10))
            flops = step_flops(hidden, batch)
            print(f"  {name:18s} batch {batch:6d}: eager {eager * 1e3:9.4f} ms, graph {graphed * 1e3:9.4f} ms"
                  f"  ({flops / graphed * 1e-12:7.2f} TFLOP/s, {batch / graphed:10.0f} samples/s)")

    # Parameter vector transfer, pinned host memory, as mlp_bench.
    numel = sum(p.numel() for p in make_model((1024, 1024)).parameters())
    host = torch.empty(numel, pin_memory=True)
    dev = torch.empty(numel, device="cuda")
    up = time_per_call(lambda: dev.copy_(host, non_blocking=True), args.reps, 0.1)
    down = time_per_call(lambda: host.copy_(dev, non_blocking=True), args.reps, 0.1)
    gb = numel * 4 * 1e-9
    print(f"\nparameter vector {numel} floats: upload {gb / up:.1f} GB/s, download {gb / down:.1f} GB/s")


if __name__ == "__main__":
    main()
