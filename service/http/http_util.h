/*
 * http_util.h — answering libmicrohttpd requests with text and JSON, paths
 * split into segments, and stored files streamed with Range: shared by the
 * job API (http_api.c), the store API (store_api.c) and the Hub read API
 * (hub_api.c).
 */
#ifndef CKPT_SERVICE_HTTP_HTTP_UTIL_H
#define CKPT_SERVICE_HTTP_HTTP_UTIL_H

#include "store/store.h"

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#define HTTP_TOKEN_DIGEST 32

/* What the request being served got (for the access log and /metrics):
 * its status and the body bytes queued or streamed so far. Every answer goes
 * through http_queue (size: a buffer's length; 0 for a streamed body, whose
 * callback adds what it sends with http_answer_bytes). */
typedef struct {
    unsigned status;
    uint64_t bytes;
} http_answer;
void http_answer_reset(void);
void http_answer_bytes(uint64_t n);
http_answer http_answer_get(void);
enum MHD_Result http_queue(struct MHD_Connection *c, unsigned code, struct MHD_Response *r, uint64_t size);

/* Takes ownership of text (malloc'd). */
enum MHD_Result http_send_text(struct MHD_Connection *c, unsigned code, const char *type, char *text);
/* Takes ownership of j (may be NULL: 500). */
enum MHD_Result http_send_json(struct MHD_Connection *c, unsigned code, json_t *j);
/* {"error": msg}; hub_code, when given, goes into X-Error-Code (and msg into X-Error-Message). */
enum MHD_Result http_send_error(struct MHD_Connection *c, unsigned code, const char *msg, const char *hub_code,
                                const char *repo_commit);
/* The same with X-Error-Message always, and X-Error-Code only when hub_code is given. */
enum MHD_Result http_send_error_msg(struct MHD_Connection *c, unsigned code, const char *msg, const char *hub_code);

/* The answer to a failed store call rc (ckpt_error_last() the message):
 * CKPT_ENOTFOUND 404, CKPT_EINVAL 400, anything else (a catalog that cannot be
 * read, I/O) 500 with {"error": "<what>: <message>", "code": "<code name>"}. */
enum MHD_Result http_send_store_error(struct MHD_Connection *c, int rc, const char *what);

/* ---- paths ---- */

#define HTTP_MAX_SEGMENTS 64

typedef struct {
    char *buf;
    char *seg[HTTP_MAX_SEGMENTS];
    int n;
} http_segments;

/* Splits the raw path (no query) on '/' first, then percent-decodes each
 * piece, so "%2F" inside a segment is no separator (docs/hub.md). False on a
 * bad escape, a NUL or too many segments; free sg->buf either way. */
bool http_split_path(const char *url, http_segments *sg);
/* Segments [from, n) joined with '/'; malloc'd. */
char *http_join_from(const http_segments *sg, int from);
/* Percent-decodes in place; false on a bad escape or a NUL. */
bool http_pct_decode(char *s);
/* A stored file path a client may name (non-empty, no '..', ...). */
bool http_path_safe(const char *p);
/* The unescape callback the server must install: keeps the path raw, so
 * "%2F" inside a revision is not taken for a separator. */
size_t http_keep_raw(void *cls, struct MHD_Connection *c, char *s);

/* ---- stored files ---- */

/* Parses a single "bytes=a-b" / "a-" / "-n" range against size T: 0 no
 * (usable) range, 1 range [*a, *b], -1 unsatisfiable. */
int http_parse_range(const char *h, uint64_t T, uint64_t *a, uint64_t *b);

/* What the Hub API adds to a file's answer (NULL for /v1/checkpoints). */
typedef struct {
    const char *commit; /* X-Repo-Commit */
    bool lfs;           /* X-Linked-Etag / X-Linked-Size */
    const char *etag;   /* the ETag of a non-LFS file (its git oid); else the sha256 */
} http_hub_file;

/* Sends stored file path of ck (GET/HEAD) with Range and ETag, streamed from
 * blobs and recipes. A file that cannot be opened is a 404 (Hub: EntryNotFound). */
enum MHD_Result http_send_stored_file(ckpt_store *s, struct MHD_Connection *c, const store_ckpt *ck, const char *path,
                                      const http_hub_file *hub);

/* API tokens are kept and compared as sha256 digests: a fixed size, so a
 * compare (CRYPTO_memcmp, constant time) leaks neither length nor prefix. */
void http_token_digest(const char *token, size_t len, unsigned char out[HTTP_TOKEN_DIGEST]);
bool http_token_equal(const unsigned char a[HTTP_TOKEN_DIGEST], const unsigned char b[HTTP_TOKEN_DIGEST]);

#endif
