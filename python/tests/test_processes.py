"""Several processes pushing to one psd: every gradient applied exactly once."""

import subprocess
import sys

import numpy as np

import psclient

WORKER = r"""
import sys, numpy as np, psclient
address, value, pushes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
with psclient.Client([address]) as c:
    c.declare([psclient.TensorSpec("shared", 4096, optimizer=psclient.sgd(1.0))])
    grad = np.full(4096, value, np.float32)
    for i in range(pushes):
        if i % 2:
            c.push("shared", grad)
        else:
            c.push_async({"shared": grad}).result(60)
"""


def test_values_exact_after_pushes_from_several_processes(psd, python_env):
    with psclient.Client([psd.address]) as c:
        c.create([psclient.TensorSpec("shared", 4096, optimizer=psclient.sgd(1.0))])
        workers, pushes = 4, 200
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, psd.address, str(p + 1), str(pushes)],
                                  env=python_env) for p in range(workers)]
        try:
            codes = [p.wait(120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        assert codes == [0] * workers
        # Small integers: float32 sums are exact in any order.
        expected = -float(pushes * sum(range(1, workers + 1)))
        values = c.pull("shared")
        np.testing.assert_array_equal(values, np.full(4096, expected, np.float32))
        assert c.list()[0].version == workers * pushes
