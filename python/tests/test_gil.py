"""Blocking calls release the GIL: other Python threads run while one waits."""

import threading
import time

import numpy as np

import psclient


def test_other_thread_runs_while_a_sync_pull_waits(psd):
    # A pull holding the GIL would stop this thread until the pull's call timeout: 8 s, so that such a
    # failure shows as a failed assertion, not a hang.
    with psclient.Client([psd.address], worker_index=0, is_chief=True, connect_timeout=2, call_timeout=8) as chief:
        chief.init_job(psclient.JobConfig(mode="sync", replicas_to_aggregate=1, total_replicas=1))
        chief.create([psclient.TensorSpec("w", 1024, optimizer=psclient.sgd(1.0))])
        chief.set_ready()
        out = np.zeros(1024, np.float32)
        done = threading.Event()
        result = {}

        def waiter():
            # Global step 1 comes only once the main thread pushes below.
            result["pull"] = chief.pull("w", out, min_step=1)
            done.set()

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.2)  # the pull is on its way and waiting on psd
        assert not done.is_set()
        counted = 0
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # pure Python: needs the GIL
            counted += 1
        assert not done.is_set()
        assert counted > 10000, f"only {counted} loop turns while the pull waited: GIL held?"
        chief.push_and_step("w", np.ones(1024, np.float32), step=0, done_step=0)
        assert done.wait(30)
        t.join()
        assert result["pull"].step >= 1
        np.testing.assert_array_equal(out, np.full(1024, -1, np.float32))
