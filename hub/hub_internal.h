/*
 * hub_internal.h — what hub_client.c, hub_download.c and hub_fetch.c share:
 * URLs, the token rule, backoff, and turning a Hub error answer into a
 * sentence. Not for use outside hub/hub_*.c.
 */
#ifndef CKPT_HUB_HUB_INTERNAL_H
#define CKPT_HUB_HUB_INTERNAL_H

#include "hub/hub.h"

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>

#define HUB_USER_AGENT "ckpt/0.1"
#define HUB_CONNECT_TIMEOUT_S 30L
#define HUB_STALL_S 60L /* a transfer that moves under 1 KiB/s this long is cut and retried */

/* What a request is about, for error sentences. */
typedef struct {
    const char *repo, *rev, *path;
} hub_what;

/* Headers of one answer that matter (filled by hub_header_cb). */
typedef struct {
    char error_code[64];
    char error_message[256];
    char content_range[128];
    char linked_etag[96]; /* X-Linked-Etag, normalized (hub_etag_normalize); "" when absent */
    char *link_next;      /* malloc'd */
} hub_answer;

/* An ETag value as huggingface_hub's file_download.py _normalize_etag reads
 * it: a weak "W/" prefix and the surrounding quotes dropped, so W/"abc",
 * "abc" and abc all give abc. */
void hub_etag_normalize(const char *v, size_t len, char *out, size_t outlen);

void hub_answer_reset(hub_answer *a);
/* Reads one header line into a; call from a CURLOPT_HEADERFUNCTION. A status
 * line starts a new answer. */
void hub_answer_header(hub_answer *a, const char *line, size_t len);

/* curl_global_init, once per process. */
int hub_curl_init(void);
/* "E/{repo}/resolve/{commit}/{path}", segments %-encoded. malloc'd. */
char *hub_file_url(const hub_client *h, const char *repo, const char *commit, const char *path);
/* %-encodes s (unreserved characters kept; '/' kept when keep_slash). malloc'd. */
char *hub_pct_encode(const char *s, bool keep_slash);
/* True when url has the endpoint's scheme, host and port: only then is the
 * token sent. */
bool hub_same_origin(const hub_client *h, const char *url);
/* The request headers for url: User-Agent, the token when hub_same_origin,
 * and "Range: bytes=a-b" when range_end > 0 (then b = range_end - 1). */
struct curl_slist *hub_request_headers(const hub_client *h, const char *url, uint64_t range_start,
                                       uint64_t range_end);
/* Options every request shares (no redirects followed by libcurl, http(s)
 * only, timeouts, no signals). */
void hub_easy_defaults(CURL *e);
/* Sets e's timeout: the per-request one, cut to what is left of the fetch's
 * deadline; when that has passed, a CKPT_EIO error naming what. */
int hub_easy_timeouts(const hub_client *h, CURL *e, const char *what);
/* The error for a fetch whose deadline passed, naming what it was doing. */
int hub_deadline_error(const hub_client *h, const char *what);
/* True when the fetch's deadline has passed. */
bool hub_past_deadline(const hub_client *h);
/* 408, 429 and 5xx: worth retrying. */
bool hub_status_transient(long status);
/* Seconds to wait before retry number fails (1, 2, ...): exponential with
 * jitter, capped; at least retry_after (capped at HUB_RETRY_AFTER_CAP_S). */
double hub_backoff(const hub_client *h, int fails, double retry_after);
void hub_sleep(double seconds);
/* Sets the error for a failed answer in plain words; returns its code. */
int hub_answer_error(const hub_client *h, long status, const hub_answer *a, const hub_what *w);
/* Copies s into out (len bytes) with control characters as \xNN. */
void hub_escape(const char *s, size_t slen, char *out, size_t len);

#endif
