#!/usr/bin/python3
"""lora_ref.py — an independent numpy reference for ckpt's LoRA commands.

Shares no code with ckpt: safetensors are read with struct + json + numpy,
BF16 is widened by a bit shift, the update is computed in float64.

  lora_ref.py merge BASE ADAPTER MERGED [--scale S] [--unmerge]
      Every adapted weight of MERGED must be within one ulp of its dtype of
      W +- s * B @ A (transposed with fan_in_fan_out) computed in float64 and
      rounded once; every other tensor must be byte-identical to BASE's.
      ckpt computes in F32 (as the issue asks), whose own rounding error is
      bounded by e = (r + 2) * 2^-24 * (|W| + |s| * |B| @ |A|). Where W and the
      update nearly cancel, e exceeds half an ulp of the tiny result and no
      F32 computation can promise one ulp of it; such elements must instead
      be within e + one ulp of the exact value, and are counted apart.
  lora_ref.py roundtrip BASE MERGED BACK
      BACK (merge then unmerge) must equal BASE within the rounding of two
      casts: |W'' - W| <= ulp(W') + ulp(W'') for BF16/F16 (each cast rounds by
      half an ulp of its own result, plus the F32 error), and for F32 within
      1e-6 of the tensor's largest magnitude.
  lora_ref.py layout BASE_CONV MERGED_CONV ADAPTER_CONV --scale S
      For converted checkpoints (the base, the merged base, the adapter, same
      layout): on every rank, s * B_r @ A_r of each converted adapter module
      must equal MERGED_CONV - BASE_CONV of its weight within F32 rounding
      ((r + 2) * 2^-24 * (|W| + |s| * |B_r| @ |A_r|) plus an ulp of the
      result), and every weight without an adapter module must be unchanged.
      The base should be F32, so that rounding is all there is.

  lora_ref.py batch FILE
      Runs the checks listed in FILE, one command line per line, in one process.

Exits 0 and prints a summary line when every check holds, else prints the
first failures and exits 1.
"""
import json
import math
import os
import struct
import sys

import numpy as np

NP = {"F32": np.float32, "F64": np.float64, "F16": np.float16}


def read_file(path):
    """{name: (dtype, shape, raw bytes)} of one safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), data[8 + n + b:8 + n + e])
    return out


def read_dir(d, prefix="model"):
    index = os.path.join(d, prefix + ".safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = [prefix + ".safetensors"]
    out = {}
    for fn in files:
        out.update(read_file(os.path.join(d, fn)))
    return out


def to_f64(t):
    dt, shape, raw = t
    if dt == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(NP[dt]).newbyteorder("<")).astype(np.float64).reshape(shape)


def order_key(t):
    """Integers in the order of the values, one apart for neighbouring floats."""
    dt, shape, raw = t
    if dt in ("BF16", "F16"):
        b = np.frombuffer(raw, dtype="<u2").astype(np.int64)
        mag = b & 0x7FFF
        return np.where(b & 0x8000, -mag, mag).reshape(shape)
    b = np.frombuffer(raw, dtype="<u4").astype(np.int64)
    mag = b & 0x7FFFFFFF
    return np.where(b & 0x80000000, -mag, mag).reshape(shape)


def round_to(x64, dt):
    """float64 -> the bytes of dtype dt, rounded once to nearest-even."""
    if dt == "BF16":
        # float64 -> bf16 directly: round the float64 mantissa to 8 bits.
        m, e = np.frexp(x64)  # x = m * 2^e, 0.5 <= |m| < 1
        q = np.round(m * 256.0) / 256.0  # numpy rounds half to even
        y = np.ldexp(q, e).astype(np.float32)  # exact: 8 significant bits
        return (y.view(np.uint32) >> 16).astype("<u2").tobytes()
    return x64.astype(NP[dt]).astype(np.dtype(NP[dt]).newbyteorder("<")).tobytes()


def ulp(x64, dt):
    """The spacing of dtype dt at the magnitude of x (its smallest subnormal at 0)."""
    bits = {"BF16": (8, -133), "F16": (11, -24), "F32": (24, -149)}[dt]
    _, e = np.frexp(np.abs(x64))
    return np.ldexp(1.0, np.maximum(e - bits[0], bits[1]))


def adapter(d):
    cfg = json.load(open(os.path.join(d, "adapter_config.json")))
    tensors = read_dir(d, "adapter_model")
    mods = {}
    for name, t in tensors.items():
        pre, suf = "base_model.model.", None
        for s in (".lora_A.weight", ".lora_B.weight"):
            if name.endswith(s):
                suf = s
        assert name.startswith(pre) and suf, name
        mods.setdefault(name[len(pre):-len(suf)], {})[suf[6]] = to_f64(t)
    return cfg, mods


def module_scale(cfg, module, rank):
    def pattern(key):
        pat = cfg.get(key) or {}
        if module in pat:
            return pat[module]
        import re
        for k, v in pat.items():
            if re.match(rf"(.*\.)?({k})$", module):
                return v
        return None
    r = pattern("rank_pattern") or cfg["r"]
    alpha = pattern("alpha_pattern") or cfg["lora_alpha"]
    assert r == rank, (module, r, rank)
    return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def fail(msgs, msg):
    msgs.append(msg)
    if len(msgs) <= 10:
        print("FAIL: " + msg, file=sys.stderr)


def cmd_merge(base_dir, adapter_dir, merged_dir, scale, unmerge):
    base, merged = read_dir(base_dir), read_dir(merged_dir)
    cfg, mods = adapter(adapter_dir)
    errs = []
    cancel = elements = 0
    if set(base) != set(merged):
        fail(errs, f"tensor names differ: {sorted(set(base) ^ set(merged))[:5]}")
    worst = 0
    for name, t in sorted(base.items()):
        m = merged.get(name)
        if m is None:
            continue
        mod = mods.get(name[:-len(".weight")]) if name.endswith(".weight") else None
        if mod is None:
            if m != t:
                fail(errs, f"{name}: not adapted but changed")
            continue
        if m[0] != t[0] or m[1] != t[1]:
            fail(errs, f"{name}: dtype/shape changed")
            continue
        s = module_scale(cfg, name[:-len(".weight")], mod["A"].shape[0]) * scale * (-1 if unmerge else 1)
        delta = s * (mod["B"] @ mod["A"])
        if cfg.get("fan_in_fan_out"):
            delta = delta.T
        exact = to_f64(t) + delta
        want = (t[0], t[1], round_to(exact, t[0]))
        diff = np.abs(order_key(m) - order_key(want))
        bound_terms = np.abs(s) * (np.abs(mod["B"]) @ np.abs(mod["A"]))
        if cfg.get("fan_in_fan_out"):
            bound_terms = bound_terms.T
        e = (mod["A"].shape[0] + 2) * 2.0 ** -24 * (np.abs(to_f64(t)) + bound_terms)
        near = np.abs(to_f64(m) - exact) <= e + ulp(exact, t[0])
        bad = (diff > 1) & ~near
        worst = max(worst, int(np.where(diff > 1, 0, diff).max()))
        cancel += int(((diff > 1) & near).sum())
        elements += diff.size
        if bad.any():
            i = np.unravel_index(int(np.argmax(np.where(bad, diff, -1))), diff.shape)
            fail(errs, f"{name}: element {i} is {to_f64(m)[i]!r}, reference {to_f64(want)[i]!r} "
                       f"({int(diff[i])} ulp, F32 error bound {e[i]:.3g})")
    if errs:
        sys.exit(1)
    print(f"lora_ref merge: {len(mods)} modules, {elements} elements within {worst} ulp of the float64 reference"
          f" ({cancel} where W and the update cancel within the F32 error bound)")


def cmd_roundtrip(base_dir, back_dir, merged_dir):
    base, back = read_dir(base_dir), read_dir(back_dir)
    merged = read_dir(merged_dir)
    errs = []
    worst = 0.0
    for name, t in sorted(base.items()):
        b = back[name]
        if b == t:
            continue
        if t[0] == "F32":
            w = to_f64(t)
            err = float(np.abs(to_f64(b) - w).max() / max(np.abs(w).max(), 1e-30))
            worst = max(worst, err)
            if err > 1e-6:
                fail(errs, f"{name}: F32 round trip off by {err:.3g} of the largest magnitude")
        else:
            w, w2 = to_f64(t), to_f64(b)
            merged_v = to_f64(merged[name]) if merged else w2
            tol = ulp(merged_v, t[0]) + ulp(w2, t[0])
            ratio = float((np.abs(w2 - w) / tol).max())
            worst = max(worst, ratio)
            if ratio > 1:
                i = np.unravel_index(int((np.abs(w2 - w) / tol).argmax()), w.shape)
                fail(errs, f"{name}: element {i} came back {w2[i]!r}, was {w[i]!r} (merged {merged_v[i]!r})")
    if errs:
        sys.exit(1)
    f32 = base and next(iter(base.values()))[0] == "F32"
    print(f"lora_ref roundtrip: worst {worst:.3g} {'of the largest magnitude' if f32 else 'of ulp(W1) + ulp(W2)'}")


def rank_dirs(d):
    ranks = sorted(x for x in os.listdir(d) if x.startswith("tp_rank_"))
    return [os.path.join(d, x) for x in ranks] or [d]


def cmd_layout(base_dir, merged_dir, adapter_dir, scale):
    errs = []
    checked = 0
    worst = 0.0
    bdirs, mdirs, adirs = rank_dirs(base_dir), rank_dirs(merged_dir), rank_dirs(adapter_dir)
    if not (len(bdirs) == len(mdirs) == len(adirs)):
        sys.exit("lora_ref layout: the three checkpoints have different rank counts")
    cfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    for bd, md, ad in zip(bdirs, mdirs, adirs):
        base, merged = read_dir(bd), read_dir(md)
        _, mods = adapter_dir_rank(ad)
        covered = set()
        for module, ab in sorted(mods.items()):
            names = [n for n in (module + ".weight", module + ".weight_qkv") if n in base]
            if len(names) != 1:
                fail(errs, f"{ad}: adapter module {module} has no single weight in the converted base")
                continue
            name = names[0]
            covered.add(name)
            A, B = ab["A"], ab["B"]
            # The converted config keeps each module's scale: check it is the original's.
            s_conv = module_scale(cfg, module, A.shape[0])
            if abs(s_conv - scale) > 1e-6 * abs(scale):
                fail(errs, f"{module}: converted adapter_config.json gives scale {s_conv}, expected {scale}")
            got = to_f64(merged[name]) - to_f64(base[name])
            want = scale * (B @ A)
            if got.shape != want.shape:
                fail(errs, f"{ad}: {module}: update {want.shape} but weight {got.shape}")
                continue
            # F32 rounding of the merge: the sum over the rank and the add
            # (r + 2 roundings of the terms), then the subtraction here is exact.
            terms = np.abs(to_f64(base[name])) + abs(scale) * (np.abs(B) @ np.abs(A))
            tol = (A.shape[0] + 2) * 2.0 ** -24 * terms + ulp(to_f64(merged[name]), "F32")
            err = np.abs(got - want) / tol
            worst = max(worst, float(err.max()))
            if (np.abs(got - want) > tol).any():
                i = np.unravel_index(int((np.abs(got - want) - tol).argmax()), got.shape)
                fail(errs, f"{ad}: {module} element {i}: merged - base = {got[i]!r}, s * B_r @ A_r = {want[i]!r}")
            checked += 1
        for name in base:
            if name not in covered and base[name] != merged[name]:
                fail(errs, f"{bd}: {name} changed by the merge but has no adapter module")
    if errs:
        sys.exit(1)
    print(f"lora_ref layout: {checked} rank modules match, worst {worst:.3f} of the F32 tolerance")


def adapter_dir_rank(d):
    tensors = read_dir(d, "adapter_model")
    mods = {}
    for name, t in tensors.items():
        for s in (".lora_A.weight", ".lora_B.weight"):
            if name.endswith(s):
                mods.setdefault(name[len("base_model.model."):-len(s)], {})[s[6]] = to_f64(t)
    return None, mods


def main(argv):
    if argv[:1] == ["batch"] and len(argv) == 2:
        # One check per line of the file, in one process (numpy loads once).
        for line in open(argv[1]):
            if line.strip():
                try:
                    main(line.split())
                except SystemExit as e:
                    if e.code:
                        print(f"lora_ref.py: failed: {line.strip()}", file=sys.stderr)
                        raise
        return
    args = [a for a in argv if not a.startswith("--")]
    scale = 1.0
    if "--scale" in argv:
        scale = float(argv[argv.index("--scale") + 1])
        args.remove(argv[argv.index("--scale") + 1])
    if args[:1] == ["merge"] and len(args) == 4:
        cmd_merge(args[1], args[2], args[3], scale, "--unmerge" in argv)
    elif args[:1] == ["roundtrip"] and len(args) == 4:
        cmd_roundtrip(args[1], args[3], args[2])
    elif args[:1] == ["layout"] and len(args) == 4:
        cmd_layout(args[1], args[2], args[3], scale)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
