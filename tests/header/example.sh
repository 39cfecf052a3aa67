#!/bin/sh
# example.sh — prints the example program of include/ckpt.h's comment as a C
# file: the lines from "#include <ckpt.h>" to the closing "}" of main, each
# without its " *   " comment prefix. The Makefile builds and runs what it
# prints (make unit), so the header's example is exactly what is tested.
#
#   tests/header/example.sh include/ckpt.h > example.c
set -eu
awk '
    /^ \*   #include <ckpt.h>$/ { on = 1 }
    on {
        line = $0
        if (line == " *") line = ""
        else if (substr(line, 1, 5) == " *   ") line = substr(line, 6)
        else { print "example.sh: unexpected line in the example: " $0 > "/dev/stderr"; exit 1 }
        print line
        if (line ~ /^int main\(/) main = 1
        if (main && line == "}") { found = 1; exit 0 }
    }
    END { if (!found) { print "example.sh: no complete example in the header" > "/dev/stderr"; exit 1 } }
' "${1:?usage: example.sh include/ckpt.h}"
