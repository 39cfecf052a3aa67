#!/usr/bin/env bash
# test_fetch_xet.sh — what real Hubs answer that a plain file server does not
# (issue 18 part 3, docs/hub.md "Redirects, ETags and 429"), from the test Hub:
#   - a Xet-backed file: resolve answers 302 to another host (hub B, another
#     port) with a signed-URL query, X-Linked-Etag in the weak form W/"sha256",
#     X-Linked-Size and X-Xet-Hash: followed, verified as usual; the token
#     goes to hub A only (hub B's log shows auth=none);
#   - an X-Linked-Etag naming other bytes than the tree's lfs.oid: refused
#     before anything is stored, naming the file;
#   - 429 with Retry-After as an HTTP-date: honoured, then the fetch succeeds.
# Run through run.sh (needs CKPT_BIN, CKPT_TESTHUB, E2E_WORK).
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
hub_client_env
E2E_LOGS=("$work/hub*.log" "$work/err")
faults() { set_faults "$hubA_url" "$1"; }
n=0
# fetch WANT_STATUS WHAT [env...]: org/tiny from hub A into a fresh home.
fetch() {
    local want=$1 what=$2 rc=0
    shift 2
    n=$((n + 1))
    export CKPT_HOME=$work/c$n
    env HF_ENDPOINT="$hubA_url" "$@" timeout 300 "$ckpt" fetch org/tiny --chunk-size 1MiB >"$work/out" 2>"$work/err" || rc=$?
    [ "$rc" -eq "$want" ] || fail "$what: exit $rc, expected $want"
    if [ "$want" -eq 0 ]; then
        "$ckpt" pull org/tiny@main -o "$work/pulled" --quiet >/dev/null 2>&1 || fail "$what: pull"
        diff -r "$work/m1" "$work/pulled" >/dev/null || fail "$what: the stored checkpoint differs from the repo"
        rm -rf "$work/pulled"
    fi
}

"$ckpt" gen-model qwen2 "$work/m1" --scale 8 --layers 2 --shard-mb 2 >/dev/null 2>&1
CKPT_HOME=$work/hub "$ckpt" import "$work/m1" --repo org/tiny@main >/dev/null 2>&1
start_testhub hubA
start_testhub hubB

secret=hf_xet_secret_$$
faults "token=$secret,xet=${hubB_url##*:}"
start=$(wc -l <"$work/hubB.log")
fetch 0 "Xet redirect" HF_TOKEN=$secret
grep -q "fault=xet" "$work/hubA.log" || fail "hub A sent no Xet redirect"
tail -n +$((start + 1)) "$work/hubB.log" | grep -q "/resolve/.*auth=none" || fail "hub B served no file"
tail -n +$((start + 1)) "$work/hubB.log" | grep /resolve/ | grep -qv "auth=none" && fail "the token followed the Xet redirect to hub B"
note "Xet redirect to hub B (W/\"sha256\" X-Linked-Etag): stored, identical; hub B saw no token"

faults "xet=${hubB_url##*:},badetag"
fetch 1 "an X-Linked-Etag of other bytes"
grep -q "model-0000.-of-00002.safetensors: the Hub's X-Linked-Etag is 0123456789abcdef" "$work/err" || fail "badetag: $(cat "$work/err")"
[ -z "$("$ckpt" ls 2>/dev/null)" ] || fail "badetag: something was stored"
note "an X-Linked-Etag that is not the tree's lfs.oid: $(tail -n 1 "$work/err" | cut -c1-120)"

faults "429date:file=1@2"
fetch 0 "429 with an HTTP-date Retry-After"
[ "$(grep -c 'fault=429' "$work/hubA.log")" -eq 2 ] || fail "429 fired $(grep -c 'fault=429' "$work/hubA.log") times"
note "429 with Retry-After as an HTTP-date (twice): waited, then stored, identical"
