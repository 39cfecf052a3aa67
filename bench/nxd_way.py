#!/usr/bin/python3
"""nxd_way.py — the Python way of bench/nxd.sh (Debian's python3-torch).

    nxd_way.py consolidate SAVE OUT.safetensors [--fsync]

What optimum-cli neuron consolidate costs (optimum/neuron/models/training/
checkpointing.py consolidate_model_parallel_checkpoints): every TP rank file
of the stage torch.load-ed into memory, each tensor-parallel parameter
concatenated along its partition_dim from mp_metadata_pp_rank_0.json, then
the whole state dict written (bench/torch_way.py's safetensors writer).
The transformation specs (fused gate_up, GQA q/k/v) are not undone here: the
cost of undoing them is a few more copies of the same tensors, so this is a
lower bound of the Python way's time and memory. Plain (not xser) saves only.
"""
import glob
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_way  # noqa: E402


def consolidate(save, dst, fsync):
    shards = os.path.join(save, "shards")
    meta = json.load(open(os.path.join(shards, "mp_metadata_pp_rank_0.json")))["parameters"]
    files = sorted(glob.glob(os.path.join(shards, "model", "dp_rank_00_tp_rank_*_pp_rank_00.pt")))
    ranks = [torch.load(f, map_location="cpu") for f in files]
    out = {}
    for name, t in ranks[0].items():
        m = meta.get(name, {})
        if m.get("tensor_model_parallel"):
            out[name] = torch.cat([r[name] for r in ranks], dim=m.get("partition_dim", 0))
        else:
            out[name] = t
    torch_way.save_safetensors(out, dst, fsync)


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "consolidate":
        consolidate(sys.argv[2], sys.argv[3], sys.argv[4:] == ["--fsync"])
    else:
        sys.exit(__doc__)
