#!/usr/bin/env python3
"""check_exports.py — libckpt.so exports exactly the functions ckpt.h declares.

Usage: tests/header/check_exports.py include/ckpt.h include/libckpt.map [libckpt.so]

1. The names listed under global: in the version script are the functions
   declared in ckpt.h (outside its comments), no more, no fewer.
2. With a shared library: its defined dynamic symbols (nm -D --defined-only)
   are those names too.
Exit status 0 when both hold; otherwise one line per difference.
"""
import re
import subprocess
import sys


def declared(header):
    text = open(header, encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*(\\\n[^\n]*)*", " ", text, flags=re.M)
    # A declaration: a name followed by "(" at file scope, ending in ");".
    names = set()
    for decl in text.split(";"):
        m = re.search(r"\b(ckpt_\w+)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*$", decl.strip())
        if m:
            names.add(m.group(1))
    return names


def mapped(mapfile):
    text = re.sub(r"/\*.*?\*/", " ", open(mapfile, encoding="utf-8").read(), flags=re.S)
    m = re.search(r"global:(.*?)local:", text, flags=re.S)
    if not m:
        return set()
    return {n.strip() for n in m.group(1).split(";") if n.strip()}


def exported(so):
    out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True,
                         check=True).stdout
    return {l.split()[-1].split("@")[0] for l in out.splitlines() if len(l.split()) == 3}


def diff(what, want, got):
    return [f"check-exports: {what}: {n} is missing" for n in sorted(want - got)] + \
           [f"check-exports: {what}: {n} is extra (not declared in ckpt.h)" for n in sorted(got - want)]


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    want = declared(sys.argv[1])
    bad = [] if want else ["check-exports: no declarations found in " + sys.argv[1]]
    bad += diff(sys.argv[2], want, mapped(sys.argv[2]))
    if len(sys.argv) == 4:
        bad += diff(sys.argv[3], want, exported(sys.argv[3]))
    for line in bad:
        print(line)
    print(f"check-exports: {len(want)} functions, {len(bad)} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
