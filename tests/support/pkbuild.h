/*
 * pkbuild.h — a byte builder and the pickle pieces the unit tests that build
 * pickles opcode by opcode share (tests/unit/format/test_torch.c,
 * test_easydel_tree.c). Include it after <cmocka.h>.
 */
#ifndef CKPT_TESTS_SUPPORT_PKBUILD_H
#define CKPT_TESTS_SUPPORT_PKBUILD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *b;
    size_t n, cap;
} buf;

static inline void put(buf *o, const void *p, size_t n)
{
    if (o->n + n > o->cap) {
        o->cap = (o->n + n) * 2 + 64;
        o->b = realloc(o->b, o->cap);
        assert_non_null(o->b);
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}
static inline void puts_(buf *o, const char *s) { put(o, s, strlen(s)); }
static inline void put8(buf *o, uint8_t v) { put(o, &v, 1); }
static inline void put16(buf *o, uint16_t v) { put8(o, v & 0xFF), put8(o, v >> 8); }
static inline void put32(buf *o, uint32_t v) { put16(o, v & 0xFFFF), put16(o, v >> 16); }
static inline void put64(buf *o, uint64_t v) { put32(o, (uint32_t)v), put32(o, (uint32_t)(v >> 32)); }

/* pickle pieces */
static inline void p_str(buf *o, const char *s) /* BINUNICODE */
{
    put8(o, 'X');
    put32(o, (uint32_t)strlen(s));
    puts_(o, s);
}
static inline void p_int(buf *o, int32_t v) /* BININT */
{
    put8(o, 'J');
    put32(o, (uint32_t)v);
}
static inline void p_glob(buf *o, const char *mod, const char *name) /* GLOBAL */
{
    put8(o, 'c');
    puts_(o, mod);
    put8(o, '\n');
    puts_(o, name);
    put8(o, '\n');
}

#endif
