#!/usr/bin/env bash
# test_fetch.sh — `ckpt fetch` against the fault-injecting local Hub
# (tests/hub/testhub.c, issue 6 "Download" and "A local Hub for tests").
#
# Every fault ends in a correct stored checkpoint (after retries or resume)
# or in a clear failure with nothing stored and nothing left in tmp/:
#   dropped connections (resumed from the last byte), 429 with Retry-After,
#   503, a flipped byte (downloaded again; twice: fails naming the file), a
#   server ignoring Range, a redirect to another port (the token does not
#   follow: the second server's log shows no Authorization), a required token
#   (missing, wrong, right), a gated repo, unsafe names in the tree (../../evil,
#   absolute, NUL, control character, over-long: rejected before anything is
#   written), a commit pushed between two requests (the fetch stays on the
#   commit it resolved), missing repo/revision/file. A commit already in the
#   store downloads nothing. Through the daemon, the token appears in no job
#   argument, log or database file. Bounds: an endless body
#   on an error answer (cut, retried, then given up), a file answer that
#   stalls forever (the request timeout, then the fetch deadline, is the only
#   way out), a tree declaring 16 TiB files (refused against free space before
#   any download), a file with neither oid nor lfs (refused).
# Run through run.sh (needs CKPT_BIN, CKPT_TESTHUB, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
export CKPT_HUB_BACKOFF_MS=10 # retries in milliseconds, not seconds
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
export HF_HOME=$work/hf-home # no token file from the machine running the tests

E2E_LOGS=("$work/hub*.log")
# faults SPEC: replaces hub A's faults.
faults() { curl -sf -X POST --data-binary "$1" "$hubA_url/_testhub/faults" >/dev/null || fail "cannot set faults '$1'"; }
lines() { wc -l <"$work/$1.log"; }

# A ceiling no passing run comes near: a fetch that hangs fails the test
# (exit 124) instead of blocking it.
ceiling="timeout 300"
n=0
# fetch_ok WHAT [fetch options]: a fresh client home fetches org/tiny from hub A;
# the stored checkpoint must equal the generated model file for file.
fetch_ok() {
    local what=$1
    shift
    n=$((n + 1))
    export CKPT_HOME=$work/c$n
    if ! HF_ENDPOINT=$hubA_url $ceiling "$ckpt" fetch org/tiny "$@" >"$work/out" 2>"$work/err"; then
        fail "$what: fetch failed: $(cat "$work/err")"
    fi
    "$ckpt" pull org/tiny@main -o "$work/pulled" --quiet >/dev/null 2>"$work/pull.err" || fail "$what: pull: $(cat "$work/pull.err")"
    diff -r "$work/m1" "$work/pulled" >/dev/null || fail "$what: the stored checkpoint differs from the original"
    rm -rf "$work/pulled"
    [ -z "$(ls -A "$CKPT_HOME/tmp")" ] || fail "$what: left $(ls "$CKPT_HOME/tmp") in tmp/"
    note "$what: stored, identical"
}
# fetch_fails WHAT PATTERN REF [fetch options]: exits 1 with PATTERN in the
# message; nothing stored, nothing left in tmp/ or blobs/.
fetch_fails() {
    local what=$1 pattern=$2 ref=$3 rc=0
    shift 3
    n=$((n + 1))
    export CKPT_HOME=$work/c$n
    HF_ENDPOINT=$hubA_url $ceiling "$ckpt" fetch "$ref" "$@" >"$work/out" 2>"$work/err" || rc=$?
    [ "$rc" -eq 1 ] || fail "$what: exit $rc, expected 1; stderr: $(cat "$work/err")"
    grep -q -- "$pattern" "$work/err" || fail "$what: expected '$pattern' in: $(cat "$work/err")"
    [ -z "$("$ckpt" ls 2>/dev/null)" ] || fail "$what: something was stored: $("$ckpt" ls)"
    [ -z "$(ls -A "$CKPT_HOME/tmp" 2>/dev/null)" ] || fail "$what: left $(ls "$CKPT_HOME/tmp") in tmp/"
    [ -z "$(find "$CKPT_HOME/blobs" -type f 2>/dev/null)" ] || fail "$what: blobs were left in the store"
    note "$what: $(tail -n 1 "$work/err" | cut -c1-150)"
}

# ---- the Hub's repos ----
"$ckpt" gen-model qwen2 "$work/m1" --scale 8 --layers 2 --shard-mb 2 >/dev/null 2>&1
"$ckpt" gen-model qwen2 "$work/m2" --scale 8 --layers 2 --shard-mb 2 --seed 7 >/dev/null 2>&1
CKPT_HOME=$work/hub "$ckpt" import "$work/m1" --repo org/tiny@main >/dev/null 2>&1
start_testhub hubA
start_testhub hubB
commit1=$(curl -sf "$hubA_url/api/models/org/tiny/revision/main" | "$py" -S -c 'import json,sys; print(json.load(sys.stdin)["sha"])')
note "hub A $hubA_url, hub B $hubB_url, org/tiny@main = $commit1"

# ---- success, and every transient fault ----
fetch_ok "clean fetch"
start=$(lines hubA)
export CKPT_HOME=$work/c$n
HF_ENDPOINT=$hubA_url "$ckpt" fetch org/tiny >"$work/out" 2>"$work/err" || fail "fetch again: $(cat "$work/err")"
grep -q "in the store already" "$work/err" || fail "fetch of a stored commit: $(cat "$work/err")"
[ "$(tail -n +$((start + 1)) "$work/hubA.log" | grep -c /resolve/ || true)" -eq 0 ] || fail "a stored commit downloaded files"
[ "$(tail -n +$((start + 1)) "$work/hubA.log" | grep -c /tree/ || true)" -eq 1 ] || fail "a stored commit did not list the tree once"
note "a commit in the store: a revision and a tree request (is every file there?), nothing downloaded"

# A narrower fetch, then a plain one: the second tops up the commit with what is missing.
n=$((n + 1))
export CKPT_HOME=$work/c$n
HF_ENDPOINT=$hubA_url "$ckpt" fetch org/tiny --include config.json >"$work/out" 2>"$work/err" || fail "fetch --include config.json: $(cat "$work/err")"
"$ckpt" pull org/tiny@main -o "$work/pulled" --quiet >/dev/null 2>&1 || fail "pull after fetch --include config.json"
[ "$(ls "$work/pulled")" = config.json ] || fail "fetch --include config.json stored: $(ls "$work/pulled")"
rm -rf "$work/pulled"
HF_ENDPOINT=$hubA_url "$ckpt" fetch org/tiny >"$work/out" 2>"$work/err" || fail "plain fetch after --include: $(cat "$work/err")"
grep -q "is in the store with 1 of the .* files picked; fetching the other" "$work/err" || fail "no top-up: $(cat "$work/err")"
"$ckpt" pull org/tiny@main -o "$work/pulled" --quiet >/dev/null 2>"$work/pull.err" || fail "pull after the top-up: $(cat "$work/pull.err")"
diff -r "$work/m1" "$work/pulled" >/dev/null || fail "after the top-up the stored commit differs from the original"
rm -rf "$work/pulled"
[ "$("$ckpt" ls --json | "$py" -S -c 'import json,sys; print(len(json.load(sys.stdin)["checkpoints"]))')" = 1 ] || fail "the top-up made a second checkpoint: $("$ckpt" ls)"
"$ckpt" verify org/tiny@main >/dev/null 2>"$work/err" || fail "verify after the top-up: $(cat "$work/err")"
HF_ENDPOINT=$hubA_url "$ckpt" fetch org/tiny >"$work/out" 2>"$work/err" || fail "third fetch: $(cat "$work/err")"
grep -q "in the store already" "$work/err" || fail "a complete commit fetched again: $(cat "$work/err")"
[ -z "$(ls -A "$CKPT_HOME/tmp")" ] || fail "the top-up left $(ls "$CKPT_HOME/tmp") in tmp/"
note "fetch --include config.json, then fetch: the commit is topped up (one checkpoint, verify clean)"

faults "drop=300000@2"
fetch_ok "connection dropped after 300000 bytes (twice)" --connections 1 --chunk-size 1MiB
grep -q "fault=drop" "$work/hubA.log" || fail "the drop fault did not fire"
# A dropped request for bytes S-E must be followed by one for (S + 300000)-E: resumed at the next byte.
"$py" -S - "$work/hubA.log" <<'PY' || fail "no dropped request was resumed at its next byte: $(grep resolve "$work/hubA.log" | tail -8)"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
want = set()
for l in lines:
    m = re.search(r"resolve/\S+/(\S+) .*range=bytes=(\d+)-(\d+)(.*)", l)
    if not m:
        continue
    path, a, b, rest = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
    if (path, a, b) in want:
        sys.exit(0)
    if "fault=drop" in rest:
        want.add((path, a + 300000, b))
sys.exit(1)
PY

faults "429=1@2"
t0=$SECONDS
fetch_ok "429 with Retry-After: 1 (twice, on the API)"
[ "$(grep -c 'fault=429' "$work/hubA.log")" -eq 2 ] || fail "429 fired $(grep -c 'fault=429' "$work/hubA.log") times"
[ $((SECONDS - t0)) -ge 2 ] || fail "Retry-After: 1 was not honoured (the fetch took $((SECONDS - t0)) s)"

faults "429:file=1@3"
fetch_ok "429 with Retry-After on file downloads" --chunk-size 1MiB

faults "503@2"
fetch_ok "503 on the API (twice)"
faults "503:file@3"
fetch_ok "503 on file downloads (three times)" --chunk-size 1MiB

faults "flip=2000000@1,only=model-00001"
fetch_ok "a flipped byte in a tensor (downloaded again)"
grep -q "downloading it again" "$work/err" || fail "no retry after the sha256 mismatch: $(cat "$work/err")"
faults "flip=20@1,only=model-00001"
fetch_ok "a flipped byte in a safetensors header (downloaded again)"
grep -q "downloading it again" "$work/err" || fail "no retry after a damaged header: $(cat "$work/err")"

faults "norange"
fetch_ok "a server ignoring Range (200 with the whole file)" --chunk-size 1MiB
grep -q "fault=norange" "$work/hubA.log" || fail "norange did not fire"

faults "norange@2,drop=500000@1"
fetch_ok "ignored Range and a drop together" --chunk-size 1MiB --connections 2

# ---- the token: required, sent only to the endpoint's own host ----
secret=hf_TestSecret0123456789
faults "token=$secret"
fetch_fails "token required, none given" "pass a token in HF_TOKEN" org/tiny
HF_TOKEN=hf_wrong_token_0000 fetch_fails "a wrong token" "refused the token" org/tiny
grep -q "hf_wrong_token" "$work/err" && fail "the token appeared in an error message"
mkdir -p "$HF_HOME"
printf '%s\n' "$secret" >"$HF_HOME/token"
fetch_ok "token from \$HF_HOME/token"
rm -f "$HF_HOME/token"
faults "token=$secret,redirect=${hubB_url##*:}"
start=$(lines hubB)
HF_TOKEN=$secret fetch_ok "token in HF_TOKEN; file downloads redirected to another port"
tail -n +$((start + 1)) "$work/hubB.log" | grep -q /resolve/ || fail "hub B served no file"
tail -n +$((start + 1)) "$work/hubB.log" | grep /resolve/ | grep -qv "auth=none" && fail "the token followed the redirect to another port"
grep "auth=ok" "$work/hubA.log" | grep -q "/revision/" || fail "hub A never got the token"
grep -rq "$secret" "$work/err" "$work/out" && fail "the token appeared in ckpt's output"
note "token sent to hub A (auth=ok), not to hub B after the redirect (auth=none)"

faults "gated"
fetch_fails "a gated repo" "gated repository: accept its licence" org/tiny

# ---- names and errors ----
for kind in dotdot abs nul ctrl long; do
    faults "evil=$kind"
    fetch_fails "unsafe name in the tree ($kind)" "unsafe file name" org/tiny
done
[ -z "$(find "$work" -name 'evil*')" ] || fail "a file named evil was written: $(find "$work" -name 'evil*')"
faults ""
fetch_fails "a missing repo" "repository org/nope not found" org/nope
fetch_fails "a missing revision" "revision 'nope' not found in org/tiny" org/tiny@nope
faults "entry404"
fetch_fails "a file the tree lists but resolve does not have" "not found in org/tiny" org/tiny
faults "flip=2000000@2,only=model-00001"
fetch_fails "a flipped byte in both downloads" "model-00001-of-00002.safetensors: sha256 of the download" org/tiny
faults "drop=1@1000"
fetch_fails "a server that always drops after 1 byte" "giving up after" org/tiny --chunk-size 1MiB

# ---- bounds: error bodies, stalls, deadlines, declared sizes, unverifiable files ----
faults "endless=503@1"
fetch_ok "an endless body on a 503 API answer (cut at 64 KiB, retried)"
faults "endless:file=500@2"
fetch_ok "an endless body on a 500 file answer (twice: cut, retried)" --chunk-size 1MiB
faults "endless:file=500"
fetch_fails "an endless body on every 500 file answer" "giving up after 9 attempts: the Hub answered 500" org/tiny
faults "stall@1"
CKPT_HUB_REQUEST_TIMEOUT=2 fetch_ok "a file answer that never sends a byte (the request timeout cuts it, retried)"
grep -q "fault=stall" "$work/hubA.log" || fail "the stall fault did not fire"
faults "stall"
# (Whatever the machine's speed, the fetch can only end at its deadline: a
# fraction of a second is enough.)
CKPT_HUB_FETCH_TIMEOUT=0.5 fetch_fails "every file answer stalls (the fetch deadline stops it)" \
    "took longer than its limit of 0.5 s (CKPT_HUB_FETCH_TIMEOUT)" org/tiny
CKPT_HUB_FETCH_TIMEOUT=x fetch_fails "a bad CKPT_HUB_FETCH_TIMEOUT" "CKPT_HUB_FETCH_TIMEOUT='x' is not a number of seconds" org/tiny
faults "huge=20"
start=$(lines hubA)
fetch_fails "a tree declaring 20 more files of 16 TiB" "files picked declare .*, more than the .* free in" org/tiny
[ "$(tail -n +$((start + 1)) "$work/hubA.log" | grep -c /resolve/ || true)" -eq 0 ] || fail "files were requested for a tree larger than the disk"
faults "nohash"
fetch_fails "config.json listed with neither oid nor lfs" \
    "tree entry 'config.json' has neither a git 'oid' nor an 'lfs' sha256" org/tiny
faults ""

# ---- a fetch stopped mid-way stores nothing; gc removes its temp files ----
# Stopped (SIGKILL) at named crash points (CKPT_FAULT, common/fault.h): after
# its second downloaded piece, after its blobs are synced, and between the
# catalog commits; nothing visible, gc removes the temp files (the pieces kept
# for a resume, in partial/, are test_fetch_resume.sh's).
faults ""
for spec in fetch.piece_done:2 blobs.synced:1 catalog.before_commit:2; do
    n=$((n + 1))
    export CKPT_HOME=$work/c$n
    rc=0
    CKPT_FAULT=$spec HF_ENDPOINT=$hubA_url "$ckpt" fetch org/tiny --quiet --chunk-size 1MiB >/dev/null 2>"$work/err" || rc=$?
    [ $rc -eq 137 ] || fail "the fetch was not stopped at $spec (exit $rc): $(cat "$work/err")"
    [ -z "$("$ckpt" ls)" ] || fail "a fetch stopped at $spec stored something"
    temps=$(ls -A "$CKPT_HOME/tmp" | wc -l)
    "$ckpt" gc >/dev/null 2>&1 || fail "gc after a fetch stopped at $spec"
    [ -z "$(ls -A "$CKPT_HOME/tmp")" ] || fail "gc left the stopped fetch's temp files: $(ls "$CKPT_HOME/tmp" | head -3)"
    HF_ENDPOINT=$hubA_url "$ckpt" fetch org/tiny --quiet >/dev/null 2>"$work/err" || fail "fetch after the one stopped at $spec: $(cat "$work/err")"
    "$ckpt" verify >/dev/null 2>"$work/err" || fail "verify after the fetch stopped at $spec: $(cat "$work/err")"
    note "a fetch stopped at $spec: nothing stored; gc removed its $temps temp files; the next fetch works"
done

# ---- a commit pushed between two requests ----
faults "push=$work/m2"
fetch_ok "a new commit pushed right after the revision answer (still the resolved commit)"
"$ckpt" ls --json | grep -q "$commit1" || fail "the fetch did not keep commit $commit1"
commit2=$(curl -sf "$hubA_url/api/models/org/tiny/revision/main" | "$py" -S -c 'import json,sys; print(json.load(sys.stdin)["sha"])')
[ "$commit2" != "$commit1" ] || fail "the push did not happen"
HF_ENDPOINT=$hubA_url "$ckpt" fetch org/tiny >/dev/null 2>"$work/err" || fail "fetch of the new commit: $(cat "$work/err")"
"$ckpt" pull org/tiny@main -o "$work/pulled" --quiet >/dev/null 2>&1
diff -r "$work/m2" "$work/pulled" >/dev/null || fail "main after the push is not the pushed model"
rm -rf "$work/pulled"
note "the next fetch takes the pushed commit ${commit2:0:12}"

# ---- through the daemon: the token stays out of jobs and the database ----
faults "token=$secret"
n=$((n + 1))
export CKPT_HOME=$work/c$n
mkdir -p "$CKPT_HOME"
HF_TOKEN=$secret HF_ENDPOINT=$hubA_url "$ckpt" serve --listen 127.0.0.1:0 --workers 2 >"$work/serve.log" 2>&1 &
dpid=$!
# (a poll for a file the server writes when ready: the 60 s ceiling catches a hang, not slowness)
for i in $(seq 1200); do [ -s "$CKPT_HOME/serve.url" ] && break; kill -0 "$dpid" 2>/dev/null || break; sleep 0.05; done
[ -s "$CKPT_HOME/serve.url" ] || fail "ckpt serve did not start: $(cat "$work/serve.log")"
id=$("$ckpt" submit fetch org/tiny)
timeout 60 "$ckpt" wait "$id" >/dev/null 2>"$work/err" || fail "fetch job: $(cat "$work/err"); $("$ckpt" logs "$id")"
"$ckpt" show "$id" | grep -q '"existed": false' || fail "the fetch job's result: $("$ckpt" show "$id")"
if grep -rqa "$secret" "$CKPT_HOME" "$work/serve.log"; then fail "the token was written into CKPT_HOME or the daemon log"; fi
"$ckpt" logs "$id" | grep -q "$secret" && fail "the token is in the job log"
note "fetch job $id through the daemon: done, token nowhere in CKPT_HOME"
stop_daemon "$dpid" "$work/serve.log"
