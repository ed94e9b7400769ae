"""No leak: the process's resident memory stays flat over 20,000 calls."""

import os

import numpy as np

import psclient


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_rss_flat_over_20000_pull_push_calls(psd):
    with psclient.Client([psd.address]) as c:
        c.create([psclient.TensorSpec("w", 1024, optimizer=psclient.sgd(1e-6)),
                  psclient.TensorSpec("b", 16, optimizer=psclient.sgd(1e-6))])
        w, b = np.empty(1024, np.float32), np.empty(16, np.float32)
        grads = {"w": np.ones(1024, np.float32), "b": np.ones(16, np.float32)}

        def rounds(n):
            for i in range(n):
                c.pull("w", w)
                c.push("w", grads["w"])
                c.pull({"w": w, "b": b})
                c.push(grads)
                c.pull("b")  # a new array each time
                if i % 10 == 0:
                    c.push_async(grads).result(30)
                    c.pull_async({"w": w}).result(30)

        rounds(1000)  # warm up: allocator pools, connection buffers
        before = rss_bytes()
        rounds(4000)  # 20,000 sync calls (and 800 async ones)
        growth = rss_bytes() - before
        # A leak of even 100 bytes a call would be 2 MB here.
        assert growth < 1 << 20, f"RSS grew by {growth} bytes over 20,000 calls"
        assert c.list()[0].version > 0
