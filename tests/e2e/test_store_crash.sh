#!/usr/bin/env bash
# test_store_crash.sh — the store when processes die and race (the second
# half of test_store.sh, split so the two run side by side).
#
# 5. import, store convert and gc stopped (SIGKILL) at every named crash point
#    they pass (CKPT_FAULT, common/fault.h): nothing half-visible, verify
#    clean, gc removes the leftovers, a fresh run works.
# 6. concurrent imports sharing tensors while gc loops: every checkpoint
#    pulls with matching sha256, verify is clean.
# 7. a tar pull to a file writes the archive alone: killed before its rename
#    it leaves only its temp file beside the target (SIGTERM: nothing), no
#    staging folder; it records the sha256 a store convert left pending; a
#    damaged blob fails it naming the file, leaving nothing.
# Run through run.sh (needs CKPT_BIN, E2E_DIR, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
. "$E2E_DIR/store_lib.sh"
# The store is read (ls, du, show, gc --dry-run) a hundred times over between
# the kills: those reads go without LeakSanitizer's check at exit, which costs
# about a third of such a short run (test_store runs the same reads with it).
# Every command under test (import, convert, gc, rm, verify, pull) keeps it.
query_asan="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# The checkpoint both sections keep in the store throughout (test_store.sh
# section 1 makes the same one).
gen qwen2 "$M/qwen2-one" --scale 32 --layers 2 --seed 2 --shard-mb 0

# =========================================================================
# 5. kill -9 during import, convert and gc
# =========================================================================
note "5. kill tests"
export CKPT_HOME=$work/h5
# Small (3 shards of under 1 MB): the points a run passes, and how often, do
# not depend on the bytes, and verify, which runs after every kill, rebuilds
# and hashes everything the store holds.
gen llama "$M/k" --scale 32 --layers 2 --shard-mb 1 --seed 5
[ "$(find "$M/k" -name '*.safetensors' | wc -l)" -ge 2 ] || fail "the llama of the kill tests is not sharded"
gen qwen3-moe "$M/kq" --scale 32 --layers 1 --shard-mb 0.5 --seed 6
gen qwen3-moe "$M/kq4" --scale 32 --layers 3 --shard-mb 0.5 --seed 6
expect_status 0 "$ckpt" import "$M/qwen2-one" --repo t/base   # something that must survive everything
killed=0
# after_kill WHAT REF WANT_SUMS BEFORE_REFS: REF is absent or complete; verify clean; gc settles.
# Sets $listed to 1 when REF is visible (gc does not change that), so the
# reset after it needs no listing of its own.
after_kill() {
    local what=$1 ref=$2 want=$3 before=$4 now
    now=$(refs)
    listed=0
    # verify first: it also records the sha256 a convert in the store leaves
    # pending, which show_sums compares.
    expect_verify_clean "$what"
    if [ "$now" != "$before" ]; then
        [ "$now" = "$(printf '%s\n%s\n' "$before" "$ref" | sed '/^$/d' | LC_ALL=C sort)" ] ||
            fail "$what: ls shows '$now', expected '$before' plus at most $ref"
        listed=1
        diff "$want" <(show_sums "$ref") >/dev/null || fail "$what: $ref is visible but its files are not the expected ones"
    fi
    expect_status 0 "$ckpt" gc
    gc_settled "$what"
}
# kill_series WHAT REF WANT_SUMS RESET -- CMD...: traces CMD's crash points,
# then for each runs CMD stopped there and checks the store (after_kill);
# RESET REF LISTED brings the store back to where the next run starts (the
# same listing every time: it is read once).
kill_series() {
    local what=$1 ref=$2 want=$3 reset=$4 before pt
    shift 5
    crash_points "$@" >"$work/points"
    "$reset" "$ref"
    before=$(refs)
    while read -r pt; do
        crash_at "$pt" "$@"
        killed=$((killed + 1))
        echo "   $what, stopped at $pt"
        after_kill "$what (stopped at $pt)" "$ref" "$want" "$before"
        "$reset" "$ref" "$listed"
    done <"$work/points"
}
# undo_rm REF [LISTED]: removes REF and gc's its blobs if it is listed
# (LISTED: 1 or 0 as after_kill found it; else ls is asked).
undo_rm() {
    local listed=${2:-}
    [ -n "$listed" ] || { listed=0; refs | grep -xF "$1" >/dev/null && listed=1; }
    if [ "$listed" = 1 ]; then
        expect_status 0 "$ckpt" rm "$1"
        expect_status 0 "$ckpt" gc
    fi
}

# -- import: stopped at every crash point it passes
sums "$M/k" >"$work/want-k"
kill_series "import" t/k@main "$work/want-k" undo_rm -- "$ckpt" import "$M/k" --repo t/k --quiet
grep -qx 'catalog.committed:[0-9]*' "$work/points" || fail "import passed no catalog commit"
expect_status 0 "$ckpt" import "$M/k" --repo t/k
expect_status 0 "$ckpt" pull t/k -o "$work/pull"
same_tree "$M/k" "$work/pull" "fresh import after the kills"
rm -rf "$work/pull"

# -- store convert
expect_status 0 "$ckpt" convert "$M/k" "$work/off" --layout neuron --tp 8
sums "$work/off" >"$work/want-conv"
kill_series "convert" t/k@main:neuron-tp8 "$work/want-conv" undo_rm -- "$ckpt" convert t/k --layout neuron --tp 8 --quiet
grep -q '^exec\.' "$work/points" && fail "store convert read tensor bytes: $(tr '\n' ' ' <"$work/points")"
grep -qx 'catalog.committed:[0-9]*' "$work/points" || fail "store convert passed no catalog commit"
expect_status 0 "$ckpt" convert t/k --layout neuron --tp 8
# Its 8 files' sha256 are left to the first reader. One stopped while hashing
# them (an HF-cache export) records none; the next records all 8, equal to
# the offline convert's.
pending() { pending_sha t/k:neuron-tp8; }
[ "$(pending)" = 8 ] || fail "store convert left $(pending) files pending, expected its 8 safetensors files"
crash_at exec.file_hashed:5 "$ckpt" pull t/k:neuron-tp8 --hf-cache "$work/hfc" --quiet
[ "$(pending)" = 8 ] || fail "a hashing stopped at file 5 of 8 recorded $((8 - $(pending))) sha256"
expect_status 0 "$ckpt" pull t/k:neuron-tp8 --hf-cache "$work/hfc" --quiet
[ "$(pending)" = 0 ] || fail "an HF-cache export left $(pending) files pending"
diff <(grep safetensors "$work/want-conv") <(show_sums t/k:neuron-tp8 | grep safetensors) >/dev/null ||
    fail "the recorded sha256 are not the offline convert's: $(show_sums t/k:neuron-tp8)"
rm -rf "$work/hfc"
expect_status 0 "$ckpt" pull t/k:neuron-tp8 -o "$work/pull"
diff -r "$work/off" "$work/pull" >/dev/null || fail "fresh convert after the kills differs from the offline convert"
rm -rf "$work/pull" "$work/off"
undo_rm t/k@main:neuron-tp8 # keep the store small: verify runs after every kill
undo_rm t/k@main

# -- import of many small tensors: stopped while its blobs are published
sums "$M/kq" >"$work/want-kq"
before=$(refs)
for pt in blob.written:150 blob.published:150; do
    crash_at "$pt" "$ckpt" import "$M/kq" --repo t/kq --quiet
    killed=$((killed + 1))
    after_kill "import (many tensors) stopped at $pt" t/kq@main "$work/want-kq" "$before"
    undo_rm t/kq@main "$listed"
done
expect_status 0 "$ckpt" import "$M/kq" --repo t/kq
expect_status 0 "$ckpt" pull t/kq -o "$work/pull"
same_tree "$M/kq" "$work/pull" "fresh import after the kills"
rm -rf "$work/pull"

# -- gc: a removed checkpoint whose blobs are partly shared with t/kq, which
# must survive. Each killed gc leaves part of the work to the next one; after
# each kill the store must be consistent; the last gc finishes the job.
expect_status 0 "$ckpt" import "$M/kq4" --repo t/kq4
expect_status 0 "$ckpt" rm t/kq4
nb=$(du_field blobs)
before=$(refs)
for pt in gc.blob_removed:1 gc.blob_removed:150 gc.blob_removed:400 catalog.before_commit:1; do
    crash_at "$pt" "$ckpt" gc
    killed=$((killed + 1))
    echo "   gc, stopped at $pt ($(du_field blobs) of $nb blobs left)"
    [ "$(refs)" = "$before" ] || fail "gc stopped at $pt: ls changed: $(refs)"
    expect_verify_clean "gc stopped at $pt"
done
[ "$(du_field blobs)" -lt "$nb" ] || fail "the stopped gc runs removed nothing"
expect_status 0 "$ckpt" gc
gc_settled "gc after the gc kills"
expect_status 0 "$ckpt" pull t/kq -o "$work/pull"
same_tree "$M/kq" "$work/pull" "t/kq after the gc kills"
rm -rf "$work/pull"
echo "   $killed runs stopped at crash points"
rm -rf "$CKPT_HOME"

# =========================================================================
# 6. concurrent imports and gc
# =========================================================================
note "6. concurrent imports while gc loops"
export CKPT_HOME=$work/h6
names=()
for l in 1 2 3 4; do
    gen llama "$M/c$l" --scale 16 --layers "$l" --seed 9
    names+=("c$l")
done
for l in 1 2; do
    gen mixtral "$M/x$l" --scale 32 --layers "$l" --seed 9 --shard-mb 1
    names+=("x$l")
done
expect_status 0 "$ckpt" import "$M/qwen2-one" --repo t/base   # the catalog exists before the race
# race NAME...: imports NAMEs at once while gc loops; all must succeed.
race() {
    local pids=() n gcs=0 alive i=0
    for n in "$@"; do
        "$ckpt" import "$M/$n" --repo "t/$n" --quiet >"$work/race-$n.out" 2>&1 &
        pids+=($!)
    done
    while :; do
        alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 1 ] || break
        "$ckpt" gc >"$work/gc.out" 2>&1 || fail "gc during the imports failed: $(cat "$work/gc.out")"
        gcs=$((gcs + 1))
    done
    for n in "$@"; do
        wait "${pids[$i]}" || fail "concurrent import of $n failed: $(cat "$work/race-$n.out")"
        i=$((i + 1))
        rm -f "$work/race-$n.out"
    done
    rm -f "$work/gc.out"
    echo "   imported $* with $gcs gc runs alongside"
}
check_all() {
    local n
    for n in "${names[@]}"; do
        expect_status 0 "$ckpt" pull "t/$n" -o "$work/pull"
        same_tree "$M/$n" "$work/pull" "$1: t/$n"
        rm -rf "$work/pull"
    done
    expect_verify_clean "$1"
    expect_status 0 "$ckpt" gc
    gc_settled "$1"
}
race "${names[@]}"
check_all "round 1"
# Removed, their blobs stay on disk unreferenced until gc: imports that reuse
# them race the gc that deletes them.
for n in "${names[@]}"; do expect_status 0 "$ckpt" rm "t/$n"; done
race c4 c2 x2 c1 c3 x1
check_all "round 2"
rm -rf "$CKPT_HOME"

# =========================================================================
# 7. a tar pull streams: nothing but the archive is written
# =========================================================================
note "7. tar pulls write the archive alone"
export CKPT_HOME=$work/h7
expect_status 0 "$ckpt" import "$M/qwen2-one" --repo t/a
lay=$(run "$ckpt" convert t/a --layout neuron --tp 2)
o=$work/o7
mkdir "$o"
# listing: what the output folder holds
listing() { ls -A "$o" | tr '\n' ' '; }
# Killed (SIGKILL) after the archive's fsync, before its rename: the folder
# holds the temp file alone, and no staging folder was made anywhere (the
# tmpdir.created point is never passed).
rm -f "$work/trace"
CKPT_FAULT=file.synced CKPT_FAULT_TRACE=$work/trace expect_status 137 "$ckpt" pull "$lay" -o "$o/p.tar" --format tar
[[ "$(listing)" == p.tar.tmp-*" " ]] || fail "a tar pull killed before its rename left: $(listing)"
grep -q tmpdir.created "$work/trace" && fail "a tar pull made a staging folder: $(tr '\n' ' ' <"$work/trace")"
tmp_empty "tar pull killed before its rename"
# The same stop by SIGTERM (as Ctrl-C): the temp file is removed.
rm -f "$o"/*
CKPT_FAULT=file.synced:1:TERM expect_status 143 "$ckpt" pull "$lay" -o "$o/p.tar.zst" --format tar.zst
[ -z "$(listing)" ] || fail "a tar pull stopped by SIGTERM left: $(listing)"
# The layout's files had their sha256 pending: the pull that completes
# records what it streamed, and removes the leftover of a killed run.
CKPT_FAULT=file.synced expect_status 137 "$ckpt" pull "$lay" -o "$o/p.tar.zst" --format tar.zst
[ "$(pending_sha "$lay")" -gt 0 ] || fail "$lay has no pending sha256 to record"
expect_status 0 "$ckpt" pull "$lay" -o "$o/p.tar.zst" --format tar.zst
[ "$(listing)" = "p.tar.zst " ] || fail "after a completed tar pull the folder holds: $(listing)"
[ "$(pending_sha "$lay")" = 0 ] || fail "the tar pull of $lay left $(pending_sha "$lay") sha256 pending"
untar "$o/p.tar.zst" "$work/u7"
diff <(sums "$work/u7") <(show_sums "$lay") >"$work/diff" || fail "$lay: the sha256 the tar pull recorded: $(head -c 1500 "$work/diff")"
rm -rf "$work/u7" "$o"/*
# A damaged blob (the largest: a tensor's) fails the pull naming the file,
# with no archive and no temp file left.
bp=$(find "$CKPT_HOME/blobs" -type f -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2)
"$py" -S -c '
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(0, 2); n = f.tell(); f.seek(n // 2); b = f.read(1); f.seek(n // 2); f.write(bytes([b[0] ^ 0x40]))' "$bp"
expect_status 1 "$ckpt" pull t/a -o "$o/p.tar" --format tar
grep -q "model.safetensors.*damaged" "$work/err" || fail "a damaged tar pull does not name the file: $(cat "$work/err")"
[ -z "$(listing)" ] || fail "a damaged tar pull left: $(listing)"
tmp_empty "damaged tar pull"
rm -rf "$CKPT_HOME" "$o"
