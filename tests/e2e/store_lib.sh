# store_lib.sh — what test_store.sh and test_store_crash.sh share: the
# helpers over a store (pull and compare, refs, sums, gc and verify checks)
# and the crash-point drivers. Sourced after lib.sh.
dump="$py -S $E2E_DIR/st_dump.py"
# run CMD...: expect_status 0 and print CMD's stdout.
run() {
    expect_status 0 "$@"
    cat "$work/out"
}
gen() { expect_status 0 "$ckpt" gen-model "$@"; }
# untar ARCHIVE DIR: extracts a .tar or .tar.zst (checked strictly by zstd) into a new DIR.
untar() {
    mkdir "$2"
    if [[ "$1" == *.zst ]]; then
        zstd -q -dc "$1" >"$1.tar" 2>"$work/err" || fail "$1: zstd -d fails: $(cat "$work/err")"
        tar -xf "$1.tar" -C "$2" || fail "$1: not a tar"
        rm -f "$1.tar"
    else
        tar -xf "$1" -C "$2" || fail "$1: not a tar"
    fi
}

# sums DIR: "sha256  relative path" of every file under DIR, sorted.
sums() { (cd "$1" && find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r sha256sum); }
# same_tree WANT GOT WHAT: same files with the same sha256.
same_tree() {
    [ -d "$2" ] || fail "$3: $2 is not a folder"
    if ! diff <(sums "$1") <(sums "$2") >"$work/diff"; then
        fail "$3: files differ from $1: $(head -c 1500 "$work/diff")"
    fi
}
# The queries below read ckpt's JSON with jq (Debian's jq, make deps): it
# starts in about half the CPU of a python (~50 ms against ~100 on the
# loaded 2-core machine), and these run after most commands of test_store
# and after every kill of test_store_crash.
# jget FIELD: a top-level field of the JSON object on stdin (a missing one
# prints "null").
jget() { jq -r --arg f "$1" '.[$f]'; }
# The state queries below (du, ls, show, gc --dry-run) run with $query_asan
# as ASAN_OPTIONS: the script's own unless it sets another (test_store_crash
# reads the store after every kill and drops LeakSanitizer's exit check from
# these reads only).
query_asan=${ASAN_OPTIONS:-}
du_field() { ASAN_OPTIONS=$query_asan "$ckpt" du --json | jget "$1"; }
# refs: the sorted refs `ckpt ls --json` lists.
refs() { ASAN_OPTIONS=$query_asan "$ckpt" ls --json | jq -r '[.checkpoints[].ref] | sort | .[]'; }
# show_sums REF: "sha256  path" of REF's files as the catalog records them (same form as sums).
# (jq sorts strings by code point: the byte order of their UTF-8, as sums' sort)
show_sums() {
    ASAN_OPTIONS=$query_asan "$ckpt" show "$1" --json | jq -r '.files | sort_by(.path) | .[] | "\(.sha256)  \(.path)"'
}
# pending_sha REF: how many of REF's files have their sha256 pending (a
# convert in the store leaves them to the first reader).
pending_sha() {
    ASAN_OPTIONS=$query_asan "$ckpt" show "$1" --json | jq '[.files[] | select(.sha256 == null)] | length'
}
tmp_empty() {
    [ -z "$(ls -A "$CKPT_HOME/tmp")" ] || fail "$1: $CKPT_HOME/tmp is not empty: $(ls -A "$CKPT_HOME/tmp" | head -5 | tr '\n' ' ')"
}
# gc_settled WHAT: a second gc (dry run) finds nothing, tmp/ is empty.
gc_settled() {
    local j
    j=$(ASAN_OPTIONS=$query_asan "$ckpt" gc --dry-run --json) || fail "$1: gc --dry-run failed"
    "$py" -S -c '
import json, sys
j = json.loads(sys.argv[1])
bad = {k: j[k] for k in ("blobs_removed", "temps_removed", "leases_dropped") if j[k]}
if bad: sys.exit(f"{sys.argv[2]}: gc --dry-run after gc still finds {bad}")' "$j" "$1" || fail "$1: gc left work"
    tmp_empty "$1"
}
expect_verify_clean() {
    expect_status 0 "$ckpt" verify
    grep -q "damaged" "$work/out" && fail "$1: verify printed damage: $(head -c 1000 "$work/out")"
    return 0
}

# crash_points CMD...: runs CMD once with CKPT_FAULT_TRACE and prints the crash
# points (common/fault.h) to stop it at: the first and the last pass of each
# distinct point it went through, as NAME:N.
crash_points() {
    rm -f "$work/trace"
    CKPT_FAULT_TRACE=$work/trace "$@" >/dev/null 2>&1 || fail "'$*' failed when traced"
    [ -s "$work/trace" ] || fail "'$*' passed no crash point"
    sort "$work/trace" | uniq -c | while read -r n p; do
        printf '%s:1\n' "$p"
        [ "$n" -gt 1 ] && printf '%s:%d\n' "$p" "$n"
        true
    done
    rm -f "$work/trace"
}
# crash_at SPEC CMD...: runs CMD stopped (SIGKILL) at crash point SPEC; it must
# get there (exit status 137), not finish or fail on its own.
crash_at() {
    local spec=$1 rc=0
    shift
    CKPT_FAULT=$spec "$@" >/dev/null 2>"$work/crash.err" || rc=$?
    [ $rc -eq 137 ] || fail "'$*' was not stopped at $spec (exit $rc): $(head -c 500 "$work/crash.err")"
}

M=$work/models
mkdir -p "$M"

