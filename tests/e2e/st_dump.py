#!/usr/bin/env python3
"""st_dump.py — an independent safetensors reader for the end-to-end tests.

It shares no code with ckpt (stdlib only: struct + json), so when its listing
and `ckpt inspect --json` agree, both read the files the same way.

  st_dump.py PATH          PATH is a .safetensors file or a checkpoint directory
                           (model.safetensors, or shards listed by
                           model.safetensors.index.json). Prints JSON in the shape
                           of `ckpt inspect --json`, plus each file's metadata:
                           {"files": [{"path", "size", "tensors", "metadata"}],
                            "tensors": [{"name", "dtype", "shape", "file", "offset", "nbytes"}],
                            "total_bytes": N, "metadata": {...}}
  st_dump.py --canon JSON  Prints a JSON listing (ours or ckpt's) as sorted text
                           lines, so two listings compare with diff.

For a directory with an index it also checks the index against the files
(same tensors, each in the file the index names, total_size), and exits 1
with a message on any disagreement.
"""
import json
import os
import struct
import sys

INDEX = "model.safetensors.index.json"
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
    "I64": 64, "U64": 64,
}


def die(msg):
    print("st_dump: " + msg, file=sys.stderr)
    sys.exit(1)


def read_file(path):
    """Returns (file entry, tensor entries) for one safetensors file."""
    name = os.path.basename(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            die(f"{name}: shorter than 8 bytes")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            die(f"{name}: header length {n} runs past the end")
        header = json.loads(f.read(n).decode("utf-8"))
    meta = header.pop("__metadata__", {})
    tensors = []
    end = 0
    for tname, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        begin, stop = info["data_offsets"]
        numel = 1
        for d in info["shape"]:
            numel *= d
        nbytes = numel * DTYPE_BITS[info["dtype"]] // 8
        if begin != end or stop - begin != nbytes:
            die(f"{name}: tensor {tname!r} at [{begin}, {stop}) is not where it should be")
        end = stop
        tensors.append({"name": tname, "dtype": info["dtype"], "shape": info["shape"],
                        "file": name, "offset": 8 + n + begin, "nbytes": stop - begin})
    if 8 + n + end != size:
        die(f"{name}: {size - 8 - n - end} bytes after the last tensor")
    entry = {"path": name, "size": size, "tensors": len(tensors), "metadata": meta}
    return entry, tensors


def check_index(folder, files, tensors):
    with open(os.path.join(folder, INDEX)) as f:
        index = json.load(f)
    mapped = index["weight_map"]
    actual = {t["name"]: t["file"] for t in tensors}
    if mapped != actual:
        missing = sorted(set(mapped) - set(actual))
        unlisted = sorted(set(actual) - set(mapped))
        moved = sorted(k for k in set(mapped) & set(actual) if mapped[k] != actual[k])
        die(f"index disagrees with files: missing {missing[:3]}, unlisted {unlisted[:3]}, "
            f"in another file {moved[:3]}")
    total = sum(t["nbytes"] for t in tensors)
    if index["metadata"]["total_size"] != total:
        die(f"index total_size {index['metadata']['total_size']} != {total}")


def dump(path):
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, INDEX)):
            with open(os.path.join(path, INDEX)) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        else:
            names = ["model.safetensors"]
        paths = [os.path.join(path, n) for n in names]
    else:
        paths = [path]
    files, tensors = [], []
    for p in paths:
        entry, ts = read_file(p)
        files.append(entry)
        tensors.extend(ts)
    if os.path.isdir(path) and os.path.exists(os.path.join(path, INDEX)):
        check_index(path, files, tensors)
    tensors.sort(key=lambda t: t["name"].encode("utf-8"))
    return {"files": files, "tensors": tensors,
            "total_bytes": sum(t["nbytes"] for t in tensors),
            "metadata": files[0]["metadata"] if files else {}}


def canon(doc):
    """Sorted text lines of a listing; tensors keep their order (it is part of the contract)."""
    lines = [f"file {f['path']} size={f['size']} tensors={f['tensors']}"
             for f in sorted(doc["files"], key=lambda f: f["path"])]
    lines += [f"tensor {t['name']} {t['dtype']} {t['shape']} {t['file']} {t['offset']} {t['nbytes']}"
              for t in doc["tensors"]]
    lines.append(f"total_bytes {doc['total_bytes']}")
    lines.append("metadata " + json.dumps(doc["metadata"], sort_keys=True))
    return "\n".join(lines)


def main():
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--canon":
        with open(args[1]) as f:
            print(canon(json.load(f)))
    elif len(args) == 1 and not args[0].startswith("-"):
        print(json.dumps(dump(args[0]), indent=1))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
