#!/usr/bin/env bash
# run.sh — runs every tests/e2e/test_*.sh against one ckpt binary.
#
#   CKPT_BIN=build/ckpt tests/e2e/run.sh [test_name ...]
#
# Each test gets CKPT_BIN (absolute), E2E_DIR (this folder, for helpers like
# st_dump.py) and a fresh work directory in E2E_WORK (also TMPDIR), which it
# must leave empty: a test that leaves files behind fails, and so does one that
# leaves a process running (one with its E2E_WORK in its environment: a
# server, a stopped client), which is killed. A test passes when
# it exits 0; its output is shown only when it fails. E2E_JOBS tests run at
# once (default 3 on CI's 2 cores: the scripts wait on fsync and on their
# daemons for a good part of their time, so a third slot cut the stage from
# about 673 s to 564 s; none depends on the machine's speed); results are
# printed in the tests' order. The last line is always "e2e: N passed, N failed" and the exit
# status is non-zero on any failure.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
: "${CKPT_BIN:?set CKPT_BIN to the ckpt binary}"
CKPT_BIN=$(cd "$(dirname "$CKPT_BIN")" && pwd)/$(basename "$CKPT_BIN")
[ -x "$CKPT_BIN" ] || { echo "e2e: $CKPT_BIN is not executable" >&2; exit 2; }
jobs_max=${E2E_JOBS:-3}

# A sanitizer report must never pass for the exit status 1 a test expects.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=86:detect_leaks=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}exitcode=87:print_stacktrace=1:halt_on_error=1"
# One BLAS / OpenMP thread: OpenBLAS starts a thread per core when it is
# loaded (by numpy, torch, a ctypes probe, ckpt's first BLAS call), and
# those threads' start and spinning cost ~35 ms of a ~120 ms numpy import
# on the 2-core machine; the helpers' arrays are tiny. ckpt asks for one
# BLAS thread itself before it multiplies (lora/lora_merge.c), and OpenBLAS
# gives the same bytes whatever its thread count.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export CKPT_BIN E2E_DIR="$here"

if [ $# -gt 0 ]; then
    tests=()
    for name in "$@"; do tests+=("$here/${name%.sh}.sh"); done
else
    tests=("$here"/test_*.sh)
    [ -e "${tests[0]}" ] || tests=()
    # The longest ones start first, longest first, so the slots end about
    # together (results are still printed in this order); the rest follow in
    # name order. (As last measured in CI, seconds of wall time three at a
    # time: store 160, daemon 133, roundtrip 125, s3 118, dashboard 112,
    # store_crash 107, multi 102, easydel 92, fetch 80, http 73, lora 72,
    # fetch_resume 48, pg 46, lib 45, nxd and vllm 43, state 34, inspect 33,
    # easydel_read 30, torch 30, sync 29, nxd_out 28; the rest are under 25 s.
    # A name without its script is skipped.)
    first=()
    for slow in test_store test_daemon test_roundtrip test_s3 test_dashboard test_store_crash test_multi \
        test_easydel test_fetch test_http test_lora test_fetch_resume test_pg test_lib test_nxd test_vllm \
        test_state test_inspect test_easydel_read test_torch test_sync test_nxd_out; do
        [ -e "$here/$slow.sh" ] && first+=("$here/$slow.sh")
    done
    rest=()
    for t in "${tests[@]}"; do
        case " ${first[*]} " in *" $t "*) ;; *) rest+=("$t") ;; esac
    done
    tests=("${first[@]}" "${rest[@]}")
fi

results=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-e2e-results.XXXXXX")

# alive WORK: whether a process whose environment has E2E_WORK=WORK (that
# test's own: another run's tests have folders of their own) still runs. One
# grep over /proc, whatever the number of processes on the machine.
alive() { grep -qlzxF "E2E_WORK=$1" /proc/[0-9]*/environ 2>/dev/null; }
# leftovers WORK: kills (-9: a stopped process too) every such process, and
# prints each one's pid and command line.
leftovers() {
    local f pid
    for f in $(grep -lzxF "E2E_WORK=$1" /proc/[0-9]*/environ 2>/dev/null); do
        pid=${f#/proc/}
        pid=${pid%/environ}
        [ "$pid" != "$BASHPID" ] || continue
        echo "pid $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | head -c 200)"
        kill -KILL "$pid" 2>/dev/null || true
    done
}
# Stopped from outside (a `timeout` of the whole run): the tests got the
# signal too and stop their servers; whatever of theirs is still running
# then is killed, and their scratch folders (listed in $results/works) are
# removed.
on_signal() {
    local w
    trap - TERM INT
    kill -TERM $(jobs -p) 2>/dev/null
    wait
    while read -r w; do
        leftovers "$w" >/dev/null
        rm -rf "$w"
    done < <(cat "$results/works" 2>/dev/null)
    exit 143
}
trap 'rm -rf "$results"' EXIT
trap on_signal TERM INT

# cpu_seconds FILE: sets $cpu to the user + system CPU seconds of the children
# this shell has waited for (the test script and every process it waited for;
# FILE is scratch). The honest figure on a shared machine, where wall time
# depends on the neighbours. Not in $(...): `times` must run in this shell.
cpu_seconds() {
    local l
    times >"$1" # its second line is the children's "user sys"
    l=$(tail -n 1 "$1")
    rm -f "$1"
    cpu=$(awk -v t="$l" 'BEGIN { split(t, f, /[ms ]+/); printf "%.1f", f[1] * 60 + f[2] + f[3] * 60 + f[4] }')
}

# run_one INDEX TEST: runs TEST in its own work directory; writes
# $results/INDEX.line (the PASS/FAIL line), INDEX.log (its output on failure)
# and INDEX.rc.
run_one() {
    local i=$1 t=$2 name work log start rc leftover left cpu
    name=$(basename "$t" .sh)
    work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-e2e-$name.XXXXXX")
    echo "$work" >>"$results/works"
    log="$results/$i.log"
    start=$SECONDS
    E2E_WORK="$work" TMPDIR="$work" bash "$t" >"$log" 2>&1
    rc=$?
    cpu_seconds "$results/$i.times"
    # A server the script stopped may still be on its way out (a daemon
    # killed -9 by its own stop function): 5 s for that, polled.
    for _ in $(seq 50); do alive "$work" || break; sleep 0.1; done
    left=$(leftovers "$work")
    if [ -n "$left" ]; then
        [ $rc -eq 0 ] && rc=1
        echo "left processes running (killed): $left" >>"$log"
    fi
    if [ -d "$work" ] && [ -n "$(ls -A "$work")" ]; then
        leftover=$(ls -A "$work" | head -n 5 | tr '\n' ' ')
        [ $rc -eq 0 ] && rc=1 && echo "left files in its work directory: $leftover" >>"$log"
    fi
    rm -rf "$work"
    if [ $rc -eq 0 ]; then
        printf '%-32s PASS (%ds, %s s CPU)\n' "$name" $((SECONDS - start)) "$cpu" >"$results/$i.line"
        : >"$log"
    else
        printf '%-32s FAIL (exit %d)\n' "$name" "$rc" >"$results/$i.line"
    fi
    echo "$rc" >"$results/$i.rc"
}

# Start the tests, at most jobs_max at a time; print each result as soon as
# it and every test before it are done.
next_print=0 running=0
print_ready() {
    while [ $next_print -lt ${#tests[@]} ] && [ -e "$results/$next_print.rc" ]; do
        cat "$results/$next_print.line"
        [ "$(cat "$results/$next_print.rc")" = 0 ] || sed 's/^/    | /' "$results/$next_print.log" | tail -n 60
        next_print=$((next_print + 1))
    done
}
for i in "${!tests[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
        wait -n 2>/dev/null || true
        print_ready
    done
    run_one "$i" "${tests[$i]}" &
done
wait
print_ready

passed=0 failed=0
for i in "${!tests[@]}"; do
    if [ "$(cat "$results/$i.rc" 2>/dev/null)" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
# The stage's wall time and the CPU of every script (the sum of the lines
# above): with E2E_JOBS at a time on 2 cores, the stage cannot take less than
# half the CPU sum, whatever the order.
cpu_seconds "$results/all.times"
echo "e2e: ${SECONDS} s wall, $cpu s CPU in all, $jobs_max at a time"
echo "e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
