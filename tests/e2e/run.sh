#!/usr/bin/env bash
# run.sh — runs every tests/e2e/test_*.sh against one ckpt binary.
#
#   CKPT_BIN=build/ckpt tests/e2e/run.sh [test_name ...]
#
# Each test gets CKPT_BIN (absolute), E2E_DIR (this folder, for helpers like
# st_dump.py) and a fresh work directory in E2E_WORK (also TMPDIR), which it
# must leave empty: a test that leaves files behind fails. A test passes when
# it exits 0; its output is shown only when it fails. The last line is always
# "e2e: N passed, N failed" and the exit status is non-zero on any failure.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
: "${CKPT_BIN:?set CKPT_BIN to the ckpt binary}"
CKPT_BIN=$(cd "$(dirname "$CKPT_BIN")" && pwd)/$(basename "$CKPT_BIN")
[ -x "$CKPT_BIN" ] || { echo "e2e: $CKPT_BIN is not executable" >&2; exit 2; }

# A sanitizer report must never pass for the exit status 1 a test expects.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=86:detect_leaks=1"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}exitcode=87:print_stacktrace=1:halt_on_error=1"
export CKPT_BIN E2E_DIR="$here"

if [ $# -gt 0 ]; then
    tests=()
    for name in "$@"; do tests+=("$here/${name%.sh}.sh"); done
else
    tests=("$here"/test_*.sh)
    [ -e "${tests[0]}" ] || tests=()
fi

passed=0 failed=0
for t in "${tests[@]}"; do
    name=$(basename "$t" .sh)
    work=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-e2e-$name.XXXXXX")
    log="$work.log"
    start=$SECONDS
    E2E_WORK="$work" TMPDIR="$work" bash "$t" >"$log" 2>&1
    rc=$?
    leftover=""
    if [ -d "$work" ] && [ -n "$(ls -A "$work")" ]; then
        leftover=$(ls -A "$work" | head -n 5 | tr '\n' ' ')
        [ $rc -eq 0 ] && rc=1 && echo "left files in its work directory: $leftover" >>"$log"
    fi
    rm -rf "$work"
    if [ $rc -eq 0 ]; then
        printf '%-32s PASS (%ds)\n' "$name" $((SECONDS - start))
        passed=$((passed + 1))
    else
        printf '%-32s FAIL (exit %d)\n' "$name" "$rc"
        sed 's/^/    | /' "$log" | tail -n 60
        failed=$((failed + 1))
    fi
    rm -f "$log"
done

echo "e2e: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
