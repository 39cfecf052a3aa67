#!/usr/bin/env bash
# run_all.sh — what `make test` runs: every stage, whatever an earlier one did.
#
#   tests/run_all.sh            (from the repository root; make test calls it)
#
# Stages, each run even when an earlier one failed:
#   build   the sanitizer build (ASan+UBSan) in build/san: ckpt, the test Hub,
#           the library example and every tests/unit/<folder>/test_*.c program
#   layers  tests/check_layers.py over the build: folders in layer order, no
#           cycle between modules (docs/ARCHITECTURE.md)
#   unit    each cmocka program, two at a time (the longest first) beside
#           `make header-check` (ckpt.h alone in C11 and C++, its example
#           program run, counted as one); then, in the programs' order, each
#           one's summary lines are printed and its passed/failed counts added
#           up (a program that dies before its summary counts as one failure)
#   e2e     tests/e2e/run.sh: one count per script
#   fuzz    each libFuzzer harness for FUZZ_SECONDS (default 6): one count
#           each. They build in the background from the start, one compiler
#           at a time at nice 19 (on the CPU the sanitizer build leaves idle,
#           then the unit and end-to-end tests), then run one after another
#           at nice 19 while the tests run (on the CPU those leave idle: they
#           wait on fsync, daemons and servers much of the time); the stage
#           waits for the last one and prints the results
# The last line is "N passed, N failed" over all of them, and the exit status
# is non-zero when anything failed (a build that fails counts as a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
MAKE=${MAKE:-make}
SAN_BUILD=build/san
FUZZ_SECONDS=${FUZZ_SECONDS:-6}
passed=0 failed=0
summary=()
log=$(mktemp "${TMPDIR:-/tmp}/ckpt-test.XXXXXX")
trap 'rm -f "$log" "$log".*' EXIT

stage() { echo; echo "=== $1"; }
add() { # add NAME PASSED FAILED
    passed=$((passed + $2))
    failed=$((failed + $3))
    summary+=("$(printf '%-28s %4d passed, %d failed' "$1" "$2" "$3")")
}

# The fuzz harnesses build (clang, build/fuzz) from the start, one compiler
# at a time at nice 19, beside the sanitizer build: they take the CPU the
# build leaves idle (its links and the last long compiles leave a core free
# much of the time), then what the unit programs and the end-to-end tests
# leave, instead of competing at full priority with the end-to-end stage,
# whose scripts are bound by the CPU on 2 cores. Then each harness runs for
# FUZZ_SECONDS, one at a time at nice 19 (a harness runs its corpus first,
# whatever the time; then it searches for what is left of FUZZ_SECONDS).
# Each one's output goes to $log.fuzz.NAME and its exit status to
# $log.fuzz.NAME.rc; the fuzz stage waits for this job.
fuzz_names=()
for src in tests/fuzz/fuzz_*.c; do fuzz_names+=("$(basename "$src" .c)"); done
fuzz_all() {
    local n rc
    nice -n 19 $MAKE -j1 -k --no-print-directory "${fuzz_names[@]/#/build/fuzz/}" >"$log.fuzzbuild" 2>&1
    for n in "${fuzz_names[@]}"; do
        [ -x "build/fuzz/$n" ] || continue
        mkdir -p "build/fuzz/corpus-$n"
        rc=0
        nice -n 19 "build/fuzz/$n" -max_total_time="$FUZZ_SECONDS" -max_len=65536 "build/fuzz/corpus-$n" \
            "tests/fuzz/corpus/$n" >"$log.fuzz.$n" 2>&1 || rc=$?
        echo "$rc" >"$log.fuzz.$n.rc"
    done
}
fuzz_all &
fuzz_build_pid=$!

# ---- build ----
stage "build (ASan+UBSan, $SAN_BUILD)"
unit_bins=()
for src in tests/unit/*/test_*.c; do
    n=$(basename "$src" .c)
    unit_bins+=("$SAN_BUILD/tests/$n")
done
build_ok=1
# -k: a test program that does not compile leaves the others to run.
if ! $MAKE -j2 -k --no-print-directory BUILD=$SAN_BUILD SAN=1 "$SAN_BUILD/ckpt" "$SAN_BUILD/ckpt-testhub" \
    "$SAN_BUILD/tests/state_example" "${unit_bins[@]}" >"$log" 2>&1; then
    tail -n 40 "$log"
    build_ok=0
fi
[ -x "$SAN_BUILD/ckpt" ] && [ -x "$SAN_BUILD/ckpt-testhub" ] && [ -x "$SAN_BUILD/tests/state_example" ] || build_ok=0
if [ $build_ok = 1 ]; then add build 1 0; else add build 0 1; fi

# ---- layers ----
stage "layers"
if [ $build_ok = 1 ] && python3 tests/check_layers.py "$SAN_BUILD"; then add check-layers 1 0; else add check-layers 0 1; fi

# ---- unit ----
stage "unit (cmocka, two at a time)"
# Each program is one process in temp folders of its own (mkdtemp), so two run
# at once, one per core; the longest start first so both lanes end together,
# and make header-check runs as one more job. Results are printed in the
# programs' order once all have ended.
unit_order=()
for slow in test_transforms test_state test_store test_lora; do
    for t in "${unit_bins[@]}"; do [ "$(basename "$t")" = "$slow" ] && unit_order+=("$t"); done
done
for t in "${unit_bins[@]}"; do
    case " ${unit_order[*]} " in *" $t "*) ;; *) unit_order+=("$t") ;; esac
done
unit_one() { # unit_one PROGRAM: runs it; output in $log.NAME, exit status in $log.NAME.rc
    local n rc=0
    n=$(basename "$1")
    ASAN_OPTIONS=detect_leaks=1 "$1" >"$log.$n" 2>&1 || rc=$?
    echo "$rc" >"$log.$n.rc"
}
header_one() {
    local rc=0
    $MAKE --no-print-directory BUILD=$SAN_BUILD SAN=1 header-check >"$log.header" 2>&1 || rc=$?
    echo "$rc" >"$log.header.rc"
}
for t in header "${unit_order[@]}"; do
    while [ "$(jobs -rp | grep -cvx "$fuzz_build_pid")" -ge 2 ]; do wait -n 2>/dev/null || true; done
    if [ "$t" = header ]; then
        header_one &
    elif [ -x "$t" ]; then
        unit_one "$t" &
    fi
done
for p in $(jobs -rp | grep -vx "$fuzz_build_pid"); do wait "$p"; done
for t in "${unit_bins[@]}"; do
    n=$(basename "$t")
    if [ ! -x "$t" ]; then
        echo "== $n: not built"
        add "$n" 0 1
        continue
    fi
    echo "== $n"
    rc=$(cat "$log.$n.rc" 2>/dev/null || echo 1)
    # The runner's own lines: every result, not the tests' chatter.
    grep -E '^\[ *(RUN|OK|FAILED|PASSED|SKIPPED|ERROR|=+) *\]|^\[  FAILED  \]' "$log.$n" | grep -v '^\[ RUN' | grep -v '^\[       OK' || true
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test(s)\./\1/p' "$log.$n" | tail -n 1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test(s), listed below:/\1/p' "$log.$n" | tail -n 1)
    p=${p:-0} f=${f:-0}
    if [ "$rc" -ne 0 ] && [ "$f" = 0 ]; then
        # Died before its summary (a sanitizer report, a crash): show why.
        tail -n 30 "$log.$n"
        f=1
    elif [ "$f" != 0 ]; then
        grep -B 3 -E '^\[  (FAILED|ERROR) +\]' "$log.$n" | head -n 60
    fi
    add "$n" "$p" "$f"
    rm -f "$log.$n" "$log.$n.rc"
done

# ckpt.h on its own and the example program of its comment (tests/header/).
echo "== header-check"
if [ "$(cat "$log.header.rc" 2>/dev/null)" = 0 ]; then
    tail -n 2 "$log.header"
    add header-check 1 0
else
    tail -n 30 "$log.header"
    add header-check 0 1
fi
rm -f "$log.header" "$log.header.rc"

# ---- e2e ----
stage "e2e"
if [ -x "$SAN_BUILD/ckpt" ]; then
    CKPT_BIN=$PWD/$SAN_BUILD/ckpt CKPT_TESTHUB=$PWD/$SAN_BUILD/ckpt-testhub tests/e2e/run.sh | tee "$log"
    line=$(grep -E '^e2e: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        set -- $line
        add e2e "$2" "$4"
    else
        add e2e 0 1
    fi
else
    echo "e2e: skipped, ckpt did not build"
    add e2e 0 1
fi

# ---- fuzz ----
stage "fuzz (${FUZZ_SECONDS}s per harness, beside the tests at nice 19)"
wait "$fuzz_build_pid"
for n in "${fuzz_names[@]}"; do
    echo "== $n for ${FUZZ_SECONDS}s"
    if [ ! -e "$log.fuzz.$n.rc" ]; then
        echo "$n: not built"
        grep -E "error|$n" "$log.fuzzbuild" | tail -n 20
        add "$n" 0 1
    elif [ "$(cat "$log.fuzz.$n.rc")" = 0 ]; then
        grep -E '^#[0-9]+.*DONE|^Done [0-9]+ runs' "$log.fuzz.$n" | tail -n 1
        add "$n" 1 0
    else
        tail -n 40 "$log.fuzz.$n"
        add "$n" 0 1
    fi
    rm -f "$log.fuzz.$n" "$log.fuzz.$n.rc"
done

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
