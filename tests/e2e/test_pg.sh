#!/usr/bin/env bash
# test_pg.sh — the catalog, the job queue and schedules on a real PostgreSQL 15
# (pg_lib.sh: initdb in the scratch folder, 127.0.0.1, a free port).
#
# 1. The queue's unit tests (tests/unit/service/test_queue.c) against the
#    server: CKPT_DB=postgresql://... runs every case on it, each from an
#    empty database (so the schema/pg/ migrations run each time); and the SQL
#    layer's (test_db.c: bytes through bytea, a batch of writes in pipeline
#    mode over two syncs, a unique violation inside a batch).
# 2. Several processes migrate at once: one set of tables, each migration
#    recorded once (pg_advisory_xact_lock); a database with a migration this
#    binary does not know is refused.
# 3. Two daemons (separate processes and ports, --workers 1 each) share one
#    database: with one daemon's only worker held by a job, the other daemon
#    takes the next one — jobs spread across both, each run once.
# 4. kill -9 of a daemon mid-job (the crash point daemon.spawned, right after
#    its worker started): the other daemon sees the lease's owner dead, puts
#    the job back and finishes it — one job, succeeded on its second attempt,
#    no worker of the dead daemon left.
# 5. A schedule due with both daemons looking fires once: one sync job, one
#    schedule.fired line across both logs, next_run_at moved on.
#    5b. The dashboard's queue endpoints read PostgreSQL: the attempts of the
#    job of step 4 (the lost one, then the one that succeeded), counts per
#    state, per-minute figures (the trigger's jobs.succeeded, the daemon's
#    queue.depth), and a schedule paused through the API.
#    5c. A daemon that stops (SIGSTOP, a crash point) inside the transaction
#    renewing a job's lease: the server ends its idle session
#    (CKPT_PG_IDLE_TX_TIMEOUT_S), which frees the job's row; the other daemon
#    runs the job again; resumed, the first daemon logs job.not_ours for its
#    worker's end and records nothing.
# 6. PostgreSQL killed -9 (every process of the server) while a convert's
#    worker is stopped right before committing its layout, and a job of the
#    other daemon runs: the commit fails, the daemon lives, says once which
#    database it lost (no password) and keeps the job's end until the server
#    is back (same port and folder); then attempt 1 counts as failed, attempt
#    2 (claimed after the restart) commits one layout that pulls, and the held
#    job ends once.
# 7. A process whose blobs are elsewhere (another home's blobs/ folder) is
#    refused, and a bad CKPT_DB too.
# 8. gc beside a transaction that holds blob_leases as a writer's lease does
#    (a psql session of the test, left open: a writer stopped mid-lease):
#    gc waits CKPT_GC_LOCK_TIMEOUT_S, not for ever, and fails saying another
#    process holds blob leases, with nothing deleted; once the session ends,
#    gc deletes the unreferenced blob; a gc stopped inside its transaction
#    (gc.blob_removed) keeps its session past CKPT_PG_IDLE_TX_TIMEOUT_S and
#    commits when resumed.
# The daemons here share one CKPT_HOME (its blobs/ folder); test_multi.sh runs
# daemons with homes of their own over a bucket.
set -euo pipefail

. "${E2E_DIR:?run me through tests/e2e/run.sh}/lib.sh"
. "$E2E_DIR/pg_lib.sh"
E2E_LOGS=("$work/d*.log" "$work/pg/server.log")

unit=$(dirname "$ckpt")/tests/test_queue
[ -x "$unit" ] || fail "$unit is not built (make BUILD=... \$BUILD/tests/test_queue)"

daemons=()
psql_pid=
on_exit() {
    local p
    for p in "${daemons[@]}" $psql_pid; do kill -9 "$p" 2>/dev/null || true; done
    pg_stop
}

# start NAME [env...]: a daemon with one worker on the shared home; its pid in $NAME_pid.
start() {
    local name=$1
    shift
    env "$@" "$ckpt" serve --listen 127.0.0.1:0 --workers 1 >>"$work/$name.log" 2>&1 &
    local pid=$!
    daemons+=("$pid")
    printf -v "${name}_pid" '%s' "$pid"
    wait_until 60 "daemon $name to start" grep -q "ckpt serve: http://" "$work/$name.log"
}
pg_start
note "PostgreSQL up on port $pg_port"
export CKPT_DB=$pg_url CKPT_HOME=$work/home
unset CKPT_SERVER

# ---- 1. the queue's unit tests on the server ----
"$unit" >"$work/unit.log" 2>&1 || fail "test_queue on PostgreSQL: $(grep -E 'FAILED|ERROR|LINE' "$work/unit.log" | head -10)"
ncases=$(sed -n 's/^\[==========\] Running \([0-9]*\) test.*/\1/p' "$work/unit.log")
[ -n "$ncases" ] && grep -q "PASSED  \] $ncases test" "$work/unit.log" || fail "test_queue on PostgreSQL: $(tail -n 3 "$work/unit.log")"
"$(dirname "$ckpt")/tests/test_db" >"$work/unit.log" 2>&1 || fail "test_db on PostgreSQL: $(grep -E 'FAILED|ERROR|LINE' "$work/unit.log" | head -10)"
note "1. test_queue and test_db (bytea, batches) pass on PostgreSQL"

# ---- 2. migrations from several processes at once ----
pg_psql "DROP TABLE IF EXISTS job_logs, job_attempts, stats, jobs, schedules, ckpt_migrations, ckpt_meta,
         verify_checkpoints, verify_runs, refs, blob_leases, checkpoint_blobs, tensors, files, checkpoints CASCADE;
         DROP FUNCTION IF EXISTS ckpt_job_attempt_ended, ckpt_job_ended_stats"
for i in 1 2 3 4; do "$ckpt" jobs --json >"$work/mig.$i" 2>&1 & done
wait
for i in 1 2 3 4; do [ "$(cat "$work/mig.$i")" = "[]" ] || fail "ckpt jobs $i while migrating: $(head -c 300 "$work/mig.$i")"; done
npg=$(ls "$E2E_DIR"/../../schema/pg/[0-9]*.sql | wc -l) # every one of this tree's PostgreSQL migrations, once
[ "$(pg_psql "SELECT count(*), count(DISTINCT name) FROM ckpt_migrations")" = "$npg|$npg" ] ||
    fail "migrations recorded: $(pg_psql "SELECT name FROM ckpt_migrations")"
[ "$(pg_psql "SELECT value FROM ckpt_meta WHERE key = 'blobs'")" = "$(hostname):$(realpath "$CKPT_HOME")/blobs" ] ||
    fail "the database does not record where its blobs are: $(pg_psql "SELECT * FROM ckpt_meta")"
pg_psql "INSERT INTO ckpt_migrations VALUES ('999_future.sql', 0)"
expect_status 1 "$ckpt" jobs
grep -q "has migration 999_future.sql, which this ckpt does not know; use a newer ckpt" "$work/err" ||
    fail "a newer database: $(cat "$work/err")"
pg_psql "DELETE FROM ckpt_migrations WHERE name = '999_future.sql'"
note "2. four processes migrated once; a database of a newer ckpt is refused"

# ---- 3. two daemons share the queue ----
start da
start db
hold1=$("$ckpt" submit noop --until-file "$CKPT_HOME/go1")
wait_until 60 "job $hold1 to run" running_pid "$hold1"
hold2=$("$ckpt" submit noop --until-file "$CKPT_HOME/go2")
wait_until 60 "job $hold2 to run" running_pid "$hold2"
p1=$(parent_of "$(col "$hold1" worker_pid)")
p2=$(parent_of "$(col "$hold2" worker_pid)")
[ "$p1" != "$p2" ] && [[ " $da_pid $db_pid " == *" $p1 "* ]] && [[ " $da_pid $db_pid " == *" $p2 "* ]] ||
    fail "jobs $hold1 and $hold2 ran under $p1 and $p2 (daemons $da_pid, $db_pid)"
touch "$CKPT_HOME/go1" "$CKPT_HOME/go2"
wait_until 60 "job $hold1 to succeed" state_is "$hold1" succeeded
wait_until 60 "job $hold2 to succeed" state_is "$hold2" succeeded
for j in "$hold1" "$hold2"; do [ "$(col "$j" attempt)" = 1 ] || fail "job $j ran $(col "$j" attempt) times"; done
note "3. jobs $hold1 and $hold2 ran on daemons $p1 and $p2"

# ---- 4. kill -9 of a daemon mid-job ----
stop_daemon "$da_pid" "$work/da.log"
hold3=$("$ckpt" submit noop --until-file "$CKPT_HOME/go3")
wait_until 60 "job $hold3 to run on db" running_pid "$hold3"
# db's only worker is busy: the next job can only go to the daemon that dies.
env CKPT_FAULT=daemon.spawned:1 "$ckpt" serve --listen 127.0.0.1:0 --workers 1 >>"$work/dk.log" 2>&1 &
dk_pid=$!
daemons+=("$dk_pid")
x=$("$ckpt" submit noop --sleep-ms 1)
rc=0
wait "$dk_pid" || rc=$?
[ "$rc" -eq 137 ] || fail "the daemon with CKPT_FAULT=daemon.spawned:1 exited $rc, not 137"
wpid=$(pg_psql "SELECT worker_pid FROM jobs WHERE id = $x")
[ -z "$wpid" ] || wait_until 60 "the dead daemon's worker $wpid to die with it" gone "$wpid"
touch "$CKPT_HOME/go3"
wait_until 60 "job $x to be finished by the other daemon" state_is "$x" succeeded
expect_status 0 "$ckpt" show "$x"
"$py" -S -c 'import json, sys; j = json.load(open(sys.argv[1])); assert j["attempt"] == 2 and j["state"] == "succeeded", j' "$work/out" ||
    fail "job $x: $(cat "$work/out"), expected attempt 2 (one lost lease, one run)"
[ "$(pg_psql "SELECT count(*) FROM jobs WHERE kind = 'noop' AND args LIKE '%sleep_ms%'")" = 1 ] || fail "job $x was doubled"
grep -Eq "info job.finished id=$x kind=noop" "$work/db.log" || fail "daemon db did not finish job $x"
note "4. daemon $dk_pid killed at daemon.spawned; daemon db finished job $x (attempt 2)"

# ---- 5. a schedule fires once across daemons ----
start da
export HF_ENDPOINT=http://127.0.0.1:9 # the sync job itself is not under test here (cancelled below)
sid=$("$ckpt" sync add org/tiny --every 1h)
queued_sync() { [ -n "$(pg_psql "SELECT last_job_id FROM schedules WHERE id = $sid")" ]; }
wait_until 60 "schedule $sid to queue its sync job" queued_sync
sj=$(pg_psql "SELECT last_job_id FROM schedules WHERE id = $sid")
fired() { cat "$work/da.log" "$work/db.log" | grep -c "schedule.fired schedule=$sid " || true; }
fired_once() { [ "$(fired)" -ge 1 ]; }
wait_until 60 "a schedule.fired line" fired_once
# The job was queued and next_run_at moved an hour on in one transaction:
# whichever daemon looks later finds the schedule not due.
[ "$(fired)" -eq 1 ] || fail "schedule $sid fired $(fired) times"
[ "$(pg_psql "SELECT count(*) FROM jobs WHERE kind = 'sync'")" = 1 ] || fail "more than one sync job"
[ "$(pg_psql "SELECT next_run_at > extract(epoch FROM now()) + 3000 FROM schedules WHERE id = $sid")" = t ] ||
    fail "next_run_at did not move an hour on"
expect_status 0 "$ckpt" cancel "$sj"
sync_ended() { [ "$(pg_psql "SELECT state IN ('succeeded', 'failed', 'cancelled') FROM jobs WHERE id = $sj")" = t ]; }
wait_until 60 "sync job $sj to end" sync_ended
note "5. schedule $sid fired once"

# ---- 5b. the dashboard's queue endpoints on PostgreSQL ----
url=$(grep -o 'ckpt serve: http://[0-9.:]*' "$work/db.log" | head -n 1 | cut -d' ' -f3)
api() { curl -s -o "$work/api.json" -w '%{http_code}' -X "$1" "$url$2"; }
[ "$(api GET "/v1/jobs/$x")" = 200 ] && "$py" -S -c '
import json, sys
at = json.load(open(sys.argv[1]))["attempts"]
sys.exit(not (len(at) == 2 and at[0]["attempt"] == 1 and at[0]["outcome"] != "succeeded"
              and at[1]["attempt"] == 2 and at[1]["outcome"] == "succeeded") and f"attempts {at}")' "$work/api.json" ||
    fail "attempts of job $x: $(cat "$work/api.json")"
[ "$(api GET "/v1/jobs/counts?q=noop")" = 200 ] && "$py" -S -c '
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(not (c["all"] == int(sys.argv[2]) and c["succeeded"] == int(sys.argv[3])) and f"counts {c}")' "$work/api.json" \
    "$(pg_psql "SELECT count(*) FROM jobs WHERE kind = 'noop'")" \
    "$(pg_psql "SELECT count(*) FROM jobs WHERE kind = 'noop' AND state = 'succeeded'")" ||
    fail "GET /v1/jobs/counts: $(cat "$work/api.json")"
[ "$(api GET "/v1/stats?hours=1")" = 200 ] && "$py" -S -c '
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
tot = lambda n, k: sum(r["value"] for r in rows if r["name"] == n and r["kind"] == k)
sys.exit(not (tot("jobs.succeeded", "noop") >= 3 and any(r["name"] == "queue.depth" for r in rows)) and f"rows {rows}")' \
    "$work/api.json" || fail "GET /v1/stats: $(cat "$work/api.json")"
[ "$(api POST "/v1/schedules/$sid/pause")" = 200 ] && grep -q '"paused": *true' "$work/api.json" ||
    fail "pause: $(cat "$work/api.json")"
[ "$(pg_psql "SELECT paused FROM schedules WHERE id = $sid")" = 1 ] || fail "the pause is not in PostgreSQL"
"$ckpt" sync ls --json | grep -q '"paused": *true' || fail "sync ls does not show the pause"
note "5b. attempts, counts, per-minute figures and a paused schedule on PostgreSQL"

# ---- 5c. a daemon frozen inside a transaction, its lease running out ----
# With db's only worker held and da stopped, daemon dd runs job y and stops
# itself (SIGSTOP) at its first lease renewal, after the UPDATE and before
# the COMMIT (the crash point queue.renew.before_commit): y's row is locked
# and its lease runs out. The server ends dd's session after dd's
# CKPT_PG_IDLE_TX_TIMEOUT_S, which releases the lock (else db's reap of y
# would wait on it for ever); db, freed, runs y again. Resumed, dd connects
# again, and its worker's end is not the job's: dd logs job.not_ours.
stop_daemon "$da_pid" "$work/da.log"
hold5=$("$ckpt" submit noop --until-file "$CKPT_HOME/go5h")
wait_until 60 "job $hold5 to run on db" running_pid "$hold5"
start dd CKPT_FAULT=queue.renew.before_commit:1:STOP CKPT_PG_IDLE_TX_TIMEOUT_S=2
y=$("$ckpt" submit noop --until-file "$CKPT_HOME/go5")
wait_until 60 "job $y to run" running_pid "$y"
w1=$(col "$y" worker_pid)
[ "$(parent_of "$w1")" = "$dd_pid" ] || fail "job $y's worker $w1 is not daemon dd's ($dd_pid)"
stopped() { [ "$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null)" = T ]; }
wait_until 60 "daemon dd to stop inside its renewal of job $y's lease" stopped "$dd_pid"
idle_ended() { grep -q "terminating connection due to idle-in-transaction timeout" "$work/pg/server.log"; }
wait_until 60 "the server to end dd's session, idle in its transaction" idle_ended
touch "$CKPT_HOME/go5h"
wait_until 60 "job $hold5 to succeed" state_is "$hold5" succeeded
rerun() { [ "$(col "$y" "attempt = 2 AND state = 'running' AND worker_pid > 0 AND worker_pid <> $w1")" = t ]; }
wait_until 60 "job $y to run again on daemon db" rerun
[ "$(parent_of "$(col "$y" worker_pid)")" = "$db_pid" ] || fail "job $y's second run is not daemon db's"
kill -CONT "$dd_pid"
touch "$CKPT_HOME/go5"
wait_until 60 "job $y to succeed" state_is "$y" succeeded
wait_until 60 "the first worker $w1 to end" gone "$w1"
wait_until 60 "daemon dd to say job $y is no longer its own" grep -q "warn job.not_ours id=$y " "$work/dd.log"
grep -q "job.finished id=$y " "$work/dd.log" && fail "daemon dd recorded the end of job $y, which daemon db ran again"
# a daemon commits a job's end before it logs it: the line may come after the state
wait_until 60 "daemon db to log the end of job $y" grep -q "info job.finished id=$y kind=noop" "$work/db.log"
[ "$(pg_psql "SELECT count(*) FROM job_attempts WHERE job_id = $y AND outcome = 'succeeded'")" = 1 ] ||
    fail "job $y: $(pg_psql "SELECT attempt, outcome FROM job_attempts WHERE job_id = $y")"
stop_daemon "$dd_pid" "$work/dd.log"
note "5c. daemon dd stopped inside a lease renewal of job $y: the server ended its session, daemon db ran the job again; dd logged job.not_ours"

# ---- 6. kill -9 of PostgreSQL under a job about to commit ----
# Daemon db's only worker is held by a job; daemon dc (its URL with a password,
# which no line may show) takes a convert whose worker stops itself right
# before the transaction that commits the layout. The server is killed -9,
# the worker resumed: its commit fails and so does recording its end, until
# the server is back; then the attempt counts as failed, the retry commits
# the layout once, and the held job of the other daemon ends once too.
expect_status 0 "$ckpt" gen-model qwen2 "$work/src" --scale 32 --layers 2 --shard-mb 1
expect_status 0 "$ckpt" import "$work/src" --repo org/m
hold4=$("$ckpt" submit noop --until-file "$CKPT_HOME/go4")
wait_until 60 "job $hold4 to run on db" running_pid "$hold4"
secret_url="postgresql://ckpt:Sekr1tPw@127.0.0.1:$pg_port/ckpt"
start dc CKPT_DB="$secret_url" CKPT_FAULT_WORKER=catalog.before_commit:3:STOP CKPT_FAULT_ONCE="$work/stop.once"
x=$("$ckpt" submit convert org/m --layout neuron --tp 2)
wait_until 60 "job $x to run" running_pid "$x"
wpid=$(col "$x" worker_pid)
wait_until 60 "job $x's worker to stop before its commit" stopped "$wpid"
# the worker's third commit is the layout's: its blob's lease (the second) is in, the layout is not
[ "$(pg_psql "SELECT count(*) FROM blob_leases WHERE pid = $wpid")" -ge 1 ] || fail "job $x's worker stopped before leasing its blob"
[ "$(pg_psql "SELECT count(*) FROM checkpoints WHERE layout = 'neuron-tp2'")" = 0 ] || fail "the layout is visible before its commit"
pg_kill9
kill -CONT "$wpid"
wait_until 60 "job $x's worker to end" gone "$wpid"
pending() { grep -q "job.end_pending id=$x " "$work/dc.log"; }
wait_until 60 "daemon dc to say it cannot record job $x's end" pending
kill -0 "$dc_pid" && kill -0 "$db_pid" || fail "a daemon died with the database"
grep -q "error db.lost db=postgresql://ckpt@127.0.0.1:$pg_port/ckpt " "$work/dc.log" ||
    fail "daemon dc did not say which database it lost: $(grep -v "^info" "$work/dc.log" | tail -n 5)"
pg_restart
wait_until 60 "job $x to succeed after the restart" state_is "$x" succeeded
grep -q "info db.back db=postgresql://ckpt@127.0.0.1:$pg_port/ckpt " "$work/dc.log" || fail "daemon dc did not say the database is back"
[ "$(col "$x" attempt)" = 2 ] || fail "job $x: attempt $(col "$x" attempt), expected 2 (the commit lost with the server, one run)"
[ "$(pg_psql "SELECT count(*) FROM job_attempts WHERE job_id = $x AND attempt = 1 AND outcome <> 'succeeded'")" = 1 ] &&
    [ "$(pg_psql "SELECT count(*) FROM job_attempts WHERE job_id = $x")" = 2 ] ||
    fail "job $x's attempts: $(pg_psql "SELECT attempt, outcome, error FROM job_attempts WHERE job_id = $x")"
[ "$(pg_psql "SELECT count(*) FROM checkpoints WHERE repo = 'org/m' AND layout = 'neuron-tp2'")" = 1 ] ||
    fail "the layout is in the catalog $(pg_psql "SELECT count(*) FROM checkpoints WHERE layout = 'neuron-tp2'") times"
[ "$(pg_psql "SELECT count(*) FROM jobs WHERE kind = 'convert'")" = 1 ] || fail "the convert job was doubled"
expect_status 0 "$ckpt" pull org/m:neuron-tp2 -o "$work/tp2"
touch "$CKPT_HOME/go4"
wait_until 60 "job $hold4 to succeed" state_is "$hold4" succeeded
[ "$(col "$hold4" attempt)" = 1 ] || fail "the held job $hold4 ran $(col "$hold4" attempt) times across the server's loss"
! grep -rq Sekr1tPw "$work"/d*.log || fail "the password is in a daemon's log"
note "6. PostgreSQL killed -9 under a commit: job $x failed attempt 1, attempt 2 committed one layout; held job $hold4 ran once"
stop_daemon "$dc_pid" "$work/dc.log"
stop_daemon "$db_pid" "$work/db.log"
daemons=()

# ---- 7. refusals ----
expect_status 1 env CKPT_HOME="$work/other" "$ckpt" jobs
grep -q "have their blobs in $(hostname):$(realpath "$CKPT_HOME")/blobs; this process's blobs are $(hostname):$(realpath "$work/other")/blobs" "$work/err" ||
    fail "another home's blobs: $(cat "$work/err")"
expect_status 1 env CKPT_DB=mysql://u:secret@h/db "$ckpt" jobs
grep -q "expected a postgresql:// URL" "$work/err" && ! grep -q secret "$work/err" || fail "bad CKPT_DB: $(cat "$work/err")"
expect_status 1 env CKPT_DB="postgresql://ckpt:secret@127.0.0.1:$pg_port/nosuchdb" "$ckpt" jobs
grep -q "nosuchdb" "$work/err" && ! grep -q secret "$work/err" || fail "unknown database: $(cat "$work/err")"
note "7. refusals"

# ---- 8. gc waits a bounded time for a writer's lease transaction ----
# The session takes what a lease's INSERT takes (ROW EXCLUSIVE on
# blob_leases) and stays in its transaction; gc's LOCK TABLE conflicts.
junk=$CKPT_HOME/blobs/ff/$(printf 'f%.0s' $(seq 62)) # a blob no checkpoint references
mkdir -p "${junk%/*}"
echo junk >"$junk"
mkfifo "$work/psql.in"
"$pg_bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U ckpt -d ckpt <"$work/psql.in" >"$work/psql.out" 2>&1 &
psql_pid=$!
exec 7>"$work/psql.in"
echo "BEGIN; LOCK TABLE blob_leases IN ROW EXCLUSIVE MODE; SELECT 'held';" >&7
wait_until 60 "the psql session to hold blob_leases" grep -q held "$work/psql.out"
CKPT_GC_LOCK_TIMEOUT_S=0.3 expect_status 1 "$ckpt" gc
grep -q "another process holds blob leases on postgresql://ckpt@127.0.0.1:$pg_port/ckpt; try again" "$work/err" ||
    fail "gc beside an open lease transaction: $(cat "$work/err")"
[ -e "$junk" ] || fail "a gc that did not get its lock removed a blob"
echo "COMMIT;" >&7
exec 7>&-
wait "$psql_pid" || fail "the psql session failed: $(cat "$work/psql.out")"
psql_pid=
expect_status 0 "$ckpt" gc
[ ! -e "$junk" ] || fail "gc after the lease transaction ended kept an unreferenced blob: $(cat "$work/out")"
note "8. gc beside an open lease transaction failed after CKPT_GC_LOCK_TIMEOUT_S, deleting nothing; then it ran"

# ---- 8b. a gc frozen inside its transaction keeps its lock ----
# gc stops itself (SIGSTOP) right after deleting a blob, its transaction
# open, with CKPT_PG_IDLE_TX_TIMEOUT_S=1: its session stays (gc's own
# transaction is exempt, since its lock on blob_leases is what keeps a
# writer from reusing a blob it is deleting), idle in its transaction well
# past the timeout; resumed, gc commits.
echo junk >"$junk"
CKPT_FAULT=gc.blob_removed:1:STOP CKPT_PG_IDLE_TX_TIMEOUT_S=1 "$ckpt" gc >"$work/gc.out" 2>&1 &
gpid=$!
daemons+=("$gpid") # killed on the way out
wait_until 60 "gc to stop after deleting a blob" stopped "$gpid"
[ ! -e "$junk" ] || fail "gc stopped at gc.blob_removed, but the blob is there"
idle_past() {
    [ "$(pg_psql "SELECT count(*) FROM pg_stat_activity WHERE usename = 'ckpt' AND state = 'idle in transaction'
                  AND now() - state_change > interval '3 seconds'")" = 1 ]
}
wait_until 60 "gc's session to stay idle in its transaction past CKPT_PG_IDLE_TX_TIMEOUT_S" idle_past
kill -CONT "$gpid"
rc=0
wait "$gpid" || rc=$?
[ "$rc" = 0 ] || fail "gc resumed after its session idled past the timeout exited $rc: $(cat "$work/gc.out")"
note "8b. gc stopped inside its transaction past CKPT_PG_IDLE_TX_TIMEOUT_S kept its session and committed"
