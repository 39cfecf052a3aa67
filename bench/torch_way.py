#!/usr/bin/python3
"""torch_way.py — the torch side of bench/torch.sh (Debian's python3-torch).

    torch_way.py write SRC.safetensors OUT.bin
        torch.save of SRC's tensors as a state dict (the zip format torch has
        written since 1.6). The tensors are views of a memory map of SRC, so
        even the full-size model is written without holding it in RAM.
    torch_way.py convert IN.bin OUT.safetensors [--fsync]
        The Python way, as Hugging Face's conversion bot (safetensors'
        convert.py, convert_file) does it: torch.load the whole file, drop
        shared names, .contiguous(), write a safetensors file with
        {"format": "pt"}. The writer is a few lines here (Debian has no
        python3-safetensors): header JSON, 8-byte aligned, then the bytes.
    torch_way.py check A B
        Same tensor names, dtypes, shapes and bytes in A and B (each a
        .safetensors file or a folder of them: shards); layout may differ.
"""
import json
import mmap
import os
import struct
import sys

import torch

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def load_mapped(path):
    header, base = read_header(path)
    f = open(path, "rb")
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        buf = memoryview(m)[base + b:base + e]
        dt = DTYPES[t["dtype"]]
        flat = torch.frombuffer(buf, dtype=torch.uint8) if e > b else torch.empty(0, dtype=torch.uint8)
        out[name] = flat.view(dt).reshape(t["shape"])
    return out


def write(src, dst):
    import warnings
    warnings.filterwarnings("ignore")  # frombuffer over a read-only map: torch.save only reads it
    torch.save(load_mapped(src), dst)


def convert(src, dst, fsync):
    loaded = torch.load(src, map_location="cpu")
    if "state_dict" in loaded:
        loaded = loaded["state_dict"]
    seen = {}
    for name in list(loaded):
        ptr = loaded[name].data_ptr()
        if ptr in seen:
            loaded.pop(name)
        else:
            seen[ptr] = name
    save_safetensors({k: v.contiguous() for k, v in loaded.items()}, dst, fsync)


def save_safetensors(loaded, dst, fsync):
    """The state dict as one safetensors file, {"format": "pt"}, tensors in name order."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(loaded):
        t = loaded[name]
        n = t.numel() * t.element_size()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in sorted(loaded):
            t = loaded[name]
            if t.numel():
                f.write(t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes())
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def tensor_map(path):
    """name -> (dtype, shape, file, absolute begin, end) over a file, or every
    .safetensors file of a folder (shards)."""
    import glob
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    out = {}
    for f in files:
        h, base = read_header(f)
        for k, v in h.items():
            out[k] = (v["dtype"], v["shape"], f, base + v["data_offsets"][0], base + v["data_offsets"][1])
    return out


def check(a, b):
    ta, tb = tensor_map(a), tensor_map(b)
    if {k: v[:2] for k, v in ta.items()} != {k: v[:2] for k, v in tb.items()}:
        sys.exit(f"{a} and {b} hold different tensors")
    maps = {}
    def view(f):
        if f not in maps:
            fh = open(f, "rb")
            maps[f] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return maps[f]
    for name, (_, _, fa, xa, ya) in ta.items():
        _, _, fb, xb, yb = tb[name]
        if view(fa)[xa:ya] != view(fb)[xb:yb]:
            sys.exit(f"tensor {name} differs between {a} and {b}")
    print(f"same {len(ta)} tensors")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "write" and len(sys.argv) == 4:
        write(sys.argv[2], sys.argv[3])
    elif cmd == "convert" and len(sys.argv) in (4, 5):
        convert(sys.argv[2], sys.argv[3], sys.argv[4:] == ["--fsync"])
    elif cmd == "check" and len(sys.argv) == 4:
        check(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
