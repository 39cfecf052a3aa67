"""dashboard_driver.py — drives the dashboard of `ckpt serve` in Debian's
headless Chromium (chromedriver, python3-selenium) for test_dashboard.sh.

Environment (set by the script): CKPT_BIN, CKPT_HOME (daemon A's home),
URL_A (daemon A: no tokens, one worker, a Hub behind it), URL_B and HOME_B
(daemon B: --token-file), READ_TOKEN, SHOTS (where screenshots go),
PROFILE (a fresh Chromium profile folder), NOOP_ID (a running job of A that
waits for a file; A's workers stop once at exec.file_hashed), FAILED_ID (a
convert of A that failed: its source was not stored yet), FAILED_B (a failed job of B), PULL_DIR (a scratch folder).

Every wait is a poll for a state with a generous ceiling that only catches a
hang (WAIT seconds); nothing here depends on how fast the machine is.
"""
import json
import math
import os
import re
import sqlite3
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from decimal import ROUND_HALF_UP, Decimal

from selenium import webdriver
from selenium.common.exceptions import JavascriptException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 180
env = os.environ
ckpt = env["CKPT_BIN"]
shots = env["SHOTS"]


def fail(msg):
    print("dashboard_driver: FAIL: " + msg, file=sys.stderr)
    try:
        d.save_screenshot(os.path.join(shots, "failure.png"))
        print("page text: " + d.find_element(By.TAG_NAME, "body").text[:2000], file=sys.stderr)
        print("console: %s" % d.get_log("browser")[-10:], file=sys.stderr)
    except Exception:
        pass
    print("dashboard_driver: FAIL: " + msg, file=sys.stderr)  # again, last: run.sh shows the tail
    sys.exit(1)


started = time.monotonic()


def note(what):
    print("-- %s (%.0f s in the browser)" % (what, time.monotonic() - started), flush=True)


def run(*args, home=None):
    e = dict(env)
    if home:
        e["CKPT_HOME"] = home
    r = subprocess.run([ckpt, *args], capture_output=True, text=True, env=e)
    if r.returncode:
        fail("%s exited %d: %s" % (" ".join(args), r.returncode, r.stderr[-500:]))
    return r.stdout


def until(what, fn):
    """Polls fn (a value or None/False) until it is true; fails after WAIT s."""

    def probe(_):
        try:
            return fn()
        except (StaleElementReferenceException, JavascriptException):
            return False

    try:
        return WebDriverWait(d, WAIT, poll_frequency=0.1).until(probe)
    except Exception as e:
        fail("timed out waiting for %s (%s)" % (what, type(e).__name__ + ": " + str(e)[:300]))


def api(base, path, method="GET", token=None):
    """The JSON of a request to the daemon's API (the same the page uses)."""
    req = urllib.request.Request(base + path, method=method)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def api_status(base, path):
    try:
        urllib.request.urlopen(base + path)
        return 200
    except urllib.error.HTTPError as e:
        return e.code


def find_all(css):
    return d.find_elements(By.CSS_SELECTOR, css)


def text(css):
    els = d.find_elements(By.CSS_SELECTOR, css)
    return els[0].text if els else None


def go(url, ready_css):
    d.get(url)
    until(ready_css, lambda: d.find_elements(By.CSS_SELECTOR, ready_css))


def shot(name):
    d.save_screenshot(os.path.join(shots, name + ".png"))


def accept_confirm():
    WebDriverWait(d, WAIT).until(EC.alert_is_present())
    d.switch_to.alert.accept()


def click(by, sel):
    """Finds the element and clicks it. The page redraws its views on every
    live update: an element found just before a redraw is stale when clicked
    (nothing was clicked then), so it is found again."""
    for _ in range(50):
        try:
            d.find_element(by, sel).click()
            return
        except StaleElementReferenceException:
            time.sleep(0.05)  # a redraw is under way
    fail("%s stayed stale through 50 redraws" % sel)


def click_confirmed(button_id, question):
    """Clicks the button, whose confirmation must ask exactly `question`, and accepts it."""
    click(By.ID, button_id)
    WebDriverWait(d, WAIT).until(EC.alert_is_present())
    asked = d.switch_to.alert.text
    d.switch_to.alert.accept()
    if asked != question:
        fail("%s asked %r, not %r" % (button_id, asked, question))


def job_state_is(state):
    return lambda: text("#job-state .state") == state


# The page's number formats (app.js fmtBytes, fmtDuration), written again from
# their definitions: JavaScript's toFixed and Math.round round halves up.
def js_fixed(x, digits):
    return str(Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def fmt_bytes(n):
    units, i = ["B", "KiB", "MiB", "GiB", "TiB"], 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return (js_fixed(n, 1) if i else str(n)) + " " + units[i]


def fmt_duration(s):
    if s < 60:
        return js_fixed(s, 1 if s < 10 else 0) + " s"
    if s < 3600:
        return "%d min %d s" % (s // 60, math.floor(s % 60 + 0.5))
    return "%d h %d min" % (s // 3600, math.floor((s % 3600) / 60 + 0.5))


def rate_shown(css, prog):
    """The rate and ETA shown at css (a .progress-rate) are the API's
    progress.rate and progress.eta_seconds in the page's formats."""
    els = d.find_elements(By.CSS_SELECTOR, css)
    if not els or float(els[0].get_attribute("data-rate")) != prog["rate"]:
        return False
    want = fmt_bytes(math.floor(prog["rate"] + 0.5)) + "/s"
    eta = prog.get("eta_seconds", 0)
    if eta > 0:
        want += " · ETA " + fmt_duration(eta)
    return els[0].text == want


opts = webdriver.ChromeOptions()
for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--window-size=1280,900", "--user-data-dir=" + env["PROFILE"]):
    opts.add_argument(a)
opts.binary_location = "/usr/bin/chromium"
opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
d = webdriver.Chrome(service=Service("/usr/bin/chromedriver", log_output=os.path.join(shots, "chromedriver.log")),
                     options=opts)
try:
    A, B = env["URL_A"], env["URL_B"]
    noop, failed = env["NOOP_ID"], env["FAILED_ID"]

    # --- the jobs page: tabs with counts, live progress of the running job ---
    go(A + "/#/jobs", "#jobs-table")
    until("the running tab to count 1", lambda: text('#job-tabs button[data-state="running"] .count') == "1")
    until("the failed tab to count 1", lambda: text('#job-tabs button[data-state="failed"] .count') == "1")
    until("the running noop's phase", lambda: "noop: waiting for until_file" in
          (text('#jobs-table tr[data-id="%s"] .progress-phase' % noop) or ""))
    shot("jobs-running")
    note("the jobs page")

    # --- submit a fetch + convert from the form (queued behind the noop: one worker) ---
    d.find_element(By.ID, "f-repo").send_keys("org/tiny")
    d.find_element(By.ID, "f-layout").send_keys("neuron")
    d.find_element(By.ID, "f-tp").send_keys("2")
    click(By.ID, "f-submit")
    until("the page of the submitted convert", lambda: d.find_elements(By.CSS_SELECTOR, "#job-view"))
    convert = d.find_element(By.ID, "job-view").get_attribute("data-id")
    until("the submitted convert to be queued", job_state_is("queued"))
    job = json.loads(run("show", convert))
    if job["kind"] != "convert" or job["args"]["ref"] != "org/tiny@main" or job["args"]["tp"] != 2:
        fail("the form queued %s" % job)
    fetch_id = str(job["depends_on"])
    if json.loads(run("show", fetch_id))["args"]["repo"] != "org/tiny":
        fail("the convert does not wait for a fetch of org/tiny")
    if "Submitted job %s (fetch) and job %s (convert)" % (fetch_id, convert) not in text("#flash"):
        fail("flash after submit: %r" % text("#flash"))

    # The fetch's page lists the convert waiting for it (GET /v1/jobs/{id}'s
    # dependents); its link leads to the convert, whose page links the fetch back.
    if [(x["id"], x["kind"], x["state"]) for x in api(A, "/v1/jobs/" + fetch_id)["dependents"]] != [(int(convert), "convert", "queued")]:
        fail("the fetch's dependents: %s" % api(A, "/v1/jobs/" + fetch_id)["dependents"])
    go(A + "/#/jobs/" + fetch_id, '#job-view[data-id="%s"]' % fetch_id)
    dep_link = '#job-dependents .dependent[data-id="%s"]' % convert
    until("the convert among the jobs waiting for the fetch", lambda: find_all(dep_link) and
          "convert" in text(dep_link) and text(dep_link + " .state") == "queued")
    click(By.CSS_SELECTOR, dep_link + " a")
    until("the convert's page, linking the fetch", lambda: find_all('#job-view[data-id="%s"]' % convert) and
          text("#job-dep a") == fetch_id and "fetch" in text("#job-dep"))
    if json.loads(text("#job-args")) != job["args"]:
        fail("the convert's page shows the arguments %r, the API %s" % (text("#job-args"), job["args"]))
    shot("job-dependents")

    # The queued tab and the search box.
    go(A + "/#/jobs", "#jobs-table")
    click(By.CSS_SELECTOR, '#job-tabs button[data-state="queued"]')
    until("two queued jobs", lambda: text('#job-tabs button[data-state="queued"] .count') == "2" and
          {r.get_attribute("data-state") for r in d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")} == {"queued"})
    click(By.CSS_SELECTOR, '#job-tabs button[data-state="all"]')
    d.find_element(By.ID, "job-search").send_keys("fetch")
    until("the search to keep only the fetch", lambda: [r.get_attribute("data-id") for r in
                                                       d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")] == [fetch_id])
    shot("jobs-search")
    note("form, tabs and search")

    # --- cancel the running noop, with confirmation ---
    go(A + "/#/jobs/" + noop, "#job-view")
    until("the noop to show as running", job_state_is("running"))
    click(By.ID, "job-cancel")
    accept_confirm()
    until("the noop to be cancelled", job_state_is("cancelled"))
    if json.loads(run("show", noop))["state"] != "cancelled":
        fail("the page says cancelled, the queue does not")
    shot("job-cancelled")
    note("cancel")

    # --- the submitted jobs run: live states until success, the log followed ---
    # The convert's worker stops itself after hashing its first output file
    # (CKPT_FAULT_WORKER=exec.file_hashed:1:STOP, once): the job is held
    # running, its tensors counted, whatever the machine's speed.
    go(A + "/#/jobs/" + convert, "#job-view")
    tensors_el = "#job-fields .progress-tensors"
    until("the running convert's tensors", lambda: job_state_is("running")() and find_all(tensors_el) and
          text("#job-fields .progress-phase") == "hashing")
    held = api(A, "/v1/jobs/" + convert)
    wpid = held["worker_pid"]
    until("the convert's worker to stop at exec.file_hashed", lambda: "\tT" in
          next(l for l in open("/proc/%d/status" % wpid) if l.startswith("State:")))
    p = api(A, "/v1/jobs/" + convert)["progress"]
    m = p["tensors_total"]
    until("the page to show the held convert's tensors", lambda: d.find_element(By.CSS_SELECTOR, tensors_el).get_attribute("data-total") == str(m) and
          d.find_element(By.CSS_SELECTOR, tensors_el).get_attribute("data-done") == str(p["tensors_done"]))
    if not 0 <= p["tensors_done"] <= m or m <= 0:
        fail("a running convert's tensors: %s" % p)
    # Its rate and time left, as the worker measured them at its last report
    # (held, they stay put): the API's figures in the page's formats.
    if not p.get("rate", 0) > 0 or p["total"] > p["done"] and not p.get("eta_seconds", 0) > 0:
        fail("a held convert's rate and ETA: %s" % p)
    until("the held convert's rate and ETA", lambda: rate_shown("#job-fields .progress-rate", p))
    if not re.fullmatch(r"\d+(\.\d)? (B|KiB|MiB|GiB|TiB)/s( · ETA (\d+(\.\d)? s|\d+ min \d+ s|\d+ h \d+ min))?",
                        text("#job-fields .progress-rate")):
        fail("the rate and ETA read %r" % text("#job-fields .progress-rate"))
    go(A + "/#/jobs", "#jobs-table")
    d.find_element(By.ID, "job-search").send_keys(Keys.CONTROL, "a", Keys.DELETE)  # the search above is kept
    row_tensors = '#jobs-table tr[data-id="%s"] .progress-tensors' % convert
    until("the jobs list to show the convert's tensors and rate", lambda: text(row_tensors) == "%d / %d tensors" % (p["tensors_done"], m)
          and rate_shown('#jobs-table tr[data-id="%s"] .progress-rate' % convert, p))
    shot("job-tensors")
    line = next(l for l in run("jobs").splitlines() if l.split()[0] == convert)
    if " %d/%d " % (p["tensors_done"], m) not in line:
        fail("ckpt jobs does not show the convert's tensors %d/%d: %r" % (p["tensors_done"], m, line))
    # The overview's workers: the one busy worker runs the convert.
    go(A + "/#/overview", "#running-table")
    held_row = '#running-table tr[data-id="%s"]' % convert
    until("the overview's worker running the convert", lambda: text("#ov-workers") == "1" and find_all(held_row) and
          [td.text for td in d.find_elements(By.CSS_SELECTOR, held_row + " td")][1:3] == [str(wpid), "convert"] and
          text(held_row + " .progress-tensors") == "%d / %d tensors" % (p["tensors_done"], m))
    shot("overview-running")
    # Live updates paused: the convert, continued, succeeds on the server
    # while its page still shows it running; resumed, the page follows.
    go(A + "/#/jobs/" + convert, "#job-view")
    until("the held convert's page", job_state_is("running"))
    click(By.ID, "pause")
    # data-paused: paused, and no refresh under way (one begun before the
    # click could still read the new state).
    until("updates paused", lambda: d.find_element(By.ID, "updated").get_attribute("data-paused") == "true" and
          text("#pause") == "Resume updates" and text("#updated").startswith("paused · updated "))
    refreshes = d.find_element(By.ID, "updated").get_attribute("data-refreshes")
    paused_at = d.execute_script("return Date.now()")
    os.kill(wpid, signal.SIGCONT)
    until("the convert to succeed (the API)", lambda: api(A, "/v1/jobs/" + convert)["state"] == "succeeded")
    # Not a sleep for something to happen: a wait until the page's own clock
    # has passed 2.5 poll periods since the pause, by which a page that still
    # polled would have refreshed at least twice. Paused, it did not.
    poll_ms = d.execute_script("return POLL_MS")
    until("2.5 poll periods on the page's clock", lambda: d.execute_script("return Date.now()") >= paused_at + 2.5 * poll_ms)
    if not job_state_is("running")() or d.find_element(By.ID, "updated").get_attribute("data-refreshes") != refreshes:
        fail("paused, the page refreshed (%s refreshes, %s before) or shows %r" % (
            d.find_element(By.ID, "updated").get_attribute("data-refreshes"), refreshes, text("#job-state .state")))
    shot("job-paused")
    click(By.ID, "pause")
    until("the convert to succeed once updates resume", lambda: job_state_is("succeeded")() and text("#pause") == "Pause updates" and
          not text("#updated").startswith("paused"))
    note("rate, ETA and pause")
    prog = text("#job-fields .progress-text") or ""
    if "(100%)" not in prog:
        fail("a finished convert's progress reads %r" % prog)
    # M was the tensor count of what the convert stored, and all were done.
    stored = json.loads(run("show", "org/tiny@main:neuron-tp2", "--json"))
    if m != sum(f["tensors"] for f in stored["files"] if f["safetensors"]):
        fail("the running convert counted %d tensors, it stored %s" % (m, [f.get("tensors") for f in stored["files"]]))
    until("the finished convert's tensors", lambda: text("#job-fields .progress-tensors") == "%d / %d tensors" % (m, m))
    until("the convert's log", lambda: d.find_element(By.ID, "job-log").text.strip().splitlines() and
          len(d.find_element(By.ID, "job-log").text.strip().splitlines()) ==
          len(run("logs", convert).strip().splitlines()))
    shot("job-succeeded")
    note("submitted jobs succeeded")

    # --- retry of the failed convert: its source is stored now, so it succeeds ---
    go(A + "/#/jobs/" + failed, "#job-view")
    until("the failed convert's page", job_state_is("failed"))
    if not text("#job-error"):
        fail("a failed job shows no error")
    click(By.ID, "job-retry")
    accept_confirm()
    until("the retried convert to succeed", job_state_is("succeeded"))
    # Its attempts: the first failed (with its error), the retry succeeded; the page shows what the API keeps.
    attempts = api(A, "/v1/jobs/" + failed)["attempts"]
    if [(a["attempt"], a["outcome"]) for a in attempts] != [(1, "failed"), (1, "succeeded")] or not attempts[0]["error"]:
        fail("the retried convert's attempts: %s" % attempts)
    until("the attempts table", lambda: [(r.get_attribute("data-attempt"), r.get_attribute("data-outcome"),
                                          r.find_elements(By.TAG_NAME, "td")[5].text) for r in find_all("#attempts-table tbody tr")] ==
          [("1", "failed", attempts[0]["error"]), ("1", "succeeded", "")])
    shot("job-retried")
    note("retry")

    # --- the store: a checkpoint page, its files and tensor table ---
    cks = json.loads(run("ls", "--json"))["checkpoints"]
    ref = next(c["ref"] for c in cks if c["layout"] == "neuron-tp2")
    go(A + "/#/store", "#store-table")
    until("the layout in the store list", lambda: d.find_elements(By.CSS_SELECTOR, '#store-table tr[data-ref="%s"] a' % ref))
    click(By.CSS_SELECTOR, '#store-table tr[data-ref="%s"] a' % ref)
    until("the tensor table", lambda: d.find_element(By.ID, "tensors-status").get_attribute("data-done") == "1")
    show = json.loads(run("show", ref, "--json"))
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in d.find_elements(By.CSS_SELECTOR, "#files-table tbody tr")]
    want = [[f["path"], str(f["tensors"]) if f["safetensors"] else "", f["sha256"]] for f in show["files"]]
    if [[r[0], r[2], r[3]] for r in rows] != want:
        fail("files table %s differs from ckpt show --json %s" % (rows, want))
    pulled = env["PULL_DIR"]
    run("pull", ref, "-o", pulled)
    expect = []
    for f in show["files"]:
        if f["safetensors"]:
            info = json.loads(run("inspect", os.path.join(pulled, f["path"]), "--json"))
            expect += [(t["name"], t["dtype"], "[" + ", ".join(map(str, t["shape"])) + "]", str(t["nbytes"]), f["path"])
                       for t in info["tensors"]]
    got = [(tr.find_elements(By.TAG_NAME, "td")[0].text, tr.find_elements(By.TAG_NAME, "td")[1].text,
            tr.find_elements(By.TAG_NAME, "td")[2].text, tr.find_elements(By.TAG_NAME, "td")[3].get_attribute("data-bytes"),
            tr.find_elements(By.TAG_NAME, "td")[4].text) for tr in d.find_elements(By.CSS_SELECTOR, "#tensors-table tbody tr")]
    if sorted(got) != sorted(expect) or not got:
        fail("tensor table (%d rows) differs from ckpt inspect of the pulled files (%d)" % (len(got), len(expect)))
    if text("#pull-cmd") != "ckpt pull %s -o DIR --server %s" % (ref, A):
        fail("pull command %r" % text("#pull-cmd"))
    # One rank's view, and the Hub API URL shown answers this checkpoint's commit.
    click(By.CSS_SELECTOR, '#rank-picker option[value="tp_rank_01/"]')
    until("rank 1's tensors only", lambda: {tr.find_elements(By.TAG_NAME, "td")[4].text for tr in
                                          d.find_elements(By.CSS_SELECTOR, "#tensors-table tbody tr") if tr.is_displayed()} ==
          {"tp_rank_01/model.safetensors"})
    hub = d.execute_script("return fetch(document.getElementById('hub-url').textContent).then(r => r.json())")
    if hub.get("id") != "org/tiny":
        fail("the Hub API URL answers %s" % hub)
    shot("checkpoint")
    note("checkpoint page")

    # --- the overview and the schedules page ---
    go(A + "/#/overview", "#state-table")
    jobs = json.loads(run("jobs", "--json"))
    want = {st: sum(1 for j in jobs if j["state"] == st) for st in ("succeeded", "cancelled")}
    until("the overview's counts", lambda: text("#ov-workers") == "0" and text("#ov-queue") == "0" and
          [td.text for td in d.find_elements(By.CSS_SELECTOR, "#state-table tbody td")] ==
          ["0", "0", "0", str(want["succeeded"]), "0", str(want["cancelled"])])
    # The charts: from /v1/stats, kept in the database. The jobs that ended
    # so far: fetch, convert and the retried convert succeeded; the first
    # try of that convert failed (the noop was cancelled: neither).
    stats = api(A, "/v1/stats?hours=6")
    total = lambda name: sum(r["value"] for r in stats["rows"] if r["name"] == name)
    if total("jobs.succeeded") != 3 or total("jobs.failed") != 1 or total("bytes.fetch") <= 0 or total("bytes.convert") <= 0:
        fail("/v1/stats after the jobs ran: %s" % stats["rows"])
    until("the last hour's jobs", lambda: text("#ov-hour") == "%d jobs succeeded, %d failed" %
          (total("jobs.succeeded"), total("jobs.failed")))
    until("the charts", lambda: [d.find_element(By.ID, c).get_attribute("data-total") for c in
                                 ("chart-succeeded", "chart-failed", "chart-fetched", "chart-converted")] ==
          ["3", "1", str(total("bytes.fetch")), str(total("bytes.convert"))] and
          len(find_all("#chart-succeeded svg rect")) >= 1)
    shot("overview")

    # --- schedules: add (a yearly cron: it never runs here), pause, resume, remove ---
    go(A + "/#/schedules", "#schedule-form")
    d.find_element(By.ID, "s-repo").send_keys("org/tiny")
    d.find_element(By.ID, "s-cron").send_keys("0 0 1 1 *")
    d.find_element(By.ID, "s-layouts").send_keys("neuron-tp2")
    click(By.ID, "s-add")
    until("the new schedule's row", lambda: find_all('#schedules-table tr[data-id]'))
    sid = find_all('#schedules-table tr[data-id]')[0].get_attribute("data-id")
    sc = api(A, "/v1/schedules/" + sid)
    if sc["repo"] != "org/tiny" or sc["cron"] != "0 0 1 1 *" or sc["layouts"] != [{"layout": "neuron", "tp": 2}] or sc["paused"]:
        fail("the form added %s" % sc)
    row = '#schedules-table tr[data-id="%s"]' % sid
    # Run now: its sync job, recorded as the schedule's last job, sees the
    # Hub's commit (stored already) and queues the layout's convert (stored
    # too); the row then shows the commit, the outcome and a link to the job.
    click(By.CSS_SELECTOR, row + " button.run-now")
    accept_confirm()
    until("run now", lambda: "Schedule %s queued" % sid in (text("#flash") or "") and api(A, "/v1/schedules/" + sid).get("last_job_id"))
    sync_job = api(A, "/v1/schedules/" + sid)["last_job_id"]
    job = api(A, "/v1/jobs/%d" % sync_job)
    if job["kind"] != "sync" or job["args"] != {"schedule": int(sid)}:
        fail("run now queued %s" % job)
    until("the sync job and what it queued to succeed", lambda: api(A, "/v1/jobs/%d" % sync_job)["state"] == "succeeded" and
          not any(api(A, "/v1/jobs/counts")[st] for st in ("queued", "running")))
    sc = api(A, "/v1/schedules/" + sid)
    if not sc.get("last_commit") or "queued" not in sc.get("last_outcome", ""):
        fail("the schedule after run now: %s" % sc)
    until("the row's last commit, outcome and job", lambda: sc["last_commit"][:12] in text(row) and sc["last_outcome"] in text(row) and
          d.find_element(By.CSS_SELECTOR, row + ' a[href="#/jobs/%d"]' % sync_job))
    shot("schedule-run")
    click(By.CSS_SELECTOR, row + " button.pause")
    accept_confirm()
    until("the schedule paused", lambda: d.find_element(By.CSS_SELECTOR, row).get_attribute("data-paused") == "true" and
          text(row + " .next-run") == "paused")
    if not api(A, "/v1/schedules/" + sid)["paused"]:
        fail("the page says paused, the API does not")
    shot("schedule-paused")
    click(By.CSS_SELECTOR, row + " button.resume")
    accept_confirm()
    until("the schedule resumed", lambda: d.find_element(By.CSS_SELECTOR, row).get_attribute("data-paused") == "false")
    if api(A, "/v1/schedules/" + sid)["paused"]:
        fail("the page says resumed, the API does not")
    click(By.CSS_SELECTOR, row + " button.remove")
    accept_confirm()
    until("the schedule removed", lambda: not find_all(row))
    if api(A, "/v1/schedules")["schedules"]:
        fail("a removed schedule is still listed by the API")
    note("overview charts and schedules")

    # --- the store's figures after a verify (the verify job records its outcome) ---
    run("verify", "--server", A)
    du = api(A, "/v1/store")
    go(A + "/#/store", "#store-fields")
    until("the store's figures and last verify", lambda: d.find_element(By.ID, "st-logical").get_attribute("data-bytes") ==
          str(du["logical_bytes"]) and d.find_element(By.ID, "st-physical").get_attribute("data-bytes") ==
          str(du["physical_bytes"]) and text("#st-dedup") == "%.2f×" % du["dedup_ratio"] and
          d.find_element(By.ID, "st-verify").get_attribute("data-clean") == "true")
    lv = du["last_verify"]
    if lv["checkpoints_checked"] != du["checkpoints"] or not text("#st-verify").startswith("clean"):
        fail("last verify %s, shown %r, of %d checkpoints" % (lv, text("#st-verify"), du["checkpoints"]))
    if {r.get_attribute("data-ok") for r in find_all("#store-table td.verify")} != {"true"}:
        fail("a checkpoint without its verify result in the store list")
    shot("store-verified")
    note("store figures after a verify")


    # --- a narrow screen: the jobs table's container stays inside the window ---
    d.set_window_size(400, 900)
    go(A + "/#/jobs", "#jobs-table")
    d.find_element(By.ID, "job-search").send_keys(Keys.CONTROL, "a", Keys.DELETE)  # the search is kept while the tab lives
    until("the jobs list on a narrow window", lambda: len(d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")) >= 4)  # B's
    over = d.execute_script("""
        const w = document.getElementById('jobs-table-wrap'), r = w.getBoundingClientRect();
        return {right: r.right, inner: window.innerWidth, page: document.documentElement.scrollWidth,
                scroll: w.scrollWidth, client: w.clientWidth};""")
    if over["right"] > over["inner"] or over["page"] > over["inner"] or over["scroll"] > over["client"]:
        fail("the jobs table overflows a 400 px window: %s" % over)
    shot("jobs-narrow")
    note("narrow window")
    d.set_window_size(1280, 900)

    # --- delete: one job from its page (a dismissed confirmation changes nothing), then all succeeded ---
    go(A + "/#/jobs/" + noop, "#job-delete")
    click(By.ID, "job-delete")
    WebDriverWait(d, WAIT).until(EC.alert_is_present())
    d.switch_to.alert.dismiss()
    if api_status(A, "/v1/jobs/" + noop) != 200:
        fail("a dismissed delete deleted job " + noop)
    click(By.ID, "job-delete")
    accept_confirm()
    until("the jobs list after the delete", lambda: "Job %s deleted" % noop in (text("#flash") or "") and find_all("#jobs-table"))
    if api_status(A, "/v1/jobs/" + noop) != 404:
        fail("job %s still answers after its delete" % noop)
    nsucc = api(A, "/v1/jobs/counts")["succeeded"]
    click(By.CSS_SELECTOR, '#job-tabs button[data-state="succeeded"]')
    until("the succeeded tab", lambda: text('#job-tabs button[data-state="succeeded"] .count') == str(nsucc) and
          not d.find_element(By.ID, "bulk-delete").get_attribute("disabled"))
    click_confirmed("bulk-delete", "Delete all %d succeeded jobs?" % nsucc)
    until("the succeeded jobs deleted", lambda: text('#job-tabs button[data-state="succeeded"] .count') == "0" and
          "delete: %d of %d" % (nsucc, nsucc) in (text("#flash") or ""))
    counts = api(A, "/v1/jobs/counts")
    if counts["succeeded"] != 0 or counts["all"] != 0:
        fail("after deleting one job and all succeeded ones: %s" % counts)
    shot("jobs-deleted")
    note("delete one and all matching")

    # --- daemon B, with tokens: the page loads without one, a read token sees but cannot act ---
    go(B + "/#/jobs", "#main")
    until("the page to ask for a token", lambda: "401" in (text("#flash") or ""))
    d.find_element(By.ID, "token").send_keys(env["READ_TOKEN"])
    click(By.ID, "token-use")
    until("the jobs of B with the read token", lambda: (text("#page-info") or "").endswith("(32 jobs)"))
    if d.execute_script("return sessionStorage.getItem('ckpt.token')") != env["READ_TOKEN"]:
        fail("the token is not kept in sessionStorage")
    if env["READ_TOKEN"] in d.current_url:
        fail("the token is in the URL")
    until("32 jobs on two pages", lambda: text("#page-info") == "page 1 of 2 (32 jobs)" and
          len(d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")) == 25)
    click(By.ID, "page-next")
    until("the second page", lambda: text("#page-info") == "page 2 of 2 (32 jobs)" and
          [r.get_attribute("data-id") for r in d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")] ==
          [str(i) for i in range(7, 0, -1)] and env["FAILED_B"] == "1")
    go(B + "/#/jobs/" + env["FAILED_B"], "#job-view")
    until("B's failed job", job_state_is("failed"))
    click(By.ID, "job-retry")
    accept_confirm()
    until("the refusal of a retry", lambda: "403" in (text("#flash") or "") and "admin token" in text("#flash"))
    go(B + "/#/jobs", "#jobs-table")
    click(By.CSS_SELECTOR, '#job-tabs button[data-state="failed"]')
    until("the failed tab of B", lambda: not d.find_element(By.ID, "bulk-retry").get_attribute("disabled"))
    click(By.ID, "bulk-retry")
    accept_confirm()
    until("the refusal of a bulk retry", lambda: "403" in (text("#flash") or "") and "bulk action needs an admin token" in text("#flash"))
    shot("read-token-refused")
    note("read token")
    if json.loads(run("show", env["FAILED_B"], home=env["HOME_B"]))["state"] != "failed":
        fail("a read token's retry changed the job")
    go(B + "/#/jobs", "#submit-form")
    d.find_element(By.ID, "f-repo").send_keys("org/tiny")
    click(By.ID, "f-submit")
    until("the refusal of a submit", lambda: "403" in (text("#flash") or "") and "submitting needs an admin token" in text("#flash"))
    if len(json.loads(run("jobs", "--json", home=env["HOME_B"]))) != 32:
        fail("a read token's submit queued a job")

    # --- B with the admin token: typed once, kept for the tab across a reload, never in a URL ---
    admin, held_b, failed_b = env["ADMIN_TOKEN"], int(env["HELD_B"]), env["FAILED_B"]
    d.find_element(By.ID, "token").send_keys(admin)
    click(By.ID, "token-use")
    until("the admin token kept in sessionStorage", lambda: d.execute_script("return sessionStorage.getItem('ckpt.token')") == admin)
    d.refresh()
    go(B + "/#/jobs/" + failed_b, "#job-view")
    until("B's failed job, after a reload", job_state_is("failed"))
    click(By.ID, "job-retry")
    accept_confirm()
    until("the admin token's retry", lambda: "Job %s queued again" % failed_b in (text("#flash") or ""))

    def b_jobs():
        return {j["id"]: j for j in json.loads(run("jobs", "--json", home=env["HOME_B"]))}
    if b_jobs()[int(failed_b)]["state"] != "queued":
        fail("the admin token's retry did not queue job %s: %s" % (failed_b, b_jobs()[int(failed_b)]))
    # Cancel all queued noops (the tab and the search), confirmed; the retried
    # convert (queued, not a noop) and the running noop are not matched.
    noops = sorted(i for i, j in b_jobs().items() if j["kind"] == "noop" and i != held_b)
    go(B + "/#/jobs", "#jobs-table")
    click(By.CSS_SELECTOR, '#job-tabs button[data-state="queued"]')
    d.find_element(By.ID, "job-search").send_keys("noop")
    until("the 30 queued noops", lambda: text('#job-tabs button[data-state="queued"] .count') == "30" and
          text("#page-info") == "page 1 of 2 (30 jobs)" and not d.find_element(By.ID, "bulk-cancel").get_attribute("disabled"))
    click_confirmed("bulk-cancel", 'Cancel all 30 queued jobs matching "noop"?')
    until("the bulk cancel", lambda: 'cancel: 30 of 30 queued jobs matching "noop"' in (text("#flash") or ""))
    jb = b_jobs()
    if [jb[i]["state"] for i in noops] != ["cancelled"] * 30 or jb[held_b]["state"] != "running" or jb[int(failed_b)]["state"] != "queued":
        fail("after cancel all: %s" % {i: j["state"] for i, j in jb.items()})
    # Retry all cancelled noops: queued again, as new (attempt 0).
    click(By.CSS_SELECTOR, '#job-tabs button[data-state="cancelled"]')
    until("the 30 cancelled noops", lambda: text('#job-tabs button[data-state="cancelled"] .count') == "30" and
          not d.find_element(By.ID, "bulk-retry").get_attribute("disabled"))
    click_confirmed("bulk-retry", 'Retry all 30 cancelled jobs matching "noop"?')
    until("the bulk retry", lambda: 'retry: 30 of 30 cancelled jobs matching "noop"' in (text("#flash") or "") and
          text('#job-tabs button[data-state="cancelled"] .count') == "0")
    jb = b_jobs()
    if [(jb[i]["state"], jb[i]["attempt"]) for i in noops] != [("queued", 0)] * 30 or jb[held_b]["state"] != "running":
        fail("after retry all: %s" % {i: (j["state"], j["attempt"]) for i, j in jb.items()})
    shot("admin-bulk-retried")
    # Neither token was ever in a URL: the address bar, this tab's history
    # (the Navigation API's entries) and, below, the profile's history database.
    urls = d.execute_script("return [location.href, ...navigation.entries().map(e => e.url)]")
    if len(urls) < 3 or any(t in u for u in urls for t in (admin, env["READ_TOKEN"])):
        fail("a token in the address bar or the tab's history: %s" % urls)
    note("admin token: retry, cancel all and retry all matching")
    print("dashboard: submit, progress with rate and ETA, pause, cancel, retry and its attempts, store page and figures "
          "after a verify, overview charts, schedules added/paused/resumed/removed, delete one and all, narrow window, "
          "a read token refused, an admin token's retry, cancel all and retry all checked")
finally:
    d.quit()

# The profile's history (Chromium writes it as it quits): the pages visited, no token.
hist = os.path.join(env["PROFILE"], "Default", "History")
con = sqlite3.connect("file:%s?mode=ro" % hist, uri=True)
visited = [r[0] for r in con.execute("SELECT url FROM urls")]
con.close()
if not any(u.startswith(env["URL_B"]) for u in visited) or any(t in u for u in visited for t in (env["ADMIN_TOKEN"], env["READ_TOKEN"])):
    print("dashboard_driver: FAIL: the browser's history: %s" % visited, file=sys.stderr)
    sys.exit(1)
