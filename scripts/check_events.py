#!/usr/bin/env python3
"""Print the scalars of a TensorBoard event file (or every file in a logdir).

Reads with TensorBoard's own reader,
tensorboard.backend.event_processing.event_accumulator, when the tensorboard
package is importable (pip install tensorboard; Debian 12 does not package it).
Otherwise, or with --builtin, uses the small decoder below, which checks the
TFRecord framing and both masked CRC32Cs and decodes the few Event fields
SummaryWriter writes.

With --unique (built-in decoder), also fails (exit 1) when a tag is written
twice for one step, or for a step before one it was written for: what a
chart would show as a zigzag.

Usage: scripts/check_events.py [--builtin] [--unique] LOGDIR_OR_FILE
"""
import os
import struct
import sys


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    p = 0
    while p < len(data):
        if p + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {p}")
        (length,) = struct.unpack_from("<Q", data, p)
        (len_crc,) = struct.unpack_from("<I", data, p + 8)
        if masked(crc32c(data[p:p + 8])) != len_crc:
            raise ValueError(f"{path}: bad length crc at byte {p}")
        body = data[p + 12:p + 12 + length]
        if len(body) != length or p + 16 + length > len(data):
            raise ValueError(f"{path}: truncated record at byte {p}")
        (body_crc,) = struct.unpack_from("<I", data, p + 12 + length)
        if masked(crc32c(body)) != body_crc:
            raise ValueError(f"{path}: bad data crc at byte {p}")
        yield body
        p += 16 + length


def fields(msg):
    """Protobuf wire format -> list of (field, wire_type, value)."""
    out, p = [], 0

    def varint():
        nonlocal p
        v, shift = 0, 0
        while True:
            b = msg[p]
            p += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return v

    while p < len(msg):
        key = varint()
        field, wt = key >> 3, key & 7
        if wt == 0:
            out.append((field, wt, varint()))
        elif wt == 1:
            out.append((field, wt, msg[p:p + 8]))
            p += 8
        elif wt == 5:
            out.append((field, wt, msg[p:p + 4]))
            p += 4
        elif wt == 2:
            n = varint()
            out.append((field, wt, msg[p:p + n]))
            p += n
        else:
            raise ValueError(f"unsupported wire type {wt}")
    return out


def builtin_scalars(path):
    version = None
    for rec in records(path):
        wall, step, summary = 0.0, 0, None
        for field, wt, v in fields(rec):
            if field == 1 and wt == 1:
                (wall,) = struct.unpack("<d", v)
            elif field == 2 and wt == 0:
                step = v - (1 << 64) if v >= 1 << 63 else v
            elif field == 3 and wt == 2:
                version = v.decode()
            elif field == 5 and wt == 2:
                summary = v
        if summary is None:
            continue
        for field, wt, value in fields(summary):
            if field != 1 or wt != 2:
                continue
            tag, simple = None, None
            for f2, w2, v2 in fields(value):
                if f2 == 1 and w2 == 2:
                    tag = v2.decode()
                elif f2 == 2 and w2 == 5:
                    (simple,) = struct.unpack("<f", v2)
            if tag is not None and simple is not None:
                yield tag, step, wall, simple
    if version != "brain.Event:2":
        raise ValueError(f"{path}: file_version is {version!r}, expected 'brain.Event:2'")


def event_files(target):
    if os.path.isfile(target):
        return [target]
    found = sorted(os.path.join(d, f) for d, _, fs in os.walk(target)
                   for f in fs if "tfevents" in f)
    if not found:
        raise SystemExit(f"no event files under {target}")
    return found


def repeats(path):
    """(tag, step) pairs written again, or out of order, in one file."""
    last, bad = {}, []
    for tag, step, _, _ in builtin_scalars(path):
        if tag in last and step <= last[tag]:
            bad.append((tag, step))
        last[tag] = step
    return bad


def main(argv):
    unique = "--unique" in argv
    builtin = "--builtin" in argv or unique
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return
    args = [a for a in argv if a not in ("--builtin", "--unique")]
    if len(args) != 1:
        raise SystemExit(__doc__)
    accumulator = None
    if not builtin:
        try:
            from tensorboard.backend.event_processing import event_accumulator as accumulator
        except ImportError:
            print("tensorboard not importable: using the built-in decoder", file=sys.stderr)
    for path in event_files(args[0]):
        print(f"== {path}")
        if accumulator is not None:
            acc = accumulator.EventAccumulator(path, size_guidance={accumulator.SCALARS: 0})
            acc.Reload()
            for tag in acc.Tags()["scalars"]:
                for e in acc.Scalars(tag):
                    print(f"{tag}\tstep={e.step}\tvalue={e.value:.6g}\twall_time={e.wall_time:.3f}")
        else:
            for tag, step, wall, value in builtin_scalars(path):
                print(f"{tag}\tstep={step}\tvalue={value:.6g}\twall_time={wall:.3f}")
        if unique:
            bad = repeats(path)
            if bad:
                raise SystemExit(f"{path}: written again or out of order: " +
                                 ", ".join(f"{t} at step {s}" for t, s in bad))


if __name__ == "__main__":
    main(sys.argv[1:])
