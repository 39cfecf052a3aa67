#!/usr/bin/env python3
"""torch_gen.py — test checkpoints written by real torch.save (Debian's
python3-torch, 1.13), for the torch reader's tests (tests/e2e/test_torch.sh,
tests/unit/test_torch.c).

  torch_gen.py OUT      writes into OUT:
    llama/            a mini Llama (embed, q/k/v/o, gate/up/down, norms, tied
                      lm_head) as pytorch_model.bin (model.state_dict(), so an
                      OrderedDict with _metadata, bf16) + config.json
    sharded/          the same model in f32 as two .bin shards +
                      pytorch_model.bin.index.json, as transformers'
                      save_pretrained(safe_serialization=False) names them
    legacy/           the mini Llama in the legacy format
                      (_use_new_zipfile_serialization=False)
    wrapped.pt        {"state_dict": {...}, "epoch": 3, "optimizer": {...}} with
                      q/k/v saved as views at offsets of one fused storage
    wrapped_legacy.pt the same in the legacy format (the optimizer's tensor
                      is a storage of the file outside the state dict)
    model.pth         {"model": {...}} whose tensors are nn.Parameters
    proto4.pt         pickle protocol 4 (FRAME, MEMOIZE, SHORT_BINUNICODE)
    dtypes.bin        every dtype torch 1.13 has that safetensors holds
    transposed.pt     lm_head saved as w.t(), a permuted 3-d tensor, a bf16
                      transpose: read as views, copied by convert's plan
    strided.pt        w[:, ::2]: refused (not a permutation of a block)
    overlap.pt        a tensor and a different view of the same bytes: refused
  Beside each file F: F.expect.json = {"tensors": {name: {"dtype", "shape",
  "sha256"}}, "aliases": {removed: kept}} from torch itself: sha256 of
  t.contiguous() bytes (bf16 through .view(torch.int16)); aliases are the
  names sharing a storage, as the reader must report them.

  torch_gen.py --dump FILE  prints FILE's tensors the same way (torch.load).
"""
import collections
import hashlib
import json
import os
import sys

import torch

SAFE = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.complex64: "C64",
}


def tensor_bytes(t):
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    if t.dtype == torch.complex64:
        t = torch.view_as_real(t)
    return t.numpy().tobytes()


def describe(sd):
    out = {}
    for name, t in sd.items():
        out[name] = {"dtype": SAFE[t.dtype], "shape": list(t.shape),
                     "sha256": hashlib.sha256(tensor_bytes(t)).hexdigest()}
    return out


def aliases(sd):
    """Names sharing one storage and the same bytes: the kept one is the first
    in sorted order, but not lm_head.weight when another name is there."""
    groups = collections.defaultdict(list)
    for name, t in sd.items():
        key = (t.storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        groups[key].append(name)
    out = {}
    for names in groups.values():
        if len(names) < 2:
            continue
        names.sort(key=lambda n: (n == "lm_head.weight" or n.endswith(".lm_head.weight"), n))
        for n in names[1:]:
            out[n] = names[0]
    return out


def write(path, obj, sd, **kw):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch.save(obj, path, **kw)
    al = aliases(sd)
    with open(path + ".expect.json", "w") as f:
        json.dump({"tensors": describe(sd), "aliases": al}, f, indent=1, sort_keys=True)


CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 128, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def llama(dtype, gen):
    c = CONFIG
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd

    def w(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    sd = collections.OrderedDict()
    embed = w(v, h)
    sd["model.embed_tokens.weight"] = embed
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = w(h, h)
        sd[p + "self_attn.k_proj.weight"] = w(kv, h)
        sd[p + "self_attn.v_proj.weight"] = w(kv, h)
        sd[p + "self_attn.o_proj.weight"] = w(h, h)
        sd[p + "mlp.gate_proj.weight"] = w(inter, h)
        sd[p + "mlp.up_proj.weight"] = w(inter, h)
        sd[p + "mlp.down_proj.weight"] = w(h, inter)
        sd[p + "input_layernorm.weight"] = w(h)
        sd[p + "post_attention_layernorm.weight"] = w(h)
    sd["model.norm.weight"] = w(h)
    sd["lm_head.weight"] = embed  # tied: one storage, two names
    # model.state_dict() carries _metadata (pickled through BUILD)
    sd._metadata = collections.OrderedDict({"": {"version": 1}, "model": {"version": 1}})
    return sd


def sharded(out, gen):
    sd = llama(torch.float32, gen)
    names = list(sd.keys())
    half = len(names) // 2
    parts = [names[:half], names[half:]]
    weight_map, total = {}, 0
    for k, part in enumerate(parts):
        fname = f"pytorch_model-{k + 1:05d}-of-{len(parts):05d}.bin"
        shard = collections.OrderedDict((n, sd[n]) for n in part)
        # lm_head shares the embedding's storage but sits in the other shard:
        # torch.save writes that storage again into this file
        write(os.path.join(out, fname), shard, shard)
        for n in part:
            weight_map[n] = fname
            total += sd[n].numel() * sd[n].element_size()
    with open(os.path.join(out, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    with open(os.path.join(out, "expect.json"), "w") as f:
        json.dump({"tensors": describe(sd), "aliases": {}}, f, indent=1, sort_keys=True)
    cfg = dict(CONFIG, torch_dtype="float32")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main(out):
    gen = torch.Generator().manual_seed(16)
    sd = llama(torch.bfloat16, gen)
    write(os.path.join(out, "llama", "pytorch_model.bin"), sd, sd)
    with open(os.path.join(out, "llama", "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    write(os.path.join(out, "legacy", "pytorch_model.bin"), sd, sd, _use_new_zipfile_serialization=False)
    with open(os.path.join(out, "legacy", "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    sharded(os.path.join(out, "sharded"), gen)

    fused = torch.randn(128, 64, generator=gen)
    inner = collections.OrderedDict()
    inner["attn.q.weight"] = fused[0:64]     # a view at offset 0
    inner["attn.k.weight"] = fused[64:96]    # at an offset of 64 rows
    inner["attn.v.weight"] = fused[96:128]
    inner["norm.weight"] = torch.ones(64)
    inner["empty"] = torch.zeros(0, 4)
    inner["scalar"] = torch.tensor(2.5)
    opt = {"state": {0: {"step": 3, "exp_avg": torch.randn(64, generator=gen, dtype=torch.float64)}},
           "param_groups": [{"lr": 1e-3}]}
    write(os.path.join(out, "wrapped.pt"), {"state_dict": inner, "epoch": 3, "optimizer": opt}, inner)
    # legacy: the optimizer's storage lies between the state dict's in the file
    write(os.path.join(out, "wrapped_legacy.pt"), {"state_dict": inner, "epoch": 3, "optimizer": opt}, inner,
          _use_new_zipfile_serialization=False)

    params = collections.OrderedDict()
    params["linear.weight"] = torch.nn.Parameter(torch.randn(8, 4, generator=gen))
    params["linear.bias"] = torch.nn.Parameter(torch.randn(8, generator=gen), requires_grad=False)
    write(os.path.join(out, "model.pth"), {"model": params}, params)

    p4 = collections.OrderedDict(("layer.%d.w" % i, torch.randn(3, 5, generator=gen)) for i in range(4))
    write(os.path.join(out, "proto4.pt"), p4, p4, pickle_protocol=4)

    dt = collections.OrderedDict()
    for dtype, name in SAFE.items():
        if dtype.is_floating_point or dtype.is_complex:
            t = torch.randn(4, 6, generator=gen, dtype=torch.float64).to(dtype) if not dtype.is_complex else \
                torch.randn(4, 6, generator=gen, dtype=torch.complex64)
        elif dtype == torch.bool:
            t = torch.randn(4, 6, generator=gen) > 0
        else:
            t = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (4, 6), generator=gen).to(dtype)
        dt["t_" + name.lower()] = t
    write(os.path.join(out, "dtypes.bin"), dt, dt)

    w = torch.randn(16, 8, generator=gen)
    tr = collections.OrderedDict([("embed.weight", torch.randn(16, 8, generator=gen)),
                                  ("lm_head.weight", torch.randn(8, 16, generator=gen).t()),
                                  ("conv.weight", torch.randn(3, 4, 5, generator=gen).permute(2, 0, 1)),
                                  ("bf16.weight", torch.randn(6, 4, generator=gen).to(torch.bfloat16).t()),
                                  ("col", torch.randn(1, 7, generator=gen).t())])
    write(os.path.join(out, "transposed.pt"), tr, tr)
    strided = collections.OrderedDict([("every_other", w[:, ::2])])
    write(os.path.join(out, "strided.pt"), strided, strided)
    ov = collections.OrderedDict([("a", w), ("b", w[2:4])])
    write(os.path.join(out, "overlap.pt"), ov, ov)


def dump(path):
    sd = torch.load(path, map_location="cpu")
    if isinstance(sd, dict) and "state_dict" in sd:
        sd = sd["state_dict"]
    elif isinstance(sd, dict) and isinstance(sd.get("model"), dict):
        sd = sd["model"]
    json.dump({"tensors": describe(sd), "aliases": aliases(sd)}, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
