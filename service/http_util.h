/* http_util.h — answering libmicrohttpd requests with text and JSON, shared by the job API and the store API. */
#ifndef CKPT_SERVICE_HTTP_UTIL_H
#define CKPT_SERVICE_HTTP_UTIL_H

#include <jansson.h>
#include <microhttpd.h>

/* Takes ownership of text (malloc'd). */
enum MHD_Result http_send_text(struct MHD_Connection *c, unsigned code, const char *type, char *text);
/* Takes ownership of j (may be NULL: 500). */
enum MHD_Result http_send_json(struct MHD_Connection *c, unsigned code, json_t *j);
/* {"error": msg}; hub_code, when given, goes into X-Error-Code (and msg into X-Error-Message). */
enum MHD_Result http_send_error(struct MHD_Connection *c, unsigned code, const char *msg, const char *hub_code,
                                const char *repo_commit);

#endif
