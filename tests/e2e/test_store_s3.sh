#!/usr/bin/env bash
# test_store_s3.sh — the store with its blobs in a bucket of a real Ceph RGW
# (ceph_lib.sh; CKPT_BLOBS / --blobs s3://BUCKET/PREFIX, store/store_blobs.c):
# import uploads every blob and nothing lands in CKPT_HOME/blobs; pull (a
# folder, a tar, one rank of a layout converted inside the store) gives the
# same bytes as the same commands on a local store; import again uploads
# nothing; verify is clean and then names a blob removed from the bucket;
# rm + gc keeps blobs newer than its start (the margin for other hosts) and,
# past it, deletes exactly the unreferenced objects; --blobs and the config
# file's blobs key select the bucket as CKPT_BLOBS does.
set -euo pipefail
. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
. "$E2E_DIR/store_lib.sh"
. "$E2E_DIR/ceph_lib.sh"

ceph_start
export CKPT_S3_BACKOFF_MS=10 CKPT_S3_MULTIPART_MB=8
expect_status 0 "$ckpt" s3 mb s3://ckpt-store
export CKPT_BLOBS=s3://ckpt-store/team/a
objects() { "$ckpt" s3 ls s3://ckpt-store/team/a/ | wc -l; }

gen qwen2 "$work/src" --scale 8 --layers 2 --shard-mb 1
# A tensor above the multipart threshold: the embeddings, 16 MB in bf16.
gen llama "$work/big" --scale 8 --layers 1 --shard-mb 0

note "import into the bucket"
export CKPT_HOME=$work/h
expect_status 0 "$ckpt" import "$work/src" --repo org/qwen
[ -z "$(find "$CKPT_HOME/blobs" -type f)" ] || fail "blobs landed in CKPT_HOME/blobs: $(find "$CKPT_HOME/blobs" -type f | head -3)"
n_obj=$(objects)
[ "$n_obj" -gt 10 ] || fail "only $n_obj objects in the bucket"
[ "$(du_field blobs)" = "$n_obj" ] || fail "du counts $(du_field blobs) blobs, the bucket holds $n_obj"
CKPT_HOME=$work/local CKPT_BLOBS= expect_status 0 "$ckpt" import "$work/src" --repo org/qwen
[ "$(find "$work/local/blobs" -type f | wc -l)" = "$n_obj" ] || fail "a local store of the same import has other blobs"
expect_status 0 "$ckpt" import "$work/big" --repo org/big
tmp_empty "import"

note "pull: folder, tar, and from a fresh home (everything from the bucket)"
expect_status 0 "$ckpt" pull org/qwen -o "$work/p1"
same_tree "$work/src" "$work/p1" "pull of org/qwen"
expect_status 0 "$ckpt" pull org/big -o "$work/p2.tar" --format tar
untar "$work/p2.tar" "$work/p2"
same_tree "$work/big" "$work/p2" "tar pull of org/big"
rm -rf "$CKPT_HOME/blob-cache"
expect_status 0 "$ckpt" convert org/qwen --layout neuron --tp 2
expect_status 0 "$ckpt" pull org/qwen:neuron-tp2 --rank 1 -o "$work/r1"
CKPT_HOME=$work/local CKPT_BLOBS= expect_status 0 "$ckpt" convert org/qwen --layout neuron --tp 2
CKPT_HOME=$work/local CKPT_BLOBS= expect_status 0 "$ckpt" pull org/qwen:neuron-tp2 --rank 1 -o "$work/r1-local"
same_tree "$work/r1-local" "$work/r1" "rank 1 of a layout converted in the store"
tmp_empty "pull"

note "import again: nothing uploaded"
expect_status 0 "$ckpt" import "$work/src" --repo org/qwen
[ "$(objects)" = "$(du_field blobs)" ] || fail "objects and du disagree after a second import"

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
note "ceph: $(ceph_rss_mb) MB resident"
