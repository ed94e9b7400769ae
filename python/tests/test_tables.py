"""Embedding tables from Python against two real psd shards: rows exact
against a NumPy reference (SGD and Adagrad), duplicated ids summed, uint64
and torch ids, async calls, and every refusal leaving psd's table unchanged."""

import asyncio
import subprocess
import sys

import numpy as np
import pytest

import psclient

ROWS, DIM = 10, 4


@pytest.fixture
def client(start_psd):
    shards = [start_psd(), start_psd()]
    with psclient.Client([s.address for s in shards]) as c:
        c.create_tables([
            psclient.TableSpec("sgd", DIM, rows=ROWS, optimizer=psclient.RowOptimizerConfig.sgd(0.5),
                               init=psclient.constant(1.0)),
            psclient.TableSpec("ada", DIM, rows=ROWS, placement="div",
                               optimizer=psclient.RowOptimizerConfig.adagrad(0.1, initial_accumulator=0.2),
                               init=psclient.constant(1.0)),
            psclient.TableSpec("dyn", DIM, dynamic=True, init=psclient.constant(3.0)),
        ])
        yield c


def whole(client, table="sgd"):
    return client.pull_rows(table, np.arange(ROWS, dtype=np.int64))


def pushes(client):
    return sum(s.pushes for s in client.stats())


def test_pull_rows_in_place_and_new_array_in_the_ids_shape(client):
    out = np.full((3, DIM), 7, np.float32)
    step = client.pull_rows("sgd", np.array([0, 9, 0]), out)
    assert isinstance(step, int)
    np.testing.assert_array_equal(out, np.ones((3, DIM), np.float32))
    rows = client.pull_rows("sgd", np.array([[1, 2, 3], [4, 5, 6]], np.int64))
    assert rows.dtype == np.float32 and rows.shape == (2, 3, DIM)
    flat_out = np.zeros((6, DIM), np.float32)  # (ids.size, dim) is accepted for any ids shape
    client.pull_rows("sgd", np.array([[1, 2, 3], [4, 5, 6]]), flat_out)
    np.testing.assert_array_equal(flat_out, np.ones((6, DIM)))
    infos = {t.name: t for t in client.list_tables()}
    assert infos["sgd"].dim == DIM and infos["sgd"].rows == ROWS and not infos["sgd"].dynamic
    assert sum(infos["sgd"].rows_per_shard) == ROWS and infos["dyn"].dynamic


def test_sgd_rows_exact_with_duplicated_ids_summed(client):
    ids = np.array([3, 1, 3, 7, 3, 8], np.int64)
    # Multiples of 1/8: float32 sums are exact in any order.
    grads = (np.arange(ids.size * DIM, dtype=np.float32).reshape(-1, DIM) - 9) / 8
    assert client.push_rows("sgd", ids, grads) == psclient.PushStatus.APPLIED
    expected = np.ones((ROWS, DIM), np.float64)
    summed = np.zeros((ROWS, DIM), np.float64)
    np.add.at(summed, ids, grads.astype(np.float64))
    expected -= 0.5 * summed
    np.testing.assert_array_equal(whole(client), expected.astype(np.float32))
    assert pushes(client) == 2  # one request per shard touched: rows 3, 1, 7 on one, 8 on the other


def test_adagrad_rows_match_a_numpy_reference(client):
    rng = np.random.default_rng(7)
    w = np.ones((ROWS, DIM), np.float32)
    acc = np.full((ROWS, DIM), 0.2, np.float32)
    w64, acc64 = w.astype(np.float64), acc.astype(np.float64)
    lr = np.float32(0.1)
    for _ in range(5):
        ids = rng.integers(0, ROWS, 12).astype(np.int64)
        grads = rng.standard_normal((ids.size, DIM)).astype(np.float32)
        client.push_rows("ada", ids, grads)
        # The shard sums duplicates, then applies Adagrad once per distinct id.
        g = np.zeros((ROWS, DIM), np.float32)
        np.add.at(g, ids, grads)
        touched = np.unique(ids)
        acc[touched] += g[touched] * g[touched]
        w[touched] -= lr * g[touched] / np.sqrt(acc[touched])
        g64 = g.astype(np.float64)
        acc64[touched] += g64[touched] ** 2
        w64[touched] -= 0.1 * g64[touched] / np.sqrt(acc64[touched])
    got = whole(client, "ada")
    np.testing.assert_allclose(got, w64, rtol=1e-5, atol=1e-6)
    # Summing duplicates in another order may move the last bit of a sum.
    np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-7)


def test_uint64_ids_and_dynamic_table(client):
    big = np.array([2**64 - 1, 2**63 + 5, 12], np.uint64)
    np.testing.assert_array_equal(client.pull_rows("dyn", big), np.full((3, DIM), 3.0))
    client.push_rows("dyn", big[:2], np.ones((2, DIM), np.float32))
    rows = client.pull_rows("dyn", big)
    moved = np.float32(3) - np.float32(0.01)  # sgd(0.01), the default
    np.testing.assert_array_equal(rows, np.array([[moved] * DIM, [moved] * DIM, [3.0] * DIM], np.float32))
    # The same 64 bits as int64 name the same rows.
    np.testing.assert_array_equal(client.pull_rows("dyn", big.view(np.int64)), rows)
    unsigned = np.array([1, 2], np.uint64)
    client.push_rows("sgd", unsigned, np.ones((2, DIM), np.float32))
    np.testing.assert_array_equal(client.pull_rows("sgd", unsigned), np.full((2, DIM), 0.5))


def test_lookup_rows_reads_without_creating_rows(client):
    held = np.array([11, 12], np.int64)
    client.push_rows("dyn", held, np.ones((2, DIM), np.float32))
    trained = client.pull_rows("dyn", held)
    rows_before = {t.name: t.rows for t in client.list_tables()}["dyn"]
    ids = np.array([[11, 99], [12, 2**40]], np.int64)
    rows = client.lookup_rows("dyn", ids)
    assert rows.shape == (2, 2, DIM)
    np.testing.assert_array_equal(rows[:, 0], trained)
    np.testing.assert_array_equal(rows[:, 1], np.full((2, DIM), 3.0))  # the initializer's
    out = np.zeros((4, DIM), np.float32)
    assert isinstance(client.lookup_rows("dyn", ids, out), int)
    np.testing.assert_array_equal(out, rows.reshape(4, DIM))
    np.testing.assert_array_equal(client.lookup_rows_async("dyn", ids).result(30), rows)
    assert {t.name: t.rows for t in client.list_tables()}["dyn"] == rows_before
    np.testing.assert_array_equal(client.lookup_rows("sgd", np.array([0, 9])), whole(client)[[0, 9]])
    with pytest.raises(ValueError, match="lookup_rows"):
        client.lookup_rows("dyn", ids, np.zeros((3, DIM), np.float32))
    with pytest.raises(psclient.RequestError, match="outside"):
        client.lookup_rows("sgd", np.array([ROWS]))


def test_a_table_admitting_ids_by_count(client):
    spec = psclient.TableSpec("admit", DIM, dynamic=True, init=psclient.constant(2.0),
                              optimizer=psclient.RowOptimizerConfig.sgd(1.0), min_count=2,
                              count_sketch_width=1 << 12)
    assert (spec.min_count, spec.count_sketch_width) == (2, 1 << 12)
    client.create_tables([spec])
    ids = np.arange(40, dtype=np.int64)
    grads = np.full((40, DIM), 0.5, np.float32)
    client.push_rows("admit", ids, grads)  # each id's first push: dropped
    info = {t.name: t for t in client.list_tables()}["admit"]
    assert (info.rows, info.ids_filtered) == (0, 40)
    np.testing.assert_array_equal(client.pull_rows("admit", ids), np.full((40, DIM), 2.0))
    client.push_rows("admit", ids[:10], grads[:10])  # the second: admitted and applied
    info = {t.name: t for t in client.list_tables()}["admit"]
    assert (info.rows, info.ids_filtered) == (10, 40)
    expected = np.full((40, DIM), 2.0, np.float32)
    expected[:10] = 1.5
    np.testing.assert_array_equal(client.pull_rows("admit", ids), expected)
    with pytest.raises(psclient.RequestError, match="at most 255"):
        client.create_tables([psclient.TableSpec("bad", DIM, dynamic=True, min_count=256)])


def test_rows_expire_after_steps_untouched(psd):
    spec = psclient.TableSpec("exp", 2, dynamic=True, init=psclient.constant(3.0),
                              optimizer=psclient.RowOptimizerConfig.sgd(1.0), expire_after_steps=2)
    assert spec.expire_after_steps == 2
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = psclient.TrainingSession(client, mode="async", ready_timeout=30)
        session.add_table(spec)
        session.initialize()
        rows, grads = np.empty((2, 2), np.float32), np.ones((2, 2), np.float32)
        for ids in ([1, 2], [1], [1]):  # 2 is touched at step 0 only, 1 at every step
            ids = np.array(ids, np.int64)
            session.set_rows("exp", ids, rows[:len(ids)], grads[:len(ids)])
            session.run_step(lambda: None)
        info = {t.name: t for t in client.list_tables()}["exp"]
        assert (info.rows, info.rows_expired) == (1, 1)  # 2 expired at step 2
        np.testing.assert_array_equal(client.lookup_rows("exp", np.array([1, 2], np.int64)),
                                      [[0.0, 0.0], [3.0, 3.0]])
        with pytest.raises(psclient.RequestError, match="dynamic tables only"):
            client.create_tables([psclient.TableSpec("fixed_exp", 2, rows=10, expire_after_steps=5)])
        session.end()


def test_async_rows_and_asyncio(client):
    ids = np.array([2, 5], np.int64)
    out = np.zeros((2, DIM), np.float32)
    status = client.push_rows_async("sgd", ids, np.ones((2, DIM), np.float32)).result(30)
    assert status == psclient.PushStatus.APPLIED
    assert isinstance(client.pull_rows_async("sgd", ids, out).result(30), int)
    np.testing.assert_array_equal(out, np.full((2, DIM), 0.5))

    async def main():
        await asyncio.wrap_future(client.push_rows_async("sgd", ids, np.ones((2, DIM), np.float32)))
        return await asyncio.wrap_future(client.pull_rows_async("sgd", ids))

    np.testing.assert_array_equal(asyncio.run(main()), np.zeros((2, DIM)))
    # Rows 2 and 4 are on one shard (mod): one request, which psd refuses.
    f = client.push_rows_async("sgd", np.array([2, 4]), np.full((2, DIM), np.nan, np.float32))
    with pytest.raises(psclient.RequestError, match="NaN or Inf"):
        f.result(30)


def test_torch_ids_and_rows_in_place(client):
    torch = pytest.importorskip("torch")
    ids = torch.tensor([4, 6, 4])
    client.push_rows("sgd", ids, torch.ones(3, DIM))
    out = torch.zeros(3, DIM)
    client.pull_rows("sgd", ids, out)
    assert torch.equal(out, torch.tensor([[0.0] * DIM, [0.5] * DIM, [0.0] * DIM]))
    # An embedding module's weight (requires grad) is written through its storage.
    emb = torch.nn.Embedding(3, DIM)
    client.pull_rows("sgd", torch.tensor([4, 6, 0]), emb.weight)
    assert torch.equal(emb.weight.detach(), torch.tensor([[0.0] * DIM, [0.5] * DIM, [1.0] * DIM]))
    with pytest.raises(ValueError, match="int64 or uint64, got int32"):
        client.pull_rows("sgd", ids.to(torch.int32), out)
    with pytest.raises(ValueError, match="C-contiguous"):
        client.pull_rows("sgd", torch.tensor([[1, 2], [3, 4]]).t(), torch.zeros(2, 2, DIM))
    with pytest.raises(ValueError, match="float32, got float64"):
        client.push_rows("sgd", ids, torch.ones(3, DIM, dtype=torch.float64))


IDS = np.array([1, 2, 8], np.int64)
GOOD = np.ones((3, DIM), np.float32)


def _read_only():
    a = np.zeros((3, DIM), np.float32)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("ids, rows, error, message", [
    (IDS.astype(np.int32), GOOD, ValueError, "ids for 'sgd' must be int64 or uint64, got int32"),
    (IDS.astype(np.float64), GOOD, ValueError, "must be int64 or uint64, got float64"),
    (np.array([1, 0, 2, 0, 8], np.int64)[::2], GOOD, ValueError, "C-contiguous"),
    ([1, 2, 8], GOOD, TypeError, "must be an int64 or uint64 array"),
    (IDS, GOOD.astype(np.float64), ValueError, "must be float32, got float64"),
    (IDS, np.ones((DIM, 3), np.float32), ValueError, r"has shape \(4, 3\); 3 ids .* need \(3, 4\)"),
    (IDS, np.ones(3 * DIM, np.float32), ValueError, r"has shape \(12,\)"),
    (IDS[:2], GOOD, ValueError, r"2 ids of table 'sgd' \(dim 4\) need \(2, 4\)"),
    (IDS, np.ones((3, 2 * DIM), np.float32)[:, ::2], ValueError, "C-contiguous"),
    (IDS, [[1.0] * DIM] * 3, TypeError, "must be a float32 array"),
    (np.array([1, 10, 2], np.int64), GOOD, psclient.RequestError, "id 10 is outside table 'sgd' of 10 rows"),
    (np.array([-1, 1, 2], np.int64), GOOD, psclient.RequestError, "id -1 is outside"),
    (np.array([1, 2**63, 2], np.uint64), GOOD, psclient.RequestError, "id 9223372036854775808 is outside"),
])
def test_refusals_leave_the_table_unchanged(client, ids, rows, error, message):
    before, pushed = whole(client), pushes(client)
    for call in (client.push_rows, client.push_rows_async):
        with pytest.raises(error, match=message):
            call("sgd", ids, rows)
    for call in (client.pull_rows, client.pull_rows_async):
        sentinel = rows.copy() if isinstance(rows, np.ndarray) else None
        with pytest.raises(error, match=message):
            call("sgd", ids, rows)
        if sentinel is not None:
            np.testing.assert_array_equal(rows, sentinel)  # a refused pull writes nothing
    np.testing.assert_array_equal(whole(client), before)
    assert pushes(client) == pushed and sum(s.rejected for s in client.stats()) == 0


def test_other_refusals_leave_the_table_unchanged(client, start_psd):
    before = whole(client)
    with pytest.raises(ValueError, match="read-only"):
        client.pull_rows("sgd", IDS, _read_only())
    client.push_rows("sgd", np.array([], np.int64), np.zeros((0, DIM), np.float32))  # nothing to do
    with pytest.raises(psclient.ConfigError, match="no table 'nope'"):
        client.pull_rows("nope", IDS)
    with pytest.raises(psclient.ConfigError, match="no table 'nope'"):
        client.push_rows("nope", IDS, GOOD)
    with pytest.raises(psclient.RequestError, match="NaN or Inf"):
        client.push_rows("sgd", IDS, np.full((3, DIM), np.inf, np.float32))
    with pytest.raises(ValueError, match="placement must be"):
        psclient.TableSpec("x", 4, rows=4, placement="random")
    with pytest.raises(ValueError, match="on_limit must be"):
        psclient.TableSpec("x", 4, dynamic=True, on_limit="drop")
    # psd refuses a table whose spec clashes with the existing one; nothing changes.
    with pytest.raises(psclient.RequestError, match="sgd"):
        client.create_tables([psclient.TableSpec("sgd", DIM + 1, rows=ROWS)])
    np.testing.assert_array_equal(whole(client), before)
    assert pushes(client) == 0


def test_declare_tables_on_a_second_client(client):
    addresses = client.ps_hosts
    with psclient.Client(addresses) as worker:
        with pytest.raises(psclient.ConfigError, match="create_tables or declare_tables"):
            worker.pull_rows("sgd", IDS)
        worker.declare_tables([psclient.TableSpec("sgd", DIM, rows=ROWS)])
        worker.push_rows("sgd", IDS, GOOD)
    np.testing.assert_array_equal(client.pull_rows("sgd", IDS), np.full((3, DIM), 0.5))


# In a child: before the refusal, a large pull whose rows landed on its own
# ids planned later parts from the row bytes and crashed the interpreter.
ALIASED_PULL = """
import sys, numpy as np, psclient
n, dim = 2_000_000, 4
with psclient.Client(sys.argv[1:], max_request_bytes=65536) as c:
    c.create_tables([psclient.TableSpec("t", dim, rows=n, placement="div", init=psclient.constant(1.0))])
    for call in (c.pull_rows, c.pull_rows_async) * 3:
        raw = np.zeros(n * dim, np.float32)
        ids = raw.view(np.int64)[:n]   # the first half of out's bytes
        ids[:] = np.arange(n)
        try:
            call("t", ids, raw.reshape(n, dim))
        except ValueError as e:
            print(e)
        assert (ids == np.arange(n)).all(), "the ids were written over"
    out = np.zeros((3, dim), np.float32)
    c.pull_rows("t", np.array([0, 1, 2]), out)  # separate arrays: fine
    np.testing.assert_array_equal(out, 1)
"""


def test_pull_rows_into_memory_shared_with_the_ids_is_refused(start_psd, python_env):
    shards = [start_psd(), start_psd()]
    child = subprocess.run([sys.executable, "-c", ALIASED_PULL, *[s.address for s in shards]],
                           env=python_env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    lines = child.stdout.splitlines()
    assert len(lines) == 6 and all("shares memory with the ids" in line for line in lines), lines


def test_dedup_ids_matches_first_appearance_and_keeps_the_dtype():
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 300, size=(40, 26)).astype(np.int64) * 1_000_003 - 5  # repeats, negatives
    unique, index = psclient.dedup_ids(ids)
    assert unique.dtype == np.int64 and index.dtype == np.int64 and index.shape == ids.shape
    np.testing.assert_array_equal(unique[index], ids)
    _, first = np.unique(ids.reshape(-1), return_index=True)
    np.testing.assert_array_equal(unique, ids.reshape(-1)[np.sort(first)])  # first-appearance order

    big = np.array([2**64 - 1, 7, 2**63, 7, 2**64 - 1], np.uint64)  # every 64 bits kept
    unique, index = psclient.dedup_ids(big)
    assert unique.dtype == np.uint64
    np.testing.assert_array_equal(unique, np.array([2**64 - 1, 7, 2**63], np.uint64))
    np.testing.assert_array_equal(index, [0, 1, 2, 1, 0])

    unique, index = psclient.dedup_ids(np.empty((0,), np.int64))
    assert unique.shape == (0,) and index.shape == (0,)
    with pytest.raises(ValueError, match="int64"):
        psclient.dedup_ids(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        psclient.dedup_ids(np.arange(10, dtype=np.int64)[::2])


def test_dedup_ids_of_a_torch_tensor():
    torch = pytest.importorskip("torch")
    ids = torch.tensor([[3, 9], [9, 3], [4, 3]], dtype=torch.int64)
    unique, index = psclient.dedup_ids(ids)
    np.testing.assert_array_equal(unique, [3, 9, 4])
    assert torch.equal(torch.from_numpy(unique)[torch.from_numpy(index)], ids)
