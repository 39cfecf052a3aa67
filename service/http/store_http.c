/* store_http.c — the store and the Hub-compatible read API over HTTP (see store_http.h). */
#include "service/http/store_http.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "service/http/http_util.h"
#include "format/archive.h"
#include "format/checkpoint.h"
#include "store/materialize.h"
#include "store/store_archive.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STORE_HTTP_CHUNK (1u << 20)
#define STORE_HTTP_MAX_SEGMENTS 64
#define INLINE_OID_MAX (64u << 20) /* non-LFS files hashed for their git oid up to this size */

size_t store_http_keep_raw(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

/* ---- paths ---- */

static int hexval(int ch)
{
    return isdigit(ch) ? ch - '0' : isxdigit(ch) ? (tolower(ch) - 'a' + 10) : -1;
}

/* Percent-decodes in place; false on a bad escape or a NUL. */
static bool pct_decode(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '%') {
            int a = r[1] ? hexval((unsigned char)r[1]) : -1, b = a >= 0 && r[2] ? hexval((unsigned char)r[2]) : -1;
            if (a < 0 || b < 0 || (a == 0 && b == 0)) return false;
            *w++ = (char)(a * 16 + b);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = 0;
    return true;
}

typedef struct {
    char *buf;
    char *seg[STORE_HTTP_MAX_SEGMENTS];
    int n;
} segments;

/* Splits the raw path on '/' first, then decodes each piece (docs/hub.md). */
static bool split_path(const char *url, segments *sg)
{
    memset(sg, 0, sizeof *sg);
    sg->buf = ckpt_strdup(url);
    if (!sg->buf) return false;
    char *q = strchr(sg->buf, '?');
    if (q) *q = 0;
    char *save = NULL;
    for (char *t = strtok_r(sg->buf, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (sg->n == STORE_HTTP_MAX_SEGMENTS || !pct_decode(t)) return false;
        sg->seg[sg->n++] = t;
    }
    return true;
}

/* Joins segments [from, n) with '/'; malloc'd. */
static char *join_from(const segments *sg, int from)
{
    size_t len = 1;
    for (int i = from; i < sg->n; i++) len += strlen(sg->seg[i]) + 1;
    char *out = ckpt_malloc(len);
    if (!out) return NULL;
    out[0] = 0;
    for (int i = from; i < sg->n; i++) {
        if (i > from) strcat(out, "/");
        strcat(out, sg->seg[i]);
    }
    return out;
}

static bool path_safe(const char *p)
{
    return *p && ckpt_shard_name_safe(p);
}

/* ---- revisions ---- */

typedef struct {
    store_ckpt c;
    char sha[41]; /* the commit clients see */
    bool found;
} hub_rev;

static void sha1_hex(const void *data, size_t len, char out[41])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_Digest(data, len, md, &n, EVP_sha1(), NULL);
    for (unsigned i = 0; i < 20 && i < n; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static void set_sha(hub_rev *r)
{
    if (!*r->c.layout) {
        snprintf(r->sha, sizeof r->sha, "%.40s", r->c.commit);
        return;
    }
    char *key = ckpt_sprintf("%s.%s", r->c.commit, r->c.layout);
    if (key) sha1_hex(key, strlen(key), r->sha);
    free(key);
}

static bool repo_exists(ckpt_store *s, const char *repo)
{
    sqlite3_stmt *st;
    if (catalog_prepare(&s->cat, &st, "SELECT 1 FROM checkpoints WHERE repo = ? LIMIT 1") < 0) return false;
    sqlite3_bind_text(st, 1, repo, -1, SQLITE_STATIC);
    bool ok = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    return ok;
}

static bool try_ref(ckpt_store *s, const char *ref, hub_rev *out)
{
    if (!ref || store_resolve(s, ref, &out->c) < 0) return false;
    out->found = true;
    set_sha(out);
    return true;
}

static bool is_hex40(const char *s)
{
    size_t n = 0;
    while (isxdigit((unsigned char)s[n])) n++;
    return n == 40;
}

/* A layout revision named by its pseudo-commit. */
static bool find_by_layout_sha(ckpt_store *s, const char *repo, const char *sha, hub_rev *out)
{
    sqlite3_stmt *st;
    if (catalog_prepare(&s->cat, &st, "SELECT id FROM checkpoints WHERE repo = ? AND layout != '' ORDER BY id DESC") < 0)
        return false;
    sqlite3_bind_text(st, 1, repo, -1, SQLITE_STATIC);
    bool found = false;
    while (!found && sqlite3_step(st) == SQLITE_ROW) {
        if (store_get(s, sqlite3_column_int64(st, 0), &out->c) < 0) continue;
        set_sha(out);
        if (!strcmp(out->sha, sha)) found = out->found = true;
        else store_ckpt_free(&out->c);
    }
    sqlite3_finalize(st);
    return found;
}

static bool resolve_rev(ckpt_store *s, const char *repo, const char *rev_in, hub_rev *out)
{
    memset(out, 0, sizeof *out);
    const char *rev = !strcmp(rev_in, "HEAD") ? "main" : rev_in;
    if (strchr(rev, ':') || strchr(rev, '@')) return false;
    const char *dot = strchr(rev, '.');
    char *ref = NULL;
    bool ok = false;
    if (dot && dot - rev == 40 && is_hex40(rev)) { /* <commit>.<layout> */
        ref = ckpt_sprintf("%s@%.40s:%s", repo, rev, dot + 1);
        ok = try_ref(s, ref, out);
    }
    if (!ok) {
        free(ref);
        ref = ckpt_sprintf("%s@%s", repo, rev); /* a name given at import, a commit or its prefix */
        ok = try_ref(s, ref, out);
    }
    if (!ok && is_hex40(rev)) ok = find_by_layout_sha(s, repo, rev, out);
    if (!ok) {
        free(ref);
        ref = ckpt_sprintf("%s@main:%s", repo, rev); /* a layout of main */
        ok = try_ref(s, ref, out);
    }
    if (!ok) {
        free(ref);
        ref = ckpt_sprintf("%s:%s", repo, rev); /* a layout of the newest original */
        ok = try_ref(s, ref, out);
    }
    free(ref);
    return ok;
}

bool store_http_resolve_rev(ckpt_store *s, const char *repo, const char *rev, store_ckpt *ck, char sha[41])
{
    hub_rev r;
    if (!resolve_rev(s, repo, rev, &r)) return false;
    *ck = r.c;
    memcpy(sha, r.sha, sizeof r.sha);
    return true;
}

/* ---- files of a checkpoint ---- */

typedef struct {
    store_file_row *v;
    size_t n;
} hub_files;

static int load_hub_files(ckpt_store *s, int64_t id, hub_files *out)
{
    return store_files_load(s, id, &out->v, &out->n);
}

static void hub_files_free(hub_files *f)
{
    store_files_free(f->v, f->n);
}

/* Safetensors files (and anything too large to hash for a git oid) are LFS files. */
static bool is_lfs(const store_file_row *f)
{
    return f->header != NULL || f->size > INLINE_OID_MAX;
}

static const char *lfs_pointer(const store_file_row *f, char *buf, size_t len)
{
    snprintf(buf, len, "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %llu\n", f->sha256,
             (unsigned long long)f->size);
    return buf;
}

/* git's blob id: sha1("blob <size>\0" + content). */
static void git_oid(const void *data, size_t len, char out[41])
{
    char head[64];
    int hn = snprintf(head, sizeof head, "blob %zu", len) + 1;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha1(), NULL);
    EVP_DigestUpdate(ctx, head, (size_t)hn);
    EVP_DigestUpdate(ctx, data, len);
    EVP_DigestFinal_ex(ctx, md, &n);
    EVP_MD_CTX_free(ctx);
    for (unsigned i = 0; i < 20 && i < n; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* git oids of non-LFS files by content sha256: a file's bytes never change
 * under its sha256, so each blob is hashed once per daemon, not on every
 * tree, paths-info and resolve call. Direct-mapped on the sha256's first
 * hex digits; a collision just hashes again. */
#define OID_CACHE_SLOTS 4096
static struct {
    char sha256[65];
    char oid[41];
} oid_cache[OID_CACHE_SLOTS];
static pthread_mutex_t oid_cache_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t oid_slot(const char *sha256)
{
    char head[5];
    snprintf(head, sizeof head, "%.4s", sha256);
    return (size_t)strtoul(head, NULL, 16) % OID_CACHE_SLOTS;
}

static bool oid_cached(const char *sha256, char out[41])
{
    size_t i = oid_slot(sha256);
    pthread_mutex_lock(&oid_cache_mu);
    bool hit = !strcmp(oid_cache[i].sha256, sha256);
    if (hit) memcpy(out, oid_cache[i].oid, 41);
    pthread_mutex_unlock(&oid_cache_mu);
    return hit;
}

static void oid_remember(const char *sha256, const char oid[41])
{
    size_t i = oid_slot(sha256);
    pthread_mutex_lock(&oid_cache_mu);
    snprintf(oid_cache[i].sha256, sizeof oid_cache[i].sha256, "%s", sha256);
    memcpy(oid_cache[i].oid, oid, 41);
    pthread_mutex_unlock(&oid_cache_mu);
}

/* git's blob id of a stored blob, read in pieces (no lock held). */
static int blob_git_oid(const char *path, uint64_t size, char out[41])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ckpt_error_sys("%s: open", path);
    char head[64];
    int hn = snprintf(head, sizeof head, "blob %llu", (unsigned long long)size) + 1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    char *buf = ckpt_malloc(STORE_HTTP_CHUNK);
    int rc = ctx && buf ? 0 : CKPT_ENOMEM;
    if (!rc) {
        EVP_DigestInit_ex(ctx, EVP_sha1(), NULL);
        EVP_DigestUpdate(ctx, head, (size_t)hn);
    }
    uint64_t left = size;
    while (!rc && left) {
        ssize_t n = read(fd, buf, left < STORE_HTTP_CHUNK ? (size_t)left : STORE_HTTP_CHUNK);
        if (n < 0) rc = ckpt_error_sys("%s: read", path);
        else if (n == 0) rc = ckpt_error_set(CKPT_ECORRUPT, "%s: shorter than its catalog size", path);
        else {
            EVP_DigestUpdate(ctx, buf, (size_t)n);
            left -= (uint64_t)n;
        }
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdn = 0;
    if (ctx) EVP_DigestFinal_ex(ctx, md, &mdn);
    if (!rc)
        for (unsigned i = 0; i < 20 && i < mdn; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return rc;
}

static void file_oid(ckpt_store *s, const store_file_row *f, char out[41])
{
    char ptr[256];
    if (is_lfs(f) || !f->blob) {
        lfs_pointer(f, ptr, sizeof ptr);
        git_oid(ptr, strlen(ptr), out);
        return;
    }
    if (oid_cached(f->sha256, out)) return;
    char *path = store_blob_path(s, f->blob);
    if (path && blob_git_oid(path, f->size, out) == 0) oid_remember(f->sha256, out);
    else git_oid("", 0, out);
    free(path);
}

static json_t *file_entry(ckpt_store *s, const store_file_row *f, const hub_rev *rev, bool expand)
{
    char oid[41], ptr[256];
    file_oid(s, f, oid);
    json_t *e = json_pack("{s:s,s:s,s:I,s:s}", "type", "file", "path", f->path, "size", (json_int_t)f->size, "oid", oid);
    if (e && is_lfs(f))
        json_object_set_new(e, "lfs", json_pack("{s:s,s:I,s:I}", "oid", f->sha256, "size", (json_int_t)f->size,
                                                "pointerSize", (json_int_t)strlen(lfs_pointer(f, ptr, sizeof ptr))));
    if (e && expand) {
        char date[32];
        time_t t = (time_t)rev->c.created_at;
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S.000Z", gmtime(&t));
        json_object_set_new(e, "lastCommit", json_pack("{s:s,s:s,s:s}", "id", rev->sha, "title",
                                                       *rev->c.layout ? "ckpt convert" : "ckpt import", "date", date));
    }
    return e;
}

static json_t *dir_entry(const char *path, const hub_rev *rev)
{
    char *key = ckpt_sprintf("%s/%s", rev->sha, path);
    char oid[41] = "0000000000000000000000000000000000000000";
    if (key) sha1_hex(key, strlen(key), oid);
    free(key);
    return json_pack("{s:s,s:s,s:s}", "type", "directory", "path", path, "oid", oid);
}

/* ---- Hub endpoints ---- */

static enum MHD_Result hub_not_found(struct MHD_Connection *c, const char *what, const char *code, const char *commit)
{
    return http_send_error(c, 404, what, code, commit);
}

/* Resolves repo + rev or answers the right 404. */
static bool hub_lookup(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev, hub_rev *out,
                       enum MHD_Result *ret)
{
    if (store_repo_name_check(repo) < 0 || !repo_exists(s, repo)) {
        char msg[512];
        snprintf(msg, sizeof msg, "Repository Not Found for url: %s", repo);
        *ret = hub_not_found(c, msg, "RepoNotFound", NULL);
        return false;
    }
    if (!resolve_rev(s, repo, rev, out)) {
        char msg[512];
        snprintf(msg, sizeof msg, "Invalid rev id: %s", rev);
        *ret = hub_not_found(c, msg, "RevisionNotFound", NULL);
        return false;
    }
    return true;
}

static enum MHD_Result hub_revision(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev)
{
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, rev, &r, &ret)) return ret;
    hub_files fs;
    json_t *sib = json_array();
    if (load_hub_files(s, r.c.id, &fs) == 0) {
        for (size_t i = 0; i < fs.n; i++) json_array_append_new(sib, json_pack("{s:s}", "rfilename", fs.v[i].path));
        hub_files_free(&fs);
    }
    char date[32];
    time_t t = (time_t)r.c.created_at;
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S.000Z", gmtime(&t));
    char id[64];
    snprintf(id, sizeof id, "%.24s", r.sha);
    json_t *j = json_pack("{s:s,s:s,s:s,s:o,s:b,s:b,s:i,s:i,s:s,s:n,s:o}", "_id", id, "id", repo, "sha", r.sha,
                          "siblings", sib, "private", 0, "gated", 0, "downloads", 0, "likes", 0, "lastModified", date,
                          "pipeline_tag", "tags", json_array());
    store_ckpt_free(&r.c);
    return http_send_json(c, 200, j);
}

static bool query_flag(struct MHD_Connection *c, const char *name)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    return v && (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1"));
}

static int page_size(void)
{
    const char *e = getenv("CKPT_HUB_PAGE_SIZE");
    int n = e ? atoi(e) : HUB_PAGE_SIZE_DEFAULT;
    return n > 0 ? n : HUB_PAGE_SIZE_DEFAULT;
}

static enum MHD_Result hub_tree(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev,
                                const char *sub, const char *raw_url)
{
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, rev, &r, &ret)) return ret;
    bool recursive = query_flag(c, "recursive");
    size_t sublen = sub ? strlen(sub) : 0;
    hub_files fs;
    json_t *all = json_array();
    if (load_hub_files(s, r.c.id, &fs) == 0) {
        /* Directories first seen on the way, then files, in path order. */
        for (size_t i = 0; i < fs.n; i++) {
            const char *p = fs.v[i].path;
            if (sublen && (strncmp(p, sub, sublen) || p[sublen] != '/')) continue;
            const char *rest = sublen ? p + sublen + 1 : p;
            for (const char *slash = strchr(rest, '/'); slash; slash = recursive ? strchr(slash + 1, '/') : NULL) {
                char *dir = ckpt_strndup(p, (size_t)(slash - p));
                bool seen = false;
                size_t k;
                json_t *e;
                json_array_foreach(all, k, e) seen |= dir && !strcmp(json_string_value(json_object_get(e, "path")), dir);
                if (dir && !seen) json_array_append_new(all, dir_entry(dir, &r));
                free(dir);
                if (!recursive) break;
            }
            if (recursive || !strchr(rest, '/')) json_array_append_new(all, file_entry(s, &fs.v[i], &r, false));
        }
        hub_files_free(&fs);
    }
    if (sublen && json_array_size(all) == 0) {
        json_decref(all);
        store_ckpt_free(&r.c);
        return hub_not_found(c, "Entry not found", "EntryNotFound", r.sha);
    }
    const char *cur = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
    size_t start = cur ? (size_t)strtoull(cur, NULL, 10) : 0, per = (size_t)page_size(), total = json_array_size(all);
    json_t *page = json_array();
    for (size_t i = start; i < total && i < start + per; i++) json_array_append(page, json_array_get(all, i));
    json_decref(all);
    char *body = json_dumps(page, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(page);
    struct MHD_Response *resp = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!resp) {
        store_ckpt_free(&r.c);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (start + per < total) {
        const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
        char path[2048];
        snprintf(path, sizeof path, "%s", raw_url);
        char *q = strchr(path, '?');
        if (q) *q = 0;
        char link[3072];
        snprintf(link, sizeof link, "<http://%s%s?recursive=%s&cursor=%zu>; rel=\"next\"", host ? host : "127.0.0.1",
                 path, recursive ? "true" : "false", start + per);
        MHD_add_response_header(resp, "Link", link);
    }
    ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    store_ckpt_free(&r.c);
    return ret;
}

/* paths-info: JSON {"paths": [...], "expand": bool} or a form body. */
static enum MHD_Result hub_paths_info(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev,
                                      const char *body, size_t body_len)
{
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, rev, &r, &ret)) return ret;
    json_t *paths = json_array();
    bool expand = false;
    json_error_t err;
    json_t *j = body_len ? json_loadb(body, body_len, 0, &err) : NULL;
    if (json_is_object(j)) {
        json_t *p = json_object_get(j, "paths");
        size_t i;
        json_t *v;
        json_array_foreach(p, i, v) if (json_is_string(v)) json_array_append(paths, v);
        if (json_is_string(p)) json_array_append(paths, p);
        expand = json_is_true(json_object_get(j, "expand"));
    } else if (body_len) {
        char *form = ckpt_strndup(body, body_len), *save = NULL;
        for (char *kv = form ? strtok_r(form, "&", &save) : NULL; kv; kv = strtok_r(NULL, "&", &save)) {
            char *eq = strchr(kv, '=');
            if (!eq) continue;
            *eq = 0;
            for (char *p = eq + 1; *p; p++)
                if (*p == '+') *p = ' ';
            if (!pct_decode(kv) || !pct_decode(eq + 1)) continue;
            if (!strcmp(kv, "paths")) json_array_append_new(paths, json_string(eq + 1));
            if (!strcmp(kv, "expand")) expand = !strcmp(eq + 1, "true") || !strcmp(eq + 1, "True") || !strcmp(eq + 1, "1");
        }
        free(form);
    }
    json_decref(j);
    hub_files fs;
    json_t *out = json_array();
    if (load_hub_files(s, r.c.id, &fs) == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(paths, i, p)
        {
            const char *want = json_string_value(p);
            size_t wl = strlen(want);
            bool dir = false;
            for (size_t k = 0; k < fs.n; k++) {
                if (!strcmp(fs.v[k].path, want)) json_array_append_new(out, file_entry(s, &fs.v[k], &r, expand));
                else if (!dir && !strncmp(fs.v[k].path, want, wl) && fs.v[k].path[wl] == '/') dir = true;
            }
            if (dir) json_array_append_new(out, dir_entry(want, &r));
        }
        hub_files_free(&fs);
    }
    json_decref(paths);
    store_ckpt_free(&r.c);
    return http_send_json(c, 200, out);
}

/* ---- file bytes ---- */

typedef struct {
    store_file_reader *r;
    uint64_t start, len;
} stream_ctx;

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *sc = cls;
    if (pos >= sc->len) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t n = sc->len - pos < max ? (size_t)(sc->len - pos) : max;
    if (n > STORE_HTTP_CHUNK) n = STORE_HTTP_CHUNK;
    if (store_file_read(sc->r, sc->start + pos, buf, n) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    stream_ctx *sc = cls;
    store_file_close(sc->r);
    free(sc);
}

/* Parses a single "bytes=a-b" / "a-" / "-n" range against size T.
 * 0 no (usable) range, 1 range [*a, *b], -1 unsatisfiable. */
static int parse_range(const char *h, uint64_t T, uint64_t *a, uint64_t *b)
{
    if (!h || strncmp(h, "bytes=", 6) || strchr(h, ',')) return 0;
    const char *p = h + 6;
    char *end;
    if (*p == '-') {
        unsigned long long n = strtoull(p + 1, &end, 10);
        if (end == p + 1 || *end) return 0;
        if (T == 0 || n == 0) return -1;
        *a = n >= T ? 0 : T - n;
        *b = T - 1;
        return 1;
    }
    unsigned long long x = strtoull(p, &end, 10);
    if (end == p || *end != '-') return 0;
    const char *q = end + 1;
    unsigned long long y = T ? T - 1 : 0;
    if (*q) {
        y = strtoull(q, &end, 10);
        if (end == q || *end || y < x) return 0;
    }
    if (x >= T) return -1;
    *a = x;
    *b = y >= T ? T - 1 : y; /* clients ask one byte past the end */
    return 1;
}

/* Sends a stored file (GET/HEAD) with Range, ETag and, for the Hub, its headers. */
static enum MHD_Result send_file(ckpt_store *s, struct MHD_Connection *c, const store_ckpt *ck, const char *path,
                                 const char *method, const hub_rev *hub, bool lfs, const char *oid)
{
    store_file_reader *r;
    if (store_file_open(&r, s, ck, path) < 0)
        return hub ? hub_not_found(c, "Entry not found", "EntryNotFound", hub->sha)
                   : http_send_error(c, 404, ckpt_error_last(), NULL, NULL);
    uint64_t T = store_file_size(r), a = 0, b = T ? T - 1 : 0;
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    int pr = parse_range(range, T, &a, &b);
    char etag[80], crange[96];
    snprintf(etag, sizeof etag, "\"%s\"", hub && !lfs ? oid : store_file_sha256(r));
    /* docs/hub.md: bytes=0-0 of an empty file answers 200 */
    if (pr < 0 && T == 0 && range && !strcmp(range, "bytes=0-0")) pr = 2;
    if (pr < 0) {
        store_file_close(r);
        snprintf(crange, sizeof crange, "bytes */%llu", (unsigned long long)T);
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Content-Range", crange);
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_RANGE_NOT_SATISFIABLE, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) {
        store_file_close(r);
        return MHD_NO;
    }
    sc->r = r;
    sc->start = pr == 1 ? a : 0;
    sc->len = pr == 1 ? b - a + 1 : T;
    bool head = !strcmp(method, "HEAD");
    struct MHD_Response *resp = MHD_create_response_from_callback(sc->len, STORE_HTTP_CHUNK, stream_cb, sc, stream_free);
    if (!resp) {
        stream_free(sc);
        return MHD_NO;
    }
    (void)head; /* libmicrohttpd sends no body for HEAD */
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    MHD_add_response_header(resp, "Accept-Ranges", "bytes");
    MHD_add_response_header(resp, "ETag", etag);
    if (pr == 1) {
        snprintf(crange, sizeof crange, "bytes %llu-%llu/%llu", (unsigned long long)a, (unsigned long long)b,
                 (unsigned long long)T);
        MHD_add_response_header(resp, "Content-Range", crange);
    } else if (pr == 2) {
        MHD_add_response_header(resp, "Content-Range", "bytes */0");
    }
    if (hub) {
        MHD_add_response_header(resp, "X-Repo-Commit", hub->sha);
        if (lfs) {
            char size[32];
            snprintf(size, sizeof size, "%llu", (unsigned long long)T);
            MHD_add_response_header(resp, "X-Linked-Etag", etag);
            MHD_add_response_header(resp, "X-Linked-Size", size);
        }
    }
    enum MHD_Result ret = MHD_queue_response(c, pr == 1 ? 206 : 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result hub_resolve(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev,
                                   const char *path, const char *method, bool raw_head_only)
{
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, rev, &r, &ret)) return ret;
    hub_files fs;
    const store_file_row *f = NULL;
    if (load_hub_files(s, r.c.id, &fs) == 0)
        for (size_t i = 0; i < fs.n && !f; i++)
            if (!strcmp(fs.v[i].path, path)) f = &fs.v[i];
    if (!f) {
        ret = hub_not_found(c, "Entry not found", "EntryNotFound", r.sha);
    } else if (raw_head_only) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "X-Repo-Commit", r.sha);
        ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
    } else {
        char oid[41];
        file_oid(s, f, oid);
        ret = send_file(s, c, &r.c, path, method, &r, is_lfs(f), oid);
    }
    hub_files_free(&fs);
    store_ckpt_free(&r.c);
    return ret;
}

/* ---- /v1/checkpoints ---- */

static json_t *ckpt_json(const store_ckpt *c)
{
    char *ref = store_ckpt_ref(c);
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:b}", "ref", ref ? ref : "", "repo", c->repo, "revision",
                          c->revision, "commit", c->commit, "layout", c->layout, "total_size", (json_int_t)c->total_size,
                          "lossy", c->lossy);
    free(ref);
    return j;
}

/* ---- archive.tar ---- */

/* The tar (store_archive.h) is written by a thread into a pipe that the
 * response reads: nothing is staged on disk, and a slow client just makes
 * the writer wait. A failure found before the answer starts is an error
 * status; one found after it aborts the connection (no final chunk), so a
 * client sees a truncated transfer, never a clean 200. */
typedef struct {
    store_archive *ar;
    char *home;
    int64_t id;
    bool zstd;
    int wfd; /* the pipe's write end; closed by the writer when it ends */
    int rfd;
    int rc; /* the writer's outcome, read after joining it */
    pthread_t th;
    bool joined;
} tar_stream;

static void *tar_writer(void *arg)
{
    tar_stream *ts = arg;
    ckpt_store s; /* its own connection: the request's goes back to the pool */
    ts->rc = store_open(&s, ts->home);
    if (!ts->rc) {
        ts->rc = store_archive_write(ts->ar, &s, ts->wfd, ts->zstd);
        store_close(&s);
    }
    if (ts->rc) ckpt_warn("archive of checkpoint %lld: %s", (long long)ts->id, ckpt_error_last());
    close(ts->wfd);
    return NULL;
}

static ssize_t tar_stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    tar_stream *ts = cls;
    ssize_t n;
    do n = read(ts->rfd, buf, max);
    while (n < 0 && errno == EINTR);
    if (n > 0) return n;
    if (!ts->joined) {
        pthread_join(ts->th, NULL);
        ts->joined = true;
    }
    return n == 0 && ts->rc == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void tar_stream_free(void *cls)
{
    tar_stream *ts = cls;
    close(ts->rfd); /* a writer still at work gets EPIPE and stops */
    if (!ts->joined) pthread_join(ts->th, NULL);
    store_archive_free(ts->ar);
    free(ts->home);
    free(ts);
}

static enum MHD_Result send_archive(ckpt_store *s, struct MHD_Connection *c, const store_ckpt *ck, bool zstd)
{
    const char *rank_text = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "rank");
    long rank = -1;
    if (rank_text) {
        char *end;
        rank = strtol(rank_text, &end, 10);
        if (end == rank_text || *end || rank < 0 || rank > 1023) {
            char msg[128];
            snprintf(msg, sizeof msg, "rank '%.40s' is not a number 0..1023", rank_text);
            return http_send_error(c, 400, msg, NULL, NULL);
        }
    }
    tar_stream *ts = ckpt_calloc(1, sizeof *ts);
    int rc = ts ? store_archive_plan(s, ck, (int)rank, &ts->ar) : CKPT_ENOMEM;
    unsigned status = rc == CKPT_EINVAL ? 400 : 500;
    int p[2] = {-1, -1};
    if (!rc && !(ts->home = ckpt_strdup(s->home))) rc = CKPT_ENOMEM;
    if (!rc && pipe2(p, O_CLOEXEC) < 0) rc = ckpt_error_sys("pipe");
    if (!rc) {
        ts->id = ck->id;
        ts->zstd = zstd;
        ts->wfd = p[1];
        ts->rfd = p[0];
        if (pthread_create(&ts->th, NULL, tar_writer, ts)) {
            close(p[0]);
            close(p[1]);
            rc = ckpt_error_set(CKPT_EIO, "cannot start an archive writer");
        }
    }
    if (rc) {
        enum MHD_Result ret = http_send_error(c, status, ckpt_error_last(), NULL, NULL);
        if (ts) {
            store_archive_free(ts->ar);
            free(ts->home);
            free(ts);
        }
        return ret;
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, tar_stream_cb, ts, tar_stream_free);
    if (!resp) {
        tar_stream_free(ts);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", zstd ? "application/zstd" : "application/x-tar");
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result v1_checkpoints(ckpt_store *s, struct MHD_Connection *c, const segments *sg, const char *method)
{
    if (sg->n == 2) {
        const char *repo = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "repo");
        sqlite3_stmt *st;
        if (catalog_prepare(&s->cat, &st, "SELECT id FROM checkpoints WHERE ?1 IS NULL OR repo = ?1 ORDER BY repo, id") < 0)
            return http_send_error(c, 500, ckpt_error_last(), NULL, NULL);
        if (repo) sqlite3_bind_text(st, 1, repo, -1, SQLITE_TRANSIENT);
        json_t *list = json_array();
        while (sqlite3_step(st) == SQLITE_ROW) {
            store_ckpt ck;
            if (store_get(s, sqlite3_column_int64(st, 0), &ck) == 0) {
                json_array_append_new(list, ckpt_json(&ck));
                store_ckpt_free(&ck);
            }
        }
        sqlite3_finalize(st);
        return http_send_json(c, 200, json_pack("{s:o}", "checkpoints", list));
    }
    store_ckpt ck;
    if (store_resolve(s, sg->seg[2], &ck) < 0) return http_send_error(c, 404, ckpt_error_last(), NULL, NULL);
    enum MHD_Result ret;
    if (sg->n == 3) {
        json_t *j = ckpt_json(&ck), *files = json_array();
        hub_files fs;
        if (load_hub_files(s, ck.id, &fs) == 0) {
            for (size_t i = 0; i < fs.n; i++)
                json_array_append_new(files, json_pack("{s:s,s:I,s:s}", "path", fs.v[i].path, "size",
                                                       (json_int_t)fs.v[i].size, "sha256", fs.v[i].sha256));
            hub_files_free(&fs);
        }
        json_object_set_new(j, "files", files);
        ret = http_send_json(c, 200, j);
    } else if (sg->n >= 5 && !strcmp(sg->seg[3], "files")) {
        char *path = join_from(sg, 4);
        ret = path && path_safe(path) ? send_file(s, c, &ck, path, method, NULL, false, NULL)
                                      : http_send_error(c, 400, "bad file path", NULL, NULL);
        free(path);
    } else if (sg->n == 4 && (!strcmp(sg->seg[3], "archive.tar") || !strcmp(sg->seg[3], "archive.tar.zst"))) {
        ret = send_archive(s, c, &ck, !strcmp(sg->seg[3], "archive.tar.zst"));
    } else {
        ret = http_send_error(c, 404, "no such endpoint", NULL, NULL);
    }
    store_ckpt_free(&ck);
    return ret;
}

enum MHD_Result store_http_route(ckpt_store *s, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *body, size_t body_len, bool *handled)
{
    *handled = false;
    segments sg;
    if (!split_path(url, &sg)) {
        free(sg.buf);
        if (strncmp(url, "/v1/jobs", 8) && strcmp(url, "/metrics") && strcmp(url, "/healthz")) {
            *handled = true;
            return http_send_error(c, 400, "bad path encoding", NULL, NULL);
        }
        return MHD_NO;
    }
    enum MHD_Result ret = MHD_NO;
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (sg.n >= 2 && !strcmp(sg.seg[0], "v1") && !strcmp(sg.seg[1], "checkpoints") && get) {
        *handled = true;
        ret = v1_checkpoints(s, c, &sg, method);
    } else if (sg.n >= 6 && !strcmp(sg.seg[0], "api") && !strcmp(sg.seg[1], "models")) {
        char repo[512];
        snprintf(repo, sizeof repo, "%s/%s", sg.seg[2], sg.seg[3]);
        const char *what = sg.seg[4];
        *handled = true;
        if (!strcmp(what, "revision") && get) {
            char *rev = join_from(&sg, 5);
            ret = rev ? hub_revision(s, c, repo, rev) : MHD_NO;
            free(rev);
        } else if (!strcmp(what, "tree") && get) {
            char *sub = sg.n > 6 ? join_from(&sg, 6) : NULL;
            ret = hub_tree(s, c, repo, sg.seg[5], sub, url);
            free(sub);
        } else if (!strcmp(what, "paths-info") && !strcmp(method, "POST")) {
            ret = hub_paths_info(s, c, repo, sg.seg[5], body, body_len);
        } else {
            ret = http_send_error(c, 404, "no such endpoint", NULL, NULL);
        }
    } else if (sg.n >= 5 && (!strcmp(sg.seg[2], "resolve") || !strcmp(sg.seg[2], "raw")) && get) {
        char repo[512];
        snprintf(repo, sizeof repo, "%s/%s", sg.seg[0], sg.seg[1]);
        char *path = join_from(&sg, 4);
        *handled = true;
        bool raw = !strcmp(sg.seg[2], "raw");
        if (!path || !path_safe(path)) ret = http_send_error(c, 400, "bad file path", NULL, NULL);
        else if (raw && strcmp(method, "HEAD")) ret = http_send_error(c, 405, "raw: HEAD only", NULL, NULL);
        else ret = hub_resolve(s, c, repo, sg.seg[3], path, method, raw);
        free(path);
    }
    free(sg.buf);
    return ret;
}
