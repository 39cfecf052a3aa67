#!/usr/bin/python3
"""neuron_convert.py — the baseline for `make bench`: a straightforward
Python/numpy conversion of a Hugging Face checkpoint (Llama, Mistral, Qwen2
families: dense MLP) into the Neuron tensor-parallel layout, the way people
do it today: load every tensor into memory, slice and concatenate with numpy,
save one safetensors file per rank.

    neuron_convert.py SRC DST --tp N [--kv-size-multiplier M] [--fsync]
    neuron_convert.py --check PY_DST CKPT_DST

It produces the same tensors as `ckpt convert SRC DST --layout neuron --tp N`
(docs/transforms.md §4 and §5, transform/presets.c):
  - model.layers.N.self_attn.qkv_proj.weight_qkv = [Q_r; K_r; V_r] with the
    GQA head selection of docs/transforms.md §4 (default m = tp / gcd(KV, tp)),
    query heads padded with zero heads at the end of each KV group when
    needed; biases likewise as qkv_proj.bias_qkv; o_proj.weight columns of
    Q_r's heads, same order;
  - mlp.gate_up_proj.weight = [gate block r; up block r] (intermediate size
    padded to a multiple of tp); mlp.down_proj.weight split on axis 1;
  - embed_tokens.weight and lm_head.weight split on axis 0, vocabulary padded
    to a multiple of tp;
  - every other tensor (norms) replicated, name unchanged.
Output: DST/tp_rank_00 .. DST/tp_rank_{N-1}/model.safetensors (DST itself for
--tp 1) and config.json. No ckpt-layout.json: this is only the baseline.

--check compares, for every rank folder, each tensor of PY_DST with the
tensor of the same name in CKPT_DST (which may be sharded): same set of
names, dtypes, shapes and bytes. Mismatches are listed; the exit status is 1
when there is any.

numpy has no bfloat16, and nothing here does arithmetic, so every tensor is
handled as unsigned integers of its element size (bf16/f16 as uint16, f32 as
uint32): slicing, concatenation and zero padding are then exact bit copies.
Run with /usr/bin/python3 (Debian's python3-numpy, `make deps`).
"""
import glob
import json
import math
import os
import re
import struct
import sys

import numpy as np

DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
NP_BITS = {1: np.uint8, 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


def die(msg):
    sys.stderr.write("neuron_convert.py: %s\n" % msg)
    sys.exit(1)


# ---- safetensors, minimal -------------------------------------------------

def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def load_file(path):
    """All tensors of one safetensors file: {name: (dtype_name, ndarray)}."""
    header, base = read_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            dt = info["dtype"]
            if dt not in DTYPE_SIZE:
                die("%s: tensor %s has unsupported dtype %s" % (path, name, dt))
            b, e = info["data_offsets"]
            es = DTYPE_SIZE[dt]
            f.seek(base + b)
            arr = np.fromfile(f, dtype=NP_BITS[es], count=(e - b) // es)
            out[name] = (dt, arr.reshape(info["shape"]))
    return out


def weight_files(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(d, n) for n in names]
    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    if not files:
        die("%s: no safetensors files" % d)
    return files


def load_dir(d):
    tensors = {}
    for path in weight_files(d):
        tensors.update(load_file(path))
    return tensors


def save_file(path, tensors, fsync=False):
    """tensors: {name: (dtype_name, ndarray)}; writes a safetensors file."""
    header, off = {}, 0
    names = sorted(tensors)
    for name in names:
        dt, arr = tensors[name]
        n = arr.size * DTYPE_SIZE[dt]
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name in names:
            np.ascontiguousarray(tensors[name][1]).tofile(f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


# ---- the conversion --------------------------------------------------------

def pad_split(arr, axis, tp):
    """Pads `axis` with zeros to a multiple of tp and cuts tp equal blocks
    (docs/transforms.md §5)."""
    length = arr.shape[axis]
    padded = -(-length // tp) * tp
    if padded != length:
        widths = [(0, 0)] * arr.ndim
        widths[axis] = (0, padded - length)
        arr = np.pad(arr, widths)
    return np.split(arr, tp, axis=axis)


class Gqa:
    """The head selection of docs/transforms.md §4 (as transform/rule_gqa.c computes it)."""

    def __init__(self, heads, kv_heads, head_dim, tp, kv_mult=None):
        if heads % kv_heads:
            die("num_attention_heads %d is not a multiple of num_key_value_heads %d" % (heads, kv_heads))
        self.H, self.KV, self.hd, self.tp = heads, kv_heads, head_dim, tp
        self.m = kv_mult or tp // math.gcd(kv_heads, tp)
        if tp % self.m or (kv_heads * self.m) % tp:
            die("kv_size_multiplier %d does not fit tp %d with %d KV heads" % (self.m, tp, kv_heads))
        self.G = heads // kv_heads
        self.Gp = self.G  # query heads per group after padding
        while self.Gp % self.m or (kv_heads * self.Gp) % tp:
            self.Gp += 1
        self.kpr = kv_heads * self.m // tp
        self.gpr = self.Gp // self.m

    def rank_heads(self, r):
        """(query heads, KV heads) of rank r; a query head of -1 is a zero head."""
        q, kv = [], []
        for j in range(self.kpr):
            p = r * self.kpr + j
            g, c = p % self.KV, p // self.KV
            kv.append(g)
            for i in range(self.gpr):
                w = c * self.gpr + i
                q.append(g * self.G + w if w < self.G else -1)
        return q, kv

    def gather(self, arr, axis, heads):
        """Concatenates the head_dim-long blocks `heads` of arr along axis."""
        blocks = []
        for h in heads:
            if h < 0:
                shape = list(arr.shape)
                shape[axis] = self.hd
                blocks.append(np.zeros(shape, dtype=arr.dtype))
            else:
                idx = [slice(None)] * arr.ndim
                idx[axis] = slice(h * self.hd, (h + 1) * self.hd)
                blocks.append(arr[tuple(idx)])
        return np.concatenate(blocks, axis=axis)


def convert(sd, cfg, tp, kv_mult=None):
    """Yields (rank, {name: (dtype, array)}) for every rank."""
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    if any(".experts." in n for n in sd):
        die("mixture-of-experts checkpoints are not handled by this baseline")
    gqa = Gqa(heads, kv_heads, head_dim, tp, kv_mult)
    attn = sorted(m.group(1) for m in (re.match(r"^(.*\.self_attn)\.q_proj\.weight$", n) for n in sd) if m)
    mlps = sorted(m.group(1) for m in (re.match(r"^(.*\.mlp)\.gate_proj\.weight$", n) for n in sd) if m)
    used = set()
    per_rank = [dict() for _ in range(tp)]

    def put(name, dt, arrays):
        for r in range(tp):
            per_rank[r][name] = (dt, arrays[r])

    for pre in attn:
        names = {k: "%s.%s_proj.%s" % (pre, k[0], "bias" if k.endswith("b") else "weight")
                 for k in ("q", "k", "v", "o", "qb", "kb", "vb")}
        for k in ("q", "k", "v", "o"):
            if names[k] not in sd:
                die("missing tensor %s" % names[k])
        has_bias = names["qb"] in sd
        dt = sd[names["q"]][0]
        qkv, qkv_b, o = [], [], []
        for r in range(tp):
            qh, kvh = gqa.rank_heads(r)
            parts = [gqa.gather(sd[names["q"]][1], 0, qh), gqa.gather(sd[names["k"]][1], 0, kvh),
                     gqa.gather(sd[names["v"]][1], 0, kvh)]
            qkv.append(np.concatenate(parts, axis=0))
            if has_bias:
                parts = [gqa.gather(sd[names["qb"]][1], 0, qh), gqa.gather(sd[names["kb"]][1], 0, kvh),
                         gqa.gather(sd[names["vb"]][1], 0, kvh)]
                qkv_b.append(np.concatenate(parts, axis=0))
            o.append(gqa.gather(sd[names["o"]][1], 1, qh))
        put(pre + ".qkv_proj.weight_qkv", dt, qkv)
        if has_bias:
            put(pre + ".qkv_proj.bias_qkv", sd[names["qb"]][0], qkv_b)
        put(names["o"], sd[names["o"]][0], o)
        used.update(n for n in names.values() if n in sd)

    for pre in mlps:
        gate, up, down = pre + ".gate_proj.weight", pre + ".up_proj.weight", pre + ".down_proj.weight"
        if up not in sd:
            die("missing tensor %s" % up)
        dt = sd[gate][0]
        if tp > 1:
            g, u = pad_split(sd[gate][1], 0, tp), pad_split(sd[up][1], 0, tp)
            put(pre + ".gate_up_proj.weight", dt, [np.concatenate([g[r], u[r]], axis=0) for r in range(tp)])
        else:
            put(pre + ".gate_up_proj.weight", dt, [np.concatenate([sd[gate][1], sd[up][1]], axis=0)])
        used.update((gate, up))

    for name, (dt, arr) in sd.items():
        if name in used:
            continue
        split_axis = None
        if tp > 1 and re.match(r"^(.*)\.mlp\.down_proj\.weight$", name):
            split_axis = 1
        elif tp > 1 and (re.match(r"^(.*)embed_tokens\.weight$", name) or name == "lm_head.weight"):
            split_axis = 0
        put(name, dt, pad_split(arr, split_axis, tp) if split_axis is not None else [arr] * tp)

    for r in range(tp):
        yield r, per_rank[r]
        per_rank[r] = None


def rank_dir(dst, r, tp):
    return dst if tp == 1 else os.path.join(dst, "tp_rank_%02d" % r)


def main_convert(args):
    src, dst, tp, kv_mult, fsync = args
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    sd = load_dir(src)
    os.makedirs(dst, exist_ok=True)
    for r, tensors in convert(sd, cfg, tp, kv_mult):
        d = rank_dir(dst, r, tp)
        os.makedirs(d, exist_ok=True)
        save_file(os.path.join(d, "model.safetensors"), tensors, fsync)
    with open(os.path.join(src, "config.json"), "rb") as f, open(os.path.join(dst, "config.json"), "wb") as g:
        g.write(f.read())
    return 0


# ---- --check -----------------------------------------------------------------

def tensor_index(d):
    """{name: (path, dtype, shape, start, end)} for every tensor of a folder."""
    out = {}
    for path in weight_files(d):
        header, base = read_header(path)
        for name, info in header.items():
            b, e = info["data_offsets"]
            out[name] = (path, info["dtype"], info["shape"], base + b, base + e)
    return out


def read_range(path, start, end):
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def main_check(py_dst, ckpt_dst):
    folders = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ckpt_dst, "tp_rank_*")))
    if not folders:
        folders = [""]
    problems, ntensors, nbytes = [], 0, 0
    for folder in folders:
        a_dir, b_dir = os.path.join(py_dst, folder), os.path.join(ckpt_dst, folder)
        if not os.path.isdir(a_dir):
            problems.append("%s: missing in %s" % (folder, py_dst))
            continue
        a, b = tensor_index(a_dir), tensor_index(b_dir)
        for name in sorted(set(a) | set(b)):
            where = "%s%s" % (folder + "/" if folder else "", name)
            if name not in a or name not in b:
                problems.append("%s: only in %s" % (where, "ckpt" if name in b else "python"))
                continue
            ta, tb = a[name], b[name]
            if ta[1] != tb[1] or ta[2] != tb[2]:
                problems.append("%s: python %s %s, ckpt %s %s" % (where, ta[1], ta[2], tb[1], tb[2]))
                continue
            ba, bb = read_range(ta[0], ta[3], ta[4]), read_range(tb[0], tb[3], tb[4])
            if ba != bb:
                es = DTYPE_SIZE.get(ta[1], 1)
                first = next(i for i in range(min(len(ba), len(bb))) if ba[i] != bb[i]) if len(ba) == len(bb) else 0
                problems.append("%s: bytes differ (first at element %d)" % (where, first // es))
                continue
            ntensors += 1
            nbytes += len(ba)
    for p in problems:
        print("MISMATCH " + p)
    print("check: %d tensors (%d bytes) in %d folder(s) identical; %d mismatch(es)"
          % (ntensors, nbytes, len(folders), len(problems)))
    return 1 if problems else 0


def usage():
    sys.stderr.write("usage: neuron_convert.py SRC DST --tp N [--kv-size-multiplier M] [--fsync]\n"
                     "       neuron_convert.py --check PY_DST CKPT_DST\n")
    return 2


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] == "--check":
        return main_check(argv[1], argv[2]) if len(argv) == 3 else usage()
    pos, tp, kv_mult, fsync = [], 1, None, False
    it = iter(argv)
    for a in it:
        try:
            if a == "--tp":
                tp = int(next(it))
            elif a == "--kv-size-multiplier":
                kv_mult = int(next(it))
            elif a == "--fsync":
                fsync = True
            elif a.startswith("-"):
                return usage()
            else:
                pos.append(a)
        except (StopIteration, ValueError):
            return usage()
    if len(pos) != 2 or tp < 1:
        return usage()
    return main_convert((pos[0], pos[1], tp, kv_mult, fsync))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
