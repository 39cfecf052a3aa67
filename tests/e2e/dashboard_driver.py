"""dashboard_driver.py — drives the dashboard of `ckpt serve` in Debian's
headless Chromium (chromedriver, python3-selenium) for test_dashboard.sh.

Environment (set by the script): CKPT_BIN, CKPT_HOME (daemon A's home),
URL_A (daemon A: no tokens, one worker, a Hub behind it), URL_B and HOME_B
(daemon B: --token-file), READ_TOKEN, SHOTS (where screenshots go),
PROFILE (a fresh Chromium profile folder), NOOP_ID (a running job of A that
waits for a file), FAILED_ID (a convert of A that failed: its source was not
stored yet), FAILED_B (a failed job of B), PULL_DIR (a scratch folder).

Every wait is a poll for a state with a generous ceiling that only catches a
hang (WAIT seconds); nothing here depends on how fast the machine is.
"""
import json
import os
import subprocess
import sys
import time

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
    except Exception:
        fail("timed out waiting for " + what)


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


def job_state_is(state):
    return lambda: text("#job-state .state") == state


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
    d.find_element(By.ID, "f-submit").click()
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

    # The queued tab and the search box.
    go(A + "/#/jobs", "#jobs-table")
    d.find_element(By.CSS_SELECTOR, '#job-tabs button[data-state="queued"]').click()
    until("two queued jobs", lambda: text('#job-tabs button[data-state="queued"] .count') == "2" and
          {r.get_attribute("data-state") for r in d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")} == {"queued"})
    d.find_element(By.CSS_SELECTOR, '#job-tabs button[data-state="all"]').click()
    d.find_element(By.ID, "job-search").send_keys("fetch")
    until("the search to keep only the fetch", lambda: [r.get_attribute("data-id") for r in
                                                       d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")] == [fetch_id])
    shot("jobs-search")
    note("form, tabs and search")

    # --- cancel the running noop, with confirmation ---
    go(A + "/#/jobs/" + noop, "#job-view")
    until("the noop to show as running", job_state_is("running"))
    d.find_element(By.ID, "job-cancel").click()
    accept_confirm()
    until("the noop to be cancelled", job_state_is("cancelled"))
    if json.loads(run("show", noop))["state"] != "cancelled":
        fail("the page says cancelled, the queue does not")
    shot("job-cancelled")
    note("cancel")

    # --- the submitted jobs run: live states until success, the log followed ---
    go(A + "/#/jobs/" + convert, "#job-view")
    until("the convert to succeed", job_state_is("succeeded"))
    prog = text("#job-fields .progress-text") or ""
    if "(100%)" not in prog:
        fail("a finished convert's progress reads %r" % prog)
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
    d.find_element(By.ID, "job-retry").click()
    accept_confirm()
    until("the retried convert to succeed", job_state_is("succeeded"))
    shot("job-retried")
    note("retry")

    # --- the store: a checkpoint page, its files and tensor table ---
    cks = json.loads(run("ls", "--json"))["checkpoints"]
    ref = next(c["ref"] for c in cks if c["layout"] == "neuron-tp2")
    go(A + "/#/store", "#store-table")
    until("the layout in the store list", lambda: d.find_elements(By.CSS_SELECTOR, '#store-table tr[data-ref="%s"] a' % ref))
    d.find_element(By.CSS_SELECTOR, '#store-table tr[data-ref="%s"] a' % ref).click()
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
    d.find_element(By.CSS_SELECTOR, '#rank-picker option[value="tp_rank_01/"]').click()
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
    go(A + "/#/schedules", "#schedules-missing, #schedules-table")
    shot("overview-schedules")
    note("overview and schedules")

    # --- a narrow screen: the jobs table's container stays inside the window ---
    d.set_window_size(400, 900)
    go(A + "/#/jobs", "#jobs-table")
    d.find_element(By.ID, "job-search").send_keys(Keys.CONTROL, "a", Keys.DELETE)  # the search is kept while the tab lives
    until("the jobs list on a narrow window", lambda: len(d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")) >= 4)
    over = d.execute_script("""
        const w = document.getElementById('jobs-table-wrap'), r = w.getBoundingClientRect();
        return {right: r.right, inner: window.innerWidth, page: document.documentElement.scrollWidth,
                scroll: w.scrollWidth, client: w.clientWidth};""")
    if over["right"] > over["inner"] or over["page"] > over["inner"] or over["scroll"] > over["client"]:
        fail("the jobs table overflows a 400 px window: %s" % over)
    shot("jobs-narrow")
    note("narrow window")
    d.set_window_size(1280, 900)

    # --- daemon B, with tokens: the page loads without one, a read token sees but cannot act ---
    go(B + "/#/jobs", "#main")
    until("the page to ask for a token", lambda: "401" in (text("#flash") or ""))
    d.find_element(By.ID, "token").send_keys(env["READ_TOKEN"])
    d.find_element(By.ID, "token-use").click()
    until("the jobs of B with the read token", lambda: (text("#page-info") or "").endswith("(31 jobs)"))
    if d.execute_script("return sessionStorage.getItem('ckpt.token')") != env["READ_TOKEN"]:
        fail("the token is not kept in sessionStorage")
    if env["READ_TOKEN"] in d.current_url:
        fail("the token is in the URL")
    until("31 jobs on two pages", lambda: text("#page-info") == "page 1 of 2 (31 jobs)" and
          len(d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")) == 25)
    d.find_element(By.ID, "page-next").click()
    until("the second page", lambda: text("#page-info") == "page 2 of 2 (31 jobs)" and
          [r.get_attribute("data-id") for r in d.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")] ==
          [str(i) for i in range(6, 0, -1)] and env["FAILED_B"] == "1")
    go(B + "/#/jobs/" + env["FAILED_B"], "#job-view")
    until("B's failed job", job_state_is("failed"))
    d.find_element(By.ID, "job-retry").click()
    accept_confirm()
    until("the refusal of a retry", lambda: "403" in (text("#flash") or "") and "admin token" in text("#flash"))
    shot("read-token-refused")
    note("read token")
    if json.loads(run("show", env["FAILED_B"], home=env["HOME_B"]))["state"] != "failed":
        fail("a read token's retry changed the job")
    go(B + "/#/jobs", "#submit-form")
    d.find_element(By.ID, "f-repo").send_keys("org/tiny")
    d.find_element(By.ID, "f-submit").click()
    until("the refusal of a submit", lambda: "403" in (text("#flash") or "") and "submitting needs an admin token" in text("#flash"))
    if len(json.loads(run("jobs", "--json", home=env["HOME_B"]))) != 31:
        fail("a read token's submit queued a job")
    print("dashboard: submit, progress, cancel, retry, store page, narrow window and read token checked")
finally:
    d.quit()
