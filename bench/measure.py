#!/usr/bin/python3
"""measure.py — run one command, report its wall time and peak RSS.

    bench/measure.py [--out FILE] CMD [ARG...]

Runs CMD (no shell; wrap in `sh -c '...'` for pipelines), waits for it and
prints one line `WALL_SECONDS PEAK_RSS_MIB EXIT_STATUS` to FILE (default
stderr). Peak RSS is getrusage(RUSAGE_CHILDREN).ru_maxrss: the largest
resident set of any process in the command's tree that was waited for, i.e.
what `/usr/bin/time -f %M` reports, without needing that package. The
command's own stdout/stderr pass through; the exit status is CMD's.
"""
import os
import resource
import subprocess
import sys
import time


def main(argv):
    out = None
    if len(argv) >= 2 and argv[0] == "--out":
        out, argv = argv[1], argv[2:]
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    t0 = time.monotonic()
    try:
        rc = subprocess.call(argv)
    except OSError as e:
        sys.stderr.write("measure.py: cannot run %s: %s\n" % (argv[0], e))
        return 127
    wall = time.monotonic() - t0
    if rc < 0:  # killed by a signal, as a shell reports it
        rc = 128 - rc
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    line = "%.3f %.1f %d\n" % (wall, peak_kib / 1024.0, rc)
    if out:
        with open(out, "w") as f:
            f.write(line)
    else:
        sys.stderr.write(line)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
