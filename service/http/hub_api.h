/*
 * hub_api.h — the Hugging Face Hub read API of docs/hub.md over the store, in
 * the daemon's API server (and in the tests' local Hub, tests/hub/testhub.c),
 * so that huggingface_hub (HF_ENDPOINT=http://host:port) and @huggingface/hub
 * (hubUrl) can list, download and read safetensors metadata from the store:
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
 *
 * A repo, revision or file that does not exist is a 404 with the Hub's
 * X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound); a catalog
 * that cannot be read is a 500 whose JSON error names the lookup that failed.
 */
#ifndef CKPT_SERVICE_HTTP_HUB_API_H
#define CKPT_SERVICE_HTTP_HUB_API_H

#include "store/store.h"

#include <microhttpd.h>
#include <stdbool.h>

#define HUB_PAGE_SIZE_DEFAULT 1000

/* Answers the request when it is one of the routes above (*handled set);
 * a path with a bad %-escape outside /v1/ is a 400 here. */
enum MHD_Result hub_api_route(ckpt_store *s, struct MHD_Connection *c, const char *url, const char *method,
                              const char *body, size_t body_len, bool *handled);
/* rev of repo as the API above resolves it ("HEAD", an import name, a commit
 * or its prefix, "<commit>.<layout>", a layout's pseudo-commit, a layout of
 * main or of the newest original): fills *ck (store_ckpt_free it) and sha,
 * the commit clients see. CKPT_ENOTFOUND when nothing matches, another error
 * when a lookup failed. */
int hub_api_resolve_rev(ckpt_store *s, const char *repo, const char *rev, store_ckpt *ck, char sha[41]);

#endif
