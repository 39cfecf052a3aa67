#!/usr/bin/python3
"""dcp_way.py — the PyTorch DCP side of bench/torch.sh (Debian's python3-torch).

    dcp_way.py write SRC.safetensors OUT_DIR RANKS
        A DCP save of SRC's tensors as FSDP2 shards them (every tensor split
        on dim 0 over RANKS ranks as torch.chunk does), written the way
        torch's FileSystemWriter writes it, by tests/dcp_gen.py's writer:
        __<rank>_0.distcp files holding a torch.save per chunk, and .metadata.
        Keys are "model.<name>".
    dcp_way.py consolidate DCP_DIR OUT.safetensors [--fsync]
        The Python way, as torch.distributed.checkpoint.format_utils'
        dcp_to_torch_save does it: the whole state dict assembled in memory
        (every chunk torch.load-ed from its byte range and copied into the
        full tensor), then written out (bench/torch_way.py's safetensors
        writer); names keep their "model." prefix.
"""
import io
import os
import pickle
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)
import dcp_gen  # noqa: E402  (registers torch's DCP classes under their module names)
import torch_way  # noqa: E402


def write(src, out, ranks):
    import warnings
    warnings.filterwarnings("ignore")
    tensors = torch_way.load_mapped(src)
    w = dcp_gen.Writer(ranks)
    for name, t in tensors.items():
        key = "model." + name
        if t.dim() == 0:
            w.add_tensor(0, key, t, (), (), dcp_gen.TensorProperties)
            continue
        for rank, (start, n) in enumerate(dcp_gen.chunk_ranges(t.shape[0], ranks)):
            w.add_tensor(rank, key, t, (start,) + (0,) * (t.dim() - 1), (n,) + tuple(t.shape[1:]),
                         dcp_gen.TensorProperties)
    w.write(out)


def consolidate(src, dst, fsync):
    with open(os.path.join(src, ".metadata"), "rb") as f:
        meta = pickle.load(f)
    state = {}
    for fqn, tm in meta.state_dict_metadata.items():
        if not isinstance(tm, dcp_gen.TensorStorageMetadata):
            continue
        full = torch.empty(tuple(tm.size), dtype=tm.properties.dtype)
        for i, chunk in enumerate(tm.chunks):
            info = meta.storage_data[dcp_gen.MetadataIndex(fqn, tuple(chunk.offsets), i)]
            with open(os.path.join(src, info.relative_path), "rb") as f:
                f.seek(info.offset)
                t = torch.load(io.BytesIO(f.read(info.length)))
            idx = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))
            if full.dim():
                full[idx].copy_(t)
            else:
                full.copy_(t)
        state[fqn] = full
    torch_way.save_safetensors(state, dst, fsync)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "write" and len(sys.argv) == 5:
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "consolidate" and len(sys.argv) in (4, 5):
        consolidate(sys.argv[2], sys.argv[3], sys.argv[4:] == ["--fsync"])
    else:
        sys.exit(__doc__)
