#!/usr/bin/env bash
# bench/nxd.sh — the speed and memory of `ckpt consolidate` of a
# neuronx-distributed training save (issue 17: "<= 1.2x a durable copy of the
# same bytes, peak RSS <= 256 MiB, against the Python way"). Not a test.
#
# The ~2 GB bench llama (gen-model --scale 2 --layers 14, bf16) is written as
# a BENCH_TP-rank save (default 8) by `ckpt convert --layout neuron --tp N
# --format nxd`, twice: plain torch.save rank files, then xser (a file per
# tensor per rank, optimum-neuron's default; BENCH_XSER=0 or 1 measures only
# the plain or only the xser save). With a warm page cache, for each save round-robin BENCH_REPEAT times, it
# measures wall time and peak RSS of (common.sh's measure)
#   cp -r + sync   a durable copy of the save folder
#   ckpt           ckpt consolidate SAVE DST (checked tensor by tensor against
#                  the model the save was made from)
#   python         every rank torch.load-ed and the parallel parameters
#                  concatenated, then written (bench/nxd_way.py: a lower bound
#                  of optimum-cli neuron consolidate; plain saves only)
#
# Environment: CKPT_BIN, BENCH_SCALE, BENCH_LAYERS, BENCH_TP, BENCH_XSER,
# BENCH_REPEAT, BENCH_DIR, BENCH_PYTHON (with python3-torch), BENCH_KEEP=1.
# A quick run: BENCH_SCALE=16 BENCH_LAYERS=2 BENCH_REPEAT=1 bench/nxd.sh
set -euo pipefail

BENCH_NAME=nxd
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch (make deps installs python3-torch)"
TP=${BENCH_TP:-8}
bench_positive SCALE LAYERS TP
bench_start
bench_cleanup_on_exit
export CKPT_QUIET=1
cd "$WORK"

"$CKPT_BIN" gen-model llama hf --scale "$SCALE" --layers "$LAYERS" --shard-mb 0 >/dev/null
case ${BENCH_XSER:-both} in 0) modes=(plain) ;; 1) modes=(xser) ;; *) modes=(plain xser) ;; esac
for mode in "${modes[@]}"; do
    xser=()
    [ "$mode" = xser ] && xser=(--xser)
    rm -rf save copy out py.safetensors
    "$CKPT_BIN" convert hf save --layout neuron --tp "$TP" --format nxd "${xser[@]}" >/dev/null
    py=("$HERE/nxd_way.py" consolidate save py.safetensors --fsync)
    label="python (load + cat)"
    [ "$mode" = xser ] && py=() label="python (plain only)" # nxd_way.py reads torch.save rank files, not xser
    measure "llama --scale $SCALE --layers $LAYERS as a neuronx-distributed save of $TP ranks ($mode)" save \
        'cp -r save copy && sync -f copy/config.json' "ckpt consolidate" "$label" \
        -- consolidate save out -- "${py[@]}"
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
