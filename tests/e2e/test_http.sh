#!/usr/bin/env bash
# test_http.sh — the store over HTTP: the npm client @huggingface/hub against
# the daemon (list, download whole and sliced, safetensors metadata) for an
# original and a converted layout; Range edge cases and Hub error codes;
# /v1/checkpoints = ckpt ls/show --json; a catalog that cannot be read is a
# 500 (CKPT_FAULT store.lookup); a tar stream that fails mid-way is cut, a
# tar pull whose reader thread fails mid-file leaves nothing;
# 16 concurrent downloads with bounded daemon memory, an archive download the
# client leaves; tokens.
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
B=$ckpt W=$work
export CKPT_HOME=$W/home CKPT_QUIET=1
DIR=$E2E_DIR
E2E_LOGS=("$W/serve.log")

start_daemon() { # start_daemon [ARGS...]: sets URL and DPID
    rm -f "$CKPT_HOME/serve.url"
    # Under ASan, freed memory waits in a quarantine (256 MB by default) that
    # counts in RSS and grows with the allocations made, however few are live:
    # a small one keeps the peak-RSS checks about live memory, whatever the
    # machine's speed and load.
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16" \
        "$B" serve --listen 127.0.0.1:0 --workers 1 "$@" >"$W/serve.log" 2>&1 &
    DPID=$!
    # (a poll for a file the server writes when ready: the 60 s ceiling catches a hang, not slowness)
    for _ in $(seq 1200); do [ -s "$CKPT_HOME/serve.url" ] && break; sleep 0.05; done
    URL=$(cat "$CKPT_HOME/serve.url")
}
# stops the daemon of start_daemon; its exit checked (lib.sh stop_daemon)
stop_dpid() { stop_daemon "$DPID" "$W/serve.log"; }

# A sharded original with an empty file, and a converted layout.
"$B" gen-model qwen2 "$W/src" --scale 16 --layers 2 --shard-mb 1 2>/dev/null
: >"$W/src/empty.txt"
"$B" import "$W/src" --repo Qwen/tiny@main >/dev/null
"$B" convert Qwen/tiny@main --layout neuron --tp 2 >/dev/null
"$B" pull Qwen/tiny@main -o "$W/orig" 2>/dev/null
"$B" pull Qwen/tiny@main:neuron-tp2 -o "$W/tp2" 2>/dev/null
start_daemon

# --- the npm client ---
NPMDIR=${CKPT_NPM_CACHE:-$W/npm}
mkdir -p "$NPMDIR"
if [ ! -d "$NPMDIR/node_modules/@huggingface/hub" ]; then
    (cd "$NPMDIR" && npm install --no-audit --no-fund --silent @huggingface/hub@2.17 >/dev/null 2>&1) ||
        fail "npm install @huggingface/hub (the npm registry must be reachable)"
fi
cp "$DIR/hub_client.mjs" "$NPMDIR/"
(cd "$NPMDIR" && node hub_client.mjs "$URL" Qwen/tiny main "$W/orig") || fail "hub client on the original"
(cd "$NPMDIR" && node hub_client.mjs "$URL" Qwen/tiny neuron-tp2 "$W/tp2") || fail "hub client on the layout"
commit=$("$B" ls --json | "$py" -S -c 'import json,sys; print(json.load(sys.stdin)["checkpoints"][0]["commit"])')
(cd "$NPMDIR" && node hub_client.mjs "$URL" Qwen/tiny "$commit.neuron-tp2" "$W/tp2") || fail "layout by <commit>.<layout>"

# --- Range edge cases (docs/hub.md) ---
F=$URL/Qwen/tiny/resolve/main/config.json
T=$(stat -c %s "$W/orig/config.json")
status() { curl -s -o "$W/body" -D "$W/hdr" -w '%{http_code}' "$@"; }
hdr() { tr -d '\r' <"$W/hdr" | awk -v k="$1" 'tolower($1)==tolower(k)":" {sub(/^[^:]*: /,""); print}'; }
[ "$(status -H 'Range: bytes=0-0' "$F")" = 206 ] && [ "$(hdr Content-Range)" = "bytes 0-0/$T" ] || fail "bytes=0-0"
[ "$(status -H "Range: bytes=$T-" "$F")" = 416 ] && [ "$(hdr Content-Range)" = "bytes */$T" ] || fail "start at end -> 416"
[ "$(status -H 'Range: bytes=10-' "$F")" = 206 ] && cmp -s "$W/body" <(tail -c +11 "$W/orig/config.json") || fail "a-"
[ "$(status -H 'Range: bytes=-7' "$F")" = 206 ] && cmp -s "$W/body" <(tail -c 7 "$W/orig/config.json") || fail "-n"
[ "$(status -H "Range: bytes=5-$((T + 100))" "$F")" = 206 ] && [ "$(hdr Content-Range)" = "bytes 5-$((T - 1))/$T" ] || fail "end clamped"
[ "$(status -H 'Range: bytes=0-0' "$URL/Qwen/tiny/resolve/main/empty.txt")" = 200 ] && [ "$(hdr Content-Range)" = "bytes */0" ] || fail "empty file"
status -I "$URL/Qwen/tiny/resolve/main/model-00001-of-00002.safetensors" >/dev/null
[ "$(hdr X-Linked-Etag)" = "\"$(sha256sum <"$W/orig/model-00001-of-00002.safetensors" | cut -c1-64)\"" ] || fail "X-Linked-Etag"
[ "$(hdr X-Repo-Commit)" = "$commit" ] || fail "X-Repo-Commit"

# --- errors ---
[ "$(status "$URL/Qwen/nope/resolve/main/x")" = 404 ] && [ "$(hdr X-Error-Code)" = RepoNotFound ] || fail RepoNotFound
[ "$(status "$URL/Qwen/tiny/resolve/v9/config.json")" = 404 ] && [ "$(hdr X-Error-Code)" = RevisionNotFound ] || fail RevisionNotFound
[ "$(status "$URL/Qwen/tiny/resolve/main/nope.json")" = 404 ] && [ "$(hdr X-Error-Code)" = EntryNotFound ] &&
    [ "$(hdr X-Repo-Commit)" = "$commit" ] || fail EntryNotFound
[ "$(status "$URL/api/models/Qwen/tiny/revision/refs%2Fpr%2F1")" = 404 ] || fail "encoded revision"
[ "$(status -I "$URL/Qwen/tiny/raw/main/config.json")" = 200 ] || fail "raw HEAD"

# --- 16 concurrent downloads of a recipe-assembled file, bounded memory ---
big=tp_rank_00/model.safetensors
for i in $(seq 16); do curl -s -o "$W/dl$i" "$URL/Qwen/tiny/resolve/neuron-tp2/$big" & done
wait $(jobs -p | grep -v "$DPID") 2>/dev/null || true
for i in $(seq 16); do cmp -s "$W/dl$i" "$W/tp2/$big" || fail "concurrent download $i differs"; done
rss=$(awk '/VmHWM/ {print $2}' "/proc/$DPID/status")
[ "$rss" -lt $((256 * 1024)) ] || fail "daemon peak RSS ${rss} KiB with 16 clients"
echo "16 concurrent downloads identical; daemon peak RSS $((rss / 1024)) MiB"
# The same at a size where buffers matter: a llama layer with its 128k-token
# vocabulary at quarter width (rank files of ~80 MB, tensors of up to 16 MB
# split by columns and rows), 16 clients of which 8 are slow (--limit-rate),
# all at once. A server holding a whole slab and band per connection (8 + 16
# MiB) would pass 256 MiB here.
"$B" gen-model llama "$W/l4" --scale 4 --layers 1 --shard-mb 50 2>/dev/null
"$B" import "$W/l4" --repo Meta/quarter@main >/dev/null
"$B" convert Meta/quarter@main --layout neuron --tp 2 >/dev/null
"$B" pull Meta/quarter@main:neuron-tp2 --rank 1 -o "$W/l4-r1" 2>/dev/null
rm -rf "$W/l4"
lf=tp_rank_01/model.safetensors
[ "$(stat -c %s "$W/l4-r1/model.safetensors")" -gt 60000000 ] || fail "the quarter-width rank file is smaller than planned"
# Each body goes straight into cmp against the pulled rank file (1.3 GB in
# all: not written to disk and read back); cmp's status, or curl's when the
# transfer failed, lands in q$i.rc.
for i in $(seq 16); do
    rate=()
    [ $((i % 2)) = 0 ] && rate=(--limit-rate 30M)
    { rc=0; curl -s "${rate[@]}" "$URL/Meta/quarter/resolve/neuron-tp2/$lf" | cmp -s - "$W/l4-r1/model.safetensors" || rc=$?
        echo "$rc" >"$W/q$i.rc"; } &
done
wait $(jobs -p | grep -v "$DPID") 2>/dev/null || true
for i in $(seq 16); do [ "$(cat "$W/q$i.rc" 2>/dev/null)" = 0 ] || fail "large concurrent download $i differs"; done
rm -f "$W"/q*
rss=$(awk '/VmHWM/ {print $2}' "/proc/$DPID/status")
[ "$rss" -lt $((256 * 1024)) ] || fail "daemon peak RSS ${rss} KiB with 16 clients on 80 MB files"
echo "16 concurrent downloads of an 80 MB rank file identical; daemon peak RSS $((rss / 1024)) MiB"
# A client that leaves after the first MB of that rank's archive.tar (80 MB):
# the archive's writer thread gets EPIPE, its reader thread stops, both are
# joined and the stream is logged as aborted (the daemon's exit, checked
# under ASan by stop_daemon, shows nothing leaked).
(curl -s "$URL/v1/checkpoints/Meta%2Fquarter@main:neuron-tp2/archive.tar?rank=1" || true) | head -c 1000000 >/dev/null
# The server logs that line when the stream's handler ends: a state, polled
# (lib.sh's wait_until; its limit only catches a hang).
wait_until 60 "the cut archive download to be logged" grep -q 'quarter.*aborted mid-stream' "$W/serve.log"
grep -q 'quarter.*aborted mid-stream: writing the archive: Broken pipe' "$W/serve.log" ||
    fail "an archive download the client left was not cut: $(grep quarter "$W/serve.log" | tail -3)"
[ "$(status "$URL/healthz")" = 200 ] || fail "the daemon is unwell after a client left an archive download"

# --- remote pull: from this daemon into another store, equal to local pulls ---
REMOTE=$W/remote-home
CKPT_HOME=$REMOTE "$B" pull Qwen/tiny@main:neuron-tp2 -o "$W/r-tp2" --server "$URL" 2>/dev/null || fail "remote pull"
diff -r "$W/tp2" "$W/r-tp2" >/dev/null || fail "remote pull of the layout differs from a local pull"
CKPT_HOME=$W/rank-home "$B" pull Qwen/tiny@main:neuron-tp2 --rank 1 -o "$W/r-rank1" --server "$URL" 2>/dev/null || fail "remote rank pull"
cmp -s "$W/r-rank1/model.safetensors" "$W/tp2/tp_rank_01/model.safetensors" || fail "remote rank 1 differs"
# only that rank's files came over: the other rank is not in the pulling store
CKPT_HOME=$W/rank-home "$B" ls --json | "$py" -S -c 'import json, sys; c = json.load(sys.stdin)["checkpoints"]; sys.exit(len(c) != 1)' &&
    ! CKPT_HOME=$W/rank-home "$B" show "$(CKPT_HOME=$W/rank-home "$B" ls --json | "$py" -S -c 'import json, sys; print(json.load(sys.stdin)["checkpoints"][0]["ref"])')" | grep -q tp_rank_00 ||
    fail "a remote --rank 1 pull fetched more than rank 1: $(CKPT_HOME=$W/rank-home "$B" ls)"
CKPT_HOME=$REMOTE "$B" pull Qwen/tiny@main:neuron-tp2 --consolidated -o "$W/r-cons" --server "$URL" 2>/dev/null || fail "remote consolidated pull"
diff -r "$W/orig" "$W/r-cons" >/dev/null || fail "remote consolidated pull differs from the original"
stop_dpid

echo "remote pulls identical (resume after cut connections: the same download code, test_fetch.sh)"

# --- /v1/checkpoints answers the JSON of ckpt ls --json and ckpt show --json ---
# same_json FILE CMD...: FILE holds the JSON CMD prints.
same_json() {
    local f=$1
    shift
    "$@" | "$py" -S -c 'import json, sys; sys.exit(json.load(sys.stdin) != json.load(open(sys.argv[1])))' "$f"
}
start_daemon
[ "$(status "$URL/v1/checkpoints")" = 200 ] || fail "/v1/checkpoints: $(cat "$W/body")"
same_json "$W/body" "$B" ls --json || fail "/v1/checkpoints differs from ckpt ls --json: $(head -c 500 "$W/body")"
[ "$(status "$URL/v1/checkpoints?repo=Qwen/tiny")" = 200 ] || fail "/v1/checkpoints?repo="
same_json "$W/body" "$B" ls Qwen/tiny --json || fail "/v1/checkpoints?repo= differs from ckpt ls REPO --json"
[ "$(status "$URL/v1/checkpoints/Qwen%2Ftiny@main:neuron-tp2")" = 200 ] || fail "/v1/checkpoints/{ref}: $(cat "$W/body")"
same_json "$W/body" "$B" show Qwen/tiny@main:neuron-tp2 --json || fail "/v1/checkpoints/{ref} differs from ckpt show --json"
"$py" -S -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(not (j["source"] == "Qwen/tiny@main" and j["files"] and all(k in j["files"][0] for k in ("path", "size", "sha256", "safetensors", "tensors", "recipes"))))' "$W/body" ||
    fail "/v1/checkpoints/{ref}: not the documented shape: $(head -c 500 "$W/body")"
[ "$(status "$URL/v1/checkpoints?repo=Qwen/none")" = 200 ] && grep -q '"checkpoints":\[\]' "$W/body" || fail "an unknown repo lists nothing"
[ "$(status "$URL/v1/checkpoints/Qwen%2Ftiny@nope")" = 404 ] || fail "an unknown ref: $(cat "$W/body")"
# outside numbers are checked: junk is a 400 naming the field, not a default
[ "$(status "$URL/v1/jobs?limit=abc")" = 400 ] && grep -q 'limit' "$W/body" || fail "?limit=abc: $(cat "$W/body")"
[ "$(status "$URL/api/models/Qwen/tiny/tree/main?cursor=-1")" = 400 ] && grep -q 'cursor' "$W/body" || fail "?cursor=-1: $(cat "$W/body")"
[ "$(status "$URL/v1/checkpoints/Qwen%2Ftiny@main:neuron-tp2/archive.tar?rank=1x")" = 400 ] || fail "?rank=1x"
stop_dpid

# --- a catalog that cannot be read: 500 naming the lookup, never a 404 or an empty list ---
# (the error point store.lookup fails every catalog lookup of the daemon: common/fault.h)
CKPT_FAULT=store.lookup:1:ERR start_daemon
[ "$(status "$URL/v1/checkpoints")" = 500 ] && grep -q 'list checkpoints' "$W/body" && grep -q 'store.lookup' "$W/body" ||
    fail "a failed listing: $(status "$URL/v1/checkpoints") $(cat "$W/body")"
[ "$(status "$URL/v1/checkpoints/Qwen%2Ftiny@main")" = 500 ] && grep -q 'store.lookup' "$W/body" ||
    fail "a failed ref lookup: $(cat "$W/body")"
[ "$(status "$URL/api/models/Qwen/tiny/revision/main")" = 500 ] && grep -q 'look up the repository' "$W/body" ||
    fail "a failed Hub repo lookup: $(cat "$W/body")"
[ "$(status -I "$URL/Qwen/tiny/resolve/main/config.json")" = 500 ] || fail "a failed Hub resolve is not a 500"
[ "$(status "$URL/healthz")" = 200 ] || fail "healthz with a failing catalog"
stop_dpid

# --- a tar stream that fails mid-way is cut: no tar end, no final chunk, logged ---
# (archive.entry:3 fails reading the third file with bytes, the second shard, into the tar)
CKPT_FAULT=archive.entry:3:ERR start_daemon
rc=0
code=$(curl -s -o "$W/cut.tar" -w '%{http_code}' "$URL/v1/checkpoints/Qwen%2Ftiny@main/archive.tar") || rc=$?
[ "$rc" != 0 ] || fail "an archive that failed mid-stream ended cleanly (HTTP $code)"
[ -s "$W/cut.tar" ] || fail "the cut archive has not even its first file"
"$py" -S -c 'import sys; d = open(sys.argv[1], "rb").read(); sys.exit(len(d) >= 1024 and d[-1024:] == bytes(1024))' "$W/cut.tar" ||
    fail "the cut archive ends with a tar end (two zero blocks)"
grep -q 'aborted mid-stream' "$W/serve.log" || fail "the cut archive was not logged: $(tail -5 "$W/serve.log")"
stop_dpid
# The same failure in a tar pull to a file, mid-file in the reader thread
# (archive.block:1 fails the first block past a file's first MiB: the
# 1.06 MB first shard's second): the pull fails naming the file and the
# offset, and leaves neither the archive nor its temp file.
[ "$(stat -c %s "$W/src/model-00001-of-00002.safetensors")" -gt 1048576 ] || fail "the first shard is too small to fail mid-file"
mkdir "$W/blk"
rc=0
CKPT_FAULT=archive.block:1:ERR "$B" pull Qwen/tiny@main -o "$W/blk/t.tar.zst" --format tar.zst 2>"$W/blk.err" || rc=$?
[ "$rc" = 1 ] && grep -q "model-00001-of-00002.safetensors': read failed at byte 1048576" "$W/blk.err" ||
    fail "a tar pull failing mid-file: exit $rc, $(cat "$W/blk.err")"
[ -z "$(ls -A "$W/blk")" ] || fail "a tar pull failing mid-file left: $(ls -A "$W/blk")"
echo "/v1/checkpoints JSON = ckpt ls/show --json; failed lookups 500; a failed tar stream is cut and logged"

# --- tokens: reads need a token when any is configured ---
printf 'admintoken-0123456789abcdef admin\nreadtoken-0123456789abcdef read\n' >"$W/tokens"
start_daemon --token-file "$W/tokens"
[ "$(status "$URL/Qwen/tiny/resolve/main/config.json")" = 401 ] || fail "read without a token"
[ "$(status -H 'Authorization: Bearer readtoken-0123456789abcdef' "$URL/Qwen/tiny/resolve/main/config.json")" = 200 ] || fail "read token"
[ "$(status -X POST -H 'Authorization: Bearer readtoken-0123456789abcdef' -d '{"kind":"gc"}' "$URL/v1/jobs")" = 403 ] || fail "read token may not submit"
[ "$(status -H 'Authorization: Bearer wrong-token-0123456789' "$URL/v1/checkpoints")" = 401 ] || fail "wrong token"
[ "$(status "$URL/healthz")" = 200 ] || fail healthz
stop_dpid

# --- every store command against the daemon, or a refusal (issue 19) ---
# A daemon with tokens that logs JSON; the commands go to it through --server,
# CKPT_SERVER and the config file; each answer equals the local command's on
# the same store. (Pruning is checked on a second daemon below: one that
# forgets finished jobs at once could forget a job before the command that
# waits for it has read its result.)
printf '%s\n' readtoken-0123456789abcdef >"$W/read.tok"
printf '%s\n' admintoken-0123456789abcdef >"$W/admin.tok"
start_daemon --token-file "$W/tokens" --log-format json
RD=("$B" --server "$URL" --token-file "$W/read.tok")
AD=("$B" --server "$URL" --token-file "$W/admin.tok")
"${RD[@]}" ls --json >"$W/r.json" && same_json "$W/r.json" "$B" ls --json || fail "ls --server differs from ls: $(head -c 300 "$W/r.json")"
CKPT_SERVER=$URL CKPT_TOKEN=readtoken-0123456789abcdef "$B" show Qwen/tiny@main:neuron-tp2 --json >"$W/r.json" &&
    same_json "$W/r.json" "$B" show Qwen/tiny@main:neuron-tp2 --json || fail "show with CKPT_SERVER differs from show"
mkdir -p "$W/cfg/ckpt"
printf '# the daemon\nserver = %s\ntoken_file = %s\n' "$URL" "$W/read.tok" >"$W/cfg/ckpt/config"
XDG_CONFIG_HOME=$W/cfg "$B" du --json >"$W/r.json" || fail "du through the config file"
"$B" du --json | "$py" -S -c 'import json, sys; a = json.load(sys.stdin); b = json.load(open(sys.argv[1])); sys.exit(any(a[k] != b[k] for k in ("checkpoints", "logical_bytes", "physical_bytes", "blobs")))' "$W/r.json" ||
    fail "du --server differs from du: $(cat "$W/r.json")"
XDG_CONFIG_HOME=$W/cfg "$B" --home "$W/home" ls >/dev/null || fail "--home before the command does not override the config's server"
printf 'home = %s\n' "$W/home" >"$W/cfg/ckpt/config"
(unset CKPT_HOME; XDG_CONFIG_HOME=$W/cfg "$B" ls --json) >"$W/r.json" && same_json "$W/r.json" "$B" ls --json ||
    fail "ls with the config's home differs: $(head -c 300 "$W/r.json")"
printf 'server = %s\nserve = x\n' "$URL" >"$W/cfg/ckpt/config"
rc=0; XDG_CONFIG_HOME=$W/cfg "$B" ls 2>"$W/err" || rc=$?
[ "$rc" = 2 ] && grep -q 'config:2: unknown key .serve.' "$W/err" || fail "a bad config line ($rc): $(cat "$W/err")"
# a read token reads; acting needs an admin token
rc=0; "${RD[@]}" rm Qwen/tiny@main 2>"$W/err" || rc=$?
[ "$rc" = 1 ] && grep -q 403 "$W/err" || fail "rm with a read token ($rc): $(cat "$W/err")"
[ "$("${AD[@]}" convert Qwen/tiny@main --layout fused 2>"$W/err")" = Qwen/tiny@main:fused ] || fail "convert --server: $(cat "$W/err")"
"$B" show Qwen/tiny@main:fused >/dev/null || fail "convert --server made nothing in the daemon's store"
"${AD[@]}" verify --json | grep -q '"clean": true' || fail "verify --server"
"${AD[@]}" rm Qwen/tiny@main:fused 2>/dev/null || fail "rm --server"
! "$B" show Qwen/tiny@main:fused >/dev/null 2>&1 || fail "rm --server left the layout"
"${AD[@]}" gc --json | grep -q '"blobs_removed"' || fail "gc --server"
"$B" state save "$W/src" "$W/st" --optimizer adamw --step 7 2>/dev/null && "$B" state import "$W/st" --run r1 >/dev/null ||
    fail "a training state to export"
"${RD[@]}" state ls --json >"$W/r.json" && same_json "$W/r.json" "$B" state ls --json && grep -q '"r1"' "$W/r.json" ||
    fail "state ls --server: $(cat "$W/r.json")"
CKPT_HOME=$W/se-home "${RD[@]}" state export r1@7 -o "$W/se" 2>/dev/null && diff -r "$W/st" "$W/se" >/dev/null ||
    fail "state export --server differs from the state imported"
rm -rf "$W/st" "$W/se" "$W/se-home"
# schedules: /v1/schedules (a yearly cron: nothing runs in this test)
rc=0; "${RD[@]}" sync add Qwen/tiny --cron "0 0 1 1 *" 2>"$W/err" || rc=$?
[ "$rc" = 1 ] && grep -q 403 "$W/err" || fail "sync add with a read token ($rc): $(cat "$W/err")"
sid=$("${AD[@]}" sync add Qwen/tiny --cron "0 0 1 1 *" --layout neuron --tp 2) || fail "sync add --server"
"${RD[@]}" sync ls --json >"$W/r.json" && same_json "$W/r.json" "$B" sync ls --json && grep -q '"neuron"' "$W/r.json" ||
    fail "sync ls --server: $(cat "$W/r.json")"
"${AD[@]}" sync rm "$sid" && [ "$("$B" sync ls --json | tr -d ' \n')" = "[]" ] || fail "sync rm --server"
rc=0; "${AD[@]}" sync run 999 2>"$W/err" || rc=$?
[ "$rc" = 1 ] && grep -q 404 "$W/err" || fail "sync run of no schedule ($rc): $(cat "$W/err")"
# what cannot work remotely says so, exit 2
for cmd in "import $W/src --repo a/b" "fetch a/b" "state import $W/src --run r" "state keep r --last 1" "gc --dry-run"; do
    rc=0; "${AD[@]}" $cmd 2>"$W/err" || rc=$?
    [ "$rc" = 2 ] && grep -q "this machine's store only" "$W/err" || fail "$cmd --server ($rc): $(cat "$W/err")"
done
# jobs: a header, times, --limit
"$B" jobs | head -1 | grep -q '^ *ID  STATE .*CREATED (UTC).*FINISHED (UTC).*WAITED.*RAN' || fail "ckpt jobs has no header: $("$B" jobs | head -2)"
"$B" jobs --json | "$py" -S -c 'import json, subprocess, sys
all_ = json.load(sys.stdin)
one = json.loads(subprocess.run(sys.argv[1:], capture_output=True, text=True, check=True).stdout)
sys.exit(not (len(all_) >= 2 and [j["id"] for j in one] == [all_[0]["id"]]))' "${RD[@]}" jobs --limit 1 --json ||
    fail "jobs --limit 1 --json over --server is not the newest job"
rc=0; "$B" jobs --limit 0 2>/dev/null || rc=$?; [ "$rc" = 2 ] || fail "jobs --limit 0 exited $rc"
rc=0; "$B" jobs --state done 2>/dev/null || rc=$?; [ "$rc" = 2 ] || fail "jobs --state done exited $rc"
# /metrics: a strict parse, then the figures against what this daemon did
curl -s -H 'Authorization: Bearer readtoken-0123456789abcdef' "$URL/metrics" >"$W/metrics"
"$py" -S "$DIR/prom_check.py" "$W/metrics" >"$W/metrics.json" || fail "/metrics is not a valid exposition"
"$B" du --json >"$W/du.json"
"$py" -S - "$W/metrics.json" "$W/du.json" <<'PY' || fail "/metrics figures: $(grep -v _bucket "$W/metrics" | head -60)"
import json, sys
m, du = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
def want(key, ok, what):
    if not ok(m.get(key)):
        sys.exit(f"{key} = {m.get(key)}: {what}")
want('ckpt_job_duration_seconds_count{kind="convert",outcome="succeeded"}', lambda v: v == 1, "one convert ran")
want('ckpt_job_duration_seconds_count{kind="verify",outcome="succeeded"}', lambda v: v == 1, "one verify ran")
want('ckpt_job_queue_wait_seconds_count{kind="gc"}', lambda v: v == 1, "one gc waited")
want('ckpt_http_request_duration_seconds_count{code="403",route="/v1/checkpoints/{ref}"}', lambda v: v == 1, "one refused rm")
want('ckpt_http_request_duration_seconds_count{code="201",route="/v1/schedules"}', lambda v: v == 1, "one schedule added")
want('ckpt_converted_bytes_total{}', lambda v: v and v > 0, "the convert wrote bytes")
want('ckpt_served_bytes_total{}', lambda v: v and v > 0, "answers were sent")
want('ckpt_workers_busy{}', lambda v: v == 0, "no job runs")
want('ckpt_queue_jobs{state="succeeded"}', lambda v: v is not None and v >= 3, "the convert, verify and gc are kept")
for k, name in (("logical_bytes", "logical_bytes"), ("physical_bytes", "physical_bytes"), ("blobs", "blobs"), ("checkpoints", "checkpoints")):
    want("ckpt_store_" + name + "{}", lambda v, k=k: v == du[k], f"du says {du[k]}")
PY
# the dashboard's API: counts, search and pages, attempts, delete, bulk
# actions, paused schedules, per-minute figures, the last verify; a read
# token reads them and is refused every action
api() { # api TOKEN METHOD PATH [BODY]: the body to $W/api.json, the status on stdout
    curl -s -o "$W/api.json" -w '%{http_code}' -X "$2" -H "Authorization: Bearer $1-0123456789abcdef" \
        ${4:+--data "$4"} "$URL$3"
}
RT=readtoken AT=admintoken
vid=$("$B" jobs --json | "$py" -S -c 'import json, sys; print(next(j["id"] for j in json.load(sys.stdin) if j["kind"] == "verify"))')
[ "$(api $RT GET /v1/jobs/counts)" = 200 ] && "$B" jobs --json | "$py" -S -c '
import json, sys
jobs, got = json.load(sys.stdin), json.load(open(sys.argv[1]))
want = {s: sum(j["state"] == s for j in jobs) for s in ("queued", "running", "succeeded", "failed", "cancelled")}
want.update(all=len(jobs), retrying=0)
sys.exit(got != want and f"counts {got} != {want}")' "$W/api.json" || fail "GET /v1/jobs/counts: $(cat "$W/api.json")"
[ "$(api $RT GET "/v1/jobs?state=succeeded&q=VERIFY&limit=1")" = 200 ] && "$py" -S -c '
import json, sys
r = json.load(open(sys.argv[1]))
sys.exit(not (r["total"] == 1 and [j["id"] for j in r["jobs"]] == [int(sys.argv[2])]))' "$W/api.json" "$vid" ||
    fail "GET /v1/jobs?state=succeeded&q=VERIFY: $(cat "$W/api.json")"
[ "$(api $RT GET "/v1/jobs?limit=1&offset=1")" = 200 ] && "$B" jobs --json | "$py" -S -c '
import json, sys
jobs, r = json.load(sys.stdin), json.load(open(sys.argv[1]))
sys.exit(not (r["total"] == len(jobs) and [j["id"] for j in r["jobs"]] == [jobs[1]["id"]]))' "$W/api.json" ||
    fail "GET /v1/jobs?limit=1&offset=1: $(cat "$W/api.json")"
[ "$(api $RT GET "/v1/jobs?state=done")" = 400 ] && grep -q "state: 'done' is not one of" "$W/api.json" || fail "?state=done: $(cat "$W/api.json")"
[ "$(api $RT GET "/v1/jobs/$vid")" = 200 ] && "$py" -S -c '
import json, sys
a = json.load(open(sys.argv[1]))["attempts"]
sys.exit(not (len(a) == 1 and a[0]["attempt"] == 1 and a[0]["outcome"] == "succeeded" and a[0]["finished_at"] >= a[0]["started_at"]))' "$W/api.json" ||
    fail "the attempts of verify job $vid: $(cat "$W/api.json")"
[ "$(api $RT GET /v1/store)" = 200 ] && "$py" -S -c '
import json, sys, time
v = json.load(open(sys.argv[1]))["last_verify"]
sys.exit(not (v["clean"] is True and v["ref"] is None and v["checkpoints_checked"] >= 2 and abs(v["at"] - time.time()) < 3600))' "$W/api.json" ||
    fail "GET /v1/store has no last verify: $(cat "$W/api.json")"
[ "$(api $RT GET /v1/checkpoints/Qwen%2Ftiny@main)" = 200 ] && "$py" -S -c '
import json, sys
sys.exit(json.load(open(sys.argv[1]))["last_verify"]["ok"] is not True)' "$W/api.json" || fail "a checkpoint's last_verify: $(cat "$W/api.json")"
[ "$(api $RT GET "/v1/stats?hours=1")" = 200 ] && "$py" -S -c '
import json, sys
r = json.load(open(sys.argv[1]))
got = {(x["name"], x["kind"]): x["value"] for x in r["rows"]}
tot = lambda n, k: sum(x["value"] for x in r["rows"] if x["name"] == n and x["kind"] == k)
sys.exit(not (r["bucket_seconds"] == 60 and tot("jobs.succeeded", "convert") == 1 and tot("jobs.succeeded", "verify") == 1
              and tot("bytes.convert", "") > 0 and ("queue.depth", "") in got))' "$W/api.json" || fail "GET /v1/stats: $(cat "$W/api.json")"
[ "$(api $RT GET "/v1/stats?hours=25")" = 400 ] || fail "/v1/stats?hours=25 is not refused"
[ "$(api $RT POST "/v1/jobs/$vid/delete")" = 403 ] && grep -q 'deleting needs an admin token' "$W/api.json" || fail "delete with a read token"
[ "$(api $RT POST /v1/jobs/bulk '{"action":"delete","state":"succeeded"}')" = 403 ] && grep -q 'bulk action needs an admin token' "$W/api.json" ||
    fail "bulk with a read token: $(cat "$W/api.json")"
[ "$(api $RT POST /v1/schedules '{"repo":"Qwen/tiny","cron":"0 0 1 1 *"}')" = 403 ] || fail "schedule add with a read token"
[ "$(api $AT POST /v1/schedules '{"repo":"Qwen/tiny","cron":"0 0 1 1 *"}')" = 201 ] || fail "schedule add: $(cat "$W/api.json")"
sid=$("$py" -S -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$W/api.json")
[ "$(api $RT POST "/v1/schedules/$sid/pause")" = 403 ] || fail "pause with a read token"
[ "$(api $AT POST "/v1/schedules/$sid/pause")" = 200 ] && grep -q '"paused": *true' "$W/api.json" || fail "pause: $(cat "$W/api.json")"
"$B" sync ls --json | grep -q '"paused": *true' || fail "the pause is not in the store's schedules"
[ "$(api $AT POST "/v1/schedules/$sid/resume")" = 200 ] && grep -q '"paused": *false' "$W/api.json" || fail "resume: $(cat "$W/api.json")"
[ "$(api $AT DELETE "/v1/schedules/$sid")" = 200 ] && [ "$(api $AT POST "/v1/schedules/$sid/pause")" = 404 ] || fail "remove, then pause: 404"
[ "$(api $AT POST /v1/jobs/bulk '{"action":"delete"}')" = 400 ] && grep -q 'needs a filter' "$W/api.json" || fail "bulk without a filter"
[ "$(api $AT POST /v1/jobs/bulk '{"action":"nuke","state":"failed"}')" = 400 ] || fail "bulk with an unknown action"
[ "$(api $AT POST "/v1/jobs/$vid/delete")" = 200 ] && [ "$(api $AT GET "/v1/jobs/$vid")" = 404 ] || fail "delete job $vid"
ngc=$("$B" jobs --json | "$py" -S -c 'import json, sys; print(sum(j["kind"] == "gc" for j in json.load(sys.stdin)))')
[ "$(api $AT POST /v1/jobs/bulk '{"action":"delete","q":"gc"}')" = 200 ] && grep -q "\"matched\": *$ngc, *\"done\": *$ngc" "$W/api.json" &&
    [ "$ngc" -ge 1 ] && ! "$B" jobs --json | grep -q '"kind": *"gc"' || fail "bulk delete of the gc jobs ($ngc): $(cat "$W/api.json")"
stop_dpid
# the log: JSON lines for jobs and requests, the route of each request; no token anywhere
grep '^{' "$W/serve.log" >"$W/events" || fail "no JSON log lines: $(tail -5 "$W/serve.log")"
"$py" -S - "$W/events" "$(stat -c %s "$W/metrics")" <<'PY' || fail "the JSON log: $(head -c 1500 "$W/events")"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
def has(**kv):
    return any(all(e.get(k) == v for k, v in kv.items()) for e in ev)
assert has(event="job.started", kind="convert", ref="Qwen/tiny@main"), "no job.started of the convert"
assert any(e["event"] == "job.finished" and e["kind"] == "convert" and e["bytes"] > 0 and e["seconds"] >= 0 for e in ev), "no job.finished with bytes"
assert has(event="http.request", method="DELETE", route="/v1/checkpoints/{ref}", status=403), "no access line of the refused rm"
assert has(event="http.request", method="GET", path="/metrics", status=200, bytes=int(sys.argv[2])), "no access line of /metrics with its body's bytes"
assert all(e["seconds"] >= 0 for e in ev if e["event"] == "http.request"), "an access line without its duration"
assert all("?" not in e.get("path", "") for e in ev), "a query in a logged path"
PY
! grep -q 'token-0123456789abcdef' "$W/serve.log" || fail "a token in the daemon's log"
# retention: a daemon that keeps finished jobs 0 s prunes the convert, verify and gc
start_daemon --token-file "$W/tokens" --keep-jobs 0s --log-format json
RD=("$B" --server "$URL" --token-file "$W/read.tok")
# (a poll for the daemon's prune, at most a second apart: the 60 s ceiling
# catches a hang; the polls skip LeakSanitizer's exit check, the check after
# it does not)
for _ in $(seq 300); do
    [ "$(ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" "${RD[@]}" jobs --json | tr -d ' \n')" = "[]" ] && break
    sleep 0.2
done
[ "$("${RD[@]}" jobs --json | tr -d ' \n')" = "[]" ] || fail "finished jobs were not pruned: $("$B" jobs)"
stop_dpid
grep '^{' "$W/serve.log" | "$py" -S -c 'import json, sys; sys.exit(not any(json.loads(l).get("event") == "jobs.pruned" for l in sys.stdin))' ||
    fail "no prune logged: $(tail -5 "$W/serve.log")"
! grep -q 'token-0123456789abcdef' "$W/serve.log" || fail "a token in the daemon's log"
echo "every store command over --server, CKPT_SERVER and the config; refusals exit 2; jobs pruned; JSON log; /metrics parsed"

# --- shell completion and the man page (deploy/) ---
root=$(cd "$DIR/../.." && pwd)
complete_words() { PATH=$(dirname "$B"):$PATH bash -c '. "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _ckpt; printf "%s\n" "${COMPREPLY[@]}"' _ "$root/deploy/completion/ckpt.bash" "$@"; }
complete_words ckpt sh | grep -qx show || fail "bash completion of a command"
complete_words ckpt serve --keep | grep -qx -- --keep-jobs || fail "bash completion of an option"
complete_words ckpt --home "$W/home" show Qwen/t | grep -qx 'Qwen/tiny@main:neuron-tp2' || fail "bash completion of a ref"
command -v zsh >/dev/null && command -v man >/dev/null || fail "zsh and man are not installed (make deps installs zsh and man-db)"
zsh -n "$root/deploy/completion/_ckpt" || fail "zsh completion does not parse"
# under dash, Debian's /bin/sh (the Makefile runs it with sh), whose echo would turn "\f" into a form feed
command -v dash >/dev/null || fail "dash is not installed"
dash "$root/deploy/mkman.sh" "$B" "$W/ckpt.1" || fail "deploy/mkman.sh under dash"
! grep -q $'\f' "$W/ckpt.1" && grep -q '^\.SH "ckpt serve"$' "$W/ckpt.1" || fail "a form feed in the man page, or no section of ckpt serve"
MANWIDTH=80 man --warnings -l "$W/ckpt.1" 2>"$W/man.err" >/dev/null
[ ! -s "$W/man.err" ] || fail "the man page renders with warnings: $(head -3 "$W/man.err")"
# make install's deploy/ part with another PREFIX: the systemd unit runs that
# PREFIX's ckpt (DESTDIR only says where the files go); nothing is built.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$root" install-deploy PREFIX=/opt/ckpt-x DESTDIR="$W/destdir" >"$W/make.out" 2>&1 ||
    fail "make install-deploy: $(tail -5 "$W/make.out")"
unit=$W/destdir/opt/ckpt-x/lib/systemd/system/ckpt.service
[ "$(grep '^ExecStart=' "$unit")" = 'ExecStart=/opt/ckpt-x/bin/ckpt serve --listen ${CKPT_LISTEN} --workers ${CKPT_WORKERS} $CKPT_SERVE_ARGS' ] &&
    ! grep -q -e /usr/local -e destdir "$unit" || fail "the installed unit under PREFIX=/opt/ckpt-x: $(grep -n -e ExecStart -e /usr/local "$unit")"
cmp -s "$W/destdir/opt/ckpt-x/share/bash-completion/completions/ckpt" "$root/deploy/completion/ckpt.bash" &&
    cmp -s "$W/destdir/opt/ckpt-x/share/zsh/site-functions/_ckpt" "$root/deploy/completion/_ckpt" || fail "the installed completions"
echo "bash completion (commands, options, refs); the man page renders under dash; the unit follows PREFIX"

# --- Hub fidelity (issue 18): the calls huggingface_hub and @huggingface/hub make ---
# (docs/hub.md, Endpoints). hf_replay.py replays the Python client's exact
# requests and judges answers as its hf_raise_for_status does; hub_client_api.mjs
# drives the npm client. A page size of 2 makes every listing page.
CKPT_HUB_PAGE_SIZE=2 start_daemon
"$py" -S "$DIR/hf_replay.py" open "$URL" "$W/orig" "$W/tp2" "$commit" || fail "the Python client's requests"
layout_sha=$(printf '%s' "$commit.neuron-tp2" | sha1sum | cut -c1-40)
cp "$DIR/hub_client_api.mjs" "$NPMDIR/"
(cd "$NPMDIR" && node hub_client_api.mjs "$URL" Qwen/tiny "$commit" "$layout_sha" "$(find "$W/tp2" -type f | wc -l)") ||
    fail "the npm client's repository calls"
# ckpt pull --hf-cache: the cache huggingface_hub reads offline, named as this
# daemon's Hub API names things (hf_cache_scan.py follows _cache_manager.py's
# scan, _tree_cache.py and hf_hub_download's etag and commit naming)
hfc=$W/hfc
"$B" pull Qwen/tiny@main --hf-cache "$hfc" 2>/dev/null && "$B" pull Qwen/tiny@main:neuron-tp2 --hf-cache="$hfc" 2>/dev/null ||
    fail "pull --hf-cache"
"$py" -S "$DIR/hf_cache_scan.py" "$hfc" "$URL" symlinks >"$W/scan" || fail "the HF cache pull wrote"
grep -q "$commit refs=\['main'\] files=5" "$W/scan" && grep -q "$layout_sha refs=\['$commit.neuron-tp2', 'neuron-tp2'\] files=5" "$W/scan" ||
    fail "the HF cache lists other revisions: $(cat "$W/scan")"
[ "$(stat -L -c %h "$hfc/models--Qwen--tiny/snapshots/$commit/config.json")" -ge 2 ] || fail "config.json's blob is not hardlinked from the store"
cache_state() { find "$hfc" -printf '%p %y %i %s %l %T@\n' | sort; }
cache_state >"$W/hfc.before"
for ref in Qwen/tiny@main Qwen/tiny@main:neuron-tp2; do
    CKPT_QUIET=0 "$B" pull "$ref" --hf-cache "$hfc" >"$W/hfc.log" 2>&1 || fail "a second pull of $ref: $(cat "$W/hfc.log")"
    grep -q 'all there already' "$W/hfc.log" || fail "a second pull of $ref wrote something: $(cat "$W/hfc.log")"
done
cache_state | cmp -s - "$W/hfc.before" || fail "a second pull changed the cache"
HF_HUB_DISABLE_SYMLINKS=1 "$B" pull Qwen/tiny@main:neuron-tp2 --hf-cache "$W/hfc2" 2>/dev/null || fail "pull --hf-cache, no symlinks"
"$py" -S "$DIR/hf_cache_scan.py" "$W/hfc2" "$URL" copies >/dev/null || fail "the HF cache without symlinks"
HF_HUB_CACHE=$W/hfc3 "$B" pull Qwen/tiny@main --hf-cache 2>/dev/null && [ -L "$W/hfc3/models--Qwen--tiny/snapshots/$commit/config.json" ] ||
    fail "pull --hf-cache into HF_HUB_CACHE"
echo "pull --hf-cache: the cache huggingface_hub lists, a second pull adds nothing"
# never a Xet header or xet JSON: clients would speak the Xet protocol to us
for u in "$URL/Qwen/tiny/resolve/main/model-00001-of-00002.safetensors" "$URL/api/models/Qwen/tiny/tree/main?expand=true&recursive=true"; do
    [ "$(status -H 'Accept: application/vnd.xet-fileinfo+json, */*' -H 'Range: bytes=0-0' "$u")" -lt 300 ] || fail "$u: $(cat "$W/body")"
    ! grep -qi 'xet' "$W/hdr" "$W/body" || fail "Xet in the answer to $u: $(cat "$W/hdr")"
done
stop_dpid
start_daemon --token-file "$W/tokens"
"$py" -S "$DIR/hf_replay.py" token "$URL" readtoken-0123456789abcdef || fail "401 answers"
stop_dpid
echo "http: ok"
