#!/usr/bin/env bash
# test_demo.sh — `make demo KEEP=1` (issue 19) ends by printing the dashboard
# URL of a daemon it leaves running. It runs demo.sh's daemon part
# (DEMO_PART=daemon: the small model published on a local Hub, then fetched
# and converted through `ckpt serve`; the offline tour before it is commands
# the other scripts check) with KEEP=1: the last line is "   dashboard: URL/";
# that URL answers the dashboard's page, and its /v1/jobs the demo's fetch
# and convert, succeeded; the line "stop them: kill PIDS; rm -rf DIR" names
# the demo's daemon and Hub, still running, and its folder; killed, they go.
# (Without KEEP the demo stops both and removes its folder, as it does when a
# step fails: its EXIT trap. A second run to show that would double this
# test's 4 s of CPU; it was checked by hand.)
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN KEEP DEMO_PART
root=$(cd "$E2E_DIR/../.." && pwd)
demo() { CKPT_BIN=$ckpt CKPT_TESTHUB=$testhub TMPDIR=$work DEMO_PART=daemon "$root/demo.sh" "$@"; }
left=()
on_exit() { [ ${#left[@]} -eq 0 ] || kill -TERM "${left[@]}" 2>/dev/null || true; }

KEEP=1 demo >"$work/keep.out" 2>&1 || fail "demo.sh with KEEP=1: $(tail -n 20 "$work/keep.out")"
last=$(tail -n 1 "$work/keep.out")
[[ "$last" =~ ^\ +dashboard:\ (http://127\.0\.0\.1:[0-9]+)/$ ]] || fail "the demo's last line is not the dashboard's URL: '$last'"
url=${BASH_REMATCH[1]}
stop=$(grep -E '^ +stop them: kill [0-9 ]+; rm -rf ' "$work/keep.out") || fail "no 'stop them' line: $(tail -n 5 "$work/keep.out")"
read -r -a left <<<"$(sed -E 's/^ +stop them: kill ([0-9 ]+); .*/\1/' <<<"$stop")"
dir=${stop##*rm -rf }
[ ${#left[@]} = 2 ] && [[ "$dir" == "$work"/ckpt-demo.* ]] && [ -d "$dir" ] || fail "the 'stop them' line: '$stop'"
for p in "${left[@]}"; do kill -0 "$p" 2>/dev/null || fail "process $p of the demo is not running"; done
[ "$(curl -s -o "$work/page" -w '%{http_code}' "$url/")" = 200 ] && grep -q '<script src="/assets/app.js"' "$work/page" ||
    fail "the printed URL does not answer the dashboard"
curl -sf "$url/v1/jobs" | "$py" -S -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
sys.exit(sorted((j["kind"], j["state"]) for j in jobs) != [("convert", "succeeded"), ("fetch", "succeeded")] and "jobs: %s" % jobs)' ||
    fail "the demo's daemon does not list its fetch and convert, succeeded"
kill -TERM "${left[@]}"
# all_gone: both have exited (not our children: an exited one may stay a zombie of init's)
all_gone() {
    local p
    for p in "${left[@]}"; do grep -qs '^State:.*[XZ]' "/proc/$p/status" || [ ! -e "/proc/$p" ] || return 1; done
}
wait_until 60 "the demo's daemon and Hub to stop" all_gone
left=()
rm -rf "$dir"
note "KEEP=1: the dashboard at $url, its daemon left running"
