#!/usr/bin/env bash
# bench/torch.sh — the speed and memory of `ckpt convert` of a torch.save
# checkpoint to safetensors (issue 16: "<= 1.2x the durable copy, peak RSS
# <= 256 MiB at any size, >= 3x faster than the Python way where it runs").
# Not a test.
#
# The ~2 GB bench llama (gen-model --scale 2 --layers 14, bf16) is written as
# pytorch_model.bin by real torch (bench/torch_way.py write: torch.save, zip
# format). With BENCH_FULL=1 the full-size Llama-3-8B shape (--scale 1
# --layers 32, 16 GB: a zip64 archive) follows. For each, with a warm page
# cache, round-robin BENCH_REPEAT times, it measures wall time and peak RSS of
#   cp + sync     a durable copy of pytorch_model.bin
#   ckpt          ckpt convert BIN DST --layout hf (checked once, tensor by
#                 tensor, against the model it was made from)
#   python        torch.load + a safetensors writer + fsync, as Hugging Face's
#                 conversion bot does (bench/torch_way.py convert); skipped,
#                 and said so, when the model does not fit twice in the
#                 memory available
# and prints the medians, the ratios and the RSS against the goals.
# Then the same model as a PyTorch DCP save of 8 ranks (FSDP2's dim-0
# chunks, written as torch's FileSystemWriter does by bench/dcp_way.py):
#   cp -r + sync  a durable copy of the DCP folder
#   ckpt          ckpt consolidate DCP DST --strip-prefix model. (checked
#                 tensor by tensor against the model)
#   python        the whole state dict assembled in memory from torch.load of
#                 every chunk, then written (dcp_to_torch_save's way)
#
# Environment: CKPT_BIN (an optimised build), BENCH_SCALE, BENCH_LAYERS,
# BENCH_FULL (1: also the 16 GB model), BENCH_RANKS (the DCP save's, default
# 8), BENCH_REPEAT, BENCH_DIR,
# BENCH_PYTHON (with python3-torch: /usr/bin/python3 after make deps),
# BENCH_KEEP=1. A quick run: BENCH_SCALE=16 BENCH_LAYERS=2 BENCH_REPEAT=1 bench/torch.sh
set -euo pipefail

BENCH_NAME=torch
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch (make deps installs python3-torch)"
bench_positive SCALE LAYERS
bench_start
cleanup() { if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench: kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
export CKPT_QUIET=1
cd "$WORK"

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
maxof() { awk -v a="$1" -v b="$2" 'BEGIN {print (b > a) ? b : a}'; }

# one_model SCALE LAYERS: generate, write as .bin, measure, print one block.
one_model() {
    local scale=$1 layers=$2
    rm -rf hf bin
    "$CKPT_BIN" gen-model llama hf --scale "$scale" --layers "$layers" --shard-mb 0 >/dev/null
    mkdir bin
    cp hf/config.json bin/
    "$PY" "$HERE/torch_way.py" write hf/model.safetensors bin/pytorch_model.bin
    local bytes avail_kb py_ok=1
    bytes=$(stat -c %s bin/pytorch_model.bin)
    avail_kb=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
    # torch.load holds the model, .contiguous() may copy, the writer a tensor more
    [ $((bytes / 1024 * 2)) -lt "$avail_kb" ] || py_ok=0
    local -a COPY CK PYW
    local rss_ck=0 rss_py=0 r
    for r in $(seq "$REPEAT"); do
        rm -rf copy.bin out py.safetensors
        sync
        cat bin/pytorch_model.bin >/dev/null
        "$PY" "$HERE/measure.py" --out m.txt sh -c 'cp bin/pytorch_model.bin copy.bin && sync copy.bin'
        COPY+=("$(cut -d' ' -f1 m.txt)")
        rm -f copy.bin
        sync
        "$PY" "$HERE/measure.py" --out m.txt "$CKPT_BIN" convert bin out --layout hf
        CK+=("$(cut -d' ' -f1 m.txt)")
        rss_ck=$(maxof "$rss_ck" "$(cut -d' ' -f2 m.txt)")
        if [ "$r" = 1 ]; then
            "$PY" "$HERE/torch_way.py" check hf/model.safetensors out/model.safetensors >/dev/null ||
                die "ckpt's model.safetensors differs from the model the .bin was written from"
        fi
        rm -rf out
        if [ "$py_ok" = 1 ]; then
            sync
            "$PY" "$HERE/measure.py" --out m.txt "$PY" "$HERE/torch_way.py" convert bin/pytorch_model.bin py.safetensors --fsync
            PYW+=("$(cut -d' ' -f1 m.txt)")
            rss_py=$(maxof "$rss_py" "$(cut -d' ' -f2 m.txt)")
            rm -f py.safetensors
        fi
    done
    local c k p=""
    c=$(median "${COPY[@]}")
    k=$(median "${CK[@]}")
    [ "$py_ok" = 1 ] && p=$(median "${PYW[@]}")
    awk -v b="$bytes" -v c="$c" -v k="$k" -v r="$rss_ck" -v p="$p" -v rp="$rss_py" -v s="$scale" -v l="$layers" 'BEGIN {
        printf "llama --scale %s --layers %s as pytorch_model.bin: %.2f GB\n", s, l, b / 1e9
        printf "  durable copy        %8.2f s\n", c
        printf "  ckpt convert        %8.2f s  %.2fx the copy (goal <= 1.2x); peak RSS %.0f MiB (goal <= 256)\n", k, k / c, r
        if (p != "") printf "  python (torch.load) %8.2f s  %.2fx ckpt (goal >= 3x); peak RSS %.0f MiB\n", p, p / k, rp
        else printf "  python (torch.load) skipped: the model does not fit twice in the memory available\n"
    }'
    rm -rf hf bin
}

# dcp_model SCALE LAYERS RANKS: the same measures for a DCP save of the model.
dcp_model() {
    local scale=$1 layers=$2 ranks=$3
    rm -rf hf dcp
    "$CKPT_BIN" gen-model llama hf --scale "$scale" --layers "$layers" --shard-mb 0 >/dev/null
    "$PY" "$HERE/dcp_way.py" write hf/model.safetensors dcp "$ranks"
    local bytes avail_kb py_ok=1
    bytes=$(du -sb dcp | cut -f1)
    avail_kb=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
    [ $((bytes / 1024 * 2)) -lt "$avail_kb" ] || py_ok=0
    local -a COPY CK PYW
    local rss_ck=0 rss_py=0 r
    for r in $(seq "$REPEAT"); do
        rm -rf copy out py.safetensors
        sync
        cat dcp/* dcp/.metadata >/dev/null
        "$PY" "$HERE/measure.py" --out m.txt sh -c 'cp -r dcp copy && sync copy/*'
        COPY+=("$(cut -d' ' -f1 m.txt)")
        rm -rf copy
        sync
        "$PY" "$HERE/measure.py" --out m.txt "$CKPT_BIN" consolidate dcp out --strip-prefix model.
        CK+=("$(cut -d' ' -f1 m.txt)")
        rss_ck=$(maxof "$rss_ck" "$(cut -d' ' -f2 m.txt)")
        if [ "$r" = 1 ]; then
            "$PY" "$HERE/torch_way.py" check hf/model.safetensors out/model.safetensors >/dev/null ||
                die "ckpt's consolidated DCP differs from the model it was written from"
        fi
        rm -rf out
        if [ "$py_ok" = 1 ]; then
            sync
            "$PY" "$HERE/measure.py" --out m.txt "$PY" "$HERE/dcp_way.py" consolidate dcp py.safetensors --fsync
            PYW+=("$(cut -d' ' -f1 m.txt)")
            rss_py=$(maxof "$rss_py" "$(cut -d' ' -f2 m.txt)")
            rm -f py.safetensors
        fi
    done
    local c k p=""
    c=$(median "${COPY[@]}")
    k=$(median "${CK[@]}")
    [ "$py_ok" = 1 ] && p=$(median "${PYW[@]}")
    awk -v b="$bytes" -v c="$c" -v k="$k" -v r="$rss_ck" -v p="$p" -v rp="$rss_py" -v s="$scale" -v l="$layers" -v n="$ranks" 'BEGIN {
        printf "llama --scale %s --layers %s as a PyTorch DCP save of %s ranks: %.2f GB\n", s, l, n, b / 1e9
        printf "  durable copy        %8.2f s\n", c
        printf "  ckpt consolidate    %8.2f s  %.2fx the copy (goal <= 1.2x); peak RSS %.0f MiB (goal <= 256)\n", k, k / c, r
        if (p != "") printf "  python (in memory)  %8.2f s  %.2fx ckpt (goal >= 3x); peak RSS %.0f MiB\n", p, p / k, rp
        else printf "  python (in memory)  skipped: the model does not fit twice in the memory available\n"
    }'
    rm -rf hf dcp
}

one_model "$SCALE" "$LAYERS"
if [ "${BENCH_FULL:-0}" = 1 ]; then one_model 1 32; fi
dcp_model "$SCALE" "$LAYERS" "${BENCH_RANKS:-8}"
echo "converted tensors checked equal to the generated model's; load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
