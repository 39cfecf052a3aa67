#!/usr/bin/env bash
# bench/run.sh — the speed and memory benchmark of the transform engine
# (issue 3, "Speed and memory"). Run by `make bench`; not a test.
#
# On a generated `llama` checkpoint of about 2 GB (bf16; Llama-3-8B shapes at
# half width, 14 layers, 500 MB shards) with a warm page cache, it measures in
# one run the wall time and peak RSS of:
#   cp -r SRC                         the baseline (into the page cache)
#   cp -r SRC + fsync of the copy     the durable baseline (ckpt fsyncs its output)
#   ckpt convert --layout neuron --tp 8
#   ckpt consolidate of that output   (and checks it equals SRC byte for byte)
#   bench/neuron_convert.py           the Python/numpy way, same tensors
#   bench/neuron_convert.py --fsync   the same, durable
# and prints a table with the ratios and the goals: convert and consolidate
# within 1.5x of cp -r, peak RSS under 256 MiB, at least 3x faster than Python.
# Before timing, the Python script's output is checked tensor by tensor
# against ckpt's on tiny llama and qwen2 models (the qwen2 one pads 14 heads).
#
# Environment:
#   CKPT_BIN        the ckpt binary (default: build/ckpt beside this folder)
#   BENCH_SCALE     gen-model --scale (default 2: hidden 2048, vocab 64128)
#   BENCH_LAYERS    gen-model --layers (default 14: about 2.05 GB)
#   BENCH_SHARD_MB  gen-model --shard-mb (default 500)
#   BENCH_TP        tensor-parallel size (default 8)
#   BENCH_DIR       where the temporary work folder goes (default /tmp; put it
#                   on the filesystem you care about)
#   BENCH_PYTHON    a python3 with numpy (default /usr/bin/python3)
#   BENCH_KEEP=1    keep the work folder
#   BENCH_FULL_CHECK=1  also compare the Python output with ckpt's at full size
# A quick run: BENCH_SCALE=16 BENCH_LAYERS=2 bench/run.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CKPT_BIN=${CKPT_BIN:-$HERE/../build/ckpt}
PY=${BENCH_PYTHON:-/usr/bin/python3}
SCALE=${BENCH_SCALE:-2}
LAYERS=${BENCH_LAYERS:-14}
SHARD_MB=${BENCH_SHARD_MB:-500}
TP=${BENCH_TP:-8}
BASE=${BENCH_DIR:-/tmp}

die() { echo "bench: $*" >&2; exit 1; }

[ -x "$CKPT_BIN" ] || die "CKPT_BIN '$CKPT_BIN' is not an executable (build it: make, or make BUILD=... BUILD/ckpt)"
"$PY" -c 'import numpy' 2>/dev/null || die "$PY cannot import numpy (make deps installs python3-numpy)"
mkdir -p "$BASE"
WORK=$(mktemp -d "$BASE/ckpt-bench.XXXXXX")
cleanup() { if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench: kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

CKPT() { "$CKPT_BIN" "$@"; }
# quietly CMD...: runs CMD, showing its output only when it fails.
quietly() { "$@" >"$WORK/log.txt" 2>&1 || { cat "$WORK/log.txt" >&2; die "failed: $*"; }; }
warm() { find "$@" -type f -exec cat {} + >/dev/null; }
bytes_of() { find "$@" -type f -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }

# measure KEY LABEL CMD...: runs CMD under measure.py after flushing earlier
# writes (so no step pays for the previous one's writeback); stores the wall
# time and peak RSS in WALL[KEY], RSS[KEY].
declare -A WALL RSS LABEL
ORDER=()
measure() {
    local key=$1 label=$2
    shift 2
    sync
    if ! "$PY" "$HERE/measure.py" --out "$WORK/measure.txt" --log "$WORK/log.txt" "$@"; then
        cat "$WORK/log.txt" >&2
        die "'$label' failed"
    fi
    local wall rss rc how
    read -r wall rss rc how <"$WORK/measure.txt"
    RSS_HOW=$how
    WALL[$key]=$wall
    RSS[$key]=$rss
    LABEL[$key]=$label
    ORDER+=("$key")
    printf '  %-34s %8.2f s %9.1f MiB\n' "$label" "$wall" "$rss"
}

echo "== machine: $(nproc) cores, $(uname -r), $(df -PT "$WORK" | awk 'NR==2 {print $2}') at $WORK"
echo "== ckpt: $CKPT_BIN"

# ---- 1. the Python baseline must produce ckpt's tensors -----------------
echo "== checking that bench/neuron_convert.py writes the same tensors as ckpt (tp $TP)"
for spec in "llama 16" "qwen2 8"; do
    set -- $spec
    d=$WORK/check-$1
    mkdir -p "$d"
    quietly "$CKPT_BIN" gen-model "$1" "$d/src" --scale "$2" --layers 2 --shard-mb 2
    quietly "$CKPT_BIN" convert "$d/src" "$d/ckpt" --layout neuron --tp "$TP" --quiet
    quietly "$PY" "$HERE/neuron_convert.py" "$d/src" "$d/py" --tp "$TP"
    if ! out=$("$PY" "$HERE/neuron_convert.py" --check "$d/py" "$d/ckpt"); then
        echo "$out"
        die "the Python baseline does not match ckpt for $1; its timing would mean nothing"
    fi
    echo "  $1 (--scale $2, 2 layers): ${out##*$'\n'}"
    rm -rf "$d"
done

# ---- 2. the checkpoint ----------------------------------------------------
SRC=$WORK/src
echo "== generating llama --scale $SCALE --layers $LAYERS --shard-mb $SHARD_MB"
CKPT gen-model llama "$SRC" --scale "$SCALE" --layers "$LAYERS" --shard-mb "$SHARD_MB"
SRC_BYTES=$(bytes_of "$SRC")
NFILES=$(find "$SRC" -name '*.safetensors' | wc -l)
GEOM=$("$PY" -c 'import json, sys
c = json.load(open(sys.argv[1]))
print("hidden %s, %s heads, %s KV heads, head_dim %s, intermediate %s, vocab %s, %s layers" % (c["hidden_size"],
      c["num_attention_heads"], c["num_key_value_heads"], c.get("head_dim"), c["intermediate_size"], c["vocab_size"],
      c["num_hidden_layers"]))' "$SRC/config.json")
echo "  $NFILES files, $(awk -v b="$SRC_BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') ($SRC_BYTES bytes of tensors); $GEOM"

# ---- 3. the runs ------------------------------------------------------------
echo "== timing (page cache warm; writeback of earlier steps flushed before each)"
warm "$SRC"
measure cp "cp -r" cp -r "$SRC" "$WORK/cp"
rm -rf "$WORK/cp"

warm "$SRC"
measure cpsync "cp -r + fsync" sh -c 'cp -r "$1" "$2" && sync "$2" "$2"/*' sh "$SRC" "$WORK/cp"
rm -rf "$WORK/cp"

warm "$SRC"
measure convert "ckpt convert neuron tp$TP" "$CKPT_BIN" convert "$SRC" "$WORK/conv" --layout neuron --tp "$TP" --quiet
CONV_BYTES=$(bytes_of "$WORK/conv")

warm "$WORK/conv"
measure consolidate "ckpt consolidate" "$CKPT_BIN" consolidate "$WORK/conv" "$WORK/cons" --quiet

same=yes
for f in "$SRC"/*; do
    b=$(basename "$f")
    if ! cmp -s "$f" "$WORK/cons/$b"; then
        echo "  consolidated $b differs from the source" >&2
        same=no
    fi
done
for f in "$WORK/cons"/*; do
    b=$(basename "$f")
    [ "$b" = ckpt-layout.json ] || [ -e "$SRC/$b" ] || { echo "  consolidate wrote an extra file $b" >&2; same=no; }
done
rm -rf "$WORK/cons"

warm "$SRC"
measure python "python/numpy neuron tp$TP" "$PY" "$HERE/neuron_convert.py" "$SRC" "$WORK/py" --tp "$TP"
if [ "${BENCH_FULL_CHECK:-0}" = 1 ]; then
    echo "  full-size check: $("$PY" "$HERE/neuron_convert.py" --check "$WORK/py" "$WORK/conv" | tail -1)"
fi
rm -rf "$WORK/py"

warm "$SRC"
measure pysync "python/numpy + fsync" "$PY" "$HERE/neuron_convert.py" "$SRC" "$WORK/py" --tp "$TP" --fsync
rm -rf "$WORK/py" "$WORK/conv"
sync

# ---- 4. the table -----------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
verdict() { awk -v v="$1" -v op="$2" -v g="$3" 'BEGIN {ok = (op == "<=" ? v <= g : op == "<" ? v < g : v >= g); print ok ? "met" : "MISSED"}'; }

echo
echo "== results: llama --scale $SCALE --layers $LAYERS, $(awk -v b="$SRC_BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') in $NFILES files -> neuron tp$TP ($(awk -v b="$CONV_BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') written)"
printf '%-34s %10s %14s %10s\n' "step" "wall s" "peak RSS MiB" "GB/s"
for k in "${ORDER[@]}"; do
    printf '%-34s %10.2f %14.1f %10.2f\n' "${LABEL[$k]}" "${WALL[$k]}" "${RSS[$k]}" \
        "$(awk -v b="$SRC_BYTES" -v t="${WALL[$k]}" 'BEGIN {printf "%.2f", (t > 0 ? b / 1e9 / t : 0)}')"
done
echo
printf '%-34s %10s   %-10s %s\n' "ratio" "value" "goal" "verdict"
row() { printf '%-34s %10s   %-10s %s\n' "$1" "$2" "$3" "$4"; }
r=$(ratio "${WALL[convert]}" "${WALL[cp]}");          row "convert / cp -r" "$r" "<= 1.5" "$(verdict "$r" "<=" 1.5)"
r=$(ratio "${WALL[consolidate]}" "${WALL[cp]}");      row "consolidate / cp -r" "$r" "<= 1.5" "$(verdict "$r" "<=" 1.5)"
r=$(ratio "${WALL[convert]}" "${WALL[cpsync]}");      row "convert / (cp -r + fsync)" "$r" "<= 1.5" "$(verdict "$r" "<=" 1.5)"
r=$(ratio "${WALL[consolidate]}" "${WALL[cpsync]}");  row "consolidate / (cp -r + fsync)" "$r" "<= 1.5" "$(verdict "$r" "<=" 1.5)"
r=$(ratio "${WALL[python]}" "${WALL[convert]}");      row "python / convert" "$r" ">= 3" "$(verdict "$r" ">=" 3)"
r=$(ratio "${WALL[pysync]}" "${WALL[convert]}");      row "(python + fsync) / convert" "$r" ">= 3" "$(verdict "$r" ">=" 3)"
row "convert peak RSS MiB" "${RSS[convert]}" "< 256" "$(verdict "${RSS[convert]}" "<" 256)"
row "consolidate peak RSS MiB" "${RSS[consolidate]}" "< 256" "$(verdict "${RSS[consolidate]}" "<" 256)"
echo "(peak RSS from $([ "$RSS_HOW" = time ] && echo "/usr/bin/time %M" || echo "getrusage, floored at the ~10 MiB of the python wrapper")); ckpt fsyncs its output, so the fsync rows are the like-for-like baselines"
echo
if [ "$same" = yes ]; then
    echo "consolidated checkpoint: every file byte-identical to the source (cmp)"
else
    echo "consolidated checkpoint: DIFFERS from the source (see above)"
    exit 1
fi
