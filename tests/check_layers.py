#!/usr/bin/env python3
"""check_layers.py — the layer order of the source folders, and no cycles.

Usage: tests/check_layers.py BUILD_DIR

1. Folders: a file may include headers of its own folder and of folders
   lower in LAYERS (the order of the Makefile's LIB_DIRS and SVC_DIRS,
   docs/ARCHITECTURE.md), never of a folder above it.
2. Files: module A uses module B when A's object file needs a symbol B's
   object defines (nm). The graph of modules must have no cycle: the first
   cycle found is printed with the symbol behind each edge.
Exit status 0 when both hold, 1 otherwise, with one line per violation.
"""
import os
import re
import subprocess
import sys

LAYERS = ["include", "common", "format", "plan", "lora", "transform", "state",
          "store", "fixtures", "hub", "service/jobs", "service/http",
          "service/daemon", "service/cli"]
RANK = {d: i for i, d in enumerate(LAYERS)}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    return os.path.dirname(path)


def check_folders():
    bad = []
    for d in LAYERS:
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(d, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for inc in INCLUDE.findall(text):
                tgt = folder_of(inc)
                if tgt not in RANK:
                    if os.path.exists(inc):
                        bad.append(f"{path}: includes {inc}, outside the layered folders")
                    continue
                if RANK[tgt] > RANK[d]:
                    bad.append(f"{path}: includes {inc}: {tgt}/ is above {d}/ in the layer order")
    return bad


def symbols(objs):
    """{obj: (external symbols it defines, symbols it needs)} for every object
    in one nm run: each nm process loads the linker plugins of
    /usr/lib/bfd-plugins (clang's LLVMgold loads all of LLVM, ~0.2 CPU-s), so
    two runs per object cost ~40 CPU-s on a single core before the unit
    tests could start."""
    out = subprocess.run(["nm", "-A", "-g", *objs], capture_output=True, text=True, check=True).stdout
    syms = {o: (set(), set()) for o in objs}
    for line in out.splitlines():
        obj, _, rest = line.partition(":")  # "OBJ:ADDR TYPE NAME", or "OBJ:   U NAME" when undefined
        f = rest.split()
        if obj not in syms:
            continue
        if len(f) == 3 and f[1] in "TDBRVWtdbr":
            syms[obj][0].add(f[2])
        elif len(f) == 2:  # U, or w / v: weak and undefined
            syms[obj][1].add(f[1])
    return syms


def check_cycles(build):
    mods = {}
    for d in LAYERS:
        objdir = os.path.join(build, "obj", d)
        if not os.path.isdir(objdir):
            continue
        for name in sorted(os.listdir(objdir)):
            if name.endswith(".o"):
                mods[os.path.join(d, name[:-2])] = os.path.join(objdir, name)
    if not mods:
        return [f"no objects under {build}/obj: build first"]
    owner, needs = {}, {}
    syms = symbols(list(mods.values()))
    for m, obj in mods.items():
        defined, undef = syms[obj]
        for s in defined:
            owner[s] = m
        needs[m] = undef
    edges = {m: {} for m in mods}
    for m, undef in needs.items():
        for s in sorted(undef):
            o = owner.get(s)
            if o and o != m:
                edges[m].setdefault(o, s)
    # Tarjan's strongly connected components: any component of more than one
    # module is a cycle.
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(mods):
        if v not in index:
            visit(v)
    bad = []
    for comp in comps:
        inside = set(comp)
        detail = ", ".join(f"{a} -> {b} ({s})" for a in comp for b, s in sorted(edges[a].items()) if b in inside)
        bad.append(f"cycle between {' '.join(comp)}: {detail}")
    return bad


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    bad = check_folders() + check_cycles(sys.argv[1])
    for b in bad:
        print("check-layers:", b)
    print(f"check-layers: {len(LAYERS)} folders, {'OK' if not bad else str(len(bad)) + ' violation(s)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
