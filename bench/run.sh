#!/usr/bin/env bash
# bench/run.sh — the speed and memory benchmark of the transform engine
# (issue 3, "Speed and memory"). Run by `make bench`; not a test.
#
# On a generated `llama` checkpoint of about 2 GB (bf16; Llama-3-8B shapes at
# half width: hidden 2048, 32 heads, 8 KV heads, 14 layers, 500 MB shards)
# with a warm page cache, it measures the wall time and peak RSS of:
#   cp -r SRC                         the baseline of the issue (page cache only)
#   cp -r SRC + fsync of the copy     the like-for-like baseline: ckpt fsyncs its output
#   ckpt convert --layout neuron --tp 8
#   ckpt consolidate of that output   (checked byte-identical to SRC with cmp)
#   bench/neuron_convert.py           the Python/numpy way, the same tensors
#   bench/neuron_convert.py --fsync   the same, durable
# and prints a table with the ratios and the goals: convert and consolidate
# within 1.5x of cp -r, peak RSS under 256 MiB, at least 3x faster than Python.
#
# The steps run round-robin BENCH_REPEAT times (default 3) and the table shows
# each step's median wall time (min and max beside it) and its largest peak
# RSS, so that a disturbance (another job on the machine, writeback, a VM
# backing fresh page-cache memory) does not fall on one step only. Before each
# run the earlier writes are flushed (sync, untimed), the step's input is read
# once (cat > /dev/null) so that the page cache is warm, and memory is
# prefaulted (BENCH_PREFAULT below).
#
# Before timing, the Python script's output is checked tensor by tensor
# against ckpt's on tiny llama and qwen2 models (qwen2 pads 14 heads to 16).
#
# Environment:
#   CKPT_BIN        the ckpt binary (default: build/ckpt beside this folder)
#   BENCH_SCALE     gen-model --scale (default 2: hidden 2048, vocab 64128)
#   BENCH_LAYERS    gen-model --layers (default 14: 2.05 GB)
#   BENCH_SHARD_MB  gen-model --shard-mb (default 500)
#   BENCH_TP        tensor-parallel size (default 8)
#   BENCH_REPEAT    rounds (default 3)
#   BENCH_DIR       where the temporary work folder goes (default /tmp; it
#                   should be on the filesystem you care about)
#   BENCH_PYTHON    a python3 with numpy (default /usr/bin/python3)
#   BENCH_PREFAULT  1 (default): just before each run, touch and free about as
#                   much memory as the step will need (1.1x the checkpoint, 2.6x
#                   for Python). On a VM whose host reclaims free guest memory
#                   (virtio-balloon free page reporting, as on the machine this
#                   was written on) the first touch of a page costs the host a
#                   fault: writing 2 GB into fresh page cache then takes 3-10 s
#                   instead of 0.5 s, whichever step happens to get such pages.
#                   Prefaulting gives every step recently used memory, so the
#                   figures compare the programs. 0: do not.
#   BENCH_KEEP=1    keep the work folder
#   BENCH_FULL_CHECK=1  also compare the full-size Python output with ckpt's
# A quick run: BENCH_SCALE=16 BENCH_LAYERS=2 BENCH_REPEAT=1 bench/run.sh
set -euo pipefail

BENCH_NAME=run
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SHARD_MB=${BENCH_SHARD_MB:-500}
TP=${BENCH_TP:-8}
PREFAULT=${BENCH_PREFAULT:-1}

"$PY" -c 'import numpy' 2>/dev/null || die "$PY cannot import numpy (make deps installs python3-numpy)"
bench_start
bench_cleanup_on_exit

# quietly CMD...: runs CMD, showing its output only when it fails.
quietly() { "$@" >"$WORK/log.txt" 2>&1 || { cat "$WORK/log.txt" >&2; die "failed: $*"; }; }
warm() { find "$@" -type f -exec cat {} + >/dev/null; }
bytes_of() { find "$@" -type f -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
gb() { awk -v b="$1" 'BEGIN {printf "%.2f GB", b / 1e9}'; }

# prefault BYTES: touches BYTES of fresh memory and frees it (see BENCH_PREFAULT).
prefault() {
    [ "$PREFAULT" = 1 ] || return 0
    "$PY" -c 'import numpy as np, sys; a = np.ones(int(sys.argv[1]), dtype=np.uint8)' "$1"
}

# measure KEY LABEL WARM_DIR PREFAULT_BYTES CMD...: flushes earlier writes,
# reads WARM_DIR into the page cache, prefaults, runs CMD under measure.py;
# appends the wall time and peak RSS to WALLS[KEY] and RSSES[KEY].
declare -A WALLS RSSES LABEL
ORDER=()
RSS_HOW=time
measure() {
    local key=$1 label=$2 warm_dir=$3 pf=$4
    shift 4
    sync
    warm "$warm_dir"
    prefault "$pf"
    if ! "$PY" "$HERE/measure.py" --out "$WORK/measure.txt" --log "$WORK/log.txt" "$@"; then
        cat "$WORK/log.txt" >&2
        die "'$label' failed"
    fi
    local wall rss rc how
    read -r wall rss rc how _ <"$WORK/measure.txt"
    RSS_HOW=$how
    if [ -z "${LABEL[$key]:-}" ]; then
        LABEL[$key]=$label
        ORDER+=("$key")
    fi
    WALLS[$key]="${WALLS[$key]:-} $wall"
    RSSES[$key]="${RSSES[$key]:-} $rss"
    printf '  %-34s %8.2f s %9.1f MiB\n' "$label" "$wall" "$rss"
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
minimum() { tr ' ' '\n' | grep . | sort -g | head -1; }
maximum() { tr ' ' '\n' | grep . | sort -g | tail -1; }

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r), $(df -PT "$WORK" | awk 'NR==2 {print $2}') at $WORK, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ckpt: $CKPT_BIN"

# ---- 1. the Python baseline must write ckpt's tensors -------------------------
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

# ---- 2. the checkpoint ----------------------------------------------------------
SRC=$WORK/src
echo "== generating llama --scale $SCALE --layers $LAYERS --shard-mb $SHARD_MB"
quietly "$CKPT_BIN" gen-model llama "$SRC" --scale "$SCALE" --layers "$LAYERS" --shard-mb "$SHARD_MB"
SRC_BYTES=$(bytes_of "$SRC")
NFILES=$(find "$SRC" -name '*.safetensors' | wc -l)
GEOM=$("$PY" -c 'import json, sys
c = json.load(open(sys.argv[1]))
print("hidden %s, %s heads, %s KV heads, head_dim %s, intermediate %s, vocab %s, %s layers" % (c["hidden_size"],
      c["num_attention_heads"], c["num_key_value_heads"], c.get("head_dim"), c["intermediate_size"], c["vocab_size"],
      c["num_hidden_layers"]))' "$SRC/config.json")
echo "  $NFILES files, $(gb "$SRC_BYTES") of tensors; $GEOM"

PF_COPY=$(awk -v b="$SRC_BYTES" 'BEGIN {printf "%.0f", b * 1.1}')
PF_PY=$(awk -v b="$SRC_BYTES" 'BEGIN {printf "%.0f", b * 2.6}')
[ "$PREFAULT" = 1 ] && echo "  prefaulting $(gb "$PF_COPY") before each cp/ckpt run, $(gb "$PF_PY") before each Python run (BENCH_PREFAULT=0 to skip)"

# ---- 3. the runs ------------------------------------------------------------------
same=yes
CONV_BYTES=0
for round in $(seq 1 "$REPEAT"); do
    echo "== round $round of $REPEAT (load $(cut -d' ' -f1-3 /proc/loadavg))"
    measure cp "cp -r" "$SRC" "$PF_COPY" cp -r "$SRC" "$WORK/cp"
    rm -rf "$WORK/cp"

    measure cpsync "cp -r + fsync" "$SRC" "$PF_COPY" sh -c 'cp -r "$1" "$2" && sync "$2" "$2"/*' sh "$SRC" "$WORK/cp"
    rm -rf "$WORK/cp"

    measure convert "ckpt convert neuron tp$TP" "$SRC" "$PF_COPY" \
        "$CKPT_BIN" convert "$SRC" "$WORK/conv" --layout neuron --tp "$TP" --quiet
    CONV_BYTES=$(bytes_of "$WORK/conv")

    measure consolidate "ckpt consolidate" "$WORK/conv" "$PF_COPY" "$CKPT_BIN" consolidate "$WORK/conv" "$WORK/cons" --quiet
    if [ "$round" = 1 ]; then
        for f in "$SRC"/*; do
            b=$(basename "$f")
            cmp -s "$f" "$WORK/cons/$b" || { echo "  consolidated $b differs from the source" >&2; same=no; }
        done
        for f in "$WORK/cons"/*; do
            b=$(basename "$f")
            [ -e "$SRC/$b" ] || { echo "  consolidate wrote a file the source does not have: $b" >&2; same=no; }
        done
    fi
    rm -rf "$WORK/cons"

    measure python "python/numpy neuron tp$TP" "$SRC" "$PF_PY" "$PY" "$HERE/neuron_convert.py" "$SRC" "$WORK/py" --tp "$TP"
    if [ "$round" = 1 ] && [ "${BENCH_FULL_CHECK:-0}" = 1 ]; then
        echo "  full-size check: $("$PY" "$HERE/neuron_convert.py" --check "$WORK/py" "$WORK/conv" | tail -1)"
    fi
    rm -rf "$WORK/py" "$WORK/conv"

    measure pysync "python/numpy + fsync" "$SRC" "$PF_PY" \
        "$PY" "$HERE/neuron_convert.py" "$SRC" "$WORK/py" --tp "$TP" --fsync
    rm -rf "$WORK/py"
done
sync

# ---- 4. the table -----------------------------------------------------------------
declare -A WALL RSS
for k in "${ORDER[@]}"; do
    WALL[$k]=$(echo "${WALLS[$k]}" | median)
    RSS[$k]=$(echo "${RSSES[$k]}" | maximum)
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
verdict() { awk -v v="$1" -v op="$2" -v g="$3" 'BEGIN {ok = (op == "<=" ? v <= g : op == "<" ? v < g : v >= g); print ok ? "met" : "MISSED"}'; }

echo
echo "== results: llama --scale $SCALE --layers $LAYERS, $(gb "$SRC_BYTES") in $NFILES files -> neuron tp$TP ($(gb "$CONV_BYTES") in $TP rank folders); $REPEAT round(s), median wall"
printf '%-30s %8s %8s %8s %13s %8s\n' "step" "wall s" "min" "max" "peak RSS MiB" "GB/s"
for k in "${ORDER[@]}"; do
    printf '%-30s %8.2f %8.2f %8.2f %13.1f %8.2f\n' "${LABEL[$k]}" "${WALL[$k]}" \
        "$(echo "${WALLS[$k]}" | minimum)" "$(echo "${WALLS[$k]}" | maximum)" "${RSS[$k]}" \
        "$(awk -v b="$SRC_BYTES" -v t="${WALL[$k]}" 'BEGIN {printf "%.2f", (t > 0 ? b / 1e9 / t : 0)}')"
done
echo
printf '%-30s %8s   %-8s %s\n' "ratio (median walls)" "value" "goal" "verdict"
row() { printf '%-30s %8s   %-8s %s\n' "$1" "$2" "$3" "$4"; }
r=$(ratio "${WALL[convert]}" "${WALL[cp]}");         row "convert / cp -r" "$r" "<= 1.5" "$(verdict "$r" "<=" 1.5)"
r=$(ratio "${WALL[consolidate]}" "${WALL[cp]}");     row "consolidate / cp -r" "$r" "<= 1.5" "$(verdict "$r" "<=" 1.5)"
r=$(ratio "${WALL[convert]}" "${WALL[cpsync]}");     row "convert / (cp -r + fsync)" "$r" "<= 1.5" "$(verdict "$r" "<=" 1.5)"
r=$(ratio "${WALL[consolidate]}" "${WALL[cpsync]}"); row "consolidate / (cp -r + fsync)" "$r" "<= 1.5" "$(verdict "$r" "<=" 1.5)"
r=$(ratio "${WALL[python]}" "${WALL[convert]}");     row "python / convert" "$r" ">= 3" "$(verdict "$r" ">=" 3)"
r=$(ratio "${WALL[pysync]}" "${WALL[convert]}");     row "(python + fsync) / convert" "$r" ">= 3" "$(verdict "$r" ">=" 3)"
row "convert peak RSS MiB" "${RSS[convert]}" "< 256" "$(verdict "${RSS[convert]}" "<" 256)"
row "consolidate peak RSS MiB" "${RSS[consolidate]}" "< 256" "$(verdict "${RSS[consolidate]}" "<" 256)"
echo
if [ "$RSS_HOW" = time ]; then
    echo "peak RSS: /usr/bin/time %M (largest process of the step)."
else
    echo "peak RSS: getrusage of the children, floored at the ~10 MiB the python wrapper has at fork."
fi
echo "ckpt fsyncs every file it writes: the '+ fsync' rows are the like-for-like baselines."
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg) (other jobs on the machine skew every figure)"
if [ "$same" = yes ]; then
    echo "consolidated checkpoint: every file byte-identical to the source (cmp)"
else
    echo "consolidated checkpoint: DIFFERS from the source (see above)"
    exit 1
fi
