#!/usr/bin/python3
"""rank_spans.py — read, in file order, the source bytes one rank is made of.

    bench/rank_spans.py MODEL PLAN_JSON RANK

PLAN_JSON is `ckpt plan MODEL --layout L --tp N --json --parts`. For every
output tensor of rank RANK (and every replicated one, which each rank holds),
each part names a box of a source tensor (src_lo, and ext through axis_map);
its bytes in the source file run from the box's first element to its last.
A rank's row-parallel slice is a few columns of every row, so its span is the
whole tensor: the disk cannot hand over 1 KiB of each 8 KiB row faster than
the rows themselves (4 KiB reads of every other page, the page cache's unit,
ran 17 times slower than reading them all in order on the bench machine).

The spans, rounded out to 4 KiB pages and merged, are read with pread in
8 MiB pieces, file by file in order, and thrown away; the total is printed.
This is the reading any tool must do to write that rank from the original
layout: bench/large.sh adds a durable copy of the rank to it for the
baseline of `pull --rank`.
"""
import json
import os
import struct
import sys

PAGE = 4096
PIECE = 8 << 20
ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}


def headers(model):
    """{tensor name: (file path, data start, dtype, shape)} of every safetensors file."""
    out = {}
    for name in sorted(os.listdir(model)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(model, name)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            h = json.loads(f.read(n))
        for k, v in h.items():
            if k != "__metadata__":
                out[k] = (path, 8 + n + v["data_offsets"][0], v["dtype"], v["shape"])
    return out


def span(t, lo, ext):
    """Byte range [a, b) in its file of the box lo + ext of tensor t."""
    path, start, dtype, shape = t
    size = ITEMSIZE[dtype]
    first = last = 0
    for d in range(len(shape)):
        first = first * shape[d] + lo[d]
        last = last * shape[d] + lo[d] + ext[d] - 1
    return path, start + first * size, start + (last + 1) * size


def main(model, plan, rank):
    src = headers(model)
    spans = {}
    for t in plan["tensors"]:
        if t.get("rank") not in (None, rank):
            continue
        for p in t["parts"]:
            names = [p["src"]] if "src" in p else p["srcs"]
            for name in names:
                s = src[name]
                ext = [0] * len(s[3])
                for i, a in enumerate(p["axis_map"]):
                    ext[a] = p["ext"][i]
                lo = p["src_lo"]
                ext = [e if e else 1 for e in ext]  # an axis the part does not map: one index of it
                path, a, b = span(s, lo, ext)
                spans.setdefault(path, []).append((a // PAGE * PAGE, -(-b // PAGE) * PAGE))
    total = 0
    for path in sorted(spans):
        merged = []
        for a, b in sorted(spans[path]):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        fd = os.open(path, os.O_RDONLY)
        try:
            for a, b in merged:
                off = a
                while off < b:
                    got = len(os.pread(fd, min(PIECE, b - off), off))
                    if got == 0:
                        break
                    total += got
                    off += got
        finally:
            os.close(fd)
    print(total)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    with open(sys.argv[2]) as f:
        main(sys.argv[1], json.load(f), int(sys.argv[3]))
