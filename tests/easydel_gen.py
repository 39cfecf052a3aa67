#!/usr/bin/python3
"""easydel_gen.py — writes an EasyDeL (eformer Checkpointer) TensorStore save
from a checkpoint in the `easydel` layout (`ckpt convert SRC X --layout easydel`),
with REAL zarr v2 arrays and the numcodecs Zstd compressor, laid out the way
EasyDeLState.save_state / eformer's tree_serialize_leaves / JAX's
array_serialization / TensorStore's zarr driver lay them out:

  OUT/tensorstore_index.json   {"format": "tensorstore", "version", "prefixes": {"model": [...], "tx": [...]}}
  OUT/model/<key with '.' as '/'>/.zarray + chunk files "i.j" (or "i/j")
  OUT/tx/...                   optimizer leaves (Adam mu/nu shaped like the params, a count)
  OUT/metadata.json, checkpoint_metadata.json, model_structure.json, tx_structure.json, config.json

  easydel_gen.py SRC OUT [--step N] [--chunk-rows R] [--slash] [--no-tx]

--chunk-rows R splits every array of rank >= 2 into chunks of R along the first
axis and, for 2-D arrays, about half the last axis (edge chunks included); the
default is one chunk per array, as JAX writes a fully replicated array.
--slash writes dimension_separator "/". bfloat16 arrays are written through
zarr as <u2 and their .zarray dtype then set to "bfloat16", as TensorStore
writes it (the chunk bytes are the same).

Needs Debian's python3-zarr and python3-numcodecs (run with /usr/bin/python3).
"""
import argparse
import base64
import json
import os
import struct
import sys

import numpy as np
import zarr
from numcodecs import Zstd

NP = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I64": "<i8", "I32": "<i4",
      "U8": "|u1", "I8": "|i1", "BOOL": "|b1", "U16": "<u2", "I16": "<i2"}
JAX = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64",
       "I32": "int32", "U8": "uint8", "I8": "int8", "BOOL": "bool", "U16": "uint16", "I16": "int16"}


def read_safetensors(path):
    """(name, dtype, shape, reader) per tensor; reader() reads its bytes (one tensor in memory at a time)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    base = 8 + n
    out = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]

        def reader(b=b, e=e):
            with open(path, "rb") as f:
                f.seek(base + b)
                return f.read(e - b)
        out.append((name, info["dtype"], info["shape"], reader))
    return out


def tensors_of(src):
    ix = os.path.join(src, "model.safetensors.index.json")
    files = sorted(set(json.load(open(ix))["weight_map"].values())) if os.path.exists(ix) else ["model.safetensors"]
    out = []
    for fn in files:
        out.extend(read_safetensors(os.path.join(src, fn)))
    return sorted(out, key=lambda t: t[0])


def write_array(out, rel, dtype, shape, raw, chunks, slash):
    arr = np.frombuffer(raw, dtype=NP[dtype]).reshape(shape) if shape else np.frombuffer(raw, dtype=NP[dtype]).reshape(())
    path = os.path.join(out, rel)
    z = zarr.open_array(zarr.DirectoryStore(path, dimension_separator="/" if slash else "."), mode="w",
                        shape=tuple(shape), chunks=tuple(chunks), dtype=NP[dtype], compressor=Zstd(level=1),
                        fill_value=None, order="C", write_empty_chunks=True)
    z[...] = arr
    meta_path = os.path.join(path, ".zarray")
    meta = json.load(open(meta_path))
    if dtype == "BF16":
        meta["dtype"] = "bfloat16"
    meta["dimension_separator"] = "/" if slash else "."
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return {"path": rel, "shape": list(shape), "dtype": JAX[dtype]}


def chunking(shape, rows):
    if not rows or len(shape) < 2:
        return [max(1, s) for s in shape]
    c = [max(1, s) for s in shape]
    c[0] = max(1, min(rows, shape[0]))
    if len(shape) == 2:
        c[1] = max(1, (shape[1] + 1) // 2)
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--step", type=int, default=1234)
    ap.add_argument("--chunk-rows", type=int, default=0)
    ap.add_argument("--slash", action="store_true")
    ap.add_argument("--no-tx", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out)
    model, tx = [], []
    for name, dtype, shape, reader in tensors_of(a.src):
        raw = reader()
        rel = "model/" + name.replace(".", "/")
        model.append(write_array(a.out, rel, dtype, shape, raw, chunking(shape, a.chunk_rows), a.slash))
        if not a.no_tx:  # optax adam: (ScaleByAdamState(count, mu, nu), EmptyState())
            zeros = bytes(len(raw) // 2 * 4 if dtype in ("BF16", "F16") else len(raw))
            for slot in ("mu", "nu"):
                rel = f"tx/0/{slot}/" + name.replace(".", "/")
                tx.append(write_array(a.out, rel, "F32", shape, zeros, chunking(shape, a.chunk_rows), a.slash))
    if not a.no_tx:
        tx.insert(0, write_array(a.out, "tx/0/count", "I32", [], struct.pack("<i", a.step), [], a.slash))
    index = {"format": "tensorstore", "version": "0.0.80", "prefixes": {"model": model}}
    if tx:
        index["prefixes"]["tx"] = tx
    with open(os.path.join(a.out, "tensorstore_index.json"), "w") as f:
        json.dump(index, f, indent=2)
    with open(os.path.join(a.out, "metadata.json"), "w") as f:
        json.dump({"step": a.step, "timestamp": "2026-01-01T00:00:00", "is_temporary": False,
                   "has_optimizer_state": not a.no_tx, "has_resume_model": True}, f)
    with open(os.path.join(a.out, "checkpoint_metadata.json"), "w") as f:
        json.dump({"version": "1.0", "timestamp": "2026-01-01T00:00:00", "checksum": {}, "array_metadata": {},
                   "framework_version": None, "custom_metadata": {"step": a.step}}, f)
    # The tree definitions are base64 pickles; a reader must never unpickle them.
    for prefix in ("model", "tx"):
        with open(os.path.join(a.out, f"{prefix}_structure.json"), "w") as f:
            json.dump({"treedef": base64.b64encode(b"not a pickle to run").decode()}, f)
    cfg = os.path.join(a.src, "config.json")
    if os.path.exists(cfg):
        with open(cfg) as i, open(os.path.join(a.out, "config.json"), "w") as o:
            o.write(i.read())


if __name__ == "__main__":
    sys.exit(main())
