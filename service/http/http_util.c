/* http_util.c — answering requests, paths, stored files, API token digests (see http_util.h). */
#include "service/http/http_util.h"

#include "common/error.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "store/materialize.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void http_token_digest(const char *token, size_t len, unsigned char out[HTTP_TOKEN_DIGEST])
{
    unsigned int n = 0;
    if (!EVP_Digest(token, len, out, &n, EVP_sha256(), NULL) || n != HTTP_TOKEN_DIGEST)
        memset(out, 0, HTTP_TOKEN_DIGEST); /* cannot happen; an all-zero digest matches no token's */
}

bool http_token_equal(const unsigned char a[HTTP_TOKEN_DIGEST], const unsigned char b[HTTP_TOKEN_DIGEST])
{
    return CRYPTO_memcmp(a, b, HTTP_TOKEN_DIGEST) == 0;
}

/* The answer of the request this thread is serving (libmicrohttpd runs a
 * thread per connection: the handler, the body callbacks and the completion
 * of one request all run in it). */
static _Thread_local http_answer current;

void http_answer_reset(void)
{
    memset(&current, 0, sizeof current);
}

void http_answer_bytes(uint64_t n)
{
    current.bytes += n;
}

http_answer http_answer_get(void)
{
    return current;
}

enum MHD_Result http_queue(struct MHD_Connection *c, unsigned code, struct MHD_Response *r, uint64_t size)
{
    current.status = code;
    current.bytes += size;
    return MHD_queue_response(c, code, r);
}

static struct MHD_Response *text_response(const char *type, char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (r) MHD_add_response_header(r, "Content-Type", type);
    return r;
}

enum MHD_Result http_send_text(struct MHD_Connection *c, unsigned code, const char *type, char *text)
{
    size_t len = strlen(text);
    struct MHD_Response *r = text_response(type, text);
    if (!r) return MHD_NO;
    enum MHD_Result ret = http_queue(c, code, r, len);
    MHD_destroy_response(r);
    return ret;
}

static char *json_text(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(j);
    if (!s) return ckpt_strdup("{\"error\":\"out of memory\"}");
    return s;
}

enum MHD_Result http_send_json(struct MHD_Connection *c, unsigned code, json_t *j)
{
    char *s = json_text(j);
    return s ? http_send_text(c, code, "application/json", s) : MHD_NO;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned code, const char *msg, const char *hub_code,
                                  const char *repo_commit, bool message_header)
{
    char *s = json_text(json_pack("{s:s}", "error", msg));
    size_t len = s ? strlen(s) : 0;
    struct MHD_Response *r = s ? text_response("application/json", s) : NULL;
    if (!r) return MHD_NO;
    if (hub_code) MHD_add_response_header(r, "X-Error-Code", hub_code);
    if (message_header) {
        char safe[512];
        size_t i = 0;
        for (; msg[i] && i + 1 < sizeof safe; i++) safe[i] = (msg[i] < 0x20 || msg[i] == 0x7f) ? ' ' : msg[i];
        safe[i] = 0;
        MHD_add_response_header(r, "X-Error-Message", safe);
    }
    if (repo_commit) MHD_add_response_header(r, "X-Repo-Commit", repo_commit);
    if (code == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = http_queue(c, code, r, len);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result http_send_error(struct MHD_Connection *c, unsigned code, const char *msg, const char *hub_code,
                                const char *repo_commit)
{
    return send_error(c, code, msg, hub_code, repo_commit, hub_code != NULL);
}

enum MHD_Result http_send_error_msg(struct MHD_Connection *c, unsigned code, const char *msg, const char *hub_code)
{
    return send_error(c, code, msg, hub_code, NULL, true);
}

enum MHD_Result http_send_store_error(struct MHD_Connection *c, int rc, const char *what)
{
    if (rc == CKPT_ENOTFOUND) return http_send_error(c, 404, ckpt_error_last(), NULL, NULL);
    if (rc == CKPT_EINVAL) return http_send_error(c, 400, ckpt_error_last(), NULL, NULL);
    char *msg = ckpt_sprintf("%s: %s", what, ckpt_error_last());
    json_t *j = json_pack("{s:s,s:s}", "error", msg ? msg : what, "code", ckpt_code_name(rc));
    free(msg);
    return http_send_json(c, 500, j);
}

/* ---- paths ---- */

size_t http_keep_raw(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

static int hexval(int ch)
{
    return isdigit(ch) ? ch - '0' : isxdigit(ch) ? (tolower(ch) - 'a' + 10) : -1;
}

bool http_pct_decode(char *s)
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

bool http_split_path(const char *url, http_segments *sg)
{
    memset(sg, 0, sizeof *sg);
    sg->buf = ckpt_strdup(url);
    if (!sg->buf) return false;
    char *q = strchr(sg->buf, '?');
    if (q) *q = 0;
    char *save = NULL;
    for (char *t = strtok_r(sg->buf, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (sg->n == HTTP_MAX_SEGMENTS || !http_pct_decode(t)) return false;
        sg->seg[sg->n++] = t;
    }
    return true;
}

char *http_join_from(const http_segments *sg, int from)
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

bool http_path_safe(const char *p)
{
    return *p && ckpt_shard_name_safe(p);
}

/* ---- stored files ---- */

#define HTTP_FILE_CHUNK (1u << 20)

typedef struct {
    store_file_reader *r;
    uint64_t start, len;
} stream_ctx;

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *sc = cls;
    if (pos >= sc->len) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t n = sc->len - pos < max ? (size_t)(sc->len - pos) : max;
    if (n > HTTP_FILE_CHUNK) n = HTTP_FILE_CHUNK;
    if (store_file_read(sc->r, sc->start + pos, buf, n) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    http_answer_bytes(n);
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    stream_ctx *sc = cls;
    store_file_close(sc->r);
    free(sc);
}

/* A whole decimal number of a Range header (digits only, no overflow). */
static bool range_number(const char *p, const char **end, unsigned long long *v)
{
    const char *q = p;
    unsigned long long n = 0;
    while (isdigit((unsigned char)*q)) {
        unsigned d = (unsigned)(*q - '0');
        if (n > (ULLONG_MAX - d) / 10) return false;
        n = n * 10 + d;
        q++;
    }
    *end = q;
    *v = n;
    return q != p;
}

int http_parse_range(const char *h, uint64_t T, uint64_t *a, uint64_t *b)
{
    if (!h || strncmp(h, "bytes=", 6) || strchr(h, ',')) return 0;
    const char *p = h + 6, *end;
    unsigned long long x, y;
    if (*p == '-') {
        if (!range_number(p + 1, &end, &x) || *end) return 0;
        if (T == 0 || x == 0) return -1;
        *a = x >= T ? 0 : T - x;
        *b = T - 1;
        return 1;
    }
    if (!range_number(p, &end, &x) || *end != '-') return 0;
    const char *q = end + 1;
    y = T ? T - 1 : 0;
    if (*q && (!range_number(q, &end, &y) || *end || y < x)) return 0;
    if (x >= T) return -1;
    *a = x;
    *b = y >= T ? T - 1 : y; /* clients ask one byte past the end */
    return 1;
}

enum MHD_Result http_send_stored_file(ckpt_store *s, struct MHD_Connection *c, const store_ckpt *ck, const char *path,
                                      const http_hub_file *hub)
{
    store_file_reader *r;
    int orc = store_file_open(&r, s, ck, path);
    if (orc < 0) {
        if (orc != CKPT_ENOTFOUND && orc != CKPT_EINVAL) return http_send_store_error(c, orc, "open the stored file");
        return hub ? http_send_error(c, 404, "Entry not found", "EntryNotFound", hub->commit)
                   : http_send_error(c, 404, ckpt_error_last(), NULL, NULL);
    }
    uint64_t T = store_file_size(r), a = 0, b = T ? T - 1 : 0;
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    int pr = http_parse_range(range, T, &a, &b);
    char etag[80], crange[96];
    snprintf(etag, sizeof etag, "\"%s\"", hub && !hub->lfs && hub->etag ? hub->etag : store_file_sha256(r));
    if (pr < 0 && T == 0 && range && !strcmp(range, "bytes=0-0")) pr = 2; /* docs/hub.md: 200 with bytes 0-0 of an empty file */
    if (pr < 0) {
        store_file_close(r);
        snprintf(crange, sizeof crange, "bytes */%llu", (unsigned long long)T);
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Content-Range", crange);
        enum MHD_Result ret = http_queue(c, MHD_HTTP_RANGE_NOT_SATISFIABLE, resp, 0);
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
    /* libmicrohttpd sends no body for HEAD */
    struct MHD_Response *resp = MHD_create_response_from_callback(sc->len, HTTP_FILE_CHUNK, stream_cb, sc, stream_free);
    if (!resp) {
        stream_free(sc);
        return MHD_NO;
    }
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
        MHD_add_response_header(resp, "X-Repo-Commit", hub->commit);
        if (hub->lfs) {
            char size[32];
            snprintf(size, sizeof size, "%llu", (unsigned long long)T);
            MHD_add_response_header(resp, "X-Linked-Etag", etag);
            MHD_add_response_header(resp, "X-Linked-Size", size);
        }
    }
    enum MHD_Result ret = http_queue(c, pr == 1 ? 206 : 200, resp, 0);
    MHD_destroy_response(resp);
    return ret;
}
