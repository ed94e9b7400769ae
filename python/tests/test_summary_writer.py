"""SummaryWriter writes TensorBoard event records with valid framing."""

import struct

import pytest

import psclient


def records(path):
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos + 12:pos + 12 + length])
        pos += 12 + length + 4
    assert pos == len(data)
    return out


def test_scalars_are_written(tmp_path):
    with psclient.SummaryWriter(str(tmp_path / "logs")) as summaries:
        summaries.add_scalar("loss", 0.25, 10)
        summaries.add_scalar("accuracy/test", 0.875, 20)
        path = summaries.path
    events = records(path)
    assert b"brain.Event:2" in events[0]
    assert len(events) == 3
    assert b"loss" in events[1] and struct.pack("<f", 0.25) in events[1]
    assert b"accuracy/test" in events[2] and struct.pack("<f", 0.875) in events[2]


def test_bad_logdir_is_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(psclient.ConfigError):
        psclient.SummaryWriter(str(blocker / "logs"))
