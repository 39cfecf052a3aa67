/*
 * test_dtype.c — the dtype table and the float conversions of format/dtype.c.
 *
 * Conversions are checked three ways: hand-picked special values (zeros,
 * infinities, NaNs with payloads, extremes, ties and their neighbours,
 * subnormals), exhaustive round trips over every 16-bit pattern, and random
 * bit patterns compared with references that share no code with dtype.c
 * (rounding through libm's nearbyint in double, the compiler's own float and
 * _Float16 conversions where the compiler has them).
 */
#include "format/dtype.h"

#include "common/error.h"
#include "common/util.h"

#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ---- helpers ---- */

static uint32_t bits_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t bits_f64(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double f64_of(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* splitmix64: a fixed seed keeps failures reproducible. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* An IEEE binary format: exponent and fraction widths. */
typedef struct {
    const char *name;
    int ebits, mbits;
} fmt;

static const fmt FMT_BF16 = {"BF16", 8, 7};
static const fmt FMT_F16 = {"F16", 5, 10};
static const fmt FMT_F32 = {"F32", 8, 23};

static int fmt_bias(fmt f)
{
    return (1 << (f.ebits - 1)) - 1;
}

static double fmt_max(fmt f)
{
    return ldexp(2.0 - ldexp(1.0, -f.mbits), fmt_bias(f));
}

/* The value of a bit pattern, decoded with ldexp (independent of dtype.c). */
static double ref_decode(uint64_t bits, fmt f)
{
    uint64_t frac = bits & ((1ull << f.mbits) - 1);
    uint64_t e = (bits >> f.mbits) & ((1ull << f.ebits) - 1);
    int neg = (int)((bits >> (f.ebits + f.mbits)) & 1);
    double v;
    if (e == (1ull << f.ebits) - 1)
        v = frac ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)frac, 1 - fmt_bias(f) - f.mbits);
    else
        v = ldexp((double)(frac + (1ull << f.mbits)), (int)e - fmt_bias(f) - f.mbits);
    return neg ? -v : v;
}

/* x rounded to format f (nearest, ties to even, overflow to infinity), as a
 * double, by scaling to an integer and calling nearbyint (libm, default mode). */
static double ref_round(double x, fmt f)
{
    if (isnan(x) || isinf(x) || x == 0) return x;
    double ax = fabs(x);
    int e;
    frexp(ax, &e); /* ax = m * 2^e, m in [0.5, 1) */
    int E = e - 1;
    int emin = 1 - fmt_bias(f);
    if (E < emin) E = emin;
    double q = ldexp(1.0, E - f.mbits); /* one unit in the last place at that exponent */
    double r = nearbyint(ax / q) * q;
    if (r > fmt_max(f)) r = INFINITY;
    return x < 0 ? -r : r;
}

/* Compares a converted bit pattern with the reference value of x; zeros must
 * agree in sign too. */
static void check_rounded(uint64_t got, fmt f, double x, const char *what)
{
    double want = ref_round(x, f);
    double have = ref_decode(got, f);
    if (have != want || signbit(have) != signbit(want)) {
        fail_msg("%s: %s of %a (bits 0x%016llx) gave 0x%llx = %a, want %a", what, f.name, x,
                 (unsigned long long)bits_f64(x), (unsigned long long)got, have, want);
    }
}

/* A converted NaN: still NaN, same sign, quiet, and the top payload bits that
 * fit (from_mbits fraction bits of the source, to_mbits of the target). */
static void check_nan(uint64_t src_frac, int src_sign, int from_mbits, uint64_t got, fmt to)
{
    uint64_t frac = got & ((1ull << to.mbits) - 1);
    uint64_t e = (got >> to.mbits) & ((1ull << to.ebits) - 1);
    int sign = (int)((got >> (to.ebits + to.mbits)) & 1);
    assert_int_equal(e, (1ull << to.ebits) - 1);
    assert_true(frac != 0);
    assert_true(frac & (1ull << (to.mbits - 1))); /* quiet */
    assert_int_equal(sign, src_sign);
    /* Payload bits below the quiet bit, aligned to the narrower of the two. */
    int keep = (from_mbits < to.mbits ? from_mbits : to.mbits) - 1;
    uint64_t want = (src_frac >> (from_mbits - 1 - keep)) & ((1ull << keep) - 1);
    uint64_t have = (frac >> (to.mbits - 1 - keep)) & ((1ull << keep) - 1);
    assert_int_equal(have, want);
}

/* ---- the table ---- */

static const struct {
    const char *name;
    ckpt_dtype dt;
    unsigned bits;
} expected_dtypes[] = {
    /* In the reference Dtype enum's order (safetensors/src/tensor.rs). */
    {"BOOL", CKPT_DT_BOOL, 8},
    {"F4", CKPT_DT_F4, 4},
    {"F6_E2M3", CKPT_DT_F6_E2M3, 6},
    {"F6_E3M2", CKPT_DT_F6_E3M2, 6},
    {"U8", CKPT_DT_U8, 8},
    {"I8", CKPT_DT_I8, 8},
    {"F8_E5M2", CKPT_DT_F8_E5M2, 8},
    {"F8_E4M3", CKPT_DT_F8_E4M3, 8},
    {"F8_E8M0", CKPT_DT_F8_E8M0, 8},
    {"F8_E4M3FNUZ", CKPT_DT_F8_E4M3FNUZ, 8},
    {"F8_E5M2FNUZ", CKPT_DT_F8_E5M2FNUZ, 8},
    {"I16", CKPT_DT_I16, 16},
    {"U16", CKPT_DT_U16, 16},
    {"F16", CKPT_DT_F16, 16},
    {"BF16", CKPT_DT_BF16, 16},
    {"I32", CKPT_DT_I32, 32},
    {"U32", CKPT_DT_U32, 32},
    {"F32", CKPT_DT_F32, 32},
    {"C64", CKPT_DT_C64, 64},
    {"F64", CKPT_DT_F64, 64},
    {"I64", CKPT_DT_I64, 64},
    {"U64", CKPT_DT_U64, 64},
};

static void test_names_and_sizes(void **state)
{
    (void)state;
    assert_int_equal(CKPT_ARRAY_LEN(expected_dtypes), CKPT_DT_COUNT);
    for (size_t i = 0; i < CKPT_ARRAY_LEN(expected_dtypes); i++) {
        ckpt_dtype dt = expected_dtypes[i].dt;
        assert_int_equal(dt, (ckpt_dtype)i); /* enum order is the reference order */
        assert_string_equal(ckpt_dtype_name(dt), expected_dtypes[i].name);
        ckpt_dtype back = CKPT_DT_COUNT;
        assert_int_equal(ckpt_dtype_from_name(expected_dtypes[i].name, &back), 0);
        assert_int_equal(back, dt);
        assert_int_equal(ckpt_dtype_bits(dt), expected_dtypes[i].bits);
        unsigned bits = expected_dtypes[i].bits;
        assert_int_equal(ckpt_dtype_size(dt), bits % 8 ? 0 : bits / 8);
    }
    assert_int_equal(ckpt_dtype_size(CKPT_DT_F4), 0);
    assert_int_equal(ckpt_dtype_size(CKPT_DT_F6_E3M2), 0);
    assert_int_equal(ckpt_dtype_size(CKPT_DT_BOOL), 1);
    assert_int_equal(ckpt_dtype_size(CKPT_DT_C64), 8);
    assert_int_equal(ckpt_dtype_bits(CKPT_DT_COUNT), 0);
    assert_string_equal(ckpt_dtype_name(CKPT_DT_COUNT), "INVALID");
}

static void test_name_aliases_and_unknown(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        ckpt_dtype dt;
    } aliases[] = {
        {"bf16", CKPT_DT_BF16}, {"f16", CKPT_DT_F16}, {"f32", CKPT_DT_F32}, {"f64", CKPT_DT_F64}};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(aliases); i++) {
        ckpt_dtype dt = CKPT_DT_COUNT;
        assert_int_equal(ckpt_dtype_from_name(aliases[i].s, &dt), 0);
        assert_int_equal(dt, aliases[i].dt);
    }
    static const char *bad[] = {"",    "f8", "FP32", "F32 ",    " F32",   "Bf16",      "bool",
                                "i32", "u8", "F128", "float32", "BF16\n", "F8_E4M3FN", "C128"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(bad); i++) {
        ckpt_dtype dt = CKPT_DT_U64;
        assert_int_equal(ckpt_dtype_from_name(bad[i], &dt), CKPT_EINVAL);
        assert_int_equal(dt, CKPT_DT_U64); /* untouched on failure */
        assert_non_null(strstr(ckpt_error_last(), "unknown dtype"));
    }
    ckpt_dtype dt;
    assert_int_equal(ckpt_dtype_from_name(NULL, &dt), CKPT_EINVAL);
    /* A long hostile name is cut in the message. */
    char longname[1000];
    memset(longname, 'A', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(ckpt_dtype_from_name(longname, &dt), CKPT_EINVAL);
    assert_true(strlen(ckpt_error_last()) < 200);
}

static void test_castable(void **state)
{
    (void)state;
    for (int i = 0; i < CKPT_DT_COUNT; i++) {
        bool want = i == CKPT_DT_F16 || i == CKPT_DT_BF16 || i == CKPT_DT_F32 || i == CKPT_DT_F64;
        assert_int_equal(ckpt_dtype_is_castable_float((ckpt_dtype)i), want);
    }
}

static void test_numel_and_nbytes(void **state)
{
    (void)state;
    uint64_t n = 0;
    assert_true(ckpt_shape_numel(0, NULL, &n));
    assert_int_equal(n, 1); /* a scalar */
    uint64_t s234[] = {2, 3, 4};
    assert_true(ckpt_shape_numel(3, s234, &n));
    assert_int_equal(n, 24);
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_F32, 3, s234, &n), 0);
    assert_int_equal(n, 96);
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_BF16, 0, NULL, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_C64, 3, s234, &n), 0);
    assert_int_equal(n, 192);
    uint64_t s0[] = {4, 0, 7};
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_F64, 3, s0, &n), 0);
    assert_int_equal(n, 0);

    /* Sub-byte dtypes: whole bytes only. */
    uint64_t s2[] = {1, 2}, s3[] = {1, 3}, s4[] = {4}, s1[] = {1};
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_F4, 2, s2, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_F6_E2M3, 1, s4, &n), 0);
    assert_int_equal(n, 3);
    n = 77;
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_F4, 2, s3, &n), CKPT_EINVAL);
    assert_non_null(strstr(ckpt_error_last(), "MisalignedSlice"));
    assert_int_equal(n, 77);
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_F6_E3M2, 1, s1, &n), CKPT_EINVAL);
    assert_non_null(strstr(ckpt_error_last(), "MisalignedSlice"));
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_F4, 0, NULL, &n), CKPT_EINVAL); /* 4-bit scalar */
    assert_non_null(strstr(ckpt_error_last(), "MisalignedSlice"));

    /* Overflow of the element count. */
    uint64_t big2[] = {1ull << 32, 1ull << 32};
    assert_false(ckpt_shape_numel(2, big2, &n));
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_U8, 2, big2, &n), CKPT_ELIMIT);
    assert_non_null(strstr(ckpt_error_last(), "ValidationOverflow"));
    /* Count fits, count x bits does not. */
    uint64_t big1[] = {1ull << 61};
    assert_true(ckpt_shape_numel(1, big1, &n));
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_F64, 1, big1, &n), CKPT_ELIMIT);
    assert_non_null(strstr(ckpt_error_last(), "ValidationOverflow"));
    uint64_t edge[] = {1ull << 60};
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_U8, 1, edge, &n), 0);
    assert_int_equal(n, 1ull << 60);
    uint64_t max1[] = {UINT64_MAX};
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_BOOL, 1, max1, &n), CKPT_ELIMIT);
    /* Multiplied in order, as the reference does: a zero after an overflow
     * does not rescue the shape, a zero before it does. */
    uint64_t late0[] = {1ull << 63, 4, 0}, early0[] = {0, 1ull << 63, 4};
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_U8, 3, late0, &n), CKPT_ELIMIT);
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_U8, 3, early0, &n), 0);
    assert_int_equal(n, 0);

    /* Rank beyond the limit, and a bad dtype. */
    uint64_t many[CKPT_MAX_RANK + 1];
    for (size_t i = 0; i < CKPT_ARRAY_LEN(many); i++)
        many[i] = 1;
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_U8, CKPT_MAX_RANK, many, &n), 0);
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_U8, CKPT_MAX_RANK + 1, many, &n), CKPT_ELIMIT);
    assert_int_equal(ckpt_dtype_nbytes(CKPT_DT_COUNT, 1, s1, &n), CKPT_EINVAL);
}

/* ---- special values ---- */

typedef struct {
    uint64_t in, out;
} bits_case;

/* Checks a table of in -> out and the same with the sign bit flipped. */
#define CHECK_TABLE(table, conv, in_sign, out_sign)                                                \
    do {                                                                                           \
        for (size_t i_ = 0; i_ < CKPT_ARRAY_LEN(table); i_++) {                                    \
            for (int neg_ = 0; neg_ < 2; neg_++) {                                                 \
                uint64_t in_ = (table)[i_].in ^ (neg_ ? (in_sign) : 0);                            \
                uint64_t want_ = (table)[i_].out ^ (neg_ ? (out_sign) : 0);                        \
                uint64_t got_ = (conv)(in_);                                                       \
                if (got_ != want_)                                                                 \
                    fail_msg("%s: 0x%llx -> 0x%llx, want 0x%llx", #conv, (unsigned long long)in_,  \
                             (unsigned long long)got_, (unsigned long long)want_);                 \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static uint64_t via_f32_to_bf16(uint64_t u)
{
    return ckpt_f32_to_bf16(f32_of((uint32_t)u));
}
static uint64_t via_bf16_to_f32(uint64_t u)
{
    return bits_f32(ckpt_bf16_to_f32((uint16_t)u));
}
static uint64_t via_f32_to_f16(uint64_t u)
{
    return ckpt_f32_to_f16(f32_of((uint32_t)u));
}
static uint64_t via_f16_to_f32(uint64_t u)
{
    return bits_f32(ckpt_f16_to_f32((uint16_t)u));
}
static uint64_t via_f64_to_f32(uint64_t u)
{
    return bits_f32(ckpt_f64_to_f32(f64_of(u)));
}
static uint64_t via_f64_to_bf16(uint64_t u)
{
    return ckpt_f64_to_bf16(f64_of(u));
}
static uint64_t via_f64_to_f16(uint64_t u)
{
    return ckpt_f64_to_f16(f64_of(u));
}

static void test_f32_to_bf16_specials(void **state)
{
    (void)state;
    /* clang-format off */
    static const bits_case cases[] = {
        {0x00000000, 0x0000}, /* zero */
        {0x7f800000, 0x7f80}, /* infinity */
        {0x7fc00000, 0x7fc0}, /* quiet NaN */
        {0x7fd23456, 0x7fd2}, /* quiet NaN with payload: top bits kept */
        {0x7f800001, 0x7fc0}, /* signalling NaN, payload only in dropped bits: not infinity */
        {0x7f80ffff, 0x7fc0},
        {0x7fa00000, 0x7fe0}, /* signalling NaN: quietened, payload kept */
        {0x7f810000, 0x7fc1},
        {0x7fffffff, 0x7fff},
        {0x7f7fffff, 0x7f80}, /* largest finite F32 overflows */
        {0x7f7f0000, 0x7f7f}, /* largest finite BF16 */
        {0x7f7f7fff, 0x7f7f}, /* just below the tie with infinity */
        {0x7f7f8000, 0x7f80}, /* tie between 0x7f7f (odd) and infinity: even wins */
        {0x3f800000, 0x3f80}, /* 1.0 */
        {0x3f808000, 0x3f80}, /* tie, lower neighbour even */
        {0x3f818000, 0x3f82}, /* tie, lower neighbour odd */
        {0x3f808001, 0x3f81}, /* just above a tie */
        {0x3f807fff, 0x3f80}, /* just below a tie */
        {0x3f817fff, 0x3f81},
        {0x3f818001, 0x3f82},
        {0x3fffffff, 0x4000}, /* carry into the exponent */
        {0x00800000, 0x0080}, /* smallest normal */
        {0x007fffff, 0x0080}, /* largest F32 subnormal rounds up to the smallest normal */
        {0x00010000, 0x0001}, /* smallest BF16 subnormal */
        {0x00000001, 0x0000}, /* smallest F32 subnormal */
        {0x00008000, 0x0000}, /* half the smallest subnormal: tie to even zero */
        {0x00008001, 0x0001},
        {0x00018000, 0x0002}, /* subnormal tie, odd neighbour */
        {0x00028000, 0x0002}, /* subnormal tie, even neighbour */
    };
    /* clang-format on */
    CHECK_TABLE(cases, via_f32_to_bf16, 0x80000000u, 0x8000u);
}

static void test_bf16_to_f32_specials(void **state)
{
    (void)state;
    /* clang-format off */
    static const bits_case cases[] = {
        {0x0000, 0x00000000}, {0x7f80, 0x7f800000}, {0x7fc0, 0x7fc00000},
        {0x7f81, 0x7fc10000}, /* signalling NaN becomes quiet, payload kept */
        {0x7fff, 0x7fff0000}, {0x7f7f, 0x7f7f0000}, {0x0080, 0x00800000},
        {0x0001, 0x00010000}, {0x3f80, 0x3f800000},
    };
    /* clang-format on */
    CHECK_TABLE(cases, via_bf16_to_f32, 0x8000u, 0x80000000u);
}

static void test_f32_to_f16_specials(void **state)
{
    (void)state;
    /* clang-format off */
    static const bits_case cases[] = {
        {0x00000000, 0x0000},
        {0x7f800000, 0x7c00},
        {0x7fc00000, 0x7e00},
        {0x7fd23456, 0x7e91}, /* payload 0x523456 -> top 10 bits 0x291 */
        {0x7f800001, 0x7e00}, /* signalling, payload below F16 precision: still NaN */
        {0x7fa00000, 0x7f00}, /* signalling: quietened, payload kept */
        {0x7f7fffff, 0x7c00}, /* largest F32 */
        {0x47800000, 0x7c00}, /* 65536 */
        {0x477fe000, 0x7bff}, /* 65504, largest F16 */
        {0x477fefff, 0x7bff}, /* just below the tie with infinity */
        {0x477ff000, 0x7c00}, /* 65520: tie between 0x7bff (odd) and infinity */
        {0x3f800000, 0x3c00}, /* 1.0 */
        {0x3f801000, 0x3c00}, /* tie, even below */
        {0x3f803000, 0x3c02}, /* tie, odd below */
        {0x3f801001, 0x3c01}, /* just above a tie */
        {0x3f800fff, 0x3c00}, /* just below a tie */
        {0x3f802fff, 0x3c01},
        {0x38800000, 0x0400}, /* 2^-14, smallest normal F16 */
        {0x387fc000, 0x03ff}, /* largest F16 subnormal */
        {0x387fe000, 0x0400}, /* tie between 0x3ff (odd) and the smallest normal */
        {0x387fdfff, 0x03ff},
        {0x387fffff, 0x0400},
        {0x33800000, 0x0001}, /* 2^-24, smallest F16 subnormal */
        {0x33000000, 0x0000}, /* 2^-25: tie to even zero */
        {0x33000001, 0x0001},
        {0x32ffffff, 0x0000},
        {0x33c00000, 0x0002}, /* 3 * 2^-25: tie, odd below */
        {0x34200000, 0x0002}, /* 5 * 2^-25: tie, even below */
        {0x34200001, 0x0003},
        {0x00800000, 0x0000}, /* smallest normal F32 */
        {0x00000001, 0x0000}, /* smallest subnormal F32 */
    };
    /* clang-format on */
    CHECK_TABLE(cases, via_f32_to_f16, 0x80000000u, 0x8000u);
}

static void test_f16_to_f32_specials(void **state)
{
    (void)state;
    /* clang-format off */
    static const bits_case cases[] = {
        {0x0000, 0x00000000}, {0x7c00, 0x7f800000}, {0x7e00, 0x7fc00000},
        {0x7c01, 0x7fc02000}, /* signalling NaN becomes quiet, payload kept */
        {0x7fff, 0x7fffe000}, {0x7bff, 0x477fe000}, {0x0400, 0x38800000},
        {0x03ff, 0x387fc000}, {0x0001, 0x33800000}, {0x0002, 0x34000000},
        {0x0200, 0x38000000}, {0x3c00, 0x3f800000},
    };
    /* clang-format on */
    CHECK_TABLE(cases, via_f16_to_f32, 0x8000u, 0x80000000u);
}

static void test_f64_to_f32_specials(void **state)
{
    (void)state;
    /* clang-format off */
    static const bits_case cases[] = {
        {0x0000000000000000ull, 0x00000000},
        {0x7ff0000000000000ull, 0x7f800000},
        {0x7ff8000000000000ull, 0x7fc00000},
        {0x7ff0000000000001ull, 0x7fc00000}, /* signalling, payload below F32 precision */
        {0x7ff4000000000000ull, 0x7fe00000}, /* signalling: quietened, payload kept */
        {0x7ff123456789abcdull, 0x7fc91a2b}, /* payload 0x123456789abcd -> top 23 bits 0x091a2b */
        {0x7fefffffffffffffull, 0x7f800000}, /* DBL_MAX */
        {0x47efffffe0000000ull, 0x7f7fffff}, /* FLT_MAX */
        {0x47efffffefffffffull, 0x7f7fffff}, /* just below the tie with infinity */
        {0x47effffff0000000ull, 0x7f800000}, /* tie between FLT_MAX (odd) and infinity */
        {0x3ff0000000000000ull, 0x3f800000}, /* 1.0 */
        {0x3ff0000010000000ull, 0x3f800000}, /* 1 + 2^-24: tie, even below */
        {0x3ff0000030000000ull, 0x3f800002}, /* 1 + 3 * 2^-24: tie, odd below */
        {0x3ff0000010000001ull, 0x3f800001}, /* just above a tie */
        {0x3ff000000fffffffull, 0x3f800000}, /* just below a tie */
        {0x3810000000000000ull, 0x00800000}, /* 2^-126, smallest normal F32 */
        {0x380fffffc0000000ull, 0x007fffff}, /* largest F32 subnormal */
        {0x36a0000000000000ull, 0x00000001}, /* 2^-149, smallest F32 subnormal */
        {0x3690000000000000ull, 0x00000000}, /* 2^-150: tie to even zero */
        {0x3690000000000001ull, 0x00000001},
        {0x36a8000000000000ull, 0x00000002}, /* 3 * 2^-150: tie, odd below */
        {0x0010000000000000ull, 0x00000000}, /* DBL_MIN */
        {0x0000000000000001ull, 0x00000000}, /* smallest F64 subnormal */
    };
    /* clang-format on */
    CHECK_TABLE(cases, via_f64_to_f32, 0x8000000000000000ull, 0x80000000u);
}

/* F64 -> BF16/F16 must round once: the F64 value just above a tie lies on
 * the tie after an intermediate rounding to F32, which would then go to even. */
static void test_f64_to_16_single_rounding(void **state)
{
    (void)state;
    /* clang-format off */
    static const bits_case bf16_cases[] = {
        {0x0000000000000000ull, 0x0000},
        {0x7ff0000000000000ull, 0x7f80},
        {0x7ff8000000000000ull, 0x7fc0},
        {0x7ff0000000000001ull, 0x7fc0},
        {0x7ff4000000000000ull, 0x7fe0},
        {0x3ff0100000000000ull, 0x3f80}, /* 1 + 2^-8: tie, even below */
        {0x3ff0300000000000ull, 0x3f82}, /* 1 + 3 * 2^-8: tie, odd below */
        {0x3ff0100000000001ull, 0x3f81}, /* just above the tie: F32 would drop it */
        {0x3ff0100000400000ull, 0x3f81}, /* 1 + 2^-8 + 2^-30 */
        {0x3ff00fffffffffffull, 0x3f80}, /* just below the tie: F32 would round up onto it */
        {0x47efe00000000000ull, 0x7f7f}, /* largest BF16 */
        {0x47eff00000000000ull, 0x7f80}, /* tie with infinity */
        {0x47efefffffffffffull, 0x7f7f},
        {0x7fefffffffffffffull, 0x7f80},
        {0x3810000000000000ull, 0x0080}, /* smallest normal */
        {0x37a0000000000000ull, 0x0001}, /* 2^-133, smallest BF16 subnormal */
        {0x3790000000000000ull, 0x0000}, /* 2^-134: tie to zero */
        {0x3790000000000001ull, 0x0001}, /* F32 would round this onto the tie */
        {0x0000000000000001ull, 0x0000},
    };
    /* clang-format on */
    CHECK_TABLE(bf16_cases, via_f64_to_bf16, 0x8000000000000000ull, 0x8000u);

    /* clang-format off */
    static const bits_case f16_cases[] = {
        {0x0000000000000000ull, 0x0000},
        {0x7ff0000000000000ull, 0x7c00},
        {0x7ff8000000000000ull, 0x7e00},
        {0x7ff0000000000001ull, 0x7e00},
        {0x7ff123456789abcdull, 0x7e48}, /* payload top 10 bits 0x048 (+ quiet) */
        {0x3ff0020000000000ull, 0x3c00}, /* 1 + 2^-11: tie, even below */
        {0x3ff0060000000000ull, 0x3c02}, /* 1 + 3 * 2^-11: tie, odd below */
        {0x3ff0020000000001ull, 0x3c01}, /* just above: lost through F32 */
        {0x3ff001ffffffffffull, 0x3c00},
        {0x40effc0000000000ull, 0x7bff}, /* 65504 */
        {0x40effdffffffffffull, 0x7bff}, /* just below 65520 */
        {0x40effe0000000000ull, 0x7c00}, /* 65520: tie with infinity */
        {0x40f0000000000000ull, 0x7c00}, /* 65536 */
        {0x3f10000000000000ull, 0x0400}, /* 2^-14 */
        {0x3f0ff80000000000ull, 0x03ff}, /* largest subnormal */
        {0x3f0ffc0000000000ull, 0x0400}, /* tie between it and 2^-14 */
        {0x3e70000000000000ull, 0x0001}, /* 2^-24 */
        {0x3e60000000000000ull, 0x0000}, /* 2^-25: tie to zero */
        {0x3e60000000000001ull, 0x0001}, /* just above: lost through F32 */
        {0x3e78000000000000ull, 0x0002}, /* 3 * 2^-25 */
        {0x36a0000000000000ull, 0x0000}, /* 2^-149 */
    };
    /* clang-format on */
    CHECK_TABLE(f16_cases, via_f64_to_f16, 0x8000000000000000ull, 0x8000u);
}

/* ---- exhaustive 16-bit patterns ---- */

static bool is_nan16(uint16_t h, fmt f)
{
    uint16_t exp_all = (uint16_t)(((1u << f.ebits) - 1) << f.mbits);
    return (h & exp_all) == exp_all && (h & ((1u << f.mbits) - 1));
}

static void test_bf16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = ckpt_bf16_to_f32(h);
        double d = (double)f;
        uint16_t back = ckpt_f32_to_bf16(f);
        uint16_t back64 = ckpt_f64_to_bf16(d);
        if (is_nan16(h, FMT_BF16)) {
            assert_true(isnan(f));
            check_nan(h & 0x7f, h >> 15, 7, bits_f32(f), FMT_F32);
            check_nan(h & 0x7f, h >> 15, 7, back, FMT_BF16);
            check_nan(h & 0x7f, h >> 15, 7, back64, FMT_BF16);
            continue;
        }
        assert_int_equal(bits_f32(f), (uint32_t)h << 16); /* widening is a shift */
        assert_true(d == ref_decode(h, FMT_BF16));
        assert_int_equal(back, h);
        assert_int_equal(back64, h);
        /* BF16 -> F16 rounds once (the F32 step is exact). */
        uint16_t o = 0;
        ckpt_convert(CKPT_DT_BF16, &h, CKPT_DT_F16, &o, 1);
        check_rounded(o, FMT_F16, d, "BF16->F16");
    }
}

static void test_f16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = ckpt_f16_to_f32(h);
        double d = (double)f;
        uint16_t back = ckpt_f32_to_f16(f);
        uint16_t back64 = ckpt_f64_to_f16(d);
        if (is_nan16(h, FMT_F16)) {
            assert_true(isnan(f));
            check_nan(h & 0x3ff, h >> 15, 10, bits_f32(f), FMT_F32);
            check_nan(h & 0x3ff, h >> 15, 10, back, FMT_F16);
            check_nan(h & 0x3ff, h >> 15, 10, back64, FMT_F16);
            continue;
        }
        double want = ref_decode(h, FMT_F16);
        assert_true(d == want);
        assert_int_equal(signbit(d) != 0, (h >> 15) != 0);
        assert_int_equal(back, h);
        assert_int_equal(back64, h);
        uint16_t o = 0;
        ckpt_convert(CKPT_DT_F16, &h, CKPT_DT_BF16, &o, 1);
        check_rounded(o, FMT_BF16, d, "F16->BF16");
#ifdef __FLT16_MAX__
        _Float16 hf;
        memcpy(&hf, &h, sizeof hf);
        assert_true((float)hf == f); /* the compiler's own widening */
#endif
    }
}

/* ---- random patterns against independent references ---- */

#define RANDOM_F32_COUNT 4000000

static void test_f32_narrowing_random(void **state)
{
    (void)state;
    for (uint32_t k = 0; k < RANDOM_F32_COUNT; k++) {
        uint64_t r = rng_next();
        uint32_t u = (uint32_t)r;
        /* Half the draws land near the F16 range so its rounding is exercised,
         * not just its overflow and underflow. */
        if (k & 1) u = (u & 0x80ffffffu) | ((uint32_t)(0x30 + (r >> 32) % 0x20) << 24);
        float f = f32_of(u);
        uint16_t b = ckpt_f32_to_bf16(f);
        uint16_t h = ckpt_f32_to_f16(f);
        if (isnan(f)) {
            check_nan(u & 0x7fffff, (int)(u >> 31), 23, b, FMT_BF16);
            check_nan(u & 0x7fffff, (int)(u >> 31), 23, h, FMT_F16);
            continue;
        }
        check_rounded(b, FMT_BF16, (double)f, "F32->BF16");
        check_rounded(h, FMT_F16, (double)f, "F32->F16");
        /* Widening is exact and agrees with the compiler's conversion. */
        uint64_t d = 0;
        ckpt_convert(CKPT_DT_F32, &u, CKPT_DT_F64, &d, 1);
        assert_true(f64_of(d) == (double)f);
        assert_int_equal(d, bits_f64((double)f));
#ifdef __FLT16_MAX__
        _Float16 hf = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &hf, sizeof hb);
        if (hb != h) fail_msg("F32->F16 of 0x%08x: 0x%04x, _Float16 says 0x%04x", u, h, hb);
#endif
    }
}

#define RANDOM_F64_COUNT 2000000

static void test_f64_narrowing_random(void **state)
{
    (void)state;
    for (uint32_t k = 0; k < RANDOM_F64_COUNT; k++) {
        uint64_t u = rng_next();
        /* Exponents from 2^-160 to 2^140 cover every target's subnormals,
         * normals and overflow; a few draws keep the full range. */
        if (k % 8) {
            uint64_t e = 1023 - 160 + (rng_next() % 301);
            u = (u & 0x800fffffffffffffull) | (e << 52);
        }
        double d = f64_of(u);
        float f = ckpt_f64_to_f32(d);
        uint16_t b = ckpt_f64_to_bf16(d);
        uint16_t h = ckpt_f64_to_f16(d);
        if (isnan(d)) {
            uint64_t frac = u & 0x000fffffffffffffull;
            check_nan(frac, (int)(u >> 63), 52, bits_f32(f), FMT_F32);
            check_nan(frac, (int)(u >> 63), 52, b, FMT_BF16);
            check_nan(frac, (int)(u >> 63), 52, h, FMT_F16);
            continue;
        }
        check_rounded(bits_f32(f), FMT_F32, d, "F64->F32");
        check_rounded(b, FMT_BF16, d, "F64->BF16");
        check_rounded(h, FMT_F16, d, "F64->F16");
        /* The compiler's double -> float rounds the same way. */
        assert_int_equal(bits_f32(f), bits_f32((float)d));
#ifdef __FLT16_MAX__
        _Float16 hf = (_Float16)d;
        uint16_t hb;
        memcpy(&hb, &hf, sizeof hb);
        if (hb != h) fail_msg("F64->F16 of %a: 0x%04x, _Float16 says 0x%04x", d, h, hb);
#endif
    }
}

/* ---- ckpt_convert over buffers ---- */

static size_t elem_size(ckpt_dtype dt)
{
    return ckpt_dtype_size(dt);
}

/* Converts one element the scalar way, through the public scalar functions,
 * for comparison with the array loops. */
static void scalar_convert(ckpt_dtype from, const unsigned char *src, ckpt_dtype to,
                           unsigned char *dst)
{
    double d;
    uint16_t h;
    uint32_t u;
    uint64_t q;
    /* Widen to F64 exactly... */
    switch (from) {
    case CKPT_DT_F16:
        memcpy(&h, src, 2);
        d = (double)ckpt_f16_to_f32(h);
        break;
    case CKPT_DT_BF16:
        memcpy(&h, src, 2);
        d = (double)ckpt_bf16_to_f32(h);
        break;
    case CKPT_DT_F32:
        memcpy(&u, src, 4);
        d = (double)f32_of(u);
        break;
    default:
        memcpy(&q, src, 8);
        d = f64_of(q);
        break;
    }
    /* ...then narrow once. */
    switch (to) {
    case CKPT_DT_F16:
        h = ckpt_f64_to_f16(d);
        memcpy(dst, &h, 2);
        break;
    case CKPT_DT_BF16:
        h = ckpt_f64_to_bf16(d);
        memcpy(dst, &h, 2);
        break;
    case CKPT_DT_F32:
        u = bits_f32(ckpt_f64_to_f32(d));
        memcpy(dst, &u, 4);
        break;
    default:
        q = bits_f64(d);
        memcpy(dst, &q, 8);
        break;
    }
}

static bool is_nan_bytes(ckpt_dtype dt, const unsigned char *p)
{
    unsigned char tmp[8] = {0};
    memcpy(tmp, p, elem_size(dt));
    switch (dt) {
    case CKPT_DT_F16:
        return isnan(ckpt_f16_to_f32((uint16_t)(tmp[0] | tmp[1] << 8)));
    case CKPT_DT_BF16:
        return isnan(ckpt_bf16_to_f32((uint16_t)(tmp[0] | tmp[1] << 8)));
    case CKPT_DT_F32: {
        uint32_t u;
        memcpy(&u, tmp, 4);
        return isnan(f32_of(u));
    }
    default: {
        uint64_t q;
        memcpy(&q, tmp, 8);
        return isnan(f64_of(q));
    }
    }
}

static void test_convert_buffers(void **state)
{
    (void)state;
    static const ckpt_dtype floats[] = {CKPT_DT_F16, CKPT_DT_BF16, CKPT_DT_F32, CKPT_DT_F64};
    static const size_t counts[] = {0, 1, 7, 63, 64, 65, 128, 1000};
    const size_t maxn = 1000;
    unsigned char *src = malloc(maxn * 8 + 1);
    unsigned char *dst = malloc(maxn * 8 + 2);
    unsigned char want[8];
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t fi = 0; fi < 4; fi++) {
        for (size_t ti = 0; ti < 4; ti++) {
            ckpt_dtype from = floats[fi], to = floats[ti];
            size_t fs = elem_size(from), ts = elem_size(to);
            for (size_t ci = 0; ci < CKPT_ARRAY_LEN(counts); ci++) {
                size_t n = counts[ci];
                /* Odd offsets: the buffers are deliberately misaligned. */
                unsigned char *s = src + 1, *d = dst + 1;
                for (size_t i = 0; i < n * fs; i++)
                    s[i] = (unsigned char)rng_next();
                memset(dst, 0xa5, maxn * 8 + 2);
                ckpt_convert(from, s, to, d, n);
                assert_int_equal(dst[0], 0xa5);    /* nothing written before */
                assert_int_equal(d[n * ts], 0xa5); /* nor after */
                for (size_t i = 0; i < n; i++) {
                    if (from == to) {
                        assert_memory_equal(d + i * ts, s + i * fs, ts);
                        continue;
                    }
                    scalar_convert(from, s + i * fs, to, want);
                    if (is_nan_bytes(from, s + i * fs)) {
                        assert_true(is_nan_bytes(to, d + i * ts));
                        continue;
                    }
                    if (memcmp(d + i * ts, want, ts) != 0)
                        fail_msg("%s->%s element %zu of %zu differs from the scalar path",
                                 ckpt_dtype_name(from), ckpt_dtype_name(to), i, n);
                }
            }
        }
    }
    free(src);
    free(dst);
}

/* The fast loops on a larger buffer, byte for byte against the scalar calls. */
static void test_convert_bf16_f32_bulk(void **state)
{
    (void)state;
    const size_t n = 1 << 20;
    uint32_t *f = malloc(n * 4);
    uint16_t *b = malloc(n * 2 + 2);
    uint32_t *back = malloc(n * 4);
    assert_non_null(f);
    assert_non_null(b);
    assert_non_null(back);
    for (size_t i = 0; i < n; i++)
        f[i] = (uint32_t)rng_next();
    unsigned char *bu = (unsigned char *)b + 1; /* odd address */
    ckpt_convert(CKPT_DT_F32, f, CKPT_DT_BF16, bu, n);
    ckpt_convert(CKPT_DT_BF16, bu, CKPT_DT_F32, back, n);
    for (size_t i = 0; i < n; i++) {
        uint16_t got;
        memcpy(&got, bu + 2 * i, 2);
        assert_int_equal(got, ckpt_f32_to_bf16(f32_of(f[i])));
        assert_int_equal(back[i], bits_f32(ckpt_bf16_to_f32(got)));
    }
    free(f);
    free(b);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_sizes),
        cmocka_unit_test(test_name_aliases_and_unknown),
        cmocka_unit_test(test_castable),
        cmocka_unit_test(test_numel_and_nbytes),
        cmocka_unit_test(test_f32_to_bf16_specials),
        cmocka_unit_test(test_bf16_to_f32_specials),
        cmocka_unit_test(test_f32_to_f16_specials),
        cmocka_unit_test(test_f16_to_f32_specials),
        cmocka_unit_test(test_f64_to_f32_specials),
        cmocka_unit_test(test_f64_to_16_single_rounding),
        cmocka_unit_test(test_bf16_exhaustive),
        cmocka_unit_test(test_f16_exhaustive),
        cmocka_unit_test(test_f32_narrowing_random),
        cmocka_unit_test(test_f64_narrowing_random),
        cmocka_unit_test(test_convert_buffers),
        cmocka_unit_test(test_convert_bf16_f32_bulk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
