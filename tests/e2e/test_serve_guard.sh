#!/usr/bin/env bash
# test_serve_guard.sh — what `ckpt serve` refuses (issue 14):
#
# 1. Job arguments are checked at submit time: a bad layout, --tp or ref is
#    exit 2 from `ckpt submit` and `ckpt sync add`, 400 from POST /v1/jobs,
#    and nothing is queued.
# 2. Host paths: without --allow-path, HTTP jobs naming host paths (import,
#    consolidate, merge-lora with a folder) get 403; with it, only paths
#    beneath it pass (symlinks resolved), a client may not set "origin", and
#    a folder swapped for a symlink after submission is refused by the worker.
#    `ckpt submit` on the local database is not limited.
# 3. Connection limits: with the defaults, 300 idle sockets from one address
#    (127.0.0.2) do not keep /healthz or the API from answering another
#    (127.0.0.1); --conns-per-ip N refuses connection N+1 of an address; a
#    connection that never finishes its headers is closed after
#    --idle-timeout.
# 4. No global lock: a Hub tree request stuck reading a blob (a FIFO in its
#    place) holds up neither /healthz nor other requests; a non-LFS file's
#    git oid is hashed once and then served from the cache.
# 5. archive.tar streams from the store (CKPT_HOME/tmp stays empty while a
#    client reads slowly), equals `ckpt pull`, checks rank; a missing blob is
#    an error status, a damaged one aborts the transfer (curl sees a
#    truncated body, never a clean 200).
# Every daemon listens on 127.0.0.1 port 0; all are stopped at exit.
# Run through run.sh (needs CKPT_BIN, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
E2E_LOGS=("$work/serve.log")
export CKPT_QUIET=1
dpid=

# ready_daemon [serve options]: starts `ckpt serve` and waits (bounded: 20 s,
# far above the start time of a sanitizer build) for serve.url; sets $url.
ready_daemon() {
    rm -f "$CKPT_HOME/serve.url"
    "$ckpt" serve --listen 127.0.0.1:0 --workers 1 "$@" >>"$work/serve.log" 2>&1 &
    dpid=$!
    local i
    for i in $(seq 400); do
        [ -s "$CKPT_HOME/serve.url" ] && break
        kill -0 "$dpid" 2>/dev/null || fail "ckpt serve $* exited at start"
        sleep 0.05
    done
    [ -s "$CKPT_HOME/serve.url" ] || fail "ckpt serve wrote no serve.url in 20 s"
    url=$(cat "$CKPT_HOME/serve.url")
}
stop_dpid() { stop_daemon "$dpid" "$work/serve.log"; }
# api WANT METHOD PATH [curl options]: the HTTP status must be WANT; body in $work/out.
api() {
    local want=$1 method=$2 path=$3 code
    shift 3
    code=$(curl -sS -o "$work/out" -w '%{http_code}' -X "$method" "$@" "$url$path") || fail "curl $method $path failed"
    [ "$code" = "$want" ] || fail "$method $path $*: HTTP $code, expected $want: $(head -c 500 "$work/out")"
}
njobs() { "$ckpt" jobs --json | "$py" -S -c 'import json, sys; print(len(json.load(sys.stdin)))'; }
J=(-H 'Content-Type: application/json')

# =========================================================================
# 1. job arguments checked at submit time
# =========================================================================
note "1. arguments checked at submit"
export CKPT_HOME=$work/h1
expect_status 2 "$ckpt" submit convert org/x@main --layout neuorn
grep -q "unknown layout 'neuorn'" "$work/err" || fail "submit --layout neuorn: $(cat "$work/err")"
expect_status 2 "$ckpt" submit convert org/x@main --layout neuron --tp 5000
grep -q -- "--tp" "$work/err" || fail "submit --tp 5000: $(cat "$work/err")"
expect_status 2 "$ckpt" submit convert 'not a ref' --layout hf
expect_status 2 "$ckpt" submit convert org/x@main --layout hf --dtype int3
expect_status 2 "$ckpt" submit org/x --layout neuorn
expect_status 2 "$ckpt" sync add org/x --every 1h --layout neuorn
grep -q "unknown layout 'neuorn'" "$work/err" || fail "sync add --layout neuorn: $(cat "$work/err")"
expect_status 0 "$ckpt" submit convert org/x@main --layout neuron --tp 8
[ "$(njobs)" = 1 ] || fail "refused submits queued jobs: $("$ckpt" jobs)"
ready_daemon
api 400 POST /v1/jobs "${J[@]}" -d '{"kind":"convert","args":{"ref":"org/x@main","layout":"neuorn"}}'
grep -q "neuorn" "$work/out" || fail "HTTP bad layout: message $(cat "$work/out")"
api 400 POST /v1/jobs "${J[@]}" -d '{"kind":"convert","args":{"ref":"org/x@main","layout":"neuron","tp":4096}}'
api 400 POST /v1/jobs "${J[@]}" -d '{"kind":"convert","args":{"ref":"../etc","layout":"hf"}}'
api 400 POST /v1/jobs "${J[@]}" -d '{"kind":"verify","args":{"ref":"x"}}'
api 400 POST /v1/jobs "${J[@]}" -d '{"kind":"fetch","args":{"repo":"no-slash"}}'
api 400 POST /v1/jobs "${J[@]}" -d '{"kind":"merge-lora","args":{"ref":"org/x","adapter":"rel/../x y"}}'
[ "$(njobs)" = 1 ] || fail "refused HTTP submits queued jobs: $("$ckpt" jobs)"
stop_dpid

# =========================================================================
# 2. host paths over HTTP: --allow-path
# =========================================================================
note "2. --allow-path"
export CKPT_HOME=$work/h2
mkdir -p "$work/allowed" "$work/outside"
"$ckpt" gen-model qwen2 "$work/allowed/m" --scale 64 --layers 1 2>/dev/null
"$ckpt" gen-model qwen2 "$work/outside/m" --scale 64 --layers 1 2>/dev/null
ln -s "$work/outside/m" "$work/allowed/esc"
imp() { printf '{"kind":"import","args":{"dir":"%s","repo":"%s"}}' "$1" "$2"; }
# jf ID EXPR: a Python expression over job ID (from `ckpt show ID`), printed.
jf() { "$ckpt" show "$1" | "$py" -S -c 'import json, sys; j = json.load(sys.stdin); print(eval(sys.argv[1]))' "$2"; }
# wait_state ID STATE: polls (every 0.05 s, at most 60 s: far above what any
# of these jobs takes on a loaded machine) until job ID is in STATE.
wait_state() {
    local i
    for i in $(seq 1200); do
        [ "$(jf "$1" 'j["state"]')" = "$2" ] && return 0
        sleep 0.05
    done
    fail "job $1 is $(jf "$1" 'j["state"]'), not $2, after 60 s: $(jf "$1" 'j.get("error")')"
}
ready_daemon # no --allow-path
api 403 POST /v1/jobs "${J[@]}" -d "$(imp "$work/allowed/m" org/a)"
grep -q -- "--allow-path" "$work/out" || fail "403 without naming --allow-path: $(cat "$work/out")"
api 403 POST /v1/jobs "${J[@]}" -d "{\"kind\":\"consolidate\",\"args\":{\"src\":\"$work/allowed/m\",\"dst\":\"$work/allowed/c\"}}"
api 403 POST /v1/jobs "${J[@]}" -d "{\"kind\":\"merge-lora\",\"args\":{\"ref\":\"org/a\",\"adapter\":\"$work/allowed\"}}"
# The operator's own submit on the local database: any path.
id=$("$ckpt" submit import "$work/outside/m" --repo org/local)
wait_state "$id" succeeded
stop_dpid
expect_status 2 "$ckpt" serve --listen 127.0.0.1:0 --allow-path "$work/nonexistent"
expect_status 2 "$ckpt" serve --listen 127.0.0.1:0 --allow-path "$work/allowed/m/config.json"
grep -q "not a folder" "$work/err" || fail "--allow-path FILE: $(cat "$work/err")"
ready_daemon --allow-path "$work/allowed/../allowed"
api 403 POST /v1/jobs "${J[@]}" -d "$(imp "$work/outside/m" org/a)"
api 403 POST /v1/jobs "${J[@]}" -d "$(imp "$work/allowed/esc" org/a)"
api 403 POST /v1/jobs "${J[@]}" -d "$(imp "$work/allowed/../outside/m" org/a)"
api 403 POST /v1/jobs "${J[@]}" -d "$(imp /etc org/a)"
api 403 POST /v1/jobs "${J[@]}" -d "{\"kind\":\"consolidate\",\"args\":{\"src\":\"$work/allowed/m\",\"dst\":\"$work/outside/c\"}}"
# DST must be strictly inside: the job writes DST.tmp-* beside it.
api 403 POST /v1/jobs "${J[@]}" -d "{\"kind\":\"consolidate\",\"args\":{\"src\":\"$work/allowed/m\",\"dst\":\"$work/allowed\"}}"
api 400 POST /v1/jobs "${J[@]}" -d "{\"kind\":\"import\",\"args\":{\"dir\":\"$work/outside/m\",\"repo\":\"org/a\",\"origin\":\"local\"}}"
api 201 POST /v1/jobs "${J[@]}" -d "$(imp "$work/allowed/m" org/a)"
id=$("$py" -S -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$work/out")
wait_state "$id" succeeded
# A folder swapped for a symlink between submit and run: the worker checks
# again. The one worker is held by a local noop until the swap is done.
hold=$("$ckpt" submit noop --sleep-ms 600000)
wait_state "$hold" running
api 201 POST /v1/jobs "${J[@]}" -d "$(imp "$work/allowed/m" org/b)"
id=$("$py" -S -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$work/out")
mv "$work/allowed/m" "$work/allowed/m.orig"
ln -s "$work/outside/m" "$work/allowed/m"
"$ckpt" cancel "$hold" >/dev/null
wait_state "$id" failed
[[ "$(jf "$id" 'j["error"]')" == *"not under an --allow-path"* ]] || fail "swapped folder: $(jf "$id" 'j["error"]')"
"$ckpt" ls --json | grep -q '"org/b"' && fail "the swapped folder was imported"
stop_dpid

# =========================================================================
# 3. connection limits
# =========================================================================
note "3. idle sockets, per-IP limit, idle timeout"
export CKPT_HOME=$work/h3
"$ckpt" gen-model qwen2 "$work/m3" --scale 16 --layers 1 2>/dev/null
"$ckpt" import "$work/m3" --repo org/tiny@main >/dev/null
ready_daemon # the defaults must protect: 32 connections per address
port=${url##*:}
# hold_sockets N: N idle connections from 127.0.0.2, kept until killed; the
# file $work/held appears once all are connected.
"$py" -S - "$port" 300 "$work/held" <<'PY' &
import signal, socket, sys
port, n, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
socks = []
for _ in range(n):
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.connect(("127.0.0.1", port))
    socks.append(s)
open(ready, "w").close()
signal.pause()
PY
holder=$!
for i in $(seq 1200); do [ -e "$work/held" ] && break; sleep 0.05; done # bounded: 60 s
[ -e "$work/held" ] || fail "300 sockets not connected in 60 s"
api 200 GET /healthz --max-time 30
api 200 GET /v1/checkpoints --max-time 30
grep -q org/tiny "$work/out" || fail "/v1/checkpoints with 300 idle sockets open: $(cat "$work/out")"
kill "$holder"
wait "$holder" 2>/dev/null || true
stop_dpid
# The per-address limit itself: with 4 connections of 127.0.0.2 open (and no
# idle timeout to close them while we look), a fifth from there is closed
# unanswered while 127.0.0.1 is served.
ready_daemon --conns-per-ip 4 --idle-timeout 3600
"$py" -S - "${url##*:}" <<'PY' || fail "a fifth connection from one address was answered (--conns-per-ip 4)"
import socket, sys
port = int(sys.argv[1])
def conn():
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.connect(("127.0.0.1", port))
    return s
held = [conn() for _ in range(4)]
s = conn()
s.settimeout(60)
try:
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = s.recv(4096)
except (ConnectionResetError, BrokenPipeError):
    data = b""
sys.exit(0 if data == b"" else 1)
PY
api 200 GET /healthz --max-time 30
stop_dpid
ready_daemon --idle-timeout 2
port=${url##*:}
# Half a request line, then silence: closed by the server after 2 s (the
# client gives up after 60 s; the old limit was 120 s).
"$py" -S - "$port" <<'PY' || fail "a connection without headers was not closed by --idle-timeout"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
s.settimeout(60)
sys.exit(0 if s.recv(4096) == b"" else 1)
PY
stop_dpid

# =========================================================================
# 4. no request holds up another; oids hashed once
# =========================================================================
note "4. a stuck tree request; the oid cache"
ready_daemon
blob_of() { local h; h=$(sha256sum <"$1" | cut -c1-64); echo "$CKPT_HOME/blobs/${h:0:2}/${h:2}"; }
tree() { curl -sS --max-time 60 "$url/api/models/org/tiny/tree/main"; }
oid_of() { "$py" -S -c 'import json, sys; print([e["oid"] for e in json.load(sys.stdin) if e["path"] == sys.argv[1]][0])' "$1"; }
cfg=$(blob_of "$work/m3/config.json")
oid=$(tree | oid_of config.json)
[ "$oid" = "$(git hash-object "$work/m3/config.json")" ] || fail "config.json oid $oid is not git's"
# The cache: the blob's bytes changed behind the store's back, the oid does not.
cp "$cfg" "$work/cfg.orig"
chmod u+w "$cfg"
printf 'changed' >>"$cfg"
[ "$(tree | oid_of config.json)" = "$oid" ] || fail "config.json hashed again on a second tree call"
cp "$work/cfg.orig" "$cfg"
# A blob nobody hashed yet replaced by a FIFO: the tree request hangs on it.
printf '{"a": 1}\n' >"$work/m3b.json"
mkdir -p "$work/m3b" && cp "$work/m3/"* "$work/m3b/" && cp "$work/m3b.json" "$work/m3b/extra.json"
"$ckpt" import "$work/m3b" --repo org/fifo@main >/dev/null
xb=$(blob_of "$work/m3b.json")
mv "$xb" "$work/xb.orig"
mkfifo "$xb"
exec 7<>"$xb" # a writer that writes nothing yet: the server's open succeeds, its read waits
curl -sS --max-time 120 -o "$work/stuck" "$url/api/models/org/fifo/tree/main" &
stuck=$!
# Once the daemon has the FIFO open the request is inside the hash (bounded
# poll, 60 s); then /healthz and store requests must still answer (each curl
# waits 30 s at most).
for i in $(seq 1200); do [ -n "$(find /proc/"$dpid"/fd -lname "$xb" 2>/dev/null)" ] && break; sleep 0.05; done
[ -n "$(find /proc/"$dpid"/fd -lname "$xb" 2>/dev/null)" ] || fail "the tree request never opened the FIFO"
api 200 GET /healthz --max-time 30
api 200 GET /v1/checkpoints --max-time 30
api 200 GET /api/models/org/tiny/revision/main --max-time 30
cat "$work/xb.orig" >&7 # lets the stuck request finish
exec 7>&-
wait "$stuck" || fail "the tree request on the FIFO failed"
grep -q extra.json "$work/stuck" || fail "tree on the FIFO: $(cat "$work/stuck")"
rm -f "$xb"
mv "$work/xb.orig" "$xb"
stop_dpid

# =========================================================================
# 5. archive.tar
# =========================================================================
note "5. archive.tar streams, checks, fails visibly"
export CKPT_HOME=$work/h5
"$ckpt" gen-model qwen2 "$work/m5" --scale 4 --layers 2 2>/dev/null
"$ckpt" import "$work/m5" --repo org/big@main >/dev/null
"$ckpt" convert org/big@main --layout neuron --tp 2 >/dev/null
"$ckpt" pull org/big@main:neuron-tp2 --rank 1 -o "$work/r1" 2>/dev/null
ready_daemon
A5=$url/v1/checkpoints/org%2Fbig@main
curl -sS --fail -o "$work/a.tar" "$A5/archive.tar" || fail "archive.tar"
mkdir "$work/ax" && tar -xf "$work/a.tar" -C "$work/ax"
diff -r "$work/ax" "$work/m5" >/dev/null || fail "archive.tar differs from the imported folder"
curl -sS --fail -o "$work/r.tar" "$url/v1/checkpoints/org%2Fbig@main:neuron-tp2/archive.tar?rank=1" || fail "rank archive"
mkdir "$work/rx" && tar -xf "$work/r.tar" -C "$work/rx"
diff -r "$work/rx" "$work/r1" >/dev/null || fail "archive.tar?rank=1 differs from pull --rank 1"
rm -rf "$work"/ax "$work"/rx "$work"/*.tar "$work/r1"
api 400 GET "/v1/checkpoints/org%2Fbig@main:neuron-tp2/archive.tar?rank=9"
grep -q "rank 9 is out of range" "$work/out" || fail "rank 9: $(cat "$work/out")"
api 400 GET "/v1/checkpoints/org%2Fbig@main/archive.tar?rank=0"
api 400 GET "/v1/checkpoints/org%2Fbig@main/archive.tar?rank=x"
# A client that reads 1 KiB and stops: nothing may be staged in CKPT_HOME/tmp.
"$py" -S - "${url##*:}" "$CKPT_HOME/tmp" <<'PY' || fail "archive.tar staged files in CKPT_HOME/tmp"
import os, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"GET /v1/checkpoints/org%2Fbig@main/archive.tar HTTP/1.1\r\nHost: x\r\n\r\n")
got = b""
while len(got) < 1024:
    got += s.recv(1024)
assert got.startswith(b"HTTP/1.1 200"), got[:100]
left = [os.path.join(r, f) for r, _, fs in os.walk(sys.argv[2]) for f in fs]
print("staged:", left[:3])
sys.exit(1 if left else 0)
PY
# Damaged blob (same size, one byte flipped): the stream is cut, never a clean 200.
cfg=$CKPT_HOME/blobs/$(sha256sum <"$work/m5/config.json" | cut -c1-2)/$(sha256sum <"$work/m5/config.json" | cut -c3-64)
cp "$cfg" "$work/cfg5.orig"
chmod u+w "$cfg"
"$py" -S -c 'import sys; p = sys.argv[1]; d = bytearray(open(p, "rb").read()); d[0] ^= 1; open(p, "wb").write(d)' "$cfg"
rc=0
curl -sS -o "$work/bad.tar" "$A5/archive.tar" 2>"$work/err" || rc=$?
[ "$rc" -ne 0 ] || fail "archive.tar with a damaged blob ended cleanly"
# Missing blob: known before the answer starts, so an error status.
rm -f "$cfg"
api 500 GET "/v1/checkpoints/org%2Fbig@main/archive.tar"
grep -q "missing" "$work/out" || fail "missing blob: $(cat "$work/out")"
cp "$work/cfg5.orig" "$cfg"
rm -f "$work/bad.tar" "$work/cfg5.orig"
stop_dpid

echo "serve guard: ok"
