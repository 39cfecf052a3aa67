#!/usr/bin/env python3
"""dcp_gen.py — PyTorch Distributed Checkpoint (DCP) test data, written the
way torch's FileSystemWriter writes it, with Debian's python3-torch (1.13,
which has no torch.distributed.checkpoint).

  /usr/bin/python3 tests/dcp_gen.py OUT

What torch does, and what this file does the same way (torch source files
under torch/distributed/checkpoint/):
  - filesystem.py, _FileSystemWriter.prepare_global_plan / write_data: one
    file per rank, "__<rank>_0.distcp" (single_file_per_rank=True, one
    thread); _write_files_from_queue writes the rank's bytes items first,
    then its tensor items; _write_item writes a bytes item raw and a tensor
    item as torch.save(tensor) into the open stream, recording
    _StorageInfo(relative_path, offset, length) of the bytes it wrote.
    The tensor is the chunk itself, cloned (the loaders clone a tensor whose
    storage is larger than it), so its torch.save holds exactly its bytes;
    a chunk whose storage is exactly its size is saved as it is, strides and
    all (tp2d's column-major lm_head chunks).
  - default_planner.py, create_default_global_save_plan: state_dict_metadata
    {fqn: TensorStorageMetadata(properties, size, chunks) or
    BytesStorageMetadata()}; DefaultSavePlanner puts the flatten mappings
    {fqn: path tuple} in planner_data. _FileSystemWriter.finish sets
    storage_data {MetadataIndex(fqn, offsets, index): _StorageInfo} and
    storage_meta, and pickle.dump()s Metadata (the default protocol: 4 on
    Python 3.8-3.13) into ".metadata".
  - metadata.py: the dataclasses, with the module and qualified names
    pickle records. TensorProperties pickles its state as a tuple through
    __getstate__ (its memory format as the _MEM_FORMAT_ENCODING enum).
Two versions of the format are written:
  - fsdp/  the newest torch's (metadata.py holds TensorProperties and
           StorageMeta, Metadata has storage_meta and version, _StorageInfo
           drops its None transform_descriptors in __getstate__);
  - tp2d/  torch 2.1's (TensorProperties and MEM_FORMAT_ENCODING in
           torch.distributed._shard.sharded_tensor.metadata, Metadata of
           three fields, _StorageInfo without transform_descriptors).
The Python classes here have torch's module and qualified names (registered
in sys.modules under torch's module names), so the pickles are the bytes
torch's would be.

The model: a mini Llama with Llama-3's GQA structure (4 query heads, 2 KV
heads, head_dim 16, hidden 64, intermediate 176, vocab 250, 2 layers,
untied lm_head), saved as Accelerate / torch.distributed.checkpoint.state_dict
do: {"model": HF state dict, "optim": {"state": {fqn: {exp_avg, exp_avg_sq,
step}}, "param_groups": [...]}} flattened to "model.<hf name>" and
"optim.state.<hf name>.exp_avg" ..., plus torchtitan's "train_state.step"
(a 0-d tensor); non-tensors ("optim.param_groups.0.lr" ...) are bytes items
(torch.save of the value, default_planner.py transform_object).
  fsdp/   4 ranks, FSDP2 (fully_shard): every tensor split on dim 0 as
          torch.chunk does (vocab 250 -> 63, 63, 63, 61: an uneven last
          chunk); matrices bf16, norms f32; the optimizer's step is a 0-d
          tensor written once (rank 0).
  tp2d/   4 ranks as a 2 x 2 mesh (TP x FSDP): every matrix a grid of
          chunks, rows over one mesh axis and columns over the other (as
          row-parallel layers are saved under TP + FSDP); vectors split on
          dim 0 over the FSDP axis and deduplicated over TP (written by the
          first TP rank, _dedup_save_plans); all f32 but the embeddings
          (bf16); lm_head's chunks of TP rank 1 are column-major (a
          transposed shard, which torch saves as a strided view).
Beside each: <name>.expect.json = {"tensors": {hf name: {dtype, shape,
sha256}}, "optim": [...], "bytes": [...]} with the sha256 of each whole
tensor's bytes (bf16 through int16), which a consolidated checkpoint must
match byte for byte.
Hostile copies of fsdp/ under hostile/<case>/ (see HOSTILE below).
"""
import dataclasses
import enum
import hashlib
import io
import json
import os
import pathlib
import pickle
import shutil
import sys
import types
import uuid
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

META_MOD = "torch.distributed.checkpoint.metadata"
FS_MOD = "torch.distributed.checkpoint.filesystem"
SHARD_MOD = "torch.distributed._shard.sharded_tensor.metadata"


def _module(name):
    m = sys.modules.get(name)
    if m is None or not getattr(m, "_dcp_gen", False):
        m = types.ModuleType(name)
        m._dcp_gen = True
        sys.modules[name] = m
    return m


def _register(cls, modname, name=None):
    name = name or cls.__name__
    cls.__module__ = modname
    cls.__qualname__ = name
    cls.__name__ = name
    setattr(_module(modname), name, cls)
    return cls


# ---- metadata.py (newest) ----

@dataclass
class ChunkStorageMetadata:
    offsets: torch.Size
    sizes: torch.Size


class _MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


def _props_class(enum_cls):
    @dataclass
    class TensorProperties:
        dtype: torch.dtype = field(default_factory=torch.get_default_dtype)
        layout: torch.layout = field(default=torch.strided)
        requires_grad: bool = False
        memory_format: torch.memory_format = field(default=torch.contiguous_format)
        pin_memory: bool = False

        def __getstate__(self):
            # as torch: memory_format cannot be pickled, its enum is
            assert self.memory_format == torch.contiguous_format
            return (self.dtype, self.layout, self.requires_grad, enum_cls.TORCH_CONTIGUOUS_FORMAT, self.pin_memory)

        def __setstate__(self, state):
            self.dtype, self.layout, self.requires_grad, _, self.pin_memory = state
            self.memory_format = torch.contiguous_format

    return TensorProperties


TensorProperties = _props_class(_MEM_FORMAT_ENCODING)


@dataclass
class TensorStorageMetadata:
    properties: Any
    size: torch.Size
    chunks: List[ChunkStorageMetadata]


@dataclass
class BytesStorageMetadata:
    pass


@dataclass
class StorageMeta:
    checkpoint_id: Any = None
    save_id: Optional[str] = None
    load_id: Optional[str] = None
    modules: List[str] = field(default_factory=list)


@dataclass
class Metadata:
    state_dict_metadata: dict
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Optional[StorageMeta] = None
    version: Optional[str] = None


@dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: Optional[torch.Size] = None
    index: Optional[int] = field(hash=False, compare=False, default=None)

    def __init__(self, fqn, offset=None, index=None):
        object.__setattr__(self, "fqn", fqn)
        object.__setattr__(self, "index", index)
        if offset is not None:
            object.__setattr__(self, "offset", torch.Size(offset))


@dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int
    transform_descriptors: Optional[List[str]] = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


for _c in (ChunkStorageMetadata, _MEM_FORMAT_ENCODING, TensorProperties, TensorStorageMetadata, BytesStorageMetadata,
           StorageMeta, Metadata, MetadataIndex):
    _register(_c, META_MOD)
_register(_StorageInfo, FS_MOD)

# ---- torch 2.1's names ----


class MEM_FORMAT_ENCODING(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0
    TORCH_CHANNELS_LAST = 1
    TORCH_PRESERVE_FORMAT = 2


_register(MEM_FORMAT_ENCODING, SHARD_MOD)
TensorProperties21 = _register(_props_class(MEM_FORMAT_ENCODING), SHARD_MOD, "TensorProperties")


@dataclass
class Metadata21:
    state_dict_metadata: dict
    planner_data: Any = None
    storage_data: Any = None


@dataclass
class _StorageInfo21:
    relative_path: str
    offset: int
    length: int


# Registered under torch's names only while a torch 2.1 checkpoint is pickled.
def _use_21(on):
    if on:
        _register(Metadata21, META_MOD, "Metadata")
        _register(_StorageInfo21, FS_MOD, "_StorageInfo")
    else:
        _register(Metadata, META_MOD, "Metadata")
        _register(_StorageInfo, FS_MOD, "_StorageInfo")


# ---- the model ----

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 64, 4, 2, 16, 176, 250, 2


def llama_state(dtype_mat, dtype_vec, dtype_emb, seed):
    g = torch.Generator().manual_seed(seed)

    def t(shape, dt):
        return (torch.randn(*shape, generator=g) * 0.02).to(dt)

    sd = {"model.embed_tokens.weight": t((VOCAB, HIDDEN), dtype_emb)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = t((HEADS * HEAD_DIM, HIDDEN), dtype_mat)
        sd[p + "self_attn.k_proj.weight"] = t((KV_HEADS * HEAD_DIM, HIDDEN), dtype_mat)
        sd[p + "self_attn.v_proj.weight"] = t((KV_HEADS * HEAD_DIM, HIDDEN), dtype_mat)
        sd[p + "self_attn.o_proj.weight"] = t((HIDDEN, HEADS * HEAD_DIM), dtype_mat)
        sd[p + "mlp.gate_proj.weight"] = t((INTER, HIDDEN), dtype_mat)
        sd[p + "mlp.up_proj.weight"] = t((INTER, HIDDEN), dtype_mat)
        sd[p + "mlp.down_proj.weight"] = t((HIDDEN, INTER), dtype_mat)
        sd[p + "input_layernorm.weight"] = t((HIDDEN,), dtype_vec)
        sd[p + "post_attention_layernorm.weight"] = t((HIDDEN,), dtype_vec)
    sd["model.norm.weight"] = t((HIDDEN,), dtype_vec)
    sd["lm_head.weight"] = t((VOCAB, HIDDEN), dtype_emb)
    return sd


def optim_state(model, seed, params=("model.layers.0.self_attn.q_proj.weight", "model.norm.weight")):
    g = torch.Generator().manual_seed(seed)
    st = {}
    for name in params:
        w = model[name]
        st[f"optim.state.{name}.exp_avg"] = torch.randn(*w.shape, generator=g).float()
        st[f"optim.state.{name}.exp_avg_sq"] = torch.rand(*w.shape, generator=g).float()
        st[f"optim.state.{name}.step"] = torch.tensor(7.0)
    return st


def chunk_ranges(n, parts):
    """torch.chunk's split of n into `parts`: ceil-sized chunks, the last shorter."""
    size = -(-n // parts)
    out, start = [], 0
    while start < n:
        out.append((start, min(size, n - start)))
        start += size
    return out


def bytes_of(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


DTYPE_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


# ---- the writer ----

class Writer:
    """One DCP save: items per rank, then files and .metadata as torch writes them."""

    def __init__(self, nranks):
        self.items = [[] for _ in range(nranks)]  # (kind, fqn, data, chunk or None)
        self.md = {}
        self.mappings = {}

    def add_tensor(self, rank, fqn, full, offsets, sizes, props_cls, transposed=False):
        idx = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
        chunk = full[idx].clone() if full.dim() else full.clone()
        if transposed:  # column-major: its storage is exactly its size, so torch saves it as it is (a strided view)
            chunk = chunk.t().contiguous().t()
        tm = self.md.setdefault(fqn, TensorStorageMetadata(
            properties=props_cls(dtype=full.dtype), size=torch.Size(full.shape), chunks=[]))
        cm = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        index = len(tm.chunks)
        tm.chunks.append(cm)
        self.items[rank].append(("tensor", MetadataIndex(fqn, offsets, index), chunk))
        self.mappings[fqn] = tuple(fqn.split(".", 1)) if fqn.startswith(("model.",)) else tuple(fqn.split("."))

    def add_bytes(self, fqn, value):
        buf = io.BytesIO()
        torch.save(value, buf)
        self.md[fqn] = BytesStorageMetadata()
        self.items[0].append(("bytes", MetadataIndex(fqn), buf))
        self.mappings[fqn] = tuple(fqn.split("."))

    def write(self, out, v21=False):
        os.makedirs(out)
        storage = {}
        for rank, items in enumerate(self.items):
            name = f"__{rank}_0.distcp"
            with open(os.path.join(out, name), "wb") as f:
                for kind, index, data in [i for i in items if i[0] == "bytes"] + [i for i in items if i[0] == "tensor"]:
                    off = f.tell()
                    if kind == "bytes":
                        f.write(data.getbuffer())
                    else:
                        torch.save(data, f)
                    length = f.tell() - off
                    storage[index] = (_StorageInfo21 if v21 else _StorageInfo)(name, off, length)
        if v21:
            props = TensorProperties21
            for tm in self.md.values():
                if isinstance(tm, TensorStorageMetadata):
                    tm.properties = props(dtype=tm.properties.dtype)
            meta = Metadata21(state_dict_metadata=self.md, planner_data=self.mappings, storage_data=storage)
        else:
            meta = Metadata(state_dict_metadata=self.md, planner_data=self.mappings, storage_data=storage,
                            storage_meta=StorageMeta(checkpoint_id=pathlib.Path(out), save_id=str(uuid.UUID(int=7))))
        self.meta = meta
        write_metadata(out, meta, v21)


def write_metadata(out, meta, v21=False):
    _use_21(v21)
    try:
        with open(os.path.join(out, ".metadata"), "wb") as f:
            pickle.dump(meta, f)
    finally:
        _use_21(False)


def expect(model, extra, byte_names):
    doc = {"tensors": {}, "optim": sorted(extra), "bytes": sorted(byte_names), "optim_tensors": {}}
    for name, t in model.items():
        doc["tensors"][name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                                "sha256": hashlib.sha256(bytes_of(t)).hexdigest()}
    for name, t in extra.items():  # what --state makes slots of: "<param>/<slot>"
        if t.dim():
            param, slot = name[len("optim.state."):].rsplit(".", 1)
            doc["optim_tensors"][f"{param}/{slot}"] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                                                       "sha256": hashlib.sha256(bytes_of(t)).hexdigest()}
    return doc


def save(out, name, w, model, opt, v21=False):
    w.write(os.path.join(out, name), v21)
    with open(os.path.join(out, name + ".expect.json"), "w") as f:
        json.dump(expect(model, opt, [k for k, v in w.md.items() if isinstance(v, BytesStorageMetadata)]), f, indent=1)


def add_optim_bytes(w, props):
    # torchtitan's TrainState: the step as a 0-d tensor (training state, not model)
    w.add_tensor(0, "train_state.step", torch.tensor(1000, dtype=torch.int64), (), (), props)
    w.add_bytes("optim.param_groups.0.lr", 3e-4)
    w.add_bytes("optim.param_groups.0.betas", (0.9, 0.95))
    w.add_bytes("optim.param_groups.0.params", ["model.layers.0.self_attn.q_proj.weight", "model.norm.weight"])


def gen_fsdp(out):
    model = llama_state(torch.bfloat16, torch.float32, torch.bfloat16, seed=1)
    opt = optim_state(model, seed=2)
    w = Writer(4)
    for fqn, t in list(model.items()) + list(opt.items()):
        key = "model." + fqn if fqn in model else fqn
        if t.dim() == 0:
            w.add_tensor(0, key, t, (), (), TensorProperties)
            continue
        for rank, (start, n) in enumerate(chunk_ranges(t.shape[0], 4)):
            w.add_tensor(rank, key, t, (start,) + (0,) * (t.dim() - 1), (n,) + tuple(t.shape[1:]), TensorProperties)
    add_optim_bytes(w, TensorProperties)
    save(out, "fsdp", w, model, opt)
    return w


def gen_tp2d(out):
    model = llama_state(torch.float32, torch.float32, torch.bfloat16, seed=3)
    opt = optim_state(model, seed=4)
    w = Writer(4)
    for fqn, t in list(model.items()) + list(opt.items()):
        key = "model." + fqn if fqn in model else fqn
        if t.dim() == 0:
            w.add_tensor(0, key, t, (), (), TensorProperties21)
        elif t.dim() == 1:  # dp over dim 0; the tp replicas deduplicated: rank (tp 0, dp d) = d
            for d, (start, n) in enumerate(chunk_ranges(t.shape[0], 2)):
                w.add_tensor(d, key, t, (start,), (n,), TensorProperties21)
        else:  # rank = tp * 2 + dp: rows over dp, columns over tp
            for d, (r0, rn) in enumerate(chunk_ranges(t.shape[0], 2)):
                for tp, (c0, cn) in enumerate(chunk_ranges(t.shape[1], 2)):
                    w.add_tensor(tp * 2 + d, key, t, (r0, c0), (rn, cn), TensorProperties21,
                                 transposed=fqn == "lm_head.weight" and tp == 1)
    add_optim_bytes(w, TensorProperties21)
    save(out, "tp2d", w, model, opt, v21=True)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch dcp_pwned",))


def hostile(out, w):
    """Copies of fsdp/ each with one defect; each must be refused."""
    src = os.path.join(out, "fsdp")
    base = os.path.join(out, "hostile")
    os.makedirs(base)

    def case(name, edit=None, remove=None):
        d = os.path.join(base, name)
        shutil.copytree(src, d)
        if remove:
            os.unlink(os.path.join(d, remove))
        if edit:
            meta = pickle.loads(pickle.dumps(w.meta))
            edit(meta)
            write_metadata(d, meta)

    q = "model.model.embed_tokens.weight"

    def chunks(meta):
        return meta.state_dict_metadata[q].chunks

    def overlap(meta):  # chunk 1 starts one row early: it overlaps chunk 0
        c = chunks(meta)[1]
        old = MetadataIndex(q, c.offsets)
        c.offsets = torch.Size((c.offsets[0] - 1, 0))
        info = meta.storage_data.pop(old)
        meta.storage_data[MetadataIndex(q, c.offsets, 1)] = info

    def hole(meta):  # chunk 2 dropped: its rows are missing
        del chunks(meta)[2]

    def outside(meta):  # a chunk's range runs past the end of its file
        k = MetadataIndex(q, chunks(meta)[3].offsets)
        meta.storage_data[k].length += 1 << 20

    def escape(meta):
        k = MetadataIndex(q, chunks(meta)[0].offsets)
        meta.storage_data[k].relative_path = "../fsdp/__0_0.distcp"

    def slash(meta):
        k = MetadataIndex(q, chunks(meta)[0].offsets)
        meta.storage_data[k].relative_path = "/etc/passwd"

    def global_(meta):
        meta.planner_data = {"x": _Evil()}

    def dtype(meta):  # the metadata says f32, the chunks hold bf16
        meta.state_dict_metadata[q].properties.dtype = torch.float32

    def shape(meta):  # chunks 0 and 3 point at each other's torch.save: shapes [61, 64] / [63, 64] disagree
        k0, k3 = (MetadataIndex(q, chunks(meta)[i].offsets) for i in (0, 3))
        meta.storage_data[k0], meta.storage_data[k3] = meta.storage_data[k3], meta.storage_data[k0]

    def zstd(meta):  # as FileSystemWriter(_extensions=[ZStandard()]) records a compressed item (_extension.py)
        k = MetadataIndex(q, chunks(meta)[1].offsets)
        meta.storage_data[k].transform_descriptors = ["stream.zstd/1"]

    case("no_metadata", remove=".metadata")
    case("no_distcp", remove="__2_0.distcp")
    case("overlap", overlap)
    case("hole", hole)
    case("outside", outside)
    case("escape", escape)
    case("slash", slash)
    case("global", global_)
    case("dtype", dtype)
    case("shape", shape)
    case("zstd", zstd)


HOSTILE = ["no_metadata", "no_distcp", "overlap", "hole", "outside", "escape", "slash", "global", "dtype", "shape", "zstd"]


def main(out):
    os.makedirs(out, exist_ok=True)
    w = gen_fsdp(out)
    gen_tp2d(out)
    hostile(out, w)


if __name__ == "__main__":
    main(sys.argv[1])
