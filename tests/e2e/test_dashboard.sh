#!/usr/bin/env bash
# test_dashboard.sh — the web dashboard `ckpt serve` answers at / (issue 19),
# in a real browser: Debian's headless Chromium through chromedriver and
# python3-selenium (make deps), driven by dashboard_driver.py.
#
# 1. The page and its assets: content types, Content-Security-Policy,
#    Cache-Control, ETag/304, 405, and no token needed for the page while the
#    API behind it still wants one.
# 2. Daemon A (no tokens, one worker, the test Hub behind it): a running noop
#    shows its phase live; a fetch+convert submitted from the form waits
#    behind it, the fetch's page linking the convert that waits for it and
#    the convert's the fetch; cancelling the noop from its page lets them
#    run: the convert's worker stops once after hashing its first output file
#    (CKPT_FAULT_WORKER=exec.file_hashed:1:STOP), and while it is held the job
#    page, the jobs list and `ckpt jobs` show its tensors N/M, M the tensor
#    count of the layout it then stores, and the page its rate and ETA as
#    GET /v1/jobs gives them, in the page's formats; with live updates
#    paused it is continued and succeeds on the server while the page still
#    shows it running (no refresh for 2.5 poll periods of the page's clock);
#    resumed, the page shows the success with M/M, the log followed; a convert that failed (its source was not stored yet)
#    is retried from its page and succeeds, its two attempts (failed with
#    the error, then succeeded) shown as the API keeps them; the checkpoint
#    page's files and tensor table equal `ckpt show --json` and `ckpt
#    inspect --json` of the pulled files; the overview's counts equal `ckpt
#    jobs --json` and its charts total what /v1/stats recorded (3 succeeded,
#    1 failed, the bytes fetched and converted) and, while the convert was
#    held, its one worker ran it; a schedule is added from the form, run now
#    (its sync job, recorded as the schedule's last job, succeeds, and the
#    row shows the commit, outcome and job), paused, resumed and removed,
#    each confirmed and seen by the API;
#    after `ckpt verify --server` the store page shows the logical and
#    physical bytes, dedup ratio and a clean last verify of every checkpoint;
#    on a 400 px window the jobs table stays inside the window; a job is
#    deleted from its page (a dismissed confirmation deletes nothing), then
#    all succeeded ones at once, and the API has none left.
# 3. Daemon B (--token-file, --log-level warn): the page loads, asks for a
#    token, and with a read token shows jobs but a retry, a bulk retry and a
#    submit are refused (403) with the server's message, and nothing
#    changes; its 32 jobs take two pages (one noop holds its one worker, so
#    30 noops stay queued). Then the admin token, typed once (kept across a
#    reload): a retry of the failed job, Cancel all of the queued jobs
#    matching "noop" and Retry all of them once cancelled, each confirmed,
#    the states read back from B; neither token in the address bar, the
#    tab's history or the browser's history database.
# 4. The logs: A's failed and cancelled jobs each have their line (the
#    error with it); B's has its failed job and nothing below warn. A's
#    /metrics counts the bytes fetched and converted that /v1/stats recorded.
# Screenshots go to $work/shots (emptied with $work at exit; with
# CKPT_DASHBOARD_SHOTS=DIR they are copied there first, to look at).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
export CKPT_QUIET=1 CKPT_HUB_BACKOFF_MS=10
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
export HF_HOME=$work/hf-home
E2E_LOGS=("$work/a.serve.log" "$work/b.serve.log" "$work/shots/chromedriver.log")

[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || fail "chromium and chromium-driver are not installed (make deps)"
has_modules /usr/bin/python3 selenium || fail "python3-selenium is not installed (make deps)"

pids=()
# The daemons first (their workers die with them); lib.sh then stops the test Hub.
on_exit() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
    [ -z "${CKPT_DASHBOARD_SHOTS:-}" ] || { mkdir -p "$CKPT_DASHBOARD_SHOTS" && cp "$work"/shots/* "$CKPT_DASHBOARD_SHOTS/"; } 2>/dev/null || true
}
on_fail() { echo "--- jobs of A"; CKPT_HOME=$work/a "$ckpt" jobs 2>&1 | head -n 20; }

# serve HOME LOG [ARGS...]: starts a daemon on HOME; sets $url and $dpid.
serve() {
    local home=$1 log=$2
    shift 2
    rm -f "$home/serve.url"
    CKPT_HOME=$home HF_ENDPOINT=$hub_url "$ckpt" serve --listen 127.0.0.1:0 "$@" >>"$log" 2>&1 &
    dpid=$!
    pids+=("$dpid")
    wait_file "$home/serve.url"
    url=$(cat "$home/serve.url")
}
jstate() { CKPT_HOME=$1 "$ckpt" show "$2" | "$py" -S -c 'import json, sys; print(json.load(sys.stdin)["state"])'; }
state_is() { [ "$(jstate "$1" "$2")" = "$3" ]; }

# The Hub holds org/tiny; A fetches it from there.
"$ckpt" gen-model qwen2 "$work/m" --scale 16 --layers 2 >/dev/null 2>&1
CKPT_HOME=$work/hub "$ckpt" import "$work/m" --repo org/tiny@main >/dev/null 2>&1
rm -rf "$work/m"
start_testhub hub

# --- 1. the page and its assets ---
# A's first worker to hash an output file stops there (once), for the live progress.
CKPT_FAULT_WORKER=exec.file_hashed:1:STOP CKPT_FAULT_ONCE=$work/stop.once serve "$work/a" "$work/a.serve.log" --workers 1
A=$url
hdr() { tr -d '\r' <"$work/hdr" | awk -v k="$1" 'tolower($1)==tolower(k)":" {sub(/^[^:]*: /,""); print}'; }
get() { rm -f "$work/body"; curl -s -o "$work/body" -D "$work/hdr" -w '%{http_code}' "$@"; }
[ "$(get "$A/")" = 200 ] && grep -q '<script src="/assets/app.js"' "$work/body" || fail "GET / did not answer the page"
[ "$(hdr Content-Type)" = "text/html; charset=utf-8" ] || fail "/ Content-Type: $(hdr Content-Type)"
csp=$(hdr Content-Security-Policy)
[[ "$csp" == *"default-src 'none'"* && "$csp" == *"script-src 'self'"* && "$csp" == *"connect-src 'self'"* &&
    "$csp" != *http* ]] || fail "Content-Security-Policy: '$csp'"
[ "$(hdr Cache-Control)" = no-cache ] && [ "$(hdr X-Content-Type-Options)" = nosniff ] || fail "/ caching or nosniff headers"
[ "$(get "$A/assets/app.js")" = 200 ] && [ "$(hdr Content-Type)" = "text/javascript; charset=utf-8" ] &&
    cmp -s "$work/body" "$E2E_DIR/../../service/http/dashboard/app.js" || fail "/assets/app.js is not the embedded script"
[ "$(get "$A/assets/app.css")" = 200 ] && [ "$(hdr Content-Type)" = "text/css; charset=utf-8" ] || fail "/assets/app.css"
etag=$(hdr ETag)
[ "$(get -H "If-None-Match: $etag" "$A/assets/app.css")" = 304 ] && [ ! -s "$work/body" ] || fail "If-None-Match did not give 304"
[ "$(get -X POST "$A/")" = 405 ] || fail "POST / is not 405"
[ "$(get "$A/assets/nope.js")" = 404 ] || fail "an unknown asset is not 404"

# --- 2. jobs for the browser on A: a failed convert, then a noop held running ---
export CKPT_HOME=$work/a
failed=$("$ckpt" submit convert org/tiny@main --layout fused)
wait_until 120 "convert $failed of a ref not stored yet to fail" state_is "$CKPT_HOME" "$failed" failed
noop=$("$ckpt" submit noop --until-file "$CKPT_HOME/never")
wait_until 120 "noop $noop to run" state_is "$CKPT_HOME" "$noop" running

# --- 3. daemon B, with tokens, and a failed job of its own ---
read_token=read-token-0123456789abcdef admin_token=admin-token-0123456789abcdef
printf '%s read\n%s admin\n' "$read_token" "$admin_token" >"$work/tokens"
serve "$work/b" "$work/b.serve.log" --workers 1 --token-file "$work/tokens" --log-level warn
B=$url
failed_b=$(CKPT_HOME=$work/b "$ckpt" submit convert org/none@main --layout fused)
wait_until 120 "B's convert $failed_b to fail" state_is "$work/b" "$failed_b" failed
# B's one worker is then held by a noop, so the 30 jobs queued after it over
# HTTP (for the pager, and for the admin token's cancel all / retry all) stay
# queued: nothing of B runs again.
held_b=$(CKPT_HOME=$work/b "$ckpt" submit noop --until-file "$work/b/never")
wait_until 120 "B's noop $held_b to run" state_is "$work/b" "$held_b" running
for i in $(seq 30); do
    curl -sf -o /dev/null -H "Authorization: Bearer $admin_token" \
        --data "{\"kind\":\"noop\",\"args\":{\"sleep_ms\":$i}}" "$B/v1/jobs" ||
        fail "POST /v1/jobs to B with the admin token"
done
[ "$(get "$B/")" = 200 ] || fail "the page of a daemon with tokens needs a token"
[ "$(get "$B/v1/jobs")" = 401 ] || fail "/v1/jobs without a token is not 401"

mkdir -p "$work/shots" "$work/profile"
note "browser"
CKPT_BIN=$ckpt URL_A=$A URL_B=$B HOME_B=$work/b READ_TOKEN=$read_token ADMIN_TOKEN=$admin_token SHOTS=$work/shots \
    PROFILE=$work/profile NOOP_ID=$noop FAILED_ID=$failed FAILED_B=$failed_b HELD_B=$held_b PULL_DIR=$work/pulled \
    /usr/bin/python3 "$E2E_DIR/dashboard_driver.py" || fail "the browser test failed (screenshots in $work/shots)"
for s in jobs-running job-dependents job-tensors overview-running job-paused job-cancelled job-succeeded job-retried checkpoint overview \
    schedule-run schedule-paused store-verified jobs-narrow jobs-deleted read-token-refused admin-bulk-retried; do
    [ -s "$work/shots/$s.png" ] || fail "no screenshot $s.png"
done
# The daemons' logs: on A, the convert that failed (with its error) and the
# noop cancelled; B logs at --log-level warn: its failed job, nothing below.
grep -Eq " error job\.failed id=$failed kind=convert ref=org/tiny@main .*error=." "$work/a.serve.log" ||
    fail "no job.failed line of convert $failed: $(grep -E 'job\.' "$work/a.serve.log" | head -5)"
grep -Eq " info job\.cancelled id=$noop kind=noop " "$work/a.serve.log" || fail "no job.cancelled line of noop $noop"
grep -Eq " error job\.failed id=$failed_b kind=convert " "$work/b.serve.log" && ! grep -q " info " "$work/b.serve.log" ||
    fail "B's log at --log-level warn: $(head -5 "$work/b.serve.log")"
# A's /metrics (a strict parse): the bytes its fetch and converts moved, as /v1/stats recorded them.
curl -sf "$A/metrics" >"$work/metrics" && "$py" -S "$E2E_DIR/prom_check.py" "$work/metrics" >"$work/metrics.json" ||
    fail "A's /metrics is not a valid exposition"
curl -sf "$A/v1/stats?hours=6" >"$work/stats.json" || fail "GET /v1/stats of A"
"$py" -S - "$work/metrics.json" "$work/stats.json" <<'PY' || fail "A's /metrics and /v1/stats disagree"
import json, sys
m, st = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
tot = lambda n: sum(r["value"] for r in st["rows"] if r["name"] == n)
for key, name in (("ckpt_fetched_bytes_total{}", "bytes.fetch"), ("ckpt_converted_bytes_total{}", "bytes.convert")):
    if not m.get(key) or m[key] != tot(name):
        sys.exit("%s = %s, %s = %s" % (key, m.get(key), name, tot(name)))
PY
note "done"
