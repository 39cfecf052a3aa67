/* sha256.c — libcrypto EVP wrapper; file hashing reads in 4 MiB blocks. */
#include "common/sha256.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int ckpt_sha256_init(ckpt_sha256 *h)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c || EVP_DigestInit_ex(c, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(c);
        h->ctx = NULL;
        return ckpt_error_set(CKPT_ENOMEM, "sha256: cannot initialise libcrypto digest");
    }
    h->ctx = c;
    return 0;
}

int ckpt_sha256_update(ckpt_sha256 *h, const void *buf, size_t len)
{
    if (EVP_DigestUpdate(h->ctx, buf, len) != 1) return ckpt_error_set(CKPT_EINTERNAL, "sha256: the digest library failed (update)");
    return 0;
}

int ckpt_sha256_final_hex(ckpt_sha256 *h, char hex[65])
{
    unsigned char md[32];
    unsigned int n = 0;
    int ok = EVP_DigestFinal_ex(h->ctx, md, &n) == 1 && n == 32;
    ckpt_sha256_free(h);
    if (!ok) return ckpt_error_set(CKPT_EINTERNAL, "sha256: the digest library failed (final)");
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

void ckpt_sha256_free(ckpt_sha256 *h)
{
    EVP_MD_CTX_free(h->ctx);
    h->ctx = NULL;
}

int ckpt_sha256_buf_hex(const void *buf, size_t len, char hex[65])
{
    ckpt_sha256 h;
    int rc = ckpt_sha256_init(&h);
    if (!rc) rc = ckpt_sha256_update(&h, buf, len);
    if (rc) {
        ckpt_sha256_free(&h);
        return rc;
    }
    return ckpt_sha256_final_hex(&h, hex);
}

int ckpt_sha256_fd_range_hex(int fd, uint64_t off, uint64_t len, char hex[65], const char *what)
{
    /* At most 4 MiB, and no more than the range: most files hashed are small,
     * and a big buffer costs its page faults on every call. */
    size_t bufsz = len < (4u << 20) ? (size_t)(len ? len : 1) : 4u << 20;
    char *buf = ckpt_malloc(bufsz);
    if (!buf) return CKPT_ENOMEM;
    ckpt_sha256 h;
    int rc = ckpt_sha256_init(&h);
    while (!rc && len) {
        size_t n = len > bufsz ? bufsz : (size_t)len;
        rc = ckpt_pread_full(fd, buf, n, off, what);
        if (!rc) rc = ckpt_sha256_update(&h, buf, n);
        off += n;
        len -= n;
    }
    free(buf);
    if (rc) {
        ckpt_sha256_free(&h);
        return rc;
    }
    return ckpt_sha256_final_hex(&h, hex);
}

int ckpt_sha256_file_hex(const char *path, char hex[65])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ckpt_error_sys("%s: open", path);
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? ckpt_error_sys("%s: stat", path) : 0;
    if (!rc) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        rc = ckpt_sha256_fd_range_hex(fd, 0, (uint64_t)st.st_size, hex, path);
    }
    close(fd);
    return rc;
}
