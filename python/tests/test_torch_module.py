"""psclient.torch: a module's parameters and a table's rows bound to a TrainingSession on a real psd.
Values after each push are compared with a float64 reference of the SGD step; CUDA cases SKIP without a
GPU, and the whole file without PyTorch."""

import threading

import numpy as np
import pytest

import psclient
from conftest import run_workers

torch = pytest.importorskip("torch")
pst = pytest.importorskip("psclient.torch")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]


def chief_session(client, **kwargs):
    return psclient.TrainingSession(client, mode="async", ready_timeout=30, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_pull_into_the_module_and_push_its_gradients(psd, device):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(device)
    lr = 0.25
    x = np.array([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]])
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        params = pst.Parameters(session, model, optimizer=psclient.sgd(lr), prefix="m/", seed=5)
        assert sorted(params.values) == ["m/bias", "m/weight"]
        session.initialize()
        for step in range(3):
            pst.pull(session, params)
            with psclient.Client([psd.address]) as reader:  # what psd holds, read apart from the session
                reader.declare([psclient.TensorSpec("m/weight", (2, 3)), psclient.TensorSpec("m/bias", 2)])
                w, b = reader.pull("m/weight").astype(np.float64), reader.pull("m/bias").astype(np.float64)
            if step == 0:
                np.testing.assert_array_equal(b, np.zeros(2))  # zeros for vectors
                assert np.abs(w).max() <= np.sqrt(6 / 5) and np.abs(w).min() > 0  # Glorot-uniform, fan 3 + 2
            # The module computes with psd's values, on its device.
            assert model.weight.device.type == device
            np.testing.assert_array_equal(model.weight.detach().cpu().numpy(), w.astype(np.float32))
            np.testing.assert_array_equal(model.bias.detach().cpu().numpy(), b.astype(np.float32))
            # loss = sum((x W^T + b)^2) * (step + 1): the gradient differs each step, so a gradient not
            # zeroed between steps would show in the values.
            y = model(torch.tensor(x, dtype=torch.float32, device=device))
            pst.backward((y * y).sum() * (step + 1), params)
            pst.push(session, params)
            y64 = x @ w.T + b
            grad_w, grad_b = 2 * (step + 1) * y64.T @ x, 2 * (step + 1) * y64.sum(0)
            with psclient.Client([psd.address]) as reader:
                reader.declare([psclient.TensorSpec("m/weight", (2, 3)), psclient.TensorSpec("m/bias", 2)])
                np.testing.assert_allclose(reader.pull("m/weight"), w - lr * grad_w, rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(reader.pull("m/bias"), b - lr * grad_b, rtol=1e-5, atol=1e-5)
        # The final values, pulled outside the session's steps, into the module.
        params.pull(client)
        np.testing.assert_allclose(model.bias.detach().cpu().numpy(), b - lr * grad_b, rtol=1e-5, atol=1e-5)
        session.end()


@pytest.mark.parametrize("device", DEVICES)
def test_parameters_start_from_the_modules_own_values(psd, device):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1)).to(device)
    initial = {name: p.detach().cpu().numpy().copy() for name, p in model.named_parameters()}
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        params = pst.Parameters(session, model, optimizer=psclient.sgd(0.1), init="module")
        # The module keeps its values before the first pull.
        for name, p in model.named_parameters():
            np.testing.assert_array_equal(p.detach().cpu().numpy(), initial[name])
        session.initialize()
        held = {name: np.empty(v.shape, np.float32) for name, v in initial.items()}
        client.pull(held)  # what psd holds
        for name, v in initial.items():
            np.testing.assert_array_equal(held[name], v)
        assert sorted(params.values) == sorted(initial)
        session.end()


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_rows_sum_repeated_ids_and_scale_gradients(psd, device):
    dim, lr, scale = 4, 0.5, 3.0
    spec = psclient.TableSpec("t", dim, rows=10, optimizer=psclient.RowOptimizerConfig.sgd(lr),
                              init=psclient.uniform(-1, 1, 9))
    rng = np.random.default_rng(1)
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        table = pst.Embedding(session, spec, device=device, grad_scale=scale)
        session.initialize()
        before = client.lookup_rows("t", np.arange(10)).astype(np.float64)
        # Step 1: ids of shape (2, 2), 3 twice.
        ids = np.array([[3, 5], [3, 7]], np.int64)
        table.set_ids(ids)
        pst.pull(session, table)
        rows = table.rows()
        assert rows.shape == (2, 2, dim) and rows.device.type == device and rows.requires_grad
        np.testing.assert_array_equal(rows.detach().cpu().numpy(), before[ids].astype(np.float32))
        weights = rng.standard_normal((2, 2, dim))
        pst.backward((rows * torch.tensor(weights, dtype=torch.float32, device=device)).sum(), table)
        pst.push(session, table)
        expected = before.copy()
        np.subtract.at(expected, ids.reshape(-1), lr * scale * weights.reshape(-1, dim))
        after = client.lookup_rows("t", np.arange(10))
        np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-6)
        # Step 2: another shape (the buffers follow it), ids given as a tensor, rows used squared.
        ids2 = torch.tensor([7, 0, 0], dtype=torch.int64)
        table.set_ids(ids2)
        pst.pull(session, table)
        rows = table.rows()
        np.testing.assert_array_equal(rows.detach().cpu().numpy(), after[[7, 0, 0]])
        pst.backward((rows * rows).sum(), table)
        pst.push(session, table)
        r = after.astype(np.float64)
        np.subtract.at(r, [7, 0, 0], lr * scale * 2 * r[[7, 0, 0]])
        now = client.lookup_rows("t", np.arange(10))
        np.testing.assert_allclose(now, r, rtol=1e-5, atol=1e-6)
        # Step 3: a loss without the rows pushes zeros (the last step's gradients are not pushed again).
        pst.pull(session, table)
        pst.backward(torch.zeros((), requires_grad=True) * 2, table)
        pst.push(session, table)
        np.testing.assert_array_equal(client.lookup_rows("t", np.arange(10)), now)
        session.end()


def test_sync_replicas_average_the_rows_gradients(psd):
    spec = psclient.TableSpec("s", 2, dynamic=True, optimizer=psclient.RowOptimizerConfig.sgd(1.0),
                              init=psclient.constant(10))
    done = threading.Barrier(2, timeout=60)

    def worker(client, i):
        session = psclient.TrainingSession(client, mode="sync", replicas_to_aggregate=2, total_replicas=2,
                                           train_steps=2, ready_timeout=30)
        table = pst.Embedding(session, spec)
        session.initialize()
        while not session.should_stop:
            table.set_ids(np.array([42, 42 + i], np.int64))
            pst.pull(session, table)
            if session.should_stop:
                break
            pst.backward(table.rows().sum() * (i + 1), table)  # worker i: gradient i + 1 per position
            pst.push(session, table)
        done.wait()
        if i == 0:
            rows = client.lookup_rows("s", np.array([42, 43], np.int64), min_step=2)
            # Per step, id 42: worker 0's two positions (1 + 1) and worker 1's one (2), over 2
            # replicas: 2; id 43, worker 1's alone: 2 / 2 = 1. Two steps from 10.
            np.testing.assert_array_equal(rows, [[6, 6], [8, 8]])
            session.end()

    run_workers(psd.address, 2, worker)


def test_gradients_stay_bound_through_pytorch_habits(psd):
    """module.zero_grad(set_to_none=True) between steps, and clip_grad_norm_ between backward and push:
    the gradients pushed are the clipped ones, every step."""
    model = torch.nn.Linear(4, 1, bias=False)
    lr, x = 0.5, torch.tensor([[3.0, 0.0, 4.0, 0.0]])
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        params = pst.Parameters(session, model, optimizer=psclient.sgd(lr), init=lambda i, n, p: psclient.zeros())
        session.initialize()
        expected = np.zeros(4)
        for step in range(3):
            model.zero_grad(set_to_none=True)  # PyTorch's default since 2.0
            assert model.weight.grad is None
            pst.pull(session, params)
            np.testing.assert_allclose(model.weight.detach().numpy()[0], expected, rtol=1e-6, atol=1e-7)
            pst.backward(model(x).sum() * 10, params)  # gradient 10 * x: norm 50
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # to norm 1: x / 5
            pst.push(session, params)
            expected -= lr * np.array([3.0, 0.0, 4.0, 0.0]) / 5
        pst.pull(session, params)
        np.testing.assert_allclose(model.weight.detach().numpy()[0], expected, rtol=1e-5, atol=1e-6)
        session.end()


@pytest.mark.parametrize("device", DEVICES)
def test_a_plain_backward_pushes_this_steps_gradients_alone(psd, device):
    """model.zero_grad(set_to_none=True) and loss.backward() instead of psclient.torch.backward: a parameter
    or rows the loss does not use push zeros (not the last step's gradient), and the rows' gradients do not
    add up over steps."""
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 1, bias=False),
                                 "unused": torch.nn.Linear(2, 1, bias=False)}).to(device)
    spec = psclient.TableSpec("r", 2, dynamic=True, optimizer=psclient.RowOptimizerConfig.sgd(1.0))
    lr, x = 0.5, torch.tensor([[1.0, 2.0]], device=device)
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        params = pst.Parameters(session, model, optimizer=psclient.sgd(lr), init=lambda i, n, p: psclient.zeros())
        table = pst.Embedding(session, spec, device=device)
        session.initialize()
        table.set_ids(np.array([7], np.int64))
        for step in range(3):
            model.zero_grad(set_to_none=True)
            pst.pull(session, params, table)
            loss = model["used"](x).sum()
            if step == 0:  # the unused layer takes part in the first step only
                loss = loss + model["unused"](x).sum()
            if step != 1:  # the rows in the first and last steps
                loss = loss + (table.rows() * 3).sum()
            loss.backward()
            pst.push(session, params, table)
        values = {"used.weight": np.empty((1, 2), np.float32), "unused.weight": np.empty((1, 2), np.float32)}
        client.pull(values)
        np.testing.assert_allclose(values["used.weight"][0], -3 * lr * np.array([1.0, 2.0]), rtol=1e-6)
        np.testing.assert_allclose(values["unused.weight"][0], -lr * np.array([1.0, 2.0]), rtol=1e-6)
        np.testing.assert_allclose(client.lookup_rows("r", np.array([7], np.int64))[0], [-6.0, -6.0], rtol=1e-6)
        session.end()


def test_init_none_keeps_pytorchs_values_for_convolutions(psd):
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 2))
    conv = model[0].weight.detach().numpy().copy()
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        pst.Parameters(session, model, optimizer=psclient.sgd(0.1), seed=9)
        session.initialize()
        held = {"0.weight": np.empty(conv.shape, np.float32), "0.bias": np.empty(8, np.float32),
                "2.weight": np.empty((2, 128), np.float32)}
        client.pull(held)
        np.testing.assert_array_equal(held["0.weight"], conv)  # PyTorch's own, not Glorot in TF's layout
        np.testing.assert_array_equal(held["0.bias"], np.zeros(8))
        limit = np.sqrt(6 / (128 + 2))
        assert 0 < np.abs(held["2.weight"]).max() <= limit  # Glorot-uniform for the Linear
        session.end()


def test_init_none_keeps_pytorchs_values_for_norm_scales_and_slopes(psd):
    # Zeros for every 1-D parameter made a LayerNorm's scale 0 (the model's output constant, no
    # gradient below it) and PReLU's slope 0.
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.PReLU(), torch.nn.Linear(6, 1))
    with torch.no_grad():
        model[1].bias.fill_(0.5)  # a bias: zeros on psd all the same
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        pst.Parameters(session, model, optimizer=psclient.sgd(0.1), seed=3)
        session.initialize()
        held = {"1.weight": np.empty(6, np.float32), "1.bias": np.empty(6, np.float32),
                "2.weight": np.empty(1, np.float32), "0.bias": np.empty(6, np.float32)}
        client.pull(held)
        np.testing.assert_array_equal(held["1.weight"], np.ones(6))
        np.testing.assert_array_equal(held["2.weight"], np.full(1, 0.25, np.float32))
        np.testing.assert_array_equal(held["1.bias"], np.zeros(6))
        np.testing.assert_array_equal(held["0.bias"], np.zeros(6))
        session.end()


def test_an_empty_batch_of_ids_pulls_and_pushes_nothing(psd):
    spec = psclient.TableSpec("z", 4, dynamic=True, optimizer=psclient.RowOptimizerConfig.sgd(1.0))
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        table = pst.Embedding(session, spec)
        session.initialize()
        for ids in (np.zeros((0,), np.int64), np.zeros((5, 0), np.int64)):  # (5, 0): no ids in any example
            table.set_ids(ids)
            pst.pull(session, table)
            assert table.rows().shape == ids.shape + (4,)
            pst.backward(table.rows().sum() + torch.zeros((), requires_grad=True), table)
            pst.push(session, table)
        assert client.list_tables()[0].rows == 0
        session.end()


def test_lookup_reads_without_creating_rows(psd):
    spec = psclient.TableSpec("d", 3, dynamic=True, init=psclient.constant(0.5))
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        table = pst.Embedding(session, spec)
        session.initialize()
        rows = table.lookup(client, np.array([[1, 2], [3, 1]], np.int64))
        assert isinstance(rows, torch.Tensor) and rows.shape == (2, 2, 3)
        np.testing.assert_array_equal(rows.numpy(), np.full((2, 2, 3), 0.5, np.float32))
        assert {t.name: t.rows for t in client.list_tables()} == {"d": 0}
        session.end()


def test_bad_arguments_are_refused_before_anything_is_sent(psd):
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        with pytest.raises(ValueError, match="no parameters"):
            pst.Parameters(session, torch.nn.ReLU(), optimizer=psclient.sgd(0.1))
        with pytest.raises(ValueError, match="init must be None, 'module' or a callable"):
            pst.Parameters(session, torch.nn.Linear(2, 2), optimizer=psclient.sgd(0.1), init="zeros")
        with pytest.raises(ValueError, match="float64.*float32"):
            pst.Parameters(session, torch.nn.Linear(2, 2).double(), optimizer=psclient.sgd(0.1))
        table = pst.Embedding(session, psclient.TableSpec("e", 2, rows=4))
        with pytest.raises(RuntimeError, match="before the pull"):
            table.rows()
        with pytest.raises(RuntimeError, match="set_ids"):
            pst.pull(session, table)  # no ids set: refused before the session pulls
        session.initialize()
        with pytest.raises(ValueError, match="int64 or uint64, not float64"):
            table.set_ids(np.array([1.0, 2.0]))
        with pytest.raises(psclient.RequestError):  # psd refuses an id outside the fixed table
            table.set_ids(np.array([1, 9], np.int64))
            session.pull()
        assert client.lookup_rows("e", np.arange(4)).shape == (4, 2)  # psd serves on
        session.end()


def test_the_ids_of_a_step_are_the_ones_pulled(psd):
    """set_ids() between the pull and the push is refused (the push would send this step's gradients
    for other ids), and the ids are copied: a loader refilling its buffer changes nothing."""
    spec = psclient.TableSpec("t", 2, rows=10, optimizer=psclient.RowOptimizerConfig.sgd(1.0),
                              init=psclient.constant(0.0))
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        table = pst.Embedding(session, spec)
        session.initialize()
        batch = torch.tensor([1, 2])
        table.set_ids(batch)
        pst.pull(session, table)
        batch.copy_(torch.tensor([7, 8]))  # the loader's next batch, in the same buffer
        with pytest.raises(RuntimeError, match="set_ids\\(\\) between the pull and the push"):
            table.set_ids(batch)
        pst.backward(table.rows().sum(), table)
        pst.push(session, table)
        rows = client.lookup_rows("t", np.array([1, 2, 7, 8], np.int64))
        np.testing.assert_array_equal(rows, [[-1, -1], [-1, -1], [0, 0], [0, 0]])
        table.set_ids(batch)  # after the push: the next step's
        session.end()


def test_a_step_without_backward_pushes_zeros_not_the_last_steps_gradients(psd):
    model = torch.nn.Linear(2, 1, bias=False)
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        params = pst.Parameters(session, model, optimizer=psclient.sgd(1.0), init=lambda *a: psclient.zeros())
        session.initialize()
        pst.pull(session, params)
        pst.backward(model(torch.tensor([[1.0, 2.0]])).sum(), params)
        pst.push(session, params)  # weight -= [1, 2]
        pst.pull(session, params)
        pst.push(session, params)  # a skipped batch: no backward
        np.testing.assert_array_equal(client.pull("weight"), [[-1.0, -2.0]])
        session.end()


def test_mistakes_in_binding_a_module_are_said_where_they_happen(psd):
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = chief_session(client)
        pst.Parameters(session, torch.nn.Linear(2, 2), optimizer=psclient.sgd(0.1))
        # A second module with the same names: refused at once, nothing bound.
        other = torch.nn.Linear(2, 2)
        before = other.weight.data_ptr()
        with pytest.raises(ValueError, match="already has a variable 'weight' \\(another Parameters\\? give each"):
            pst.Parameters(session, other, optimizer=psclient.sgd(0.1))
        assert other.weight.data_ptr() == before
        # Buffers stay on each worker: said.
        with pytest.warns(UserWarning, match="buffers \\(running_mean, running_var\\) stay on each worker"):
            pst.Parameters(session, torch.nn.BatchNorm1d(2), optimizer=psclient.sgd(0.1), prefix="bn/")
        # A module converted after binding no longer lives where pulls write: the next pull says so.
        moved = torch.nn.Linear(2, 2)
        params = pst.Parameters(session, moved, optimizer=psclient.sgd(0.1), prefix="moved/")
        session.initialize()
        moved.to(torch.float64)
        with pytest.raises(RuntimeError, match="'moved/weight' has moved out of the memory psd's pulls write"):
            pst.pull(session, params)


def test_a_push_after_a_pull_that_found_the_job_done_sends_nothing(psd):
    """A sync worker whose pull finds the job at its stop step (behind the others, or looping once
    more) pushes nothing: no step past train_steps."""
    model = torch.nn.Linear(2, 1, bias=False)
    with psclient.Client([psd.address], worker_index=0, is_chief=True) as client:
        session = psclient.TrainingSession(client, mode="sync", replicas_to_aggregate=1, total_replicas=1,
                                           train_steps=2, ready_timeout=30)
        params = pst.Parameters(session, model, optimizer=psclient.sgd(1.0), init=lambda *a: psclient.zeros())
        session.initialize()
        while not session.should_stop:
            pst.pull(session, params)
            pst.backward(model(torch.tensor([[1.0, 1.0]])).sum(), params)
            pst.push(session, params)
        pst.pull(session, params)  # once more: the job is at step 2, its stop step
        assert session.should_stop
        outcome = pst.push(session, params)
        assert outcome.stop
        assert client.stats()[0].global_step == 2
        np.testing.assert_array_equal(client.pull("weight"), [[-2.0, -2.0]])
