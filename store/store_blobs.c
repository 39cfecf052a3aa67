/*
 * store_blobs.c — where the store's blobs live: CKPT_HOME/blobs (the
 * default) or a bucket of an S3-compatible object store (CKPT_BLOBS =
 * s3://BUCKET/PREFIX, store/s3.h). The catalog, the leases and the staging
 * folder tmp/ stay in CKPT_HOME either way.
 *
 * In a bucket, blob SHA is the object PREFIX/ab/cdef... (the local layout's
 * names). It is uploaded once (If-None-Match: *; a 412 means the same bytes
 * are there) from its temp file after the temp is durable and leased, and the
 * catalog commits only after every upload was acknowledged. Readers that
 * need a file (the executor, whole-file copies) get a local copy in
 * CKPT_HOME/blob-cache/ab/cdef..., downloaded in ranges and checked against
 * its name before it is renamed into place.
 */
#include "store/store.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/sha256.h"
#include "common/util.h"
#include "store/s3.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bytes of one ranged GET when a blob is copied or hashed. */
#define BLOB_GET_CHUNK (64ull << 20)

int64_t store_self_start_time(void)
{
    static int64_t cached = -1;
    if (cached < 0) cached = ckpt_proc_start_time((int)getpid());
    return cached;
}

char *store_tmp_base(const ckpt_store *s, const char *kind)
{
    return ckpt_sprintf("%s/%s-%d-%lld", s->tmp_dir, kind, (int)getpid(), (long long)store_self_start_time());
}

char *store_blob_path(const ckpt_store *s, const char *sha)
{
    return ckpt_sprintf("%s/%.2s/%s", s->blob_dir, sha, sha + 2);
}

int store_blobs_config(ckpt_store *s)
{
    const char *url = getenv("CKPT_BLOBS");
    if (!url || !*url) return 0;
    if (strncmp(url, "s3://", 5))
        return ckpt_error_set(CKPT_EINVAL, "CKPT_BLOBS / --blobs '%s': expected s3://BUCKET/PREFIX (unset: the store's blobs/ folder)", url);
    int rc = s3_url_parse(url, &s->s3_bucket, &s->s3_prefix);
    if (!rc && !(s->cache_dir = ckpt_path_join(s->home, "blob-cache"))) rc = CKPT_ENOMEM;
    if (!rc) rc = ckpt_mkdir_p(s->cache_dir, 0755);
    return rc;
}

bool store_blobs_remote(const ckpt_store *s) { return s->s3_bucket != NULL; }

/* A temp name for a download of blob sha, unique in this process too (the
 * daemon's HTTP threads may fetch the same blob at once). malloc'd. */
static char *download_tmp(const ckpt_store *s, const char *kind, const char *sha)
{
    static atomic_uint seq;
    char *base = store_tmp_base(s, kind);
    char *tmp = base ? ckpt_sprintf("%s-%.16s-%u", base, sha, atomic_fetch_add(&seq, 1)) : NULL;
    free(base);
    return tmp;
}

/* The client, opened on first use (a command that never touches a blob
 * never loads libcurl). */
static int client(ckpt_store *s, s3_client **c)
{
    if (!s->s3) {
        int rc = s3_open(s->s3_bucket, (s3_client **)&s->s3);
        if (rc) return rc;
    }
    *c = s->s3;
    return 0;
}

void store_blobs_close(ckpt_store *s)
{
    s3_close(s->s3);
    s->s3 = NULL;
    free(s->s3_bucket), free(s->s3_prefix), free(s->cache_dir);
    s->s3_bucket = s->s3_prefix = s->cache_dir = NULL;
}

char *store_blob_key(const ckpt_store *s, const char *sha)
{
    return ckpt_sprintf("%s%s%.2s/%s", s->s3_prefix, *s->s3_prefix ? "/" : "", sha, sha + 2);
}

int store_blob_stat(ckpt_store *s, const char *sha, bool *exists, uint64_t *size)
{
    *exists = false;
    if (!store_blobs_remote(s)) {
        char *path = store_blob_path(s, sha);
        struct stat st;
        if (!path) return CKPT_ENOMEM;
        if (stat(path, &st) == 0) {
            *exists = true;
            if (size) *size = (uint64_t)st.st_size;
        }
        free(path);
        return 0;
    }
    s3_client *c;
    char *key = store_blob_key(s, sha);
    int rc = key ? client(s, &c) : CKPT_ENOMEM;
    if (!rc) rc = s3_head(c, key, exists, size);
    free(key);
    return rc;
}

int store_blob_upload(ckpt_store *s, const char *sha, const char *tmp_path, uint64_t size)
{
    s3_client *c;
    char *key = store_blob_key(s, sha);
    int rc = key ? client(s, &c) : CKPT_ENOMEM;
    int fd = rc ? -1 : open(tmp_path, O_RDONLY | O_CLOEXEC);
    if (!rc && fd < 0) rc = ckpt_error_sys("%s: open", tmp_path);
    if (!rc) rc = s3_put_fd(c, key, fd, 0, size, sha, NULL);
    if (fd >= 0) close(fd);
    free(key);
    return rc;
}

int store_blob_copy_to_fd(ckpt_store *s, const char *sha, uint64_t size, int fd)
{
    s3_client *c;
    char *key = store_blob_key(s, sha);
    int rc = key ? client(s, &c) : CKPT_ENOMEM;
    for (uint64_t off = 0; !rc && off < size; off += BLOB_GET_CHUNK)
        rc = s3_get_fd(c, key, off, size - off < BLOB_GET_CHUNK ? size - off : BLOB_GET_CHUNK, fd, off);
    free(key);
    return rc;
}

char *store_blob_read_path(ckpt_store *s, const char *sha)
{
    if (!store_blobs_remote(s)) return store_blob_path(s, sha);
    char *dst = ckpt_sprintf("%s/%.2s/%s", s->cache_dir, sha, sha + 2);
    if (!dst) return NULL;
    if (access(dst, R_OK) == 0) return dst;
    bool exists = false;
    uint64_t size = 0;
    char *dir = ckpt_sprintf("%s/%.2s", s->cache_dir, sha), *tmp = download_tmp(s, "blobget", sha), hex[65];
    int rc = dir && tmp ? ckpt_mkdir_p(dir, 0755) : CKPT_ENOMEM;
    if (!rc) rc = store_blob_stat(s, sha, &exists, &size);
    if (!rc && !exists)
        rc = ckpt_error_set(CKPT_ECORRUPT, "blob %s is missing from %s (run ckpt verify)", sha, s->s3_bucket);
    int fd = rc ? -1 : open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (!rc && fd < 0) rc = ckpt_error_sys("%s: create", tmp);
    if (!rc) rc = store_blob_copy_to_fd(s, sha, size, fd);
    if (!rc) rc = ckpt_sha256_fd_range_hex(fd, 0, size, hex, tmp);
    if (!rc && strcmp(hex, sha))
        rc = ckpt_error_set(CKPT_ECORRUPT, "blob %s in s3://%s: its bytes hash to %.16s...", sha, s->s3_bucket, hex);
    if (fd >= 0) close(fd);
    if (!rc && rename(tmp, dst) < 0) rc = ckpt_error_sys("%s: rename", dst);
    if (rc && tmp) unlink(tmp);
    free(dir), free(tmp);
    if (rc) {
        free(dst);
        return NULL;
    }
    return dst;
}

int store_blob_hash(ckpt_store *s, const char *sha, bool *exists, char hex[65])
{
    uint64_t size = 0;
    int rc = store_blob_stat(s, sha, exists, &size);
    if (rc || !*exists) return rc;
    if (!store_blobs_remote(s)) {
        char *path = store_blob_path(s, sha);
        rc = path ? ckpt_sha256_file_hex(path, hex) : CKPT_ENOMEM;
        free(path);
        return rc;
    }
    /* streamed through a temp file in tmp/, never whole in memory */
    char *tmp = download_tmp(s, "blobhash", sha);
    int fd = tmp ? open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    if (!tmp) rc = CKPT_ENOMEM;
    else if (fd < 0) rc = ckpt_error_sys("%s: create", tmp);
    if (fd >= 0) unlink(tmp);
    if (!rc) rc = store_blob_copy_to_fd(s, sha, size, fd);
    if (!rc) rc = ckpt_sha256_fd_range_hex(fd, 0, size, hex, sha);
    if (fd >= 0) close(fd);
    free(tmp);
    return rc;
}

typedef struct {
    const ckpt_store *s;
    size_t skip;
    store_blob_list_cb cb;
    void *ud;
} list_ctx;

static int list_one(void *ud, const char *key, uint64_t size, int64_t mtime)
{
    list_ctx *l = ud;
    const char *rest = key + l->skip; /* "ab/cdef..." */
    if (strlen(key) < l->skip || strlen(rest) != 65 || rest[2] != '/') return 0; /* not a blob of ours */
    char sha[65];
    snprintf(sha, sizeof sha, "%.2s%.62s", rest, rest + 3);
    for (int i = 0; i < 64; i++)
        if (!((sha[i] >= '0' && sha[i] <= '9') || (sha[i] >= 'a' && sha[i] <= 'f'))) return 0;
    return l->cb(l->ud, sha, size, mtime);
}

int store_blob_list(ckpt_store *s, store_blob_list_cb cb, void *ud)
{
    s3_client *c;
    char *prefix = ckpt_sprintf("%s%s", s->s3_prefix, *s->s3_prefix ? "/" : "");
    int rc = prefix ? client(s, &c) : CKPT_ENOMEM;
    list_ctx l = {.s = s, .skip = prefix ? strlen(prefix) : 0, .cb = cb, .ud = ud};
    if (!rc) rc = s3_list(c, prefix, 0, list_one, &l);
    free(prefix);
    return rc;
}

int store_blob_delete(ckpt_store *s, const char *sha)
{
    s3_client *c;
    char *key = store_blob_key(s, sha);
    int rc = key ? client(s, &c) : CKPT_ENOMEM;
    if (!rc) rc = s3_delete(c, key);
    free(key);
    if (!rc && s->cache_dir) {
        char *cached = ckpt_sprintf("%s/%.2s/%s", s->cache_dir, sha, sha + 2);
        if (cached) unlink(cached);
        free(cached);
    }
    return rc;
}
