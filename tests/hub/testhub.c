/*
 * testhub.c — ckpt-testhub: a local Hugging Face Hub for tests and the demo,
 * with faults injected on demand. NOT part of ckpt: built by the Makefile
 * for `make test` and `make demo` only.
 *
 *   ckpt-testhub --home HUB_HOME [--listen 127.0.0.1:0] [--url-file F]
 *                [--log F] [--faults SPEC] [--outlive-parent]
 *
 * It serves the checkpoints stored in HUB_HOME (`ckpt import`ed gen-model
 * folders) through the daemon's own Hub read API (service/http/hub_api.c:
 * revision, tree with paging, paths-info, resolve with Range and LFS
 * headers) and its /v1/checkpoints routes (service/http/store_api.c).
 * Requests that a fault applies to are answered here instead.
 *
 * SPEC is a comma-separated list of faults, each NAME[=VALUE][@COUNT]; COUNT
 * is how many requests it hits before it stops (default: all):
 *
 *   drop=N          file bodies longer than N bytes: close the connection after N
 *   429=S           any Hub request: 429 with Retry-After: S
 *   503             any Hub request: 503 (no Retry-After: the client's own backoff)
 *   429:file=S, 503:file   the same, for file downloads (resolve) only
 *   429date=S, 429date:file=S   the same as 429, Retry-After as an HTTP-date S seconds ahead
 *   flip=OFF        file bodies holding file offset OFF: flip one bit of that byte
 *   norange         file bodies: ignore Range, answer 200 with the whole file
 *   entry404        resolve: 404 EntryNotFound
 *   slow=MS         file bodies: a pause of MS milliseconds before every 256 KiB
 *   only=TEXT       drop, flip, norange and slow hit only files whose path holds TEXT
 *   redirect=PORT   resolve: 302 to the same path on 127.0.0.1:PORT
 *   xet=PORT        resolve: what the Hub answers for a Xet-backed file: 302 to
 *                   the same path on 127.0.0.1:PORT with a signed-URL-like query,
 *                   X-Linked-Etag W/"<sha256>" (weak form) and X-Linked-Size for
 *                   an LFS file, X-Xet-Hash, X-Repo-Commit
 *   badetag         with xet: the X-Linked-Etag names other bytes
 *   token=SECRET    every Hub request needs "Authorization: Bearer SECRET":
 *                   without one 401 RepoNotFound, with another 401
 *                   "Invalid credentials in Authorization header"
 *   gated           every Hub request of a repo: 403 GatedRepo (401 without a token)
 *   evil[=KIND]     the tree lists a file with an unsafe name: dotdot
 *                   ("../../evil", the default), abs ("/tmp/evil"), nul, ctrl, long
 *   push=DIR        after the next revision answer, import DIR as that repo's
 *                   main (a new commit pushed between two requests)
 *   endless=STATUS  any Hub request: answer STATUS with a body that never ends
 *   endless:file=STATUS   the same, for file downloads (resolve) only
 *   stall           file bodies: the headers, then not one byte, ever
 *   hold=OFF        file bodies holding file offset OFF (only= applies): the
 *                   headers, then not one byte, ever (a response the Hub holds
 *                   while a test kills the client)
 *   huge=N          the tree lists N more files "huge-K.safetensors" of 16 TiB each
 *   nohash          the tree lists config.json with neither 'oid' nor 'lfs'
 *
 * The file faults hit any revision the daemon's Hub API serves: names given
 * at import, commits, and converted layouts ("neuron-tp8", "<commit>.<layout>"
 * and the pseudo-commit a client downloads a layout by).
 *
 * POST /_testhub/faults with a SPEC body replaces the faults at run time.
 *
 * It stops on SIGTERM or SIGINT in every fault mode (a held or endless body
 * ends at the stop; the open connections get 10 s to end, then it exits 1
 * saying so), and when the process that started it dies (PR_SET_PDEATHSIG,
 * and its parent pid checked every second): a test killed by `timeout` or
 * -9 leaves no Hub behind. --outlive-parent (the demo's KEEP=1) keeps it
 * running after its parent's end.
 * Every request is logged, one line: METHOD URL auth=none|bearer|ok|bad
 * [range=...] [fault=...] — the token itself never.
 */
#include "common/error.h"
#include "common/fsutil.h"
#include "common/sanexit.h"
#include "common/util.h"
#include "service/http/http_util.h"
#include "service/http/hub_api.h"
#include "service/http/store_api.h"
#include "store/catalog.h"
#include "store/store.h"
#include "store/materialize.h"
#include "store/store_hub.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TH_MAX_SPEC 4096
#define TH_CHUNK (256u << 10)

typedef struct {
    int64_t drop_after;
    int drop_n;
    int retry_after, s429_n, s503_n;
    bool s429_file, s503_file;
    int entry404_n;
    int64_t flip_at;
    int flip_n, norange_n;
    int redirect_port, redirect_n;
    int xet_port, xet_n;
    bool badetag, retry_date;
    char token[256];
    bool gated;
    char evil[16];
    char push_dir[1024];
    char only[256];
    int slow_ms;
    int endless_status, endless_n;
    bool endless_file;
    int stall_n, huge;
    int64_t hold_at;
    int hold_n;
    bool nohash;
} faults;

static struct {
    ckpt_store store;
    pthread_mutex_t mu;
    faults f;
    FILE *log;
} hub;

/* Set by main once SIGTERM or SIGINT arrived (or the parent died): the
 * held and endless bodies end at it. */
static volatile sig_atomic_t stop;

/* The stop's safety net: connections that have not ended 10 s after it. */
static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "ckpt-testhub: connections still open 10 s after the stop; exiting\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    if (!hub.log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(hub.log, fmt, ap);
    va_end(ap);
    fputc('\n', hub.log);
    fflush(hub.log);
}

/* ---- faults ---- */

/* A fault with n hits left (-1: unlimited) fires: counts one down. */
static bool fire(int *n)
{
    if (*n == 0) return false;
    if (*n > 0) (*n)--;
    return true;
}

static int parse_faults(const char *spec, faults *f)
{
    memset(f, 0, sizeof *f);
    f->drop_after = f->flip_at = f->hold_at = -1;
    char buf[TH_MAX_SPEC], *save = NULL;
    if (strlen(spec) >= sizeof buf) return ckpt_error_set(CKPT_ELIMIT, "fault spec too long");
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*item))
            item++;
        if (!*item) continue;
        int count = -1;
        char *at = strrchr(item, '@');
        if (at) {
            *at = 0;
            count = atoi(at + 1);
        }
        char *eq = strchr(item, '=');
        const char *val = eq ? eq + 1 : "";
        if (eq) *eq = 0;
        char *scope = strchr(item, ':');
        bool file_only = scope && !strcmp(scope, ":file");
        if (scope) *scope = 0;
        if (!strcmp(item, "drop"))
            f->drop_after = atoll(val), f->drop_n = count;
        else if (!strcmp(item, "429") || !strcmp(item, "429date"))
            f->retry_after = atoi(val), f->s429_n = count, f->s429_file = file_only,
            f->retry_date = item[3] == 'd';
        else if (!strcmp(item, "503"))
            f->s503_n = count, f->s503_file = file_only;
        else if (!strcmp(item, "entry404"))
            f->entry404_n = count;
        else if (!strcmp(item, "flip"))
            f->flip_at = atoll(val), f->flip_n = count;
        else if (!strcmp(item, "norange"))
            f->norange_n = count;
        else if (!strcmp(item, "redirect"))
            f->redirect_port = atoi(val), f->redirect_n = count;
        else if (!strcmp(item, "xet"))
            f->xet_port = atoi(val), f->xet_n = count;
        else if (!strcmp(item, "badetag"))
            f->badetag = true;
        else if (!strcmp(item, "token"))
            snprintf(f->token, sizeof f->token, "%s", val);
        else if (!strcmp(item, "gated"))
            f->gated = true;
        else if (!strcmp(item, "evil"))
            snprintf(f->evil, sizeof f->evil, "%s", *val ? val : "dotdot");
        else if (!strcmp(item, "push"))
            snprintf(f->push_dir, sizeof f->push_dir, "%s", val);
        else if (!strcmp(item, "only"))
            snprintf(f->only, sizeof f->only, "%s", val);
        else if (!strcmp(item, "slow"))
            f->slow_ms = atoi(val);
        else if (!strcmp(item, "endless"))
            f->endless_status = atoi(val), f->endless_n = count, f->endless_file = file_only;
        else if (!strcmp(item, "stall"))
            f->stall_n = count;
        else if (!strcmp(item, "hold"))
            f->hold_at = atoll(val), f->hold_n = count;
        else if (!strcmp(item, "huge"))
            f->huge = atoi(val);
        else if (!strcmp(item, "nohash"))
            f->nohash = true;
        else
            return ckpt_error_set(CKPT_EINVAL, "unknown fault '%s'", item);
    }
    return 0;
}

/* ---- answers made here ---- */

static enum MHD_Result send_status(struct MHD_Connection *c, unsigned code, const char *hub_code,
                                   const char *msg, int retry_after)
{
    char *body = ckpt_sprintf("{\"error\":\"%s\"}", msg);
    struct MHD_Response *r =
        body ? MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE) : NULL;
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (hub_code) MHD_add_response_header(r, "X-Error-Code", hub_code);
    MHD_add_response_header(r, "X-Error-Message", msg);
    if (retry_after > 0) {
        char ra[64];
        time_t when = time(NULL) + retry_after;
        struct tm tm;
        if (hub.f.retry_date && gmtime_r(&when, &tm))
            strftime(ra, sizeof ra, "%a, %d %b %Y %H:%M:%S GMT", &tm); /* RFC 9110 IMF-fixdate */
        else
            snprintf(ra, sizeof ra, "%d", retry_after);
        MHD_add_response_header(r, "Retry-After", ra);
    }
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_evil_tree(struct MHD_Connection *c, const char *kind)
{
    const char *name = "../../evil";
    char longname[2100];
    if (!strcmp(kind, "abs"))
        name = "/tmp/evil";
    else if (!strcmp(kind, "nul"))
        name = "evil\\u0000.json";
    else if (!strcmp(kind, "ctrl"))
        name = "evil\\u0001.json";
    else if (!strcmp(kind, "long")) {
        memset(longname, 'x', 2000);
        memcpy(longname + 2000, ".json", 6);
        name = longname;
    }
    char *body = ckpt_sprintf(
        "[{\"type\":\"file\",\"oid\":\"0000000000000000000000000000000000000000\",\"size\":5,"
        "\"path\":\"config.json\"},{\"type\":\"file\",\"oid\":"
        "\"0000000000000000000000000000000000000000\","
        "\"size\":5,\"path\":\"%s\"}]",
        name);
    return body ? http_send_text(c, 200, "application/json", body) : MHD_NO;
}

/* An endless body ('x' forever), or one that never sends a byte (stall):
 * either ends only when the client goes away or the hub stops. */
static ssize_t endless_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    if (stop) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (cls) { /* stall */
        usleep(50000);
        return 0;
    }
    size_t n = max < TH_CHUNK ? max : TH_CHUNK;
    memset(buf, 'x', n);
    return (ssize_t)n;
}

static enum MHD_Result send_endless(struct MHD_Connection *c, unsigned code, bool stall)
{
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, TH_CHUNK, endless_cb, stall ? &hub : NULL, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", stall ? "application/octet-stream" : "text/plain");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* The repo's own tree with faults applied: config.json without oid/lfs
 * (nohash), n files of 16 TiB appended (huge). */
static enum MHD_Result send_tree_fault(struct MHD_Connection *c, const char *url)
{
    /* The tree the daemon's API would send (one page), built from the store here. */
    char repo[512], commit[128];
    const char *p = url + 12, *t = strstr(url, "/tree/");
    if (!t || (size_t)(t - p) >= sizeof repo) return http_send_error(c, 404, "bad tree url", NULL, NULL);
    snprintf(repo, sizeof repo, "%.*s", (int)(t - p), p);
    snprintf(commit, sizeof commit, "%.*s", (int)strcspn(t + 6, "?/"), t + 6);
    store_ckpt ck;
    char sha[41];
    if (hub_api_resolve_rev(&hub.store, repo, commit, &ck, sha) < 0)
        return http_send_error(c, 404, "no such revision", "RevisionNotFound", NULL);
    json_t *list = json_array();
    store_file_row *rows;
    size_t n;
    if (store_files_load(&hub.store, ck.id, &rows, &n) == 0) {
        for (size_t i = 0; i < n; i++) {
            bool st = strlen(rows[i].path) > 12 && !strcmp(rows[i].path + strlen(rows[i].path) - 12, ".safetensors");
            json_t *e = json_pack("{s:s,s:s,s:I}", "type", "file", "path", rows[i].path, "size",
                                  (json_int_t)rows[i].size);
            if (st)
                json_object_set_new(e, "lfs", json_pack("{s:s,s:I}", "oid", rows[i].sha256, "size",
                                                        (json_int_t)rows[i].size));
            else if (!(hub.f.nohash && !strcmp(rows[i].path, "config.json")))
                json_object_set_new(e, "oid", json_string("0000000000000000000000000000000000000000"));
            json_array_append_new(list, e);
        }
        store_files_free(rows, n);
    }
    for (int k = 0; k < hub.f.huge; k++) {
        char name[64];
        snprintf(name, sizeof name, "huge-%d.safetensors", k);
        json_array_append_new(
            list, json_pack("{s:s,s:s,s:I,s:{s:s,s:I}}", "type", "file", "path", name, "size",
                            (json_int_t)(1ll << 44), "lfs", "oid",
                            "0000000000000000000000000000000000000000000000000000000000000000", "size",
                            (json_int_t)(1ll << 44)));
    }
    store_ckpt_free(&ck);
    return http_send_json(c, 200, list);
}

typedef struct {
    store_file_reader *r;
    uint64_t start, len;
    int64_t drop_after; /* body bytes, or -1 */
    int64_t flip_at;    /* file offset, or -1 */
    int slow_ms;
} fault_stream;

static ssize_t fault_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    fault_stream *fs = cls;
    if (pos >= fs->len) return MHD_CONTENT_READER_END_OF_STREAM;
    if (fs->drop_after >= 0 && pos >= (uint64_t)fs->drop_after)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    /* The "slow" fault: a slow server on purpose (clients must cope); no test
     * asserts how long anything took. */
    if (stop) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (fs->slow_ms > 0) usleep((useconds_t)fs->slow_ms * 1000);
    size_t n = fs->len - pos < max ? (size_t)(fs->len - pos) : max;
    if (n > TH_CHUNK) n = TH_CHUNK;
    if (fs->drop_after >= 0 && pos + n > (uint64_t)fs->drop_after)
        n = (size_t)((uint64_t)fs->drop_after - pos);
    if (store_file_read(fs->r, fs->start + pos, buf, n) < 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    uint64_t at = fs->start + pos;
    if (fs->flip_at >= 0 && (uint64_t)fs->flip_at >= at && (uint64_t)fs->flip_at < at + n)
        buf[fs->flip_at - (int64_t)at] ^= 0x01;
    return (ssize_t)n;
}

static void fault_free(void *cls)
{
    fault_stream *fs = cls;
    store_file_close(fs->r);
    free(fs);
}

static bool pct_decode(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '%' && isxdigit((unsigned char)r[1]) && isxdigit((unsigned char)r[2])) {
            char hex[3] = {r[1], r[2], 0};
            *w++ = (char)strtol(hex, NULL, 16);
            r += 2;
        } else if (*r == '%') {
            return false;
        } else {
            *w++ = *r;
        }
    }
    *w = 0;
    return true;
}

/* GET /{org}/{name}/resolve/{rev}/{path} with the drop/flip/norange faults
 * that apply to this body; *served false when none does (the caller then
 * answers as usual). rev is any revision the daemon's Hub API serves,
 * converted layouts included. The headers are the daemon's, except the ETag
 * of a non-LFS file (its sha256 here, its git blob id there; downloads do not
 * read it). */
static enum MHD_Result faulty_resolve(struct MHD_Connection *c, const char *line, const char *repo,
                                      const char *rev, const char *path, bool *served)
{
    faults *f = &hub.f;
    *served = false;
    store_ckpt ck;
    char sha[41];
    if (hub_api_resolve_rev(&hub.store, repo, rev, &ck, sha) < 0)
        return MHD_YES; /* the usual answer says what is missing */
    store_file_reader *r;
    if (store_file_open(&r, &hub.store, &ck, path) < 0) {
        store_ckpt_free(&ck);
        return MHD_YES;
    }
    uint64_t T = store_file_size(r), a = 0, b = T ? T - 1 : 0;
    bool ranged = false;
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    unsigned long long x, y;
    bool norange = T > 0 && fire(&f->norange_n);
    if (!norange && range && sscanf(range, "bytes=%llu-%llu", &x, &y) == 2 && x <= y && x < T) {
        a = x;
        b = y < T ? y : T - 1;
        ranged = true;
    }
    uint64_t len = ranged ? b - a + 1 : T;
    int64_t drop_after = f->drop_after >= 0 && len > (uint64_t)f->drop_after && fire(&f->drop_n)
                             ? f->drop_after
                             : -1;
    int64_t flip_at = f->flip_at >= 0 && (uint64_t)f->flip_at >= a &&
                              (uint64_t)f->flip_at < a + len && fire(&f->flip_n)
                          ? f->flip_at
                          : -1;
    if (!norange && drop_after < 0 && flip_at < 0 && !f->slow_ms) {
        store_file_close(r);
        store_ckpt_free(&ck);
        return MHD_YES;
    }
    *served = true;
    logf_("%s fault=%s%s%s%s", line, drop_after >= 0 ? "drop" : "", flip_at >= 0 ? "flip" : "",
          norange ? "norange" : "", f->slow_ms ? "slow" : "");
    fault_stream *fs = calloc(1, sizeof *fs);
    if (!fs) {
        store_file_close(r);
        store_ckpt_free(&ck);
        return MHD_NO;
    }
    *fs = (fault_stream){r, a, len, drop_after, flip_at, f->slow_ms};
    struct MHD_Response *resp =
        MHD_create_response_from_callback(fs->len, TH_CHUNK, fault_cb, fs, fault_free);
    char etag[80], crange[96], size[32];
    snprintf(etag, sizeof etag, "\"%s\"", store_file_sha256(r));
    snprintf(size, sizeof size, "%llu", (unsigned long long)T);
    MHD_add_response_header(resp, "Accept-Ranges", "bytes");
    MHD_add_response_header(resp, "ETag", etag);
    MHD_add_response_header(resp, "X-Linked-Etag", etag);
    MHD_add_response_header(resp, "X-Linked-Size", size);
    MHD_add_response_header(resp, "X-Repo-Commit", sha);
    if (ranged) {
        snprintf(crange, sizeof crange, "bytes %llu-%llu/%llu", (unsigned long long)a,
                 (unsigned long long)b, (unsigned long long)T);
        MHD_add_response_header(resp, "Content-Range", crange);
    }
    enum MHD_Result ret = MHD_queue_response(c, ranged ? 206 : 200, resp);
    MHD_destroy_response(resp);
    store_ckpt_free(&ck);
    return ret;
}

/* ---- routing ---- */

typedef struct {
    char *body;
    size_t len;
} upload;

/* "/{org}/{name}/resolve/{rev}/{path...}" -> pieces (decoded); false when not a resolve URL. */
static bool split_resolve(const char *url, char *repo, size_t rl, char *rev, size_t vl, char *path,
                          size_t pl)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", url);
    char *q = strchr(buf, '?');
    if (q) *q = 0;
    char *seg[5] = {0}, *p = buf + 1;
    for (int i = 0; i < 4; i++) {
        seg[i] = p;
        p = strchr(p, '/');
        if (!p) return false;
        *p++ = 0;
    }
    seg[4] = p;
    if (strcmp(seg[2], "resolve") || !pct_decode(seg[3]) || !pct_decode(seg[4])) return false;
    snprintf(repo, rl, "%s/%s", seg[0], seg[1]);
    snprintf(rev, vl, "%s", seg[3]);
    snprintf(path, pl, "%s", seg[4]);
    return true;
}

/* The repo named by a Hub URL ("/api/models/ORG/NAME/..." or "/ORG/NAME/resolve/..."). */
static bool url_repo(const char *url, char *repo, size_t len)
{
    const char *p = !strncmp(url, "/api/models/", 12) ? url + 12 : url + 1;
    const char *s1 = strchr(p, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    if (!s1 || !s2) return false;
    snprintf(repo, len, "%.*s", (int)(s2 - p), p);
    return true;
}

static void push_commit(const char *repo, const char *dir)
{
    store_import_opts io = {.repo = repo, .revision = "main", .quiet = true};
    store_ckpt out;
    bool existed;
    if (store_import_dir(&hub.store, dir, &io, &out, &existed) == 0) {
        logf_("push %s: %s is main now", repo, out.commit);
        store_ckpt_free(&out);
    } else {
        logf_("push %s failed: %s", repo, ckpt_error_last());
    }
}

/* The resolve answer of a Xet-backed file on the Hub: a redirect to the
 * storage host, with the LFS file's hash in X-Linked-Etag. */
static enum MHD_Result send_xet_redirect(struct MHD_Connection *c, const char *url, const char *repo,
                                         const char *rev, const char *path)
{
    store_ckpt ck;
    char commit[41], sha[65] = "", size[32] = "";
    bool lfs = false;
    if (hub_api_resolve_rev(&hub.store, repo, rev, &ck, commit) < 0)
        return http_send_error(c, 404, "no such revision", "RevisionNotFound", NULL);
    store_file_row *rows;
    size_t n;
    if (store_files_load(&hub.store, ck.id, &rows, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            if (!strcmp(rows[i].path, path)) {
                lfs = store_hub_is_lfs(&rows[i]);
                snprintf(sha, sizeof sha, "%s", hub.f.badetag ? "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" : rows[i].sha256);
                snprintf(size, sizeof size, "%llu", (unsigned long long)rows[i].size);
            }
        store_files_free(rows, n);
    }
    store_ckpt_free(&ck);
    char *loc = ckpt_sprintf("http://127.0.0.1:%d%s?X-Xet-Signed-Range=bytes&Signature=abc", hub.f.xet_port, url);
    char *etag = ckpt_sprintf("W/\"%s\"", sha);
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!r || !loc || !etag) {
        free(loc);
        free(etag);
        if (r) MHD_destroy_response(r);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Location", loc);
    MHD_add_response_header(r, "X-Repo-Commit", commit);
    MHD_add_response_header(r, "X-Xet-Hash", sha);
    if (lfs) {
        MHD_add_response_header(r, "X-Linked-Etag", etag);
        MHD_add_response_header(r, "X-Linked-Size", size);
    }
    free(loc);
    free(etag);
    enum MHD_Result ret = MHD_queue_response(c, 302, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result route(struct MHD_Connection *c, const char *url, const char *method,
                             const upload *up)
{
    faults *f = &hub.f;
    if (!strcmp(url, "/_testhub/faults")) {
        if (!strcmp(method, "POST")) {
            faults nf;
            char *spec = up->body ? up->body : "";
            if (parse_faults(spec, &nf) < 0) return send_status(c, 400, NULL, ckpt_error_last(), 0);
            *f = nf;
            logf_("faults: %s", spec);
        }
        return http_send_text(c, 200, "text/plain", ckpt_strdup("ok\n"));
    }
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    bool token_ok =
        *f->token && auth && !strncmp(auth, "Bearer ", 7) && !strcmp(auth + 7, f->token);
    const char *auth_word = !auth ? "none" : !*f->token ? "bearer" : token_ok ? "ok" : "bad";
    char line[600];
    snprintf(line, sizeof line, "%s %.400s auth=%s%s%.60s", method, url, auth_word,
             range ? " range=" : "", range ? range : "");
    bool file_call = strstr(url, "/resolve/") || strstr(url, "/raw/");
    bool hub_call = !strncmp(url, "/api/", 5) || file_call;
    if (hub_call && (file_call || !f->s429_file) && fire(&f->s429_n)) {
        logf_("%s fault=429", line);
        return send_status(c, 429, NULL, "Too Many Requests", f->retry_after);
    }
    if (hub_call && (file_call || !f->s503_file) && fire(&f->s503_n)) {
        logf_("%s fault=503", line);
        return send_status(c, 503, NULL, "Service Unavailable", 0);
    }
    if (hub_call && f->endless_status && (file_call || !f->endless_file) && fire(&f->endless_n)) {
        logf_("%s fault=endless", line);
        return send_endless(c, (unsigned)f->endless_status, false);
    }
    if (hub_call && *f->token && !token_ok) {
        logf_("%s fault=token", line);
        return auth ? send_status(c, 401, NULL, "Invalid credentials in Authorization header", 0)
                    : send_status(c, 401, "RepoNotFound", "Repository Not Found", 0);
    }
    if (hub_call && f->gated) {
        logf_("%s fault=gated", line);
        return send_status(c, auth ? 403 : 401, "GatedRepo", "Access to this model is restricted",
                           0);
    }
    char repo[512], rev[256], path[2048];
    if (*f->evil && !strncmp(url, "/api/models/", 12) && strstr(url, "/tree/")) {
        logf_("%s fault=evil", line);
        return send_evil_tree(c, f->evil);
    }
    if ((f->huge || f->nohash) && !strncmp(url, "/api/models/", 12) && strstr(url, "/tree/")) {
        logf_("%s fault=%s", line, f->huge ? "huge" : "nohash");
        return send_tree_fault(c, url);
    }
    bool resolve = !strcmp(method, "GET") &&
                   split_resolve(url, repo, sizeof repo, rev, sizeof rev, path, sizeof path);
    if (resolve && fire(&f->stall_n)) {
        logf_("%s fault=stall", line);
        return send_endless(c, 200, true);
    }
    unsigned long long ra = 0, rb = ~0ull;
    if (resolve && f->hold_at >= 0 && (!*f->only || strstr(path, f->only)) &&
        (!range || sscanf(range, "bytes=%llu-%llu", &ra, &rb) == 2) && (uint64_t)f->hold_at >= ra &&
        (uint64_t)f->hold_at <= rb && fire(&f->hold_n)) {
        logf_("%s fault=hold", line);
        return send_endless(c, 206, true);
    }
    if (resolve && f->xet_port && fire(&f->xet_n)) {
        logf_("%s fault=xet", line);
        return send_xet_redirect(c, url, repo, rev, path);
    }
    if (resolve && f->redirect_port && fire(&f->redirect_n)) {
        logf_("%s fault=redirect", line);
        char *loc = ckpt_sprintf("http://127.0.0.1:%d%s", f->redirect_port, url);
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Location", loc ? loc : "/");
        free(loc);
        enum MHD_Result ret = MHD_queue_response(c, 302, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (resolve && fire(&f->entry404_n)) {
        logf_("%s fault=entry404", line);
        return send_status(c, 404, "EntryNotFound", "Entry not found", 0);
    }
    if (resolve && (f->drop_n || f->flip_n || f->norange_n || f->slow_ms) &&
        (!*f->only || strstr(path, f->only))) {
        bool served;
        enum MHD_Result ret = faulty_resolve(c, line, repo, rev, path, &served);
        if (served) return ret;
    }
    logf_("%s", line);
    bool handled;
    enum MHD_Result ret = store_api_route(&hub.store, c, url, method, &handled);
    if (!handled) ret = hub_api_route(&hub.store, c, url, method, up->body, up->len, &handled);
    if (!handled) ret = http_send_error(c, 404, "no such endpoint", NULL, NULL);
    if (*f->push_dir && !strncmp(url, "/api/models/", 12) && strstr(url, "/revision/") &&
        url_repo(url, repo, sizeof repo)) {
        /* The answer is queued; the client gets it when this returns, after the push. */
        push_commit(repo, f->push_dir);
        f->push_dir[0] = 0;
    }
    return ret;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *data,
                               size_t *data_size, void **con_cls)
{
    (void)cls;
    (void)version;
    upload *up = *con_cls;
    if (!up) {
        if (!(up = calloc(1, sizeof *up))) return MHD_NO;
        *con_cls = up;
        return MHD_YES;
    }
    if (*data_size) {
        if (up->len + *data_size < TH_MAX_SPEC) {
            char *b = realloc(up->body, up->len + *data_size + 1);
            if (!b) return MHD_NO;
            memcpy(b + up->len, data, *data_size);
            up->body = b;
            up->len += *data_size;
            up->body[up->len] = 0;
        }
        *data_size = 0;
        return MHD_YES;
    }
    pthread_mutex_lock(&hub.mu);
    enum MHD_Result r = route(c, url, method, up);
    pthread_mutex_unlock(&hub.mu);
    return r;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    upload *up = *con_cls;
    if (up) {
        free(up->body);
        free(up);
    }
    *con_cls = NULL;
}

int main(int argc, char **argv)
{
    ckpt_san_exit_prefault();
    const char *home = NULL, *listen = "127.0.0.1:0", *url_file = NULL, *log_file = NULL,
               *spec = "";
    bool outlive_parent = false;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--outlive-parent")) {
            outlive_parent = true;
            i--;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "ckpt-testhub: option '%s' needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--home"))
            home = argv[i + 1];
        else if (!strcmp(argv[i], "--listen"))
            listen = argv[i + 1];
        else if (!strcmp(argv[i], "--url-file"))
            url_file = argv[i + 1];
        else if (!strcmp(argv[i], "--log"))
            log_file = argv[i + 1];
        else if (!strcmp(argv[i], "--faults"))
            spec = argv[i + 1];
        else {
            fprintf(stderr, "ckpt-testhub: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!home) {
        fprintf(stderr, "usage: ckpt-testhub --home HUB_HOME [--listen 127.0.0.1:0] [--url-file F] "
                        "[--log F] [--faults SPEC] [--outlive-parent]\n");
        return 2;
    }
    /* SIGTERM and SIGINT are taken by sigtimedwait in the loop below: blocked
     * here, before any thread starts (the server's threads inherit the mask),
     * so none is lost between a check and a wait, and one that comes during
     * the start is handled once the loop runs. The parent's death sends
     * SIGTERM. */
    sigset_t stopsigs;
    sigemptyset(&stopsigs);
    sigaddset(&stopsigs, SIGTERM);
    sigaddset(&stopsigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stopsigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    pid_t parent = getppid();
    if (!outlive_parent) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) return 1; /* the parent died before the prctl */
    }
    pthread_mutex_init(&hub.mu, NULL);
    if (parse_faults(spec, &hub.f) < 0 || store_open(&hub.store, home) < 0) {
        fprintf(stderr, "ckpt-testhub: %s\n", ckpt_error_last());
        return 1;
    }
    hub.log = log_file ? fopen(log_file, "a") : stderr;
    unsigned port = 0;
    const char *colon = strrchr(listen, ':');
    if (colon) port = (unsigned)atoi(colon + 1);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
            MHD_USE_ERROR_LOG,
        0, NULL, NULL, handler, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
        MHD_OPTION_UNESCAPE_CALLBACK, http_keep_raw, NULL, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "ckpt-testhub: cannot listen on %s\n", listen);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", di ? di->port : port);
    if (url_file && ckpt_write_file_atomic(url_file, url, strlen(url)) < 0) {
        fprintf(stderr, "ckpt-testhub: %s\n", ckpt_error_last());
        MHD_stop_daemon(d);
        return 1;
    }
    fprintf(stderr, "ckpt-testhub: %s serving %s\n", url, hub.store.home);
    while (!stop) {
        struct timespec tick = {1, 0};
        if (sigtimedwait(&stopsigs, NULL, &tick) > 0 || (!outlive_parent && getppid() != parent))
            stop = 1;
    }
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = on_alarm;
    sigaction(SIGALRM, &act, NULL);
    alarm(10);
    MHD_stop_daemon(d);
    store_close(&hub.store);
    if (hub.log && hub.log != stderr) fclose(hub.log);
    return 0;
}
