#!/usr/bin/python3
"""measure.py — run one command, report its wall time and peak RSS.

    bench/measure.py [--out FILE] [--log FILE] CMD [ARG...]

Runs CMD (no shell; wrap in `sh -c '...'` for a pipeline), waits for it and
writes one line `WALL_SECONDS PEAK_RSS_MIB EXIT_STATUS HOW CPU_SECONDS READ_MB
WRITTEN_MB` to FILE (default stderr); CPU_SECONDS is the user + system time of
the command and every process it waited for, READ_MB and WRITTEN_MB what they
read from and wrote to the block devices (getrusage's ru_inblock and
ru_oublock, 512-byte units: reads the page cache served are not counted). With --log, CMD's stdout and stderr go to that file instead of
passing through. The exit status is CMD's.

Peak RSS is the largest resident set of any process of the command's tree
(what `/usr/bin/time -f %M` reports). When /usr/bin/time exists, the command
runs under it and its %M is used (HOW = "time"): a small C program, so its
own pages add about 1 MiB at most. Without it, the figure is
getrusage(RUSAGE_CHILDREN).ru_maxrss (HOW = "rusage"); the kernel then
counts this interpreter's own resident pages at the fork/exec (about 10
MiB), so small figures are floored there.
"""
import os
import resource
import subprocess
import sys
import tempfile
import time

GNU_TIME = "/usr/bin/time"


def main(argv):
    out = log = None
    while len(argv) >= 2 and argv[0] in ("--out", "--log"):
        if argv[0] == "--out":
            out = argv[1]
        else:
            log = argv[1]
        argv = argv[2:]
    if not argv:
        sys.stderr.write(__doc__)
        return 2
    use_time = os.access(GNU_TIME, os.X_OK)
    tfile = None
    cmd = argv
    if use_time:
        fd, tfile = tempfile.mkstemp(prefix="measure-", suffix=".txt")
        os.close(fd)
        cmd = [GNU_TIME, "-f", "%M", "-o", tfile] + argv
    logf = open(log, "wb") if log else None
    t0 = time.monotonic()
    try:
        rc = subprocess.call(cmd, stdout=logf, stderr=logf)
    except OSError as e:
        sys.stderr.write("measure.py: cannot run %s: %s\n" % (cmd[0], e))
        return 127
    finally:
        if logf:
            logf.close()
    wall = time.monotonic() - t0
    if rc < 0:  # killed by a signal, as a shell reports it
        rc = 128 - rc
    peak_kib = None
    if tfile:
        try:
            with open(tfile) as f:
                lines = [l.strip() for l in f if l.strip()]
            peak_kib = int(lines[-1])  # earlier lines: "Command exited with non-zero status N"
        except (OSError, ValueError, IndexError):
            peak_kib = None
        os.unlink(tfile)
    how = "time"
    if peak_kib is None:
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
        how = "rusage"
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = "%.3f %.1f %d %s %.3f %.1f %.1f\n" % (wall, peak_kib / 1024.0, rc, how, ru.ru_utime + ru.ru_stime,
                                            ru.ru_inblock * 512 / 1e6, ru.ru_oublock * 512 / 1e6)
    if out:
        with open(out, "w") as f:
            f.write(line)
    else:
        sys.stderr.write(line)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
