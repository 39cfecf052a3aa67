/* store_hfcache.c — a stored checkpoint written into a Hugging Face cache (see store_hfcache.h). */
#include "store/store_hfcache.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/sha256.h"
#include "common/util.h"
#include "store/materialize.h"
#include "store/store_hub.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define HFCACHE_CHUNK (1u << 20)
#define HFCACHE_REF_MAX 4096

char *store_hfcache_default_dir(void)
{
    const char *e = getenv("HF_HUB_CACHE");
    if (e && *e) return ckpt_strdup(e);
    e = getenv("HF_HOME");
    if (e && *e) return ckpt_path_join(e, "hub");
    e = getenv("XDG_CACHE_HOME");
    if (e && *e) return ckpt_sprintf("%s/huggingface/hub", e);
    e = getenv("HOME");
    if (!e || !*e) {
        ckpt_error_set(CKPT_EINVAL, "no Hugging Face cache folder: HF_HUB_CACHE, HF_HOME and HOME are unset");
        return NULL;
    }
    return ckpt_sprintf("%s/.cache/huggingface/hub", e);
}

bool store_hfcache_symlinks_disabled(void)
{
    const char *e = getenv("HF_HUB_DISABLE_SYMLINKS");
    return e && (!strcasecmp(e, "1") || !strcasecmp(e, "on") || !strcasecmp(e, "yes") || !strcasecmp(e, "true"));
}

/* A regular file (not following a link) of exactly size bytes. */
static bool have_file(const char *path, uint64_t size)
{
    struct stat st;
    return !lstat(path, &st) && S_ISREG(st.st_mode) && (uint64_t)st.st_size == size;
}

static int mkdir_parent(const char *path)
{
    char *dir = ckpt_strdup(path);
    if (!dir) return CKPT_ENOMEM;
    char *slash = strrchr(dir, '/');
    int rc = 0;
    if (slash && slash != dir) {
        *slash = 0;
        rc = ckpt_mkdir_p(dir, 0755);
    }
    free(dir);
    return rc;
}

/* Writes stored file f of c to dst: a hardlink of its blob when it is one
 * whole file and the filesystem allows, else its bytes (from the blob, or
 * assembled) checked against the catalog's sha256 before dst appears. */
static int produce(ckpt_store *s, const store_ckpt *c, const store_file_row *f, const char *dst,
                   store_hfcache_stats *st)
{
    if (unlink(dst) < 0 && errno != ENOENT) return ckpt_error_sys("%s: remove", dst);
    if (f->blob && !f->header && !store_blobs_remote(s)) { /* a bucket's blobs are read in ranges below */
        char *src = store_blob_read_path(s, f->blob);
        if (!src) return CKPT_ENOMEM;
        int ok = link(src, dst) == 0;
        free(src);
        if (ok) {
            st->linked++;
            return 0;
        }
    }
    store_file_reader *r = NULL;
    ckpt_atomic_file af = {.fd = -1};
    char *buf = ckpt_malloc(HFCACHE_CHUNK);
    ckpt_sha256 h;
    bool hashing = false;
    int rc = buf ? store_file_open(&r, s, c, f->path) : CKPT_ENOMEM;
    if (!rc) rc = ckpt_atomic_open(&af, dst);
    if (!rc) rc = ckpt_sha256_init(&h);
    if (!rc) hashing = true;
    uint64_t size = r ? store_file_size(r) : 0;
    if (!rc && size != f->size) rc = ckpt_error_set(CKPT_ECORRUPT, "'%s': the store gives %llu bytes, the catalog %llu",
                                                    f->path, (unsigned long long)size, (unsigned long long)f->size);
    for (uint64_t off = 0; !rc && off < size;) {
        size_t n = size - off < HFCACHE_CHUNK ? (size_t)(size - off) : HFCACHE_CHUNK;
        rc = store_file_read(r, off, buf, n);
        if (!rc) rc = ckpt_write_full(af.fd, buf, n, dst);
        if (!rc) rc = ckpt_sha256_update(&h, buf, n);
        off += n;
    }
    char hex[65] = "";
    if (hashing) {
        if (!rc) rc = ckpt_sha256_final_hex(&h, hex);
        ckpt_sha256_free(&h);
    }
    if (!rc && strcmp(hex, f->sha256))
        rc = ckpt_error_set(CKPT_ECORRUPT, "'%s': its bytes hash to %s, the catalog says %s (run ckpt verify)", f->path,
                            hex, f->sha256);
    if (!rc) rc = ckpt_atomic_commit(&af);
    else if (af.fd >= 0) ckpt_atomic_abort(&af);
    if (r) store_file_close(r);
    free(buf);
    if (!rc) st->copied++;
    return rc ? ckpt_error_prefix(rc, "write '%s' into the cache", f->path) : 0;
}

/* "../" for each folder of path below snapshots/{commit}/, and two more. */
static char *blob_target(const char *path, const char *etag)
{
    size_t depth = 2;
    for (const char *p = path; *p; p++) depth += *p == '/';
    char *t = ckpt_malloc(depth * 3 + strlen(etag) + 8);
    if (!t) return NULL;
    char *w = t;
    for (size_t i = 0; i < depth; i++, w += 3) memcpy(w, "../", 3);
    sprintf(w, "blobs/%s", etag);
    return t;
}

/* snapshots/{commit}/{path} -> target, unless it is that link already. */
static int snapshot_link(const char *snap, const char *target, store_hfcache_stats *st, bool *refused)
{
    char have[4096];
    ssize_t n = readlink(snap, have, sizeof have - 1);
    if (n >= 0) {
        have[n] = 0;
        if (!strcmp(have, target)) return 0;
    }
    if (unlink(snap) < 0 && errno != ENOENT) return ckpt_error_sys("%s: remove", snap);
    if (symlink(target, snap) == 0) {
        st->written++;
        return 0;
    }
    if (errno != EPERM && errno != ENOTSUP && errno != EOPNOTSUPP && errno != EACCES)
        return ckpt_error_sys("%s: symlink", snap);
    *refused = true; /* the filesystem refuses links: a copy of the file, as huggingface_hub makes */
    return 0;
}

/* Writes text to path unless path holds exactly text. */
static int write_if_changed(const char *path, const char *text, store_hfcache_stats *st)
{
    char *old = NULL;
    size_t len = 0;
    if (ckpt_read_file(path, HFCACHE_REF_MAX + (1u << 26), &old, &len) == 0 && len == strlen(text) &&
        !memcmp(old, text, len)) {
        free(old);
        return 0;
    }
    free(old);
    ckpt_error_clear();
    int rc = mkdir_parent(path);
    if (!rc) rc = ckpt_write_file_atomic(path, text, strlen(text));
    if (!rc) st->written++;
    return rc;
}

/* The refs/ names of c (store_hfcache.h); NULL-terminated, malloc'd. */
static int ref_names(const store_ckpt *c, const char *commit, char *out[3])
{
    memset(out, 0, 3 * sizeof *out);
    if (!*c->layout) {
        if (c->revision && *c->revision && strcmp(c->revision, commit)) out[0] = ckpt_strdup(c->revision);
        else return 0;
        return out[0] ? 0 : CKPT_ENOMEM;
    }
    out[0] = ckpt_sprintf("%s.%s", c->commit, c->layout);
    if (c->revision && !strcmp(c->revision, "main")) out[1] = ckpt_strdup(c->layout);
    return out[0] && (out[1] || !c->revision || strcmp(c->revision, "main")) ? 0 : CKPT_ENOMEM;
}

int store_hfcache_write(ckpt_store *s, const store_ckpt *c, const char *dir, const store_hfcache_opts *o,
                        store_hfcache_stats *st)
{
    memset(st, 0, sizeof *st);
    int rc = store_repo_name_check(c->repo);
    if (rc) return rc;
    char commit[41];
    store_hub_commit(c, commit);
    const char *slash = strchr(c->repo, '/'); /* models--ORG--NAME, as repo_folder_name() names it */
    char *repo_dir = slash ? ckpt_sprintf("%s/models--%.*s--%s", dir, (int)(slash - c->repo), c->repo, slash + 1) : NULL;
    if (!repo_dir) return slash ? CKPT_ENOMEM : ckpt_error_set(CKPT_EINVAL, "repository '%s': expected ORG/NAME", c->repo);
    char *blobs = ckpt_sprintf("%s/blobs", repo_dir), *snaps = ckpt_sprintf("%s/snapshots/%s", repo_dir, commit);
    store_file_row *rows = NULL;
    size_t n = 0;
    json_t *tree = json_object(), *files = json_object();
    rc = blobs && snaps && tree && files ? 0 : CKPT_ENOMEM;
    if (!rc) rc = ckpt_mkdir_p(snaps, 0755);
    if (!rc && !o->no_symlinks) rc = ckpt_mkdir_p(blobs, 0755);
    if (!rc) rc = store_files_load_hashed(s, c, -1, &rows, &n);
    st->files = n;
    for (size_t i = 0; !rc && i < n; i++) {
        const store_file_row *f = &rows[i];
        char etag[65], oid[41];
        rc = store_path_check(f->path);
        if (!rc) rc = store_hub_etag(s, f, etag);
        if (!rc) rc = store_hub_file_oid(s, f, oid);
        if (rc) break;
        json_t *e = json_pack("{s:I,s:s}", "size", (json_int_t)f->size, "blob_id", oid);
        if (e && store_hub_is_lfs(f)) {
            json_object_set_new(e, "lfs_sha256", json_string(f->sha256));
            json_object_set_new(e, "lfs_size", json_integer((json_int_t)f->size));
        }
        if (!e || json_object_set_new(files, f->path, e) < 0) {
            rc = CKPT_ENOMEM;
            break;
        }
        char *snap = ckpt_sprintf("%s/%s", snaps, f->path), *blob = ckpt_sprintf("%s/%s", blobs, etag);
        char *target = blob_target(f->path, etag);
        rc = snap && blob && target ? mkdir_parent(snap) : CKPT_ENOMEM;
        bool refused = o->no_symlinks;
        if (!rc && !o->no_symlinks) {
            if (!have_file(blob, f->size)) {
                rc = produce(s, c, f, blob, st);
                if (!rc) st->written++;
            }
            if (!rc) rc = snapshot_link(snap, target, st, &refused);
        }
        if (!rc && refused && !have_file(snap, f->size)) {
            rc = produce(s, c, f, snap, st);
            if (!rc) st->written++;
        }
        free(snap);
        free(blob);
        free(target);
    }
    store_files_free(rows, n);
    /* trees/{commit}.json as huggingface_hub's _tree_cache.py writes it */
    char *tree_path = !rc ? ckpt_sprintf("%s/trees/%s.json", repo_dir, commit) : NULL;
    if (!rc && json_object_set_new(tree, "format_version", json_integer(1)) == 0 &&
        json_object_set(tree, "files", files) == 0 && tree_path) {
        char *text = json_dumps(tree, JSON_INDENT(1) | JSON_SORT_KEYS);
        rc = text ? write_if_changed(tree_path, text, st) : CKPT_ENOMEM;
        free(text);
    } else if (!rc) {
        rc = CKPT_ENOMEM;
    }
    free(tree_path);
    char *names[3] = {NULL, NULL, NULL};
    if (!rc) rc = ref_names(c, commit, names);
    for (int k = 0; !rc && k < 3 && names[k]; k++) {
        rc = store_path_check(names[k]);
        char *ref = rc ? NULL : ckpt_sprintf("%s/refs/%s", repo_dir, names[k]);
        if (!rc) rc = ref ? write_if_changed(ref, commit, st) : CKPT_ENOMEM;
        free(ref);
    }
    for (int k = 0; k < 3; k++) free(names[k]);
    json_decref(tree);
    json_decref(files);
    free(blobs);
    free(snaps);
    free(repo_dir);
    return rc;
}
