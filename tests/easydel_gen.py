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
  easydel_gen.py SRC OUT --legacy [--shards N] [--no-tx]

--legacy writes the older save instead (EasyDeLState.save_state before the
TensorStore Checkpointer; easydel/infra/base_state.py and bridge's
_save_model_files through CheckpointManager.save_checkpoint):
  OUT/easydel-model.parameters       safetensors, the parameter tree's keys
                                     joined with ".", no metadata (safetensors'
                                     save_file), or with --shards N that many
                                     shard files and
  OUT/easydel-model.parameters.safetensors.index.json (the weight_map naming them)
  OUT/easydel-optstate.parameters    safetensors of the optimizer leaves in
                                     tree order, "param_{i}"
  OUT/easydel-optstate.structure     a pickle of the tree definition (here a
                                     plain tuple of the leaves' roles: Python's
                                     own pickle of record-shaped data)

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


def write_st(path, tensors):
    """A safetensors file as safetensors' save_file writes it (no metadata):
    data ordered by dtype size (largest first), then name; 8-byte padded header."""
    size = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}
    tensors = sorted(tensors, key=lambda t: (-size.get(t[1], 1), t[0]))
    header, off = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, raw in tensors:
            f.write(raw)


def legacy(a):
    import pickle
    params = [(name, dtype, shape, reader()) for name, dtype, shape, reader in tensors_of(a.src)]
    if a.shards <= 1:
        write_st(os.path.join(a.out, "easydel-model.parameters"), params)
    else:
        per = -(-len(params) // a.shards)
        weight_map = {}
        for k in range(a.shards):
            fn = f"easydel-model.parameters-{k + 1:05d}-of-{a.shards:05d}.safetensors"
            part = params[k * per:(k + 1) * per]
            write_st(os.path.join(a.out, fn), part)
            weight_map.update({p[0]: fn for p in part})
        with open(os.path.join(a.out, "easydel-model.parameters.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(len(p[3]) for p in params)}, "weight_map": weight_map}, f, indent=2)
    if not a.no_tx:  # optax adam leaves in tree order: count, mu..., nu...
        leaves = [("count", "I32", [], struct.pack("<i", a.step))]
        for slot in ("mu", "nu"):
            for name, dtype, shape, raw in params:
                leaves.append((f"{slot}:{name}", "F32", shape, bytes(len(raw) // 2 * 4 if dtype in ("BF16", "F16") else len(raw))))
        write_st(os.path.join(a.out, "easydel-optstate.parameters"),
                 [(f"param_{i}", dt, sh, raw) for i, (_, dt, sh, raw) in enumerate(leaves)])
        with open(os.path.join(a.out, "easydel-optstate.structure"), "wb") as f:
            pickle.dump((tuple(role for role, _, _, _ in leaves), a.step), f)
    cfg = os.path.join(a.src, "config.json")
    if os.path.exists(cfg):
        with open(cfg) as i, open(os.path.join(a.out, "config.json"), "w") as o:
            o.write(i.read())


def as_f32(dtype, raw):
    """A parameter's values as float32 (exact for BF16, F16 and F32)."""
    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype("<u4") << 16).view("<f4")
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype("<f4")
    if dtype == "F32":
        return np.frombuffer(raw, "<f4").copy()
    raise ValueError(f"no float32 view of {dtype} parameters")


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
    ap.add_argument("--legacy", action="store_true")
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out)
    if a.legacy:
        return legacy(a)
    model, tx = [], []
    for name, dtype, shape, reader in tensors_of(a.src):
        raw = reader()
        rel = "model/" + name.replace(".", "/")
        model.append(write_array(a.out, rel, dtype, shape, raw, chunking(shape, a.chunk_rows), a.slash))
        if not a.no_tx:  # optax adam: (ScaleByAdamState(count, mu, nu), EmptyState())
            # mu = the parameter as float32, nu = twice that: a slot that does
            # not follow its parameter's transforms exactly shows
            mu = as_f32(dtype, raw)
            for slot, v in (("mu", mu), ("nu", mu * 2)):
                rel = f"tx/0/{slot}/" + name.replace(".", "/")
                tx.append(write_array(a.out, rel, "F32", shape, v.tobytes(), chunking(shape, a.chunk_rows), a.slash))
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
