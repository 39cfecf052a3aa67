#!/usr/bin/env bash
# bench/lora.sh — the speed of `ckpt merge-lora` (issue 9, "Speed"). Not a test.
#
# Merges a rank-16 adapter on every attention and MLP projection (q, k, v, o,
# gate, up, down: 7 per layer) into a generated `llama` checkpoint of about
# 2 GB (bf16; Llama-3-8B shapes at half width: hidden 2048, 32 heads, 8 KV
# heads, intermediate 7168, 14 layers, 500 MB shards), with a warm page
# cache, and measures wall time, CPU time (user + sys) and peak RSS of
#   cp -r BASE                        the baseline of the issue (page cache only)
#   cp -r BASE + sync of the copy     the like-for-like baseline: ckpt fsyncs its output
#   ckpt merge-lora BASE ADAPTER DST
# The steps run round-robin BENCH_REPEAT times (default 3); the table shows
# median wall (min and max beside it), median CPU and the largest peak RSS.
# From merge-lora --json: the GEMM work (2 * out * in * r per module), the
# GFLOP/s of cblas_sgemm (time inside it, per thread) and of the whole pass
# (GFLOP over the wall time of reading, computing and writing blocks).
# Goal: merge within 2x of cp -r.
#
# Before timing, a small merge is checked against tests/lora_ref.py (numpy).
#
# Environment:
#   CKPT_BIN        the ckpt binary (default: build/ckpt beside this folder;
#                   an optimised build, not a sanitizer one)
#   BENCH_SCALE     gen-model --scale (default 2), BENCH_LAYERS (default 14),
#   BENCH_SHARD_MB  gen-model --shard-mb (default 500)
#   BENCH_RANK      adapter rank (default 16)
#   BENCH_THREADS   merge-lora --threads (default: its own, 2)
#   BENCH_REPEAT    rounds (default 3)
#   BENCH_DIR       where the temporary work folder goes (default /tmp)
#   BENCH_PYTHON    a python3 with numpy (default /usr/bin/python3)
#   BENCH_KEEP=1    keep the work folder
# A quick run: BENCH_SCALE=16 BENCH_LAYERS=2 BENCH_REPEAT=1 bench/lora.sh
set -euo pipefail

BENCH_NAME=lora
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SHARD_MB=${BENCH_SHARD_MB:-500}
RANK=${BENCH_RANK:-16}
THREADS=()
[ -n "${BENCH_THREADS:-}" ] && THREADS=(--threads "$BENCH_THREADS")
TARGETS=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
GEN="python3 $HERE/../tests/lora_gen.py"
REF="$PY $HERE/../tests/lora_ref.py"

[ -x /usr/bin/time ] || die "needs GNU time at /usr/bin/time for CPU time and peak RSS"
bench_start
bench_cleanup_on_exit
export CKPT_QUIET=1

quietly() { "$@" >"$WORK/log.txt" 2>&1 || { cat "$WORK/log.txt" >&2; die "failed: $*"; }; }
warm() { find "$@" -type f -exec cat {} + >/dev/null; }
bytes_of() { find "$@" -type f -name '*.safetensors' -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
gb() { awk -v b="$1" 'BEGIN {printf "%.2f GB", b / 1e9}'; }

# measure KEY LABEL WARM_DIRS CMD...: flushes earlier writes, reads WARM_DIRS (space-separated) into
# the page cache, runs CMD under GNU time; appends wall, CPU and peak RSS.
declare -A WALLS CPUS RSSES LABEL
ORDER=()
measure() {
    local key=$1 label=$2 warm_dir=$3
    shift 3
    sync
    read -r -a dirs <<<"$warm_dir"
    warm "${dirs[@]}"
    if ! /usr/bin/time -f '%e %U %S %M' -o "$WORK/time.txt" "$@" >"$WORK/out.txt" 2>"$WORK/log.txt"; then
        cat "$WORK/log.txt" >&2
        die "'$label' failed"
    fi
    local wall user sys kib
    read -r wall user sys kib < <(tail -n 1 "$WORK/time.txt")
    if [ -z "${LABEL[$key]:-}" ]; then
        LABEL[$key]=$label
        ORDER+=("$key")
    fi
    local cpu rss
    cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.2f", u + s}')
    rss=$(awk -v k="$kib" 'BEGIN {printf "%.1f", k / 1024}')
    WALLS[$key]="${WALLS[$key]:-} $wall"
    CPUS[$key]="${CPUS[$key]:-} $cpu"
    RSSES[$key]="${RSSES[$key]:-} $rss"
    printf '  %-28s %8.2f s wall %7.2f s cpu %9.1f MiB\n' "$label" "$wall" "$cpu" "$rss"
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
minimum() { tr ' ' '\n' | grep . | sort -g | head -1; }
maximum() { tr ' ' '\n' | grep . | sort -g | tail -1; }

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r), $(df -PT "$WORK" | awk 'NR==2 {print $2}') at $WORK, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== ckpt: $CKPT_BIN"

# ---- 1. correctness on a small model ----
if "$PY" -c 'import numpy' 2>/dev/null; then
    d=$WORK/check
    mkdir -p "$d"
    quietly "$CKPT_BIN" gen-model llama "$d/base" --scale 16 --layers 2
    quietly $GEN "$d/base" "$d/ad" --targets $TARGETS --rank "$RANK" --alpha 32
    quietly "$CKPT_BIN" merge-lora "$d/base" "$d/ad" "$d/merged" "${THREADS[@]}"
    out=$($REF merge "$d/base" "$d/ad" "$d/merged") || die "the merge does not match the numpy reference: $out"
    echo "== check (llama --scale 16, 2 layers): $out"
    rm -rf "$d"
else
    echo "== check skipped: $PY has no numpy"
fi

# ---- 2. the checkpoint and the adapter ----
SRC=$WORK/base
AD=$WORK/adapter
echo "== generating llama --scale $SCALE --layers $LAYERS --shard-mb $SHARD_MB and a rank-$RANK adapter on $TARGETS"
quietly "$CKPT_BIN" gen-model llama "$SRC" --scale "$SCALE" --layers "$LAYERS" --shard-mb "$SHARD_MB"
quietly $GEN "$SRC" "$AD" --targets $TARGETS --rank "$RANK" --alpha 32
SRC_BYTES=$(bytes_of "$SRC")
AD_BYTES=$(bytes_of "$AD")
NFILES=$(find "$SRC" -name '*.safetensors' | wc -l)
echo "  base: $NFILES files, $(gb "$SRC_BYTES") of tensors; adapter: $(gb "$AD_BYTES") (F32)"

# ---- 3. the runs ----
for round in $(seq 1 "$REPEAT"); do
    echo "== round $round of $REPEAT (load $(cut -d' ' -f1-3 /proc/loadavg))"
    measure cp "cp -r" "$SRC" cp -r "$SRC" "$WORK/cp"
    rm -rf "$WORK/cp"
    measure cpsync "cp -r + sync" "$SRC" sh -c 'cp -r "$1" "$2" && sync "$2" "$2"/*' sh "$SRC" "$WORK/cp"
    rm -rf "$WORK/cp"
    measure merge "ckpt merge-lora" "$SRC $AD" "$CKPT_BIN" merge-lora "$SRC" "$AD" "$WORK/merged" --json "${THREADS[@]}"
    tail -n 1 "$WORK/out.txt" >>"$WORK/stats.jsonl"
    rm -rf "$WORK/merged"
done
sync

# ---- 4. the table ----
declare -A WALL CPU RSS
for k in "${ORDER[@]}"; do
    WALL[$k]=$(echo "${WALLS[$k]}" | median)
    CPU[$k]=$(echo "${CPUS[$k]}" | median)
    RSS[$k]=$(echo "${RSSES[$k]}" | maximum)
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
verdict() { awk -v v="$1" -v g="$2" 'BEGIN {print (v <= g ? "met" : "MISSED")}'; }

echo
echo "== results: llama --scale $SCALE --layers $LAYERS, $(gb "$SRC_BYTES") in $NFILES files + rank-$RANK adapter; $REPEAT round(s), medians"
printf '%-28s %8s %8s %8s %8s %13s %8s\n' "step" "wall s" "min" "max" "cpu s" "peak RSS MiB" "GB/s"
for k in "${ORDER[@]}"; do
    printf '%-28s %8.2f %8.2f %8.2f %8.2f %13.1f %8.2f\n' "${LABEL[$k]}" "${WALL[$k]}" \
        "$(echo "${WALLS[$k]}" | minimum)" "$(echo "${WALLS[$k]}" | maximum)" "${CPU[$k]}" "${RSS[$k]}" \
        "$(awk -v b="$SRC_BYTES" -v t="${WALL[$k]}" 'BEGIN {printf "%.2f", (t > 0 ? b / 1e9 / t : 0)}')"
done
"$PY" - "$WORK/stats.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
med = lambda k: statistics.median(r[k] for r in runs)
gflop = runs[0]["gflop"]
print()
print("GEMM: %d modules, %.2f GFLOP per merge; cblas_sgemm %.1f GFLOP/s per thread (%.2f s inside it, summed over "
      "threads); whole pass %.1f GFLOP/s (%.2f s reading, computing, writing); fsync + rename %.2f s"
      % (runs[0]["modules"], gflop, gflop / med("gemm_seconds"), med("gemm_seconds"), gflop / med("work_seconds"),
         med("work_seconds"), med("sync_seconds")))
EOF
echo
printf '%-30s %8s   %-8s %s\n' "ratio (medians)" "value" "goal" "verdict"
row() { printf '%-30s %8s   %-8s %s\n' "$1" "$2" "$3" "$4"; }
r=$(ratio "${WALL[merge]}" "${WALL[cp]}");     row "merge / cp -r (wall)" "$r" "<= 2" "$(verdict "$r" 2)"
r=$(ratio "${WALL[merge]}" "${WALL[cpsync]}"); row "merge / (cp -r + sync) (wall)" "$r" "<= 2" "$(verdict "$r" 2)"
r=$(ratio "${CPU[merge]}" "${CPU[cp]}");       row "merge / cp -r (cpu)" "$r" "" "(2 cores: wall can be half of cpu)"
row "merge peak RSS MiB" "${RSS[merge]}" "" "(bounded: 2 threads x 2 blocks of 4 MiB + modules in flight)"
echo
echo "ckpt fsyncs every file it writes: 'cp -r + sync' is the like-for-like baseline."
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg) (other jobs on the machine skew every figure; cpu time less so)"
