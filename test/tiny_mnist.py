"""Writes a small valid data set in the MNIST format (IDX files) to DIR.

  python3 test/tiny_mnist.py DIR [TRAIN_IMAGES] [TEST_IMAGES]

The pixels are a fixed pattern, the labels i % 10: enough for the trainers
to load, train and evaluate, fast, without the real data set.
"""
import os
import struct
import sys

d = sys.argv[1]
train = int(sys.argv[2]) if len(sys.argv) > 2 else 5100
test = int(sys.argv[3]) if len(sys.argv) > 3 else 100
os.makedirs(d, exist_ok=True)
for prefix, n in (("train", train), ("t10k", test)):
    with open(f"{d}/{prefix}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, n, 28, 28) + (bytes(range(256)) * (n * 784 // 256 + 1))[: n * 784])
    with open(f"{d}/{prefix}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
