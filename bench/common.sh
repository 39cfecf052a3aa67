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

# bench_cleanup_on_exit: WORK is removed when the script exits, unless
# BENCH_KEEP=1 (then its path is printed).
bench_cleanup_on_exit() {
    trap 'if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench/$BENCH_NAME: kept $WORK"; else rm -rf "$WORK"; fi' EXIT
}

# median V...: the median of the numbers given (the upper one of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
# maxof A B: the larger number.
maxof() { awk -v a="$1" -v b="$2" 'BEGIN {print (b > a) ? b : a}'; }
