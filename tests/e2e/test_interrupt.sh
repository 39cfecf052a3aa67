#!/usr/bin/env bash
# test_interrupt.sh — Ctrl-C and SIGTERM leave nothing behind (issue 14,
# must fix 7).
#
# 1. SIGTERM / SIGINT at a named point (CKPT_FAULT=NAME:N:TERM|INT,
#    common/fault.h: the signal is sent at exactly that step, no timing) during
#    convert, consolidate, pull -o DIR and state save: exit 143 / 130, no DST,
#    no DST.tmp-*; with --force the old DST is intact.
# 2. A run killed with SIGKILL leaves DST.tmp-<pid>-<start>-*: the next run
#    into the same DST removes it (its writer is gone); a live writer's temp
#    folder is left alone.
# 3. A killed `state export` leaves staging in CKPT_HOME/tmp that gc removes.
# 4. A checkpoint removed (`ckpt rm`) while a convert of it runs: a clear
#    error naming it, not "FOREIGN KEY constraint failed".
# Run through run.sh (needs CKPT_BIN, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
export CKPT_HOME="$work/home"
# no_temps: nothing named *.tmp-* anywhere under $work (the store's tmp/ included).
no_temps() {
    local left
    left=$(find "$work" -name '*.tmp-*' -print | head -n 5)
    [ -z "$left" ] || fail "$1: temp folders left: $left"
    [ -z "$(ls -A "$CKPT_HOME/tmp" 2>/dev/null)" ] || fail "$1: left $(ls -A "$CKPT_HOME/tmp") in the store's tmp/"
}

expect_status 0 "$ckpt" gen-model qwen2 "$work/m" --scale 8 --layers 2 --shard-mb 1
expect_status 0 "$ckpt" convert "$work/m" "$work/conv" --layout neuron --tp 2
expect_status 0 "$ckpt" import "$work/m" --repo t/m@main
expect_status 0 "$ckpt" state save "$work/m" "$work/s" --optimizer adamw --fill random --seed 3 --step 10

# ---- 1. a signal at a named point ----
for sig in TERM:143 INT:130; do
    name=${sig%:*} code=${sig#*:}
    CKPT_FAULT=exec.file_done:2:$name expect_status "$code" "$ckpt" convert "$work/m" "$work/dst" --layout neuron --tp 2
    grep -q "interrupted (SIG$name); the unfinished output was removed" "$work/err" || fail "convert SIG$name: $(cat "$work/err")"
    [ ! -e "$work/dst" ] || fail "convert SIG$name made $work/dst"
    no_temps "convert SIG$name"
    CKPT_FAULT=exec.file_done:1:$name expect_status "$code" "$ckpt" consolidate "$work/conv" "$work/dst"
    [ ! -e "$work/dst" ] || fail "consolidate SIG$name made $work/dst"
    no_temps "consolidate SIG$name"
    CKPT_FAULT=exec.file_done:1:$name expect_status "$code" "$ckpt" pull t/m@main -o "$work/dst"
    [ ! -e "$work/dst" ] || fail "pull SIG$name made $work/dst"
    no_temps "pull -o DIR SIG$name"
    CKPT_FAULT=state.before_commit:1:$name expect_status "$code" "$ckpt" state save "$work/m" "$work/dst" --step 1
    [ ! -e "$work/dst" ] || fail "state save SIG$name made $work/dst"
    no_temps "state save SIG$name"
    note "SIG$name: convert, consolidate, pull -o DIR, state save exit $code, nothing left"
done
# --force: a signal before the swap leaves the old output whole; one during
# the swap (old moved aside, new renamed in) lets the swap finish first
cp -a "$work/conv" "$work/keep"
for point in exec.file_done:1 dir.before_rename:1 dir.renamed:1; do
    CKPT_FAULT=$point:TERM expect_status 143 "$ckpt" convert "$work/m" "$work/conv" --layout fused --force
    if [ "$point" = exec.file_done:1 ]; then
        diff -r "$work/keep" "$work/conv" >/dev/null || fail "--force, SIGTERM at $point: the old output changed"
    else
        grep -q fused "$work/conv/ckpt-layout.json" || fail "--force, SIGTERM at $point: the new output is not in place"
        rm -rf "$work/conv" && cp -a "$work/keep" "$work/conv"
    fi
    no_temps "convert --force, SIGTERM at $point"
done
rm -rf "$work/keep"
CKPT_FAULT=state.before_commit:1:TERM expect_status 143 "$ckpt" state save "$work/m" "$work/s" --step 11 --force
expect_status 0 "$ckpt" state load "$work/s" --json
grep -q '"step": 10' "$work/out" || fail "state save --force, SIGTERM: the old state changed: $(head -c 300 "$work/out")"
no_temps "state save --force SIGTERM"
note "--force: the old output survives a signal before the swap"

# ---- 2. a killed run's temp folder: the next run into the same DST removes it ----
CKPT_FAULT=exec.file_done:2 expect_status 137 "$ckpt" convert "$work/m" "$work/dst" --layout neuron --tp 2
left=$(compgen -G "$work/dst.tmp-*" || true)
[ -n "$left" ] || fail "the killed convert left no temp folder"
live=$$ # this shell: a writer that is alive
mkdir "$work/dst.tmp-$live-$(awk '{print $22}' "/proc/$live/stat")-live"
expect_status 0 "$ckpt" convert "$work/m" "$work/dst" --layout neuron --tp 2
[ ! -e "$left" ] || fail "the next convert into dst left $left"
grep -q "left by an interrupted run" "$work/err" || fail "the removal was not reported: $(cat "$work/err")"
[ -d "$work/dst.tmp-$live-"*-live ] || fail "a live writer's temp folder was removed"
rm -rf "$work/dst.tmp-$live-"*-live "$work/dst"
no_temps "after the next run"
note "a killed convert's temp folder is removed by the next run into the same DST; a live one is kept"

# ---- 3. a killed state export: gc removes its staging ----
expect_status 0 "$ckpt" state import "$work/s" --run r --step 10
# (--no-optimizer: rebuilt in staging, then saved without the moments)
CKPT_FAULT=tmpdir.created expect_status 137 "$ckpt" state export r -o "$work/exp" --no-optimizer
[ -n "$(ls -A "$CKPT_HOME/tmp")" ] || fail "the killed export left no staging (did the point move?)"
expect_status 0 "$ckpt" gc
[ -z "$(ls -A "$CKPT_HOME/tmp")" ] || fail "gc left the killed export's staging: $(ls -A "$CKPT_HOME/tmp")"
no_temps "state export killed, then gc"
note "a killed state export: gc removed its staging"

# ---- 4. a checkpoint removed while a convert of it runs ----
# The convert stops itself at a named point (CKPT_FAULT=NAME:N:STOP), the test
# removes the source, then lets the convert go on: a clear error, nothing stored.
expect_status 0 "$ckpt" import "$work/m" --repo t/gone@main
CKPT_FAULT=blob.written:1:STOP "$ckpt" convert t/gone@main --layout fused >"$work/out" 2>"$work/err" &
cpid=$!
stopped() { [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = T ]; }
wait_until 60 "the convert to stop at blob.written" stopped "$cpid"
"$ckpt" rm t/gone@main >/dev/null 2>"$work/rm.err" || fail "rm during the convert: $(cat "$work/rm.err")"
kill -CONT "$cpid"
rc=0
wait "$cpid" || rc=$?
[ "$rc" -eq 1 ] || fail "convert of a removed checkpoint exited $rc: $(cat "$work/err")"
grep -q "the source) was removed while this ran; nothing was stored" "$work/err" || fail "convert of a removed checkpoint: $(cat "$work/err")"
grep -q "FOREIGN KEY" "$work/err" && fail "a raw SQLite error: $(cat "$work/err")"
[ -z "$("$ckpt" ls 2>/dev/null | grep t/gone)" ] || fail "something of t/gone is stored: $("$ckpt" ls)"
rm -f "$work/rm.err"
expect_status 0 "$ckpt" gc
no_temps "a convert whose source was removed"
note "a source removed while its convert ran: a clear error, nothing stored"
