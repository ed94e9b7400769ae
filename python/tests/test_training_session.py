"""TrainingSession with worker threads (each its own Client): sync steps
average the gradients, the job stops at train_steps, checkpoints restore."""

import time

import numpy as np
import pytest

import psclient
from conftest import run_workers


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
        shared = np.zeros(6, np.float32)
        session.add_variable(spec, shared[:4], np.empty(4, np.float32))
        with pytest.raises(ValueError, match="add_variable: values for 'b' share memory with the values of 'w'"):
            session.add_variable(psclient.TensorSpec("b", 2), shared[3:5], np.empty(2, np.float32))
        session.add_variable(psclient.TensorSpec("b", 2), shared[4:], np.empty(2, np.float32))  # adjacent: fine
        with pytest.raises(ValueError, match="mode"):
            psclient.TrainingSession(c, mode="eventually")
        with pytest.raises(TypeError, match="client must be a psclient.Client, not str"):
            psclient.TrainingSession(c.__class__.__name__)


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


def test_session_steps_carry_table_rows_sync(psd):
    # Two workers, sync: each step pulls the batch's rows with the dense
    # weights and pushes their gradients; psd averages the two workers' sums
    # per id (repeated ids within a worker summed first, as IndexedSlices).
    dense = psclient.TensorSpec("w", 2, optimizer=psclient.sgd(1.0), init=psclient.constant(0))
    table = psclient.TableSpec("emb", 3, rows=10, optimizer=psclient.RowOptimizerConfig.sgd(1.0),
                               init=psclient.constant(1.0))
    ids = {0: np.array([2, 5, 2], np.int64), 1: np.array([5, 7], np.int64)}
    seen, after = {}, {}

    def worker(client, i):
        session = psclient.TrainingSession(client, mode="sync", replicas_to_aggregate=2, total_replicas=2,
                                           train_steps=3, ready_timeout=30)
        w, gw = np.empty(2, np.float32), np.zeros(2, np.float32)
        session.add_variable(dense, w, gw)
        session.add_table(table)
        session.initialize()
        rows = np.full((len(ids[i]), 3), np.nan, np.float32)
        grads = np.full_like(rows, i + 1.0)  # worker 0 pushes 1 per id occurrence, worker 1 pushes 2
        session.set_rows("emb", ids[i], rows, grads)
        pulled = []
        while not session.should_stop:
            session.run_step(lambda: pulled.append(rows.copy()))
        seen[i] = pulled
        if session.is_chief:
            client.barrier("read", 2, timeout=30)
            after[i] = client.pull_rows("emb", np.array([2, 5, 7, 0], np.int64))  # the Client knows the table
            session.end()
        else:
            client.barrier("read", 2, timeout=30)

    run_workers(psd.address, 2, worker)
    # Per step, id 2: worker 0 sums 1 + 1, worker 1 has none: (2 + 0) / 2 = 1.
    # Id 5: (1 + 2) / 2 = 1.5. Id 7: (0 + 2) / 2 = 1. Every step reads the last one's values.
    want = {2: [1.0, 0.0, -1.0], 5: [1.0, -0.5, -2.0], 7: [1.0, 0.0, -1.0]}
    for i in (0, 1):
        assert len(seen[i]) == 3
        for step, rows in enumerate(seen[i]):
            for k, id_ in enumerate(ids[i]):
                np.testing.assert_array_equal(rows[k], np.full(3, want[int(id_)][step], np.float32))
    np.testing.assert_array_equal(after[0], np.array([[-2.0] * 3, [-3.5] * 3, [-2.0] * 3, [1.0] * 3], np.float32))


def test_session_rows_async_into_torch_tensors(psd):
    torch = pytest.importorskip("torch")
    table = psclient.TableSpec("user", 4, dynamic=True, optimizer=psclient.RowOptimizerConfig.sgd(0.5),
                               init=psclient.constant(2.0))
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as c:
        session = psclient.TrainingSession(c, mode="async", ready_timeout=30)
        session.add_table(table)
        session.initialize()
        ids = torch.tensor([10**12, 7, 10**12], dtype=torch.int64)
        rows = torch.zeros(3, 4)
        grads = torch.ones(3, 4)
        session.set_rows("user", ids, rows, grads)
        for step in range(4):
            session.pull()
            # id 10**12 twice: its gradients summed, 2 per step; id 7: 1 per step (lr 0.5).
            assert torch.equal(rows[0], torch.full((4,), 2.0 - step * 1.0))
            assert torch.equal(rows[1], torch.full((4,), 2.0 - step * 0.5))
            session.push()
        session.end()


def test_session_rows_refused_before_anything_is_bound(psd):
    table = psclient.TableSpec("emb", 4, rows=100)
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as c:
        session = psclient.TrainingSession(c, ready_timeout=30)
        ids = np.arange(5, dtype=np.int64)
        with pytest.raises(psclient.ConfigError, match="no table 'emb'"):
            session.set_rows("emb", ids, np.empty((5, 4), np.float32), np.empty((5, 4), np.float32))
        session.add_table(table)
        with pytest.raises(psclient.ConfigError, match="twice"):
            session.add_table(table)
        with pytest.raises(ValueError, match=r"rows for 'emb' has shape \(5, 3\)"):
            session.set_rows("emb", ids, np.empty((5, 3), np.float32), np.empty((5, 4), np.float32))
        with pytest.raises(ValueError, match=r"grads for 'emb' has shape \(4, 4\)"):
            session.set_rows("emb", ids, np.empty((5, 4), np.float32), np.empty((4, 4), np.float32))
        with pytest.raises(ValueError, match="float32"):
            session.set_rows("emb", ids, np.empty((5, 4), np.float64), np.empty((5, 4), np.float32))
        with pytest.raises(ValueError, match="int64"):
            session.set_rows("emb", ids.astype(np.float32), np.empty((5, 4), np.float32),
                             np.empty((5, 4), np.float32))
        both = np.zeros(40, np.float32)  # ids in its first 40 bytes; rows right after them are fine
        session.set_rows("emb", both[:10].view(np.int64), both[10:30].reshape(5, 4), np.empty((5, 4), np.float32))
        with pytest.raises(ValueError, match="share memory with the ids"):
            session.set_rows("emb", both[:10].view(np.int64), both[8:28].reshape(5, 4), np.empty((5, 4), np.float32))
        session.set_rows("emb", ids, np.empty((5, 4), np.float32), np.empty((5, 4), np.float32))
        # A pull writes the variables' values and every table's rows at once: none may share memory.
        block = np.zeros(64, np.float32)
        session.add_variable(psclient.TensorSpec("w", 8), block[:8], np.empty(8, np.float32))
        session.add_table(psclient.TableSpec("emb2", 4, rows=100))
        with pytest.raises(ValueError, match="set_rows: rows for 'emb' share memory with the values of 'w'"):
            session.set_rows("emb", ids, block[4:24].reshape(5, 4), np.empty((5, 4), np.float32))
        session.set_rows("emb", ids, block[8:28].reshape(5, 4), np.empty((5, 4), np.float32))
        with pytest.raises(ValueError, match="set_rows: rows for 'emb2' share memory with the rows of 'emb'"):
            session.set_rows("emb2", ids, block[20:40].reshape(5, 4), np.empty((5, 4), np.float32))
        with pytest.raises(ValueError, match="add_variable: values for 'b' share memory with the rows of 'emb'"):
            session.add_variable(psclient.TensorSpec("b", 4), block[26:30], np.empty(4, np.float32))
        session.set_rows("emb", ids, block[8:28].reshape(5, 4), np.empty((5, 4), np.float32))  # its own, again: fine
        session.set_rows("emb2", ids, block[28:48].reshape(5, 4), np.empty((5, 4), np.float32))
        session.initialize()
        with pytest.raises(psclient.ConfigError, match="after initialize"):
            session.add_table(psclient.TableSpec("late", 2, rows=4))
        session.end()


def test_session_tables_restore_into_two_shards(start_psd, tmp_path):
    # A checkpoint of a session with a fixed and a dynamic Adagrad table on one
    # shard, restored by a chief over two shards: the rows read back as saved,
    # and the next step (which needs the accumulators) equals that same step
    # on the original shard, bit for bit.
    ckpt = tmp_path / "ckpt"
    first = start_psd("--checkpoint_dir", str(ckpt))
    opt = psclient.RowOptimizerConfig.adagrad(0.5, initial_accumulator=0.1)
    tables = [psclient.TableSpec("fixed", 3, rows=50, optimizer=opt, init=psclient.uniform(-1, 1, seed=3)),
              psclient.TableSpec("grown", 2, dynamic=True, optimizer=opt, init=psclient.constant(0.5))]
    ids = {"fixed": np.array([4, 17, 4, 49], np.int64), "grown": np.array([10**15, 3, 77], np.int64)}
    rng = np.random.default_rng(9)
    grads = {t.name: rng.standard_normal((len(ids[t.name]), t.dim)).astype(np.float32) for t in tables}

    def bind(session):
        rows = {}
        for t in tables:
            session.add_table(t)
        for t in tables:
            rows[t.name] = np.empty((len(ids[t.name]), t.dim), np.float32)
        return rows

    with psclient.Client([first.address], worker_index=0, is_chief=True) as c:
        session = psclient.TrainingSession(c, mode="async")
        rows = bind(session)
        session.initialize()
        for t in tables:
            session.set_rows(t.name, ids[t.name], rows[t.name], grads[t.name])
        for _ in range(3):
            session.run_step(lambda: None)
        saved = session.checkpoint()
        assert saved.step == 3
        session.pull()
        before = {name: r.copy() for name, r in rows.items()}
        session.push()  # step 4 on the original shard: the reference
        session.pull()
        want = {name: r.copy() for name, r in rows.items()}

    shards = [start_psd(), start_psd()]
    with psclient.Client([s.address for s in shards], worker_index=0, is_chief=True) as c:
        session = psclient.TrainingSession(c, mode="async", restore_from=str(ckpt))
        rows = bind(session)
        session.initialize()
        for t in tables:
            session.set_rows(t.name, ids[t.name], rows[t.name], grads[t.name])
        assert session.pull() == 3
        for name in before:
            np.testing.assert_array_equal(rows[name], before[name])
        session.push()
        session.pull()
        for name in want:
            np.testing.assert_array_equal(rows[name], want[name])
        info = {t.name: t for t in c.list_tables()}
        assert info["fixed"].rows_per_shard == [25, 25] and sum(info["grown"].rows_per_shard) == 3


def test_a_second_thread_is_refused_while_one_waits_in_a_session_call(psd):
    """One thread drives a TrainingSession: while thread A waits in pull() (a sync step
    not reached yet), set_rows() or push() from another thread is refused and binds
    nothing; A's pull then writes the rows it was given."""
    import threading
    n, dim = 20000, 16
    spec = psclient.TableSpec("t", dim, rows=n, init=psclient.constant(3.0))

    def make(worker):
        c = psclient.Client([psd.address], worker_index=worker, is_chief=worker == 0, call_timeout=30)
        s = psclient.TrainingSession(c, mode="sync", replicas_to_aggregate=2, total_replicas=2)
        s.add_variable(psclient.TensorSpec("v", (4,)), np.zeros(4, np.float32), np.zeros(4, np.float32))
        s.add_table(spec)
        return c, s

    (c0, s0), (c1, s1) = make(0), make(1)
    t = threading.Thread(target=s0.initialize)
    t.start()
    s1.initialize()
    t.join()
    ids = np.arange(n, dtype=np.int64)
    rows0 = np.zeros((n, dim), np.float32)
    s0.set_rows("t", ids, rows0, np.zeros((n, dim), np.float32))
    s1.set_rows("t", ids, np.zeros((n, dim), np.float32), np.zeros((n, dim), np.float32))
    s0.pull()
    s0.push()  # worker 0 is done with step 0; its next pull waits for worker 1
    rows0[:] = 0
    got = {}
    a = threading.Thread(target=lambda: got.update(step=s0.pull()))
    a.start()
    try:
        # Until A is in its pull, add_table() (harmless: after initialize) says so by what it raises.
        deadline = time.monotonic() + 20
        while True:
            try:
                s0.add_table(psclient.TableSpec("probe", 1, rows=1))
            except psclient.ConfigError:
                pass  # A has not entered pull() yet
            except RuntimeError as e:
                assert "another thread is in TrainingSession.pull()" in str(e), e
                break
            assert time.monotonic() < deadline, "thread A never entered pull()"
            time.sleep(0.01)
        with pytest.raises(RuntimeError, match=r"TrainingSession.set_rows: another thread is in "
                                               r"TrainingSession.pull\(\); one thread drives a session"):
            s0.set_rows("t", ids, np.empty((n, dim), np.float32), np.zeros((n, dim), np.float32))
        with pytest.raises(RuntimeError, match=r"TrainingSession.push: another thread is in"):
            s0.push()
        assert a.is_alive()
    finally:
        s1.pull()
        s1.push()  # step 0 complete: A's pull returns
        a.join(30)
    assert got["step"] == 1
    assert np.all(rows0 == 3.0)  # the arrays bound before, written by the pull
    s0.push()  # and the session goes on from the same thread
    for c in (c0, c1):
        c.close()
