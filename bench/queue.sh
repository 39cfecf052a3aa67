#!/usr/bin/env bash
# bench/queue.sh — the job queue's speed (issue 5, "Speed"). Not a test.
#
# With real worker processes (`ckpt serve` runs `ckpt worker` per job) and
# no-op jobs, it measures:
#   1. drain throughput: N noop jobs queued behind a gate job (depends_on), the
#      daemon (--workers W, already running) releases them all at once when
#      the gate ends: N / (last finished_at - gate finished_at). Each job is a
#      claim transaction, a fork + exec of `ckpt worker`, its SQLite reads, the
#      pipe, and the finish transaction.
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

bench_positive JOBS WORKERS SAMPLES
bench_start
DPID=
cleanup() {
    if [ -n "$DPID" ]; then
        kill -TERM "$DPID" 2>/dev/null || true
        wait "$DPID" 2>/dev/null || true
    fi
    if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

export CKPT_HOME=$WORK/home CKPT_QUIET=1
"$CKPT_BIN" jobs >/dev/null # creates the store and the database
"$CKPT_BIN" serve --listen 127.0.0.1:0 --workers "$WORKERS" --grace 5 >"$WORK/serve.log" 2>&1 &
DPID=$!
for _ in $(seq 200); do
    [ -s "$CKPT_HOME/serve.url" ] && break
    kill -0 "$DPID" 2>/dev/null || die "ckpt serve exited: $(cat "$WORK/serve.log")"
    sleep 0.05
done
[ -s "$CKPT_HOME/serve.url" ] || die "ckpt serve wrote no serve.url"

"$PY" - "$CKPT_BIN" "$(cat "$CKPT_HOME/serve.url")" "$JOBS" "$WORKERS" "$SAMPLES" "$DPID" <<'EOF'
import http.client, json, os, random, statistics, subprocess, sys, time, urllib.parse

ckpt, url, N, W, S, dpid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
tick = os.sysconf("SC_CLK_TCK")

def cpu():
    """(daemon, its reaped workers) CPU seconds so far."""
    f = open(f"/proc/{dpid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick, (int(f[13]) + int(f[14])) / tick
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
gate_ms = 2000 + 3 * N
gate = submit({"sleep_ms": gate_ms, "gate": 1})
t = time.time()
ids = [submit({"seq": i}, depends_on=gate) for i in range(N)]
sub_s = time.time() - t
g = job(gate)
if g["state"] != "running":
    sys.exit(f"bench: the gate job is {g['state']} after submitting; raise its sleep")
c0 = cpu()
jobs = wait_all(ids, 120 + N)
c1 = cpu()
g = job(gate)
span = max(j["finished_at"] for j in jobs) - g["finished_at"]
drain = N / span

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
