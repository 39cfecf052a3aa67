/*
 * fuzz_mem.h — what the zip and pickle harnesses share: the input as a
 * zip_read_fn byte source, and REQUIRE (an invariant broken aborts, so
 * libFuzzer records the input).
 */
#ifndef CKPT_TESTS_FUZZ_FUZZ_MEM_H
#define CKPT_TESTS_FUZZ_FUZZ_MEM_H

#include "common/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) abort();                                                                      \
    } while (0)

typedef struct {
    const uint8_t *b;
    size_t n;
} mem;

static inline int mem_read(void *ctx, void *out, size_t len, uint64_t off)
{
    const mem *m = ctx;
    if (off > m->n || len > m->n - off) return ckpt_error_set(CKPT_EINVAL, "fuzz: read past the end");
    memcpy(out, m->b + off, len);
    return 0;
}

#endif
