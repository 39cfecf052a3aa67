#!/usr/bin/env python3
"""make_torch_corpus.py — seed corpora for fuzz_torch_zip and fuzz_pickle.

    /usr/bin/python3 tests/fuzz/make_torch_corpus.py   # a python3 with torch (python3-torch)

corpus/fuzz_torch_zip/ gets small files written by real torch.save (zip and
legacy, protocols 2 and 4, wrappers, tied weights, every dtype; from
tests/torch_gen.py) and the hostile files of tests/e2e/torch_hostile.py that
fit libFuzzer's -max_len; corpus/fuzz_pickle/ gets the pickles inside them
(data.pkl of each zip). Deterministic for a torch version but for the
legacy files, whose storage keys are memory addresses; committed.
"""
import collections
import os
import shutil
import sys
import tempfile
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import torch_gen  # noqa: E402
import torch_hostile  # noqa: E402

MAX = 65536


def adamw_state():
    g = torch.Generator().manual_seed(2)
    p = torch.nn.Parameter(torch.randn(4, 2, generator=g))
    opt = torch.optim.AdamW([p])
    p.grad = torch.ones_like(p)
    opt.step()
    return opt.state_dict()


def main():
    zdir = os.path.join(HERE, "corpus", "fuzz_torch_zip")
    pdir = os.path.join(HERE, "corpus", "fuzz_pickle")
    for d in (zdir, pdir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    with tempfile.TemporaryDirectory() as tmp:
        torch_gen.main(os.path.join(tmp, "gen"))
        g = torch.Generator().manual_seed(1)
        small = collections.OrderedDict([("w", torch.randn(2, 3, generator=g)), ("b", torch.ones(3, dtype=torch.bfloat16))])
        small["tied"] = small["w"]
        torch.save(small, os.path.join(tmp, "gen", "small.pt"))
        torch.save(small, os.path.join(tmp, "gen", "small_legacy.pt"), _use_new_zipfile_serialization=False)
        # a torch optimizer's state_dict (nested dicts, integer keys): what neuronx-distributed saves under shards/optim
        torch.save(adamw_state(), os.path.join(tmp, "gen", "optim.pt"))
        os.makedirs(os.path.join(tmp, "hostile"))
        torch_hostile.main(os.path.join(tmp, "hostile"), "/nonexistent/marker")
        n = 0
        for sub in ("gen", "hostile"):
            for root, _, files in sorted(os.walk(os.path.join(tmp, sub))):
                for f in sorted(files):
                    path = os.path.join(root, f)
                    if f.endswith((".json", ".txt")) or os.path.getsize(path) > MAX:
                        continue
                    name = ("valid_" if sub == "gen" else "bad_") + os.path.relpath(path, os.path.join(tmp, sub)).replace("/", "_")
                    shutil.copy(path, os.path.join(zdir, name))
                    n += 1
                    if zipfile.is_zipfile(path):
                        try:
                            with zipfile.ZipFile(path) as z:
                                pkl = [i for i in z.namelist() if i.endswith("data.pkl")]
                                if pkl:
                                    open(os.path.join(pdir, name + ".pkl"), "wb").write(z.read(pkl[0]))
                        except (zipfile.BadZipFile, OSError, NotImplementedError, ValueError):
                            pass
    print(f"{n} seeds in {zdir}, {len(os.listdir(pdir))} in {pdir}")


if __name__ == "__main__":
    main()
