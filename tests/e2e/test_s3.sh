#!/usr/bin/env bash
# test_s3.sh — the store's S3 client (store/s3.c, driven by `ckpt s3`) against
# a real Ceph RGW (ceph_lib.sh): SigV4 with the canonical query strings and
# x-amz-content-sha256 the client builds itself, conditional PUTs (exactly one
# of four concurrent writers stores), multipart uploads, ranged GETs, paged
# LISTs, DELETE, wrong credentials, and faults injected by cutproxy.py (503,
# 500, an upload cut mid-part, a download cut mid-body) that the retries
# absorb. Every byte read back is compared by sha256.
# Then, on the same cluster, the store with its blobs in a bucket (CKPT_BLOBS /
# --blobs s3://BUCKET/PREFIX, store/store_blobs.c): import uploads every blob
# and nothing lands in CKPT_HOME/blobs; pull (a folder, a tar, one rank of a
# layout converted inside the store) and `ckpt serve` give the same bytes as
# a local store; import again uploads nothing; verify is clean and then names
# a blob removed from the bucket; rm + gc keeps blobs newer than its start
# (the margin for other hosts) and, past it, deletes exactly the unreferenced
# objects; --blobs and the config file's blobs key select the bucket.
# Reads are ranged: a rank pull requests exactly the rank's bytes (counted by
# CKPT_DEBUG's totals), no tensor blob is copied whole into blob-cache/; the
# gateway killed -9 while an import is held between two parts of an upload
# (crash point s3.part_uploaded) leaves no partial object and the re-run
# completes; the secret appears in no file the tests leave.
# One cluster for both halves: its start is most of the script's time.
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
. "$E2E_DIR/store_lib.sh"
. "$E2E_DIR/ceph_lib.sh"
E2E_LOGS=("$work/proxy*.log")

ceph_start
export CKPT_S3_BACKOFF_MS=10 CKPT_S3_MULTIPART_MB=8
B=s3://ckpt-test
sha() { sha256sum "$1" | cut -d' ' -f1; }
s3() { "$ckpt" s3 "$@"; }
# stat_of FIELD: requests or retries from the --stats line of the last command.
stat_of() { sed -n "s/^s3: \([0-9]*\) requests, \([0-9]*\) retries.*/\\$1/p" "$work/err"; }

expect_status 0 s3 mb "$B"
expect_status 0 s3 mb "$B" # ours already: success

note "put, head, ranged get, delete"
"$py" -S -c 'import os, sys; open(sys.argv[1], "wb").write(os.urandom(100000))' "$work/small"
expect_status 0 s3 put "$B/t/small" "$work/small"
[ "$(cat "$work/out")" = stored ] || fail "first put: $(cat "$work/out")"
expect_status 0 s3 put "$B/t/small" "$work/small"
[ "$(cat "$work/out")" = existed ] || fail "second put of the same key: $(cat "$work/out"), expected existed (412)"
expect_status 0 s3 head "$B/t/small"
[ "$(cat "$work/out")" = 100000 ] || fail "head: $(cat "$work/out")"
for r in 0:1 12345:1000 99999:1 0:100000 4096:95904; do
    expect_status 0 s3 get "$B/t/small" -o "$work/part" --range "$r"
    off=${r%:*} len=${r#*:}
    "$py" -S -c 'import sys; d = open(sys.argv[1], "rb").read(); o, n = int(sys.argv[2]), int(sys.argv[3]); sys.exit(open(sys.argv[4], "rb").read() != d[o:o + n])' \
        "$work/small" "$off" "$len" "$work/part" || fail "range $r: bytes differ"
done
expect_status 1 s3 get "$B/t/small" -o "$work/part" --range 99990:100
grep -q "got 10 bytes (the object is shorter)" "$work/err" || fail "a range past the end: $(cat "$work/err")"
expect_status 1 s3 get "$B/t/nothing" -o "$work/part" --range 0:10
grep -q "s3://ckpt-test/t/nothing: GET: no such object" "$work/err" || fail "a missing key: $(cat "$work/err")"
expect_status 0 s3 rm "$B/t/small"
expect_status 1 s3 head "$B/t/small"
expect_status 0 s3 rm "$B/t/small" # gone already: success

note "keys and prefixes that need percent-encoding; LIST in pages"
for k in "odd/sp ace+plus=eq&amp~tilde" "odd/ü-utf8" "odd/a%2Fb"; do
    expect_status 0 s3 put "$B/$k" "$work/small"
done
expect_status 0 s3 ls "$B/odd/sp ace+"
[ "$(cut -d' ' -f1-3 "$work/out")" = "odd/sp ace+plus=eq&amp~tilde 100000" ] || fail "ls of an encoded prefix: $(cat "$work/out")"
expect_status 0 s3 ls "$B/odd"
[ "$(wc -l <"$work/out")" = 3 ] || fail "ls odd/: $(cat "$work/out")"
for i in $(seq -w 1 12); do echo "$i" >"$work/k$i"; done
for i in $(seq -w 1 12); do s3 put "$B/many/k$i" "$work/k$i" >/dev/null || fail "put many/k$i"; done
expect_status 0 s3 ls "$B/many/" --max-keys 5 --stats
[ "$(cut -d' ' -f1 "$work/out" | tr '\n' ' ')" = "$(for i in $(seq -w 1 12); do printf 'many/k%s ' "$i"; done)" ] ||
    fail "paged ls: $(cat "$work/out")"
[ "$(stat_of 1)" = 3 ] || fail "12 keys 5 per page took $(stat_of 1) requests, expected 3"
awk '$2 != 3 || $3 < 1700000000 { exit 1 }' "$work/out" || fail "ls sizes or times: $(head -n 3 "$work/out")"

note "four concurrent conditional PUTs of one key: exactly one stores"
"$py" -S -c 'import os, sys; open(sys.argv[1], "wb").write(os.urandom(3 << 20))' "$work/race"
pids=()
for i in 1 2 3 4; do
    "$ckpt" s3 put "$B/race/x" "$work/race" >"$work/race$i.out" 2>"$work/race$i.err" &
    pids+=($!)
done
for i in 1 2 3 4; do wait "${pids[$((i - 1))]}" || fail "racing put $i failed: $(cat "$work/race$i.err")"; done
[ "$(cat "$work"/race?.out | sort | tr '\n' ' ')" = "existed existed existed stored " ] ||
    fail "racing puts: $(cat "$work"/race?.out | tr '\n' ' ')"
expect_status 0 s3 get "$B/race/x" -o "$work/race.back"
[ "$(sha "$work/race.back")" = "$(sha "$work/race")" ] || fail "the raced object's bytes differ"

note "multipart: 20 MiB in 8 MiB parts"
"$py" -S -c 'import os, sys; open(sys.argv[1], "wb").write(os.urandom((20 << 20) + 12345))' "$work/big"
expect_status 0 s3 put "$B/big/a" "$work/big" --stats
[ "$(cat "$work/out")" = stored ] || fail "multipart put: $(cat "$work/out")"
[ "$(stat_of 1)" = 6 ] || fail "multipart of 3 parts took $(stat_of 1) requests, expected 6 (head, initiate, 3 parts, complete)"
expect_status 0 s3 get "$B/big/a" -o "$work/big.back"
[ "$(sha "$work/big.back")" = "$(sha "$work/big")" ] || fail "the multipart object's bytes differ"
expect_status 0 s3 put "$B/big/a" "$work/big" --stats
[ "$(cat "$work/out")" = existed ] && [ "$(stat_of 1)" = 1 ] || fail "a stored multipart object is uploaded again: $(cat "$work/out" "$work/err")"
expect_status 0 s3 get "$B/big/a" -o "$work/part" --range 8388600:20
[ "$(cmp -n 20 -i 8388600:0 "$work/big" "$work/part" && echo same)" = same ] || fail "a range across parts differs"

note "wrong credentials: a clear error without the secret"
secret=$AWS_SECRET_ACCESS_KEY
AWS_SECRET_ACCESS_KEY=not-the-secret-0123456789 expect_status 1 s3 put "$B/t/denied" "$work/k01"
grep -q "s3://ckpt-test/t/denied: PUT: HTTP 403 SignatureDoesNotMatch" "$work/err" || fail "wrong secret: $(cat "$work/err")"
grep -q "check AWS_ACCESS_KEY_ID" "$work/err" || fail "wrong secret: no hint: $(cat "$work/err")"
AWS_ACCESS_KEY_ID=NOSUCHKEY expect_status 1 s3 ls "$B/many/"
grep -q "HTTP 403 InvalidAccessKeyId" "$work/err" || fail "unknown access key: $(cat "$work/err")"
AWS_SECRET_ACCESS_KEY=not-the-secret-0123456789 expect_status 1 s3 get "$B/big/a" -o "$work/part"
! grep -q -e "$secret" -e not-the-secret "$work/err" "$work/out" || fail "a secret in the output: $(cat "$work/err")"
(unset AWS_SECRET_ACCESS_KEY; expect_status 1 s3 head "$B/big/a")
grep -q "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set" "$work/err" || fail "no secret: $(cat "$work/err")"

note "faults: 503 and 500 retried, an upload cut mid-part and a download cut mid-body resumed"
proxy_n=0
# start_proxy ARGS...: a cutproxy.py in front of the gateway; sets proxy_url, proxy_pid, proxy_log.
start_proxy() {
    proxy_n=$((proxy_n + 1))
    proxy_log=$work/proxy$proxy_n.log
    rm -f "$work/proxy.url"
    "$py" -S "$E2E_DIR/cutproxy.py" --target "127.0.0.1:$ceph_port" --url-file "$work/proxy.url" --log "$proxy_log" \
        "$@" 2>>"$work/proxy-stderr.log" &
    proxy_pid=$!
    serve_bg "$proxy_pid"
    wait_file "$work/proxy.url"
    proxy_url=$(cat "$work/proxy.url")
}
start_proxy --status "503@2,only=PUT /ckpt-test/faults/a" --cut-request "1000000,only=partNumber=2" \
    --status "500,only=POST /ckpt-test/faults/a?uploadId" --cut "1000000,only=GET /ckpt-test/faults/a"
AWS_ENDPOINT_URL=$proxy_url expect_status 0 s3 put "$B/faults/a" "$work/big" --stats
[ "$(cat "$work/out")" = stored ] && [ "$(stat_of 2)" = 4 ] ||
    fail "put through faults: $(cat "$work/out" "$work/err"), expected 4 retries"
[ "$(grep -c "status=503 injected" "$proxy_log")" = 2 ] && grep -q "cut-request=1000000" "$proxy_log" &&
    grep -q "POST .*uploadId.* status=500 injected" "$proxy_log" || fail "the faults did not happen: $(cat "$proxy_log")"
AWS_ENDPOINT_URL=$proxy_url expect_status 0 s3 get "$B/faults/a" -o "$work/faults.back" --stats
[ "$(stat_of 2)" = 1 ] && grep -q "cut=1000000" "$proxy_log" || fail "get through a cut: $(cat "$work/err" "$proxy_log")"
[ "$(sha "$work/faults.back")" = "$(sha "$work/big")" ] || fail "bytes after the faults differ"
serve_stop "$proxy_pid"
# No partial object is ever visible, and the multipart upload cut short left
# nothing listed.
expect_status 0 s3 ls "$B/faults/"
[ "$(cat "$work/out" | cut -d' ' -f1-2)" = "faults/a $(stat -c %s "$work/big")" ] || fail "faults/: $(cat "$work/out")"

start_proxy --status "503@100,only=HEAD"
CKPT_S3_RETRIES=3 AWS_ENDPOINT_URL=$proxy_url expect_status 1 s3 head "$B/big/a"
grep -q "s3://ckpt-test/big/a: HEAD: HTTP 503 (after 3 attempts)" "$work/err" || fail "retries exhausted: $(cat "$work/err")"
serve_stop "$proxy_pid"

# =========================================================================
# The store with its blobs in a bucket
# =========================================================================
expect_status 0 "$ckpt" s3 mb s3://ckpt-store
export CKPT_BLOBS=s3://ckpt-store/team/a
objects() { "$ckpt" s3 ls s3://ckpt-store/team/a/ | wc -l; }

gen qwen2 "$work/src" --scale 8 --layers 2 --shard-mb 1
# A tensor above the multipart threshold: the embeddings, 16 MB in bf16.
gen llama "$work/llama" --scale 8 --layers 1 --shard-mb 0

note "import into the bucket"
export CKPT_HOME=$work/h
CKPT_DEBUG=1 expect_status 0 "$ckpt" import "$work/src" --repo org/qwen
[ -z "$(find "$CKPT_HOME/blobs" -type f)" ] || fail "blobs landed in CKPT_HOME/blobs: $(find "$CKPT_HOME/blobs" -type f | head -3)"
n_obj=$(objects)
[ "$n_obj" -gt 10 ] || fail "only $n_obj objects in the bucket"
# One request per blob (each below the multipart size): its PUT, and one
# HEAD for the first tensor (is it stored already?); no HEAD of each new one.
n_req=$(sed -n 's/^debug: blobs s3:.*: \([0-9]*\) requests, .*/\1/p' "$work/err")
[ "$n_req" = $((n_obj + 1)) ] || fail "import of $n_obj blobs took ${n_req:-no} requests, expected $((n_obj + 1))"
[ "$(du_field blobs)" = "$n_obj" ] || fail "du counts $(du_field blobs) blobs, the bucket holds $n_obj"
CKPT_HOME=$work/local CKPT_BLOBS= expect_status 0 "$ckpt" import "$work/src" --repo org/qwen
[ "$(find "$work/local/blobs" -type f | wc -l)" = "$n_obj" ] || fail "a local store of the same import has other blobs"
expect_status 0 "$ckpt" import "$work/llama" --repo org/big
tmp_empty "import"

note "pull: folder, tar, and from a fresh home (everything from the bucket)"
expect_status 0 "$ckpt" pull org/qwen -o "$work/p1"
same_tree "$work/src" "$work/p1" "pull of org/qwen"
expect_status 0 "$ckpt" pull org/big -o "$work/p2.tar" --format tar
untar "$work/p2.tar" "$work/p2"
same_tree "$work/llama" "$work/p2" "tar pull of org/big"
rm -rf "$CKPT_HOME/blob-cache"
expect_status 0 "$ckpt" convert org/qwen --layout neuron --tp 2
expect_status 0 "$ckpt" pull org/qwen:neuron-tp2 --rank 1 -o "$work/r1"
CKPT_HOME=$work/local CKPT_BLOBS= expect_status 0 "$ckpt" convert org/qwen --layout neuron --tp 2
CKPT_HOME=$work/local CKPT_BLOBS= expect_status 0 "$ckpt" pull org/qwen:neuron-tp2 --rank 1 -o "$work/r1-local"
same_tree "$work/r1-local" "$work/r1" "rank 1 of a layout converted in the store"
[ -z "$(find "$CKPT_HOME/blob-cache" -type f -size +64k)" ] ||
    fail "tensor blobs were copied whole into blob-cache/: $(find "$CKPT_HOME/blob-cache" -type f -size +64k | head -3)"
tmp_empty "pull"

note "a rank pull requests exactly the rank's bytes from the bucket"
# With CKPT_S3_RANGE_GAP=0 every row of a row-parallel slice is its own GET,
# so the bytes received are exactly the rank's tensor bytes (every output
# byte comes from one source byte; the layout has no zero padding here) and
# its whole plain files; CKPT_DEBUG=1 prints the store's totals as it closes.
rank_bytes() { "$py" -S "$E2E_DIR/payload_bytes.py" "$1"; }
# received: bytes received from the bucket by the last command (its debug line).
received() { sed -n 's/^debug: blobs s3:.*: [0-9]* requests, [0-9]* retries, \([0-9]*\) bytes received$/\1/p' "$work/err"; }
rm -rf "$CKPT_HOME/blob-cache"
CKPT_DEBUG=1 CKPT_S3_RANGE_GAP=0 expect_status 0 "$ckpt" pull org/qwen:neuron-tp2 --rank 1 -o "$work/r1-exact"
same_tree "$work/r1-local" "$work/r1-exact" "rank 1 read in exact ranges"
want=$(rank_bytes "$work/r1-exact")
[ "$(received)" = "$want" ] || fail "rank 1 received $(received) bytes from the bucket, its files hold $want: $(grep debug: "$work/err" | tail -n 3)"
# With the default gap the rows of a row-parallel slice come in one GET of
# their span: more bytes, far fewer requests, still not the whole checkpoint.
CKPT_DEBUG=1 expect_status 0 "$ckpt" pull org/qwen:neuron-tp2 --rank 1 -o "$work/r1-gap"
same_tree "$work/r1-local" "$work/r1-gap" "rank 1 read in ranges"
all=$(rank_bytes "$work/src")
[ "$(received)" -ge "$want" ] && [ "$(received)" -lt "$all" ] ||
    fail "rank 1 with the default gap received $(received) bytes (rank $want, whole checkpoint $all)"
note "rank 1 of 2: $want bytes exact, $(received) with the default gap, checkpoint $all"

note "serve: a file of a layout over HTTP, from the bucket"
rm -rf "$CKPT_HOME/blob-cache"
rm -f "$CKPT_HOME/serve.url"
"$ckpt" serve --listen 127.0.0.1:0 --workers 1 >"$work/serve.log" 2>&1 &
serve_pid=$!
serve_bg "$serve_pid"
wait_file "$CKPT_HOME/serve.url"
f=$(cd "$work/r1" && find . -name '*.safetensors' | head -n 1)
curl -sf -o "$work/served" "$(cat "$CKPT_HOME/serve.url")/org/qwen/resolve/neuron-tp2/tp_rank_01/${f#./}" ||
    fail "GET of tp_rank_01/${f#./} failed: $(tail -3 "$work/serve.log")"
cmp -s "$work/served" "$work/r1/$f" || fail "the served file differs from the pulled one"
# a Range of the same file, and a whole plain file (config.json), from the bucket in ranges
url=$(cat "$CKPT_HOME/serve.url")/org/qwen/resolve/neuron-tp2
curl -sf -r 1000-300999 -o "$work/served.part" "$url/tp_rank_01/${f#./}" || fail "a Range GET failed: $(tail -3 "$work/serve.log")"
cmp -s "$work/served.part" <(tail -c +1001 "$work/r1/$f" | head -c 300000) || fail "the served range differs from the pulled file's"
curl -sf -o "$work/served.cfg" "$url/config.json" || fail "GET config.json failed: $(tail -3 "$work/serve.log")"
cmp -s "$work/served.cfg" "$work/src/config.json" || fail "the served config.json differs"
[ -z "$(find "$CKPT_HOME/blob-cache" -type f -size +64k)" ] || fail "serving copied tensor blobs whole into blob-cache/"
serve_stop "$serve_pid"

note "import again: nothing uploaded"
expect_status 0 "$ckpt" import "$work/src" --repo org/qwen
[ "$(objects)" = "$(du_field blobs)" ] || fail "objects and du disagree after a second import"

note "an import killed after its third upload: nothing visible, the re-run completes"
gen qwen2 "$work/src2" --scale 8 --layers 2 --shard-mb 1 --seed 7
CKPT_FAULT=blob.published:3 expect_status 137 "$ckpt" import "$work/src2" --repo org/crash
! refs | grep -q org/crash || fail "a killed import left org/crash in the catalog"
expect_status 0 "$ckpt" import "$work/src2" --repo org/crash
expect_status 0 "$ckpt" pull org/crash -o "$work/p4"
same_tree "$work/src2" "$work/p4" "pull after a killed import and its re-run"
expect_status 0 "$ckpt" rm org/crash

note "verify: clean, then a blob removed from the bucket is named"
expect_status 0 "$ckpt" verify
victim=$("$ckpt" s3 ls s3://ckpt-store/team/a/ | sort -k2 -n | tail -n 1 | cut -d' ' -f1)
sha=$(echo "$victim" | sed 's|^team/a/\(..\)/|\1|')
expect_status 0 "$ckpt" s3 rm "s3://ckpt-store/$victim"
rm -rf "$CKPT_HOME/blob-cache"
expect_status 1 "$ckpt" verify
grep -q "$sha" "$work/out" "$work/err" && grep -q missing "$work/out" "$work/err" ||
    fail "verify does not name the missing blob $sha: $(cat "$work/out" "$work/err" | head -5)"
expect_status 0 "$ckpt" rm org/big # the biggest blob is org/big's

note "rm + gc: fresh blobs kept within the margin, then deleted"
before=$(objects)
expect_status 0 "$ckpt" rm org/qwen:neuron-tp2
expect_status 0 "$ckpt" rm org/qwen
expect_status 0 "$ckpt" gc --json
[ "$(jget blobs_removed <"$work/out")" = 0 ] || fail "gc removed blobs newer than its start: $(cat "$work/out")"
[ "$(objects)" = "$before" ] || fail "objects went from $before to $(objects) though gc removed none"
CKPT_GC_MARGIN_S=-3600 expect_status 0 "$ckpt" gc --json
removed=$(jget blobs_removed <"$work/out")
[ "$removed" -gt 0 ] && [ "$(objects)" = $((before - removed)) ] || fail "gc removed $removed, objects $before -> $(objects)"
[ "$(objects)" = 0 ] || fail "objects left after every checkpoint was removed: $(objects)"

note "the gateway killed while a multipart upload is between parts: nothing visible, the re-run completes"
# The import stops itself (SIGSTOP at the crash point s3.part_uploaded)
# after the first 8 MiB part of its 16 MB embeddings blob is acknowledged
# (one part at a time, CKPT_S3_PART_UPLOADS=1, so the second is not sent yet);
# the gateway is killed -9 while it is stopped; the import goes on, finds no
# server, gives up after its retries and fails. With the gateway back, no
# checkpoint appeared, and the same import completes with every blob whole.
gen llama "$work/llama3" --scale 8 --layers 1 --shard-mb 0 --seed 9
[ "$(objects)" = 0 ] || fail "objects left before the gateway-kill case"
CKPT_FAULT=s3.part_uploaded:1:STOP CKPT_S3_RETRIES=2 CKPT_S3_UPLOADS=1 CKPT_S3_PART_UPLOADS=1 "$ckpt" import "$work/llama3" --repo org/cut \
    >"$work/cut.out" 2>"$work/cut.err" &
cut_pid=$!
stopped() { [ "$(awk '/^State:/ {print $2}' "/proc/$cut_pid/status" 2>/dev/null)" = T ]; }
wait_until 120 "the import to stop between two parts" stopped
ceph_rgw_kill
kill -CONT "$cut_pid"
cut_rc=0
wait "$cut_pid" || cut_rc=$?
[ "$cut_rc" = 1 ] || fail "the import with its gateway gone exited $cut_rc: $(cat "$work/cut.err")"
grep -q "s3://ckpt-store/team/a/.*: upload part: .*(after 2 attempts)" "$work/cut.err" ||
    fail "the failed upload is not named: $(cat "$work/cut.err")"
ceph_rgw_start
! refs | grep -q org/cut || fail "an import whose upload failed left org/cut in the catalog"
# the embeddings are the one blob above a part: neither whole nor as its first part
"$ckpt" s3 ls s3://ckpt-store/team/a/ >"$work/cut.ls" || fail "ls after the gateway restarted: $(cat "$work/cut.ls")"
awk '$2 >= 8388608 { exit 1 }' "$work/cut.ls" || fail "an object of a part's size or more is visible: $(sort -k2 -n "$work/cut.ls" | tail -n 1)"
# The re-run finds the objects the failed run stored (412 or a HEAD of the
# same size: not uploaded again), so a partial object under a blob's name
# would become part of org/cut: verify re-hashes every blob from the bucket,
# and every object is one of org/cut's blobs.
expect_status 0 "$ckpt" import "$work/llama3" --repo org/cut
expect_status 0 "$ckpt" verify
[ "$(objects)" = "$(du_field blobs)" ] || fail "$(objects) objects, org/cut references $(du_field blobs) blobs"

note "--blobs and the config file select the bucket"
export -n CKPT_BLOBS
unset CKPT_BLOBS
expect_status 0 "$ckpt" --blobs s3://ckpt-store/team/b import "$work/src" --repo org/qwen
[ "$("$ckpt" s3 ls s3://ckpt-store/team/b/ | wc -l)" -gt 10 ] || fail "--blobs did not put blobs in team/b"
mkdir -p "$work/xdg/ckpt"
echo "blobs = s3://ckpt-store/team/b" >"$work/xdg/ckpt/config"
XDG_CONFIG_HOME=$work/xdg expect_status 0 "$ckpt" pull org/qwen -o "$work/p3"
same_tree "$work/src" "$work/p3" "pull with the config's blobs"
expect_status 1 "$ckpt" --blobs /some/folder ls
grep -q "expected s3://BUCKET/PREFIX" "$work/err" || fail "a bad --blobs: $(cat "$work/err")"
note "credentials: the secret is in no log, error, output or catalog file"
# Every file the tests left (command outputs and errors, the daemon's log,
# the proxies' logs, the stores' catalogs and their WAL files), except the
# cluster's own folder, whose user record holds the key by design.
leaks=$(grep -rlaF --exclude-dir=ceph -e "$secret" "$work" || true)
[ -z "$leaks" ] || fail "the secret appears in: $leaks"
[ -s "$work/h/ckpt.db" ] && [ -s "$work/serve.log" ] && [ -s "$work/cut.err" ] || fail "the files searched are missing"
note "ceph: $(ceph_rss_mb) MB resident"
