/* http_util.h — answering libmicrohttpd requests with text and JSON, shared by the job API and the store API. */
#ifndef CKPT_SERVICE_HTTP_UTIL_H
#define CKPT_SERVICE_HTTP_UTIL_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#define HTTP_TOKEN_DIGEST 32

/* Takes ownership of text (malloc'd). */
enum MHD_Result http_send_text(struct MHD_Connection *c, unsigned code, const char *type, char *text);
/* Takes ownership of j (may be NULL: 500). */
enum MHD_Result http_send_json(struct MHD_Connection *c, unsigned code, json_t *j);
/* {"error": msg}; hub_code, when given, goes into X-Error-Code (and msg into X-Error-Message). */
enum MHD_Result http_send_error(struct MHD_Connection *c, unsigned code, const char *msg, const char *hub_code,
                                const char *repo_commit);

/* API tokens are kept and compared as sha256 digests: a fixed size, so a
 * compare (CRYPTO_memcmp, constant time) leaks neither length nor prefix. */
void http_token_digest(const char *token, size_t len, unsigned char out[HTTP_TOKEN_DIGEST]);
bool http_token_equal(const unsigned char a[HTTP_TOKEN_DIGEST], const unsigned char b[HTTP_TOKEN_DIGEST]);

#endif
