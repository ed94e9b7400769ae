"""psclient.load_checkpoint against checkpoints that two real psd shards
wrote: every tensor, optimizer slot and table row as the shards held them
(compared with pulls and lookups, exactly), and a clear error where there
is no checkpoint."""

import numpy as np
import pytest

import psclient

DIM = 3


def test_load_checkpoint_gives_tensors_slots_and_rows_as_the_shards_held_them(start_psd, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    shards = [start_psd("--shard_index", str(i), "--num_shards", "2", "--checkpoint_dir", ckpt,
                        "--checkpoint_secs", "0") for i in range(2)]
    with psclient.Client([s.address for s in shards]) as client:
        client.create([psclient.TensorSpec("w", (5, 4), optimizer=psclient.adam(0.1),
                                           init=psclient.glorot_uniform(3)),
                       psclient.TensorSpec("b", (4,), optimizer=psclient.sgd(0.5))])
        client.create_tables([
            psclient.TableSpec("user", DIM, dynamic=True, init=psclient.uniform(-1, 1, seed=2),
                               optimizer=psclient.RowOptimizerConfig.adagrad(0.1)),
            psclient.TableSpec("item", DIM, rows=10, placement="div")])
        rng = np.random.default_rng(0)
        ids = np.array([7, -3, 2**40, 7, 11], np.int64)
        for _ in range(3):
            client.push({"w": rng.standard_normal((5, 4), dtype=np.float32),
                         "b": rng.standard_normal(4, dtype=np.float32)})
            client.push_rows("user", ids, rng.standard_normal((5, DIM), dtype=np.float32))
            client.push_rows("item", np.array([0, 9]), np.ones((2, DIM), np.float32))
        client.checkpoint()
        held = {"w": client.pull("w"), "b": client.pull("b")}
        user = client.lookup_rows("user", np.array([7, -3, 2**40, 11], np.int64))
        item = client.pull_rows("item", np.arange(10))

    m = psclient.load_checkpoint(ckpt)
    assert isinstance(m, psclient.RestoredModel)
    assert m.num_shards == 2 and len(m.files) == 2
    assert sorted(m.tensors) == ["b", "w"]
    np.testing.assert_array_equal(m.tensors["w"], held["w"])
    np.testing.assert_array_equal(m.tensors["b"], held["b"])
    assert m.tensors["w"].shape == (5, 4) and m.tensors["w"].dtype == np.float32
    assert [s.shape for s in m.tensor_slots["w"]] == [(5, 4), (5, 4)]  # Adam's m and v
    assert m.tensor_slots["b"] == []  # SGD keeps none
    assert np.all(m.tensor_slots["w"][1] > 0)  # v: squares of the gradients pushed

    t = m.tables["user"]
    assert isinstance(t, psclient.RestoredTable)
    assert t.spec.dynamic and t.spec.dim == DIM and t.version > 0
    assert t.ids.dtype == np.int64 and sorted(t.ids.tolist()) == sorted([7, -3, 2**40, 11])
    row_of = dict(zip(t.ids.tolist(), t.values))
    for k, i in enumerate([7, -3, 2**40, 11]):
        np.testing.assert_array_equal(row_of[i], user[k])
    assert len(t.slots) == 1 and t.slots[0].shape == (4, DIM) and np.all(t.slots[0] > 0.1)
    f = m.tables["item"]
    order = np.argsort(f.ids)
    np.testing.assert_array_equal(f.ids[order], np.arange(10))
    np.testing.assert_array_equal(f.values[order], item)


def test_load_checkpoint_of_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(psclient.CheckpointError, match=str(tmp_path)):
        psclient.load_checkpoint(str(tmp_path))
    assert issubclass(psclient.CheckpointError, psclient.Error)
