#!/usr/bin/env python3
"""lora_gen.py — writes a PEFT LoRA adapter for a base checkpoint (stdlib only).

  lora_gen.py BASE OUT --targets q_proj,v_proj [--rank R] [--alpha A] [--rslora]
              [--fan-in-fan-out] [--dtype f32|bf16] [--seed K]
              [--set KEY=JSON ...] [--unset KEY ...] [--bad-shape] [--drop-b]

Reads only the safetensors headers of BASE (a folder with model.safetensors or
shards + model.safetensors.index.json) and, for every 2-D "<module>.weight"
whose module matches a target (PEFT's rule: the name or a ".name" suffix),
writes base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight
[out, r] ([in, out] weights with --fan-in-fan-out) into OUT/adapter_model.safetensors,
and OUT/adapter_config.json as PEFT saves it.

The file is written the way the reference safetensors writer does (metadata
{"format": "pt"} first, tensors by dtype then name, compact JSON padded with
spaces to 8 bytes), so a byte comparison with a rebuilt adapter is fair.
Values are random, magnitude 2^-7 .. 2^-5 with a random sign, from --seed.

Test helpers: --set/--unset edit adapter_config.json (KEY=JSON), --bad-shape
gives the first module's lora_A one input column too many, --drop-b leaves out
the first module's lora_B.
"""
import argparse
import json
import os
import random
import struct
import sys

DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
               "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
               "F64", "I64", "U64"]


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def base_tensors(base):
    index = os.path.join(base, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for fn in files:
        out.update(read_header(os.path.join(base, fn)))
    return out


def targeted(module, targets):
    return any(module == t or module.endswith("." + t) for t in targets)


def random_values(rng, n, dtype):
    """n values as bytes: sign random, exponent 120..121 (F32 bias 127), mantissa random."""
    high = bytes(0x3C | (b & 0x80) for b in rng.randbytes(n))
    if dtype == "BF16":
        buf = bytearray(2 * n)
        buf[0::2] = rng.randbytes(n)
        buf[1::2] = high
    else:
        buf = bytearray(4 * n)
        low = rng.randbytes(3 * n)
        buf[0::4] = low[0::3]
        buf[1::4] = low[1::3]
        buf[2::4] = low[2::3]
        buf[3::4] = high
    return bytes(buf)


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)}, written as the reference writer does."""
    order = sorted(tensors, key=lambda k: (-DTYPE_ORDER.index(tensors[k][0]), k))
    header = {"__metadata__": {"format": "pt"}}
    pos = 0
    for k in order:
        dt, shape, data = tensors[k]
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for k in order:
            f.write(tensors[k][2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("out")
    ap.add_argument("--targets", required=True)
    ap.add_argument("--rank", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=8)
    ap.add_argument("--rslora", action="store_true")
    ap.add_argument("--fan-in-fan-out", action="store_true")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--unset", action="append", default=[])
    ap.add_argument("--bad-shape", action="store_true")
    ap.add_argument("--drop-b", action="store_true")
    a = ap.parse_args()

    targets = a.targets.split(",")
    dt = a.dtype.upper()
    rng = random.Random(a.seed)
    es = 2 if dt == "BF16" else 4
    tensors = {}
    first = True
    for name, info in sorted(base_tensors(a.base).items()):
        if not name.endswith(".weight") or len(info["shape"]) != 2:
            continue
        module = name[: -len(".weight")]
        if not targeted(module, targets):
            continue
        rows, cols = info["shape"]
        out_f, in_f = (cols, rows) if a.fan_in_fan_out else (rows, cols)
        if a.bad_shape and first:
            in_f += 1
        pre = "base_model.model." + module
        tensors[pre + ".lora_A.weight"] = (dt, (a.rank, in_f), random_values(rng, a.rank * in_f, dt))
        if not (a.drop_b and first):
            tensors[pre + ".lora_B.weight"] = (dt, (out_f, a.rank), random_values(rng, out_f * a.rank, dt))
        first = False
    if not tensors:
        sys.exit(f"lora_gen: no weight of {a.base} matches {targets}")

    alpha = int(a.alpha) if a.alpha == int(a.alpha) else a.alpha
    config = {
        "alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": a.base, "bias": "none",
        "fan_in_fan_out": a.fan_in_fan_out, "inference_mode": True, "init_lora_weights": True,
        "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": alpha,
        "lora_dropout": 0.05, "megatron_config": None, "megatron_core": "megatron.core",
        "modules_to_save": None, "peft_type": "LORA", "r": a.rank, "rank_pattern": {}, "revision": None,
        "target_modules": targets, "task_type": "CAUSAL_LM", "use_dora": False, "use_rslora": a.rslora,
    }
    for kv in a.set:
        k, v = kv.split("=", 1)
        config[k] = json.loads(v)
    for k in a.unset:
        config.pop(k, None)
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "adapter_model.safetensors"), tensors)
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
