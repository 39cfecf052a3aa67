/*
 * store_http.h — the store over HTTP, in the daemon's API server:
 *
 *   GET  /v1/checkpoints[?repo=R]                 stored checkpoints
 *   GET  /v1/checkpoints/{ref}                    one, with its files (size, sha256)
 *   GET|HEAD /v1/checkpoints/{ref}/files/{path}   a file, single Range requests, ETag = sha256
 *   GET  /v1/checkpoints/{ref}/archive.tar[.zst][?rank=R]   a tar stream
 *
 * and the Hugging Face Hub read API of docs/hub.md, so that huggingface_hub
 * (HF_ENDPOINT=http://host:port) and @huggingface/hub (hubUrl) can list,
 * download and read safetensors metadata from the store:
 *
 *   GET  /api/models/{repo}/revision/{rev}
 *   GET  /api/models/{repo}/tree/{rev}[/{path}]   recursive, paged with Link
 *   POST /api/models/{repo}/paths-info/{rev}
 *   HEAD|GET /{repo}/resolve/{rev}/{path}          Range, LFS headers
 *   HEAD /{repo}/raw/{rev}/{path}
 *
 * Revisions: originals under the names they were imported with and their
 * commits; each converted layout as a revision named by its layout
 * ("neuron-tp8": of the newest original) or "<commit>.<layout>", whose commit
 * sha is sha1("<commit>.<layout>") so client caches keep them apart. Files are
 * streamed from blobs and assembled from recipes on the fly, never
 * materialised; each download holds bounded memory.
 */
#ifndef CKPT_SERVICE_STORE_HTTP_H
#define CKPT_SERVICE_STORE_HTTP_H

#include "store/store.h"

#include <microhttpd.h>
#include <stdbool.h>

#define HUB_PAGE_SIZE_DEFAULT 1000

/* Answers the request when it is one of the routes above (*handled set). */
enum MHD_Result store_http_route(ckpt_store *s, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *body, size_t body_len, bool *handled);
/* rev of repo as the Hub API above resolves it ("HEAD", an import name, a
 * commit or its prefix, "<commit>.<layout>", a layout's pseudo-commit, a
 * layout of main or of the newest original): fills *ck (store_ckpt_free it)
 * and sha, the commit clients see. False when nothing matches. */
bool store_http_resolve_rev(ckpt_store *s, const char *repo, const char *rev, store_ckpt *ck, char sha[41]);
/* The unescape callback the server must install: keeps the path raw, so
 * "%2F" inside a revision is not taken for a separator. */
size_t store_http_keep_raw(void *cls, struct MHD_Connection *c, char *s);

#endif
