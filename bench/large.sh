#!/usr/bin/env bash
# bench/large.sh — every operation on the full-size Llama-3-8B shape against a
# durable copy of the same bytes, and the many-tensor MoE (issue 20). Run by
# `make bench-large`, never by `make test`:
#
#   make BUILD=build/rel build/rel/ckpt build/rel/ckpt-testhub
#   CKPT_BIN=build/rel/ckpt bench/large.sh            # about 45 minutes, 70 GB of disk
#   BENCH_LARGE_SCALE=8 BENCH_REPEAT=1 bench/large.sh # a quick look (~250 MB)
#
# The model (`gen-model llama --scale 1`: 16.06 GB bf16, 291 tensors, 4 shards)
# is generated once and kept in BENCH_LARGE_MODEL between runs. Each round, in
# a fresh work folder, measures (wall, CPU = user + system, peak RSS):
#   cp -r MODEL + sync            the durable copy: the baseline of every row
#                                 that writes the model's bytes
#   convert --layout neuron --tp 8, --layout vllm --tp 8, --layout easydel
#   convert --format nxd --xser (neuronx-distributed's own training save), a
#                                 durable copy of that save, its consolidate
#   consolidate of the neuron tp8 output (compared with the model, round 1)
#   cp -r + sync of one rank, and the same after reading the source bytes
#                                 that rank is made of (bench/rank_spans.py:
#                                 a row-parallel slice spans whole rows), the
#                                 baseline of the rank pull
#   import                        into a fresh store
#   convert REF --layout neuron --tp 8   inside the store: writes no tensor
#                                 bytes (goal 0.3x the copy of the layout)
#   pull REF, pull REF:neuron-tp8 --rank 3, pull ... --consolidated,
#   pull REF --format tar.zst     (pulls compared with their sources, round 1)
#   tar | zstd -1 of the model    the compressed pull's work the usual way
#                                 (a reference, no goal)
#   curl + sha256sum of the model's files from the local test Hub, and
#   ckpt fetch of the same model  (the Hub serves the store just imported)
# Before every step written data is synced and, when this runs as root, the
# page cache is dropped (every row cold, as a first run on a big checkpoint
# is; otherwise the table says "warm"). Then, once, the many-tensor case:
# gen-model qwen3-moe (the real 48 layers x 128 experts, ~18,900 tensors) at
# BENCH_MOE_SCALE: plan, convert neuron tp8, import, store convert, rank
# pull (against reading that rank's sources + a durable copy of it, as
# above), consolidated pull, each with its cost per tensor, and the copy
# again; BENCH_MOE_REPEAT rounds (1).
#
# The Python ways (load every rank, concatenate, save) are not run: they hold
# the model twice, more than this size leaves in 24 GB (the 2 GB benches,
# bench/nxd.sh and bench/run.sh, measure them).
#
# Prints min/median/max over BENCH_REPEAT rounds and, per row, median / the
# baseline's median against the goals: <= 1.2x for a row that writes N bytes,
# <= 0.3x for the in-store convert, peak RSS <= 256 MiB.
#
# Environment: CKPT_BIN (default build/ckpt), CKPT_TESTHUB (default beside
# it), BENCH_REPEAT (3), BENCH_DIR (work folders; default /var/tmp),
# BENCH_LARGE_MODEL (the kept model; default BENCH_DIR/ckpt-bench-large-model-sS),
# BENCH_LARGE_SCALE (1), BENCH_MOE_SCALE (8; 0 skips the MoE case),
# BENCH_MOE_REPEAT (1),
# BENCH_PART (all; "offline": only the copies, the offline converts and the
# consolidates, no store, fetch or MoE; "store": the copies, the neuron
# convert the rank pull is compared with, and the store and fetch steps; "moe":
# only the MoE), BENCH_KEEP=1
# keeps the work folder.
set -euo pipefail

BENCH_NAME=large
BENCH_DIR=${BENCH_DIR:-/var/tmp}
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

LSCALE=${BENCH_LARGE_SCALE:-1}
MOE_SCALE=${BENCH_MOE_SCALE:-8}
PART=${BENCH_PART:-all}
MODEL=${BENCH_LARGE_MODEL:-$BASE/ckpt-bench-large-model-s$LSCALE}
TP=8
RANK=3
[ -x "$PY" ] || PY=python3
bench_need_hub
[[ $LSCALE =~ ^[1-9][0-9]*$ ]] || die "BENCH_LARGE_SCALE must be a positive number"
[[ $MOE_SCALE =~ ^[0-9]+$ ]] || die "BENCH_MOE_SCALE must be a number"
[[ $PART =~ ^(all|offline|store|moe)$ ]] || die "BENCH_PART must be all, offline, store or moe"
bench_start
bench_cleanup_on_exit

CACHE=warm
[ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ] && CACHE=cold
bytes_of() { find "$@" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
gb() { awk -v b="$1" 'BEGIN {printf "%.2f GB", b / 1e9}'; }
quietly() { "$@" >"$WORK/log.txt" 2>&1 || { cat "$WORK/log.txt" >&2; die "failed: $*"; }; }
settle() {
    sync
    if [ "$CACHE" = cold ]; then echo 3 >/proc/sys/vm/drop_caches; fi
}

# run KEY BASE LABEL CMD...: one measured step (after settle); KEY's wall, CPU,
# peak RSS and MB read from the disk (not from the page cache) in this round
# are appended to W[KEY], C[KEY], R[KEY], RD[KEY]. BASE is
# the row it is compared with ("-": none); goals: GOAL[KEY].
declare -A W C R RD B LABEL GOAL
ORDER=()
run() {
    local key=$1 base=$2 label=$3
    shift 3
    settle
    "$PY" "$HERE/measure.py" --out "$WORK/m.txt" --log "$WORK/log.txt" "$@" ||
        { cat "$WORK/log.txt" >&2; die "'$label' failed"; }
    local wall rss cpu rd
    read -r wall rss _ _ cpu rd _ <"$WORK/m.txt"
    [ -n "${LABEL[$key]:-}" ] || ORDER+=("$key")
    LABEL[$key]=$label
    B[$key]=$base
    W[$key]="${W[$key]:-} $wall"
    C[$key]="${C[$key]:-} $cpu"
    RD[$key]="${RD[$key]:-} ${rd:-0}"
    R[$key]=$(maxof "${R[$key]:-0}" "$rss")
}
COPY=(sh -c 'cp -r "$1" "$2" && sync' sh)
total_bytes() { "$CKPT_BIN" inspect "$1" --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["total_bytes"])'; }
stat3() { printf '%s\n' $1 | sort -g | awk '{v[NR] = $1} END {printf "%.2f %.2f %.2f", v[1], v[int((NR + 1) / 2)], v[NR]}'; }

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), kernel $(uname -r), $(df -PT "$WORK" | awk 'NR==2 {print $2}') at $WORK, page cache $CACHE before every step"
ROUNDS=$REPEAT
[ "$PART" = moe ] && ROUNDS=0
if [ "$ROUNDS" -gt 0 ] && [ ! -f "$MODEL/config.json" ]; then
    echo "== generating llama --scale $LSCALE into $MODEL (kept for later runs)"
    rm -rf "$MODEL"
    quietly "$CKPT_BIN" gen-model llama "$MODEL" --scale "$LSCALE"
fi
[ "$ROUNDS" -gt 0 ] && MBYTES=$(bytes_of "$MODEL") &&
    echo "== model: $MODEL, $(gb "$MBYTES"), $(find "$MODEL" -name '*.safetensors' | wc -l) safetensors files"

for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round of $REPEAT (load $(cut -d' ' -f1-3 /proc/loadavg))"
    RW=$WORK/r
    rm -rf "$RW" && mkdir -p "$RW"
    run copy - "cp -r model + sync" "${COPY[@]}" "$MODEL" "$RW/copy"
    rm -rf "$RW/copy"
    run conv_n8 copy "convert neuron tp8" "$CKPT_BIN" convert "$MODEL" "$RW/n8" --layout neuron --tp $TP
    if [ "$PART" != store ]; then
        run conv_vllm copy "convert vllm tp8" "$CKPT_BIN" convert "$MODEL" "$RW/vllm" --layout vllm --tp $TP
        rm -rf "$RW/vllm"
        run conv_ez copy "convert easydel" "$CKPT_BIN" convert "$MODEL" "$RW/ez" --layout easydel
        rm -rf "$RW/ez"
        run conv_nxd copy "convert nxd tp8 --xser" "$CKPT_BIN" convert "$MODEL" "$RW/nxd" --layout neuron --tp $TP --format nxd --xser
        run copy_nxd - "cp -r nxd save + sync" "${COPY[@]}" "$RW/nxd" "$RW/nxdcopy"
        rm -rf "$RW/nxdcopy"
        run consol_nxd copy_nxd "consolidate nxd xser tp8" "$CKPT_BIN" consolidate "$RW/nxd" "$RW/back"
        if [ "$round" = 1 ]; then
            [ "$(total_bytes "$RW/back")" = "$(total_bytes "$MODEL")" ] || die "the NxD save consolidates to other tensor bytes than the model's"
        fi
        rm -rf "$RW/nxd" "$RW/back"
        run consol copy "consolidate neuron tp8" "$CKPT_BIN" consolidate "$RW/n8" "$RW/back"
        [ "$round" = 1 ] && { diff -r "$MODEL" "$RW/back" >/dev/null || die "consolidate differs from the model"; }
        rm -rf "$RW/back"
    fi
    RDIR=$(printf 'tp_rank_%02d' $RANK)
    run copy_rank - "cp -r one rank + sync" "${COPY[@]}" "$RW/n8/$RDIR" "$RW/rank"
    rm -rf "$RW/rank"
    [ -f "$WORK/plan.json" ] || quietly sh -c '"$1" plan "$2" --layout neuron --tp "$3" --json --parts >"$4"' sh "$CKPT_BIN" "$MODEL" $TP "$WORK/plan.json"
    run copy_rank_src - "read rank sources + cp" sh -c '"$1" "$2" "$3" "$4" "$5" >/dev/null && cp -r "$6" "$7" && sync' sh \
        "$PY" "$HERE/rank_spans.py" "$MODEL" "$WORK/plan.json" $RANK "$RW/n8/$RDIR" "$RW/rank"
    rm -rf "$RW/n8"
    if [ "$PART" != offline ]; then
        export CKPT_HOME=$RW/home
        run import copy "import" "$CKPT_BIN" import "$MODEL" --repo bench/large
        run sconv copy "store convert neuron tp8" "$CKPT_BIN" convert bench/large --layout neuron --tp $TP
        run pull copy "pull" "$CKPT_BIN" pull bench/large -o "$RW/pull"
        [ "$round" = 1 ] && { diff -r "$MODEL" "$RW/pull" >/dev/null || die "pull differs from the model"; }
        rm -rf "$RW/pull"
        run pull_rank copy_rank_src "pull --rank $RANK" "$CKPT_BIN" pull bench/large:neuron-tp$TP --rank $RANK -o "$RW/pr"
        if [ "$round" = 1 ]; then
            for f in "$RW/rank"/*; do cmp -s "$f" "$RW/pr/${f##*/}" || die "the rank pull's ${f##*/} differs from the offline convert's"; done
        fi
        rm -rf "$RW/pr" "$RW/rank"
        run pull_cons copy "pull --consolidated" "$CKPT_BIN" pull bench/large:neuron-tp$TP --consolidated -o "$RW/pc"
        [ "$round" = 1 ] && { diff -r "$MODEL" "$RW/pc" >/dev/null || die "pull --consolidated differs from the model"; }
        rm -rf "$RW/pc"
        run pull_zst copy "pull --format tar.zst" "$CKPT_BIN" pull bench/large -o "$RW/m.tar.zst" --format tar.zst
        rm -f "$RW/m.tar.zst"
        # the same work the usual way (no goal: a reference): compressing is
        # CPU a copy does not spend, zstd -1 on both cores as the pull does
        run zst_ref - "tar | zstd -1 -T$(nproc) + sync" sh -c 'tar -cf - -C "$1" . | zstd -q -1 -T"$3" -o "$2" && sync' sh \
            "$MODEL" "$RW/ref.tar.zst" "$(nproc)"
        rm -f "$RW/ref.tar.zst"

        # fetch: the test Hub serves the store just imported
        rm -f "$WORK/hub.url"
        "$CKPT_TESTHUB" --home "$RW/home" --url-file "$WORK/hub.url" 2>/dev/null &
        HUB_PID=$!
        for _ in $(seq 100); do [ -s "$WORK/hub.url" ] && break; sleep 0.1; done
        [ -s "$WORK/hub.url" ] || die "ckpt-testhub did not start"
        HUB=$(cat "$WORK/hub.url")
        COMMIT=$(curl -sf "$HUB/api/models/bench/large/revision/main" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["sha"])')
        (cd "$MODEL" && find . -type f -printf '%P\n') | sed "s|^|$HUB/bench/large/resolve/$COMMIT/|" >"$WORK/urls"
        mkdir -p "$RW/curl"
        run curl_sha - "curl + sha256sum" sh -c 'cd "$1" && xargs -n 1 curl -sfO <"$2" && sha256sum ./* >/dev/null && sync' sh "$RW/curl" "$WORK/urls"
        rm -rf "$RW/curl"
        run fetch curl_sha "fetch from the test Hub" env HF_ENDPOINT="$HUB" CKPT_HOME="$RW/client" "$CKPT_BIN" fetch bench/large
        bench_stop_hub
        unset CKPT_HOME
    fi
    # the baseline again: how much the disk's speed drifted during the round
    run copy_end - "cp -r model + sync (again)" "${COPY[@]}" "$MODEL" "$RW/copy"
    rm -rf "$RW"
done

[ "$ROUNDS" -gt 0 ] && awk -v b="$MBYTES" '/MemTotal/ {m = $2 * 1024} END {
    if (2 * b > m) printf "== the Python way (every rank torch.load-ed, concatenated, saved) is not run: it holds the model twice, %.1f GB, more than this machine'"'"'s %.1f GB of RAM (bench/nxd.sh and bench/run.sh measure it at 2 GB)\n", 2 * b / 1e9, m / 1e9 }' /proc/meminfo
for k in conv_n8 conv_vllm conv_ez conv_nxd consol consol_nxd import pull pull_rank pull_cons pull_zst fetch; do GOAL[$k]=1.2; done
GOAL[sconv]=0.3
[ "$ROUNDS" -gt 0 ] && echo && echo "== $(gb "$MBYTES") llama, $REPEAT round(s), page cache $CACHE; seconds as min / median / max"
[ "$ROUNDS" -gt 0 ] && printf '%-27s %-20s %8s %8s %8s %9s  %s\n' step "wall" "CPU" "RSS MiB" "read GB" "vs base" "goal"
for k in "${ORDER[@]}"; do
    read -r wmin wmed wmax <<<"$(stat3 "${W[$k]}")"
    read -r _ cmed _ <<<"$(stat3 "${C[$k]}")"
    read -r _ rdmed _ <<<"$(stat3 "${RD[$k]}")"
    ratio="" goal=""
    if [ "${B[$k]}" != - ]; then
        read -r _ bmed _ <<<"$(stat3 "${W[${B[$k]}]}")"
        ratio=$(awk -v a="$wmed" -v b="$bmed" 'BEGIN {printf "%.2fx", a / b}')
        goal="<= ${GOAL[$k]}x of '${LABEL[${B[$k]}]}'; RSS <= 256"
    fi
    printf '%-27s %6.2f/%6.2f/%6.2f %8.2f %8.0f %8.2f %9s  %s\n' "${LABEL[$k]}" "$wmin" "$wmed" "$wmax" "$cmed" "${R[$k]}" \
        "$(awk -v m="$rdmed" 'BEGIN {print m / 1000}')" "$ratio" "$goal"
done
# the compressed pull against the same work done the usual way (its goal stays the copy's)
if [ -n "${W[pull_zst]:-}" ] && [ -n "${W[zst_ref]:-}" ]; then
    read -r _ zmed _ <<<"$(stat3 "${W[pull_zst]}")"
    read -r _ rmed _ <<<"$(stat3 "${W[zst_ref]}")"
    awk -v a="$zmed" -v b="$rmed" 'BEGIN {printf "== pull --format tar.zst: %.2fx of tar | zstd (the same compression, the usual way)\n", a / b}'
fi
# how much the baseline itself moved: every copy of the model in this run
if [ -n "${W[copy]:-}" ]; then
    read -r cmin _ cmax <<<"$(stat3 "${W[copy]} ${W[copy_end]:-}")"
    echo "== the copies of the model in this run: $cmin s to $cmax s"
fi

[ "$MOE_SCALE" = 0 ] || [ "$PART" = offline ] || [ "$PART" = store ] && exit 0
# ---- the many-tensor case ----
MOE=$BASE/ckpt-bench-large-moe-s$MOE_SCALE
if [ ! -f "$MOE/config.json" ]; then
    echo "== generating qwen3-moe --scale $MOE_SCALE into $MOE (kept for later runs)"
    rm -rf "$MOE"
    quietly "$CKPT_BIN" gen-model qwen3-moe "$MOE" --scale "$MOE_SCALE"
fi
NT=$("$CKPT_BIN" inspect "$MOE" --json | "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["tensors"]))')
echo
MOE_ROUNDS=${BENCH_MOE_REPEAT:-1}
[[ $MOE_ROUNDS =~ ^[1-9][0-9]*$ ]] || die "BENCH_MOE_REPEAT must be a positive number"
echo "== many tensors: qwen3-moe --scale $MOE_SCALE, $(gb "$(bytes_of "$MOE")"), $NT tensors, $MOE_ROUNDS round(s)"
W=() C=() R=() RD=() B=() LABEL=() ORDER=()
RW=$WORK/moe
for round in $(seq 1 "$MOE_ROUNDS"); do
[ "$MOE_ROUNDS" = 1 ] || echo "== MoE round $round of $MOE_ROUNDS (load $(cut -d' ' -f1-3 /proc/loadavg))"
rm -rf "$RW" && mkdir -p "$RW"
export CKPT_HOME=$RW/home
run mcopy - "cp -r model + sync" "${COPY[@]}" "$MOE" "$RW/copy"
rm -rf "$RW/copy"
run mplan - "plan neuron tp8" "$CKPT_BIN" plan "$MOE" --layout neuron --tp $TP
run mconv mcopy "convert neuron tp8" "$CKPT_BIN" convert "$MOE" "$RW/n8" --layout neuron --tp $TP
RDIR=$(printf 'tp_rank_%02d' $RANK)
quietly sh -c '"$1" plan "$2" --layout neuron --tp "$3" --json --parts >"$4"' sh "$CKPT_BIN" "$MOE" $TP "$RW/plan.json"
run mcopy_rank - "read rank sources + cp" sh -c '"$1" "$2" "$3" "$4" "$5" >/dev/null && cp -r "$6" "$7" && sync' sh \
    "$PY" "$HERE/rank_spans.py" "$MOE" "$RW/plan.json" $RANK "$RW/n8/$RDIR" "$RW/rank"
rm -rf "$RW/n8"
run mimport mcopy "import" "$CKPT_BIN" import "$MOE" --repo bench/moe
run msconv mcopy "store convert neuron tp8" "$CKPT_BIN" convert bench/moe --layout neuron --tp $TP
run mpull_rank mcopy_rank "pull --rank $RANK" "$CKPT_BIN" pull bench/moe:neuron-tp$TP --rank $RANK -o "$RW/pr"
for f in "$RW/rank"/*; do cmp -s "$f" "$RW/pr/${f##*/}" || die "the MoE's rank pull's ${f##*/} differs from the offline convert's"; done
rm -rf "$RW/rank" "$RW/pr"
run mpull_cons mcopy "pull --consolidated" "$CKPT_BIN" pull bench/moe:neuron-tp$TP --consolidated -o "$RW/pc"
diff -r "$MOE" "$RW/pc" >/dev/null || die "the MoE's pull --consolidated differs from the model"
rm -rf "$RW/pc"
# the copy again: a ratio is only as good as the copies at both ends agree
run mcopy_end - "cp -r model + sync (again)" "${COPY[@]}" "$MOE" "$RW/copy"
unset CKPT_HOME
done
echo "== seconds as min / median / max; ratios are medians against the median copy at the start of each round"
printf '%-27s %-20s %8s %9s %9s %14s\n' step "wall s" "CPU s" "RSS MiB" "vs copy" "per tensor ms"
for k in "${ORDER[@]}"; do
    read -r wmin w wmax <<<"$(stat3 "${W[$k]}")"
    ratio=""
    [ "${B[$k]}" != - ] && ratio=$(awk -v a="$w" -v b="$(stat3 "${W[${B[$k]}]}" | cut -d' ' -f2)" 'BEGIN {printf "%.2fx", a / b}')
    printf '%-27s %6.2f/%6.2f/%6.2f %8.2f %9.0f %9s %14.3f\n' "${LABEL[$k]}" "$wmin" "$w" "$wmax" "$(stat3 "${C[$k]}" | cut -d' ' -f2)" "${R[$k]}" "$ratio" \
        "$(awk -v w="$w" -v n="$NT" 'BEGIN {print w * 1000 / n}')"
done
read -r cmin _ cmax <<<"$(stat3 "${W[mcopy]} ${W[mcopy_end]}")"
echo "== the copies of the model in this run: $cmin s to $cmax s"
