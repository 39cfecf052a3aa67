/*
 * hub_client.c — talking to a Hub's API (docs/hub.md): configuration from
 * the environment, JSON requests with retries and hand-followed redirects,
 * the revision and tree calls, the checks on names the server sends, the
 * include/exclude filter, and error answers turned into sentences.
 */
#include "hub/hub_internal.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"

#include <ctype.h>
#include <fnmatch.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

const char *const hub_default_include[] = {"*.safetensors", "*.json", "tokenizer*", "*.tiktoken",
                                           "*.model",       "*.txt",  "*.md",       NULL};
const char *const hub_default_exclude[] = {"*.bin", "*.pt",   "*.pth",  "*.ckpt", "*.msgpack",
                                           "*.h5",  "*.onnx", "*.gguf", NULL};

/* ---- set-up ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int hub_curl_init(void)
{
    pthread_once(&curl_once, curl_init_once);
    return curl_init_rc == CURLE_OK
               ? 0
               : ckpt_error_set(CKPT_EIO, "libcurl: %s", curl_easy_strerror(curl_init_rc));
}

/* A token fit for a header: printable, no spaces. The value is never shown. */
static int token_take(hub_client *h, char *text, const char *source)
{
    char *t = text;
    while (*t && isspace((unsigned char)*t))
        t++;
    char *end = t + strlen(t);
    while (end > t && isspace((unsigned char)end[-1]))
        *--end = '\0';
    if (!*t) return 0;
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f)
            return ckpt_error_set(CKPT_EINVAL, "the token in %s has spaces or control characters",
                                  source);
    h->token = ckpt_strdup(t);
    return h->token ? 0 : CKPT_ENOMEM;
}

static int token_from_env(hub_client *h)
{
    static const char *const vars[] = {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(vars); i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v) continue;
        char *copy = ckpt_strdup(v);
        if (!copy) return CKPT_ENOMEM;
        int rc = token_take(h, copy, vars[i]);
        free(copy);
        if (rc || h->token) return rc;
    }
    char *path = NULL;
    const char *hf_home = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    if (hf_home && *hf_home)
        path = ckpt_sprintf("%s/token", hf_home);
    else if (xdg && *xdg)
        path = ckpt_sprintf("%s/huggingface/token", xdg);
    else if (home && *home)
        path = ckpt_sprintf("%s/.cache/huggingface/token", home);
    if (!path || !ckpt_exists(path)) {
        free(path);
        return 0;
    }
    char *text = NULL;
    size_t len;
    int rc = ckpt_read_file(path, 4096, &text, &len);
    if (!rc) rc = token_take(h, text, path);
    free(text);
    free(path);
    return rc;
}

int hub_client_init(hub_client *h)
{
    memset(h, 0, sizeof *h);
    int rc = hub_curl_init();
    if (rc) return rc;
    const char *e = getenv("HF_ENDPOINT");
    h->endpoint = ckpt_strdup(e && *e ? e : HUB_DEFAULT_ENDPOINT);
    if (!h->endpoint) return CKPT_ENOMEM;
    size_t n = strlen(h->endpoint);
    while (n > 0 && h->endpoint[n - 1] == '/')
        h->endpoint[--n] = '\0';
    if (strncmp(h->endpoint, "http://", 7) && strncmp(h->endpoint, "https://", 8)) {
        rc = ckpt_error_set(CKPT_EINVAL, "HF_ENDPOINT '%s' is not an http:// or https:// URL",
                            h->endpoint);
        hub_client_free(h);
        return rc;
    }
    h->connections = HUB_DEFAULT_CONNECTIONS;
    h->chunk_size = HUB_DEFAULT_CHUNK;
    h->backoff_s = HUB_BACKOFF_MS / 1000.0;
    const char *b = getenv("CKPT_HUB_BACKOFF_MS");
    uint64_t ms;
    if (b && ckpt_parse_u64(b, &ms) == 0 && ms <= 60000) h->backoff_s = (double)ms / 1000.0;
    h->request_timeout_s = HUB_REQUEST_TIMEOUT_S;
    static const char *const tvars[] = {"CKPT_HUB_REQUEST_TIMEOUT", "CKPT_HUB_FETCH_TIMEOUT"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(tvars[i]);
        double sec;
        if (!v || !*v) continue;
        /* Seconds, fractions allowed (the tests' stalls wait 0.5 s, not 5). */
        if (ckpt_parse_double(tvars[i], v, 0, 100.0 * 365 * 86400, &sec) < 0) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s='%.40s' is not a number of seconds", tvars[i], v);
            hub_client_free(h);
            return rc;
        }
        *(i ? &h->fetch_timeout_s : &h->request_timeout_s) = sec;
    }
    hub_client_start(h);
    rc = token_from_env(h);
    if (rc) hub_client_free(h);
    return rc;
}

void hub_client_start(hub_client *h)
{
    h->deadline = h->fetch_timeout_s > 0 ? ckpt_now() + h->fetch_timeout_s : 0;
}

bool hub_past_deadline(const hub_client *h)
{
    return h->deadline > 0 && ckpt_now() >= h->deadline;
}

int hub_deadline_error(const hub_client *h, const char *what)
{
    return ckpt_error_set(CKPT_EIO,
                          "%s: the fetch took longer than its limit of %g s "
                          "(CKPT_HUB_FETCH_TIMEOUT); stopped",
                          what, h->fetch_timeout_s);
}

int hub_easy_timeouts(const hub_client *h, CURL *e, const char *what)
{
    double t = h->request_timeout_s;
    if (h->deadline > 0) {
        double left = h->deadline - ckpt_now();
        if (left <= 0) return hub_deadline_error(h, what);
        if (t <= 0 || left < t) t = left;
    }
    if (t > 0) curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(t * 1000) + 1);
    return 0;
}

void hub_client_free(hub_client *h)
{
    free(h->endpoint);
    if (h->token) {
        /* Not left lying in freed memory. */
        volatile char *p = h->token;
        while (*p)
            *p++ = 0;
        free(h->token);
    }
    memset(h, 0, sizeof *h);
}

/* ---- URLs and the token rule ---- */

char *hub_pct_encode(const char *s, bool keep_slash)
{
    size_t n = strlen(s);
    char *out = ckpt_malloc(3 * n + 1), *w = out;
    if (!out) return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (isalnum(*p) || strchr("-._~", *p) || (keep_slash && *p == '/'))
            *w++ = (char)*p;
        else
            w += sprintf(w, "%%%02X", *p);
    }
    *w = 0;
    return out;
}

char *hub_file_url(const hub_client *h, const char *repo, const char *commit, const char *path)
{
    char *r = hub_pct_encode(repo, true), *p = hub_pct_encode(path, true);
    char *url = r && p ? ckpt_sprintf("%s/%s/resolve/%s/%s", h->endpoint, r, commit, p) : NULL;
    free(r);
    free(p);
    return url;
}

/* scheme, host (lowercase) and port of url; false when it does not parse. */
static bool origin_of(const char *url, char *out, size_t len)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL;
    bool ok = u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK;
    if (ok) {
        snprintf(out, len, "%s://%s:%s", scheme, host, port);
        for (char *c = out; *c; c++)
            *c = (char)tolower((unsigned char)*c);
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return ok;
}

bool hub_same_origin(const hub_client *h, const char *url)
{
    char a[512], b[512];
    return origin_of(h->endpoint, a, sizeof a) && origin_of(url, b, sizeof b) && !strcmp(a, b);
}

struct curl_slist *hub_request_headers(const hub_client *h, const char *url, uint64_t range_start,
                                       uint64_t range_end)
{
    struct curl_slist *l = curl_slist_append(NULL, "User-Agent: " HUB_USER_AGENT);
    if (l && h->token && hub_same_origin(h, url)) {
        char *auth = ckpt_sprintf("Authorization: Bearer %s", h->token);
        struct curl_slist *n = auth ? curl_slist_append(l, auth) : NULL;
        if (auth) {
            memset(auth, 0, strlen(auth));
            free(auth);
        }
        if (!n) {
            curl_slist_free_all(l);
            return NULL;
        }
        l = n;
    }
    if (l && range_end > 0) {
        char range[96];
        snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)range_start,
                 (unsigned long long)(range_end - 1));
        struct curl_slist *n = curl_slist_append(l, range);
        if (!n) {
            curl_slist_free_all(l);
            return NULL;
        }
        l = n;
    }
    return l;
}

void hub_easy_defaults(CURL *e)
{
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION,
                     0L); /* by hand: the token must not follow to another host */
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, HUB_CONNECT_TIMEOUT_S);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, HUB_STALL_S);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
}

bool hub_status_transient(long status)
{
    return status == 408 || status == 429 || (status >= 500 && status <= 599);
}

double hub_backoff(const hub_client *h, int fails, double retry_after)
{
    double b = h->backoff_s;
    for (int i = 1; i < fails && b < HUB_BACKOFF_CAP_S; i++)
        b *= 2;
    if (b > HUB_BACKOFF_CAP_S) b = HUB_BACKOFF_CAP_S;
    b *=
        0.75 + 0.5 * ((double)rand() / RAND_MAX); /* jitter: many pieces do not come back at once */
    if (retry_after > HUB_RETRY_AFTER_CAP_S) retry_after = HUB_RETRY_AFTER_CAP_S;
    return b > retry_after ? b : retry_after;
}

void hub_sleep(double seconds)
{
    if (seconds <= 0) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* ---- answers ---- */

void hub_escape(const char *s, size_t slen, char *out, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < slen && o + 5 < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(out + o, len - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    out[o < len ? o : len - 1] = 0;
}

void hub_answer_reset(hub_answer *a)
{
    free(a->link_next);
    memset(a, 0, sizeof *a);
}

/* The URL of the rel="next" link in a Link header value, or NULL. */
static char *link_next(const char *v)
{
    for (const char *p = v; (p = strchr(p, '<'));) {
        const char *end = strchr(p, '>');
        if (!end) return NULL;
        const char *params = end + 1, *stop = strchr(params, ',');
        size_t plen = stop ? (size_t)(stop - params) : strlen(params);
        char buf[256];
        snprintf(buf, sizeof buf, "%.*s", (int)(plen < sizeof buf ? plen : sizeof buf - 1), params);
        for (char *c = buf; *c; c++)
            *c = (char)tolower((unsigned char)*c);
        if (strstr(buf, "rel=\"next\"") || strstr(buf, "rel=next"))
            return ckpt_strndup(p + 1, (size_t)(end - p - 1));
        p = end + 1;
    }
    return NULL;
}

void hub_etag_normalize(const char *v, size_t len, char *out, size_t outlen)
{
    if (len >= 2 && v[0] == 'W' && v[1] == '/') v += 2, len -= 2;
    if (len >= 2 && v[0] == '"' && v[len - 1] == '"') v++, len -= 2;
    hub_escape(v, len, out, outlen);
}

void hub_answer_header(hub_answer *a, const char *line, size_t len)
{
    if (len >= 5 && !strncmp(line, "HTTP/", 5)) {
        hub_answer_reset(a);
        return;
    }
    const char *colon = memchr(line, ':', len);
    if (!colon) return;
    size_t nlen = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vlen = len - nlen - 1;
    while (vlen && (*v == ' ' || *v == '\t'))
        v++, vlen--;
    while (vlen && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n' || v[vlen - 1] == ' '))
        vlen--;
#define IS(name) (nlen == sizeof(name) - 1 && !strncasecmp(line, name, nlen))
    if (IS("X-Error-Code"))
        hub_escape(v, vlen, a->error_code, sizeof a->error_code);
    else if (IS("X-Error-Message"))
        hub_escape(v, vlen, a->error_message, sizeof a->error_message);
    else if (IS("Content-Range"))
        hub_escape(v, vlen, a->content_range, sizeof a->content_range);
    else if (IS("X-Linked-Etag"))
        hub_etag_normalize(v, vlen, a->linked_etag, sizeof a->linked_etag);
    else if (IS("Link") && vlen < 8192) {
        char *val = ckpt_strndup(v, vlen);
        char *next = val ? link_next(val) : NULL;
        free(val);
        if (next) {
            free(a->link_next);
            a->link_next = next;
        }
    }
#undef IS
}

int hub_answer_error(const hub_client *h, long status, const hub_answer *a, const hub_what *w)
{
    const char *code = a->error_code, *repo = w->repo ? w->repo : "?";
    char said[300] = "";
    if (*a->error_message) snprintf(said, sizeof said, " (the Hub said: %s)", a->error_message);
    if (!strcmp(code, "GatedRepo"))
        return ckpt_error_set(
            CKPT_EINVAL,
            "%s is a gated repository: accept its licence on its Hub page, then pass a token "
            "of that account in HF_TOKEN%s",
            repo, h->token ? " (the token given has no access yet)" : "");
    if (!strcmp(code, "RepoNotFound"))
        return ckpt_error_set(CKPT_ENOTFOUND, "repository %s not found on %s%s", repo, h->endpoint,
                              h->token ? "" : " (if it is private, pass a token in HF_TOKEN)");
    if (!strcmp(code, "RevisionNotFound"))
        return ckpt_error_set(CKPT_ENOTFOUND, "revision '%s' not found in %s",
                              w->rev ? w->rev : "?", repo);
    if (!strcmp(code, "EntryNotFound"))
        return ckpt_error_set(CKPT_ENOTFOUND, "file '%s' not found in %s at %s",
                              w->path ? w->path : "?", repo, w->rev ? w->rev : "?");
    if (status == 401 && h->token)
        return ckpt_error_set(CKPT_EINVAL,
                              "the Hub refused the token (HF_TOKEN): bad or expired token%s", said);
    if (status == 401)
        return ckpt_error_set(CKPT_EINVAL, "%s needs a token: set HF_TOKEN%s", repo, said);
    if (status == 403)
        return ckpt_error_set(CKPT_EINVAL, "access to %s%s%s was refused (403)%s", repo,
                              w->path ? " file " : "", w->path ? w->path : "", said);
    if (status == 404)
        return ckpt_error_set(CKPT_ENOTFOUND, "%s%s%s: not found (404)%s", repo,
                              w->path ? " file " : "", w->path ? w->path : "", said);
    if (hub_status_transient(status))
        return ckpt_error_set(CKPT_EIO, "%s%s%s: the Hub answered %ld, retries exhausted%s", repo,
                              w->path ? " file " : "", w->path ? w->path : "", status, said);
    return ckpt_error_set(CKPT_EINVAL, "%s%s%s: unexpected answer %ld%s", repo,
                          w->path ? " file " : "", w->path ? w->path : "", status, said);
}

/* ---- JSON requests ---- */

typedef struct {
    char *data;
    size_t len, cap;
    bool too_big, error_cut;
    CURL *e;
} body_buf;

static size_t body_cb(char *p, size_t size, size_t n, void *ctx)
{
    body_buf *b = ctx;
    size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(b->e, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 300 && b->len + len > HUB_MAX_ERROR_BODY) {
        b->error_cut = true; /* the status says enough: stop reading */
        return 0;
    }
    if (b->len + len > HUB_MAX_JSON_BYTES) {
        b->too_big = true;
        return 0;
    }
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 16384;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, len);
    b->len += len;
    b->data[b->len] = 0;
    return len;
}

static size_t header_cb(char *p, size_t size, size_t n, void *ctx)
{
    hub_answer_header(ctx, p, size * n);
    return size * n;
}

/* GETs url (following redirects, retrying transient failures) and parses
 * the JSON answer. *next gets the Link rel="next" URL when asked for. */
static int get_json(hub_client *h, const char *url0, const hub_what *w, json_t **out, char **next)
{
    *out = NULL;
    if (next) *next = NULL;
    char *url = ckpt_strdup(url0);
    CURL *e = curl_easy_init();
    if (!url || !e) {
        free(url);
        if (e) curl_easy_cleanup(e);
        return ckpt_error_set(CKPT_ENOMEM, "out of memory starting a request");
    }
    hub_answer a = {0};
    body_buf b = {.e = e};
    int fails = 0, redirects = 0, rc = 0;
    char errbuf[CURL_ERROR_SIZE];
    for (;;) {
        curl_easy_reset(e);
        hub_easy_defaults(e);
        struct curl_slist *hdrs = hub_request_headers(h, url, 0, 0);
        hub_answer_reset(&a);
        b.len = 0;
        b.too_big = b.error_cut = false;
        errbuf[0] = 0;
        if ((rc = hub_easy_timeouts(h, e, w->repo))) {
            curl_slist_free_all(hdrs);
            break;
        }
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, body_cb);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, &a);
        curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, ""); /* JSON may come compressed */
        CURLcode res = hdrs ? curl_easy_perform(e) : CURLE_OUT_OF_MEMORY;
        curl_slist_free_all(hdrs);
        long status = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
        if (b.error_cut) res = CURLE_OK; /* the answer is its status */
        if (res == CURLE_OPERATION_TIMEDOUT && hub_past_deadline(h)) {
            rc = hub_deadline_error(h, w->repo);
            break;
        }
        if (b.too_big) {
            rc = ckpt_error_set(CKPT_ELIMIT, "%s: an API answer larger than %u bytes", w->repo,
                                HUB_MAX_JSON_BYTES);
            break;
        }
        if (res != CURLE_OK || hub_status_transient(status)) {
            curl_off_t ra = -1;
            curl_easy_getinfo(e, CURLINFO_RETRY_AFTER, &ra);
            if (++fails > HUB_MAX_RETRIES) {
                rc = res != CURLE_OK
                         ? ckpt_error_set(CKPT_EIO, "%s: cannot reach the Hub at %s: %s", w->repo,
                                          h->endpoint, *errbuf ? errbuf : curl_easy_strerror(res))
                         : hub_answer_error(h, status, &a, w);
                break;
            }
            double wait = hub_backoff(h, fails, ra > 0 ? (double)ra : 0);
            if (h->deadline > 0 && ckpt_now() + wait >= h->deadline) {
                rc = hub_deadline_error(h, w->repo);
                break;
            }
            hub_sleep(wait);
            continue;
        }
        if (status >= 300 && status < 400) {
            char *loc = NULL;
            curl_easy_getinfo(e, CURLINFO_REDIRECT_URL, &loc);
            if (!loc || ++redirects > HUB_MAX_REDIRECTS) {
                rc = ckpt_error_set(CKPT_EINVAL, "%s: %s", w->repo,
                                    loc ? "too many redirects" : "a redirect without a Location");
                break;
            }
            char *n = ckpt_strdup(loc);
            if (!n) {
                rc = CKPT_ENOMEM;
                break;
            }
            free(url);
            url = n;
            continue;
        }
        if (status != 200) {
            rc = hub_answer_error(h, status, &a, w);
            break;
        }
        json_error_t err;
        *out = json_loadb(b.data ? b.data : "", b.len, JSON_ALLOW_NUL, &err);
        if (!*out) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: the Hub's answer is not JSON (%s)", w->repo,
                                err.text);
            break;
        }
        if (next && a.link_next) {
            *next = a.link_next;
            a.link_next = NULL;
        }
        break;
    }
    hub_answer_reset(&a);
    free(b.data);
    free(url);
    curl_easy_cleanup(e);
    return rc;
}

static bool is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return false;
    return s[n] == '\0';
}

static void lower(char *s)
{
    for (; *s; s++)
        *s = (char)tolower((unsigned char)*s);
}

int hub_resolve_revision(hub_client *h, const char *repo, const char *rev, char commit[41])
{
    char *r = hub_pct_encode(repo, true), *v = hub_pct_encode(rev, false);
    char *url = r && v ? ckpt_sprintf("%s/api/models/%s/revision/%s", h->endpoint, r, v) : NULL;
    free(r);
    free(v);
    if (!url) return CKPT_ENOMEM;
    hub_what w = {repo, rev, NULL};
    json_t *j;
    int rc = get_json(h, url, &w, &j, NULL);
    free(url);
    if (rc) return rc;
    const char *sha = json_string_value(json_object_get(j, "sha"));
    if (!sha || !is_hex(sha, 40))
        rc = ckpt_error_set(CKPT_EINVAL, "%s@%s: the Hub's revision answer has no 40-digit 'sha'",
                            repo, rev);
    else {
        memcpy(commit, sha, 41);
        lower(commit);
    }
    json_decref(j);
    return rc;
}

/* ---- tree ---- */

int hub_path_check(const char *path, size_t len)
{
    char shown[200];
    hub_escape(path, len < 150 ? len : 150, shown, sizeof shown);
    const char *why = NULL;
    if (len == 0)
        why = "is empty";
    else if (strlen(path) != len)
        why = "holds a NUL byte";
    else if (len > HUB_MAX_PATH)
        return ckpt_error_set(CKPT_ELIMIT,
                              "unsafe file name from the Hub: '%s...' is longer than %d bytes",
                              shown, HUB_MAX_PATH);
    else if (path[0] == '/')
        why = "is absolute";
    for (size_t i = 0; !why && i < len; i++)
        if ((unsigned char)path[i] < 0x20 || path[i] == 0x7f) why = "holds a control character";
    for (const char *seg = path; !why && seg;) {
        const char *slash = strchr(seg, '/');
        size_t sl = slash ? (size_t)(slash - seg) : strlen(seg);
        if (sl == 0)
            why = "has an empty segment";
        else if ((sl == 1 && seg[0] == '.') || (sl == 2 && seg[0] == '.' && seg[1] == '.'))
            why = "has a '.' or '..' segment";
        else if (sl > HUB_MAX_SEGMENT)
            why = "has a segment longer than 255 bytes";
        seg = slash ? slash + 1 : NULL;
    }
    if (why)
        return ckpt_error_set(
            CKPT_EINVAL, "unsafe file name from the Hub: '%s' %s; nothing was written", shown, why);
    /* The store's rule for every file it records (store_path_check). */
    int rc = store_path_check(path);
    if (rc) return ckpt_error_prefix(rc, "file name from the Hub refused; nothing was written");
    return 0;
}

void hub_tree_free(hub_tree *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->v[i].path);
    free(t->v);
    memset(t, 0, sizeof *t);
}

static int add_entry(hub_tree *t, const json_t *e, const char *repo)
{
    const char *type = json_string_value(json_object_get(e, "type"));
    if (!type) return ckpt_error_set(CKPT_EINVAL, "%s: a tree entry without a 'type'", repo);
    json_t *jp = json_object_get(e, "path");
    if (!json_is_string(jp))
        return ckpt_error_set(CKPT_EINVAL, "%s: a tree entry without a 'path'", repo);
    int rc = hub_path_check(json_string_value(jp), json_string_length(jp));
    if (rc || strcmp(type, "file")) return rc; /* directories: names checked, nothing to fetch */
    const char *path = json_string_value(jp);
    json_t *js = json_object_get(e, "size"), *lfs = json_object_get(e, "lfs");
    if (!json_is_integer(js) || json_integer_value(js) < 0 ||
        (uint64_t)json_integer_value(js) > HUB_MAX_FILE_SIZE)
        return ckpt_error_set(CKPT_EINVAL, "%s: tree entry '%s' has a bad 'size'", repo, path);
    if (t->n >= HUB_MAX_FILES)
        return ckpt_error_set(CKPT_ELIMIT, "%s: more than %d files", repo, HUB_MAX_FILES);
    if ((rc = ckpt_grow(&t->v, &t->cap, t->n + 1, sizeof *t->v))) return rc;
    hub_entry *he = &t->v[t->n];
    memset(he, 0, sizeof *he);
    he->size = (uint64_t)json_integer_value(js);
    const char *oid = json_string_value(json_object_get(e, "oid"));
    if (oid && is_hex(oid, 40)) {
        memcpy(he->oid, oid, 41);
        lower(he->oid);
    }
    if (lfs && !json_is_null(lfs)) {
        const char *sha = json_string_value(json_object_get(lfs, "oid"));
        json_t *ls = json_object_get(lfs, "size");
        if (sha && !strncmp(sha, "sha256:", 7)) sha += 7;
        if (!sha || !is_hex(sha, 64))
            return ckpt_error_set(
                CKPT_EINVAL, "%s: tree entry '%s' has an LFS oid that is not a sha256", repo, path);
        if (json_is_integer(ls) && (uint64_t)json_integer_value(ls) != he->size)
            return ckpt_error_set(CKPT_EINVAL, "%s: tree entry '%s': size %llu but lfs.size %lld",
                                  repo, path, (unsigned long long)he->size,
                                  (long long)json_integer_value(ls));
        memcpy(he->sha256, sha, 65);
        lower(he->sha256);
    }
    if (!he->oid[0] && !he->sha256[0]) /* nothing to verify the download against */
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: tree entry '%s' has neither a git 'oid' nor an 'lfs' sha256: "
                              "refusing to store a file that cannot be verified",
                              repo, path);
    he->path = ckpt_strdup(path);
    if (!he->path) return CKPT_ENOMEM;
    t->n++;
    return 0;
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const hub_entry *)a)->path, ((const hub_entry *)b)->path);
}

int hub_list_tree(hub_client *h, const char *repo, const char *commit, hub_tree *out)
{
    memset(out, 0, sizeof *out);
    char *r = hub_pct_encode(repo, true);
    char *url =
        r ? ckpt_sprintf("%s/api/models/%s/tree/%s?recursive=true", h->endpoint, r, commit) : NULL;
    free(r);
    if (!url) return CKPT_ENOMEM;
    hub_what w = {repo, commit, NULL};
    int rc = 0;
    for (int page = 0; !rc && url; page++) {
        if (page >= HUB_MAX_TREE_PAGES) {
            rc = ckpt_error_set(CKPT_ELIMIT, "%s: the tree has more than %d pages", repo,
                                HUB_MAX_TREE_PAGES);
            break;
        }
        json_t *j;
        char *next = NULL;
        rc = get_json(h, url, &w, &j, &next);
        free(url);
        url = next;
        if (rc) break;
        if (!json_is_array(j))
            rc = ckpt_error_set(CKPT_EINVAL, "%s: a tree page is not a JSON list", repo);
        size_t i;
        json_t *e;
        json_array_foreach(j, i, e)
        {
            if (rc) break;
            rc = add_entry(out, e, repo);
        }
        json_decref(j);
        if (!rc && url && strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
            rc =
                ckpt_error_set(CKPT_EINVAL, "%s: the tree's next page is not an http(s) URL", repo);
    }
    free(url);
    if (!rc && out->n > 1) {
        qsort(out->v, out->n, sizeof *out->v, cmp_entry);
        for (size_t i = 1; !rc && i < out->n; i++) {
            const char *a = out->v[i - 1].path, *b = out->v[i].path;
            size_t al = strlen(a);
            if (!strcmp(a, b))
                rc = ckpt_error_set(CKPT_EINVAL, "%s: the tree lists '%s' twice", repo, a);
            else if (!strncmp(a, b, al) && b[al] == '/')
                rc = ckpt_error_set(CKPT_EINVAL,
                                    "%s: the tree lists '%s' as a file and as a folder", repo, a);
        }
    }
    if (rc) hub_tree_free(out);
    return rc;
}

/* ---- which files ---- */

static bool glob_match(const char *pattern, const char *path)
{
    if (fnmatch(pattern, path, 0) == 0) return true;
    return !strchr(pattern, '/') && fnmatch(pattern, ckpt_basename(path), 0) == 0;
}

static bool any_match(const char *const *patterns, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (glob_match(patterns[i], path)) return true;
    return false;
}

static size_t list_len(const char *const *l)
{
    size_t n = 0;
    while (l[n])
        n++;
    return n;
}

bool hub_filter_match(const hub_filter *f, const char *path)
{
    bool take = f->ninclude
                    ? any_match(f->include, f->ninclude, path)
                    : any_match(hub_default_include, list_len(hub_default_include), path) &&
                          !any_match(hub_default_exclude, list_len(hub_default_exclude), path);
    return take && !any_match(f->exclude, f->nexclude, path);
}
