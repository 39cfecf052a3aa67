"""prom_check.py FILE — parses a Prometheus text exposition (format 0.0.4)
strictly and prints its samples as JSON: {"name{labels}": value, ...} with
labels sorted. Exits 1, naming the line, on anything the format does not
allow: a sample of a family with no TYPE before it, a malformed name, label
or value, a label set twice, a histogram whose buckets are not cumulative,
lack +Inf, or whose _count differs from its +Inf bucket or lacks a _sum."""
import json
import math
import re
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\\\|\\"|\\n)*)"'
SAMPLE = re.compile(r"^(" + NAME + r")(\{(?:" + LABEL + r"(?:," + LABEL + r")*)?\})? (\S+)$")


def die(n, line, why):
    print(f"line {n}: {why}: {line!r}", file=sys.stderr)
    sys.exit(1)


def main():
    types, helps, samples = {}, set(), {}
    hist = {}  # (family, labels without le) -> {"buckets": [(le, v)], "count", "sum"}
    text = open(sys.argv[1], encoding="utf-8").read()
    if not text.endswith("\n"):
        die(0, text[-40:], "the exposition does not end with a newline")
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if line.startswith("#"):
            m = re.match(r"^# (HELP|TYPE) (" + NAME + r") (.*)$", line)
            if not m:
                die(n, line, "a comment that is neither HELP nor TYPE")
            kind, name, rest = m.groups()
            if kind == "TYPE":
                if rest not in ("counter", "gauge", "histogram", "summary", "untyped"):
                    die(n, line, "unknown type")
                if name in types:
                    die(n, line, "TYPE given twice")
                types[name] = rest
            else:
                if name in helps:
                    die(n, line, "HELP given twice")
                helps.add(name)
            continue
        m = SAMPLE.match(line)
        if not m:
            die(n, line, "not a sample line")
        name, labeltext, value = m.group(1), m.group(2) or "", m.group(m.lastindex)
        labels = dict(re.findall(LABEL, labeltext))
        if len(labels) != len(re.findall(LABEL, labeltext)):
            die(n, line, "a label given twice")
        try:
            v = float(value)
        except ValueError:
            die(n, line, "the value is not a number")
        family = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "histogram":
                family = name[: -len(suffix)]
        if family not in types:
            die(n, line, f"no TYPE line for {family} before its samples")
        if types[family] == "histogram":
            if family == name:
                die(n, line, "a histogram sample without _bucket, _sum or _count")
            le = labels.pop("le", None)
            key = (family, tuple(sorted(labels.items())))
            h = hist.setdefault(key, {"buckets": [], "count": None, "sum": None})
            if name.endswith("_bucket"):
                if le is None:
                    die(n, line, "a bucket without le")
                h["buckets"].append((math.inf if le == "+Inf" else float(le), v))
            elif name.endswith("_count"):
                h["count"] = v
            else:
                h["sum"] = v
        elif types[family] == "counter" and v < 0:
            die(n, line, "a negative counter")
        key = name + "{" + ",".join(f'{k}="{val}"' for k, val in sorted(dict(re.findall(LABEL, labeltext)).items())) + "}"
        if key in samples:
            die(n, line, "the same sample twice")
        samples[key] = v
    for (family, labels), h in hist.items():
        b = h["buckets"]
        where = f"{family}{dict(labels)}"
        if not b or b[-1][0] != math.inf:
            die(0, where, "a histogram without a +Inf bucket last")
        if any(b[i][0] >= b[i + 1][0] or b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            die(0, where, "buckets not in increasing le order with cumulative counts")
        if h["count"] != b[-1][1] or h["sum"] is None:
            die(0, where, "_count differs from the +Inf bucket, or no _sum")
    json.dump(samples, sys.stdout, indent=0, sort_keys=True)


main()
