/*
 * store_api.h — the store over HTTP, in the daemon's API server:
 *
 *   GET  /v1/checkpoints[?repo=R]                 stored checkpoints
 *   GET  /v1/checkpoints/{ref}                    one, with its files
 *   GET|HEAD /v1/checkpoints/{ref}/files/{path}   a file, single Range requests, ETag = sha256
 *   GET  /v1/checkpoints/{ref}/archive.tar[.zst][?rank=R]   a tar stream
 *
 * The JSON of the list and of one checkpoint is store_info.h's (the same
 * `ckpt ls --json` and `ckpt show --json` print). A ref that names nothing is
 * a 404; a catalog that cannot be read is a 500 whose JSON error names what
 * failed ({"error": "...", "code": "I/O error"}). A tar stream that fails
 * after its answer began is aborted (no tar end, no final chunk) and logged,
 * so a client sees a truncated transfer, never a clean 200.
 */
#ifndef CKPT_SERVICE_HTTP_STORE_API_H
#define CKPT_SERVICE_HTTP_STORE_API_H

#include "store/store.h"

#include <microhttpd.h>
#include <stdbool.h>

/* Answers the request when it is one of the routes above (*handled set). */
enum MHD_Result store_api_route(ckpt_store *s, struct MHD_Connection *c, const char *url, const char *method,
                                bool *handled);

#endif
