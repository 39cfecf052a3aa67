"""resume_check.py KEPT_DIR HUB_LOG FIRST_LINE — what a resumed fetch asked for.

KEPT_DIR is a copy of CKPT_HOME/partial/<commit> taken after the interrupted
fetch died (hub/hub_download.c, store/store_partial.h): per file a folder
with meta (size and path), journal (one "START END" line per piece kept) and,
for a safetensors file, header (its first bytes, kept whole). HUB_LOG is the
test Hub's request log; the lines from FIRST_LINE (1-based) on are the rerun.

Checks, per file something was kept of: no request of the rerun asks for a
kept byte, and the bytes requested are exactly the bytes missing (size - kept).
Prints "kept K requested R missing M total T" over all kept files, or exits 1
naming the file and the range.
"""
import os
import re
import sys

kept_dir, log, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = {}
for key in sorted(os.listdir(kept_dir)):
    d = os.path.join(kept_dir, key)
    if not os.path.isdir(d):
        continue
    meta = open(os.path.join(d, "meta")).read().split("\n")
    size, path = int(meta[1].split()[0]), meta[2]
    ranges = []
    if os.path.exists(os.path.join(d, "header")):
        ranges.append((0, os.path.getsize(os.path.join(d, "header"))))
    if os.path.exists(os.path.join(d, "journal")):
        for line in open(os.path.join(d, "journal")).read().split("\n")[:-1]:
            a, b = line.split()
            ranges.append((int(a), int(b)))
    merged = []  # disjoint, sorted
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    files[path] = (size, merged)


def overlaps(merged, a, b):
    return any(x < b and a < y for x, y in merged)

asked = {p: 0 for p in files}
for n, line in enumerate(open(log).read().split("\n")[first - 1:], first):
    m = re.search(r"^GET /\S+/resolve/[0-9a-f]{40}/(\S+) .*?range=bytes=(\d+)-(\d+)", line)
    if not m or m.group(1) not in files:
        continue
    path, a, b = m.group(1), int(m.group(2)), int(m.group(3)) + 1
    size, merged = files[path]
    b = min(b, size)
    if overlaps(merged, a, b):
        sys.exit(f"{path}: the rerun asked for kept bytes {a}-{b - 1} (log line {n})")
    asked[path] += b - a

kept = requested = missing = total = 0
for path, (size, merged) in files.items():
    have = sum(y - x for x, y in merged)
    if not have:
        continue
    if asked[path] != size - have:
        sys.exit(f"{path}: {size} bytes, {have} kept, the rerun asked for {asked[path]}")
    kept += have
    requested += asked[path]
    missing += size - have
    total += size
print(f"kept {kept} requested {requested} missing {missing} total {total}")
