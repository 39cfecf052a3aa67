/* store_hub.c — the Hub's names for stored checkpoints and files (see store_hub.h). */
#include "store/store_hub.h"

#include "common/error.h"
#include "common/util.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HUB_READ_CHUNK (1u << 20)

static void sha1_hex(const void *data, size_t len, char out[41])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_Digest(data, len, md, &n, EVP_sha1(), NULL);
    for (unsigned i = 0; i < 20 && i < n; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

void store_hub_commit(const store_ckpt *c, char out[41])
{
    if (!*c->layout) {
        snprintf(out, 41, "%.40s", c->commit);
        return;
    }
    char *key = ckpt_sprintf("%s.%s", c->commit, c->layout);
    if (key) sha1_hex(key, strlen(key), out);
    else snprintf(out, 41, "%040d", 0);
    free(key);
}

bool store_hub_is_lfs(const store_file_row *f)
{
    return f->header != NULL || f->size > STORE_HUB_INLINE_OID_MAX;
}

size_t store_hub_lfs_pointer(const store_file_row *f, char *buf, size_t len)
{
    int n = snprintf(buf, len, "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %llu\n", f->sha256,
                     (unsigned long long)f->size);
    return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

/* git's blob id: sha1("blob <size>\0" + content). */
static void git_oid(const void *data, size_t len, char out[41])
{
    char head[64];
    int hn = snprintf(head, sizeof head, "blob %zu", len) + 1;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha1(), NULL);
    EVP_DigestUpdate(ctx, head, (size_t)hn);
    EVP_DigestUpdate(ctx, data, len);
    EVP_DigestFinal_ex(ctx, md, &n);
    EVP_MD_CTX_free(ctx);
    for (unsigned i = 0; i < 20 && i < n; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* git oids of non-LFS files by content sha256: a file's bytes never change
 * under its sha256, so each blob is hashed once per daemon, not on every
 * tree, paths-info and resolve call. Direct-mapped on the sha256's first
 * hex digits; a collision just hashes again. */
#define OID_CACHE_SLOTS 4096
static struct {
    char sha256[65];
    char oid[41];
} oid_cache[OID_CACHE_SLOTS];
static pthread_mutex_t oid_cache_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t oid_slot(const char *sha256)
{
    char head[5];
    snprintf(head, sizeof head, "%.4s", sha256);
    return (size_t)strtoul(head, NULL, 16) % OID_CACHE_SLOTS;
}

static bool oid_cached(const char *sha256, char out[41])
{
    size_t i = oid_slot(sha256);
    pthread_mutex_lock(&oid_cache_mu);
    bool hit = !strcmp(oid_cache[i].sha256, sha256);
    if (hit) memcpy(out, oid_cache[i].oid, 41);
    pthread_mutex_unlock(&oid_cache_mu);
    return hit;
}

static void oid_remember(const char *sha256, const char oid[41])
{
    size_t i = oid_slot(sha256);
    pthread_mutex_lock(&oid_cache_mu);
    snprintf(oid_cache[i].sha256, sizeof oid_cache[i].sha256, "%s", sha256);
    memcpy(oid_cache[i].oid, oid, 41);
    pthread_mutex_unlock(&oid_cache_mu);
}

/* git's blob id of a stored blob, read in pieces (no lock held). */
static int blob_git_oid(const char *path, uint64_t size, char out[41])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ckpt_error_sys("%s: open", path);
    char head[64];
    int hn = snprintf(head, sizeof head, "blob %llu", (unsigned long long)size) + 1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    char *buf = ckpt_malloc(HUB_READ_CHUNK);
    int rc = ctx && buf ? 0 : CKPT_ENOMEM;
    if (!rc) {
        EVP_DigestInit_ex(ctx, EVP_sha1(), NULL);
        EVP_DigestUpdate(ctx, head, (size_t)hn);
    }
    uint64_t left = size;
    while (!rc && left) {
        ssize_t n = read(fd, buf, left < HUB_READ_CHUNK ? (size_t)left : HUB_READ_CHUNK);
        if (n < 0) rc = ckpt_error_sys("%s: read", path);
        else if (n == 0) rc = ckpt_error_set(CKPT_ECORRUPT, "%s: shorter than its catalog size", path);
        else {
            EVP_DigestUpdate(ctx, buf, (size_t)n);
            left -= (uint64_t)n;
        }
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdn = 0;
    if (ctx) EVP_DigestFinal_ex(ctx, md, &mdn);
    if (!rc)
        for (unsigned i = 0; i < 20 && i < mdn; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return rc;
}

/* A blob that cannot be read is an error (the store is damaged), never the
 * oid of some other content. */
int store_hub_file_oid(ckpt_store *s, const store_file_row *f, char out[41])
{
    char ptr[256];
    if (store_hub_is_lfs(f) || !f->blob) {
        git_oid(ptr, store_hub_lfs_pointer(f, ptr, sizeof ptr), out);
        return 0;
    }
    if (oid_cached(f->sha256, out)) return 0;
    char *path = store_blob_read_path(s, f->blob);
    int rc = path ? blob_git_oid(path, f->size, out) : CKPT_ENOMEM;
    if (!rc) oid_remember(f->sha256, out);
    else rc = ckpt_error_prefix(rc, "git oid of '%s'", f->path);
    free(path);
    return rc;
}

int store_hub_etag(ckpt_store *s, const store_file_row *f, char out[65])
{
    if (store_hub_is_lfs(f)) {
        snprintf(out, 65, "%s", f->sha256);
        return 0;
    }
    return store_hub_file_oid(s, f, out);
}
