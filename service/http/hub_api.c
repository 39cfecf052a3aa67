/* hub_api.c — the Hugging Face Hub read API over the store (see hub_api.h). */
#include "service/http/hub_api.h"

#include "common/error.h"
#include "common/log.h"
#include "common/util.h"
#include "service/http/http_util.h"
#include "store/materialize.h"
#include "store/store_hub.h"
#include "store/store_info.h"

#include <ctype.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define HUB_API_CHUNK (1u << 20)

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
    store_hub_commit(&r->c, r->sha);
}

/* 1 found, 0 no such checkpoint, < 0 the lookup failed. */
static int try_ref(ckpt_store *s, const char *ref, hub_rev *out)
{
    if (!ref) return CKPT_ENOMEM;
    int rc = store_resolve(s, ref, &out->c);
    if (rc == CKPT_ENOTFOUND || rc == CKPT_EINVAL) return 0; /* EINVAL: a rev that cannot be in a ref */
    if (rc) return rc;
    out->found = true;
    set_sha(out);
    return 1;
}

static size_t hex_len(const char *s)
{
    size_t n = 0;
    while (isxdigit((unsigned char)s[n])) n++;
    return n;
}

static bool is_hex40(const char *s)
{
    return hex_len(s) == 40;
}

/* A layout revision named by its pseudo-commit or a prefix of it (7 to 40
 * hex digits, as for an original's commit) that only one layout has: 1 found,
 * 0 none (or several), < 0 failed. */
static int find_by_layout_sha(ckpt_store *s, const char *repo, const char *sha, hub_rev *out)
{
    size_t len = strlen(sha);
    if (len < 7 || len > 40 || hex_len(sha) != len) return 0;
    store_ckpt *v;
    size_t n;
    int rc = store_repo_layouts(s, repo, &v, &n);
    if (rc) return rc;
    size_t hits = 0, hit = 0;
    for (size_t i = 0; i < n; i++) {
        out->c = v[i];
        set_sha(out);
        if (!strncasecmp(out->sha, sha, len)) {
            hits++;
            hit = i;
        }
    }
    memset(&out->c, 0, sizeof out->c);
    if (hits == 1) {
        out->c = v[hit];
        set_sha(out);
        out->found = true;
        memset(&v[hit], 0, sizeof v[hit]); /* now out's */
    }
    store_list_free(v, n);
    return hits == 1;
}

/* The default branch, what a request without a revision (or HEAD) means:
 * main, else the newest original, else the newest layout. 0, CKPT_ENOTFOUND
 * (the repository holds nothing) or a failed lookup. */
static int resolve_default(ckpt_store *s, const char *repo, hub_rev *out)
{
    memset(out, 0, sizeof *out);
    char *ref = ckpt_sprintf("%s@main", repo);
    int ok = try_ref(s, ref, out);
    free(ref);
    if (!ok) {
        ref = ckpt_strdup(repo); /* the newest original */
        ok = try_ref(s, ref, out);
        free(ref);
    }
    if (!ok) {
        store_ckpt *v;
        size_t n;
        int rc = store_repo_layouts(s, repo, &v, &n);
        if (rc) return rc;
        if (n) {
            out->c = v[0];
            memset(&v[0], 0, sizeof v[0]);
            out->found = true;
            set_sha(out);
            ok = 1;
        }
        store_list_free(v, n);
    }
    return ok > 0 ? 0 : ok == 0 ? CKPT_ENOTFOUND : ok;
}

/* 0 found, CKPT_ENOTFOUND nothing matches, another error: a lookup failed. */
static int resolve_rev(ckpt_store *s, const char *repo, const char *rev, hub_rev *out)
{
    memset(out, 0, sizeof *out);
    if (!strcmp(rev, "HEAD")) return resolve_default(s, repo, out);
    if (strchr(rev, ':') || strchr(rev, '@')) return CKPT_ENOTFOUND;
    const char *dot = strchr(rev, '.');
    char *ref = NULL;
    int ok = 0;
    if (dot && dot - rev == 40 && is_hex40(rev)) { /* <commit>.<layout> */
        ref = ckpt_sprintf("%s@%.40s:%s", repo, rev, dot + 1);
        ok = try_ref(s, ref, out);
    }
    if (!ok) {
        free(ref);
        ref = ckpt_sprintf("%s@%s", repo, rev); /* a name given at import, a commit or its prefix */
        ok = try_ref(s, ref, out);
    }
    if (!ok) ok = find_by_layout_sha(s, repo, rev, out);
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
    return ok > 0 ? 0 : ok == 0 ? CKPT_ENOTFOUND : ok;
}

int hub_api_resolve_rev(ckpt_store *s, const char *repo, const char *rev, store_ckpt *ck, char sha[41])
{
    hub_rev r;
    int rc = resolve_rev(s, repo, rev, &r);
    if (rc) return rc == CKPT_ENOTFOUND ? ckpt_error_set(rc, "%s: no revision '%s'", repo, rev) : rc;
    *ck = r.c;
    memcpy(sha, r.sha, sizeof r.sha);
    return 0;
}

/* ---- files of a checkpoint ---- */

typedef struct {
    store_file_row *v;
    size_t n;
} hub_files;

/* With the sha256 a convert in the store left pending filled in: the Hub
 * API names LFS files by them. */
static int load_hub_files(ckpt_store *s, const store_ckpt *c, hub_files *out)
{
    return store_files_load_hashed(s, c, -1, &out->v, &out->n);
}

static void hub_files_free(hub_files *f)
{
    store_files_free(f->v, f->n);
}

static bool is_lfs(const store_file_row *f)
{
    return store_hub_is_lfs(f);
}

static const char *lfs_pointer(const store_file_row *f, char *buf, size_t len)
{
    store_hub_lfs_pointer(f, buf, len);
    return buf;
}

static int file_oid(ckpt_store *s, const store_file_row *f, char out[41])
{
    return store_hub_file_oid(s, f, out);
}

static void iso_date(int64_t unix_s, char out[32])
{
    time_t t = (time_t)unix_s;
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(out, 32, "%Y-%m-%dT%H:%M:%S.000Z", &tm)) snprintf(out, 32, "1970-01-01T00:00:00.000Z");
}

/* The revision's commit as the Hub's lastCommit: every entry of a revision
 * last changed in the revision's own commit (the store keeps no history). */
static json_t *last_commit(const hub_rev *rev)
{
    char date[32];
    iso_date(rev->c.created_at, date);
    return json_pack("{s:s,s:s,s:s}", "id", rev->sha, "title", *rev->c.layout ? "ckpt convert" : "ckpt import", "date",
                     date);
}

/* Appends the entry of a file to into. */
static int file_entry(ckpt_store *s, const store_file_row *f, const hub_rev *rev, bool expand, json_t *into)
{
    char oid[41], ptr[256];
    int rc = file_oid(s, f, oid);
    if (rc) return rc;
    json_t *e = json_pack("{s:s,s:s,s:I,s:s}", "type", "file", "path", f->path, "size", (json_int_t)f->size, "oid", oid);
    if (e && is_lfs(f))
        json_object_set_new(e, "lfs", json_pack("{s:s,s:I,s:I}", "oid", f->sha256, "size", (json_int_t)f->size,
                                                "pointerSize", (json_int_t)strlen(lfs_pointer(f, ptr, sizeof ptr))));
    if (e && expand) json_object_set_new(e, "lastCommit", last_commit(rev));
    if (!e || json_array_append_new(into, e) < 0) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

/* Appends the entry of a directory to into. */
static int dir_entry(const char *path, const hub_rev *rev, bool expand, json_t *into)
{
    char *key = ckpt_sprintf("%s/%s", rev->sha, path);
    if (!key) return CKPT_ENOMEM;
    char oid[41];
    sha1_hex(key, strlen(key), oid);
    free(key);
    json_t *j = json_pack("{s:s,s:s,s:s}", "type", "directory", "path", path, "oid", oid);
    if (j && expand) json_object_set_new(j, "lastCommit", last_commit(rev));
    if (!j || json_array_append_new(into, j) < 0) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

/* ---- Hub endpoints ---- */

static enum MHD_Result hub_not_found(struct MHD_Connection *c, const char *what, const char *code, const char *commit)
{
    return http_send_error(c, 404, what, code, commit);
}

/* A lookup that failed (not: found nothing): 500 naming it. */
static enum MHD_Result hub_failed(struct MHD_Connection *c, int rc, const char *what, const char *repo)
{
    char *w = ckpt_sprintf("%s of %s", what, repo);
    enum MHD_Result ret = http_send_store_error(c, rc == CKPT_ENOTFOUND || rc == CKPT_EINVAL ? CKPT_EIO : rc,
                                                w ? w : what);
    free(w);
    return ret;
}

/* Resolves repo + rev or answers the right 404 (or a 500 when a lookup failed). */
static bool hub_lookup(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev, hub_rev *out,
                       enum MHD_Result *ret)
{
    bool exists = false;
    int rc = store_repo_name_check(repo) < 0 ? 0 : store_repo_exists(s, repo, &exists);
    if (rc) {
        *ret = hub_failed(c, rc, "look up the repository", repo);
        return false;
    }
    if (!exists) {
        char msg[512];
        snprintf(msg, sizeof msg, "Repository Not Found for url: %s", repo);
        *ret = hub_not_found(c, msg, "RepoNotFound", NULL);
        return false;
    }
    rc = rev ? resolve_rev(s, repo, rev, out) : resolve_default(s, repo, out);
    if (rc && rc != CKPT_ENOTFOUND) {
        *ret = hub_failed(c, rc, "resolve the revision", repo);
        return false;
    }
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "Invalid rev id: %s", rev ? rev : "HEAD");
        *ret = hub_not_found(c, msg, "RevisionNotFound", NULL);
        return false;
    }
    return true;
}

static bool query_flag(struct MHD_Connection *c, const char *name)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    return v && (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1"));
}

/* CKPT_HUB_PAGE_SIZE (1..1000000), else the default; junk is warned about once. */
static size_t page_size(void)
{
    const char *e = getenv("CKPT_HUB_PAGE_SIZE");
    uint64_t n;
    if (!e || !*e) return HUB_PAGE_SIZE_DEFAULT;
    if (ckpt_parse_u64_field("CKPT_HUB_PAGE_SIZE", e, 1, 1000000, &n) < 0) {
        static atomic_bool warned;
        if (!atomic_exchange(&warned, true)) ckpt_warn("%s; using %d", ckpt_error_last(), HUB_PAGE_SIZE_DEFAULT);
        return HUB_PAGE_SIZE_DEFAULT;
    }
    return (size_t)n;
}

/* The model info of a revision (rev NULL: the default branch). With
 * ?blobs=true each sibling adds size, blobId and lfs {sha256, size,
 * pointerSize}, as huggingface_hub's RepoSibling and BlobLfsInfo read them. */
static enum MHD_Result hub_revision(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev)
{
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, rev, &r, &ret)) return ret;
    bool blobs = query_flag(c, "blobs");
    hub_files fs;
    int rc = load_hub_files(s, &r.c, &fs);
    if (rc) {
        store_ckpt_free(&r.c);
        return hub_failed(c, rc, "read the files", repo);
    }
    json_t *sib = json_array();
    rc = sib ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < fs.n; i++) {
        const store_file_row *f = &fs.v[i];
        json_t *e = json_pack("{s:s}", "rfilename", f->path);
        if (e && blobs) {
            char oid[41], ptr[256];
            rc = file_oid(s, f, oid);
            if (!rc) {
                json_object_set_new(e, "blobId", json_string(oid));
                json_object_set_new(e, "size", json_integer((json_int_t)f->size));
            }
            if (!rc && is_lfs(f))
                json_object_set_new(e, "lfs",
                                    json_pack("{s:s,s:I,s:I}", "sha256", f->sha256, "size", (json_int_t)f->size,
                                              "pointerSize", (json_int_t)strlen(lfs_pointer(f, ptr, sizeof ptr))));
        }
        if (!rc && (!e || json_array_append_new(sib, e) < 0)) rc = CKPT_ENOMEM;
        else if (rc) json_decref(e);
    }
    hub_files_free(&fs);
    if (rc) {
        json_decref(sib);
        store_ckpt_free(&r.c);
        return hub_failed(c, rc, "read the files", repo);
    }
    char date[32];
    iso_date(r.c.created_at, date);
    char id[64];
    snprintf(id, sizeof id, "%.24s", r.sha);
    json_t *j = json_pack("{s:s,s:s,s:s,s:o,s:b,s:b,s:i,s:i,s:s,s:n,s:o}", "_id", id, "id", repo, "sha", r.sha,
                          "siblings", sib, "private", 0, "gated", 0, "downloads", 0, "likes", 0, "lastModified", date,
                          "pipeline_tag", "tags", json_array());
    store_ckpt_free(&r.c);
    return http_send_json(c, 200, j);
}

/* ---- paging links ---- */

typedef struct {
    char *buf;
    size_t len, cap;
    const char *skip; /* the paging parameter, given anew */
    bool oom;
} query_text;

static void qt_add(query_text *q, const char *s, size_t n)
{
    if (q->oom) return;
    if (q->len + n + 1 > q->cap) {
        size_t cap = (q->len + n + 1) * 2;
        char *b = realloc(q->buf, cap);
        if (!b) {
            q->oom = true;
            return;
        }
        q->buf = b;
        q->cap = cap;
    }
    memcpy(q->buf + q->len, s, n);
    q->len += n;
    q->buf[q->len] = 0;
}

/* Appends s percent-encoded: the arguments come raw (http_keep_raw) but for
 * '+' made a space, so escapes are kept and anything a URL in a Link header
 * may not hold raw is encoded. */
static void qt_add_enc(query_text *q, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[4];
        if (isalnum(*p) || strchr("-._~%", *p)) qt_add(q, (const char *)p, 1);
        else {
            snprintf(e, sizeof e, "%%%02X", *p);
            qt_add(q, e, 3);
        }
    }
}

static enum MHD_Result qt_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    query_text *q = cls;
    if (!key || !strcmp(key, q->skip)) return MHD_YES;
    if (q->len) qt_add(q, "&", 1);
    qt_add_enc(q, key);
    if (value) {
        qt_add(q, "=", 1);
        qt_add_enc(q, value);
    }
    return MHD_YES;
}

/* Link: <http://HOST/PATH?every query parameter but param&param=next>; rel="next". */
static void add_next_link(struct MHD_Connection *c, struct MHD_Response *resp, const char *raw_url, const char *param,
                          uint64_t next)
{
    query_text q = {.skip = param};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, qt_arg, &q);
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    size_t plen = strcspn(raw_url, "?");
    char *link = q.oom ? NULL
                       : ckpt_sprintf("<http://%s%.*s?%s%s%s=%llu>; rel=\"next\"", host ? host : "127.0.0.1", (int)plen,
                                      raw_url, q.buf ? q.buf : "", q.len ? "&" : "", param, (unsigned long long)next);
    bool clean = link != NULL;
    for (const char *p = link; clean && *p; p++) clean = *p >= 0x20 && *p != 0x7f;
    if (clean) MHD_add_response_header(resp, "Link", link);
    free(link);
    free(q.buf);
}

static enum MHD_Result hub_tree(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev,
                                const char *sub, const char *raw_url)
{
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, rev, &r, &ret)) return ret;
    bool recursive = query_flag(c, "recursive"), expand = query_flag(c, "expand");
    size_t sublen = sub ? strlen(sub) : 0;
    hub_files fs;
    int rc = load_hub_files(s, &r.c, &fs);
    if (rc) {
        store_ckpt_free(&r.c);
        return hub_failed(c, rc, "read the files", repo);
    }
    json_t *all = json_array();
    rc = all ? 0 : CKPT_ENOMEM;
    {
        /* Directories first seen on the way, then files, in path order. */
        for (size_t i = 0; !rc && i < fs.n; i++) {
            const char *p = fs.v[i].path;
            if (sublen && (strncmp(p, sub, sublen) || p[sublen] != '/')) continue;
            const char *rest = sublen ? p + sublen + 1 : p;
            for (const char *slash = strchr(rest, '/'); slash; slash = recursive ? strchr(slash + 1, '/') : NULL) {
                char *dir = ckpt_strndup(p, (size_t)(slash - p));
                bool seen = false;
                size_t k;
                json_t *e;
                json_array_foreach(all, k, e) seen |= dir && !strcmp(json_string_value(json_object_get(e, "path")), dir);
                if (!dir) rc = CKPT_ENOMEM;
                else if (!seen) rc = dir_entry(dir, &r, expand, all);
                free(dir);
                if (!recursive || rc) break;
            }
            if (!rc && (recursive || !strchr(rest, '/'))) rc = file_entry(s, &fs.v[i], &r, expand, all);
        }
        hub_files_free(&fs);
    }
    if (rc) {
        json_decref(all);
        store_ckpt_free(&r.c);
        return hub_failed(c, rc, "list the tree", repo);
    }
    if (sublen && json_array_size(all) == 0) {
        json_decref(all);
        store_ckpt_free(&r.c);
        return hub_not_found(c, "Entry not found", "EntryNotFound", r.sha);
    }
    const char *cur = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
    uint64_t start = 0;
    if (cur && ckpt_parse_u64_field("cursor", cur, 0, UINT64_MAX, &start) < 0) {
        json_decref(all);
        store_ckpt_free(&r.c);
        return http_send_error(c, 400, ckpt_error_last(), NULL, NULL);
    }
    size_t per = page_size(), total = json_array_size(all);
    json_t *page = json_array();
    for (size_t i = start < total ? (size_t)start : total; i < total && i < start + per; i++) json_array_append(page, json_array_get(all, i));
    json_decref(all);
    char *body = json_dumps(page, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(page);
    struct MHD_Response *resp = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!resp) {
        store_ckpt_free(&r.c);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (start + per < total) add_next_link(c, resp, raw_url, "cursor", start + per);
    ret = http_queue(c, 200, resp, strlen(body));
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
            if (!http_pct_decode(kv) || !http_pct_decode(eq + 1)) continue;
            if (!strcmp(kv, "paths")) json_array_append_new(paths, json_string(eq + 1));
            if (!strcmp(kv, "expand")) expand = !strcmp(eq + 1, "true") || !strcmp(eq + 1, "True") || !strcmp(eq + 1, "1");
        }
        free(form);
    }
    json_decref(j);
    hub_files fs;
    int rc = load_hub_files(s, &r.c, &fs);
    if (rc) {
        json_decref(paths);
        store_ckpt_free(&r.c);
        return hub_failed(c, rc, "read the files", repo);
    }
    json_t *out = json_array();
    rc = out ? 0 : CKPT_ENOMEM;
    {
        size_t i;
        json_t *p;
        json_array_foreach(paths, i, p)
        {
            const char *want = json_string_value(p);
            size_t wl = strlen(want);
            bool dir = false;
            for (size_t k = 0; !rc && k < fs.n; k++) {
                if (!strcmp(fs.v[k].path, want)) rc = file_entry(s, &fs.v[k], &r, expand, out);
                else if (!dir && !strncmp(fs.v[k].path, want, wl) && fs.v[k].path[wl] == '/') dir = true;
            }
            if (!rc && dir) rc = dir_entry(want, &r, expand, out);
            if (rc) break;
        }
        hub_files_free(&fs);
    }
    json_decref(paths);
    store_ckpt_free(&r.c);
    if (rc) {
        json_decref(out);
        return hub_failed(c, rc, "describe the paths", repo);
    }
    return http_send_json(c, 200, out);
}

static enum MHD_Result hub_resolve(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev,
                                   const char *path, bool raw_head_only)
{
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, rev, &r, &ret)) return ret;
    hub_files fs;
    const store_file_row *f = NULL;
    int rc = load_hub_files(s, &r.c, &fs);
    if (rc) {
        store_ckpt_free(&r.c);
        return hub_failed(c, rc, "read the files", repo);
    }
    for (size_t i = 0; i < fs.n && !f; i++)
        if (!strcmp(fs.v[i].path, path)) f = &fs.v[i];
    if (!f) {
        ret = hub_not_found(c, "Entry not found", "EntryNotFound", r.sha);
    } else if (raw_head_only) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "X-Repo-Commit", r.sha);
        ret = http_queue(c, 200, resp, 0);
        MHD_destroy_response(resp);
    } else {
        char oid[41];
        rc = file_oid(s, f, oid);
        http_hub_file hf = {.commit = r.sha, .lfs = is_lfs(f), .etag = oid};
        ret = rc ? hub_failed(c, rc, "read the file", repo) : http_send_stored_file(s, c, &r.c, path, &hf);
    }
    hub_files_free(&fs);
    store_ckpt_free(&r.c);
    return ret;
}


/* ---- refs and commits ---- */

static int add_branch(json_t *branches, const char *name, const char *sha)
{
    size_t i;
    json_t *e;
    json_array_foreach(branches, i, e) if (!strcmp(json_string_value(json_object_get(e, "name")), name)) return 0;
    char *ref = ckpt_sprintf("refs/heads/%s", name);
    json_t *b = ref ? json_pack("{s:s,s:s,s:s}", "name", name, "ref", ref, "targetCommit", sha) : NULL;
    free(ref);
    if (!b || json_array_append_new(branches, b) < 0) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

/* The repository's names as branches: each name given at import or fetch,
 * then each layout as <commit>.<layout> and, when that name leads to it, by
 * its layout name (docs/hub.md, Revisions). No tags, converts or pull
 * requests: the store does not tell a tag from a branch. */
static enum MHD_Result hub_refs(ckpt_store *s, struct MHD_Connection *c, const char *repo)
{
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, NULL, &r, &ret)) return ret;
    store_ckpt_free(&r.c);
    json_t *branches = json_array();
    store_ckpt *v = NULL;
    size_t n = 0;
    int rc = branches ? store_repo_refs(s, repo, &v, &n) : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        hub_rev b = {.c = v[i]};
        set_sha(&b);
        rc = add_branch(branches, v[i].revision, b.sha);
    }
    store_list_free(v, n);
    v = NULL;
    n = 0;
    if (!rc) rc = store_repo_layouts(s, repo, &v, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        hub_rev b = {.c = v[i]}, byname;
        set_sha(&b);
        char *name = ckpt_sprintf("%s.%s", v[i].commit, v[i].layout);
        rc = name ? add_branch(branches, name, b.sha) : CKPT_ENOMEM;
        free(name);
        int found = rc ? rc : resolve_rev(s, repo, v[i].layout, &byname);
        if (found == 0) {
            if (byname.c.id == v[i].id) rc = add_branch(branches, v[i].layout, b.sha);
            store_ckpt_free(&byname.c);
        } else if (found != CKPT_ENOTFOUND) {
            rc = found;
        }
    }
    store_list_free(v, n);
    if (rc) {
        json_decref(branches);
        return hub_failed(c, rc, "list the refs", repo);
    }
    return http_send_json(c, 200, json_pack("{s:o,s:[],s:[],s:[]}", "branches", branches, "converts", "tags",
                                            "pullRequests"));
}

static int add_commit(json_t *into, const hub_rev *r, const char *message)
{
    char date[32];
    iso_date(r->c.created_at, date);
    json_t *j = json_pack("{s:s,s:s,s:s,s:[],s:s}", "id", r->sha, "title",
                          *r->c.layout ? "ckpt convert" : "ckpt import", "message", message, "authors", "date", date);
    if (!j || json_array_append_new(into, j) < 0) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    return 0;
}

/* A revision's history, newest first: its commit, and for a layout the
 * original it was converted from (when still stored). ?limit=N (1..1000,
 * default 50) and ?p=PAGE page it, with X-Total-Count and a Link to the next. */
static enum MHD_Result hub_commits(ckpt_store *s, struct MHD_Connection *c, const char *repo, const char *rev,
                                   const char *raw_url)
{
    uint64_t limit = 50, page = 0;
    const char *l = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    const char *p = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "p");
    if ((l && ckpt_parse_u64_field("limit", l, 1, 1000, &limit) < 0) ||
        (p && ckpt_parse_u64_field("p", p, 0, 1000000, &page) < 0))
        return http_send_error(c, 400, ckpt_error_last(), NULL, NULL);
    hub_rev r;
    enum MHD_Result ret;
    if (!hub_lookup(s, c, repo, rev, &r, &ret)) return ret;
    json_t *all = json_array();
    int rc = all ? 0 : CKPT_ENOMEM;
    char *msg = *r.c.layout ? ckpt_sprintf("layout %s of %s", r.c.layout, r.c.commit)
                            : ckpt_sprintf("%s@%s", r.c.repo, r.c.revision);
    if (!rc) rc = msg ? add_commit(all, &r, msg) : CKPT_ENOMEM;
    free(msg);
    if (!rc && *r.c.layout && r.c.source_id) {
        hub_rev src = {0};
        int g = store_get(s, r.c.source_id, &src.c);
        if (g == 0) {
            set_sha(&src);
            msg = ckpt_sprintf("%s@%s", src.c.repo, src.c.revision);
            rc = msg ? add_commit(all, &src, msg) : CKPT_ENOMEM;
            free(msg);
            store_ckpt_free(&src.c);
        } else if (g != CKPT_ENOTFOUND) {
            rc = g;
        }
    }
    store_ckpt_free(&r.c);
    if (rc) {
        json_decref(all);
        return hub_failed(c, rc, "list the commits", repo);
    }
    size_t total = json_array_size(all);
    json_t *out = json_array();
    for (uint64_t i = page * limit; out && i < total && i < (page + 1) * limit; i++)
        json_array_append(out, json_array_get(all, (size_t)i));
    json_decref(all);
    char *body = out ? json_dumps(out, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(out);
    struct MHD_Response *resp = body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    char count[32];
    snprintf(count, sizeof count, "%zu", total);
    MHD_add_response_header(resp, "X-Total-Count", count);
    if ((page + 1) * limit < total) add_next_link(c, resp, raw_url, "p", page + 1);
    ret = http_queue(c, 200, resp, strlen(body));
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result hub_api_route(ckpt_store *s, struct MHD_Connection *c, const char *url, const char *method,
                              const char *body, size_t body_len, bool *handled)
{
    *handled = false;
    if (!strncmp(url, "/v1/", 4) || !strcmp(url, "/metrics") || !strcmp(url, "/healthz")) return MHD_NO;
    http_segments sg;
    if (!http_split_path(url, &sg)) {
        free(sg.buf);
        *handled = true;
        return http_send_error(c, 400, "bad path encoding", NULL, NULL);
    }
    enum MHD_Result ret = MHD_NO;
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (sg.n >= 4 && !strcmp(sg.seg[0], "api") && !strcmp(sg.seg[1], "models")) {
        char repo[512];
        snprintf(repo, sizeof repo, "%s/%s", sg.seg[2], sg.seg[3]);
        const char *what = sg.n > 4 ? sg.seg[4] : "";
        *handled = true;
        if (sg.n == 4 && get) {
            ret = hub_revision(s, c, repo, NULL);
        } else if (sg.n == 5 && !strcmp(what, "refs") && get) {
            ret = hub_refs(s, c, repo);
        } else if (sg.n < 6) {
            ret = http_send_error(c, 404, "no such endpoint", NULL, NULL);
        } else if (!strcmp(what, "commits") && get) {
            char *rev = http_join_from(&sg, 5);
            ret = rev ? hub_commits(s, c, repo, rev, url) : MHD_NO;
            free(rev);
        } else if (!strcmp(what, "revision") && get) {
            char *rev = http_join_from(&sg, 5);
            ret = rev ? hub_revision(s, c, repo, rev) : MHD_NO;
            free(rev);
        } else if (!strcmp(what, "tree") && get) {
            char *sub = sg.n > 6 ? http_join_from(&sg, 6) : NULL;
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
        char *path = http_join_from(&sg, 4);
        *handled = true;
        bool raw = !strcmp(sg.seg[2], "raw");
        if (!path || !http_path_safe(path)) ret = http_send_error(c, 400, "bad file path", NULL, NULL);
        else if (raw && strcmp(method, "HEAD")) ret = http_send_error(c, 405, "raw: HEAD only", NULL, NULL);
        else ret = hub_resolve(s, c, repo, sg.seg[3], path, raw);
        free(path);
    }
    free(sg.buf);
    return ret;
}
