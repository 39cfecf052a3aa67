#!/usr/bin/env bash
# test_http.sh — the store over HTTP: the npm client @huggingface/hub against
# the daemon (list, download whole and sliced, safetensors metadata) for an
# original and a converted layout; Range edge cases and Hub error codes;
# /v1/checkpoints = ckpt ls/show --json; a catalog that cannot be read is a
# 500 (CKPT_FAULT store.lookup); a tar stream that fails mid-way is cut;
# 16 concurrent downloads with bounded daemon memory; tokens.
set -euo pipefail
B=${CKPT_BIN:?}
W=${E2E_WORK:-$(mktemp -d)}
export CKPT_HOME=$W/home CKPT_QUIET=1
DIR=$(cd "$(dirname "$0")" && pwd)
py=$(python3 -c 'import sys; print(sys.executable)') # resolved once: a pyenv shim costs 0.3 s a call
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "${W:?}"/* "${W:?}"/.[!.]* 2>/dev/null || true # run.sh wants the work folder left empty
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

start_daemon() { # start_daemon [ARGS...]: sets URL and DPID
    rm -f "$CKPT_HOME/serve.url"
    # Under ASan, freed memory waits in a quarantine (256 MB by default) that
    # counts in RSS and grows with the allocations made, however few are live:
    # a small one keeps the peak-RSS checks about live memory, whatever the
    # machine's speed and load.
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16" \
        "$B" serve --listen 127.0.0.1:0 --workers 1 "$@" >"$W/serve.log" 2>&1 &
    DPID=$!
    pids+=("$DPID")
    # (a poll for a file the server writes when ready: the 60 s ceiling catches a hang, not slowness)
    for _ in $(seq 1200); do [ -s "$CKPT_HOME/serve.url" ] && break; sleep 0.05; done
    URL=$(cat "$CKPT_HOME/serve.url")
}
stop_daemon() { kill "$DPID"; wait "$DPID" 2>/dev/null || true; }

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
commit=$("$B" ls --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)["checkpoints"][0]["commit"])')
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
for i in $(seq 16); do
    rate=()
    [ $((i % 2)) = 0 ] && rate=(--limit-rate 30M)
    curl -s "${rate[@]}" -o "$W/q$i" "$URL/Meta/quarter/resolve/neuron-tp2/$lf" &
done
wait $(jobs -p | grep -v "$DPID") 2>/dev/null || true
for i in $(seq 16); do cmp -s "$W/q$i" "$W/l4-r1/model.safetensors" || fail "large concurrent download $i differs"; done
rm -f "$W"/q*
rss=$(awk '/VmHWM/ {print $2}' "/proc/$DPID/status")
[ "$rss" -lt $((256 * 1024)) ] || fail "daemon peak RSS ${rss} KiB with 16 clients on 80 MB files"
echo "16 concurrent downloads of an 80 MB rank file identical; daemon peak RSS $((rss / 1024)) MiB"

# --- remote pull: from this daemon into another store, equal to local pulls ---
REMOTE=$W/remote-home
CKPT_HOME=$REMOTE "$B" pull Qwen/tiny@main:neuron-tp2 -o "$W/r-tp2" --server "$URL" 2>/dev/null || fail "remote pull"
diff -r "$W/tp2" "$W/r-tp2" >/dev/null || fail "remote pull of the layout differs from a local pull"
CKPT_HOME=$REMOTE "$B" pull Qwen/tiny@main:neuron-tp2 --rank 1 -o "$W/r-rank1" --server "$URL" 2>/dev/null || fail "remote rank pull"
cmp -s "$W/r-rank1/model.safetensors" "$W/tp2/tp_rank_01/model.safetensors" || fail "remote rank 1 differs"
CKPT_HOME=$REMOTE "$B" pull Qwen/tiny@main:neuron-tp2 --consolidated -o "$W/r-cons" --server "$URL" 2>/dev/null || fail "remote consolidated pull"
diff -r "$W/orig" "$W/r-cons" >/dev/null || fail "remote consolidated pull differs from the original"
stop_daemon

echo "remote pulls identical (resume after cut connections: the same download code, test_fetch.sh)"

# --- /v1/checkpoints answers the JSON of ckpt ls --json and ckpt show --json ---
# same_json FILE CMD...: FILE holds the JSON CMD prints.
same_json() {
    local f=$1
    shift
    "$@" | "$py" -c 'import json, sys; sys.exit(json.load(sys.stdin) != json.load(open(sys.argv[1])))' "$f"
}
start_daemon
[ "$(status "$URL/v1/checkpoints")" = 200 ] || fail "/v1/checkpoints: $(cat "$W/body")"
same_json "$W/body" "$B" ls --json || fail "/v1/checkpoints differs from ckpt ls --json: $(head -c 500 "$W/body")"
[ "$(status "$URL/v1/checkpoints?repo=Qwen/tiny")" = 200 ] || fail "/v1/checkpoints?repo="
same_json "$W/body" "$B" ls Qwen/tiny --json || fail "/v1/checkpoints?repo= differs from ckpt ls REPO --json"
[ "$(status "$URL/v1/checkpoints/Qwen%2Ftiny@main:neuron-tp2")" = 200 ] || fail "/v1/checkpoints/{ref}: $(cat "$W/body")"
same_json "$W/body" "$B" show Qwen/tiny@main:neuron-tp2 --json || fail "/v1/checkpoints/{ref} differs from ckpt show --json"
"$py" -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(not (j["source"] == "Qwen/tiny@main" and j["files"] and all(k in j["files"][0] for k in ("path", "size", "sha256", "safetensors", "tensors", "recipes"))))' "$W/body" ||
    fail "/v1/checkpoints/{ref}: not the documented shape: $(head -c 500 "$W/body")"
[ "$(status "$URL/v1/checkpoints?repo=Qwen/none")" = 200 ] && grep -q '"checkpoints":\[\]' "$W/body" || fail "an unknown repo lists nothing"
[ "$(status "$URL/v1/checkpoints/Qwen%2Ftiny@nope")" = 404 ] || fail "an unknown ref: $(cat "$W/body")"
# outside numbers are checked: junk is a 400 naming the field, not a default
[ "$(status "$URL/v1/jobs?limit=abc")" = 400 ] && grep -q 'limit' "$W/body" || fail "?limit=abc: $(cat "$W/body")"
[ "$(status "$URL/api/models/Qwen/tiny/tree/main?cursor=-1")" = 400 ] && grep -q 'cursor' "$W/body" || fail "?cursor=-1: $(cat "$W/body")"
[ "$(status "$URL/v1/checkpoints/Qwen%2Ftiny@main:neuron-tp2/archive.tar?rank=1x")" = 400 ] || fail "?rank=1x"
stop_daemon

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
stop_daemon

# --- a tar stream that fails mid-way is cut: no tar end, no final chunk, logged ---
# (archive.entry:3 fails reading the third file with bytes, the second shard, into the tar)
CKPT_FAULT=archive.entry:3:ERR start_daemon
rc=0
code=$(curl -s -o "$W/cut.tar" -w '%{http_code}' "$URL/v1/checkpoints/Qwen%2Ftiny@main/archive.tar") || rc=$?
[ "$rc" != 0 ] || fail "an archive that failed mid-stream ended cleanly (HTTP $code)"
[ -s "$W/cut.tar" ] || fail "the cut archive has not even its first file"
"$py" -c 'import sys; d = open(sys.argv[1], "rb").read(); sys.exit(len(d) >= 1024 and d[-1024:] == bytes(1024))' "$W/cut.tar" ||
    fail "the cut archive ends with a tar end (two zero blocks)"
grep -q 'aborted mid-stream' "$W/serve.log" || fail "the cut archive was not logged: $(tail -5 "$W/serve.log")"
stop_daemon
echo "/v1/checkpoints JSON = ckpt ls/show --json; failed lookups 500; a failed tar stream is cut and logged"

# --- tokens: reads need a token when any is configured ---
printf 'admintoken-0123456789abcdef admin\nreadtoken-0123456789abcdef read\n' >"$W/tokens"
start_daemon --token-file "$W/tokens"
[ "$(status "$URL/Qwen/tiny/resolve/main/config.json")" = 401 ] || fail "read without a token"
[ "$(status -H 'Authorization: Bearer readtoken-0123456789abcdef' "$URL/Qwen/tiny/resolve/main/config.json")" = 200 ] || fail "read token"
[ "$(status -X POST -H 'Authorization: Bearer readtoken-0123456789abcdef' -d '{"kind":"gc"}' "$URL/v1/jobs")" = 403 ] || fail "read token may not submit"
[ "$(status -H 'Authorization: Bearer wrong-token-0123456789' "$URL/v1/checkpoints")" = 401 ] || fail "wrong token"
[ "$(status "$URL/healthz")" = 200 ] || fail healthz
stop_daemon

# --- Hub fidelity (issue 18): the calls huggingface_hub and @huggingface/hub make ---
# (docs/hub.md, Endpoints). hf_replay.py replays the Python client's exact
# requests and judges answers as its hf_raise_for_status does; hub_client_api.mjs
# drives the npm client. A page size of 2 makes every listing page.
CKPT_HUB_PAGE_SIZE=2 start_daemon
/usr/bin/python3 "$DIR/hf_replay.py" open "$URL" "$W/orig" "$W/tp2" "$commit" || fail "the Python client's requests"
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
/usr/bin/python3 "$DIR/hf_cache_scan.py" "$hfc" "$URL" symlinks >"$W/scan" || fail "the HF cache pull wrote"
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
/usr/bin/python3 "$DIR/hf_cache_scan.py" "$W/hfc2" "$URL" copies >/dev/null || fail "the HF cache without symlinks"
HF_HUB_CACHE=$W/hfc3 "$B" pull Qwen/tiny@main --hf-cache 2>/dev/null && [ -L "$W/hfc3/models--Qwen--tiny/snapshots/$commit/config.json" ] ||
    fail "pull --hf-cache into HF_HUB_CACHE"
echo "pull --hf-cache: the cache huggingface_hub lists, a second pull adds nothing"
# never a Xet header or xet JSON: clients would speak the Xet protocol to us
for u in "$URL/Qwen/tiny/resolve/main/model-00001-of-00002.safetensors" "$URL/api/models/Qwen/tiny/tree/main?expand=true&recursive=true"; do
    [ "$(status -H 'Accept: application/vnd.xet-fileinfo+json, */*' -H 'Range: bytes=0-0' "$u")" -lt 300 ] || fail "$u: $(cat "$W/body")"
    ! grep -qi 'xet' "$W/hdr" "$W/body" || fail "Xet in the answer to $u: $(cat "$W/hdr")"
done
stop_daemon
start_daemon --token-file "$W/tokens"
/usr/bin/python3 "$DIR/hf_replay.py" token "$URL" readtoken-0123456789abcdef || fail "401 answers"
stop_daemon
echo "http: ok"
