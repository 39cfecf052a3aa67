#!/usr/bin/env bash
# test_pull_cut.sh — `ckpt pull --server` with connections cut mid-transfer
# (issue 7: "a converted layout equals a local `ckpt pull` byte for byte, also
# after the connection is cut mid-transfer").
#
# A generated Qwen2 with odd sizes (14 query heads, 2 KV heads: GQA
# replication and padding to 16 heads on tp 4) is converted to neuron tp 4 and
# served by `ckpt serve`. Between the client and the daemon sits
# cutproxy.py, which passes bytes through and cuts chosen responses after N
# body bytes (both sides closed). Through it:
#   - the whole layout, cut once mid-way through a rank's data, once inside a
#     safetensors header, once in a whole-file (non-Range) download;
#   - --rank 2, cut in rank 2's data;
#   - --consolidated, cut twice in a row in the same file;
# every pull equals the local `ckpt pull` of the same ref (diff -r), every cut
# is in the proxy's log and was followed by a request that resumes at the next
# byte, and the client's tmp/ is empty. Then the same layout through the test
# Hub (tests/hub/testhub.c) with its drop fault, which must fire for the
# revisions a layout is downloaded by ("<commit>.<layout>", its pseudo-commit).
# Run through run.sh (needs CKPT_BIN, E2E_WORK; CKPT_TESTHUB or the test hub
# beside CKPT_BIN).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
B=$ckpt W=$work
DIR=$E2E_DIR
export CKPT_HOME=$W/home CKPT_QUIET=1
export CKPT_HUB_BACKOFF_MS=10 # retries in milliseconds, not seconds
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN CKPT_TOKEN
export HF_HOME=$W/hf-home # no token file from the machine running the tests
E2E_LOGS=("$W/*.log")

resumed() {
    local why
    why=$("$py" -S - "$@" 2>&1 <<'PY'
import re, sys
log, need = sys.argv[1], int(sys.argv[2])
fixed = int(sys.argv[3]) if len(sys.argv) > 3 else None
lines = open(log).read().splitlines()
cuts = 0
for i, l in enumerate(lines):
    m = re.search(r" cut=(\d+)", l)
    if not m and not (fixed is not None and "fault=drop" in l):
        continue
    cuts += 1
    n = int(m.group(1)) if m else fixed
    url = l.split()[1]
    r = re.search(r"range=bytes=(\d+)-", l)
    want = "range=bytes=%d-" % ((int(r.group(1)) if r else 0) + n)
    if not any(x.split()[1:2] == [url] and want in x for x in lines[i + 1:]):
        sys.exit("not resumed at its next byte (%s): %s" % (want, l))
    print("cut and resumed: %s -> %s" % (l, want))
if cuts != need:
    sys.exit("%d cuts, expected %d" % (cuts, need))
PY
    ) || fail "$(basename "$1"): $why"
    echo "$why"
}

# --- a converted layout with odd sizes, and the local pulls to compare with ---
"$B" gen-model qwen2 "$W/src" --scale 8 --layers 2 --shard-mb 2 2>/dev/null
"$py" -S - "$W/src/config.json" <<'PY' || fail "the model is not odd enough"
import json, sys
c = json.load(open(sys.argv[1]))
h, kv = c["num_attention_heads"], c["num_key_value_heads"]
assert h % 4 and kv < h and 4 % kv == 0, (h, kv)  # padding on tp 4, GQA replication
PY
"$B" import "$W/src" --repo Qwen/odd@main >/dev/null
"$B" convert Qwen/odd@main --layout neuron --tp 4 >/dev/null
REF=Qwen/odd@main:neuron-tp4
"$B" pull "$REF" -o "$W/local" 2>/dev/null
"$B" pull "$REF" --rank 2 -o "$W/local-r2" 2>/dev/null
"$B" pull "$REF" --consolidated -o "$W/local-cons" 2>/dev/null
size=$(stat -c %s "$W/local/tp_rank_01/model.safetensors")
[ "$size" -gt 1000000 ] || fail "rank files of $size bytes are too small to cut mid-file"
note "neuron tp 4 layout: rank files of $size bytes"

# --- ckpt serve behind the cutting proxy ---
"$B" serve --listen 127.0.0.1:0 --workers 1 >"$W/serve.log" 2>&1 &
DPID=$!
serve_bg "$DPID"
wait_file "$CKPT_HOME/serve.url"
DURL=$(cat "$CKPT_HOME/serve.url")

n=0
# pull_cut WHAT NCUTS LOCAL [pull options] -- RULE...: a fresh client home pulls
# REF through a new proxy with these cut rules; the result must equal LOCAL.
pull_cut() {
    local what=$1 ncuts=$2 want=$3
    shift 3
    local opts=() rules=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
    shift
    for r in "$@"; do rules+=(--cut "$r"); done
    n=$((n + 1))
    rm -f "$W/proxy.url"
    "$py" -S "$DIR/cutproxy.py" --target "${DURL#http://}" --url-file "$W/proxy.url" \
        --log "$W/proxy$n.log" "${rules[@]}" 2>>"$W/proxy-stderr.log" &
    local ppid=$!
    serve_bg "$ppid"
    wait_file "$W/proxy.url"
    CKPT_HOME=$W/c$n "$B" pull "$REF" "${opts[@]}" -o "$W/out$n" --server "$(cat "$W/proxy.url")" \
        >"$W/pull.out" 2>"$W/pull.err" || fail "$what: pull failed: $(cat "$W/pull.err")"
    serve_stop "$ppid"
    resumed "$W/proxy$n.log" "$ncuts"
    diff -r "$want" "$W/out$n" >/dev/null || fail "$what: differs from a local pull: $(diff -rq "$want" "$W/out$n" | head -5)"
    [ -d "$W/c$n/tmp" ] && [ -z "$(ls -A "$W/c$n/tmp")" ] || fail "$what: left $(ls -A "$W/c$n/tmp" 2>&1) in tmp/"
    note "$what: $ncuts cut(s), resumed, identical to the local pull"
}

pull_cut "the layout" 3 "$W/local" -- \
    "300000,only=tp_rank_01/,resumed" "1000,only=tp_rank_02/" "40000,only=ckpt-layout.json"
pull_cut "--rank 2" 1 "$W/local-r2" --rank 2 -- "500000,only=tp_rank_02/,resumed"
pull_cut "--consolidated" 2 "$W/local-cons" --consolidated -- "250000@2,only=tp_rank_03/,resumed"

[ "$(curl -s -o /dev/null -w '%{http_code}' "$DURL/healthz")" = 200 ] || fail "the daemon is unwell after the cuts"
serve_stop "$DPID"
! grep -Eq 'AddressSanitizer|runtime error|LeakSanitizer' "$W/serve.log" || fail "sanitizer report in the daemon's log"

# --- the test hub's drop fault on a converted layout's revisions ---
"$testhub" --home "$CKPT_HOME" --url-file "$W/hub.url" --log "$W/hub.log" \
    --faults "drop=1000@2,only=tp_rank_01/" 2>>"$W/hub-stderr.log" &
HPID=$!
serve_bg "$HPID"
wait_file "$W/hub.url"
HURL=$(cat "$W/hub.url")
CKPT_HOME=$W/c-hub "$B" pull "$REF" -o "$W/out-hub" --server "$HURL" >"$W/pull.out" 2>"$W/pull.err" ||
    fail "pull through the test hub: $(cat "$W/pull.err")"
resumed "$W/hub.log" 2 1000
diff -r "$W/local" "$W/out-hub" >/dev/null || fail "pull through the test hub differs from a local pull"
note "test hub: drop fired on the layout's pseudo-commit, resumed, identical"
commit=$("$B" ls --json | "$py" -S -c 'import json,sys; print([c["commit"] for c in json.load(sys.stdin)["checkpoints"] if not c.get("layout")][0])')
for rev in "$commit.neuron-tp4" neuron-tp4; do
    curl -s -X POST --data-binary "drop=100000@1" "$HURL/_testhub/faults" >/dev/null || fail "cannot set faults"
    rc=0
    curl -s -o "$W/part" "$HURL/Qwen/odd/resolve/$rev/tp_rank_00/model.safetensors" || rc=$?
    [ "$rc" -eq 18 ] && [ "$(stat -c %s "$W/part")" -eq 100000 ] || fail "revision $rev: no drop (curl exit $rc)"
    grep -q "resolve/$rev/tp_rank_00/model.safetensors .*fault=drop" "$W/hub.log" || fail "revision $rev: no drop in the log"
done
note "test hub: drop fired for <commit>.neuron-tp4 and neuron-tp4"
# archive.tar?rank=R: a rank the layout lacks, a rank that is not a number and
# any rank of a checkpoint without ranks are 400 answers naming the problem.
while IFS='|' read -r ref query want; do
    code=$(curl -s -o "$W/rank.out" -w '%{http_code}' "$HURL/v1/checkpoints/$ref/archive.tar?$query")
    [ "$code" = 400 ] && grep -q "$want" "$W/rank.out" || fail "$ref archive.tar?$query: $code $(head -c 300 "$W/rank.out")"
done <<'RANKS'
Qwen%2Fodd@main:neuron-tp4|rank=4|rank 4 is out of range: checkpoint [0-9]* has ranks 0-3
Qwen%2Fodd@main:neuron-tp4|rank=x|rank: 'x' is not a whole number
Qwen%2Fodd@main|rank=0|is not tensor-parallel
RANKS
code=$(curl -s -o "$W/rank.out" -w '%{http_code}' "$HURL/v1/checkpoints/Qwen%2Fodd@main:neuron-tp4/archive.tar?rank=3")
[ "$code" = 200 ] && tar -tf "$W/rank.out" | grep -q '^model.safetensors$' || fail "archive.tar?rank=3: $code"
rm -f "$W/rank.out"
note "test hub: archive.tar?rank= out of range, not a number, on an original: 400"
serve_stop "$HPID"
echo "pull --server with cut connections: ok"
