"""hf_replay.py — replays the requests huggingface_hub (hf_api.py,
file_download.py) makes against a ckpt daemon, with urllib, and judges the
answers the way the client does (utils/_http.py hf_raise_for_status): which
exception a status and X-Error-Code become, which fields it reads.

    python3 hf_replay.py open URL ORIG_DIR TP2_DIR COMMIT
    python3 hf_replay.py token URL GOOD_TOKEN

Exits non-zero naming the first check that failed. Debian has no
python3-huggingface-hub; this follows its code (cited in docs/hub.md)."""
import hashlib
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request


def fail(msg):
    print(f"hf_replay: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


class Answer:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def next_link(self):  # httpx Response.links["next"]["url"]
        for part in (self.headers.get("Link") or "").split(","):
            m = re.match(r'\s*<([^>]*)>\s*;\s*rel="?next"?', part)
            if m:
                return m.group(1)
        return None


def request(method, url, data=None, token=None):
    headers = {"User-Agent": "hf_replay"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if data is not None:
        data = urllib.parse.urlencode(data, doseq=True).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return Answer(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.headers, e.read())


def raised(a):
    """The exception hf_raise_for_status raises for a (None: none), for the
    calls here (all under /api/models/ or /{repo}/resolve/)."""
    if a.status < 400:
        return None
    code, msg = a.headers.get("X-Error-Code"), a.headers.get("X-Error-Message")
    if code == "RevisionNotFound":
        return "RevisionNotFoundError"
    if code == "EntryNotFound":
        return "RemoteEntryNotFoundError"
    if code == "GatedRepo":
        return "GatedRepoError"
    if code == "RepoNotFound" or (a.status == 401 and msg != "Invalid credentials in Authorization header"):
        return "RepositoryNotFoundError"
    return "HfHubHTTPError"


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data):
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(data).hexdigest()}\n"
            f"size {len(data)}\n").encode()


def walk(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


class Failed(Exception):
    pass


def bad(msg):
    raise Failed(msg)


def open_checks(E, orig_dir, tp2_dir, commit):
    """Each numbered group runs even when another failed (a run against a
    daemon without these routes names every group that fails)."""
    repo = "Qwen/tiny"
    layout_sha = hashlib.sha1(f"{commit}.neuron-tp2".encode()).hexdigest()
    groups = [("1 model info without a revision", lambda: _g1(E, repo, commit)),
              ("2 blobs=true", lambda: _g2(E, repo, orig_dir, tp2_dir)),
              ("3 expand, paging, paths-info", lambda: _g3(E, repo, tp2_dir, layout_sha)),
              ("4 layout commit prefixes", lambda: _g4(E, repo, commit, layout_sha)),
              ("6 refs and commits", lambda: _g6(E, repo, commit, layout_sha))]
    failed = []
    for name, fn in groups:
        try:
            fn()
        except (Failed, KeyError, ValueError, TypeError) as e:
            print(f"hf_replay: FAIL ({name}): {e!r}", file=sys.stderr)
            failed.append(name)
    if failed:
        fail(f"groups {failed} failed")
    print(f"hf_replay: model info, blobs, paged expanded tree, paths-info, layout prefixes, refs, commits: ok")


def _g1(E, repo, commit):
    # 1. model_info(repo) / repo_info / repo_exists: no revision in the path.
    a = request("GET", f"{E}/api/models/{repo}")
    if a.status != 200 or a.json()["sha"] != commit:
        bad(f"model_info without a revision: {a.status} {a.body[:200]!r}")
    a = request("GET", f"{E}/api/models/Qwen/nope")
    if a.status != 404 or raised(a) != "RepositoryNotFoundError" or not a.headers.get("X-Error-Message"):
        bad(f"a missing repo: {a.status} {dict(a.headers)}")
    a = request("GET", f"{E}/api/models/{repo}/revision/{urllib.parse.quote('v9', safe='')}")
    if raised(a) != "RevisionNotFoundError":
        bad(f"revision_exists(v9) would not answer False: {a.status}")


def _g2(E, repo, orig_dir, tp2_dir):
    # 2. model_info(files_metadata=True): params={"blobs": True}.
    for rev, files in (("main", walk(orig_dir)), ("neuron-tp2", walk(tp2_dir))):
        a = request("GET", f"{E}/api/models/{repo}/revision/{rev}?blobs=True")
        if a.status != 200:
            bad(f"blobs=True at {rev}: {a.status}")
        sibs = {s["rfilename"]: s for s in a.json()["siblings"]}
        if sorted(sibs) != sorted(files):
            bad(f"siblings at {rev}: {sorted(sibs)} vs {sorted(files)}")
        lfs_seen = 0
        for path, data in files.items():
            s = sibs[path]
            if s.get("size") != len(data):
                bad(f"{rev}/{path}: size {s.get('size')} != {len(data)}")
            if s.get("lfs"):
                lfs_seen += 1
                lfs = s["lfs"]
                if (lfs["sha256"] != hashlib.sha256(data).hexdigest() or lfs["size"] != len(data)
                        or lfs["pointerSize"] != len(lfs_pointer(data)) or s["blobId"] != git_blob_id(lfs_pointer(data))):
                    bad(f"{rev}/{path}: lfs {lfs} blobId {s['blobId']}")
            elif s.get("blobId") != git_blob_id(data) or path.endswith(".safetensors"):
                bad(f"{rev}/{path}: blobId {s.get('blobId')} != {git_blob_id(data)} (or a safetensors file not LFS)")
        if not lfs_seen:
            bad(f"{rev}: no LFS sibling")


def _g3(E, repo, tp2_dir, layout_sha):
    # 3. list_repo_tree(recursive=True, expand=True) through paginate(), and
    #    get_paths_info(expand=True) on a folder (a form body).
    url = f"{E}/api/models/{repo}/tree/{urllib.parse.quote('neuron-tp2', safe='')}?recursive=True&expand=True"
    entries, pages = [], 0
    while url:
        a = request("GET", url)
        if a.status != 200:
            bad(f"tree page {pages}: {a.status} {a.body[:200]!r}")
        entries += a.json()
        pages += 1
        url = a.next_link()
        if url and ("expand=True" not in url or "recursive=True" not in url):
            bad(f"the next page lost a query parameter: {url}")
    files = walk(tp2_dir)
    got = sorted(e["path"] for e in entries if e["type"] == "file")
    if pages < 2 or got != sorted(files):
        bad(f"paged tree: {pages} pages, {got}")
    for e in entries:
        lc = e.get("lastCommit")
        if not lc or lc["id"] != layout_sha or not lc["title"] or not re.match(r"\d{4}-\d\d-\d\dT", lc["date"]):
            bad(f"tree entry without lastCommit: {e}")
    a = request("POST", f"{E}/api/models/{repo}/paths-info/neuron-tp2",
                data={"paths": ["tp_rank_00", "config.json"], "expand": True})
    info = {e["path"]: e for e in a.json()} if a.status == 200 else {}
    if set(info) != {"tp_rank_00", "config.json"} or any(e.get("lastCommit", {}).get("id") != layout_sha
                                                           for e in info.values()):
        bad(f"paths-info expand: {a.status} {a.body[:300]!r}")


def _g4(E, repo, commit, layout_sha):
    # 4. a prefix of a layout's commit, like a prefix of an original's.
    for rev, want in ((commit[:10], commit), (layout_sha[:10], layout_sha), (layout_sha, layout_sha)):
        a = request("GET", f"{E}/api/models/{repo}/revision/{rev}")
        if a.status != 200 or a.json()["sha"] != want:
            bad(f"revision {rev}: {a.status} {a.body[:200]!r}")


def _g6(E, repo, commit, layout_sha):
    # 6. list_repo_refs and list_repo_commits (paginate()).
    a = request("GET", f"{E}/api/models/{repo}/refs")
    if a.status != 200:
        bad(f"refs: {a.status} {a.body[:200]!r}")
    refs = a.json()
    br = {b["name"]: (b["ref"], b["targetCommit"]) for b in refs["branches"]}
    want = {"main": ("refs/heads/main", commit), "neuron-tp2": ("refs/heads/neuron-tp2", layout_sha),
            f"{commit}.neuron-tp2": (f"refs/heads/{commit}.neuron-tp2", layout_sha)}
    if br != want or refs["converts"] != [] or refs["tags"] != []:
        bad(f"refs: {refs}")
    for b in refs["branches"]:  # every branch resolves to its target
        a = request("GET", f"{E}/api/models/{repo}/revision/{urllib.parse.quote(b['name'], safe='')}")
        if a.status != 200 or a.json()["sha"] != b["targetCommit"]:
            bad(f"branch {b['name']} does not resolve to {b['targetCommit']}")
    url, commits = f"{E}/api/models/{repo}/commits/neuron-tp2?limit=1", []
    while url:
        a = request("GET", url)
        if a.status != 200 or a.headers.get("X-Total-Count") != "2":
            bad(f"commits: {a.status} {dict(a.headers)}")
        commits += [(c["id"], [x["user"] for x in c["authors"]], c["title"], c["message"], c["date"]) for c in a.json()]
        url = a.next_link()
        if url and "limit=1" not in url:
            bad(f"the commits' next page lost limit: {url}")
    if [c[0] for c in commits] != [layout_sha, commit]:
        bad(f"commits of the layout: {commits}")
    a = request("GET", f"{E}/api/models/{repo}/commits/main")
    if a.status != 200 or [c["id"] for c in a.json()] != [commit]:
        bad(f"commits of main: {a.status} {a.body[:200]!r}")
    if raised(request("GET", f"{E}/api/models/{repo}/commits/v9")) != "RevisionNotFoundError":
        bad("commits of a missing revision")


def token_checks(E, token):
    repo = "Qwen/tiny"
    # revision_exists / repo_exists: repo_info raises RepositoryNotFoundError -> False
    a = request("GET", f"{E}/api/models/{repo}/revision/main")
    if a.status != 401 or raised(a) != "RepositoryNotFoundError" or not a.headers.get("X-Error-Message"):
        fail(f"repo_info without a token: {a.status} {dict(a.headers)}")
    # file_exists: get_hf_file_metadata (HEAD resolve) raises RepositoryNotFoundError -> False
    a = request("HEAD", f"{E}/{repo}/resolve/main/config.json")
    if a.status != 401 or raised(a) != "RepositoryNotFoundError":
        fail(f"file_exists without a token: {a.status} {dict(a.headers)}")
    # a wrong token is reported as such, not as a missing repository
    a = request("GET", f"{E}/api/models/{repo}/revision/main", token="wrong-token-0123456789")
    if a.status != 401 or raised(a) != "HfHubHTTPError":
        fail(f"a wrong token: {a.status} {dict(a.headers)}")
    a = request("GET", f"{E}/api/models/{repo}", token=token)
    if a.status != 200:
        fail(f"with the token: {a.status}")
    print("hf_replay: 401 answers as the Hub gives them: ok")


if __name__ == "__main__":
    if sys.argv[1] == "open":
        open_checks(*sys.argv[2:6])
    else:
        token_checks(*sys.argv[2:4])
