#!/usr/bin/env bash
# pg_run.sh — runs e2e tests with the catalog and the queue on a throw-away
# PostgreSQL (pg_lib.sh), to see how far the local store's tests get on it:
#
#   CKPT_BIN=build/san/ckpt tests/e2e/pg_run.sh test_store [test_name ...]
#
# One server; each test gets a database of its own (CKPT_DB=.../<name>) and
# runs through run.sh as usual. Not part of `make test`: a database with local
# blobs serves one CKPT_HOME (catalog_claim_blobs), so a test that opens a
# second home on purpose is refused there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${CKPT_BIN:?set CKPT_BIN to the ckpt binary}"
CKPT_BIN=$(cd "$(dirname "$CKPT_BIN")" && pwd)/$(basename "$CKPT_BIN")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-pg-run.XXXXXX")
export E2E_DIR=$here E2E_WORK=$scratch
. "$here/lib.sh"
. "$here/pg_lib.sh"
on_exit() { pg_stop; }
drop_scratch() { rm -rf "$scratch"; }
e2e_cleanups+=(drop_scratch)
pg_start
rc=0
for t in "$@"; do
    name=${t%.sh}
    as_pg "$pg_bin/createdb" -h "$pg_dir" -p "$pg_port" -U ckpt "$name" || fail "createdb $name failed"
    CKPT_DB=postgresql://ckpt@127.0.0.1:$pg_port/$name "$here/run.sh" "$t" || rc=1
done
exit $rc
