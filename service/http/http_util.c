/* http_util.c — answering requests with text and JSON, and API token digests (see http_util.h). */
#include "service/http/http_util.h"

#include "common/util.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
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

static struct MHD_Response *text_response(const char *type, char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (r) MHD_add_response_header(r, "Content-Type", type);
    return r;
}

enum MHD_Result http_send_text(struct MHD_Connection *c, unsigned code, const char *type, char *text)
{
    struct MHD_Response *r = text_response(type, text);
    if (!r) return MHD_NO;
    enum MHD_Result ret = MHD_queue_response(c, code, r);
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

enum MHD_Result http_send_error(struct MHD_Connection *c, unsigned code, const char *msg, const char *hub_code,
                                const char *repo_commit)
{
    char *s = json_text(json_pack("{s:s}", "error", msg));
    struct MHD_Response *r = s ? text_response("application/json", s) : NULL;
    if (!r) return MHD_NO;
    if (hub_code) {
        MHD_add_response_header(r, "X-Error-Code", hub_code);
        char safe[512];
        size_t i = 0;
        for (; msg[i] && i + 1 < sizeof safe; i++) safe[i] = (msg[i] < 0x20 || msg[i] == 0x7f) ? ' ' : msg[i];
        safe[i] = 0;
        MHD_add_response_header(r, "X-Error-Message", safe);
    }
    if (repo_commit) MHD_add_response_header(r, "X-Repo-Commit", repo_commit);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}
