#!/usr/bin/env bash
# bench/queue.sh — the job queue's speed (issue 5, "Speed"). Not a test.
#
# With real worker processes (`ckpt serve` runs `ckpt worker` per job) and
# no-op jobs, it measures:
#   1. drain throughput: N noop jobs queued behind a gate job (depends_on; a
#      noop waiting for a file), the daemon (--workers W, already running)
#      releases them all at once when the gate ends: N / (last finished_at -
#      gate finished_at). Each job is a claim transaction, a fork + exec of
#      `ckpt worker`, its SQLite reads, the pipe, and the finish transaction.
#   2. end-to-end throughput: N more noop jobs POSTed by one HTTP client
#      (keep-alive) as fast as it can while the daemon runs them:
#      N / (last finished_at - first created_at).
#   3. submit-to-start latency, the daemon idle, jobs submitted one at a time
#      with `ckpt submit noop` (local SQLite, a new process each; a random
#      0-50 ms pause before each so submits do not line up with the daemon's
#      50 ms poll): created_at -> started_at (the claim, right before the
#      fork), and from the moment `ckpt submit` was started -> started_at.
#      Also shown: -> the worker's last line (its "done"), an upper bound of the
#      worker's start.
#   4. the claim throughput of several hosts: the drain of 1 again with the
#      queue on a throw-away PostgreSQL 15 (tests/e2e/pg_lib.sh: initdb in the
#      work folder, 127.0.0.1, a free port) and BENCH_DAEMONS daemons (3,
#      --workers W each, one home as in tests/e2e/test_pg.sh) claiming with
#      FOR UPDATE SKIP LOCKED, against the one daemon on SQLite of 1: jobs/s of
#      each and the ratio. (All the daemons share this machine's cores: this
#      measures what the database's claims and wake-ups cost, not what more
#      hosts would add.) BENCH_DAEMONS=0 skips it.
# It prints median and p99 and the goals: at least 200 jobs/s, median
# submit-to-start under 50 ms.
#
# Jobs need distinct arguments (identical queued jobs are one job), so the
# batches go through the HTTP API with {"seq": i}.
#
# Environment:
#   CKPT_BIN       the ckpt binary (default: build/ckpt beside this folder; use a release build)
#   BENCH_JOBS     N (default 1000)
#   BENCH_WORKERS  W (default 2)
#   BENCH_DAEMONS  daemons on PostgreSQL in 4 (default 3; 0: skip)
#   BENCH_SAMPLES  latency samples (default 200)
#   BENCH_DIR      where the temporary CKPT_HOME goes (default /tmp)
#   BENCH_PYTHON   python3 (default /usr/bin/python3)
#   BENCH_KEEP=1   keep the work folder
set -euo pipefail

BENCH_NAME=queue
# shellcheck source=bench/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

JOBS=${BENCH_JOBS:-1000}
WORKERS=${BENCH_WORKERS:-2}
SAMPLES=${BENCH_SAMPLES:-200}
DAEMONS=${BENCH_DAEMONS:-3}

bench_positive JOBS WORKERS SAMPLES
[[ $DAEMONS =~ ^[0-9]+$ ]] || die "BENCH_DAEMONS must be a number"
bench_start
DPIDS=()
# pg_lib.sh is written for the e2e tests: give it what it uses of lib.sh.
work=$WORK
py=$PY
fail() { die "$*"; }
wait_until() { # LIMIT WHAT CMD...: polls CMD (a ceiling that only catches a hang)
    local end=$((EPOCHSECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ "$EPOCHSECONDS" -lt "$end" ] || die "timed out waiting for $what"
        sleep 0.05
    done
}
# shellcheck source=tests/e2e/pg_lib.sh
. "$HERE/../tests/e2e/pg_lib.sh"
cleanup() {
    local p
    for p in "${DPIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${DPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    pg_stop
    if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# serve_daemon LOG: a daemon on CKPT_HOME (and CKPT_DB if set) with W
# workers; waits for its URL (CKPT_HOME/serve.url, which it writes), in $URL.
serve_daemon() {
    rm -f "$CKPT_HOME/serve.url"
    "$CKPT_BIN" serve --listen 127.0.0.1:0 --workers "$WORKERS" --grace 5 >"$1" 2>&1 &
    DPIDS+=($!)
    wait_until 60 "ckpt serve ($1)" test -s "$CKPT_HOME/serve.url"
    URL=$(cat "$CKPT_HOME/serve.url")
}

export CKPT_HOME=$WORK/home CKPT_QUIET=1
"$CKPT_BIN" jobs >/dev/null # creates the store and the database
serve_daemon "$WORK/serve.log"

cat >"$WORK/queue_bench.py" <<'EOF'
import http.client, json, os, random, statistics, subprocess, sys, time, urllib.parse

# argv: ckpt URL N W SAMPLES DAEMON_PID HOME [drain]; "drain": part 1 only,
# its jobs/s on stdout (the daemons on PostgreSQL of part 4).
ckpt, url, N, W, S, dpid, home = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
drain_only = sys.argv[8:] == ["drain"]
tick = os.sysconf("SC_CLK_TCK")

def stat(pid):
    """(own, reaped children's) CPU seconds of a process so far."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick, (int(f[13]) + int(f[14])) / tick

def cpu():
    """(the daemons, their reaped workers, the database server) CPU seconds so
    far: DAEMON_PID may list several, comma-separated; the server's share is
    the postmaster named by BENCH_PG_PM, its live processes and the ones it
    reaped (a worker's connection is a backend process that ends with it)."""
    d = [stat(p) for p in dpid.split(",")]
    db = 0.0
    pm = os.environ.get("BENCH_PG_PM")
    if pm:
        own, reaped = stat(pm)
        db = own + reaped
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and p != pm and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == pm:
                    db += stat(p)[0]
            except OSError:
                pass # ended while we looked: counted in the postmaster's reaped share
    return sum(x[0] for x in d), sum(x[1] for x in d), db
u = urllib.parse.urlparse(url)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)

def call(method, path, body=None):
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status >= 300:
        sys.exit(f"bench: {method} {path}: HTTP {r.status} {data[:300]!r}")
    return json.loads(data)

def submit(args, **kw):
    return call("POST", "/v1/jobs", {"kind": "noop", "args": args, **kw})["id"]

def job(i):
    return call("GET", f"/v1/jobs/{i}")

def wait_all(ids, limit):
    """Waits until every job in ids ended; returns them."""
    end = time.time() + limit
    pending = set(ids)
    while pending:
        if time.time() > end:
            sys.exit(f"bench: {len(pending)} jobs did not end in {limit} s")
        done = call("GET", f"/v1/jobs?state=succeeded&limit={len(ids) + 10}")["jobs"]
        pending -= {j["id"] for j in done}
        failed = call("GET", "/v1/jobs?state=failed&limit=10")["jobs"]
        if failed:
            sys.exit(f"bench: jobs failed: {[(j['id'], j.get('error')) for j in failed]}")
        time.sleep(0.05)
    return [job(i) for i in ids]

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))]

# ---- 1. drain: N jobs behind a gate ----
go = os.path.join(home, "bench-gate")
gate = submit({"until_file": go, "gate": 1})
t = time.time()
ids = [submit({"seq": i}, depends_on=gate) for i in range(N)]
sub_s = time.time() - t
c0 = cpu()
open(go, "w").close()
jobs = wait_all(ids, 120 + N)
c1 = cpu()
g = job(gate)
span = max(j["finished_at"] for j in jobs) - g["finished_at"]
drain = N / span
if drain_only:
    print(f"{drain:.1f} {span:.2f} {(c1[0] - c0[0]) / N * 1000:.2f} {(c1[1] - c0[1]) / N * 1000:.2f} {(c1[2] - c0[2]) / N * 1000:.2f}")
    sys.exit(0)

# ---- 2. end to end: submit while running ----
t = time.time()
ids = [submit({"seq": N + i}) for i in range(N)]
sub2_s = time.time() - t
jobs = wait_all(ids, 120 + N)
span2 = max(j["finished_at"] for j in jobs) - min(j["created_at"] for j in jobs)
e2e = N / span2

# ---- 3. latency, one at a time, daemon idle ----
claim, cli, done = [], [], []
env = dict(os.environ)
for k in range(S):
    time.sleep(0.05 + random.uniform(0, 0.05))
    t_cli = time.time()
    out = subprocess.run([ckpt, "submit", "noop"], env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench: ckpt submit noop: {out.stderr}")
    i = int(out.stdout)
    while True:
        j = job(i)
        if j["state"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.005)
    if j["state"] != "succeeded":
        sys.exit(f"bench: job {i} {j['state']}: {j.get('error')}")
    logs = call("GET", f"/v1/jobs/{i}/logs")["lines"]
    claim.append((j["started_at"] - j["created_at"]) * 1000)
    cli.append((j["started_at"] - t_cli) * 1000)
    if logs:
        done.append((logs[-1]["at"] - t_cli) * 1000)

# ---- the floor: exec of the binary alone ----
t0, e0 = time.time(), os.times()
for _ in range(50):
    subprocess.run([ckpt, "--version"], stdout=subprocess.DEVNULL, check=True)
e1 = os.times()
exec_wall = (time.time() - t0) / 50 * 1000
exec_cpu = ((e1.children_user - e0.children_user) + (e1.children_system - e0.children_system)) / 50 * 1000
try:
    libs = sum(1 for l in subprocess.run(["ldd", ckpt], capture_output=True, text=True).stdout.splitlines() if "=>" in l)
except OSError:
    libs = "?"

cpus = os.cpu_count()
load = os.getloadavg()[0]
print(f"queue bench: {os.path.basename(ckpt)} ({ckpt}), {W} workers, {cpus} CPUs, load average {load:.1f}")
print(f"  drain: {N} queued noop jobs          {drain:8.1f} jobs/s   ({span:.2f} s)          goal >= 200 jobs/s  {'ok' if drain >= 200 else 'MISSED'}")
print(f"  end to end: {N} submitted + run      {e2e:8.1f} jobs/s   ({span2:.2f} s; the client submitted {N / sub2_s:.0f}/s)"
      f"  goal >= 200 jobs/s  {'ok' if e2e >= 200 else 'MISSED'}")
print(f"  (HTTP submit alone, daemon idle:  {N / sub_s:8.0f} jobs/s)")
print(f"  CPU per job while draining: daemon {(c1[0] - c0[0]) / N * 1000:.2f} ms, worker {(c1[1] - c0[1]) / N * 1000:.2f} ms"
      f" (the gate included; {cpus} CPUs bound the rate at {cpus * N / max(1e-9, (c1[0] - c0[0]) + (c1[1] - c0[1])):.0f} jobs/s)")
print(f"  floor: `ckpt --version` (exec, {libs} shared libraries) {exec_wall:.2f} ms wall, {exec_cpu:.2f} ms CPU per run")
print(f"  submit -> start, {S} jobs one at a time, daemon idle:")
print(f"    created_at -> claimed (started_at)      median {statistics.median(claim):6.1f} ms   p99 {pct(claim, 99):6.1f} ms"
      f"   goal median < 50 ms  {'ok' if statistics.median(claim) < 50 else 'MISSED'}")
print(f"    `ckpt submit` started -> claimed         median {statistics.median(cli):6.1f} ms   p99 {pct(cli, 99):6.1f} ms")
if done:
    print(f"    `ckpt submit` started -> worker done     median {statistics.median(done):6.1f} ms   p99 {pct(done, 99):6.1f} ms"
          "   (upper bound of the worker's start)")
EOF
"$PY" "$WORK/queue_bench.py" "$CKPT_BIN" "$URL" "$JOBS" "$WORKERS" "$SAMPLES" "${DPIDS[0]}" "$CKPT_HOME" | tee "$WORK/sqlite.txt"

# ---- 4. the same drain with DAEMONS daemons on PostgreSQL ----
[ "$DAEMONS" -gt 0 ] || exit 0
kill -TERM "${DPIDS[0]}"
wait "${DPIDS[0]}" || die "the SQLite daemon did not stop cleanly"
DPIDS=()
pg_start
export CKPT_DB=$pg_url CKPT_HOME=$WORK/pg-home
"$CKPT_BIN" jobs >/dev/null # the schema, before the daemons start together
for i in $(seq "$DAEMONS"); do serve_daemon "$WORK/pg-serve.$i.log"; done
pm=$(head -n 1 "$pg_dir/data/postmaster.pid")
read -r pg_rate pg_span pg_dcpu pg_wcpu pg_scpu < <(BENCH_PG_PM=$pm "$PY" "$WORK/queue_bench.py" "$CKPT_BIN" "$URL" "$JOBS" "$WORKERS" "$SAMPLES" "$(IFS=,; echo "${DPIDS[*]}")" "$CKPT_HOME" drain)
lite_rate=$(awk '/drain:/ {for (i = 1; i < NF; i++) if ($(i + 1) == "jobs/s") {print $i; exit}}' "$WORK/sqlite.txt")
echo "  claim throughput, $JOBS queued noop jobs drained ($(nproc) CPUs, load average $(cut -d' ' -f1 /proc/loadavg)):"
echo "    1 daemon on SQLite ($WORKERS workers)                  $(printf '%8.1f' "$lite_rate") jobs/s"
echo "    $DAEMONS daemons on PostgreSQL 15 ($WORKERS workers each)   $(printf '%8.1f' "$pg_rate") jobs/s   ($pg_span s)"
echo "      CPU per job: the daemons $pg_dcpu ms, their workers $pg_wcpu ms, PostgreSQL $pg_scpu ms"
echo "    ratio PostgreSQL / SQLite                          $(awk -v a="$pg_rate" -v b="$lite_rate" 'BEGIN {printf "%8.2f", a / b}')"
