#!/usr/bin/env bash
# test_sync.sh — scheduled Hub sync (issue 6, "Scheduled sync") against the
# local Hub (tests/hub/testhub.c) and a real daemon:
#   1. `sync add --every 2s --layout neuron --tp 8`: the first run fetches and
#      converts the repo's commit;
#   2. no new commit: later runs queue no fetch and no convert ("unchanged");
#   3. a new commit pushed to the Hub (a new generated checkpoint imported
#      under the same repo@main) is fetched and converted, seen by the first
#      sync run after the push;
#   4. the daemon down across two periods: one catch-up run at restart, not two;
#   5. a schedule's sync jobs never overlap; sync ls / rm / run; cron
#      expressions (UTC) and bad input.
# Run through run.sh (needs CKPT_BIN, CKPT_TESTHUB, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
export CKPT_HUB_BACKOFF_MS=10
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
export HF_HOME=$work/hf-home
export CKPT_HOME=$work/client
PERIOD=2

dpid=""
E2E_LOGS=("$work/serve.log")
on_fail() { echo "--- jobs"; "$ckpt" jobs 2>&1 | head -n 30; echo "--- sync ls"; "$ckpt" sync ls 2>&1; }
# The daemon first; lib.sh then stops the test Hub and checks its exit status.
on_exit() { [ -z "$dpid" ] || { kill -TERM "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null; } || true; }
# jobs_py EXPR: a Python expression over `jobs` (all jobs, oldest first), printed;
# jobs_check CODE: Python statements over the same, failing on an exception.
jobs_prelude='
import json, sys
jobs = sorted(json.load(sys.stdin), key=lambda j: j["id"])
def kind(k): return [j for j in jobs if j["kind"] == k]
'
jobs_py() { "$ckpt" jobs --json | "$py" -S -c "$jobs_prelude"'
print(eval(sys.argv[1]))' "$1"; }
jobs_check() { "$ckpt" jobs --json | "$py" -S -c "$jobs_prelude$1"; }
# stored COMMIT LAYOUT: the client store holds org/tiny at COMMIT in LAYOUT ("" the original).
stored() {
    "$ckpt" ls --json | "$py" -S -c 'import json, sys
sys.exit(not any(c["commit"] == sys.argv[1] and c["layout"] == sys.argv[2] for c in json.load(sys.stdin)["checkpoints"]))' "$1" "$2"
}
# at_least N EXPR: EXPR (jobs_py) is at least N — re-evaluated by each wait_until try.
at_least() { [ "$(jobs_py "$2")" -ge "$1" ]; }
start_daemon() {
    rm -f "$CKPT_HOME/serve.url"
    HF_ENDPOINT=$hub_url "$ckpt" serve --listen 127.0.0.1:0 --workers 2 >>"$work/serve.log" 2>&1 &
    dpid=$!
    local i
    # (a poll for a file the server writes when ready: the 60 s ceiling catches a hang, not slowness)
    for i in $(seq 1200); do [ -s "$CKPT_HOME/serve.url" ] && return 0; kill -0 "$dpid" 2>/dev/null || break; sleep 0.05; done
    fail "ckpt serve did not start"
}
stop_dpid() {
    local p=$dpid
    dpid=""
    stop_daemon "$p" "$work/serve.log"
}
now() { "$py" -S -c 'import time; print(time.time())'; }

# ---- the Hub ----
"$ckpt" gen-model qwen2 "$work/m1" --scale 8 --layers 2 >/dev/null 2>&1
"$ckpt" gen-model qwen2 "$work/m2" --scale 8 --layers 2 --seed 3 >/dev/null 2>&1
CKPT_HOME=$work/hub "$ckpt" import "$work/m1" --repo org/tiny@main >/dev/null 2>&1
start_testhub hub
c1=$(curl -sf "$hub_url/api/models/org/tiny/revision/main" | "$py" -S -c 'import json,sys; print(json.load(sys.stdin)["sha"])')

# ---- bad input ----
rc=0; "$ckpt" sync add org/tiny >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "sync add without --every/--cron exited $rc"
rc=0; "$ckpt" sync add org/tiny --every 5x >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "--every 5x exited $rc"
rc=0; "$ckpt" sync add org/tiny --cron "61 * * * *" 2>"$work/err" >/dev/null || rc=$?
[ "$rc" -eq 2 ] && grep -q "minute" "$work/err" || fail "--cron '61 * * * *': exit $rc, $(cat "$work/err")"
rc=0; "$ckpt" sync add org/tiny --every 1h --tp 8 >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "--tp before --layout exited $rc"
rc=0; "$ckpt" sync add org/tiny --every 1h --cron "* * * * *" >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "--every with --cron exited $rc"

# ---- cron in UTC; ls, rm ----
cron_id=$("$ckpt" sync add org/other --cron "*/5 3 * * mon-fri")
"$ckpt" sync ls --json | "$py" -S -c '
import json, sys, time
s = [x for x in json.load(sys.stdin) if x["id"] == int(sys.argv[1])][0]
t = time.gmtime(s["next_run_at"])
assert s["next_run_at"] > time.time(), s
assert t.tm_hour == 3 and t.tm_min % 5 == 0 and t.tm_sec == 0 and t.tm_wday < 5, (s, t)
assert s["cron"] == "*/5 3 * * mon-fri"' "$cron_id" || fail "cron next_run_at is not a weekday 03:xx UTC multiple of 5 minutes"
"$ckpt" sync rm "$cron_id"
rc=0; "$ckpt" sync rm "$cron_id" 2>/dev/null || rc=$?; [ "$rc" -eq 1 ] || fail "removing a removed schedule exited $rc"
note "cron '*/5 3 * * mon-fri' runs next on a weekday at 03:x5 UTC; ls, rm"

# ---- 1. the first run fetches and converts ----
sid=$("$ckpt" sync add org/tiny --every ${PERIOD}s --layout neuron --tp 8)
start_daemon
wait_until 60 "the first commit fetched and converted" stored "$c1" neuron-tp8
note "schedule $sid: commit ${c1:0:12} fetched and converted"
[ "$(jobs_py 'len(kind("fetch"))')" = 1 ] || fail "expected 1 fetch job"
# the daemon's log: a line per schedule firing and per job's start and end
grep -Eq " info schedule.fired schedule=$sid repo=org/tiny revision=main job=[0-9]+" "$work/serve.log" &&
    grep -Eq " info job.finished id=[0-9]+ kind=fetch ref=org/tiny .* bytes=[1-9]" "$work/serve.log" ||
    fail "no schedule.fired or job.finished line: $(grep -E 'schedule|job\.' "$work/serve.log" | head -5)"

# ---- 2. no new commit: nothing queued ----
syncs=$(jobs_py 'len(kind("sync"))')
wait_until 30 "two more sync runs" at_least $((syncs + 2)) 'len([j for j in kind("sync") if j["state"] == "succeeded"])'
[ "$(jobs_py 'len(kind("fetch"))')" = 1 ] || fail "a sync run without a new commit queued a fetch"
[ "$(jobs_py 'len(kind("convert"))')" = 1 ] || fail "a sync run without a new commit queued a convert"
"$ckpt" sync ls | grep -q "unchanged" || fail "sync ls does not say unchanged"
note "$(jobs_py 'len(kind("sync"))') sync runs, still 1 fetch and 1 convert; outcome: unchanged"

# ---- 3. a new commit on the Hub ----
CKPT_HOME=$work/hub "$ckpt" import "$work/m2" --repo org/tiny@main >/dev/null 2>&1
pushed=$(now) # the Hub answers with the new commit from here on
c2=$(curl -sf "$hub_url/api/models/org/tiny/revision/main" | "$py" -S -c 'import json,sys; print(json.load(sys.stdin)["sha"])')
[ "$c2" != "$c1" ] || fail "the push did not make a new commit"
wait_until 60 "the new commit fetched and converted" stored "$c2" neuron-tp8
# The first sync run that started after the push saw the new commit (not a
# wall-clock bound: how soon that run came depends on the machine's load).
# A run that started while the import was still going may have found it
# first; then the next one runs on and must still be let finish before its
# result is read.
wait_until 60 "the first sync run after the push to end" jobs_check "
after = [j for j in kind('sync') if (j.get('started_at') or 0) >= $pushed]
assert after and after[0]['state'] in ('succeeded', 'failed', 'cancelled')
"
jobs_check "
after = [j for j in kind('sync') if (j.get('started_at') or 0) >= $pushed]
assert after, 'no sync run after the push'
assert (after[0].get('result') or {}).get('commit') == '$c2', ('the first run after the push did not see it', after[0])
" || fail "the first sync run after the push did not see the new commit"
[ "$(jobs_py 'len(kind("fetch"))')" = 2 ] || fail "expected 2 fetch jobs after the push"
"$ckpt" pull org/tiny@main -o "$work/pulled" --quiet >/dev/null 2>&1
diff -r "$work/m2" "$work/pulled" >/dev/null || fail "main in the client store is not the pushed commit"
rm -rf "$work/pulled"
note "pushed ${c2:0:12}: seen by the first run after it, fetched and converted"

# ---- 4. the daemon down across two periods: one catch-up run ----
wait_until 30 "no job running" at_least 0 '-sum(j["state"] in ("queued", "running") for j in jobs)'
stop_dpid
# Schedules run on the wall clock: being down across two periods takes that
# much real time. Nothing below bounds how long anything took.
sleep $((PERIOD * 2 + 1))
restart=$(now)
start_daemon
wait_until 30 "two runs after the restart" at_least 2 "len([j for j in kind('sync') if (j.get('started_at') or 0) >= $restart])"
# One catch-up run at once, the next a whole period later (not one run per missed period).
jobs_check "
runs = sorted(j['started_at'] for j in kind('sync') if (j.get('started_at') or 0) >= $restart)
# One catch-up run, then the next a whole period later: a lower bound only (a
# loaded machine makes gaps longer, never shorter), so no upper bound on how
# soon the catch-up came.
assert runs[1] - runs[0] >= $PERIOD - 0.5, ('two runs right after the restart', runs)
" || fail "after $((PERIOD * 2 + 1)) s down: not exactly one catch-up run"
note "down $((PERIOD * 2 + 1)) s (two periods): one catch-up run, then the regular schedule"

# ---- 5. never two at once; run; rm ----
jobs_check '
runs = sorted((j["started_at"], j.get("finished_at") or 1e18) for j in kind("sync") if j.get("started_at"))
bad = [(a, b) for a, b in zip(runs, runs[1:]) if b[0] < a[1]]
assert not bad, bad
' || fail "two sync jobs of one schedule overlapped"
jid=$("$ckpt" sync run "$sid")
timeout 60 "$ckpt" wait "$jid" >/dev/null 2>&1 || fail "sync run: job $jid failed: $("$ckpt" show "$jid")"
"$ckpt" sync rm "$sid"
[ -z "$("$ckpt" sync ls)" ] || fail "sync ls after rm: $("$ckpt" sync ls)"
stop_dpid
note "sync jobs never overlapped; sync run queued job $jid; rm"
