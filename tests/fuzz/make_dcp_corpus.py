#!/usr/bin/env python3
"""make_dcp_corpus.py — the seed corpus of fuzz_dcp_meta.

    /usr/bin/python3 tests/fuzz/make_dcp_corpus.py   # a python3 with torch (python3-torch)

corpus/fuzz_dcp_meta/ gets the .metadata files tests/dcp_gen.py writes: the
FSDP save in the newest torch's format, the TP x FSDP save in torch 2.1's,
the hostile ones whose defect is in .metadata (overlap, hole, escaping
paths, os.system, dtype), and a one-tensor save (a short seed mutations
explore fast). Deterministic but for StorageMeta's checkpoint_id (the
temporary folder's path); committed.
"""
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import dcp_gen  # noqa: E402
import torch  # noqa: E402

MAX = 65536


def main():
    out = os.path.join(HERE, "corpus", "fuzz_dcp_meta")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    with tempfile.TemporaryDirectory() as tmp:
        dcp_gen.main(os.path.join(tmp, "gen"))
        w = dcp_gen.Writer(2)
        t = torch.arange(6, dtype=torch.float32).reshape(3, 2)
        w.add_tensor(0, "w", t, (0, 0), (2, 2), dcp_gen.TensorProperties)
        w.add_tensor(1, "w", t, (2, 0), (1, 2), dcp_gen.TensorProperties)
        w.add_tensor(0, "s", torch.tensor(1.0), (), (), dcp_gen.TensorProperties)
        w.add_bytes("b", 3)
        w.write(os.path.join(tmp, "gen", "tiny"))
        n, seen = 0, set()
        for root, _, files in sorted(os.walk(os.path.join(tmp, "gen"))):
            if ".metadata" not in files:
                continue
            path = os.path.join(root, ".metadata")
            data = open(path, "rb").read()
            if len(data) > MAX or data in seen:  # no_distcp, outside, shape: the same .metadata as fsdp
                continue
            seen.add(data)
            rel = os.path.relpath(root, os.path.join(tmp, "gen")).replace("/", "_")
            shutil.copy(path, os.path.join(out, rel + ".metadata"))
            n += 1
    print(f"{n} seeds in {out}")


if __name__ == "__main__":
    main()
