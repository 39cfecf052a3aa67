/*
 * test_http.c — pieces of the daemon's HTTP layer that need no server
 * (service/http/http_util.c): API token digests and their compare.
 *
 * Tokens are compared as sha256 digests of a fixed size with CRYPTO_memcmp,
 * so a compare never depends on the given token's length or on how long a
 * prefix matches; these tests pin the outcomes (equal, prefix, longer,
 * shorter, empty, one byte off at either end).
 *
 * Also the request pieces every route shares: Range headers and paths split
 * into %-decoded segments.
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

/* Range headers are parsed whole and checked: junk, signs and numbers past
 * 2^64 are no range (the whole file), never a wrapped value. */
static void test_parse_range(void **state)
{
    (void)state;
    uint64_t a = 0, b = 0;
    assert_int_equal(http_parse_range("bytes=0-0", 10, &a, &b), 1);
    assert_true(a == 0 && b == 0);
    assert_int_equal(http_parse_range("bytes=5-", 10, &a, &b), 1);
    assert_true(a == 5 && b == 9);
    assert_int_equal(http_parse_range("bytes=-3", 10, &a, &b), 1);
    assert_true(a == 7 && b == 9);
    assert_int_equal(http_parse_range("bytes=2-100", 10, &a, &b), 1);
    assert_true(a == 2 && b == 9);
    assert_int_equal(http_parse_range("bytes=10-", 10, &a, &b), -1);
    assert_int_equal(http_parse_range("bytes=-0", 10, &a, &b), -1);
    static const char *none[] = {NULL, "", "bytes=", "bytes=x-1", "bytes=1-x", "bytes=+1-2", "bytes=1--2",
                                 "bytes=3-2", "bytes=0-1,3-4", "items=0-1", "bytes=-",
                                 "bytes=99999999999999999999-", "bytes=0-99999999999999999999",
                                 "bytes=-99999999999999999999"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) assert_int_equal(http_parse_range(none[i], 10, &a, &b), 0);
}

/* Paths split on '/' before decoding: "%2F" stays inside a segment; a bad
 * escape or "%00" is refused. */
static void test_split_path(void **state)
{
    (void)state;
    http_segments sg;
    assert_true(http_split_path("/v1/checkpoints/acme%2Fllama@main/files/a%20b.json?x=1", &sg));
    assert_int_equal(sg.n, 5);
    assert_string_equal(sg.seg[2], "acme/llama@main");
    assert_string_equal(sg.seg[4], "a b.json");
    char *j = http_join_from(&sg, 3);
    assert_string_equal(j, "files/a b.json");
    free(j);
    free(sg.buf);
    assert_false(http_split_path("/a/%2", &sg));
    free(sg.buf);
    assert_false(http_split_path("/a/%00b", &sg));
    free(sg.buf);
    assert_false(http_split_path("/a/%zz", &sg));
    free(sg.buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_equal),
        cmocka_unit_test(test_token_digest_fixed),
        cmocka_unit_test(test_parse_range),
        cmocka_unit_test(test_split_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
