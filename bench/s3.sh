#!/usr/bin/env bash
# bench/s3.sh — the store with its blobs in an S3 bucket against `aws s3 cp`
# of the same files (issue 21, "Speed"). Run by `make bench BENCH=s3` (which
# installs Debian's awscli first: the Makefile's BENCH_DEB_PACKAGES); never
# by make test.
#
# A throw-away Ceph cluster (tests/e2e/ceph_lib.sh: monitor, one OSD on
# bluestore over a sparse file in the work folder, radosgw on 127.0.0.1) and
# the generated ~2 GB llama of the other benches (BENCH_SCALE 2, BENCH_LAYERS
# 14, 500 MB shards). Each round, with the source in the page cache:
#   aws s3 cp --recursive SRC s3://bench-aws/rN/      the baseline upload
#   ckpt import SRC (CKPT_BLOBS=s3://bench-ckpt/rN)   validates, hashes and
#                                                      uploads each tensor as a blob
#   aws s3 cp --recursive s3://bench-aws/rN/ DIR       the baseline download
#   ckpt pull REF -o DIR                               ranged GETs, every file
#                                                      checked against its sha256
# (each pair in an order that alternates between rounds; each round's objects
# are removed afterwards, untimed), then prints the
# median wall times and the ratios ckpt / aws (goal: at most 1.0). Last, the
# model is converted inside the store to neuron --tp BENCH_TP (default 8) and
# rank 0 is pulled with CKPT_DEBUG=1: the bytes it requested from the bucket
# against the rank's own bytes (tensors and plain files), and the
# whole model's.
#
# Environment: CKPT_BIN (default build/ckpt), BENCH_REPEAT (3), BENCH_DIR
# (/tmp; ~2 GB for the source and ~2 GB of pulled copies, plus what the
# OSD's sparse file fills, ~4 GB at a time), BENCH_SCALE, BENCH_LAYERS,
# BENCH_TP, BENCH_KEEP=1 keeps the work folder.
# A quick run that only checks the script: BENCH_SCALE=16 BENCH_LAYERS=2 BENCH_REPEAT=1 bench/s3.sh
set -euo pipefail

BENCH_NAME=s3
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TP=${BENCH_TP:-8}
AWS=/usr/bin/aws
[ -x "$AWS" ] || die "$AWS is missing: make deps-bench (Debian's awscli)"
bench_positive TP
bench_start

# ceph_lib.sh is written for the e2e tests: give it what it uses of lib.sh.
work=$WORK
py=$PY
e2e_cleanups=()
fail() { die "$*"; }
note() { echo "   $*"; }
CEPH_OBJECTSTORE=bluestore
# shellcheck source=tests/e2e/ceph_lib.sh
. "$HERE/../tests/e2e/ceph_lib.sh"
trap 'ceph_stop; if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench/$BENCH_NAME: kept $WORK"; else rm -rf "$WORK"; fi' EXIT

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r), $(df -PT "$WORK" | awk 'NR==2 {print $2}') at $WORK, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ckpt: $CKPT_BIN; $("$AWS" --version 2>&1 | cut -d' ' -f1); radosgw $(radosgw --version 2>/dev/null | awk '{print $3}')"
echo "== starting Ceph (bluestore) and radosgw on loopback"
ceph_start
export AWS_PAGER="" AWS_MAX_ATTEMPTS=3
awscp() { "$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 cp --recursive --only-show-errors "$@"; }
awsrm() { "$AWS" --endpoint-url "$AWS_ENDPOINT_URL" s3 rm --recursive --only-show-errors "$@"; }
"$CKPT_BIN" s3 mb s3://bench-ckpt >/dev/null
"$CKPT_BIN" s3 mb s3://bench-aws >/dev/null

echo "== generating llama --scale $SCALE --layers $LAYERS"
"$CKPT_BIN" gen-model llama "$WORK/src" --scale "$SCALE" --layers "$LAYERS" --shard-mb 500 >/dev/null 2>&1
BYTES=$(du -sb "$WORK/src" | cut -f1)
echo "   $(awk -v b="$BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') in $(find "$WORK/src" -type f | wc -l) files"

declare -A T
# timed KEY CMD...: CMD's wall time (seconds) appended to T[KEY]; its output in WORK/log.txt.
timed() {
    local key=$1 t0 t1
    shift
    sync
    t0=$(date +%s.%N)
    "$@" >"$WORK/log.txt" 2>&1 || { cat "$WORK/log.txt" >&2; die "failed: $*"; }
    t1=$(date +%s.%N)
    T[$key]="${T[$key]:-} $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')"
}
warm() { find "$@" -type f -exec cat {} + >/dev/null; }
same() { diff -r "$1" "$2" >/dev/null || die "$2 differs from $1"; }

# Each direction's pair runs back to back in an order that alternates from
# round to round (odd: aws first; even: ckpt first): what the gateway still
# does after one transfer (bluestore's deferred writes, RocksDB compaction)
# then falls on each side equally. With a fixed order (aws up, import, aws
# down, pull) one idle run measured the pull at 1.07x, where downloads
# alternating over the same objects gave 0.78-0.85x.
up_aws() { warm "$WORK/src"; timed aws_up awscp "$WORK/src" "s3://bench-aws/r$r/"; }
up_ckpt() { warm "$WORK/src"; timed ckpt_import "$CKPT_BIN" import "$WORK/src" --repo bench/llama --quiet; }
down_aws() {
    timed aws_down awscp "s3://bench-aws/r$r/" "$WORK/aws-out"
    same "$WORK/src" "$WORK/aws-out"
    rm -rf "$WORK/aws-out"
}
down_ckpt() {
    timed ckpt_pull "$CKPT_BIN" pull bench/llama -o "$WORK/ckpt-out" --quiet
    same "$WORK/src" "$WORK/ckpt-out"
    rm -rf "$WORK/ckpt-out"
}
for r in $(seq "$REPEAT"); do
    echo "== round $r of $REPEAT"
    export CKPT_HOME=$WORK/home$r CKPT_BLOBS=s3://bench-ckpt/r$r
    if [ $((r % 2)) = 1 ]; then
        up_aws; up_ckpt; down_aws; down_ckpt
    else
        up_ckpt; up_aws; down_ckpt; down_aws
    fi
    if [ "$r" != "$REPEAT" ]; then # the last round's blobs serve the rank pull below
        awsrm "s3://bench-aws/r$r/"
        awsrm "s3://bench-ckpt/r$r/"
        rm -rf "$CKPT_HOME"
    fi
done

med() { echo "${T[$1]}" | tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
row() { # LABEL KEY BASE_KEY
    local m b
    m=$(med "$2") b=$(med "$3")
    # shellcheck disable=SC2086 # T[KEY] is a list of times
    awk -v l="$1" -v m="$m" -v b="$b" -v n="$BYTES" -v s="$(spread ${T[$2]})" \
        'BEGIN {printf "  %-44s %8.2f s %7.2f GB/s %6.2fx   (rounds %s s)\n", l, m, n / m / 1e9, m / b, s}'
}
echo
echo "== medians of $REPEAT round(s); ratio = time / the aws s3 cp of the same direction (goal <= 1.00)"
row "aws s3 cp --recursive SRC s3://..." aws_up aws_up
row "ckpt import (blobs in the bucket)" ckpt_import aws_up
row "aws s3 cp --recursive s3://... DIR" aws_down aws_down
row "ckpt pull -o DIR (sha256 checked)" ckpt_pull aws_down

echo
echo "== a rank pull reads only its byte ranges"
"$CKPT_BIN" convert bench/llama --layout neuron --tp "$TP" --quiet >"$WORK/log.txt" 2>&1 ||
    { cat "$WORK/log.txt" >&2; die "convert in the store failed"; }
CKPT_DEBUG=1 "$CKPT_BIN" pull "bench/llama:neuron-tp$TP" --rank 0 -o "$WORK/rank0" --quiet 2>"$WORK/rank.err" >/dev/null ||
    { cat "$WORK/rank.err" >&2; die "rank pull failed"; }
got=$(sed -n 's/^debug: blobs s3:.*: \([0-9]*\) requests, [0-9]* retries, \([0-9]*\) bytes received$/\1 \2/p' "$WORK/rank.err")
rank=$("$PY" "$HERE/../tests/e2e/payload_bytes.py" "$WORK/rank0")
awk -v req="${got%% *}" -v got="${got#* }" -v rank="$rank" -v all="$BYTES" -v tp="$TP" 'BEGIN {
    printf "  rank 0 of %d: %.1f MB requested in %d requests, the rank holds %.1f MB (%.2fx), the model %.1f MB (%.2f of it)\n",
        tp, got / 1e6, req, rank / 1e6, got / rank, all / 1e6, got / all }'
echo "  (row-parallel slices come as one GET of their rows' span when the rows lie closer than CKPT_S3_RANGE_GAP)"
