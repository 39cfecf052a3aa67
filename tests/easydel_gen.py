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
  easydel_gen.py SRC OUT --legacy [--shards N] [--no-tx] [--step N] [--flax 0.10|0.11]
      [--jaxlib xla_extension|_jax] [--step-form none|int|array] [--leaf-prefix plain|idx]
      [--extra] [--hostile global|reduce|count|missing|deep|numnodes]

--legacy writes the older save instead (EasyDeLState.save_state before the
TensorStore Checkpointer; easydel/infra/base_state.py and bridge's
_save_model_files through CheckpointManager.save_checkpoint):
  OUT/easydel-model.parameters       safetensors, the parameter tree's keys
                                     joined with ".", no metadata (safetensors'
                                     save_file), or with --shards N that many
                                     shard files and
  OUT/easydel-model.parameters.safetensors.index.json (the weight_map naming them)
  OUT/easydel-optstate.parameters    safetensors of optax adamw's leaves in
                                     tree order, "param_{i}" (--leaf-prefix idx:
                                     "param_idx_{i}", as from May 2025)
  OUT/easydel-optstate.structure     the pickled jax PyTreeDef of that state
                                     (and the step), written by Python's pickle
                                     of stand-ins with the real names (below):
                                     --flax picks nnx's VariableState (0.10) or
                                     Variable (0.11) leaves, --jaxlib the
                                     PyTreeDef's module, --step-form a bare
                                     treedef (January 2025), (treedef, int) or
                                     (treedef, jax Array); --extra adds a masked
                                     trace leaf that is no slot; --hostile
                                     writes one broken structure

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
    # zarr and numcodecs (~0.1 CPU-s to import) only for the TensorStore
    # saves: the older save (--legacy) writes safetensors and a pickle.
    import zarr
    from numcodecs import Zstd
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


# ---- the older save's optimizer structure ----
# EasyDeLState.save_state (easydel/infra/base_state.py, 2025) pickled
# jax.tree_util.tree_structure(opt_state) — with self.step as a pair from
# April 2025 — and wrote the leaves as "param_{i}" (later "param_idx_{i}").
# The stand-ins below have the real module and class names and the same
# reduce shapes, so Python's pickle writes the real GLOBAL / NEWOBJ / REDUCE /
# BUILD opcodes:
#  * PyTreeDef (jaxlib pytree.cc, PyTreeDef::ToPickle and __getstate__ /
#    __setstate__ in BuildPytreeSubmodule): object.__reduce_ex__ gives NEWOBJ
#    of the class with () and BUILD of (registry, traversal); the registry's
#    __reduce__ names jax._src.tree_util.default_registry; the traversal is one
#    (kind, arity, node_data, custom type, num_leaves, num_nodes) per node in
#    post-order (PyTreeDef::FlattenIntoImpl), kinds 0 leaf, 1 None, 2 tuple,
#    3 namedtuple (node_data: its class), 4 list, 5 dict (the sorted keys),
#    6 custom (node_data: the flatten's aux data; custom: the class).
#  * flax nnx (flax/nnx/statelib.py _state_flatten_with_keys: aux = the sorted
#    keys; flax 0.10 variablelib.py _variable_state_flatten: one child, aux =
#    (variable type, metadata items); flax 0.11: the Variable subclass itself,
#    aux = metadata items).
#  * optax states are NamedTuples (optax/_src/transform.py ScaleByAdamState,
#    optax/_src/base.py EmptyState): adamw's init is chain's tuple of them.
#  * a jax.Array step: ArrayImpl.__reduce__ (jax/_src/array.py) is
#    (_reconstruct_array, (fun, args, arr_state, {"weak_type": ...})) with
#    numpy's own ndarray __reduce__ parts.
def _fake_module(name, **attrs):
    import types
    parts = name.split(".")
    for k in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:k]), types.ModuleType(".".join(parts[:k])))
    m = sys.modules[name]
    for key, v in attrs.items():
        setattr(m, key, v)
        if isinstance(v, type) or callable(v):
            v.__module__, v.__qualname__ = name, key
    return m


def _stand_ins(jaxlib):
    import collections

    class PyTreeDef:
        def __init__(self, traversal):
            self.traversal = traversal

        def __getstate__(self):
            return (REGISTRY, self.traversal)

    class Registry:
        def __reduce__(self):
            return "default_registry"

    REGISTRY = Registry()
    REGISTRY.__module__ = "jax._src.tree_util"
    _fake_module("jax._src.tree_util", default_registry=REGISTRY)
    _fake_module(f"jaxlib.{jaxlib}.pytree", PyTreeDef=PyTreeDef)

    def _reconstruct_array(fun, args, arr_state, aval_state):
        raise RuntimeError("never called")

    class ArrayImpl:
        def __init__(self, value):
            self.value = value

        def __reduce__(self):
            fun, args, arr_state = self.value.__reduce__()
            return (_reconstruct_array, (fun, args, arr_state, {"weak_type": False}))

    _fake_module("jax._src.array", _reconstruct_array=_reconstruct_array, ArrayImpl=ArrayImpl)
    nt = {}
    for mod, name, fields in (("optax._src.transform", "ScaleByAdamState", "count mu nu"),
                              ("optax._src.base", "EmptyState", ""),
                              ("optax.transforms._accumulation", "TraceState", "trace"),
                              ("optax.transforms._masking", "MaskedState", "inner_state")):
        nt[name] = collections.namedtuple(name, fields)
        _fake_module(mod, **{name: nt[name]})
    flax = {}
    for mod, name in (("flax.nnx.statelib", "State"), ("flax.nnx.variablelib", "VariableState"),
                      ("flax.nnx.variablelib", "Param")):
        flax[name] = type(name, (), {})
        _fake_module(mod, **{name: flax[name]})
    return PyTreeDef, ArrayImpl, nt, flax


def _treedef(tree, flax_version, nt, flax):
    """(traversal, leaves) of a tree described as ("tuple", [..]), ("nt", name, [..]),
    ("state", {key: ..}), ("var", leaf), ("leaf", value), in PyTreeDef's post-order."""
    traversal, leaves = [], []

    def walk(x):
        n0, l0 = len(traversal), len(leaves)
        kind = x[0]
        if kind == "leaf":
            leaves.append(x[1])
            entry = (0, 0, None, None)
        elif kind == "tuple":
            for c in x[1]:
                walk(c)
            entry = (2, len(x[1]), None, None)
        elif kind == "nt":
            for c in x[2]:
                walk(c)
            entry = (3, len(x[2]), nt[x[1]], None)
        elif kind == "state":
            keys = sorted(x[1])
            for k in keys:
                walk(x[1][k])
            entry = (6, len(keys), tuple(keys), flax["State"])
        elif kind == "var":
            walk(x[1])
            metadata = ()
            if flax_version == "0.10":
                entry = (6, 1, (flax["Param"], metadata), flax["VariableState"])
            else:
                entry = (6, 1, metadata, flax["Param"])
        traversal.append(entry + (len(leaves) - l0, len(traversal) - n0 + 1))

    walk(tree)
    return traversal, leaves


def _param_tree(params, value):
    """The nnx State of the parameters (keys split at '.', list indexes as ints), leaves value(param)."""
    root = {}
    for p in params:
        node, parts = root, [int(c) if c.isdigit() else c for c in p[0].split(".")]
        for c in parts[:-1]:
            node = node.setdefault(c, {})
        node[parts[-1]] = ("var", ("leaf", value(p)))

    def to_state(d):
        return ("state", {k: v if isinstance(v, tuple) else to_state(v) for k, v in d.items()})
    return to_state(root)


def legacy_optimizer(a, params):
    """easydel-optstate.parameters and .structure of optax.adamw's state:
    (ScaleByAdamState(count, mu, nu), EmptyState(), EmptyState()), mu = the
    parameter as float32, nu = twice that (as the TensorStore save has them)."""
    import pickle
    PyTreeDef, ArrayImpl, nt, flax = _stand_ins(a.jaxlib)
    f32 = {p[0]: as_f32(p[1], p[3]) for p in params}
    count = ("leaf", ("I32", [], struct.pack("<i", a.step)))
    mu = _param_tree(params, lambda p: ("F32", p[2], f32[p[0]].tobytes()))
    nu = _param_tree(params, lambda p: ("F32", p[2], (f32[p[0]] * 2).tobytes()))
    parts = [("nt", "ScaleByAdamState", [count, mu, nu]), ("nt", "EmptyState", []), ("nt", "EmptyState", [])]
    if a.extra:  # a masked trace of one parameter with another shape: a leaf that is no slot
        first = params[0][0]
        trace = _param_tree([(first,)], lambda p: ("F32", [3], bytes(12)))
        parts.append(("nt", "MaskedState", [("nt", "TraceState", [trace])]))
    h = a.hostile
    if h == "missing":  # a parameter the model does not have
        mu[1]["nonexistent"] = ("state", {"kernel": ("var", ("leaf", ("F32", [2], bytes(8))))})
    tree = ("tuple", parts)
    if h == "deep":  # a nesting bomb: 100 one-tuples around the state
        for _ in range(100):
            tree = ("tuple", [tree])
    traversal, leaves = _treedef(tree, a.flax, nt, flax)
    if h == "numnodes":
        traversal[-1] = traversal[-1][:5] + (traversal[-1][5] + 1,)
    if h == "global":  # a namedtuple "class" that is a function outside the allow-list
        traversal[-2] = (3, 0, os.system) + traversal[-2][3:]
    if h == "count":  # one leaf fewer in the parameters file than in the structure
        leaves = leaves[:-1]
    td = PyTreeDef(traversal)
    if a.step_form == "none":
        obj = td
    elif a.step_form == "int":
        obj = (td, a.step)
    else:
        obj = (td, ArrayImpl(np.asarray(a.step, dtype=np.int32)))
    if h == "reduce":  # REDUCE of an allowed class that may not be called
        class Call:
            def __reduce__(self):
                return (nt["EmptyState"], ())
        obj = (td, Call())
    prefix = "param_idx_" if a.leaf_prefix == "idx" else "param_"
    write_st(os.path.join(a.out, "easydel-optstate.parameters"),
             [(f"{prefix}{i}", dt, sh, raw) for i, (dt, sh, raw) in enumerate(leaves)])
    with open(os.path.join(a.out, "easydel-optstate.structure"), "wb") as f:
        pickle.dump(obj, f)


def legacy(a):
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
    if not a.no_tx:
        legacy_optimizer(a, params)
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
    ap.add_argument("--flax", choices=("0.10", "0.11"), default="0.10")
    ap.add_argument("--jaxlib", choices=("xla_extension", "_jax"), default="_jax")
    ap.add_argument("--step-form", choices=("none", "int", "array"), default="array")
    ap.add_argument("--leaf-prefix", choices=("plain", "idx"), default="plain")
    ap.add_argument("--extra", action="store_true")
    ap.add_argument("--hostile", choices=("global", "reduce", "count", "missing", "deep", "numnodes"))
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
