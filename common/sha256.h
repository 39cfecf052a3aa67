/*
 * sha256.h — SHA-256 through OpenSSL's libcrypto (uses SHA-NI when the CPU has it).
 *
 *   ckpt_sha256 h; ckpt_sha256_init(&h); ckpt_sha256_update(&h, buf, n); ...
 *   char hex[65]; ckpt_sha256_final_hex(&h, hex);
 */
#ifndef CKPT_COMMON_SHA256_H
#define CKPT_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    void *ctx; /* EVP_MD_CTX */
} ckpt_sha256;

int ckpt_sha256_init(ckpt_sha256 *h);
int ckpt_sha256_update(ckpt_sha256 *h, const void *buf, size_t len);
/* Writes 64 lowercase hex digits and a NUL; frees the context. */
int ckpt_sha256_final_hex(ckpt_sha256 *h, char hex[65]);
void ckpt_sha256_free(ckpt_sha256 *h);
/* One-shot helpers. */
int ckpt_sha256_buf_hex(const void *buf, size_t len, char hex[65]);
/* Hashes bytes [off, off+len) of fd. */
int ckpt_sha256_fd_range_hex(int fd, uint64_t off, uint64_t len, char hex[65], const char *what);
int ckpt_sha256_file_hex(const char *path, char hex[65]);

#endif
