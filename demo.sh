#!/usr/bin/env bash
# demo.sh — a newcomer's tour of ckpt on a small synthetic model (`make demo`).
#
# Each step says what it does, shows the command, and runs it. To add a step
# (convert, consolidate, ...), add one `step "what it shows" command args...`
# line below; $MODEL and $WORK are there to use. Everything happens in a
# temporary directory that is removed at the end, whatever happens — unless
# KEEP=1 (`make demo KEEP=1`): then the daemon and the local Hub are left
# running with their folder, and the last line is the dashboard's URL.
# DEMO_PART=daemon runs only the last part (the model, then a local Hub and
# the daemon fetching and converting it): what tests/e2e/test_demo.sh checks.
set -euo pipefail

CKPT_BIN=${CKPT_BIN:-$(dirname "$0")/build/ckpt}
[ -x "$CKPT_BIN" ] || { echo "demo: $CKPT_BIN not found; run 'make' first" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-demo.XXXXXX")
BACKGROUND=() # servers the demo starts: stopped at exit
stop_background() {
    local p
    for p in "${BACKGROUND[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${BACKGROUND[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap 'stop_background; rm -rf "$WORK"' EXIT
MODEL=$WORK/qwen2-tiny

n=0
# step [--head LINES] DESCRIPTION COMMAND [ARGS...]: a numbered heading, the
# command (paths shown relative to $WORK), then its output (its first LINES).
step() {
    local lines=0
    if [ "$1" = --head ]; then
        lines=$2
        shift 2
    fi
    n=$((n + 1))
    printf '\n== %d. %s\n' "$n" "$1"
    shift
    echo "\$ ckpt $*" | sed "s|$WORK/||g"
    "$CKPT_BIN" "$@" >"$WORK/step.out"
    if [ "$lines" -gt 0 ] && [ "$(wc -l <"$WORK/step.out")" -gt "$lines" ]; then
        head -n "$lines" "$WORK/step.out"
        echo "   ... ($(wc -l <"$WORK/step.out") lines in all)"
    else
        cat "$WORK/step.out"
    fi
}

echo "ckpt demo: working in $WORK"

if [ "${DEMO_PART:-all}" = daemon ]; then
    "$CKPT_BIN" gen-model qwen2 "$MODEL" --scale 8 --layers 2 >/dev/null
else
step "Generate a small Qwen2-0.5B-shaped checkpoint (real tensor names and heads, widths / 8)" \
    gen-model qwen2 "$MODEL" --scale 8 --layers 2
ls -l "$MODEL" | sed 1d

export CKPT_HOME=$WORK/home

step --head 12 "List its tensors: name, dtype, shape, size, file" \
    inspect "$MODEL"

step --head 20 "Plan the neuron layout for 8-way tensor parallelism (headers only; 14 query heads pad to 16)" \
    plan "$MODEL" --layout neuron --tp 8

step "Convert: fused QKV with GQA replication, gate/up fused, row/column slices, vocab padding" \
    convert "$MODEL" "$WORK/neuron-tp8" --layout neuron --tp 8
ls "$WORK/neuron-tp8"

step "Consolidate the 8 rank folders back into the original layout, from the shards and ckpt-layout.json alone" \
    consolidate "$WORK/neuron-tp8" "$WORK/restored"

echo
echo "== check: the consolidated files are byte-identical to the originals"
for f in "$MODEL"/*; do
    cmp "$f" "$WORK/restored/$(basename "$f")"
    echo "   identical: $(basename "$f")  $(sha256sum <"$f" | cut -c1-16)"
done

step "Store it: every tensor once, named by its sha256" \
    import "$MODEL" --repo demo/qwen2-tiny@main

step "Convert inside the store: the layout is recipes over the same blobs" \
    convert demo/qwen2-tiny@main --layout neuron --tp 8

step "What the store holds" ls

step "Logical vs physical bytes: the converted layout costs almost nothing" du

step "Pull rank 3 of the converted layout (rebuilt from recipes, sha256 checked)" \
    pull demo/qwen2-tiny@main:neuron-tp8 --rank 3 -o "$WORK/rank3"
cmp "$WORK/rank3/model.safetensors" "$WORK/neuron-tp8/tp_rank_03/model.safetensors"
echo "   rank 3 equals the offline conversion's tp_rank_03"

step "Pull the consolidated form of the converted layout" \
    pull demo/qwen2-tiny@main:neuron-tp8 --consolidated -o "$WORK/from-store"
diff -r "$MODEL" "$WORK/from-store" && echo "   identical to the original checkpoint"

step "Verify: re-hash every blob, rebuild every file, compare with the catalog" verify
fi

# ---- From a Hub: the daemon fetches and converts ----
# The local Hub (tests/hub/testhub.c, built by `make demo`) serves a store of its
# own through the Hugging Face Hub API; the client is another CKPT_HOME.
CKPT_TESTHUB=${CKPT_TESTHUB:-$(dirname "$CKPT_BIN")/ckpt-testhub}
if [ -x "$CKPT_TESTHUB" ]; then
    echo
    echo "== a local Hub: publish the model as demo/qwen2-tiny, then fetch and convert it through the daemon"
    CKPT_HOME=$WORK/hub-home "$CKPT_BIN" import "$MODEL" --repo demo/qwen2-tiny@main --quiet >/dev/null
    # It ends with this script, unless KEEP=1 leaves it running.
    keep_hub=()
    [ "${KEEP:-0}" = 1 ] && keep_hub=(--outlive-parent)
    "$CKPT_TESTHUB" --home "$WORK/hub-home" --url-file "$WORK/hub.url" --log "$WORK/hub.log" "${keep_hub[@]}" >/dev/null 2>&1 &
    BACKGROUND+=($!)
    for _ in $(seq 100); do [ -s "$WORK/hub.url" ] && break; sleep 0.1; done
    export HF_ENDPOINT CKPT_HOME=$WORK/client-home
    HF_ENDPOINT=$(cat "$WORK/hub.url")
    echo "   Hub at $HF_ENDPOINT (HF_ENDPOINT); the client's store is client-home"
    "$CKPT_BIN" serve --listen 127.0.0.1:0 --workers 2 >"$WORK/serve.log" 2>&1 &
    BACKGROUND+=($!)

    step "Submit: fetch demo/qwen2-tiny from the Hub (verified), then convert it; --wait follows the convert" \
        submit demo/qwen2-tiny --layout neuron --tp 8 --wait

    step "The two jobs: the convert ran after the fetch" jobs

    step "Pull rank 0 of the converted layout" pull demo/qwen2-tiny@main:neuron-tp8 --rank 0 -o "$WORK/hub-rank0"
    ls "$WORK/hub-rank0"

    step "Pull the consolidated form" pull demo/qwen2-tiny@main:neuron-tp8 --consolidated -o "$WORK/hub-consolidated"
    diff -r "$MODEL" "$WORK/hub-consolidated" && echo "   identical to the original checkpoint, after a trip through the Hub"
    if [ "${KEEP:-0}" = 1 ]; then
        trap - EXIT # the daemon, the Hub and $WORK stay
        printf '\n== done: %d steps; the daemon and the local Hub keep running (KEEP=1)\n' "$n"
        echo "   stop them: kill ${BACKGROUND[*]}; rm -rf $WORK"
        echo "   dashboard: $(cat "$CKPT_HOME/serve.url")/"
        exit 0
    fi
    stop_background
    BACKGROUND=()
else
    echo
    echo "== skipping the Hub steps: $CKPT_TESTHUB is not built (make demo builds it)"
fi

printf '\n== done: %d steps; %s removed\n' "$n" "$WORK"
