"""psclient.read_ctr / ctr_synthetic / roc_auc / log_loss: the features and
metrics of ctr_trainer (include/ps/ctr_data.h), as NumPy arrays; checked
against make_ctr_data's file, the layout's rules and float64 references."""

import math
import os
import pathlib
import subprocess

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
