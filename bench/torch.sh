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
bench_cleanup_on_exit
export CKPT_QUIET=1
cd "$WORK"


# one_model SCALE LAYERS: the model as pytorch_model.bin, converted.
one_model() {
    rm -rf hf bin
    "$CKPT_BIN" gen-model llama hf --scale "$1" --layers "$2" --shard-mb 0 >/dev/null
    mkdir bin
    cp hf/config.json bin/
    "$PY" "$HERE/torch_way.py" write hf/model.safetensors bin/pytorch_model.bin
    measure "llama --scale $1 --layers $2 as pytorch_model.bin" bin \
        'mkdir copy && cp bin/pytorch_model.bin copy/ && sync copy/pytorch_model.bin' \
        "ckpt convert" "python (torch.load)" \
        -- convert bin out --layout hf -- "$HERE/torch_way.py" convert bin/pytorch_model.bin py.safetensors --fsync
    rm -rf hf bin
}

# dcp_model SCALE LAYERS RANKS: the model as a DCP save of RANKS ranks, consolidated.
dcp_model() {
    rm -rf hf dcp
    "$CKPT_BIN" gen-model llama hf --scale "$1" --layers "$2" --shard-mb 0 >/dev/null
    "$PY" "$HERE/dcp_way.py" write hf/model.safetensors dcp "$3"
    measure "llama --scale $1 --layers $2 as a PyTorch DCP save of $3 ranks" dcp \
        'cp -r dcp copy && sync copy/*' "ckpt consolidate" "python (in memory)" \
        -- consolidate dcp out --strip-prefix model. -- "$HERE/dcp_way.py" consolidate dcp py.safetensors --fsync
    rm -rf hf dcp
}

one_model "$SCALE" "$LAYERS"
if [ "${BENCH_FULL:-0}" = 1 ]; then one_model 1 32; fi
dcp_model "$SCALE" "$LAYERS" "${BENCH_RANKS:-8}"
echo "converted tensors checked equal to the generated model's; load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
