"""TrainingSession with worker threads (each its own Client): sync steps
average the gradients, the job stops at train_steps, checkpoints restore."""

import threading

import numpy as np
import pytest

import psclient


def run_workers(address, workers, body):
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


def test_sync_session_averages_gradients_and_stops(psd):
    spec = psclient.TensorSpec("w", 8, optimizer=psclient.sgd(1.0), init=psclient.constant(10))
    finals, steps = {}, {}

    def worker(client, i):
        session = psclient.TrainingSession(client, mode="sync", replicas_to_aggregate=2, total_replicas=2,
                                           train_steps=5, ready_timeout=30)
        w, g = np.empty(8, np.float32), np.empty(8, np.float32)
        session.add_variable(spec, w, g)
        session.initialize()
        while not session.should_stop:
            # Worker i pushes i + 1: each sync step applies the average, 1.5.
            session.run_step(lambda: g.fill(i + 1))
        steps[i] = session.global_step
        client.pull("w", w, min_step=5)  # the last step's update applied
        finals[i] = w.copy()
        if session.is_chief:
            session.end()

    run_workers(psd.address, 2, worker)
    assert steps == {0: 5, 1: 5}
    for i in (0, 1):
        np.testing.assert_array_equal(finals[i], np.full(8, 10 - 5 * 1.5, np.float32))


def test_async_session_counts_every_push(psd):
    spec = psclient.TensorSpec("w", 4, optimizer=psclient.sgd(1.0))

    def worker(client, i):
        session = psclient.TrainingSession(client, mode="async", train_steps=0, ready_timeout=30)
        w, g = np.empty(4, np.float32), np.ones(4, np.float32)
        session.add_variable(spec, w, g)
        session.initialize()
        for _ in range(10):
            session.pull()
            outcome = session.push()
            assert not outcome.stale
        session.report(loss=0.5, accuracy=0.9)
        client.barrier("done", 3, timeout=30)

    run_workers(psd.address, 3, worker)
    with psclient.Client([psd.address]) as c:
        c.declare([spec])
        np.testing.assert_array_equal(c.pull("w"), np.full(4, -30, np.float32))


def test_add_variable_refuses_wrong_arrays(psd):
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as c:
        session = psclient.TrainingSession(c)
        spec = psclient.TensorSpec("w", 4)
        with pytest.raises(ValueError, match="has 3 elements"):
            session.add_variable(spec, np.empty(3, np.float32), np.empty(4, np.float32))
        with pytest.raises(ValueError, match="float32"):
            session.add_variable(spec, np.empty(4, np.float64), np.empty(4, np.float32))
        with pytest.raises(ValueError, match="mode"):
            psclient.TrainingSession(c, mode="eventually")


@pytest.mark.parametrize("timeout", [float("inf"), 1e300, -1.0, float("nan")])
def test_ready_timeout_out_of_range_refused(psd, timeout):
    # Past int64 milliseconds (or not a number): refused, never wrapped to a negative wait.
    with psclient.Client([psd.address], worker_index=1) as c:
        with pytest.raises(ValueError, match="ready_timeout must be a number of seconds"):
            psclient.TrainingSession(c, ready_timeout=timeout)


def test_checkpoint_and_restore(start_psd, tmp_path):
    ckpt = tmp_path / "ckpt"
    first = start_psd("--checkpoint_dir", str(ckpt))
    spec = psclient.TensorSpec("w", 4, optimizer=psclient.sgd(1.0))
    with psclient.Client([first.address], worker_index=0, is_chief=True) as c:
        session = psclient.TrainingSession(c, mode="async")
        w, g = np.empty(4, np.float32), np.full(4, 2, np.float32)
        session.add_variable(spec, w, g)
        session.initialize()
        for _ in range(3):
            session.run_step(lambda: None)
        saved = session.checkpoint()
        assert saved.step == 3 and len(saved.paths) == 1
    second = start_psd()
    with psclient.Client([second.address], worker_index=0, is_chief=True) as c:
        session = psclient.TrainingSession(c, mode="async", restore_from=str(ckpt))
        w, g = np.empty(4, np.float32), np.zeros(4, np.float32)
        session.add_variable(spec, w, g)
        session.initialize()
        assert session.pull() == 3
        np.testing.assert_array_equal(w, np.full(4, -6, np.float32))
