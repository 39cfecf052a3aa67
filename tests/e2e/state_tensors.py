#!/usr/bin/env python3
"""state_tensors.py — every tensor of a folder, however it is sharded, for the state tests.

  state_tensors.py DIR [--scale F]

Reads every *.safetensors file directly in DIR (stdlib only, no ckpt code) and
prints one line per tensor, sorted: "name dtype shape sha256-of-bytes". Two
folders holding the same tensors in different files or shards print the same
lines, so `diff` compares what a state holds, not how it is laid out.

--scale F multiplies F32 values by F before hashing (a "training step" the
test can predict), and prints F32 tensors' hashes of the scaled values.
"""
import glob
import hashlib
import json
import os
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        yield name, t["dtype"], t["shape"], data[base + b:base + e]


def main():
    args = sys.argv[1:]
    scale = None
    if "--scale" in args:
        i = args.index("--scale")
        scale = float(args[i + 1])
        del args[i:i + 2]
    (d,) = args
    lines = []
    for path in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        for name, dtype, shape, raw in tensors(path):
            if scale is not None and dtype == "F32":
                count = len(raw) // 4
                vals = struct.unpack(f"<{count}f", raw)
                raw = struct.pack(f"<{count}f", *(v * scale for v in vals))
            lines.append(f"{name} {dtype} {shape} {hashlib.sha256(raw).hexdigest()}")
    print("\n".join(sorted(lines)))


main()
