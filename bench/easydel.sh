#!/usr/bin/env bash
# bench/easydel.sh — the speed and memory of `ckpt consolidate` of an EasyDeL
# TensorStore save (issue 22: "at <= 1.2x a durable copy with RSS <= 256 MiB").
# Not a test.
#
# The ~2 GB bench llama (gen-model --scale 2 --layers 14, bf16) is converted
# to --layout easydel and saved the EasyDeL way by tests/easydel_gen.py (real
# zarr v2 + zstd, one chunk per array, no optimizer). With a warm page cache,
# round-robin BENCH_REPEAT times, it measures wall time and peak RSS of
#   cp + sync        a durable copy of the Hugging Face model.safetensors
#   consolidate      ckpt consolidate SAVE DST (checked byte-identical with cmp)
# and prints the medians, the ratio and the RSS against the goals, with the
# load average before and after (the figures mean little on a busy machine).
# Each command's output is removed before the other runs, so both write
# into page cache memory just freed: on a virtual machine, memory the guest
# has not touched for a while can cost several times more to write.
# consolidate decodes the arrays as the executor asks for them, with no
# staging copy of the model (docs/easydel.md, "Reading the arrays"), and
# writes its output with O_DIRECT: it fills no page cache, and the cmp
# reads the output back from the disk.
#
# Environment: CKPT_BIN (an optimised build), BENCH_SCALE, BENCH_LAYERS,
# BENCH_REPEAT, BENCH_DIR, BENCH_PYTHON (with python3-zarr and
# python3-numcodecs: /usr/bin/python3 after make deps), BENCH_KEEP=1.
# A quick run: BENCH_SCALE=16 BENCH_LAYERS=2 BENCH_REPEAT=1 bench/easydel.sh
set -euo pipefail

BENCH_NAME=easydel
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$PY" -c 'import zarr, numcodecs' 2>/dev/null || die "$PY cannot import zarr and numcodecs (make deps)"
bench_positive SCALE LAYERS
bench_start
bench_cleanup_on_exit
export CKPT_QUIET=1
cd "$WORK"
"$CKPT_BIN" gen-model llama hf --scale "$SCALE" --layers "$LAYERS" --shard-mb 0 >/dev/null
"$CKPT_BIN" convert hf ed --layout easydel >/dev/null
"$PY" "$HERE/../tests/easydel_gen.py" ed save --no-tx
rm -rf ed
bytes=$(stat -c %s hf/model.safetensors)

declare -a COPY CONS
rss_max=0
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$REPEAT"); do
    rm -rf copy.st back
    sync
    find hf save -type f -exec cat {} + >/dev/null
    "$PY" "$HERE/measure.py" --out m.txt sh -c 'cp hf/model.safetensors copy.st && sync copy.st'
    COPY+=("$(cut -d' ' -f1 m.txt)")
    rm -f copy.st
    sync
    "$PY" "$HERE/measure.py" --out m.txt "$CKPT_BIN" consolidate save back
    CONS+=("$(cut -d' ' -f1 m.txt)")
    rss=$(cut -d' ' -f2 m.txt)
    rss_max=$(maxof "$rss_max" "$rss")
    cmp -s hf/model.safetensors back/model.safetensors || die "consolidated model.safetensors differs"
done
c=$(median "${COPY[@]}") k=$(median "${CONS[@]}")
awk -v b="$bytes" -v c="$c" -v k="$k" -v r="$rss_max" -v n="$REPEAT" -v cs="$(spread "${COPY[@]}")" -v ks="$(spread "${CONS[@]}")" 'BEGIN {
    printf "model %.2f GB; medians of %d round(s): durable copy %.2f s; consolidate %.2f s (%.2fx, goal <= 1.2x); peak RSS %.0f MiB (goal <= 256)\n",
        b / 1e9, n, c, k, k / c, r
    printf "each round (min-max): durable copy %s s, consolidate %s s\n", cs, ks }'
echo "load average (1, 5, 15 min): $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after; $(nproc) cores"
