# shellcheck shell=bash disable=SC2034 # the settings are for the scripts that source this
# bench/common.sh — how every bench script starts; sourced right after
# `set -euo pipefail` with BENCH_NAME set (messages and the work folder use it):
#
#   BENCH_NAME=store
#   . "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#   ... script-specific settings and checks ...
#   bench_start   # CKPT_BIN checked and made absolute, WORK created
#
# Shared settings (environment): CKPT_BIN (default build/ckpt beside bench/),
# BENCH_PYTHON, BENCH_SCALE / BENCH_LAYERS (the ~2 GB llama every bench uses:
# --scale 2 --layers 14), BENCH_REPEAT (rounds, default 3), BENCH_DIR (where
# the work folder goes, default /tmp).

HERE=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
CKPT_BIN=${CKPT_BIN:-$HERE/../build/ckpt}
PY=${BENCH_PYTHON:-/usr/bin/python3}
SCALE=${BENCH_SCALE:-2}
LAYERS=${BENCH_LAYERS:-14}
REPEAT=${BENCH_REPEAT:-3}
BASE=${BENCH_DIR:-/tmp}

die() { echo "bench/$BENCH_NAME: $*" >&2; exit 1; }

# bench_positive VAR...: each of these settings is a positive whole number.
bench_positive() {
    local v
    for v in "$@"; do
        [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "BENCH_$v must be a positive number"
    done
}

# bench_start: CKPT_BIN must be built (made absolute; a sanitizer build is
# warned about), REPEAT positive; WORK is a new folder under BENCH_DIR.
bench_start() {
    [ -x "$CKPT_BIN" ] || die "CKPT_BIN '$CKPT_BIN' is not an executable (build it: make, or make BUILD=DIR DIR/ckpt)"
    CKPT_BIN=$(cd "$(dirname "$CKPT_BIN")" && pwd)/$(basename "$CKPT_BIN")
    if nm "$CKPT_BIN" 2>/dev/null | grep -q __asan_init; then
        echo "bench/$BENCH_NAME: warning: $CKPT_BIN is a sanitizer build; figures mean little" >&2
    fi
    bench_positive REPEAT
    mkdir -p "$BASE"
    WORK=$(mktemp -d "$BASE/ckpt-bench-$BENCH_NAME.XXXXXX")
}

# bench_need_hub: CKPT_TESTHUB (default beside CKPT_BIN) is built and curl
# is there, for the scripts that serve a store over the Hub API.
bench_need_hub() {
    CKPT_TESTHUB=${CKPT_TESTHUB:-$(dirname "$CKPT_BIN")/ckpt-testhub}
    [ -x "$CKPT_TESTHUB" ] || die "CKPT_TESTHUB '$CKPT_TESTHUB' is not built (make BUILD=DIR DIR/ckpt-testhub)"
    command -v curl >/dev/null || die "curl is needed"
}

# bench_stop_hub: the test Hub whose pid is in HUB_PID, if any, stopped.
HUB_PID=""
bench_stop_hub() {
    if [ -n "$HUB_PID" ]; then kill -TERM "$HUB_PID" 2>/dev/null && wait "$HUB_PID" 2>/dev/null; fi
    HUB_PID=""
}

# bench_cleanup_on_exit: when the script exits, a test Hub it started is
# stopped and WORK removed, unless BENCH_KEEP=1 (then its path is printed).
bench_cleanup_on_exit() {
    trap 'bench_stop_hub; if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench/$BENCH_NAME: kept $WORK"; else rm -rf "$WORK"; fi' EXIT
}

# median V...: the median of the numbers given (the upper one of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
# maxof A B: the larger number.
# spread V...: "min-max" of the values (what a median hides on a busy machine).
spread() { printf '%s\n' "$@" | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%s-%s", lo, hi}'; }
maxof() { awk -v a="$1" -v b="$2" 'BEGIN {print (b > a) ? b : a}'; }

# measure TITLE SRC COPY_CMD CKPT_LABEL PY_LABEL -- CKPT_ARGS... -- PY_ARGS...
# (in WORK, with hf/model.safetensors the model SRC was made from; PY with torch;
# ckpt writes out/, one file or shards):
# REPEAT rounds of the durable copy (COPY_CMD, a shell command), ckpt with
# CKPT_ARGS writing out/ (its model.safetensors checked against
# hf/model.safetensors once) and, when SRC fits twice in the memory
# available, the Python way (bench script and args writing py.safetensors;
# none: not measured); prints one block of medians, ratios and peak RSS.
measure() {
    local title=$1 src=$2 copy=$3 ck_label=$4 py_label=$5
    shift 5
    local -a ck_args py_args
    [ "$1" = -- ] && shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do ck_args+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    py_args=("$@")
    local bytes avail_kb py_ok=1
    bytes=$(du -sb "$src" | cut -f1)
    avail_kb=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
    # the Python way holds the model, may copy it once more, the writer a tensor more
    [ $((bytes / 1024 * 2)) -lt "$avail_kb" ] || py_ok=0
    [ ${#py_args[@]} -gt 0 ] || py_ok=2
    local -a COPY CK PYW
    local rss_ck=0 rss_py=0 r
    for r in $(seq "$REPEAT"); do
        rm -rf copy out py.safetensors
        sync
        find "$src" -type f -exec cat {} + >/dev/null
        "$PY" "$HERE/measure.py" --out m.txt sh -c "$copy"
        COPY+=("$(cut -d' ' -f1 m.txt)")
        rm -rf copy
        sync
        "$PY" "$HERE/measure.py" --out m.txt "$CKPT_BIN" "${ck_args[@]}"
        CK+=("$(cut -d' ' -f1 m.txt)")
        rss_ck=$(maxof "$rss_ck" "$(cut -d' ' -f2 m.txt)")
        if [ "$r" = 1 ]; then
            "$PY" "$HERE/torch_way.py" check hf/model.safetensors out >/dev/null ||
                die "$title: ckpt's model.safetensors differs from the model it was written from"
        fi
        rm -rf out
        if [ "$py_ok" = 1 ]; then
            sync
            "$PY" "$HERE/measure.py" --out m.txt "$PY" "${py_args[@]}"
            PYW+=("$(cut -d' ' -f1 m.txt)")
            rss_py=$(maxof "$rss_py" "$(cut -d' ' -f2 m.txt)")
            rm -f py.safetensors
        fi
    done
    local c k p=""
    c=$(median "${COPY[@]}")
    k=$(median "${CK[@]}")
    [ "$py_ok" = 1 ] && p=$(median "${PYW[@]}")
    awk -v t="$title" -v b="$bytes" -v c="$c" -v k="$k" -v r="$rss_ck" -v p="$p" -v rp="$rss_py" -v why="$py_ok" \
        -v kl="$ck_label" -v pl="$py_label" 'BEGIN {
        printf "%s: %.2f GB\n", t, b / 1e9
        printf "  durable copy        %8.2f s\n", c
        printf "  %-19s %8.2f s  %.2fx the copy (goal <= 1.2x); peak RSS %.0f MiB (goal <= 256)\n", kl, k, k / c, r
        if (p != "") printf "  %-19s %8.2f s  %.2fx ckpt (goal >= 3x); peak RSS %.0f MiB\n", pl, p, p / k, rp
        else if (why == 2) printf "  %-19s not measured\n", pl
        else printf "  %-19s skipped: the model does not fit twice in the memory available\n", pl
    }'
}
