"""psclient.read_ctr / read_ctr_share / ctr_synthetic / roc_auc / log_loss: the features and
metrics of ctr_trainer (include/ps/ctr_data.h), as NumPy arrays; checked
against make_ctr_data's file, the layout's rules and float64 references."""

import gzip
import math
import os
import pathlib
import signal
import subprocess
import tarfile
import threading
import time

import numpy as np
import pytest

import psclient


def make_ctr_data():
    build = pathlib.Path(os.environ.get("PSD_BIN", "build/server/psd")).resolve().parents[1]
    exe = build / "examples" / "make_ctr_data"
    if not os.access(exe, os.X_OK):
        pytest.fail(f"{exe} not found: build it (meson test sets PSD_BIN beside it)")
    return str(exe)


def test_a_generated_file_reads_as_the_generator_draws_it(tmp_path):
    path = tmp_path / "ctr.tsv"
    subprocess.run([make_ctr_data(), "--out", str(path), "--examples", "3000", "--seed", "7",
                    "--max_distinct", "5000", "--holdout", "0.2"], check=True, capture_output=True)
    read = psclient.read_ctr(str(path))
    opts = dict(seed=7, max_distinct=5000, holdout=0.2)
    train = psclient.ctr_synthetic(3000, part="train", **opts)
    held = psclient.ctr_synthetic(3000, part="holdout", **opts)
    assert len(train["labels"]) == 2400 and len(held["labels"]) == 600
    for key, dtype, width in (("labels", np.float32, None), ("dense", np.float32, 13), ("ids", np.uint64, 26),
                              ("wide_ids", np.uint64, 39)):
        assert read[key].dtype == dtype and train[key].dtype == dtype
        assert read[key].shape == ((3000,) if width is None else (3000, width))
        np.testing.assert_array_equal(read[key], np.concatenate([train[key], held[key]]))
    assert set(np.unique(read["labels"])) == {0.0, 1.0}
    np.testing.assert_array_equal(read["wide_ids"][:, :26], read["ids"])
    # A worker's share is every workers-th training example from its index on.
    share = psclient.ctr_synthetic(3000, part="train", worker=1, workers=3, **opts)
    np.testing.assert_array_equal(share["ids"], train["ids"][1::3])
    assert np.all((held["planted"] > 0) & (held["planted"] < 1))
    assert "planted" not in read
    assert len(psclient.read_ctr(str(path), max_examples=10)["labels"]) == 10


def test_features_follow_the_layout(tmp_path):
    # Two examples: example 1 has I1 = -3, I2 missing, C1 = C2 = 0000abcd, C3 missing;
    # example 2 has I1 = 7 and the same C1 value, another C2.
    cats1 = ["0000abcd", "0000abcd", ""] + ["00000001"] * 23
    cats2 = ["0000abcd", "12345678", "00000002"] + ["00000001"] * 23
    lines = ["0\t-3\t\t" + "\t".join(["0"] * 11) + "\t" + "\t".join(cats1),
             "1\t7\t" + "\t".join(["1"] * 12) + "\t" + "\t".join(cats2)]
    (tmp_path / "two.tsv").write_text("\n".join(lines) + "\n")
    d = psclient.read_ctr(str(tmp_path / "two.tsv"))
    np.testing.assert_array_equal(d["labels"], [0, 1])
    assert d["dense"][0, 0] == np.float32(-math.log1p(3)) and d["dense"][0, 1] == 0
    assert d["dense"][1, 0] == np.float32(math.log1p(7)) and d["dense"][1, 1] == np.float32(math.log1p(1))
    ids = d["ids"]
    assert ids[0, 0] == ids[1, 0]  # the same value of the same field
    assert ids[0, 0] != ids[0, 1]  # the same value in another field
    assert ids[0, 1] != ids[1, 1]
    assert ids[0, 2] not in (ids[1, 2], 0)  # a missing value has its own id
    assert len(set(ids[0].tolist())) == 26 and len(set(d["wide_ids"][0].tolist())) == 39


def reference_auc(labels, scores):
    """Mann-Whitney: the share of (positive, negative) pairs ranked right, ties half."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    right = sum(np.sum(p > neg) + 0.5 * np.sum(p == neg) for p in pos)
    return right / (len(pos) * len(neg))


def test_metrics_against_float64_references():
    rng = np.random.default_rng(3)
    labels = (rng.random(2000) < 0.3).astype(np.float32)
    scores = np.round(rng.random(2000) * 0.5 + labels * 0.2, 2)  # rounded: many ties
    assert psclient.roc_auc(labels, scores) == pytest.approx(reference_auc(labels, scores), abs=1e-12)
    p = np.clip(scores, 1e-15, 1 - 1e-15)
    want = -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    assert psclient.log_loss(labels, scores) == pytest.approx(want, rel=1e-12)
    assert psclient.roc_auc(labels, labels) == 1.0
    assert psclient.log_loss(labels, np.where(labels == 1, 1.0, 0.0)) == pytest.approx(1e-15, abs=1e-14)


@pytest.mark.parametrize("layout", ["criteo", "avazu"])
def test_a_workers_share_is_its_slice_of_the_file(tmp_path, layout):
    """read_ctr_share: every workers-th training example from the worker's index on, and the held-out
    tail, as read_ctr's whole file sliced; the same for a CSV in Avazu's layout (its header skipped)."""
    path = tmp_path / f"ctr.{layout}"
    subprocess.run([make_ctr_data(), "--out", str(path), "--examples", "2000", "--layout", layout,
                    "--max_distinct", "5000"], check=True, capture_output=True)
    every = psclient.read_ctr(str(path))
    assert len(every["labels"]) == 2000
    if layout == "avazu":  # no dense features; 21 fields, hour of day and weekday: 3 fields missing
        assert not every["dense"].any()
        assert len(np.unique(every["ids"][:, 25])) == 1 and len(np.unique(every["ids"][:, 0])) > 100
    end = round(2000 * 0.9)
    for worker in range(3):
        s = psclient.read_ctr_share(str(path), holdout=0.1, worker=worker, workers=3, keep_holdout=worker == 0)
        assert s["examples"] == 2000 and s["train_end"] == end
        for key in every:
            np.testing.assert_array_equal(s["train"][key], every[key][worker:end:3])
            if worker == 0:
                np.testing.assert_array_equal(s["holdout"][key], every[key][end:])
        assert worker == 0 or s["holdout"] is None
    held = psclient.read_ctr_share(str(path), keep_train=False, keep_holdout=True, max_examples=1000)
    assert held["train"] is None and held["examples"] == 1000 and held["train_end"] == 900
    np.testing.assert_array_equal(held["holdout"]["ids"], every["ids"][900:1000])
    whole = psclient.read_ctr_share(str(path), holdout=0.0)
    assert whole["train_end"] == 2000
    np.testing.assert_array_equal(whole["train"]["wide_ids"], every["wide_ids"])


def test_a_stream_gives_the_share_batch_by_batch(tmp_path):
    """CtrShareStream: the share read_ctr_share holds, in batches cut short at its end, then over again."""
    path = tmp_path / "ctr.csv"
    subprocess.run([make_ctr_data(), "--out", str(path), "--examples", "1000", "--layout", "avazu"], check=True,
                   capture_output=True)
    counted = psclient.read_ctr_share(str(path), holdout=0.1, worker=2, workers=3, keep_train=False)
    assert counted["train"] is None and counted["train_end"] == 900
    held = psclient.read_ctr_share(str(path), holdout=0.1, worker=2, workers=3)["train"]
    stream = psclient.CtrShareStream(str(path), 2, 3, counted["train_end"])
    assert stream.share_size == len(held["labels"]) == 300
    for start in (0, 128, 256, 0, 128):  # 300 = 128 + 128 + 44, then from the start again
        batch = stream.next(128)
        end = min(start + 128, 300)
        for key in held:
            np.testing.assert_array_equal(batch[key], held[key][start:end])
    # Threads sharing one stream take turns: every batch whole, the share's examples each read once a pass.
    shared = psclient.CtrShareStream(str(path), 2, 3, counted["train_end"])
    got = []
    pool = [threading.Thread(target=lambda: got.extend(shared.next(10)["ids"][:, 0] for _ in range(15)))
            for _ in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert len(got) == 60 and all(len(ids) == 10 for ids in got)  # 600 = two passes of 300
    assert sorted(np.concatenate(got).tolist()) == sorted(np.tile(held["ids"][:, 0], 2).tolist())
    with pytest.raises(psclient.ConfigError, match="no training examples"):
        psclient.CtrShareStream(str(path), 1, 2, 1)
    with pytest.raises(psclient.ConfigError, match="ended after 1000 examples, 2000 expected"):
        psclient.CtrShareStream(str(path), 0, 1, 2000).next(1500)


def test_a_gzip_file_reads_as_the_plain_one(tmp_path):
    """Files as downloaded (Criteo's day_N.gz, Avazu's train.gz): read_ctr and read_ctr_share decompress."""
    path = tmp_path / "ctr.csv"
    subprocess.run([make_ctr_data(), "--out", str(path), "--examples", "3000", "--layout", "avazu"], check=True,
                   capture_output=True)
    packed = tmp_path / "ctr.csv.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    plain, unpacked = psclient.read_ctr(str(path)), psclient.read_ctr(str(packed))
    for key in plain:
        np.testing.assert_array_equal(unpacked[key], plain[key])
    share = psclient.read_ctr_share(str(packed), worker=1, workers=2)
    assert share["train_end"] == 2700
    np.testing.assert_array_equal(share["train"]["wide_ids"], plain["wide_ids"][1:2700:2])
    (tmp_path / "cut.gz").write_bytes(packed.read_bytes()[:len(packed.read_bytes()) // 2])
    with pytest.raises(psclient.ConfigError, match=r"cut.gz:\d+: read error: unexpected end of file"):
        psclient.read_ctr(str(tmp_path / "cut.gz"))


def test_a_tar_archive_reads_as_its_training_member(tmp_path):
    """Criteo's dac.tar.gz as downloaded (readme.txt, train.txt, test.txt): its train.txt is read."""
    path = tmp_path / "train.txt"
    subprocess.run([make_ctr_data(), "--out", str(path), "--examples", "2000"], check=True, capture_output=True)
    (tmp_path / "readme.txt").write_text("Criteo's display-ads data\n")
    (tmp_path / "test.txt").write_text("no labels here\n")
    with tarfile.open(tmp_path / "dac.tar.gz", "w:gz") as tar:
        for name in ("readme.txt", "train.txt", "test.txt"):
            tar.add(tmp_path / name, arcname=name)
    plain, packed = psclient.read_ctr(str(path)), psclient.read_ctr(str(tmp_path / "dac.tar.gz"))
    for key in plain:
        np.testing.assert_array_equal(packed[key], plain[key])
    with tarfile.open(tmp_path / "other.tar", "w") as tar:
        tar.add(tmp_path / "readme.txt", arcname="readme.txt")
    with pytest.raises(psclient.ConfigError, match=r"a tar archive without a train.txt.*\(it holds: readme.txt\)"):
        psclient.read_ctr(str(tmp_path / "other.tar"))


def test_share_refusals(tmp_path):
    good = "1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26)
    (tmp_path / "bad.tsv").write_text(good + "\n1\tnot a number\n" + good + "\n")
    path = str(tmp_path / "bad.tsv")
    # Example 1 is worker 1's of 2: worker 0 does not parse it.
    assert len(psclient.read_ctr_share(path, holdout=0.0, worker=0, workers=2)["train"]["labels"]) == 2
    with pytest.raises(psclient.ConfigError, match="bad.tsv:2:"):
        psclient.read_ctr_share(path, holdout=0.0, worker=1, workers=2)
    with pytest.raises(ValueError, match="worker 2 of 2 workers"):
        psclient.read_ctr_share(path, worker=2, workers=2)
    with pytest.raises(ValueError, match="worker 0 of 0 workers"):
        psclient.read_ctr_share(path, workers=0)
    with pytest.raises(psclient.ConfigError, match="holdout must be in"):
        psclient.read_ctr_share(path, holdout=1.0)
    with pytest.raises(TypeError, match="progress must be callable"):
        psclient.read_ctr_share(path, progress=3)
    # Beyond the C++ int, refused rather than cut to another worker's numbers.
    with pytest.raises(ValueError, match="worker 4294967296 of 4294967297 workers"):
        psclient.read_ctr_share(path, worker=2**32, workers=2**32 + 1)
    with pytest.raises(ValueError, match="worker 0 of 4294967298 workers"):
        psclient.CtrShareStream(path, 0, 2**32 + 2, 3)
    with pytest.raises(ValueError, match="workers"):
        psclient.ctr_synthetic(100, worker=1, workers=2**63 - 1)
    (tmp_path / "test.csv").write_text("id,hour,C1\n1,14102100,1005\n")
    with pytest.raises(psclient.ConfigError, match="test.csv:1: CSV header has no 'click' column"):
        psclient.read_ctr_share(str(tmp_path / "test.csv"))


def test_a_draw_too_large_is_refused_and_ctrl_c_ends_a_long_one():
    with pytest.raises(psclient.ConfigError, match=r"ctr_synthetic\(1000000000000, part='train'\): "
                                                   r"900000000000 examples need .* GB in memory"):
        psclient.ctr_synthetic(10**12)
    # SIGINT a second in, as Ctrl-C would: a draw of many seconds stops. As many examples as
    # a quarter of this machine's memory holds (at about 816 bytes each), at most 20M (90 s here).
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    examples = min(20_000_000, memory // 4 // 816)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            psclient.ctr_synthetic(examples)
    finally:
        timer.cancel()  # a draw refused or ended early must not leave the signal to the next test
    assert time.monotonic() - start < 10


def test_refusals(tmp_path):
    with pytest.raises(psclient.ConfigError, match="nonexistent"):
        psclient.read_ctr(str(tmp_path / "nonexistent.tsv"))
    good = "1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26)
    (tmp_path / "bad.tsv").write_text(good + "\n1\tnot a number\n")
    with pytest.raises(psclient.ConfigError, match="bad.tsv:2:"):
        psclient.read_ctr(str(tmp_path / "bad.tsv"))
    with pytest.raises(ValueError, match="part must be 'train' or 'holdout'"):
        psclient.ctr_synthetic(100, part="test")
    with pytest.raises(ValueError, match="worker 3 of 3 workers"):
        psclient.ctr_synthetic(100, worker=3, workers=3)
    with pytest.raises(psclient.ConfigError):
        psclient.ctr_synthetic(100, holdout=1.5)
    with pytest.raises(ValueError, match="3 probabilities for 2 labels"):
        psclient.roc_auc(np.zeros(2, np.float32), np.zeros(3))
    with pytest.raises(ValueError, match="float32"):
        psclient.log_loss(np.zeros(2, np.float64), np.zeros(2))
