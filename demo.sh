#!/usr/bin/env bash
# demo.sh — a newcomer's tour of ckpt on a small synthetic model (`make demo`).
#
# Each step says what it does, shows the command, and runs it. To add a step
# (convert, consolidate, ...), add one `step "what it shows" command args...`
# line below; $MODEL and $WORK are there to use. Everything happens in a
# temporary directory that is removed at the end, whatever happens.
set -euo pipefail

CKPT_BIN=${CKPT_BIN:-$(dirname "$0")/build/ckpt}
[ -x "$CKPT_BIN" ] || { echo "demo: $CKPT_BIN not found; run 'make' first" >&2; exit 1; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-demo.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
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

step "Generate a small Qwen2-0.5B-shaped checkpoint (real tensor names and heads, widths / 8)" \
    gen-model qwen2 "$MODEL" --scale 8 --layers 2
ls -l "$MODEL" | sed 1d

step "List its tensors: name, dtype, shape, size, file" \
    inspect "$MODEL"

step --head 24 "The same as JSON, with each tensor's absolute byte offset in its file" \
    inspect --json "$MODEL"

printf '\n== done: %d steps; %s removed\n' "$n" "$WORK"
