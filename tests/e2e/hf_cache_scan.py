"""hf_cache_scan.py — reads a Hugging Face cache folder the way huggingface_hub
does, and checks it against the Hub API that serves the same repository.

    python3 hf_cache_scan.py CACHE_DIR HUB_URL symlinks|copies

The scan follows huggingface_hub's utils/_cache_manager.py (_scan_cached_repo:
what scan_cache_dir lists and which layouts it calls corrupted), the tree
listing follows _tree_cache.py (read_tree_cache) and _snapshot_download.py
(_raise_if_incomplete_snapshot), and the names follow file_download.py
(hf_hub_download: the blob is named by the normalized X-Linked-Etag or ETag of
the resolve answer, the snapshot by its X-Repo-Commit, refs/{revision} holds
the commit). Prints one line per revision; exits non-zero naming what is
wrong. (Debian has no python3-huggingface-hub: this is a reimplementation.)"""
import hashlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

FILES_TO_IGNORE = {".DS_Store"}


class Corrupted(Exception):
    pass


def scan_repo(repo_path):
    """_scan_cached_repo: {commit: {"refs": set, "files": {relpath: blob_path}}}, blob sizes."""
    if not repo_path.is_dir() or "--" not in repo_path.name:
        raise Corrupted(f"not a cache repo folder: {repo_path}")
    repo_type, repo_id = repo_path.name.split("--", maxsplit=1)
    if repo_type[:-1] not in {"dataset", "model", "space"}:
        raise Corrupted(f"repo type {repo_type}")
    repo_id = repo_id.replace("--", "/")
    snapshots, refs = repo_path / "snapshots", repo_path / "refs"
    if not snapshots.is_dir():
        raise Corrupted(f"no snapshots dir: {snapshots}")
    refs_by_hash = defaultdict(set)
    if refs.exists():
        if refs.is_file():
            raise Corrupted("refs is a file")
        for ref in refs.glob("**/*"):
            if ref.is_dir() or ref.name in FILES_TO_IGNORE:
                continue
            refs_by_hash[ref.read_text()].add(str(ref.relative_to(refs)))
    revisions, blob_stats = {}, {}
    for rev in snapshots.iterdir():
        if rev.name in FILES_TO_IGNORE:
            continue
        if rev.is_file():
            raise Corrupted(f"a file in snapshots: {rev}")
        files = {}
        for f in rev.glob("**/*"):
            if f.is_dir():
                continue
            blob = Path(f).resolve()
            if not blob.exists():
                raise Corrupted(f"Blob missing (broken symlink): {blob}")
            blob_stats.setdefault(blob, blob.stat())
            files[str(f.relative_to(rev))] = blob
        revisions[rev.name] = {"refs": refs_by_hash.pop(rev.name, set()), "files": files}
    if refs_by_hash:
        raise Corrupted(f"Reference(s) refer to missing commit hashes: {dict(refs_by_hash)}")
    return repo_id, revisions, blob_stats


def read_tree_cache(repo_path, commit):
    p = repo_path / "trees" / f"{commit}.json"
    data = json.loads(p.read_text())
    if data.get("format_version") != 1:
        raise Corrupted(f"{p}: format_version {data.get('format_version')}")
    return {path: (info["size"], info["blob_id"], info.get("lfs_sha256"), info.get("lfs_size"))
            for path, info in data["files"].items()}


def head(url):
    req = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def normalize_etag(etag):  # file_download._normalize_etag
    return etag.lstrip("W/").strip('"') if etag else None


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def main(cache, hub, mode):
    repos = [p for p in Path(cache).iterdir() if p.name not in FILES_TO_IGNORE]
    if not repos:
        raise Corrupted("empty cache")
    for repo_path in repos:
        repo_id, revisions, blob_stats = scan_repo(repo_path)
        if not revisions:
            raise Corrupted(f"{repo_id}: no revision")
        for commit, rev in sorted(revisions.items()):
            if len(commit) != 40 or not rev["files"]:
                raise Corrupted(f"{repo_id}: snapshot {commit} has no files")
            tree = read_tree_cache(repo_path, commit)
            missing = [p for p in tree if p not in rev["files"]]  # _raise_if_incomplete_snapshot
            if missing or sorted(tree) != sorted(rev["files"]):
                raise Corrupted(f"{repo_id}@{commit}: tree {sorted(tree)} vs snapshot {sorted(rev['files'])}")
            for ref in rev["refs"]:  # each ref is a revision the Hub resolves to this commit
                with urllib.request.urlopen(f"{hub}/api/models/{repo_id}/revision/{urllib.parse.quote(ref, safe='')}") as r:
                    sha = json.load(r)["sha"]
                if sha != commit:
                    raise Corrupted(f"refs/{ref} = {commit}, the Hub says {sha}")
            for path, blob in sorted(rev["files"].items()):
                snap = repo_path / "snapshots" / commit / path
                data = blob.read_bytes()
                size, blob_id, lfs_sha256, lfs_size = tree[path]
                if len(data) != size:
                    raise Corrupted(f"{path}: {len(data)} bytes, the tree says {size}")
                if lfs_sha256 is not None:
                    if hashlib.sha256(data).hexdigest() != lfs_sha256 or lfs_size != size:
                        raise Corrupted(f"{path}: not the LFS file the tree names")
                elif git_blob_id(data) != blob_id:
                    raise Corrupted(f"{path}: git blob id differs from the tree's")
                status, h = head(f"{hub}/{repo_id}/resolve/{commit}/{urllib.parse.quote(path)}")
                etag = normalize_etag(h.get("X-Linked-Etag") or h.get("ETag"))
                if status != 200 or h.get("X-Repo-Commit") != commit:
                    raise Corrupted(f"{path}: resolve {status}, X-Repo-Commit {h.get('X-Repo-Commit')}")
                if mode == "symlinks":
                    link = os.readlink(snap)
                    if os.path.isabs(link) or blob != (repo_path / "blobs" / etag).resolve() or blob.parent.name != "blobs":
                        raise Corrupted(f"{path}: -> {link}, want a relative link to blobs/{etag}")
                elif snap.is_symlink() or blob != snap.resolve():
                    raise Corrupted(f"{path}: a link, where copies were asked for")
            print(f"hf_cache_scan: {repo_id} {commit} refs={sorted(rev['refs'])} files={len(rev['files'])}")
        if mode == "copies" and (repo_path / "blobs").exists() and any((repo_path / "blobs").iterdir()):
            raise Corrupted("blobs/ written although symlinks are disabled")


if __name__ == "__main__":
    try:
        main(*sys.argv[1:4])
    except (Corrupted, OSError, KeyError, ValueError) as e:
        print(f"hf_cache_scan: FAIL: {e}", file=sys.stderr)
        sys.exit(1)
