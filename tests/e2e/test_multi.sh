#!/usr/bin/env bash
# test_multi.sh — several daemons with separate homes sharing one PostgreSQL
# (the catalog and the queue: pg_lib.sh) and one bucket on a real Ceph RGW
# (the blobs: ceph_lib.sh), as on several hosts. One server of each for every
# case:
#
# 1. A checkpoint imported through home A is served by daemon B's HTTP API
#    (/v1/checkpoints) and Hub API (/api/models, /resolve: every file
#    byte-compared with the source), and pulled through home C.
# 2. Jobs spread: three jobs held at once run on the three daemons.
# 3. kill -9 of a daemon mid-job (crash point daemon.spawned, right after its
#    worker started a convert): its lease is reaped by another daemon, which
#    runs the convert again — one job (attempt 2), one layout in the catalog,
#    byte-identical to the same convert in a local SQLite store.
# 4. gc on one home while an import through another is stopped between its
#    uploads (SIG STOP at blob.published: leased, not committed): every blob
#    of that import stays; a removed checkpoint's blobs stay while another
#    host holds an unexpired lease on them and go once it expired; the import
#    then completes and verifies clean.
# 5. A process whose blobs are elsewhere (its own blobs/ folder) is refused by
#    the database.
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
. "$E2E_DIR/store_lib.sh"
. "$E2E_DIR/pg_lib.sh"
. "$E2E_DIR/ceph_lib.sh"
E2E_LOGS=("$work/d*.log" "$work/pg/server.log")

daemons=()
on_exit() {
    local p
    for p in "${daemons[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    pg_stop
}

stopped() { [ "$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null)" = T ]; }
# hdir NAME: the home of host NAME. They nest (a/b/c/d) only because a noop
# job's until_file must be inside its daemon's home: a file in the innermost
# is inside every one. Nothing of a home is shared with another.
hdir() {
    case $1 in
    a) echo "$work/ha" ;;
    b) echo "$work/ha/hb" ;;
    c) echo "$work/ha/hb/hc" ;;
    d) echo "$work/ha/hb/hc/hd" ;;
    *) echo "$work/h$1" ;;
    esac
}
hold=$work/ha/hb/hc/hd # hold files: inside every daemon's home
# home NAME CMD...: CMD with CKPT_HOME set to host NAME's home.
home() {
    local n=$1
    shift
    CKPT_HOME=$(hdir "$n") "$@"
}
# start NAME [env...]: a daemon with one worker on home NAME; its pid in $NAME_pid, its URL in $NAME_url.
start() {
    local name=$1
    shift
    local h
    h=$(hdir "$name")
    mkdir -p "$h"
    rm -f "$h/serve.url"
    env CKPT_HOME="$h" "$@" "$ckpt" serve --listen 127.0.0.1:0 --workers 1 >>"$work/d$name.log" 2>&1 &
    local pid=$!
    daemons+=("$pid")
    printf -v "${name}_pid" '%s' "$pid"
    # serve.url, not the log line: the daemon logs its URL, then writes the
    # file (fsync, rename), which a loaded machine may not have done yet.
    wait_until 60 "daemon $name to start" test -s "$h/serve.url"
    printf -v "${name}_url" '%s' "$(cat "$h/serve.url")"
}
objects() { "$ckpt" s3 ls s3://ckpt-multi/blobs/ 2>/dev/null | wc -l; }
in_bucket() { "$ckpt" s3 head "s3://ckpt-multi/blobs/${1:0:2}/${1:2}" >/dev/null 2>&1; }

pg_start
ceph_start
export CKPT_DB=$pg_url CKPT_BLOBS=s3://ckpt-multi/blobs CKPT_S3_BACKOFF_MS=10
unset CKPT_SERVER CKPT_HOME
expect_status 0 "$ckpt" s3 mb s3://ckpt-multi
note "PostgreSQL on $pg_port, RGW on $ceph_port"

# ---- 1. imported through A, served by B, pulled through C ----
gen qwen2 "$work/src" --scale 32 --layers 2 --shard-mb 1
expect_status 0 home a "$ckpt" import "$work/src" --repo org/m
[ -z "$(ls -A "$(hdir a)/blobs" 2>/dev/null)" ] || fail "home A kept blobs locally"
start a
start b
start c
(cd "$work/src" && find . -type f -printf '%P\n') | sort >"$work/files"
while read -r f; do
    code=$(curl -s -o "$work/served" -w '%{http_code}' "$b_url/org/m/resolve/main/$f")
    [ "$code" = 200 ] || fail "daemon B: GET /org/m/resolve/main/$f: $code"
    cmp -s "$work/served" "$work/src/$f" || fail "daemon B served other bytes for $f"
done <"$work/files"
curl -sf -o "$work/api.json" "$b_url/api/models/org/m/revision/main" || fail "daemon B: /api/models/org/m/revision/main"
"$py" -S -c '
import json, sys
names = sorted(s["rfilename"] for s in json.load(open(sys.argv[1]))["siblings"])
want = open(sys.argv[2]).read().split()
sys.exit(names != want and f"siblings {names}, want {want}")' "$work/api.json" "$work/files" ||
    fail "daemon B's Hub API lists other files: $(head -c 400 "$work/api.json")"
curl -sf -o "$work/ck.json" "$b_url/v1/checkpoints/org%2Fm@main" || fail "daemon B: /v1/checkpoints/org%2Fm@main"
home a "$ckpt" show org/m@main --json >"$work/show.json"
"$py" -S -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
sys.exit(a != b and "differ")' "$work/ck.json" "$work/show.json" ||
    fail "daemon B's /v1/checkpoints differs from ckpt show through home A"
expect_status 0 home c "$ckpt" pull org/m -o "$work/pulled"
same_tree "$work/src" "$work/pulled" "pull through home C"
note "1. imported through home A; daemon B served every file, home C pulled it"

# ---- 2. jobs spread across the daemons ----
holds=()
for i in 1 2 3; do
    mkdir -p "$hold"
    h=$(home a "$ckpt" submit noop --until-file "$hold/go$i")
    wait_until 60 "job $h to run" running_pid "$h"
    holds+=("$h")
done
parents=$(for h in "${holds[@]}"; do parent_of "$(col "$h" worker_pid)"; done | sort -u | tr '\n' ' ')
[ "$(echo "$parents" | wc -w)" = 3 ] || fail "jobs ${holds[*]} ran under daemons $parents (a $a_pid, b $b_pid, c $c_pid)"
touch "$hold/go1" "$hold/go2" "$hold/go3"
for h in "${holds[@]}"; do wait_until 60 "job $h to succeed" state_is "$h" succeeded; done
note "2. three held jobs ran on three daemons ($parents)"

# ---- 3. kill -9 of a daemon mid-convert ----
stop_daemon "$a_pid" "$work/da.log"
hb=$(home b "$ckpt" submit noop --until-file "$hold/go4")
wait_until 60 "job $hb to run" running_pid "$hb"
hc=$(home b "$ckpt" submit noop --until-file "$hold/go5")
wait_until 60 "job $hc to run" running_pid "$hc"
# B's and C's only workers are busy: the convert can only go to the daemon that dies.
env CKPT_HOME="$(hdir d)" CKPT_FAULT=daemon.spawned:1 "$ckpt" serve --listen 127.0.0.1:0 --workers 1 >>"$work/dd.log" 2>&1 &
dk_pid=$!
daemons+=("$dk_pid")
x=$(home b "$ckpt" submit convert org/m --layout neuron --tp 2)
rc=0
wait "$dk_pid" || rc=$?
[ "$rc" -eq 137 ] || fail "the daemon with CKPT_FAULT=daemon.spawned:1 exited $rc, not 137"
wpid=$(pg_psql "SELECT worker_pid FROM jobs WHERE id = $x")
[ -z "$wpid" ] || wait_until 60 "the dead daemon's worker $wpid to die with it" gone "$wpid"
touch "$hold/go4" "$hold/go5"
wait_until 60 "job $x to be finished by another daemon" state_is "$x" succeeded
[ "$(col "$x" attempt)" = 2 ] || fail "job $x: attempt $(col "$x" attempt), expected 2 (one lost lease, one run)"
[ "$(pg_psql "SELECT count(*) FROM jobs WHERE kind = 'convert'")" = 1 ] || fail "the convert job was doubled"
[ "$(pg_psql "SELECT count(*) FROM checkpoints WHERE repo = 'org/m' AND layout = 'neuron-tp2'")" = 1 ] ||
    fail "the layout is in the catalog $(pg_psql "SELECT count(*) FROM checkpoints WHERE layout = 'neuron-tp2'") times"
cat "$work/db.log" "$work/dc.log" | grep -Eq "info job.finished id=$x kind=convert" || fail "no daemon finished job $x"
expect_status 0 home d "$ckpt" pull org/m:neuron-tp2 -o "$work/tp2"
# the same convert in a store of its own (SQLite, local blobs): the same bytes
CKPT_DB= CKPT_BLOBS= CKPT_HOME=$work/local expect_status 0 "$ckpt" import "$work/src" --repo org/m
CKPT_DB= CKPT_BLOBS= CKPT_HOME=$work/local expect_status 0 "$ckpt" convert org/m --layout neuron --tp 2
CKPT_DB= CKPT_BLOBS= CKPT_HOME=$work/local expect_status 0 "$ckpt" pull org/m:neuron-tp2 -o "$work/tp2-local"
same_tree "$work/tp2-local" "$work/tp2" "the convert finished after the kill"
note "3. daemon $dk_pid killed at daemon.spawned; job $x finished on attempt 2, one layout, same bytes as a local store"

# ---- 4. gc on one home while an import through another is mid-way ----
gen qwen2 "$work/src3" --scale 32 --layers 2 --shard-mb 1 --seed 3
expect_status 0 home c "$ckpt" import "$work/src3" --repo org/o
o_id=$(pg_psql "SELECT id FROM checkpoints WHERE repo = 'org/o'")
pg_psql "CREATE TABLE t_orphans AS SELECT DISTINCT blob FROM checkpoint_blobs WHERE checkpoint_id = $o_id
         AND blob NOT IN (SELECT blob FROM checkpoint_blobs WHERE checkpoint_id <> $o_id)" >/dev/null
n_orphans=$(pg_psql "SELECT count(*) FROM t_orphans")
[ "$n_orphans" -gt 5 ] || fail "org/o has $n_orphans blobs of its own"
expect_status 0 home c "$ckpt" rm org/o
# another host writing a checkpoint over those blobs: its leases, unexpired
pg_psql "INSERT INTO blob_leases(blob, host, pid, start_time, expires_at)
         SELECT blob, 'elsewhere', 1, 1, extract(epoch FROM now()) + 600 FROM t_orphans"
gen qwen2 "$work/src2" --scale 32 --layers 2 --shard-mb 1 --seed 2
CKPT_HOME=$(hdir b) CKPT_FAULT=blob.published:3:STOP "$ckpt" import "$work/src2" --repo org/w >"$work/dimport.log" 2>&1 &
imp=$!
wait_until 60 "the import through home B to stop at its third upload" stopped "$imp"
pg_psql "SELECT blob FROM blob_leases WHERE pid = $imp AND host = '$(hostname)'" >"$work/leased"
n_up=0
while read -r b; do
    if in_bucket "$b"; then echo "$b" >>"$work/uploaded"; n_up=$((n_up + 1)); fi
done <"$work/leased"
[ "$n_up" -ge 3 ] || fail "the stopped import has $n_up leased blobs in the bucket, expected at least 3"
CKPT_GC_MARGIN_S=-86400 expect_status 0 home a "$ckpt" gc --json
while read -r b; do in_bucket "$b" || fail "gc through home A removed blob $b, which the import through B is writing"; done <"$work/uploaded"
for b in $(pg_psql "SELECT blob FROM t_orphans"); do
    in_bucket "$b" || fail "gc removed blob $b, leased by another host until $(pg_psql "SELECT max(expires_at) FROM blob_leases WHERE host = 'elsewhere'")"
done
kill -CONT "$imp"
rc=0
wait "$imp" || rc=$?
[ "$rc" -eq 0 ] || fail "the import through home B exited $rc after gc: $(tail -n 5 "$work/dimport.log")"
[ "$(pg_psql "SELECT count(*) FROM blob_leases WHERE host <> 'elsewhere'")" = 0 ] || fail "leases left after the import committed"
expect_status 0 home a "$ckpt" verify org/w
expect_status 0 home c "$ckpt" pull org/w -o "$work/pulled-w"
same_tree "$work/src2" "$work/pulled-w" "the import that gc ran beside"
# the other host's leases expire: then its blobs are garbage
pg_psql "UPDATE blob_leases SET expires_at = extract(epoch FROM now()) - 1 WHERE host = 'elsewhere'"
before=$(objects)
CKPT_GC_MARGIN_S=-86400 expect_status 0 home b "$ckpt" gc --json
removed=$(jget blobs_removed <"$work/out")
[ "$(jget leases_dropped <"$work/out")" -ge "$n_orphans" ] || fail "gc dropped $(jget leases_dropped <"$work/out") leases, expected the $n_orphans expired ones"
for b in $(pg_psql "SELECT blob FROM t_orphans"); do in_bucket "$b" && fail "gc kept blob $b after its lease expired"; done
[ "$removed" -ge "$n_orphans" ] && [ "$(objects)" = $((before - removed)) ] ||
    fail "gc removed $removed (orphans $n_orphans), objects $before -> $(objects)"
expect_status 0 home c "$ckpt" verify
note "4. gc beside a stopped import kept its $n_up uploaded blobs and $n_orphans blobs leased by another host; after expiry removed $removed"

# ---- 5. a process with blobs of its own is refused ----
CKPT_BLOBS= expect_status 1 home e "$ckpt" ls
grep -q "have their blobs in s3://ckpt-multi/blobs; this process's blobs are $(hostname):" "$work/err" ||
    fail "local blobs on a shared database: $(cat "$work/err")"
note "5. a process with local blobs is refused"
stop_daemon "$b_pid" "$work/db.log"
stop_daemon "$c_pid" "$work/dc.log"
daemons=()
