/*
 * dtype.c — the safetensors dtype table and exact float conversions.
 *
 * The table follows the reference Dtype enum (see dtype.h). Conversions work
 * on bit patterns, never through the FPU, so they do not depend on the
 * rounding mode, flush-to-zero or the compiler's choice of instructions:
 * narrowing rounds to nearest, ties to even, with overflow to infinity and
 * exact subnormals; widening is exact; a NaN stays a NaN with its sign and
 * the high bits of its payload, and is made quiet.
 *
 * ckpt_convert() runs over gigabytes, so every pair has its own loop with the
 * conversion inlined; the F32<->BF16 and BF16->F32 conversions are branch-free
 * so the compiler vectorises them (the loops run in fixed-size blocks, which
 * GCC's -O2 cost model accepts).
 */
#include "format/dtype.h"

#include "common/error.h"
#include "common/util.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dtype.c loads little-endian tensor bytes with memcpy; port it for this byte order"
#endif

static const struct {
    const char *name;
    unsigned bits;
} dtype_table[CKPT_DT_COUNT] = {
    [CKPT_DT_BOOL] = {"BOOL", 8},
    [CKPT_DT_F4] = {"F4", 4},
    [CKPT_DT_F6_E2M3] = {"F6_E2M3", 6},
    [CKPT_DT_F6_E3M2] = {"F6_E3M2", 6},
    [CKPT_DT_U8] = {"U8", 8},
    [CKPT_DT_I8] = {"I8", 8},
    [CKPT_DT_F8_E5M2] = {"F8_E5M2", 8},
    [CKPT_DT_F8_E4M3] = {"F8_E4M3", 8},
    [CKPT_DT_F8_E8M0] = {"F8_E8M0", 8},
    [CKPT_DT_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [CKPT_DT_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [CKPT_DT_I16] = {"I16", 16},
    [CKPT_DT_U16] = {"U16", 16},
    [CKPT_DT_F16] = {"F16", 16},
    [CKPT_DT_BF16] = {"BF16", 16},
    [CKPT_DT_I32] = {"I32", 32},
    [CKPT_DT_U32] = {"U32", 32},
    [CKPT_DT_F32] = {"F32", 32},
    [CKPT_DT_C64] = {"C64", 64},
    [CKPT_DT_F64] = {"F64", 64},
    [CKPT_DT_I64] = {"I64", 64},
    [CKPT_DT_U64] = {"U64", 64},
};

/* Spellings people type on the command line (torch-style lowercase). */
static const struct {
    const char *alias;
    ckpt_dtype dt;
} dtype_aliases[] = {
    {"bf16", CKPT_DT_BF16},
    {"f16", CKPT_DT_F16},
    {"f32", CKPT_DT_F32},
    {"f64", CKPT_DT_F64},
};

static bool dtype_valid(ckpt_dtype dt)
{
    return (unsigned)dt < CKPT_DT_COUNT;
}

const char *ckpt_dtype_name(ckpt_dtype dt)
{
    return dtype_valid(dt) ? dtype_table[dt].name : "INVALID";
}

int ckpt_dtype_from_name(const char *s, ckpt_dtype *out)
{
    if (!s) return ckpt_error_set(CKPT_EINVAL, "missing dtype");
    for (size_t i = 0; i < CKPT_DT_COUNT; i++) {
        if (strcmp(s, dtype_table[i].name) == 0) {
            *out = (ckpt_dtype)i;
            return 0;
        }
    }
    for (size_t i = 0; i < CKPT_ARRAY_LEN(dtype_aliases); i++) {
        if (strcmp(s, dtype_aliases[i].alias) == 0) {
            *out = dtype_aliases[i].dt;
            return 0;
        }
    }
    /* Bounded so a hostile multi-megabyte "dtype" does not fill the message. */
    return ckpt_error_set(CKPT_EINVAL, "unknown dtype '%.64s'%s", s, strlen(s) > 64 ? "..." : "");
}

unsigned ckpt_dtype_bits(ckpt_dtype dt)
{
    return dtype_valid(dt) ? dtype_table[dt].bits : 0;
}

unsigned ckpt_dtype_size(ckpt_dtype dt)
{
    unsigned bits = ckpt_dtype_bits(dt);
    return bits % 8 == 0 ? bits / 8 : 0;
}

bool ckpt_dtype_is_castable_float(ckpt_dtype dt)
{
    return dt == CKPT_DT_F16 || dt == CKPT_DT_BF16 || dt == CKPT_DT_F32 || dt == CKPT_DT_F64;
}

/* Multiplies in shape order, as the reference does, so a shape such as
 * [2^63, 4, 0] overflows there exactly when it overflows here. */
bool ckpt_shape_numel(int ndim, const uint64_t *shape, uint64_t *out)
{
    if (ndim < 0) return false;
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (!ckpt_mul(n, shape[i], &n)) return false;
    }
    *out = n;
    return true;
}

/* "[2, 3, 4]" into buf, truncated with "..." when it does not fit. */
const char *ckpt_shape_str(int ndim, const uint64_t *shape, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i <= ndim && used < len; i++) {
        int n;
        if (i == ndim)
            n = snprintf(buf + used, len - used, "%s]", ndim ? "" : "[");
        else
            n = snprintf(buf + used, len - used, "%s%" PRIu64, i ? ", " : "[", shape[i]);
        if (n < 0 || (size_t)n >= len - used) {
            if (len >= 4) memcpy(buf + len - 4, "...", 4);
            return buf;
        }
        used += (size_t)n;
    }
    return buf;
}

int ckpt_dtype_nbytes(ckpt_dtype dt, int ndim, const uint64_t *shape, uint64_t *out)
{
    char sbuf[160];
    if (!dtype_valid(dt)) return ckpt_error_set(CKPT_EINVAL, "invalid dtype %d", (int)dt);
    if (ndim < 0 || ndim > CKPT_MAX_RANK)
        return ckpt_error_set(CKPT_ELIMIT, "LimitExceeded: rank %d (at most %d)", ndim,
                              CKPT_MAX_RANK);
    uint64_t numel, nbits;
    if (!ckpt_shape_numel(ndim, shape, &numel) || !ckpt_mul(numel, dtype_table[dt].bits, &nbits))
        return ckpt_error_set(CKPT_ELIMIT, "ValidationOverflow: %s x %s does not fit in 64 bits",
                              dtype_table[dt].name, ckpt_shape_str(ndim, shape, sbuf, sizeof sbuf));
    if (nbits % 8 != 0)
        return ckpt_error_set(
            CKPT_EINVAL,
            "MisalignedSlice: %s x %s is %" PRIu64 " bits, not a whole number of bytes",
            dtype_table[dt].name, ckpt_shape_str(ndim, shape, sbuf, sizeof sbuf), nbits);
    *out = nbits / 8;
    return 0;
}

/* ---- scalar conversions on bit patterns ---- */

#define F32_ABS_MASK 0x7fffffffu
#define F32_INF 0x7f800000u
#define F32_QUIET 0x00400000u
#define F64_ABS_MASK 0x7fffffffffffffffull
#define F64_INF 0x7ff0000000000000ull
#define F64_QUIET 0x0008000000000000ull

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static inline double f64_from_bits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* F32 -> BF16. Adding 0x7fff plus the lowest kept bit rounds to nearest even;
 * a carry walks into the exponent, and past the largest finite value it lands
 * exactly on infinity. A NaN keeps its top 7 payload bits and gets the quiet
 * bit, which also stops a NaN whose payload sits in the low 16 bits from
 * truncating to infinity. Branch-free so loops of it vectorise. */
static inline uint16_t bf16_from_f32_bits(uint32_t u)
{
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & F32_ABS_MASK) > F32_INF ? nan : rounded);
}

/* BF16 -> F32: exact; a signalling NaN becomes quiet. */
static inline uint32_t f32_bits_from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    return (u & F32_ABS_MASK) > F32_INF ? u | F32_QUIET : u;
}

/* Shifts m right by shift bits (1..63), rounding to nearest, ties to even. */
static inline uint64_t shift_round_even(uint64_t m, unsigned shift)
{
    uint64_t half = 1ull << (shift - 1);
    uint64_t rem = m & ((half << 1) - 1);
    uint64_t q = m >> shift;
    return q + (rem > half || (rem == half && (q & 1)));
}

/* F32 -> F16. */
static inline uint16_t f16_from_f32_bits(uint32_t u)
{
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & F32_ABS_MASK;
    if (a > F32_INF) return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x01ffu);
    if (a >= 0x47800000u) return sign | 0x7c00u; /* >= 2^16, infinity included */
    if (a >= 0x38800000u) {                      /* >= 2^-14: normal in F16 */
        /* Rebias the exponent (127 -> 15) and round off 13 bits; a carry
         * into the exponent is right, up to and including infinity. */
        uint32_t r = a - 0x38000000u;
        return sign | (uint16_t)((r + 0x0fffu + ((r >> 13) & 1u)) >> 13);
    }
    if (a <= 0x33000000u) return sign; /* <= 2^-25, half the smallest subnormal: ties to 0 */
    /* Subnormal result: the value in units of 2^-24 is mant * 2^(e - 126). */
    uint32_t e = a >> 23;
    uint32_t mant = (a & 0x007fffffu) | 0x00800000u;
    return sign | (uint16_t)shift_round_even(mant, 126 - e);
}

/* F16 -> F32: exact. */
static inline uint32_t f32_bits_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x03ffu;
    if (e == 0x1f) return sign | F32_INF | (mant << 13) | (mant ? F32_QUIET : 0);
    if (e != 0) return sign | ((e + 112) << 23) | (mant << 13);
    if (mant == 0) return sign;
    /* Subnormal mant * 2^-24: normalise so the leading 1 sits at bit 10. */
    unsigned lead = 31u - (unsigned)__builtin_clz(mant); /* 0..9 */
    uint32_t exp32 = 103u + lead;                        /* 2^(lead - 24), biased by 127 */
    return sign | (exp32 << 23) | (((mant << (10u - lead)) & 0x03ffu) << 13);
}

/* F32 -> F64: exact. */
static inline uint64_t f64_bits_from_f32_bits(uint32_t u)
{
    uint64_t sign = (uint64_t)(u >> 31) << 63;
    uint32_t e = (u >> 23) & 0xffu;
    uint64_t mant = u & 0x007fffffu;
    if (e == 0xff) return sign | F64_INF | (mant << 29) | (mant ? F64_QUIET : 0);
    if (e != 0) return sign | ((uint64_t)(e + 896) << 52) | (mant << 29);
    if (mant == 0) return sign;
    unsigned lead = 31u - (unsigned)__builtin_clz((uint32_t)mant); /* 0..22 */
    uint64_t exp64 = 874u + lead; /* 2^(lead - 149), biased by 1023 */
    return sign | (exp64 << 52) | (((mant << (52u - lead)) & 0x000fffffffffffffull));
}

/*
 * F64 -> a narrower IEEE binary format with ebits exponent bits and mbits
 * fraction bits (F32: 8/23, BF16: 8/7, F16: 5/10), in one rounding.
 */
static inline uint64_t narrow_from_f64_bits(uint64_t u, unsigned ebits, unsigned mbits)
{
    const uint64_t sign = (u >> 63) << (ebits + mbits);
    const uint64_t exp_all = ((1ull << ebits) - 1) << mbits; /* infinity's exponent field */
    const uint64_t frac_mask = (1ull << mbits) - 1;
    const int bias = (1 << (ebits - 1)) - 1;
    uint64_t a = u & F64_ABS_MASK;
    if (a > F64_INF)
        return sign | exp_all | (1ull << (mbits - 1)) | ((a >> (52 - mbits)) & frac_mask);
    if (a == F64_INF) return sign | exp_all;
    int dexp = (int)(a >> 52);
    if (dexp == 0) return sign; /* zero or F64 subnormal: far below any target's subnormals */
    int e = dexp - 1023;        /* value = sig * 2^(e - 52) */
    uint64_t sig = (a & 0x000fffffffffffffull) | (1ull << 52);
    int emin = 1 - bias;
    if (e > bias) return sign | exp_all;
    if (e >= emin) {
        /* Normal: exponent field then fraction, so a rounding carry walks into
         * the exponent and, past the largest finite value, onto infinity. */
        uint64_t field = ((uint64_t)(e + bias) << mbits) | ((sig >> (52 - mbits)) & frac_mask);
        uint64_t rem = sig & ((1ull << (52 - mbits)) - 1);
        uint64_t half = 1ull << (51 - mbits);
        field += rem > half || (rem == half && (field & 1));
        return sign | field;
    }
    /* Subnormal: the value in units of 2^(emin - mbits). */
    unsigned shift = (unsigned)(52 - (int)mbits + (emin - e));
    if (shift > 60) return sign; /* below half the smallest subnormal */
    return sign | shift_round_even(sig, shift);
}

static inline uint32_t f32_bits_from_f64_bits(uint64_t u)
{
    return (uint32_t)narrow_from_f64_bits(u, 8, 23);
}

static inline uint16_t bf16_from_f64_bits(uint64_t u)
{
    return (uint16_t)narrow_from_f64_bits(u, 8, 7);
}

static inline uint16_t f16_from_f64_bits(uint64_t u)
{
    return (uint16_t)narrow_from_f64_bits(u, 5, 10);
}

/* Conversions that pass through F32 exactly (the first step is exact, so the
 * pair still rounds once). */
static inline uint16_t f16_from_bf16(uint16_t h)
{
    return f16_from_f32_bits(f32_bits_from_bf16(h));
}

static inline uint16_t bf16_from_f16(uint16_t h)
{
    return bf16_from_f32_bits(f32_bits_from_f16(h));
}

static inline uint64_t f64_bits_from_bf16(uint16_t h)
{
    return f64_bits_from_f32_bits(f32_bits_from_bf16(h));
}

static inline uint64_t f64_bits_from_f16(uint16_t h)
{
    return f64_bits_from_f32_bits(f32_bits_from_f16(h));
}

uint16_t ckpt_f32_to_bf16(float f)
{
    return bf16_from_f32_bits(f32_bits(f));
}

float ckpt_bf16_to_f32(uint16_t h)
{
    return f32_from_bits(f32_bits_from_bf16(h));
}

uint16_t ckpt_f32_to_f16(float f)
{
    return f16_from_f32_bits(f32_bits(f));
}

float ckpt_f16_to_f32(uint16_t h)
{
    return f32_from_bits(f32_bits_from_f16(h));
}

float ckpt_f64_to_f32(double d)
{
    return f32_from_bits(f32_bits_from_f64_bits(f64_bits(d)));
}

uint16_t ckpt_f64_to_bf16(double d)
{
    return bf16_from_f64_bits(f64_bits(d));
}

uint16_t ckpt_f64_to_f16(double d)
{
    return f16_from_f64_bits(f64_bits(d));
}

/* ---- array conversions ---- */

/* Elements per block: a loop of constant trip count that GCC -O2 vectorises. */
#define CONVERT_BLOCK 64

/*
 * Defines a loop converting n elements of in_t at src into out_t at dst with
 * fn, loading and storing with memcpy so any alignment works.
 */
#define DEFINE_CONVERT_LOOP(loop_name, in_t, out_t, fn)                                            \
    static void loop_name(const unsigned char *restrict src, unsigned char *restrict dst,          \
                          size_t n)                                                                \
    {                                                                                              \
        size_t i = 0;                                                                              \
        for (; n - i >= CONVERT_BLOCK; i += CONVERT_BLOCK) {                                       \
            const unsigned char *s = src + i * sizeof(in_t);                                       \
            unsigned char *d = dst + i * sizeof(out_t);                                            \
            for (size_t j = 0; j < CONVERT_BLOCK; j++) {                                           \
                in_t x;                                                                            \
                memcpy(&x, s + j * sizeof x, sizeof x);                                            \
                out_t y = fn(x);                                                                   \
                memcpy(d + j * sizeof y, &y, sizeof y);                                            \
            }                                                                                      \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            in_t x;                                                                                \
            memcpy(&x, src + i * sizeof x, sizeof x);                                              \
            out_t y = fn(x);                                                                       \
            memcpy(dst + i * sizeof y, &y, sizeof y);                                              \
        }                                                                                          \
    }

DEFINE_CONVERT_LOOP(convert_f32_bf16, uint32_t, uint16_t, bf16_from_f32_bits)
DEFINE_CONVERT_LOOP(convert_bf16_f32, uint16_t, uint32_t, f32_bits_from_bf16)
DEFINE_CONVERT_LOOP(convert_f32_f16, uint32_t, uint16_t, f16_from_f32_bits)
DEFINE_CONVERT_LOOP(convert_f16_f32, uint16_t, uint32_t, f32_bits_from_f16)
DEFINE_CONVERT_LOOP(convert_f64_f32, uint64_t, uint32_t, f32_bits_from_f64_bits)
DEFINE_CONVERT_LOOP(convert_f32_f64, uint32_t, uint64_t, f64_bits_from_f32_bits)
DEFINE_CONVERT_LOOP(convert_f64_bf16, uint64_t, uint16_t, bf16_from_f64_bits)
DEFINE_CONVERT_LOOP(convert_f64_f16, uint64_t, uint16_t, f16_from_f64_bits)
DEFINE_CONVERT_LOOP(convert_bf16_f64, uint16_t, uint64_t, f64_bits_from_bf16)
DEFINE_CONVERT_LOOP(convert_f16_f64, uint16_t, uint64_t, f64_bits_from_f16)
DEFINE_CONVERT_LOOP(convert_bf16_f16, uint16_t, uint16_t, f16_from_bf16)
DEFINE_CONVERT_LOOP(convert_f16_bf16, uint16_t, uint16_t, bf16_from_f16)

typedef void (*convert_loop_fn)(const unsigned char *restrict, unsigned char *restrict, size_t);

/* Index of a castable float among F16, BF16, F32, F64; -1 otherwise. */
static int castable_index(ckpt_dtype dt)
{
    switch (dt) {
    case CKPT_DT_F16:
        return 0;
    case CKPT_DT_BF16:
        return 1;
    case CKPT_DT_F32:
        return 2;
    case CKPT_DT_F64:
        return 3;
    default:
        return -1;
    }
}

void ckpt_convert(ckpt_dtype from, const void *src, ckpt_dtype to, void *dst, size_t n)
{
    /* [from][to] in castable_index order; NULL on the diagonal (a copy). */
    static const convert_loop_fn loops[4][4] = {
        {NULL, convert_f16_bf16, convert_f16_f32, convert_f16_f64},
        {convert_bf16_f16, NULL, convert_bf16_f32, convert_bf16_f64},
        {convert_f32_f16, convert_f32_bf16, NULL, convert_f32_f64},
        {convert_f64_f16, convert_f64_bf16, convert_f64_f32, NULL},
    };
    int fi = castable_index(from), ti = castable_index(to);
    assert(fi >= 0 && ti >= 0);
    if (fi < 0 || ti < 0 || n == 0) return;
    if (fi == ti) {
        memcpy(dst, src, n * dtype_table[from].bits / 8);
        return;
    }
    loops[fi][ti](src, dst, n);
}

int ckpt_scalar_value(ckpt_dtype dt, const void *bytes, double *out)
{
    switch (dt) {
    case CKPT_DT_I32: { int32_t v; memcpy(&v, bytes, 4); *out = v; return 0; }
    case CKPT_DT_I64: { int64_t v; memcpy(&v, bytes, 8); *out = (double)v; return 0; }
    case CKPT_DT_F32: { float v; memcpy(&v, bytes, 4); *out = v; return 0; }
    case CKPT_DT_F64: { double v; memcpy(&v, bytes, 8); *out = v; return 0; }
    default: return -1;
    }
}
