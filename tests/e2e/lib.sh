# lib.sh — what the e2e scripts share. A script starts with
#
#   set -euo pipefail
#   . "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
#
# and then has:
#   $ckpt, $work        the binary under test (CKPT_BIN) and the script's own
#                       scratch folder (E2E_WORK), which is emptied at exit
#                       (run.sh wants it left empty)
#   $testhub            the local Hub (CKPT_TESTHUB, or beside CKPT_BIN)
#   $py                 /usr/bin/python3 (else python3 resolved once: a pyenv shim
#                       costs 0.3 s a call). The scripts run it as `"$py" -S`
#                       (no site module: the .pth files of dist-packages are
#                       not run at each start) for every helper of the
#                       standard library only; what needs Debian's modules
#                       (torch, zarr, numpy, selenium) runs /usr/bin/python3
#                       or torch_python's without -S
#   fail MSG            prints the tails of the logs in E2E_LOGS (globs, set
#                       by the script), what the script's on_fail function
#                       prints if it has one, then "FAIL: MSG"; exits 1
#   note MSG            a progress line with the seconds since the start and
#                       the CPU seconds used so far (by the processes waited for)
#   expect_status WANT CMD...   runs CMD; its exit status must be WANT;
#                       stdout in $work/out, stderr in $work/err
#   wait_until LIMIT WHAT CMD...  polls CMD until it succeeds; fails after
#                       LIMIT seconds (at least 60: a ceiling for a hang, not a
#                       measure of speed)
#   wait_file FILE      wait_until the file exists and is not empty
#   has_modules PY MOD...  PY finds every module (looked up, not imported)
#   stop_daemon PID LOG SIGTERM to a `ckpt serve` the script started; it must
#                       exit cleanly (serve_exit_ok; LOG its stderr)
#   serve_bg PID        a server of the script: at exit it gets SIGTERM and
#                       must exit 0 (a sanitizer report is a failure)
#   start_testhub NAME [FAULTS] [ARGS...]  a test Hub on the store $work/hub
#                       (or HUB_HOME), log in $work/NAME.log; sets
#                       ${NAME}_url and ${NAME}_pid
#   hub_client_env      fetches retry in milliseconds and see no token of the machine
#   set_faults URL SPEC replaces the faults of the test Hub at URL
# At exit: the script's on_exit function if it has one, the commands in
# e2e_cleanups (libraries such as ceph_lib.sh add their own), then every
# serve_bg server is stopped and checked, every other background job
# killed, and $work emptied.

ckpt=${CKPT_BIN:?run me through tests/e2e/run.sh}
work=${E2E_WORK:?run me through tests/e2e/run.sh}
testhub=${CKPT_TESTHUB:-$(dirname "$ckpt")/ckpt-testhub}
# Debian's python3 (the one `make deps` gives its packages), else the one on PATH
# resolved once (a pyenv shim costs ~0.9 CPU-s a call; pyenv's own python
# starts in twice the CPU of Debian's).
if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=$(python3 -c 'import sys; print(sys.executable)'); fi
E2E_LOGS=()
e2e_servers=()
e2e_cleanups=() # commands run at exit after on_exit (a library's servers: ceph_lib.sh)

fail() { # the logs first, the reason last: run.sh shows the last 60 lines of a failed test
    local pattern l
    for pattern in "${E2E_LOGS[@]}"; do
        for l in $pattern; do
            [ -f "$l" ] && { echo "--- $(basename "$l") (tail)"; tail -n 10 "$l"; } >&2
        done
    done
    if declare -F on_fail >/dev/null; then on_fail >&2 || true; fi
    echo "FAIL: $*" >&2
    exit 1
}

note() { # the wall seconds since the start, and the CPU seconds of the processes waited for so far
    local u sys
    times >"$work/.times" # a builtin: this shell's children; its second line is "user sys"
    { read -r _ && read -r u sys; } <"$work/.times"
    rm -f "$work/.times"
    echo "-- $* (${SECONDS}s, $(awk -v t="$u $sys" 'BEGIN { split(t, f, /[ms ]+/); printf "%.1f", f[1] * 60 + f[2] + f[3] * 60 + f[4] }') s CPU)"
}

expect_status() {
    local want=$1 rc=0
    shift
    "$@" >"$work/out" 2>"$work/err" || rc=$?
    # GCC 12's LeakSanitizer sometimes crashes in its own tracer at a
    # process's exit (no scan made): that exit (86) stands for the command's
    # success only when success was expected and nothing else was reported.
    if [ "$rc" -eq 86 ] && [ "$want" -eq 0 ] && lsan_tracer_crash "$work/err"; then
        echo "note: LeakSanitizer's tracer crashed at the exit of '$1' (no scan made; not a leak)" >&2
        rc=0
    fi
    [ "$rc" -eq "$want" ] || fail "'$*' exited $rc, expected $want; stdout: $(head -c 1500 "$work/out"); stderr: $(head -c 1500 "$work/err")"
}

wait_until() {
    local limit=$1 what=$2 end asan=${ASAN_OPTIONS:-} pause=0.02
    shift 2
    [ "${limit%.*}" -ge 60 ] || limit=60
    end=$((EPOCHSECONDS + ${limit%.*}))
    "$@" >/dev/null 2>&1 && return 0
    # The first poll runs with the script's sanitizer options; the next ones
    # without LeakSanitizer's check at exit, which costs a ckpt process about
    # as much CPU as a query's work. A poll (a sanitizer-built ckpt, often a
    # python after it) costs ~0.1 CPU-s: the pause between polls doubles from
    # 20 ms up to 320 ms, so a wait of a few seconds for a daemon's jobs does
    # not keep a core busy (and away from the daemon it waits for).
    until ASAN_OPTIONS="${asan:+$asan:}detect_leaks=0" "$@" >/dev/null 2>&1; do
        [ "$EPOCHSECONDS" -lt "$end" ] || fail "timed out after ${limit%.*} s waiting for: $what"
        sleep "$pause" # a poll interval: what is awaited is a state, and LIMIT only catches a hang
        case $pause in 0.02) pause=0.04 ;; 0.04) pause=0.08 ;; 0.08) pause=0.16 ;; *) pause=0.32 ;; esac
    done
}

# gone PID: the process has ended (no such process, or a zombie its parent
# has not reaped yet).
gone() {
    local s
    s=$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 0
    [[ -z "$s" || "$s" == Z* || "$s" == X* ]]
}

# serve_exit_ok RC LOG: a daemon's exit status RC is a clean exit: 0, or 86
# (ASAN_OPTIONS' exitcode) when the only sanitizer output in LOG, its stderr,
# is LeakSanitizer's own tracer crashing while it stops the process's threads
# for the exit scan ("Tracer caught signal 11 ... LeakSanitizer has encountered
# a fatal error": GCC 12's LSan racing a thread of the runtime; no scan was
# made, nothing was found). A leak, an ASan or UBSan report still fails.
# lsan_tracer_crash LOG: LOG (a process's stderr) ends in LeakSanitizer's
# own tracer crash and holds no sanitizer report.
lsan_tracer_crash() {
    grep -q "^Tracer caught signal" "$1" 2>/dev/null &&
        grep -q "LeakSanitizer has encountered a fatal error" "$1" &&
        ! grep -q "ERROR: \(Leak\|Address\)Sanitizer\|runtime error:" "$1"
}

serve_exit_ok() {
    local rc=$1 log=$2
    [ "$rc" -eq 0 ] && return 0
    [ "$rc" -eq 86 ] && lsan_tracer_crash "$log" || return 1
    echo "note: LeakSanitizer's tracer crashed at the daemon's exit (no scan made; not a leak)" >&2
}

# stop_daemon PID LOG: SIGTERM to a daemon this script started (a child of
# its shell), waits for it, and fails unless its exit is clean by
# serve_exit_ok (LOG: its stderr, whose tail the failure shows).
stop_daemon() {
    local rc=0
    kill -TERM "$1"
    wait "$1" || rc=$?
    serve_exit_ok "$rc" "$2" || fail "ckpt serve ($1) exited $rc after SIGTERM: $(tail -n 20 "$2" 2>/dev/null)"
}

wait_file() { wait_until 60 "$1 to appear" test -s "$1"; }

# has_modules PYTHON MODULE...: PYTHON finds every MODULE, looked up without
# being imported (an import of numpy, zarr or selenium costs 0.1 to 0.3
# CPU-s, torch ~1-3): the script's own python imports it anyway, and fails
# clearly if the package is broken.
has_modules() {
    local p=$1
    shift
    "$p" -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))' "$@" 2>/dev/null
}

# torch_python: prints a python3 that has torch (Debian's python3-torch,
# make deps) — $py, else /usr/bin/python3 — or returns 1:
#   torch_py=$(torch_python) || fail "no python3 with torch (make deps installs python3-torch)"
# It looks the module up without importing it: an import of torch costs ~3
# CPU-s, and the script's own python pays it anyway (and fails clearly if
# the package is broken).
torch_python() {
    local cand
    for cand in "$py" /usr/bin/python3; do
        if has_modules "$cand" torch; then
            echo "$cand"
            return 0
        fi
    done
    return 1
}

# same_tensors A B: folders A and B hold the same tensors (names, dtypes,
# shapes, bytes), in whatever files and shards (state_tensors.py); else says
# how they differ and returns 1.
same_tensors() {
    diff <("$py" -S "$E2E_DIR/state_tensors.py" "$1") <("$py" -S "$E2E_DIR/state_tensors.py" "$2") >"$work/same.diff" || {
        echo "$1 and $2 hold different tensors: $(head -n 5 "$work/same.diff")" >&2
        return 1
    }
}

serve_bg() { e2e_servers+=("$1"); }

# serve_stop PID: SIGTERM now; it must exit 0.
serve_stop() {
    local p rc=0 left=()
    for p in "${e2e_servers[@]}"; do [ "$p" = "$1" ] || left+=("$p"); done
    e2e_servers=("${left[@]}")
    kill -TERM "$1" 2>/dev/null || true
    wait "$1" || rc=$?
    [ "$rc" -eq 0 ] || fail "pid $1 exited $rc after SIGTERM (sanitizer report?)"
}

start_testhub() {
    local name=$1 spec=${2:-}
    shift $(($# < 2 ? $# : 2))
    [ -x "$testhub" ] || fail "$testhub is not built (make BUILD=... \$BUILD/ckpt-testhub)"
    rm -f "$work/$name.url"
    "$testhub" --home "${HUB_HOME:-$work/hub}" --url-file "$work/$name.url" --log "$work/$name.log" \
        --faults "$spec" "$@" 2>>"$work/$name.err" &
    local pid=$!
    serve_bg "$pid"
    wait_file "$work/$name.url"
    printf -v "${name}_url" '%s' "$(cat "$work/$name.url")"
    printf -v "${name}_pid" '%s' "$pid"
}

# hub_client_env: what a fetch in a test runs with: retries in milliseconds,
# no token from the machine running the tests.
hub_client_env() {
    export CKPT_HUB_BACKOFF_MS=10 HF_HOME=$work/hf-home
    unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
}
# set_faults URL SPEC: replaces the faults of the test Hub at URL.
set_faults() { curl -sf -X POST --data-binary "$2" "$1/_testhub/faults" >/dev/null || fail "cannot set faults '$2'"; }

e2e_exit() {
    local rc=$? p bad=0
    trap - EXIT
    if declare -F on_exit >/dev/null; then on_exit || true; fi
    for p in "${e2e_cleanups[@]}"; do "$p" || true; done
    for p in "${e2e_servers[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${e2e_servers[@]}"; do wait "$p" 2>/dev/null || bad=$?; done
    for p in $(jobs -p); do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    find "$work" -mindepth 1 -delete 2>/dev/null || true
    if [ "$bad" -ne 0 ] && [ "$rc" -eq 0 ]; then
        echo "FAIL: a server exited $bad when stopped (sanitizer report?)" >&2
        rc=1
    fi
    exit "$rc"
}
trap e2e_exit EXIT
