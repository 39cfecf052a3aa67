/*
 * test_http.c — pieces of the daemon's HTTP layer that need no server
 * (service/http/http_util.c): API token digests and their compare.
 *
 * Tokens are compared as sha256 digests of a fixed size with CRYPTO_memcmp,
 * so a compare never depends on the given token's length or on how long a
 * prefix matches; these tests pin the outcomes (equal, prefix, longer,
 * shorter, empty, one byte off at either end).
 *
 * Linked against libckpt-svc.a (the service objects), like every unit test.
 */
#include "service/http/http_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static bool same(const char *a, const char *b)
{
    unsigned char da[HTTP_TOKEN_DIGEST], db[HTTP_TOKEN_DIGEST];
    http_token_digest(a, strlen(a), da);
    http_token_digest(b, strlen(b), db);
    return http_token_equal(da, db);
}

static void test_token_equal(void **state)
{
    (void)state;
    const char *t = "admintoken-0123456789abcdef";
    assert_true(same(t, t));
    assert_false(same(t, "admintoken-0123456789abcde"));   /* a prefix */
    assert_false(same(t, "admintoken-0123456789abcdefX")); /* longer */
    assert_false(same(t, ""));
    assert_false(same(t, "bdmintoken-0123456789abcdef")); /* first byte */
    assert_false(same(t, "admintoken-0123456789abcdeg")); /* last byte */
}

static void test_token_digest_fixed(void **state)
{
    (void)state;
    /* The digest is sha256: known answer for "abc". */
    unsigned char d[HTTP_TOKEN_DIGEST];
    http_token_digest("abc", 3, d);
    static const unsigned char want[HTTP_TOKEN_DIGEST] = {
        0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
        0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    assert_memory_equal(d, want, sizeof want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_equal),
        cmocka_unit_test(test_token_digest_fixed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
