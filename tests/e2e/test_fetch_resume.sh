#!/usr/bin/env bash
# test_fetch_resume.sh — an interrupted `ckpt fetch` resumes (issue 18 part 3,
# docs/hub.md "Resume"): the next fetch of the same commit asks the test Hub
# only for the bytes the first one did not keep, and stores the repo's bytes.
#
#   - stopped at the crash point fetch.piece_recorded after 90% of the pieces
#     (kill -9 on the spot): the rerun requests only the missing ranges (the
#     Hub's request log against the kept journal), about 10% of the bytes;
#   - Ctrl-C (SIGINT at that point): exit 130, the pieces are kept, resumed;
#   - a file whose connections are all cut early (drop=1000): the fetch gives
#     up after its retries, the other files' pieces are kept, resumed;
#   - kill -9 while the Hub holds a response (fault hold=OFF): the same; a gc
#     meanwhile keeps the folder a live fetch holds, a plain gc keeps a recent
#     one, and CKPT_HUB_PARTIAL_KEEP=0 gc removes a stale one (then the next
#     fetch starts from byte 0).
# Run through run.sh (needs CKPT_BIN, CKPT_TESTHUB, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
hub_client_env
E2E_LOGS=("$work/hub*.log" "$work/err")
faults() { set_faults "$hub_url" "$1"; }
ceiling="timeout 300"
opts=(--connections 1 --chunk-size 128KiB) # one piece at a time: the crash point's count is a piece count

"$ckpt" gen-model qwen2 "$work/m1" --scale 8 --layers 2 --shard-mb 2 >/dev/null 2>&1
CKPT_HOME=$work/hub "$ckpt" import "$work/m1" --repo org/tiny@main >/dev/null 2>&1
start_testhub hub
export HF_ENDPOINT=$hub_url
commit=$(curl -sf "$hub_url/api/models/org/tiny/revision/main" | "$py" -S -c 'import json,sys; print(json.load(sys.stdin)["sha"])')

# fetch_into HOME EXPECTED_STATUS [env...]: one fetch of org/tiny into HOME.
fetch_into() {
    local home=$1 want=$2 rc=0
    shift 2
    env CKPT_HOME="$home" "$@" $ceiling "$ckpt" fetch org/tiny "${opts[@]}" >"$work/out" 2>"$work/err" || rc=$?
    [ "$rc" -eq "$want" ] || fail "fetch into $home: exit $rc, expected $want"
}
# keep HOME: copies what the killed fetch kept, for resume_check.py.
keep() {
    [ -d "$1/partial/$commit" ] || fail "the interrupted fetch kept nothing in $1/partial/$commit"
    rm -rf "$work/kept"
    cp -r "$1/partial/$commit" "$work/kept"
}
# resume HOME WHAT: reruns the fetch; it must ask only for what is missing
# and store the repo's bytes, leaving no partial folder behind.
resume() {
    local home=$1 what=$2 first
    first=$(($(wc -l <"$work/hub.log") + 1))
    fetch_into "$home" 0
    grep -q "resuming an interrupted fetch" "$work/err" || fail "$what: the rerun did not resume: $(cat "$work/err")"
    # not a TTY: no progress line, a line per verified file
    [ "$(grep -c ', verified (./4 files)$' "$work/err")" -eq 4 ] || fail "not a TTY: expected a line per file: $(cat "$work/err")"
    ! grep -q $'\r' "$work/err" || fail "not a TTY: the progress line was drawn"
    "$py" -S "$E2E_DIR/resume_check.py" "$work/kept" "$work/hub.log" "$first" >"$work/check" || fail "$what: $(cat "$work/check")"
    CKPT_HOME=$home "$ckpt" pull org/tiny@main -o "$work/pulled" --quiet >/dev/null 2>"$work/err" || fail "$what: pull"
    diff -r "$work/m1" "$work/pulled" >/dev/null || fail "$what: the stored checkpoint differs from the repo"
    rm -rf "$work/pulled"
    [ ! -e "$home/partial/$commit" ] || fail "$what: left $(ls "$home/partial/$commit") in partial/"
    note "$what: resumed, identical; $(cat "$work/check")"
}

# ---- a crash point after 90% of the pieces ----
pieces=$(CKPT_HOME=$work/count CKPT_FAULT_TRACE=$work/trace "$ckpt" fetch org/tiny "${opts[@]}" >/dev/null 2>&1 && grep -c '^fetch.piece_recorded$' "$work/trace")
n90=$((pieces * 9 / 10))
fetch_into "$work/c1" 137 CKPT_FAULT=fetch.piece_recorded:$n90
keep "$work/c1"
resume "$work/c1" "killed at piece $n90 of $pieces"
"$py" -S - "$work/check" <<'PY' || fail "the 90% resume cost more than the missing bytes: $(cat "$work/check")"
import sys
w = open(sys.argv[1]).read().split()
kept, requested, missing, total = int(w[1]), int(w[3]), int(w[5]), int(w[7])
assert requested == missing and kept >= total * 0.8, w
print(f"-- bytes requested on the rerun / size: {requested / total:.3f}")
PY

# ---- Ctrl-C ----
fetch_into "$work/c2" 130 CKPT_FAULT=fetch.piece_recorded:10:INT
keep "$work/c2"
resume "$work/c2" "Ctrl-C at piece 10"

# ---- a connection lost past the retries ----
faults "drop=1000,only=model-00001"
fetch_into "$work/c8" 1
grep -q "model-00001-of-00002.safetensors: giving up after 9 attempts" "$work/err" || fail "drop=1000: $(cat "$work/err")"
faults ""
keep "$work/c8"
resume "$work/c8" "a fetch that gave up on model-00001 (its connections cut after 1000 bytes)"

# ---- kill -9 while the Hub holds a response; gc and the kept folder ----
faults "hold=3000000,only=model-00001"
CKPT_HOME=$work/c3 "$ckpt" fetch org/tiny "${opts[@]}" >"$work/out" 2>"$work/err.held" & # the process itself: kill -9 hits it
pid=$!
wait_until 60 "the Hub to hold a response" grep -q "fault=hold" "$work/hub.log"
CKPT_HOME=$work/c3 CKPT_HUB_PARTIAL_KEEP=0 "$ckpt" gc >/dev/null 2>&1 || fail "gc during a fetch"
[ -d "$work/c3/partial/$commit" ] || fail "gc removed the partial folder of a live fetch"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
faults ""
CKPT_HOME=$work/c3 "$ckpt" gc >/dev/null 2>&1 || fail "gc after the kill"
[ -d "$work/c3/partial/$commit" ] || fail "gc removed a recent partial folder (keep period: 7 days)"
keep "$work/c3"
resume "$work/c3" "kill -9 while the Hub held bytes 3000000-"

fetch_into "$work/c4" 137 CKPT_FAULT=fetch.piece_recorded:10
CKPT_HOME=$work/c4 CKPT_HUB_PARTIAL_KEEP=0 "$ckpt" gc >/dev/null 2>&1 || fail "gc of a stale partial folder"
[ ! -e "$work/c4/partial/$commit" ] || fail "CKPT_HUB_PARTIAL_KEEP=0 gc kept $work/c4/partial/$commit"
fetch_into "$work/c4" 0
! grep -q "resuming" "$work/err" || fail "a fetch resumed from a folder gc removed"
note "gc: a live fetch's folder and a recent one are kept; a stale one (CKPT_HUB_PARTIAL_KEEP=0) is removed"

# ---- the progress line ----
# On a TTY (a pty here): one line for the whole fetch, rewritten with \r:
# files verified, bytes done/total, rate, ETA. Its fields are checked, not its timing.
CKPT_HOME=$work/c5 "$py" -S - "$ckpt" "${opts[@]}" <<'PY' || fail "the progress line on a TTY"
import os, pty, re, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "fetch", "org/tiny"] + sys.argv[2:])
out = b""
while True:
    try:
        b = os.read(fd, 65536)
    except OSError:
        break
    if not b:
        break
    out += b
_, status = os.waitpid(pid, 0)
text = out.decode("utf-8", "replace")
assert os.waitstatus_to_exitcode(status) == 0, text
line = re.compile(r"fetch (\d+)/(\d+) files \[[#.]{30}\] +([\d.]+)% ([\d.]+ \w+)/([\d.]+ \w+) ([\d.]+) MiB/s ETA (\d+:\d\d|--:--)")
rows = [l for l in text.replace("\r\n", "\n").split("\n") if "files [" in l]
assert len(rows) == 1, f"the progress took {len(rows)} lines: {rows}"
draws = [line.search(seg) for seg in rows[0].split("\r") if seg.strip()]
assert draws and all(draws), rows[0]
last = draws[-1]
assert last.group(1) == last.group(2) == "4" and last.group(3) == "100.0", last.group(0)
assert last.group(4) == last.group(5) and last.group(7) == "0:00", last.group(0)
print("-- TTY: one progress line, last draw:", last.group(0))
PY
fetch_into "$work/c7" 0 CKPT_QUIET=1
[ ! -s "$work/err" ] || fail "CKPT_QUIET=1: the fetch said $(cat "$work/err")"
note "progress: one line on a TTY (files, bytes, rate, ETA); a line per file otherwise; nothing under CKPT_QUIET"
