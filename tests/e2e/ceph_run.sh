#!/usr/bin/env bash
# ceph_run.sh — runs e2e tests with the store's blobs in a bucket of a
# throw-away Ceph RGW (ceph_lib.sh), to see how far the local store's tests
# get against the S3 backend:
#
#   CKPT_BIN=build/san/ckpt tests/e2e/ceph_run.sh test_store [test_name ...]
#
# One cluster, one bucket; each test gets CKPT_BLOBS=s3://ckpt-e2e/<name>
# and the AWS_* variables, and runs through run.sh as usual. Not part of
# `make test` (the local tests' checks of CKPT_HOME/blobs itself, such as
# verify flipping a byte in a blob file, do not apply to a bucket).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${CKPT_BIN:?set CKPT_BIN to the ckpt binary}"
CKPT_BIN=$(cd "$(dirname "$CKPT_BIN")" && pwd)/$(basename "$CKPT_BIN")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-ceph-run.XXXXXX")
export E2E_DIR=$here E2E_WORK=$scratch
. "$here/lib.sh"
. "$here/ceph_lib.sh"
drop_scratch() { rm -rf "$scratch"; }
e2e_cleanups+=(drop_scratch) # after ceph_stop (added by ceph_lib.sh)
ceph_start
export CKPT_S3_BACKOFF_MS=10
"$ckpt" s3 mb s3://ckpt-e2e >/dev/null || fail "cannot create the bucket"
rc=0
for t in "$@"; do
    CKPT_BLOBS=s3://ckpt-e2e/${t%.sh} "$here/run.sh" "$t" || rc=1
done
exit $rc
