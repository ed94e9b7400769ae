"""Client against a real psd: values, in-place pulls, futures, refusals."""

import asyncio
import builtins
import concurrent.futures
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import psclient


@pytest.fixture
def client(psd):
    with psclient.Client([psd.address]) as c:
        c.create([
            psclient.TensorSpec("w", (2, 3), optimizer=psclient.sgd(0.5)),
            psclient.TensorSpec("b", 3, init=psclient.constant(2.0)),
        ])
        yield c


def test_pull_into_numpy_in_place_and_new_array(client):
    w = np.full((2, 3), 7, np.float32)
    result = client.pull("w", w)
    assert isinstance(result, psclient.PullResult)
    np.testing.assert_array_equal(w, np.zeros((2, 3), np.float32))
    b = client.pull("b")
    assert b.dtype == np.float32 and b.shape == (3,)
    np.testing.assert_array_equal(b, [2, 2, 2])


def test_push_applies_sgd_exactly(client):
    grad = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.push("w", grad)
    assert result.status == [psclient.PushStatus.APPLIED]
    client.push({"w": grad, "b": np.ones(3, np.float32)})
    w, b = np.empty((2, 3), np.float32), np.empty(3, np.float32)
    result = client.pull({"w": w, "b": b})
    np.testing.assert_array_equal(w, -0.5 * 2 * grad)
    np.testing.assert_array_equal(b, np.full(3, 2, np.float32) - np.float32(0.01))
    assert result.versions == [2, 1]


def test_flat_buffer_of_the_right_size_is_accepted(client):
    client.push("w", np.ones(6, np.float32))
    out = np.empty(6, np.float32)
    client.pull("w", out)
    np.testing.assert_array_equal(out, -0.5 * np.ones(6, np.float32))
    mv = memoryview(bytearray(12)).cast("f")
    client.pull("b", mv)
    assert list(mv) == [2.0, 2.0, 2.0]


def test_create_is_idempotent_and_list_reports_tensors(client):
    client.create([psclient.TensorSpec("w", (2, 3))])
    infos = {t.name: t for t in client.list()}
    assert infos["w"].shape == (2, 3) and infos["b"].shape == (3,)
    assert infos["w"].optimizer == psclient.OptimizerKind.SGD


def test_optimizer_and_initializer_helpers(psd):
    with psclient.Client(psd.address) as c:  # a comma-separated string, as --ps_hosts
        c.create([
            psclient.TensorSpec("m", 4, optimizer=psclient.momentum(0.1, 0.9)),
            psclient.TensorSpec("a", 4, optimizer=psclient.adam(1e-3), init=psclient.uniform(-1, 1, seed=3)),
            psclient.TensorSpec("g", (20, 30), init=psclient.glorot_uniform(7)),
            psclient.TensorSpec("v", 3, init=psclient.from_values(np.array([1, 2, 3], np.float32))),
            psclient.TensorSpec("r", 2, optimizer=psclient.rmsprop(0.01), init=psclient.normal(0, 1, seed=1)),
            psclient.TensorSpec("d", 2, optimizer=psclient.adagrad(0.1)),
        ])
        np.testing.assert_array_equal(c.pull("v"), [1, 2, 3])
        a = c.pull("a")
        assert np.all((a >= -1) & (a < 1)) and len(set(a.tolist())) == 4
        limit = np.sqrt(6 / (20 + 30))
        g = c.pull("g")
        assert np.all(np.abs(g) <= limit) and g.std() > limit / 4
        # Momentum: v = 0.9 v + g; w -= lr v, twice with g = 1: -0.1, then -0.1 - 0.19.
        c.push("m", np.ones(4, np.float32))
        c.push("m", np.ones(4, np.float32))
        np.testing.assert_allclose(c.pull("m"), np.full(4, -0.29), rtol=1e-6)
        assert {t.name: t.optimizer for t in c.list()}["a"] == psclient.OptimizerKind.ADAM
    assert psclient.TensorSpec("x", (1, 2)).optimizer.learning_rate == pytest.approx(0.01)
    assert psclient.TensorSpec("x", (1, 2)).init.kind == psclient.InitKind.ZEROS
    assert psclient.optimizer("nesterov", 0.1).nesterov
    with pytest.raises(psclient.ConfigError):
        psclient.optimizer("lbfgs", 0.1)


def test_torch_tensors_in_place(client):
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.full((2, 3), 9.0))
    client.push("w", torch.ones(2, 3))
    client.pull("w", param)  # requires grad: written through .detach(), the same storage
    assert torch.equal(param.detach(), torch.full((2, 3), -0.5))
    flat = torch.empty(6)
    client.pull({"w": flat})
    assert torch.equal(flat, torch.full((6,), -0.5))
    with pytest.raises(ValueError, match="float32"):
        client.pull("w", torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        client.pull("w", torch.zeros(3, 2).t())
    with pytest.raises(ValueError, match="has 5 elements"):
        client.push("w", torch.zeros(5))


def test_torch_tensors_dlpack_cannot_export_are_value_errors(client):
    torch = pytest.importorskip("torch")
    for tensor in (torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 3).to_sparse()):
        with pytest.raises(ValueError, match="cannot be read as an array"):
            client.pull("w", tensor)
        with pytest.raises(ValueError, match="cannot be read as an array"):
            client.push_async("w", tensor)
    assert client.stats()[0].pushes == 0


def test_torch_negated_views_refused_not_written_with_the_wrong_sign(client):
    # x.conj().imag is a float32 view whose memory holds the negated values.
    torch = pytest.importorskip("torch")
    client.push("w", np.ones((2, 3), np.float32))  # w = -0.5
    for view in (torch._neg_view(torch.zeros(2, 3)), torch.zeros(2, 3, dtype=torch.cfloat).conj().imag):
        assert view.is_neg()
        for call in (client.pull, client.pull_async, client.push, client.push_async):
            with pytest.raises(ValueError, match=r"negated torch view .*resolve_neg"):
                call("w", view)
        assert torch.equal(view, torch.zeros(2, 3))  # nothing written
    assert client.stats()[0].pushes == 1
    np.testing.assert_array_equal(client.pull("w"), np.full((2, 3), -0.5))
    client.push("w", torch._neg_view(torch.ones(2, 3)).resolve_neg())  # a copy with the values shown


def test_futures_and_asyncio(client):
    grad = np.ones((2, 3), np.float32)
    futures = [client.push_async("w", grad) for _ in range(10)]
    assert isinstance(futures[0], concurrent.futures.Future)
    for f in concurrent.futures.as_completed(futures, timeout=30):
        assert f.result().status == [psclient.PushStatus.APPLIED]
    out = np.empty((2, 3), np.float32)
    f = client.pull_async("w", out)
    assert f.result(timeout=30).versions == [10]
    assert f.done() and not f.cancel()
    np.testing.assert_array_equal(out, np.full((2, 3), -5, np.float32))

    async def main():
        pushed = await asyncio.wrap_future(client.push_async({"w": grad}))
        new = await asyncio.wrap_future(client.pull_async("w"))
        return pushed, new

    pushed, new = asyncio.run(main())
    assert pushed.status == [psclient.PushStatus.APPLIED]
    np.testing.assert_array_equal(new, np.full((2, 3), -5.5, np.float32))


def test_a_client_closed_in_a_done_callback_completes_the_calls_queued_behind_it(psd):
    # The last reference dropped in a callback closed the Client on its completing thread at once:
    # the calls queued behind that future, still waiting in psd, failed ("destroyed with this call
    # in flight").
    holder = {"c": psclient.Client([psd.address], worker_index=0, is_chief=True, call_timeout=20)}
    c = holder["c"]
    c.init_job(psclient.JobConfig(mode="sync", replicas_to_aggregate=1, total_replicas=2))
    c.create([psclient.TensorSpec("w", 1 << 16, optimizer=psclient.sgd(1.0))])
    c.set_ready()
    dropped = threading.Event()
    first = c.pull_async("w", min_step=1)  # its callback, on the completing thread, drops the Client
    first.add_done_callback(lambda f: (holder.clear(), dropped.set()))
    outs = [np.zeros(1 << 16, np.float32) for _ in range(5)]
    waiting = [c.pull_async("w", out, min_step=2) for out in outs]  # held until global step 2
    del c
    with psclient.Client([psd.address], worker_index=1) as other:  # takes the job to step 1, then 2
        other.declare([psclient.TensorSpec("w", 1 << 16)])
        other.push_and_step("w", np.ones(1 << 16, np.float32), step=0, done_step=0)
        assert dropped.wait(10)
        time.sleep(0.2)
        assert not any(f.done() for f in waiting)
        other.push_and_step("w", np.ones(1 << 16, np.float32), step=1, done_step=1)
    for f, out in zip(waiting, outs):
        assert f.result(timeout=30).step == 2
        np.testing.assert_array_equal(out, np.full(1 << 16, -2, np.float32))


def test_future_carries_the_error(client):
    f = client.push_async("w", np.full((2, 3), np.inf, np.float32))
    with pytest.raises(psclient.RequestError, match="NaN or Inf"):
        f.result(timeout=30)
    assert isinstance(f.exception(), psclient.Error)


@pytest.mark.parametrize("array, error, message", [
    (np.zeros((2, 3), np.float64), ValueError, "must be float32, got float64"),
    (np.zeros((2, 3), np.int32), ValueError, "must be float32, got int32"),
    (np.zeros(5, np.float32), ValueError, "has 5 elements, the tensor has 6"),
    (np.zeros((3, 2), np.float32).T, ValueError, "C-contiguous"),
    (np.zeros((2, 6), np.float32)[:, ::2], ValueError, "C-contiguous"),
    ([0.0] * 6, TypeError, "must be a float32 array"),
])
def test_bad_arrays_refused_before_sending(client, array, error, message):
    with pytest.raises(error, match=message):
        client.pull("w", array)
    with pytest.raises(error, match=message):
        client.push("w", array)
    with pytest.raises(error, match=message):
        client.push_async({"w": array})
    stats = client.stats()[0]
    assert stats.pushes == 0 and stats.rejected == 0  # nothing reached psd
    np.testing.assert_array_equal(client.pull("w"), np.zeros((2, 3)))


def test_read_only_array_refused_for_pull_accepted_for_push(client):
    grad = np.ones((2, 3), np.float32)
    grad.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        client.pull("w", grad)
    client.push("w", grad)
    np.testing.assert_array_equal(client.pull("w"), np.full((2, 3), -0.5))


def test_a_pull_into_outs_that_share_memory_is_refused_before_sending(client):
    """Two tensors pulled at once into overlapping memory would race (which one's values
    land there would depend on which answer comes last): refused, nothing written."""
    block = np.full(9, 7, np.float32)
    for w, b in [(block[:6], block[5:8]), (block[3:9], block[2:5]), (block[:6], block[:6][:3])]:
        with pytest.raises(ValueError, match="pull: the outs for '(w|b)' and '(w|b)' share memory"):
            client.pull({"w": w.reshape(2, 3), "b": b})
        with pytest.raises(ValueError, match="share memory"):
            client.pull_async({"w": w.reshape(2, 3), "b": b})
    np.testing.assert_array_equal(block, np.full(9, 7, np.float32))
    client.pull({"w": block[:6].reshape(2, 3), "b": block[6:]})  # adjacent: fine
    np.testing.assert_array_equal(block, [0, 0, 0, 0, 0, 0, 2, 2, 2])


def test_other_refusals(client, psd):
    with pytest.raises(psclient.ConfigError, match="unknown to this Client"):
        client.pull("nope")
    with pytest.raises(TypeError, match="gradient missing"):
        client.push("w")
    with pytest.raises(TypeError, match="tensor name"):
        client.pull(3)
    with pytest.raises(TypeError, match="either a name and an array"):
        client.pull({"w": np.zeros(6, np.float32)}, np.zeros(6, np.float32))
    with pytest.raises(psclient.RequestError, match="NaN or Inf") as refused:
        client.push("w", np.full((2, 3), np.nan, np.float32))
    assert isinstance(refused.value, psclient.Error) and isinstance(refused.value, RuntimeError)
    np.testing.assert_array_equal(client.pull("w"), np.zeros((2, 3)))
    with pytest.raises(psclient.ConfigError, match="worker"):
        client.push_and_step("w", np.ones((2, 3), np.float32), step=0, done_step=0)


def test_request_error_from_psd_carries_its_message(client, psd):
    # Another client declares "w" with another shape: psd refuses it.
    with psclient.Client([psd.address]) as other:
        with pytest.raises(psclient.Error) as refused:
            other.create([psclient.TensorSpec("w", (4,))])
        assert isinstance(refused.value, psclient.RequestError)
        assert "w" in str(refused.value) and "shape" in str(refused.value)


def test_connection_error_and_closed_client():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(psclient.ConnectionError) as refused:
        psclient.Client([f"127.0.0.1:{port}"], connect_timeout=0.3)
    assert isinstance(refused.value, builtins.ConnectionError)
    assert str(port) in str(refused.value)
    with pytest.raises(ValueError, match="placement"):
        psclient.Client([f"127.0.0.1:{port}"], placement="random")
    for bad in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValueError, match="busy_poll_us"):
            psclient.Client([f"127.0.0.1:{port}"], busy_poll_us=bad)
        with pytest.raises(ValueError, match="call_timeout"):
            psclient.Client([f"127.0.0.1:{port}"], call_timeout=bad)


def test_closed_client_refuses_calls(psd):
    c = psclient.Client([psd.address])
    c.create([psclient.TensorSpec("w", 2)])
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(ValueError, match="closed"):
        c.pull("w")


def test_report_and_stats(psd):
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as c:
        c.create([psclient.TensorSpec("w", 2)])
        c.report(step=3, loss=0.5, accuracy=0.75)
        assert c.stats()[0].tensors == 1
        assert c.num_shards == 1 and c.worker_index == 0 and c.is_chief
        assert c.connection_addresses() == [psd.address]


def test_tls_ca_reaches_a_tls_psd_and_a_plaintext_client_is_told(start_psd, tmp_path):
    import shutil
    import subprocess
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    run = lambda *a: subprocess.run(a, cwd=tmp_path, check=True, capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("openssl", "req", "-x509", *ec, "-days", "2", "-subj", "/CN=ca", "-keyout", "ca.key", "-out", "ca.crt")
    run("openssl", "req", *ec, "-subj", "/CN=psd", "-keyout", "psd.key", "-out", "psd.csr")
    (tmp_path / "psd.ext").write_text("subjectAltName=DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", "psd.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "psd.ext", "-out", "psd.crt")
    psd = start_psd("--tls_cert", str(tmp_path / "psd.crt"), "--tls_key", str(tmp_path / "psd.key"))
    with psclient.Client([psd.address], tls_ca=str(tmp_path / "ca.crt")) as c:
        c.create([psclient.TensorSpec("w", (3,), optimizer=psclient.sgd(0.5))])
        c.push("w", np.array([2, 4, 6], np.float32))
        w = np.zeros(3, np.float32)
        c.pull("w", w)
        assert w.tolist() == [-1.0, -2.0, -3.0]
    with pytest.raises(psclient.ConnectionError, match="requires TLS"):
        psclient.Client([psd.address], connect_timeout=2)
    with pytest.raises(psclient.ConnectionError, match="TLS certificate check"):
        psclient.Client([psd.address], tls_ca=str(tmp_path / "ca.crt"), tls_server_name="other.example",
                        connect_timeout=2)


CLOSE_FROM_TWO_THREADS = r"""
import sys, threading, time, numpy as np, psclient
address = sys.argv[1]
c = psclient.Client([address], worker_index=0, is_chief=True, call_timeout=30)
c.init_job(psclient.JobConfig(mode="sync", replicas_to_aggregate=1, total_replicas=1))
c.create([psclient.TensorSpec("w", 4, optimizer=psclient.sgd(1.0))])
c.set_ready()
out = np.zeros(4, np.float32)
pulled = c.pull_async("w", out, min_step=1)  # waits for global step 1
closers = [threading.Thread(target=c.close, daemon=True) for _ in range(2)]
for t in closers:
    t.start()
time.sleep(0.3)
assert not pulled.done()
assert all(t.is_alive() for t in closers)  # both wait for the pull
with psclient.Client([address], worker_index=0) as other:
    other.declare([psclient.TensorSpec("w", 4, optimizer=psclient.sgd(1.0))])
    other.push_and_step("w", np.ones(4, np.float32), step=0, done_step=0)
for t in closers:
    t.join(10)
assert not any(t.is_alive() for t in closers), "a close() never returned"
assert c.closed and pulled.result(timeout=0).step >= 1
assert (out == -1).all(), out
c.close()
print("closed")
"""


def test_close_from_two_threads_waits_for_calls_and_returns(psd, python_env):
    # In a child process: a close() that never returns would hang this one at exit.
    child = subprocess.run([sys.executable, "-c", CLOSE_FROM_TWO_THREADS, psd.address], env=python_env,
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout == "closed\n"
