#!/usr/bin/env bash
# bench/store.sh — the speed benchmark of the store (issue 4, "Speed").
# Standalone; bench/run.sh may call it after its own table.
#
# On a generated `llama` checkpoint of about 2 GB (bf16, 500 MB shards) with a
# warm page cache, in a fresh CKPT_HOME, it measures the wall time and peak
# RSS of:
#   cp -r SRC + sha256sum SRC/*        the import baseline
#   ckpt import SRC                    (and importing it again: stores nothing)
#   cp -r SRC                          the pull baseline
#   ckpt pull REF -o DIR               the original back out
#   ckpt convert REF --layout neuron --tp 8   inside the store (recipes)
#   cp -r DST/tp_rank_03               one rank of an offline convert: the rank baseline
#   ckpt pull REF:neuron-tp8 --rank 3  that rank out of the store
# Each baseline also runs with a sync of what it wrote ("+ sync"), because
# ckpt makes its writes durable (import: syncfs before and after publishing;
# pull: fsync of every file) — those rows are the like-for-like ones.
# Before each step the page cache holds its input and earlier writeback is
# flushed. The pulled files are compared with the source / the offline
# convert (cmp) after timing. Prints `ckpt du` before and after the convert,
# then a table of ratios against the goals: import within 2x of cp -r +
# sha256sum, pull and rank pull within 1.5x of cp -r.
#
# Environment:
#   CKPT_BIN        the ckpt binary (default: build/ckpt beside this folder; use
#                   a release build, not SAN=1)
#   BENCH_SCALE     gen-model --scale (default 2: hidden 2048, vocab 64128)
#   BENCH_LAYERS    gen-model --layers (default 14: about 2.05 GB)
#   BENCH_SHARD_MB  gen-model --shard-mb (default 500)
#   BENCH_TP        tensor-parallel size (default 8)
#   BENCH_RANK      the rank to pull (default 3)
#   BENCH_DIR       where the temporary work folder goes (default /tmp; put it
#                   on the filesystem you care about)
#   BENCH_PYTHON    python3 for measure.py (default /usr/bin/python3)
#   BENCH_KEEP=1    keep the work folder
# A quick run: BENCH_SCALE=16 BENCH_LAYERS=2 bench/store.sh
set -euo pipefail

BENCH_NAME=store
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SHARD_MB=${BENCH_SHARD_MB:-500}
TP=${BENCH_TP:-8}
RANK=${BENCH_RANK:-3}

[ -x "$PY" ] || PY=python3
[ -f "$HERE/measure.py" ] || die "$HERE/measure.py is missing"
[ "$RANK" -lt "$TP" ] || die "BENCH_RANK ($RANK) must be below BENCH_TP ($TP)"
bench_start
bench_cleanup_on_exit
export CKPT_HOME=$WORK/home
REPO=bench/llama
RR=$(printf '%02d' "$RANK")

quietly() { "$@" >"$WORK/log.txt" 2>&1 || { cat "$WORK/log.txt" >&2; die "failed: $*"; }; }
warm() { find "$@" -type f -exec cat {} + >/dev/null; }
bytes_of() { find "$@" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
gb() { awk -v b="$1" 'BEGIN {printf "%.2f GB", b / 1e9}'; }

# measure KEY LABEL CMD...: runs CMD under measure.py after flushing earlier
# writes; stores the wall time and peak RSS in WALL[KEY], RSS[KEY].
declare -A WALL RSS LABEL BYTES
ORDER=()
RSS_HOW=rusage
measure() {
    local key=$1 label=$2
    shift 2
    sync
    if ! "$PY" "$HERE/measure.py" --out "$WORK/measure.txt" --log "$WORK/log.txt" "$@"; then
        cat "$WORK/log.txt" >&2
        die "'$label' failed"
    fi
    local wall rss how
    read -r wall rss _ how _ <"$WORK/measure.txt"
    RSS_HOW=$how
    WALL[$key]=$wall
    RSS[$key]=$rss
    LABEL[$key]=$label
    ORDER+=("$key")
    printf '  %-44s %8.2f s %9.1f MiB\n' "$label" "$wall" "$rss"
}
# du_line: the `ckpt du` figures, and the JSON kept in $WORK/du.json.
du_now() {
    "$CKPT_BIN" du --json >"$WORK/du.json"
    "$CKPT_BIN" du
}
du_get() { "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$WORK/du.json" "$1"; }

echo "== machine: $(nproc) cores, $(uname -r), $(df -PT "$WORK" | awk 'NR==2 {print $2}') at $WORK"
echo "== ckpt: $CKPT_BIN"

# ---- the checkpoint ---------------------------------------------------------
SRC=$WORK/src
echo "== generating llama --scale $SCALE --layers $LAYERS --shard-mb $SHARD_MB"
quietly "$CKPT_BIN" gen-model llama "$SRC" --scale "$SCALE" --layers "$LAYERS" --shard-mb "$SHARD_MB"
SRC_BYTES=$(bytes_of "$SRC")
NFILES=$(find "$SRC" -type f | wc -l)
echo "  $NFILES files, $(gb "$SRC_BYTES") ($SRC_BYTES bytes)"
echo "== offline convert for the rank baseline (not timed)"
OFF=$WORK/offline
quietly "$CKPT_BIN" convert "$SRC" "$OFF" --layout neuron --tp "$TP" --quiet
RANK_BYTES=$(bytes_of "$OFF/tp_rank_$RR")
echo "  tp_rank_$RR: $(gb "$RANK_BYTES")"

# ---- the runs -----------------------------------------------------------------
echo "== timing (page cache warm; writeback of earlier steps flushed before each)"
warm "$SRC"
measure cpsha "cp -r + sha256sum" sh -c 'cp -r "$1" "$2" && sha256sum "$1"/* >/dev/null' sh "$SRC" "$WORK/cp"
rm -rf "$WORK/cp"
warm "$SRC"
measure cpshasync "cp -r + sha256sum + sync" sh -c 'cp -r "$1" "$2" && sha256sum "$1"/* >/dev/null && sync "$2" "$2"/*' sh "$SRC" "$WORK/cp"
rm -rf "$WORK/cp"

warm "$SRC"
measure import "ckpt import" "$CKPT_BIN" import "$SRC" --repo "$REPO" --quiet
echo "  after import:  $(du_now)"
PHYS0=$(du_get physical_bytes)
warm "$SRC"
measure reimport "ckpt import again (stores nothing)" "$CKPT_BIN" import "$SRC" --repo "$REPO" --quiet
du_now >/dev/null
[ "$(du_get physical_bytes)" = "$PHYS0" ] || die "importing again grew the store: $PHYS0 -> $(du_get physical_bytes) bytes"

warm "$SRC"
measure cp "cp -r" cp -r "$SRC" "$WORK/cp"
rm -rf "$WORK/cp"
warm "$SRC"
measure cpsync "cp -r + sync" sh -c 'cp -r "$1" "$2" && sync "$2" "$2"/*' sh "$SRC" "$WORK/cp"
rm -rf "$WORK/cp"

warm "$CKPT_HOME/blobs"
measure pull "ckpt pull (original)" "$CKPT_BIN" pull "$REPO" -o "$WORK/pull" --quiet
for f in "$SRC"/*; do cmp -s "$f" "$WORK/pull/$(basename "$f")" || die "pulled $(basename "$f") differs from the source"; done
[ "$(find "$WORK/pull" -type f | wc -l)" = "$NFILES" ] || die "the pull wrote other files than the source has"
rm -rf "$WORK/pull"

warm "$CKPT_HOME/blobs"
measure convert "ckpt convert (store) neuron tp$TP" "$CKPT_BIN" convert "$REPO" --layout neuron --tp "$TP" --quiet
LAYOUT_REF=$REPO@main:neuron-tp$TP
echo "  after convert: $(du_now)"
PHYS1=$(du_get physical_bytes)

warm "$OFF/tp_rank_$RR"
measure cprank "cp -r tp_rank_$RR" cp -r "$OFF/tp_rank_$RR" "$WORK/cp"
rm -rf "$WORK/cp"
warm "$OFF/tp_rank_$RR"
measure cpranksync "cp -r tp_rank_$RR + sync" sh -c 'cp -r "$1" "$2" && sync "$2" "$2"/*' sh "$OFF/tp_rank_$RR" "$WORK/cp"
rm -rf "$WORK/cp"

warm "$CKPT_HOME/blobs"
measure pullrank "ckpt pull neuron-tp$TP --rank $RANK" "$CKPT_BIN" pull "$LAYOUT_REF" --rank "$RANK" -o "$WORK/pull" --quiet
for f in "$OFF/tp_rank_$RR"/*; do
    cmp -s "$f" "$WORK/pull/$(basename "$f")" || die "pulled rank $RANK: $(basename "$f") differs from the offline convert"
done
rm -rf "$WORK/pull"

# ---- the table ----------------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
verdict() { awk -v v="$1" -v g="$2" 'BEGIN {print (v <= g ? "met" : "MISSED")}'; }
BYTES=([cpsha]=$SRC_BYTES [cpshasync]=$SRC_BYTES [import]=$SRC_BYTES [reimport]=$SRC_BYTES [cp]=$SRC_BYTES
    [cpsync]=$SRC_BYTES [pull]=$SRC_BYTES [convert]=$SRC_BYTES [cprank]=$RANK_BYTES [cpranksync]=$RANK_BYTES
    [pullrank]=$RANK_BYTES)

echo
echo "== results: llama --scale $SCALE --layers $LAYERS, $(gb "$SRC_BYTES") in $NFILES files; rank $RANK of neuron tp$TP: $(gb "$RANK_BYTES")"
printf '%-44s %10s %14s %10s\n' "step" "wall s" "peak RSS MiB" "GB/s"
for k in "${ORDER[@]}"; do
    printf '%-44s %10.2f %14.1f %10.2f\n' "${LABEL[$k]}" "${WALL[$k]}" "${RSS[$k]}" \
        "$(awk -v b="${BYTES[$k]}" -v t="${WALL[$k]}" 'BEGIN {printf "%.2f", (t > 0 ? b / 1e9 / t : 0)}')"
done
echo
echo "ckpt du: logical $(gb "$(du_get logical_bytes)"), physical $(gb "$PHYS1") in $(du_get blobs) blobs," \
    "dedup ratio $(printf '%.2f' "$(du_get dedup_ratio)"), catalog $(awk -v b="$(du_get catalog_bytes)" 'BEGIN {printf "%.1f MiB", b / 1048576}')"
GROWTH=$(awk -v a="$PHYS1" -v b="$PHYS0" 'BEGIN {printf "%.4f", (a - b) * 100 / b}')
echo "convert neuron-tp$TP in the store: physical $PHYS0 -> $PHYS1 bytes (+$GROWTH%)"
echo
printf '%-44s %10s   %-10s %s\n' "ratio" "value" "goal" "verdict"
row() { printf '%-44s %10s   %-10s %s\n' "$1" "$2" "$3" "$4"; }
r=$(ratio "${WALL[import]}" "${WALL[cpsha]}");          row "import / (cp -r + sha256sum)" "$r" "<= 2" "$(verdict "$r" 2)"
r=$(ratio "${WALL[import]}" "${WALL[cpshasync]}");      row "import / (cp -r + sha256sum + sync)" "$r" "<= 2" "$(verdict "$r" 2)"
r=$(ratio "${WALL[pull]}" "${WALL[cp]}");               row "pull / cp -r" "$r" "<= 1.5" "$(verdict "$r" 1.5)"
r=$(ratio "${WALL[pull]}" "${WALL[cpsync]}");           row "pull / (cp -r + sync)" "$r" "<= 1.5" "$(verdict "$r" 1.5)"
r=$(ratio "${WALL[pullrank]}" "${WALL[cprank]}");       row "pull --rank $RANK / cp -r tp_rank_$RR" "$r" "<= 1.5" "$(verdict "$r" 1.5)"
r=$(ratio "${WALL[pullrank]}" "${WALL[cpranksync]}");   row "pull --rank $RANK / (cp -r tp_rank_$RR + sync)" "$r" "<= 1.5" "$(verdict "$r" 1.5)"
row "convert neuron-tp$TP physical growth %" "$GROWTH" "< 1" "$(awk -v g="$GROWTH" 'BEGIN {print (g < 1 ? "met" : "MISSED")}')"
echo "(peak RSS from $([ "$RSS_HOW" = time ] && echo "/usr/bin/time %M" || echo "getrusage, floored at the ~10 MiB of the python wrapper"));" \
    "ckpt syncs what it writes, so the '+ sync' rows are the like-for-like baselines"
