/*
 * hub.h — downloading checkpoints from a Hugging Face Hub (docs/hub.md).
 *
 * A fetch, step by step (hub_fetch):
 *
 *   1. resolve the revision to a commit: GET {E}/api/models/{repo}/revision/{rev};
 *      every later request names that commit, so a push during the download
 *      cannot mix two revisions;
 *   2. list the files: GET {E}/api/models/{repo}/tree/{commit}?recursive=true,
 *      every page (Link: <url>; rel="next"); every name is checked before
 *      anything is written (no "..", "." or empty segments, not absolute, no
 *      NUL or control characters, at most HUB_MAX_PATH bytes and
 *      HUB_MAX_SEGMENT per segment); the include/exclude globs pick files;
 *   3. when the store holds (repo, commit) already: the files it has (by
 *      path) are dropped from the pick; none left: point the revision at it
 *      and stop, nothing is downloaded; else the rest is a top-up, added to
 *      that checkpoint at step 6 (store_add_files) instead of a new one;
 *   4. download the picked files with hub_download: parallel Range requests
 *      on one libcurl multi handle, each byte written once, straight into the
 *      files of the commit's resume folder (store_partial.h: an interrupted
 *      fetch keeps its finished pieces there and the next one requests only
 *      the rest; when another fetch holds the folder, the store's blob temp
 *      files in CKPT_HOME/tmp, which gc removes once the writer is gone;
 *      never held in memory): a
 *      safetensors file's header is fetched first and parsed (st_parse, the
 *      same checks as an import), then each tensor's bytes go to that
 *      tensor's blob; any other file is one blob;
 *   5. verify: every file's size; the sha256 of every LFS file against the
 *      tree's lfs.oid and the git blob id (sha1) of every other file against
 *      its oid (a tree entry with neither is refused when the tree is read:
 *      nothing unverifiable is stored). A mismatch (or a header that does not parse) downloads the
 *      file once more; a second one fails the fetch naming the file;
 *   6. only then publish the blobs and commit the checkpoint, named by the
 *      commit, in one catalog transaction (store_blobs_publish,
 *      store_commit_checkpoint, or store_add_files for a top-up): nothing
 *      unverified enters the store.
 *
 * Bounds: the body of an error answer is read up to HUB_MAX_ERROR_BODY bytes,
 * then the connection is cut (the status says enough; a server that sends an
 * endless error body costs one attempt, not the fetch); an API answer is at
 * most HUB_MAX_JSON_BYTES; the files picked must fit the space free in
 * CKPT_HOME/tmp, checked before any piece is set up (a tree that declares
 * 16 TiB files fails at once instead of allocating state for them); every
 * request ends after CKPT_HUB_REQUEST_TIMEOUT seconds (default
 * HUB_REQUEST_TIMEOUT_S; it is then retried like a dropped connection) and
 * the whole fetch after CKPT_HUB_FETCH_TIMEOUT seconds (default: none), each
 * a number of seconds (fractions allowed), 0 meaning none.
 *
 * Robustness of each request: 408, 429 and 5xx answers and transport errors
 * are retried with exponential backoff (HUB_BACKOFF_* , with jitter) that
 * honours Retry-After, up to HUB_MAX_RETRIES times without progress; a
 * dropped download resumes from the last byte written; a 200 answer to a
 * Range request (a server ignoring Range) restarts that piece from its first
 * byte, never appending; redirects are followed (at most HUB_MAX_REDIRECTS)
 * by hand, and the token goes only to URLs with the endpoint's own scheme,
 * host and port (a Xet-backed file's redirect to the storage host gets none).
 * Retry-After is read in both forms (seconds or an HTTP-date, by libcurl),
 * capped at HUB_RETRY_AFTER_CAP_S, and each such answer counts as a retry.
 * An X-Linked-Etag on the endpoint's answer (quoted or weak W/"...", read
 * by hub_etag_normalize) that is not the tree's lfs.oid fails the fetch.
 *
 * Configuration (hub_client_init): HF_ENDPOINT (default
 * https://huggingface.co); the token from HF_TOKEN, else
 * HUGGING_FACE_HUB_TOKEN, else the file $HF_HOME/token (HF_HOME default
 * ~/.cache/huggingface). The token is kept in memory only: it never appears
 * in logs, job arguments, error messages or the database.
 * CKPT_HUB_BACKOFF_MS overrides the first backoff step (tests make it small).
 *
 * Errors are in plain words from X-Error-Code: repository not found,
 * revision not found, file not found, gated repository (accept the licence
 * and pass a token), bad token. Permanent ones are CKPT_ENOTFOUND or
 * CKPT_EINVAL; ones a later retry may cure (network, 5xx) CKPT_EIO.
 * Verifying a download: bytes that do not hash to what the Hub says are
 * downloaded again once, then CKPT_ECORRUPT; reading the written bytes back
 * fails with CKPT_EIO (transient: a job retries it); a failure of the digest
 * library is CKPT_EINTERNAL (not retried).
 */
#ifndef CKPT_HUB_HUB_H
#define CKPT_HUB_HUB_H

#include "store/store.h"
#include "store/store_partial.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"
#define HUB_MAX_PATH STORE_MAX_PATH
#define HUB_MAX_SEGMENT 255
#define HUB_MAX_FILES STORE_MAX_FILES
#define HUB_MAX_JSON_BYTES (64u << 20) /* one API answer (a tree page) */
#define HUB_MAX_ERROR_BODY (64u << 10) /* the body of an error answer: the rest is not read */
#define HUB_REQUEST_TIMEOUT_S 1800     /* one request (a piece of HUB_DEFAULT_CHUNK bytes) */
#define HUB_MAX_TREE_PAGES 10000
#define HUB_MAX_REDIRECTS 10
#define HUB_MAX_RETRIES 8  /* attempts of one request that make no progress */
#define HUB_BACKOFF_MS 500 /* first backoff step; doubles each retry */
#define HUB_BACKOFF_CAP_S 60.0
#define HUB_RETRY_AFTER_CAP_S 300.0 /* a Retry-After longer than this is cut to it */
#define HUB_DEFAULT_CONNECTIONS 8
#define HUB_MAX_CONNECTIONS 64
#define HUB_DEFAULT_CHUNK (32u << 20) /* bytes per Range request */
#define HUB_MIN_CHUNK (64u << 10)
#define HUB_MAX_FILE_SIZE (1ull << 44) /* 16 TiB: a larger size is a broken tree */
#define HUB_MAX_GLOBS 256

typedef struct {
    char *endpoint; /* no trailing slash */
    char *token;    /* NULL: none. Never logged. */
    int connections;
    uint64_t chunk_size;
    double backoff_s; /* first backoff step */
    double request_timeout_s; /* one request; 0: none */
    double fetch_timeout_s;   /* the whole fetch; 0: none */
    double deadline;          /* ckpt_now() when the fetch must end; 0: none (hub_client_start) */
} hub_client;

/* Reads the environment (see above). */
int hub_client_init(hub_client *h);
/* Starts the whole-fetch clock (fetch_timeout_s from now). */
void hub_client_start(hub_client *h);
void hub_client_free(hub_client *h);

/* One file of a tree listing. */
typedef struct {
    char *path;
    uint64_t size;
    char oid[41];    /* git blob id (sha1 hex), "" when absent */
    char sha256[65]; /* lfs.oid, "" for a file that is not in LFS */
} hub_entry;

typedef struct {
    hub_entry *v;
    size_t n, cap;
} hub_tree;

void hub_tree_free(hub_tree *t);

/* The commit (40 hex digits) a revision names. */
int hub_resolve_revision(hub_client *h, const char *repo, const char *rev, char commit[41]);
/* Every file of the repo at commit (all pages). Unsafe names are an error. */
int hub_list_tree(hub_client *h, const char *repo, const char *commit, hub_tree *out);

/* A name from the server is safe to create under a folder: relative, no
 * empty, "." or ".." segments, no NUL (len is the JSON string's length) or
 * control characters, within HUB_MAX_PATH and HUB_MAX_SEGMENT, and one the
 * store can hold (store_path_check: no '..' or '\\' anywhere). Else
 * CKPT_EINVAL naming it (escaped). */
int hub_path_check(const char *path, size_t len);

/* Which files a fetch takes. include NULL/empty: the defaults
 * (HUB_DEFAULT_INCLUDE); a file matching HUB_DEFAULT_EXCLUDE is taken only when
 * an explicit include pattern matches it; an exclude pattern always wins.
 * Patterns are fnmatch(3) globs over the whole path ('*' crosses '/'); a
 * pattern without '/' also matches the file name alone ("config.json"
 * matches "sub/config.json"). */
typedef struct {
    const char *const *include;
    size_t ninclude;
    const char *const *exclude;
    size_t nexclude;
} hub_filter;
bool hub_filter_match(const hub_filter *f, const char *path);
/* The default lists, for help texts: "*.safetensors, *.json, ...". */
extern const char *const hub_default_include[];
extern const char *const hub_default_exclude[];

/* Blob writers of a download, to publish (store_blobs_publish) or abort. */
typedef struct {
    store_blob_writer *w;
    size_t n;
} hub_blobs;
void hub_blobs_abort(hub_blobs *b);

/* Downloads files[0..n) (sorted by path) of repo@commit into blob writers of
 * s and verifies each (see above). On success rec->files holds one record per
 * file, in order (headers and tensors of safetensors files, whole-file blobs
 * otherwise), and blobs the writers to publish; on failure nothing is left.
 * *bytes gets the bytes received, retries included. */
int hub_download(hub_client *h, ckpt_store *s, const char *repo, const char *commit,
                 const hub_entry *files, size_t n, bool quiet, store_partial *part,
                 store_ckpt_rec *rec, hub_blobs *blobs, uint64_t *bytes);

typedef struct {
    const char *repo;     /* ORG/NAME */
    const char *revision; /* NULL: "main" */
    const char *commit; /* NULL: resolve revision; else fetch this commit (and name it revision) */
    hub_filter filter;
    int connections;     /* 0: the default */
    uint64_t chunk_size; /* 0: the default */
    bool quiet;
} hub_fetch_opts;

typedef struct {
    store_ckpt ckpt;
    bool existed;   /* the commit was in the store: nothing downloaded */
    uint64_t bytes; /* bytes received */
    size_t files;   /* files fetched */
    double seconds;
} hub_fetch_result;

int hub_fetch(ckpt_store *s, const hub_fetch_opts *o, hub_fetch_result *out);
void hub_fetch_result_free(hub_fetch_result *r);

#endif
