/*
 * s3.c — the S3 client of s3.h: SigV4 through libcurl, canonical query
 * strings, retries, multipart uploads, ranged GETs, ListObjectsV2 (expat).
 */
#include "store/s3.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <expat.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define S3_ERR_BODY_MAX (64u << 10) /* an error response kept for its code */
#define S3_XML_TEXT_MAX 4096u       /* one element's text */
#define S3_EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct s3_client {
    CURL *e;
    char *bucket, *name; /* name: "s3://BUCKET" */
    char *endpoint;      /* without a trailing '/' */
    char *sigv4;         /* "aws:amz:REGION:s3" */
    char *access, *secret;
    unsigned retries, backoff_ms;
    uint64_t multipart_min;
    uint64_t n_requests, n_retries, bytes_in;
};

/* ---- configuration ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_rc;
static void curl_init_once(void) { curl_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static bool bucket_ok(const char *b, size_t n)
{
    if (n < 3 || n > 63) return false;
    for (size_t i = 0; i < n; i++)
        if (!(islower((unsigned char)b[i]) || isdigit((unsigned char)b[i]) || b[i] == '.' || b[i] == '-'))
            return false;
    return true;
}

int s3_url_parse(const char *url, char **bucket, char **prefix)
{
    *bucket = *prefix = NULL;
    if (strncmp(url, "s3://", 5) != 0) return ckpt_error_set(CKPT_EINVAL, "%s: not an s3://BUCKET/PREFIX URL", url);
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t bn = slash ? (size_t)(slash - b) : strlen(b);
    if (!bucket_ok(b, bn))
        return ckpt_error_set(CKPT_EINVAL, "%s: bucket name must be 3 to 63 of a-z, 0-9, '.', '-'", url);
    const char *p = slash ? slash + 1 : "";
    while (*p == '/') p++;
    size_t pn = strlen(p);
    while (pn && p[pn - 1] == '/') pn--;
    if (pn > 512) return ckpt_error_set(CKPT_ELIMIT, "%s: prefix longer than 512 bytes", url);
    for (size_t i = 0; i < pn; i++)
        if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
            return ckpt_error_set(CKPT_EINVAL, "%s: control character in the prefix", url);
    *bucket = ckpt_strndup(b, bn);
    *prefix = ckpt_strndup(p, pn);
    if (!*bucket || !*prefix) {
        free(*bucket), free(*prefix);
        *bucket = *prefix = NULL;
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    }
    return 0;
}

static unsigned env_uint(const char *name, unsigned dflt, unsigned min, unsigned max)
{
    const char *v = getenv(name);
    uint64_t x;
    if (!v || !*v || ckpt_parse_u64(v, &x) < 0) return dflt;
    return x < min ? min : x > max ? max : (unsigned)x;
}

int s3_open(const char *bucket, s3_client **out)
{
    *out = NULL;
    if (!bucket_ok(bucket, strlen(bucket)))
        return ckpt_error_set(CKPT_EINVAL, "s3://%s: bucket name must be 3 to 63 of a-z, 0-9, '.', '-'", bucket);
    const char *ak = getenv("AWS_ACCESS_KEY_ID"), *sk = getenv("AWS_SECRET_ACCESS_KEY");
    if (!ak || !*ak || !sk || !*sk)
        return ckpt_error_set(CKPT_EINVAL, "s3://%s: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set", bucket);
    const char *region = getenv("AWS_REGION");
    if (!region || !*region) region = getenv("AWS_DEFAULT_REGION");
    if (!region || !*region) region = "us-east-1";
    for (const char *r = region; *r; r++)
        if (!isalnum((unsigned char)*r) && *r != '-')
            return ckpt_error_set(CKPT_EINVAL, "AWS_REGION '%s': not a region name", region);
    const char *ep = getenv("AWS_ENDPOINT_URL");
    pthread_once(&curl_once, curl_init_once);
    if (curl_rc != CURLE_OK) return ckpt_error_set(CKPT_EIO, "libcurl: %s", curl_easy_strerror(curl_rc));

    s3_client *c = ckpt_calloc(1, sizeof *c);
    if (!c) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    c->bucket = ckpt_strdup(bucket);
    c->name = ckpt_sprintf("s3://%s", bucket);
    c->endpoint = ep && *ep ? ckpt_strdup(ep) : ckpt_sprintf("https://s3.%s.amazonaws.com", region);
    c->sigv4 = ckpt_sprintf("aws:amz:%s:s3", region);
    c->access = ckpt_strdup(ak);
    c->secret = ckpt_strdup(sk);
    c->e = curl_easy_init();
    if (!c->bucket || !c->name || !c->endpoint || !c->sigv4 || !c->access || !c->secret || !c->e) {
        s3_close(c);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    }
    size_t n = strlen(c->endpoint);
    while (n && c->endpoint[n - 1] == '/') c->endpoint[--n] = '\0';
    if (strncmp(c->endpoint, "http://", 7) && strncmp(c->endpoint, "https://", 8)) {
        int rc = ckpt_error_set(CKPT_EINVAL, "AWS_ENDPOINT_URL '%s': not an http:// or https:// URL", c->endpoint);
        s3_close(c);
        return rc;
    }
    c->retries = env_uint("CKPT_S3_RETRIES", 6, 1, 100);
    c->backoff_ms = env_uint("CKPT_S3_BACKOFF_MS", 200, 0, 60000);
    c->multipart_min = (uint64_t)env_uint("CKPT_S3_MULTIPART_MB", 64, 8, 1u << 20) << 20;
    *out = c;
    return 0;
}

void s3_close(s3_client *c)
{
    if (!c) return;
    if (c->e) curl_easy_cleanup(c->e);
    if (c->secret) explicit_bzero(c->secret, strlen(c->secret));
    free(c->bucket), free(c->name), free(c->endpoint), free(c->sigv4), free(c->access), free(c->secret);
    free(c);
}

const char *s3_bucket_name(const s3_client *c) { return c->name; }

void s3_stats(const s3_client *c, uint64_t *requests, uint64_t *retries, uint64_t *bytes_in)
{
    if (requests) *requests = c->n_requests;
    if (retries) *retries = c->n_retries;
    if (bytes_in) *bytes_in = c->bytes_in;
}

/* ---- canonical encoding ---- */

/* Appends s percent-encoded (RFC 3986 unreserved kept, uppercase hex; '/'
 * kept when keep_slash) to *out. */
static int enc_append(char **out, size_t *len, size_t *cap, const char *s, bool keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ckpt_grow(out, cap, *len + 4, 1) < 0) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
        if (isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/')) {
            (*out)[(*len)++] = (char)ch;
        } else {
            (*out)[(*len)++] = '%';
            (*out)[(*len)++] = hex[ch >> 4];
            (*out)[(*len)++] = hex[ch & 15];
        }
        (*out)[*len] = '\0';
    }
    return 0;
}

typedef struct {
    const char *name, *value; /* value NULL or "": written "name=" */
} s3_param;

static int param_cmp(const void *a, const void *b)
{
    return strcmp(((const s3_param *)a)->name, ((const s3_param *)b)->name);
}

/* The canonical query string of params (sorted, encoded), allocated; "" for none. */
static char *query_build(s3_param *params, size_t n)
{
    char *q = ckpt_strdup("");
    size_t len = 0, cap = 1;
    if (!q) return NULL;
    qsort(params, n, sizeof *params, param_cmp);
    for (size_t i = 0; i < n; i++) {
        if (ckpt_grow(&q, &cap, len + 2, 1) < 0) goto oom;
        if (i) q[len++] = '&', q[len] = '\0';
        if (enc_append(&q, &len, &cap, params[i].name, false) < 0) goto oom;
        if (ckpt_grow(&q, &cap, len + 2, 1) < 0) goto oom;
        q[len++] = '=', q[len] = '\0';
        if (params[i].value && enc_append(&q, &len, &cap, params[i].value, false) < 0) goto oom;
    }
    return q;
oom:
    free(q);
    return NULL;
}

/* ---- one request ---- */

typedef struct {
    const char *op;    /* for messages: "PUT", "GET", "LIST", ... */
    const char *method;
    const char *key;   /* NULL: the bucket itself */
    const char *query; /* canonical, without '?'; NULL for none */
    const char *hdr[3];
    /* body: memory (body_mem) or bytes of a file (body_fd) */
    const char *body_mem;
    int body_fd;
    uint64_t body_off, body_len;
    bool has_body;
    const char *payload_sha; /* hex, or NULL: UNSIGNED-PAYLOAD for a file, computed for memory */
    /* response: the caller's buffer or fd for a 2xx body, else memory */
    uint8_t *buf;
    int out_fd;
    uint64_t out_off, out_cap; /* buf or fd: the bytes expected */
    size_t mem_limit;          /* the most kept in memory */
    /* results of the last attempt */
    char *mem;
    size_t mem_len, mem_cap;
    uint64_t got, sent;
    long status;
    char etag[130];
    bool overflow;
    int io_err; /* errno of a failed read or write of the caller's fd */
} s3_req;

static size_t on_write(char *data, size_t sz, size_t nm, void *ud)
{
    s3_req *r = ud;
    size_t n = sz * nm;
    bool success = r->status >= 200 && r->status < 300;
    if (success && (r->buf || r->out_fd >= 0)) {
        if (n > r->out_cap - r->got) {
            r->overflow = true;
            return 0;
        }
        if (r->buf) {
            memcpy(r->buf + r->got, data, n);
        } else {
            size_t done = 0;
            while (done < n) {
                ssize_t w = pwrite(r->out_fd, data + done, n - done, (off_t)(r->out_off + r->got + done));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) {
                    r->io_err = w < 0 ? errno : EIO;
                    return 0;
                }
                done += (size_t)w;
            }
        }
        r->got += n;
        return n;
    }
    size_t limit = success ? r->mem_limit : S3_ERR_BODY_MAX;
    if (r->mem_len + n > limit) {
        if (success) {
            r->overflow = true;
            return 0;
        }
        n = limit - r->mem_len; /* an error body: its head is enough */
        if (!n) return sz * nm;
    }
    if (ckpt_grow(&r->mem, &r->mem_cap, r->mem_len + n + 1, 1) < 0) return 0;
    memcpy(r->mem + r->mem_len, data, n);
    r->mem_len += n;
    r->mem[r->mem_len] = '\0';
    r->got += n;
    return sz * nm;
}

static size_t on_header(char *data, size_t sz, size_t nm, void *ud)
{
    s3_req *r = ud;
    size_t n = sz * nm;
    if (n > 9 && !strncmp(data, "HTTP/", 5)) {
        /* a new response (after a 100 Continue): its status */
        const char *sp = memchr(data, ' ', n);
        if (sp && sp + 4 <= data + n) r->status = strtol(sp + 1, NULL, 10);
        r->etag[0] = '\0';
    } else if (n > 5 && !strncasecmp(data, "etag:", 5)) {
        const char *v = data + 5, *end = data + n;
        while (v < end && (*v == ' ' || *v == '\t')) v++;
        while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
        size_t len = (size_t)(end - v);
        if (len < sizeof r->etag) {
            memcpy(r->etag, v, len);
            r->etag[len] = '\0';
        }
    }
    return n;
}

static size_t on_read(char *dst, size_t sz, size_t nm, void *ud)
{
    s3_req *r = ud;
    size_t want = sz * nm;
    uint64_t left = r->body_len - r->sent;
    if (want > left) want = (size_t)left;
    if (!want) return 0;
    if (r->body_mem) {
        memcpy(dst, r->body_mem + r->sent, want);
    } else {
        ssize_t n;
        do n = pread(r->body_fd, dst, want, (off_t)(r->body_off + r->sent));
        while (n < 0 && errno == EINTR);
        if (n <= 0) {
            r->io_err = n < 0 ? errno : EIO; /* a file shorter than said */
            return CURL_READFUNC_ABORT;
        }
        want = (size_t)n;
    }
    r->sent += want;
    return want;
}

/* The object's URL: ENDPOINT/BUCKET[/KEY][?QUERY]. */
static char *req_url(const s3_client *c, const s3_req *r)
{
    char *u = ckpt_sprintf("%s/%s", c->endpoint, c->bucket);
    size_t len, cap;
    if (!u) return NULL;
    len = strlen(u), cap = len + 1;
    if (r->key) {
        if (ckpt_grow(&u, &cap, len + 2, 1) < 0) goto oom;
        u[len++] = '/', u[len] = '\0';
        if (enc_append(&u, &len, &cap, r->key, true) < 0) goto oom;
    }
    if (r->query && *r->query) {
        size_t ql = strlen(r->query);
        if (ckpt_grow(&u, &cap, len + ql + 2, 1) < 0) goto oom;
        u[len++] = '?';
        memcpy(u + len, r->query, ql + 1);
    }
    return u;
oom:
    free(u);
    return NULL;
}

/* The store's <Code> and <Message> of an error body, when it has them. */
typedef struct {
    char text[S3_XML_TEXT_MAX];
    size_t len;
    bool too_long;
    int depth;
    void *ud;
    void (*elem)(void *ud, int depth, const char *name, const char *text);
    void (*open)(void *ud, int depth, const char *name);
} xml_walk;

static void XMLCALL xw_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
    xml_walk *w = ud;
    (void)attrs;
    w->depth++;
    w->len = 0;
    if (w->open) w->open(w->ud, w->depth, name);
}

static void XMLCALL xw_end(void *ud, const XML_Char *name)
{
    xml_walk *w = ud;
    w->text[w->len] = '\0';
    if (w->elem) w->elem(w->ud, w->depth, name, w->text);
    w->len = 0;
    w->depth--;
}

static void XMLCALL xw_chars(void *ud, const XML_Char *s, int n)
{
    xml_walk *w = ud;
    if (w->len + (size_t)n >= sizeof w->text) {
        w->too_long = true;
        return;
    }
    memcpy(w->text + w->len, s, (size_t)n);
    w->len += (size_t)n;
}

/* Parses an XML document with expat, calling elem for each element's end
 * (with its text when it has no children) and open for each start. */
static int xml_parse(const char *doc, size_t len, const char *what, void *ud,
                     void (*open)(void *, int, const char *),
                     void (*elem)(void *, int, const char *, const char *))
{
    xml_walk w = {.ud = ud, .elem = elem, .open = open};
    XML_Parser p = XML_ParserCreate("UTF-8");
    if (!p) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    XML_SetUserData(p, &w);
    XML_SetElementHandler(p, xw_start, xw_end);
    XML_SetCharacterDataHandler(p, xw_chars);
    int rc = 0;
    if (len > INT32_MAX || XML_Parse(p, doc, (int)len, 1) != XML_STATUS_OK)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: malformed XML response: %s at line %lu", what,
                            XML_ErrorString(XML_GetErrorCode(p)), (unsigned long)XML_GetCurrentLineNumber(p));
    else if (w.too_long)
        rc = ckpt_error_set(CKPT_ELIMIT, "%s: an element of the XML response is longer than %u bytes", what,
                            S3_XML_TEXT_MAX);
    XML_ParserFree(p);
    return rc;
}

typedef struct {
    bool is_error; /* the root element is <Error> */
    char code[64], message[256];
} err_doc;

static void err_open(void *ud, int depth, const char *name)
{
    if (depth == 1 && !strcmp(name, "Error")) ((err_doc *)ud)->is_error = true;
}

static void err_elem(void *ud, int depth, const char *name, const char *text)
{
    err_doc *d = ud;
    if (depth != 2 || !d->is_error) return;
    if (!strcmp(name, "Code")) snprintf(d->code, sizeof d->code, "%s", text);
    if (!strcmp(name, "Message")) snprintf(d->message, sizeof d->message, "%s", text);
}

/* Reads an error document from r's memory body (no error when there is none). */
static void err_read(const s3_req *r, err_doc *d)
{
    memset(d, 0, sizeof *d);
    if (r->mem_len && r->mem && xml_parse(r->mem, r->mem_len, "error", d, err_open, err_elem) < 0)
        memset(d, 0, sizeof *d); /* not an error document: the status says it all */
}

/* An error for a response: "s3://B/KEY: OP: HTTP 403 SignatureDoesNotMatch (message)". */
static int http_error(const s3_client *c, const s3_req *r, int code)
{
    err_doc d;
    err_read(r, &d);
    if (r->status == 403 && !d.code[0]) snprintf(d.code, sizeof d.code, "AccessDenied");
    return ckpt_error_set(code, "%s%s%s: %s: HTTP %ld%s%s%s%s%s%s", c->name, r->key ? "/" : "", r->key ? r->key : "",
                          r->op, r->status, d.code[0] ? " " : "", d.code, d.message[0] ? " (" : "", d.message,
                          d.message[0] ? ")" : "",
                          r->status == 403 ? "; check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION" : "");
}

static bool transient_curl(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
        return true;
    default:
        return false;
    }
}

static bool transient_status(long s) { return s == 500 || s == 502 || s == 503 || s == 504; }

static void backoff(const s3_client *c, unsigned attempt)
{
    uint64_t ms = c->backoff_ms;
    for (unsigned i = 1; i < attempt && ms < 5000; i++) ms *= 2;
    if (ms > 5000) ms = 5000;
    ms = ms / 2 + (ms ? (uint64_t)rand() % (ms / 2 + 1) : 0); /* jitter: concurrent writers spread */
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Runs r, retrying transient failures. On return r->status is the final
 * HTTP status (the caller decides what it means); a failure to get any
 * response, or a transient one that outlived every attempt, is an error. */
static int perform(s3_client *c, s3_req *r)
{
    char *url = req_url(c, r);
    if (!url) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    char sha_hex[65];
    const char *payload = r->payload_sha;
    if (!payload) {
        if (r->has_body && r->body_mem) {
            if (ckpt_sha256_buf_hex(r->body_mem, (size_t)r->body_len, sha_hex) < 0) {
                free(url);
                return ckpt_error_prefix(CKPT_EINTERNAL, "sha256");
            }
            payload = sha_hex;
        } else {
            payload = r->has_body ? "UNSIGNED-PAYLOAD" : S3_EMPTY_SHA;
        }
    }
    char sha_hdr[100];
    snprintf(sha_hdr, sizeof sha_hdr, "x-amz-content-sha256: %s", payload);
    struct curl_slist *hdrs = curl_slist_append(NULL, sha_hdr);
    for (size_t i = 0; hdrs && i < sizeof r->hdr / sizeof r->hdr[0]; i++)
        if (r->hdr[i]) {
            struct curl_slist *n = curl_slist_append(hdrs, r->hdr[i]);
            if (!n) curl_slist_free_all(hdrs);
            hdrs = n;
        }
    if (!hdrs) {
        free(url);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    }
    int rc = 0;
    for (unsigned attempt = 1;; attempt++) {
        r->got = r->sent = 0;
        r->mem_len = 0;
        r->status = 0;
        r->etag[0] = '\0';
        r->overflow = false;
        r->io_err = 0;
        CURL *e = c->e;
        curl_easy_reset(e);
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 20L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 60L);
        curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
        curl_easy_setopt(e, CURLOPT_AWS_SIGV4, c->sigv4);
        curl_easy_setopt(e, CURLOPT_USERNAME, c->access);
        curl_easy_setopt(e, CURLOPT_PASSWORD, c->secret);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
        if (!strcmp(r->method, "HEAD")) {
            curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
        } else if (!strcmp(r->method, "PUT")) {
            curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
            curl_easy_setopt(e, CURLOPT_READDATA, r);
            curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)(r->has_body ? r->body_len : 0));
        } else if (!strcmp(r->method, "POST")) {
            curl_easy_setopt(e, CURLOPT_POST, 1L);
            curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
            curl_easy_setopt(e, CURLOPT_READDATA, r);
            curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(r->has_body ? r->body_len : 0));
        } else if (strcmp(r->method, "GET")) {
            curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
        }
        c->n_requests++;
        CURLcode cr = curl_easy_perform(e);
        c->bytes_in += r->got;
        long st = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
        if (cr == CURLE_OK) r->status = st;
        bool retry;
        if (r->overflow) {
            rc = ckpt_error_set(CKPT_ELIMIT, "%s/%s: %s: the response is larger than expected (%" PRIu64 " bytes)",
                                c->name, r->key ? r->key : "", r->op, r->mem_limit ? (uint64_t)r->mem_limit : r->out_cap);
            break;
        }
        if (r->io_err) {
            errno = r->io_err;
            rc = ckpt_error_sys("%s/%s: %s: local file", c->name, r->key ? r->key : "", r->op);
            break;
        }
        if (cr != CURLE_OK) {
            retry = transient_curl(cr);
            if (!retry || attempt >= c->retries) {
                rc = ckpt_error_set(retry ? CKPT_EBUSY : CKPT_EIO, "%s%s%s: %s: %s (after %u attempts)", c->name,
                                    r->key ? "/" : "", r->key ? r->key : "", r->op, curl_easy_strerror(cr), attempt);
                break;
            }
            ckpt_debug("%s/%s: %s: %s; retrying", c->name, r->key ? r->key : "", r->op, curl_easy_strerror(cr));
        } else if (transient_status(r->status)) {
            if (attempt >= c->retries) {
                char msg[1024];
                http_error(c, r, CKPT_EBUSY);
                snprintf(msg, sizeof msg, "%s", ckpt_error_last());
                rc = ckpt_error_set(CKPT_EBUSY, "%s (after %u attempts)", msg, attempt);
                break;
            }
            ckpt_debug("%s/%s: %s: HTTP %ld; retrying", c->name, r->key ? r->key : "", r->op, r->status);
        } else {
            break;
        }
        c->n_retries++;
        backoff(c, attempt);
    }
    curl_easy_setopt(c->e, CURLOPT_PASSWORD, "");
    curl_easy_setopt(c->e, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(hdrs);
    free(url);
    return rc;
}

static void req_free(s3_req *r) { free(r->mem); }

static void req_init(s3_req *r, const char *op, const char *method, const char *key)
{
    memset(r, 0, sizeof *r);
    r->op = op;
    r->method = method;
    r->key = key;
    r->body_fd = -1;
    r->out_fd = -1;
    r->mem_limit = S3_ERR_BODY_MAX;
}

/* ---- bucket ---- */

int s3_make_bucket(s3_client *c)
{
    s3_req r;
    req_init(&r, "create bucket", "PUT", NULL);
    int rc = perform(c, &r);
    if (!rc && r.status != 200) {
        err_doc d;
        err_read(&r, &d);
        if (!(r.status == 409 && !strcmp(d.code, "BucketAlreadyOwnedByYou"))) rc = http_error(c, &r, CKPT_EIO);
    }
    req_free(&r);
    return rc;
}

/* ---- HEAD, GET, DELETE ---- */

int s3_head(s3_client *c, const char *key, bool *exists, uint64_t *size)
{
    s3_req r;
    req_init(&r, "HEAD", "HEAD", key);
    int rc = perform(c, &r);
    *exists = false;
    if (!rc) {
        if (r.status == 200) {
            curl_off_t cl = -1;
            curl_easy_getinfo(c->e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
            *exists = true;
            if (size) *size = cl < 0 ? 0 : (uint64_t)cl;
        } else if (r.status != 404) {
            rc = http_error(c, &r, r.status == 403 ? CKPT_EINVAL : CKPT_EIO);
        }
    }
    req_free(&r);
    return rc;
}

static int get_range(s3_client *c, const char *key, uint64_t off, uint64_t len, void *buf, int fd, uint64_t fd_off)
{
    if (!len) return 0;
    if (off + len < off) return ckpt_error_set(CKPT_EINVAL, "%s/%s: GET: range overflows", c->name, key);
    char range[64];
    snprintf(range, sizeof range, "Range: bytes=%" PRIu64 "-%" PRIu64, off, off + len - 1);
    s3_req r;
    req_init(&r, "GET", "GET", key);
    r.hdr[0] = range;
    r.buf = buf;
    r.out_fd = fd;
    r.out_off = fd_off;
    r.out_cap = len;
    int rc = perform(c, &r);
    if (!rc) {
        if (r.status == 404)
            rc = ckpt_error_set(CKPT_ENOTFOUND, "%s/%s: GET: no such object", c->name, key);
        else if (r.status != 206 && !(r.status == 200 && off == 0))
            rc = http_error(c, &r, r.status == 416 ? CKPT_EINVAL : CKPT_EIO);
        else if (r.got != len)
            rc = ckpt_error_set(CKPT_ECORRUPT,
                                "%s/%s: GET bytes %" PRIu64 "+%" PRIu64 ": got %" PRIu64 " bytes (the object is shorter)",
                                c->name, key, off, len, r.got);
    }
    req_free(&r);
    return rc;
}

int s3_get(s3_client *c, const char *key, uint64_t off, uint64_t len, void *buf)
{
    return get_range(c, key, off, len, buf, -1, 0);
}

int s3_get_fd(s3_client *c, const char *key, uint64_t off, uint64_t len, int fd, uint64_t fd_off)
{
    return get_range(c, key, off, len, NULL, fd, fd_off);
}

/* A DELETE of key (with query: of an upload); gone already is success. */
static int delete_req(s3_client *c, const char *op, const char *key, const char *query)
{
    s3_req r;
    req_init(&r, op, "DELETE", key);
    r.query = query;
    int rc = perform(c, &r);
    if (!rc && r.status != 204 && r.status != 200 && r.status != 404) rc = http_error(c, &r, CKPT_EIO);
    req_free(&r);
    return rc;
}

int s3_delete(s3_client *c, const char *key) { return delete_req(c, "DELETE", key, NULL); }

/* r's body: bytes [off, off+len) of fd, whose sha256 is sha (NULL: unsigned). */
static void req_body_fd(s3_req *r, int fd, uint64_t off, uint64_t len, const char *sha)
{
    r->hdr[1] = "Content-Type: application/octet-stream";
    r->body_fd = fd;
    r->body_off = off;
    r->body_len = len;
    r->has_body = true;
    r->payload_sha = sha;
}

/* ---- PUT ---- */

static int put_single(s3_client *c, const char *key, int fd, uint64_t off, uint64_t len, const char *sha,
                      bool *existed)
{
    s3_req r;
    req_init(&r, "PUT", "PUT", key);
    r.hdr[0] = "If-None-Match: *";
    req_body_fd(&r, fd, off, len, sha);
    int rc = perform(c, &r);
    if (!rc) {
        if (r.status == 412)
            *existed = true; /* another writer stored the same name: the same bytes */
        else if (r.status == 200)
            *existed = false;
        else if (r.status == 400 || r.status == 403)
            rc = http_error(c, &r, CKPT_EINVAL);
        else
            rc = http_error(c, &r, CKPT_EIO);
    }
    req_free(&r);
    return rc;
}

typedef struct {
    char upload_id[1024];
} initiate_doc;

static void initiate_elem(void *ud, int depth, const char *name, const char *text)
{
    if (depth == 2 && !strcmp(name, "UploadId")) snprintf(((initiate_doc *)ud)->upload_id, 1024, "%s", text);
}

static int abort_upload(s3_client *c, const char *key, const char *upload_id)
{
    s3_param p[] = {{"uploadId", upload_id}};
    char *q = query_build(p, 1);
    if (!q) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    int rc = delete_req(c, "abort multipart upload", key, q);
    free(q);
    return rc;
}

/* Appends s to the XML document *doc, with &, < and > escaped when text. */
static int xml_append(char **doc, size_t *len, size_t *cap, const char *s, bool text)
{
    for (; *s; s++) {
        const char *rep = !text ? NULL : *s == '&' ? "&amp;" : *s == '<' ? "&lt;" : *s == '>' ? "&gt;" : NULL;
        size_t n = rep ? strlen(rep) : 1;
        if (ckpt_grow(doc, cap, *len + n + 1, 1) < 0) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
        memcpy(*doc + *len, rep ? rep : s, n);
        *len += n;
        (*doc)[*len] = '\0';
    }
    return 0;
}

/* The parts of one multipart upload, sent CKPT_S3_PART_UPLOADS at a time
 * (default 4), each sender with a connection of its own; the ETags in
 * part order. */
typedef struct {
    const char *key, *upload_id;
    int fd;
    uint64_t off, len, part;
    unsigned nparts;
    char (*etags)[130];
    s3_client *parent;
    pthread_mutex_t mu;
    unsigned next;
    int rc;
    char msg[1024];
} parts_job;

/* Part i (0-based) of j through c: its sha256 signed, its ETag kept. */
static int part_put(s3_client *c, parts_job *j, unsigned i)
{
    uint64_t poff = (uint64_t)i * j->part, plen = j->len - poff < j->part ? j->len - poff : j->part;
    char num[16], sha[65];
    snprintf(num, sizeof num, "%u", i + 1);
    int rc = ckpt_sha256_fd_range_hex(j->fd, j->off + poff, plen, sha, j->key);
    if (rc < 0) return rc;
    s3_param pp[] = {{"uploadId", j->upload_id}, {"partNumber", num}};
    char *q = query_build(pp, 2);
    if (!q) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    s3_req r;
    req_init(&r, "upload part", "PUT", j->key);
    r.query = q;
    req_body_fd(&r, j->fd, j->off + poff, plen, sha);
    rc = perform(c, &r);
    if (!rc && r.status != 200) rc = http_error(c, &r, r.status == 403 ? CKPT_EINVAL : CKPT_EIO);
    if (!rc && !r.etag[0])
        rc = ckpt_error_set(CKPT_EINVAL, "%s/%s: upload part %u: no ETag in the response", c->name, j->key, i + 1);
    if (!rc) memcpy(j->etags[i], r.etag, sizeof j->etags[i]);
    req_free(&r);
    free(q);
    if (!rc) ckpt_fault("s3.part_uploaded");
    return rc;
}

/* One sender, with a client of its own (its requests are added to the
 * parent's): parts in turn until none is left or one failed. */
static void *parts_main(void *arg)
{
    parts_job *j = arg;
    s3_client *own = NULL;
    int rc = s3_open(j->parent->bucket, &own);
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (rc && !j->rc) {
            j->rc = rc;
            snprintf(j->msg, sizeof j->msg, "%s", ckpt_error_last());
        }
        if (j->rc || j->next >= j->nparts) break;
        unsigned i = j->next++;
        pthread_mutex_unlock(&j->mu);
        rc = part_put(own, j, i);
        pthread_mutex_lock(&j->mu);
    }
    if (own) {
        j->parent->n_requests += own->n_requests;
        j->parent->n_retries += own->n_retries;
        j->parent->bytes_in += own->bytes_in;
    }
    pthread_mutex_unlock(&j->mu);
    s3_close(own);
    return NULL;
}

static int parts_upload(s3_client *c, parts_job *j)
{
    unsigned want = env_uint("CKPT_S3_PART_UPLOADS", 4, 1, 64);
    if (want > j->nparts) want = j->nparts;
    if (want <= 1) { /* this client, this thread */
        int rc = 0;
        for (unsigned i = 0; !rc && i < j->nparts; i++) rc = part_put(c, j, i);
        return rc;
    }
    j->parent = c;
    if (pthread_mutex_init(&j->mu, NULL)) return ckpt_error_set(CKPT_EIO, "cannot create a mutex");
    pthread_t th[64];
    unsigned started = 0;
    for (unsigned i = 0; i < want; i++)
        if (pthread_create(&th[started], NULL, parts_main, j) == 0) started++;
    if (!started) parts_main(j);
    for (unsigned i = 0; i < started; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j->mu);
    return j->rc ? ckpt_error_set(j->rc, "%s", j->msg) : 0;
}

static int put_multipart(s3_client *c, const char *key, int fd, uint64_t off, uint64_t len, bool *existed)
{
    bool have = false;
    uint64_t have_size = 0;
    int rc = s3_head(c, key, &have, &have_size);
    if (rc < 0) return rc;
    if (have && have_size == len) {
        /* the multipart completion does not honour If-None-Match: a name
         * stored already is not uploaded again */
        *existed = true;
        return 0;
    }
    uint64_t part = S3_PART_MIN;
    while ((len + part - 1) / part > S3_MAX_PARTS) part += 1u << 20;
    unsigned nparts = (unsigned)((len + part - 1) / part);

    s3_param p_init[] = {{"uploads", NULL}};
    char *q = query_build(p_init, 1);
    if (!q) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    s3_req r;
    req_init(&r, "initiate multipart upload", "POST", key);
    r.query = q;
    r.hdr[0] = "Content-Type: application/octet-stream";
    r.has_body = true;
    r.body_mem = "";
    initiate_doc init = {{0}};
    rc = perform(c, &r);
    if (!rc && r.status != 200) rc = http_error(c, &r, r.status == 403 ? CKPT_EINVAL : CKPT_EIO);
    if (!rc) rc = xml_parse(r.mem, r.mem_len, "initiate multipart upload", &init, NULL, initiate_elem);
    if (!rc && !init.upload_id[0])
        rc = ckpt_error_set(CKPT_EINVAL, "%s/%s: initiate multipart upload: no UploadId in the response", c->name, key);
    req_free(&r);
    free(q);
    if (rc < 0) return rc;

    parts_job pj = {.key = key, .upload_id = init.upload_id, .fd = fd, .off = off, .len = len, .part = part,
                    .nparts = nparts, .etags = ckpt_calloc(nparts, sizeof *pj.etags)};
    rc = pj.etags ? parts_upload(c, &pj) : ckpt_error_set(CKPT_ENOMEM, "out of memory");
    char *doc = rc ? NULL : ckpt_strdup("<CompleteMultipartUpload>");
    size_t dlen = doc ? strlen(doc) : 0, dcap = dlen + 1;
    if (!rc && !doc) rc = ckpt_error_set(CKPT_ENOMEM, "out of memory");
    for (unsigned i = 0; !rc && i < nparts; i++) {
        char head[64];
        snprintf(head, sizeof head, "<Part><PartNumber>%u</PartNumber><ETag>", i + 1);
        rc = xml_append(&doc, &dlen, &dcap, head, false);
        if (!rc) rc = xml_append(&doc, &dlen, &dcap, pj.etags[i], true);
        if (!rc) rc = xml_append(&doc, &dlen, &dcap, "</ETag></Part>", false);
    }
    free(pj.etags);
    if (!rc) rc = xml_append(&doc, &dlen, &dcap, "</CompleteMultipartUpload>", false);
    if (!rc) {
        s3_param pc[] = {{"uploadId", init.upload_id}};
        q = query_build(pc, 1);
        if (!q) rc = ckpt_error_set(CKPT_ENOMEM, "out of memory");
        if (!rc) {
            req_init(&r, "complete multipart upload", "POST", key);
            r.query = q;
            r.hdr[0] = "Content-Type: application/xml";
            r.body_mem = doc;
            r.body_len = dlen;
            r.has_body = true;
            rc = perform(c, &r);
            if (!rc) {
                err_doc d;
                err_read(&r, &d);
                if (r.status == 404 && !strcmp(d.code, "NoSuchUpload")) {
                    /* completed by an attempt whose answer was lost? */
                    bool now = false;
                    uint64_t sz = 0;
                    rc = s3_head(c, key, &now, &sz);
                    if (!rc && !(now && sz == len)) rc = http_error(c, &r, CKPT_EIO);
                } else if (r.status != 200 || d.is_error) { /* S3 may answer 200 with an <Error> */
                    rc = http_error(c, &r, CKPT_EIO);
                }
            }
            req_free(&r);
            free(q);
        }
    }
    free(doc);
    if (rc < 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ckpt_error_last());
        abort_upload(c, key, init.upload_id); /* best effort: the store also expires them */
        return ckpt_error_set(rc, "%s", msg);
    }
    *existed = false;
    return 0;
}

int s3_put_fd(s3_client *c, const char *key, int fd, uint64_t off, uint64_t len, const char *sha256_hex,
              bool *existed)
{
    bool ex = false;
    int rc;
    if (len > c->multipart_min) {
        rc = put_multipart(c, key, fd, off, len, &ex);
    } else {
        char sha[65];
        if (!sha256_hex) {
            rc = ckpt_sha256_fd_range_hex(fd, off, len, sha, key);
            if (rc < 0) return rc;
            sha256_hex = sha;
        }
        rc = put_single(c, key, fd, off, len, sha256_hex, &ex);
    }
    if (existed) *existed = ex;
    return rc;
}

/* ---- LIST ---- */

typedef struct {
    s3_list_cb cb;
    void *ud;
    int stop;
    bool in_contents, truncated;
    char key[1100], next[1100], mtime[64];
    uint64_t size;
    bool bad;
} list_doc;

static void list_open(void *ud, int depth, const char *name)
{
    list_doc *d = ud;
    if (depth == 2 && !strcmp(name, "Contents")) {
        d->in_contents = true;
        d->key[0] = d->mtime[0] = '\0';
        d->size = 0;
    }
}

static int64_t parse_time(const char *s)
{
    struct tm tm = {0};
    int y, mo, da, h, mi, se;
    if (sscanf(s, "%d-%d-%dT%d:%d:%d", &y, &mo, &da, &h, &mi, &se) != 6) return -1;
    tm.tm_year = y - 1900, tm.tm_mon = mo - 1, tm.tm_mday = da, tm.tm_hour = h, tm.tm_min = mi, tm.tm_sec = se;
    return (int64_t)timegm(&tm);
}

static void list_elem(void *ud, int depth, const char *name, const char *text)
{
    list_doc *d = ud;
    if (d->stop) return;
    if (depth == 3 && d->in_contents) {
        if (!strcmp(name, "Key")) snprintf(d->key, sizeof d->key, "%s", text);
        else if (!strcmp(name, "Size") && ckpt_parse_u64(text, &d->size) < 0) d->bad = true;
        else if (!strcmp(name, "LastModified")) snprintf(d->mtime, sizeof d->mtime, "%s", text);
    } else if (depth == 2 && !strcmp(name, "Contents")) {
        d->in_contents = false;
        if (!d->key[0]) {
            d->bad = true;
            return;
        }
        d->stop = d->cb(d->ud, d->key, d->size, parse_time(d->mtime));
    } else if (depth == 2 && !strcmp(name, "IsTruncated")) {
        d->truncated = !strcmp(text, "true");
    } else if (depth == 2 && !strcmp(name, "NextContinuationToken")) {
        snprintf(d->next, sizeof d->next, "%s", text);
    }
}

int s3_list(s3_client *c, const char *prefix, unsigned max_keys, s3_list_cb cb, void *ud)
{
    char token[1100] = "", mk[16];
    snprintf(mk, sizeof mk, "%u", max_keys ? max_keys : 1000);
    for (unsigned page = 0;; page++) {
        s3_param p[4] = {{"list-type", "2"}, {"max-keys", mk}, {"prefix", prefix}};
        size_t np = 3;
        if (token[0]) p[np++] = (s3_param){"continuation-token", token};
        char *q = query_build(p, np);
        if (!q) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
        s3_req r;
        req_init(&r, "LIST", "GET", NULL);
        r.query = q;
        r.mem_limit = S3_LIST_MAX_BYTES;
        list_doc d = {.cb = cb, .ud = ud};
        int rc = perform(c, &r);
        if (!rc && r.status != 200) rc = http_error(c, &r, r.status == 403 ? CKPT_EINVAL : CKPT_EIO);
        if (!rc) rc = xml_parse(r.mem ? r.mem : "", r.mem_len, c->name, &d, list_open, list_elem);
        req_free(&r);
        free(q);
        if (rc < 0) return rc;
        if (d.stop) return d.stop;
        if (d.bad) return ckpt_error_set(CKPT_EINVAL, "%s: LIST: an entry without a key or with a bad size", c->name);
        if (!d.truncated) return 0;
        if (!d.next[0] || !strcmp(d.next, token))
            return ckpt_error_set(CKPT_EINVAL, "%s: LIST: truncated without a new continuation token", c->name);
        snprintf(token, sizeof token, "%s", d.next);
    }
}
