/*
 * test_torch.c — the restricted pickle machine (format/pickle.c), the zip
 * directory reader (format/zipdir.c) and the torch.save reader
 * (format/torch.c), on images built here byte by byte: pickles as torch
 * writes them (protocol 2, BINPUT memo, persistent ids, _rebuild_tensor_v2,
 * OrderedDict with BUILD of _metadata), zips laid out as torch's writer lays
 * them out, the legacy format. Then what must be refused, each with its
 * message, and a deterministic mutation loop for memory safety (ASan).
 * Real torch files are tests/e2e/test_torch.sh's business.
 */
#include "common/error.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/pickle.h"
#include "format/torch.h"
#include "format/torch_write.h"
#include "format/zipdir.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/pkbuild.h"

/* ---- a byte builder: tests/support/pkbuild.h ---- */

static void p_tuple_ints(buf *o, int n, const int *v)
{
    put8(o, '(');
    for (int i = 0; i < n; i++) p_int(o, v[i]);
    put8(o, 't');
}
/* _rebuild_tensor_v2(('storage', torch.FloatStorage, key, 'cpu', numel[, None]), off, size, stride, False, OrderedDict()) */
static void p_tensor(buf *o, const char *key, int numel, int off, int ndim, const int *size, const int *stride, bool legacy)
{
    p_glob(o, "torch._utils", "_rebuild_tensor_v2");
    put8(o, '(');
    put8(o, '(');
    p_str(o, "storage");
    p_glob(o, "torch", "FloatStorage");
    p_str(o, key);
    p_str(o, "cpu");
    p_int(o, numel);
    if (legacy) put8(o, 'N');
    put8(o, 't');
    put8(o, 'Q');
    p_int(o, off);
    p_tuple_ints(o, ndim, size);
    p_tuple_ints(o, ndim, stride);
    put8(o, 0x89);
    p_glob(o, "collections", "OrderedDict");
    puts_(o, ")R");
    puts_(o, "tR");
}

/* A state dict pickle {"w": 4 floats of storage 0, "w_tied": the same tensor (memo)}
 * as an OrderedDict with a BUILD of _metadata, as model.state_dict() pickles. */
static void p_state_dict(buf *o, bool legacy)
{
    int four[] = {4}, one[] = {1};
    put(o, "\x80\x02", 2);
    p_glob(o, "collections", "OrderedDict");
    puts_(o, ")R");
    put(o, "q\x00", 2);
    put8(o, '(');
    p_str(o, "w");
    p_tensor(o, "0", 4, 0, 1, four, one, legacy);
    put(o, "q\x01", 2);
    p_str(o, "w_tied");
    put(o, "h\x01", 2);
    put8(o, 'u');
    put8(o, '}');
    p_str(o, "_metadata");
    put8(o, '}');
    puts_(o, "sb.");
}

/* ---- a zip writer laid out as torch's (stored entries) ---- */

typedef struct {
    const char *name;
    const void *data;
    size_t len;
    uint16_t method;
} zentry;

static bool zip64; /* zip_build writes zip64 central fields and end records */

static void zip_build(buf *o, const zentry *e, size_t n)
{
    uint64_t *offs = calloc(n, sizeof *offs);
    for (size_t i = 0; i < n; i++) {
        offs[i] = o->n;
        uint32_t crc = zipdir_crc32(0, e[i].data, e[i].len);
        put32(o, 0x04034b50);
        put16(o, 20), put16(o, 0), put16(o, e[i].method), put32(o, 0);
        put32(o, crc), put32(o, (uint32_t)e[i].len), put32(o, (uint32_t)e[i].len);
        put16(o, (uint16_t)strlen(e[i].name)), put16(o, 0);
        puts_(o, e[i].name);
        put(o, e[i].data, e[i].len);
    }
    uint64_t cd = o->n;
    for (size_t i = 0; i < n; i++) {
        put32(o, 0x02014b50);
        put16(o, 20), put16(o, 20), put16(o, 0), put16(o, e[i].method), put32(o, 0);
        put32(o, zipdir_crc32(0, e[i].data, e[i].len));
        put32(o, zip64 ? 0xFFFFFFFFu : (uint32_t)e[i].len), put32(o, zip64 ? 0xFFFFFFFFu : (uint32_t)e[i].len);
        put16(o, (uint16_t)strlen(e[i].name)), put16(o, zip64 ? 28 : 0), put16(o, 0), put16(o, 0), put16(o, 0), put32(o, 0);
        put32(o, zip64 ? 0xFFFFFFFFu : (uint32_t)offs[i]);
        puts_(o, e[i].name);
        if (zip64) { /* the zip64 extra field: size, compressed size, local header offset */
            put16(o, 1), put16(o, 24);
            put64(o, e[i].len), put64(o, e[i].len), put64(o, offs[i]);
        }
    }
    uint64_t cd_size = o->n - cd;
    if (zip64) {
        uint64_t rec = o->n;
        put32(o, 0x06064b50), put64(o, 44), put16(o, 45), put16(o, 45), put32(o, 0), put32(o, 0);
        put64(o, n), put64(o, n), put64(o, cd_size), put64(o, cd);
        put32(o, 0x07064b50), put32(o, 0), put64(o, rec), put32(o, 1);
        put32(o, 0x06054b50);
        put16(o, 0), put16(o, 0), put16(o, 0xFFFF), put16(o, 0xFFFF);
        put32(o, 0xFFFFFFFFu), put32(o, 0xFFFFFFFFu), put16(o, 0);
        free(offs);
        return;
    }
    put32(o, 0x06054b50);
    put16(o, 0), put16(o, 0), put16(o, (uint16_t)n), put16(o, (uint16_t)n);
    put32(o, (uint32_t)cd_size), put32(o, (uint32_t)cd), put16(o, 0);
    free(offs);
}

static const float DATA[4] = {1, 2, 3, 4};

/* A torch zip around a pickle; storage "0" holds `storage_len` bytes of DATA. */
static void torch_zip(buf *o, const buf *pkl, size_t storage_len, uint16_t method, const char *byteorder)
{
    zentry e[4] = {{"archive/data.pkl", pkl->b, pkl->n, 0},
                   {"archive/data/0", DATA, storage_len, method},
                   {"archive/version", "3\n", 2, 0},
                   {"archive/byteorder", byteorder, byteorder ? strlen(byteorder) : 0, 0}};
    zip_build(o, e, byteorder ? 4 : 3);
}

typedef struct {
    const uint8_t *b;
    size_t n;
} mem;

static int mem_read(void *ctx, void *out, size_t len, uint64_t off)
{
    const mem *m = ctx;
    if (off > m->n || len > m->n - off) return ckpt_error_set(CKPT_EINVAL, "mem: read past the end");
    memcpy(out, m->b + off, len);
    return 0;
}

static int parse_image(st_file *f, const buf *img)
{
    mem m = {img->b, img->n};
    return torch_parse(f, "img.bin", mem_read, &m, img->n);
}

static void expect_error(int rc, int code, const char *want)
{
    assert_int_equal(rc, code);
    if (!strstr(ckpt_error_last(), want)) fail_msg("error '%s' lacks '%s'", ckpt_error_last(), want);
}

/* ---- pickle ---- */

static const pk_global_def ALLOW[] = {
    {"collections", "OrderedDict", PKG_DICT, 1},
    {"mod", "fn", PKG_CALL, 2},
    {"mod", "Rec", PKG_RECORD, 3},
    {"_codecs", "encode", PKG_ENCODE, 4},
    {"mod", "CONST", PKG_VALUE, 5},
    {"mod", "DType", PKG_REDUCE_RECORD, 6},
};

static int run(pk_doc *d, const buf *b, size_t max_stack)
{
    pk_opts o = {.allow = ALLOW, .nallow = CKPT_ARRAY_LEN(ALLOW), .allow_persid = true, .limits = {.max_stack = max_stack}};
    return pk_parse(d, "t.pkl", b->b, b->n, &o);
}

static void test_pickle_plain_values(void **state)
{
    (void)state;
    buf b = {0};
    put(&b, "\x80\x02", 2);
    put8(&b, '}');
    put8(&b, '(');
    p_str(&b, "i");
    p_int(&b, -7);
    p_str(&b, "big");
    put(&b, "\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 12); /* LONG1 of 10 bytes: kept as bytes */
    p_str(&b, "neg");
    put(&b, "\x8a\x02\x00\xff", 4); /* -256 */
    p_str(&b, "f");
    put(&b, "G\x3f\xf8\x00\x00\x00\x00\x00\x00", 9); /* 1.5 */
    p_str(&b, "bytes");
    p_glob(&b, "_codecs", "encode");
    put8(&b, '(');
    p_str(&b, "a\xc3\xbf"); /* "aÿ" */
    p_str(&b, "latin1");
    puts_(&b, "tR");
    p_str(&b, "t");
    put(&b, "K\x01K\x02\x86", 5);
    put(&b, "u.", 2);
    pk_doc d;
    assert_int_equal(run(&d, &b, 0), 0);
    const pk_node *r = pk_at(&d, d.root);
    assert_int_equal(r->kind, PK_DICT);
    assert_int_equal(r->n, 12);
    assert_int_equal(pk_item(&d, r, 1)->i, -7);
    assert_non_null(pk_item(&d, r, 3)->s);
    assert_int_equal(pk_item(&d, r, 3)->slen, 10);
    assert_int_equal(pk_item(&d, r, 5)->i, -256);
    assert_true(pk_item(&d, r, 7)->f == 1.5);
    const pk_node *by = pk_item(&d, r, 9);
    assert_int_equal(by->kind, PK_BYTES);
    assert_int_equal(by->slen, 2);
    assert_memory_equal(by->s, "a\xff", 2);
    assert_int_equal(pk_item(&d, r, 11)->kind, PK_TUPLE);
    assert_int_equal(d.consumed, b.n);
    pk_free(&d);
    free(b.b);
}

static void test_pickle_calls_are_recorded(void **state)
{
    (void)state;
    buf b = {0};
    put(&b, "\x80\x02", 2);
    p_glob(&b, "mod", "fn");
    put8(&b, '(');
    put(&b, "K\x05", 2);
    puts_(&b, "tR");
    put(&b, "\x85", 1);
    p_glob(&b, "mod", "Rec");
    put(&b, ")\x81", 2);
    put8(&b, '}');
    p_str(&b, "x");
    put(&b, "K\x01", 2);
    put(&b, "sb", 2);
    put(&b, "\x86.", 2);
    pk_doc d;
    assert_int_equal(run(&d, &b, 0), 0);
    const pk_node *r = pk_at(&d, d.root);
    assert_int_equal(r->kind, PK_TUPLE);
    const pk_node *call = pk_item(&d, pk_item(&d, r, 0), 0), *obj = pk_item(&d, r, 1);
    assert_int_equal(call->kind, PK_CALL);
    assert_int_equal(pk_item(&d, call, 0)->tag, 2);
    assert_int_equal(obj->kind, PK_OBJ);
    assert_int_equal(pk_item(&d, obj, 2)->kind, PK_DICT);
    pk_free(&d);
    free(b.b);
}

/* PKG_REDUCE_RECORD (numpy.dtype in the EasyDeL structure reader): REDUCE
 * gives a record whose state one BUILD sets; a plain PKG_RECORD class still
 * may not be REDUCEd, and a second BUILD is refused. */
static void test_pickle_reduce_record(void **state)
{
    (void)state;
    buf b = {0};
    put(&b, "\x80\x02", 2);
    p_glob(&b, "mod", "DType");
    put8(&b, '(');
    p_str(&b, "i4");
    put(&b, "\x89\x88", 2); /* False, True */
    puts_(&b, "tR");
    put8(&b, '(');
    put(&b, "K\x03", 2);
    p_str(&b, "<");
    puts_(&b, "tb.");
    pk_doc d;
    assert_int_equal(run(&d, &b, 0), 0);
    const pk_node *r = pk_at(&d, d.root);
    assert_int_equal(r->kind, PK_OBJ);
    assert_int_equal(pk_item(&d, r, 0)->tag, 6);
    assert_int_equal(pk_item(&d, r, 1)->n, 3);
    assert_int_equal(pk_item(&d, r, 2)->kind, PK_TUPLE);
    assert_string_equal(pk_item(&d, pk_item(&d, r, 2), 1)->s, "<");
    pk_free(&d);
    b.n -= 1; /* a second BUILD */
    put8(&b, '(');
    puts_(&b, "tb.");
    expect_error(run(&d, &b, 0), CKPT_EINVAL, "BUILD (__setstate__) on 'object' is not allowed");
    b.n = 0;
    put(&b, "\x80\x02", 2);
    p_glob(&b, "mod", "Rec");
    puts_(&b, ")R.");
    expect_error(run(&d, &b, 0), CKPT_EINVAL, "global 'mod.Rec' may not be called (REDUCE)");
    free(b.b);
}

/* Each refusal, with its message. */
#define C(lit) lit, sizeof(lit) - 1

static void test_pickle_refusals(void **state)
{
    (void)state;
    struct {
        const char *bytes;
        size_t len;
        const char *want;
        int code;
        size_t max_stack;
    } cases[] = {
        {C("\x80\x02\x63os\nsystem\n(X\x02\x00\x00\x00lstR."), "global 'os.system' is not allowed", CKPT_EINVAL, 0},
        {C("\x80\x02X\x08\x00\x00\x00" "builtinsX\x04\x00\x00\x00" "eval\x93."), "global 'builtins.eval'", CKPT_EINVAL, 0},
        {C("\x80\x02\x63mod\nCONST\n)R."), "global 'mod.CONST' may not be called", CKPT_EINVAL, 0},
        {C("\x80\x02\x63mod\nfn\n)R}b."), "BUILD (__setstate__) on 'mod.fn' is not allowed", CKPT_EINVAL, 0},
        {C("\x80\x02\x63mod\nfn\n)\x81."), "NEWOBJ of 'mod.fn', which is not an allowed record class", CKPT_EINVAL, 0},
        {C("\x80\x02(ios\nsystem\n."), "opcode 0x69 is not supported", CKPT_EINVAL, 0},
        {C("\x80\x02]r\x05\x00\x00\x00."), "memo index out of order", CKPT_EINVAL, 0},
        {C("\x80\x02h\x00."), "memo entry not defined", CKPT_EINVAL, 0},
        {C("\x80\x02]]]]]]]]]]]]]]]]]]."), "stack deeper than the limit", CKPT_ELIMIT, 16},
        {C("\x80\x02((((((((((((((((((."), "more marks than the limit", CKPT_ELIMIT, 16},
        {C("\x80\x06."), "protocol 6 is not one of 2-5", CKPT_EINVAL, 0},
        {C("\x80\x02K\x01K\x02."), "STOP with 2 values", CKPT_EINVAL, 0},
        {C("\x80\x02t."), "no MARK", CKPT_EINVAL, 0},
        {C("\x80\x02K\x01" "a."), "stack underflow", CKPT_EINVAL, 0},
        {C("\x80\x02]K\x01K\x02s."), "setting items on a list", CKPT_EINVAL, 0},
        {C("\x80\x02\x8b\x00\x01\x00\x00."), "an integer of 256 bytes", CKPT_ELIMIT, 0},
        {C("\x80\x02Q."), "stack underflow", CKPT_EINVAL, 0},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(cases); i++) {
        buf b = {(uint8_t *)cases[i].bytes, cases[i].len, 0};
        pk_doc d;
        int rc = run(&d, &b, cases[i].max_stack);
        if (rc != cases[i].code || !strstr(ckpt_error_last(), cases[i].want))
            fail_msg("case %zu: rc %d, '%s' (want '%s')", i, rc, ckpt_error_last(), cases[i].want);
        assert_null(d.nodes);
    }
    /* a pickle cut short says so (the legacy reader then reads more) */
    buf b = {(uint8_t *)"\x80\x02X\x10\x00\x00\x00" "abc", 10, 0};
    pk_doc d;
    assert_int_not_equal(run(&d, &b, 0), 0);
    assert_true(d.truncated);
}

/* ---- torch zip ---- */

static void test_torch_zip_state_dict(void **state)
{
    (void)state;
    buf pkl = {0}, img = {0};
    p_state_dict(&pkl, false);
    torch_zip(&img, &pkl, sizeof DATA, 0, "little");
    st_file f;
    assert_int_equal(parse_image(&f, &img), 0);
    assert_true(f.from_torch);
    assert_int_equal(f.ntensors, 1);
    const st_tensor *t = st_find(&f, "w");
    assert_non_null(t);
    assert_int_equal(t->dtype, CKPT_DT_F32);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], 4);
    assert_int_equal(t->nbytes, 16);
    assert_memory_equal(img.b + t->offset, DATA, 16); /* the bytes, in place */
    assert_string_equal(st_meta_get(&f, "w_tied"), "w");
    st_close(&f);
    free(pkl.b);
    free(img.b);
}

/* The same archive with zip64 central fields and end records (what torch's
 * writer emits past 4 GB): the same table. */
static void test_torch_zip64(void **state)
{
    (void)state;
    buf pkl = {0}, img = {0};
    p_state_dict(&pkl, false);
    zip64 = true;
    torch_zip(&img, &pkl, sizeof DATA, 0, NULL);
    zip64 = false;
    st_file f;
    assert_int_equal(parse_image(&f, &img), 0);
    const st_tensor *t = st_find(&f, "w");
    assert_non_null(t);
    assert_memory_equal(img.b + t->offset, DATA, 16);
    st_close(&f);
    free(pkl.b);
    free(img.b);
}

static void test_torch_zip_refusals(void **state)
{
    (void)state;
    buf pkl = {0}, img = {0};
    p_state_dict(&pkl, false);
    st_file f;

    torch_zip(&img, &pkl, 8, 0, NULL);
    expect_error(parse_image(&f, &img), CKPT_EINVAL, "storage '0' is 16 bytes (torch.FloatStorage of 4) but its entry holds 8");
    img.n = 0;
    torch_zip(&img, &pkl, sizeof DATA, 8, NULL);
    expect_error(parse_image(&f, &img), CKPT_EINVAL, "entry 'archive/data/0' is compressed (method 8)");
    img.n = 0;
    torch_zip(&img, &pkl, sizeof DATA, 0, "big");
    expect_error(parse_image(&f, &img), CKPT_EINVAL, "byteorder 'big'");

    /* data.pkl's CRC-32 must hold */
    img.n = 0;
    torch_zip(&img, &pkl, sizeof DATA, 0, NULL);
    img.b[30 + strlen("archive/data.pkl") + 5] ^= 1;
    expect_error(parse_image(&f, &img), CKPT_EINVAL, "'archive/data.pkl' does not match its CRC-32");

    /* views */
    int four[] = {4}, two[] = {2}, one[] = {1}, s2[] = {2};
    struct {
        int off, ndim;
        const int *size, *stride;
        const char *want;
    } views[] = {
        {1, 1, four, one, "reaches element 4 of a storage of 4 elements"},
        {0, 1, two, s2, "is a strided view"},
    };
    for (size_t i = 0; i < CKPT_ARRAY_LEN(views); i++) {
        buf p = {0};
        put(&p, "\x80\x02}(", 4);
        p_str(&p, "v");
        p_tensor(&p, "0", 4, views[i].off, views[i].ndim, views[i].size, views[i].stride, false);
        put(&p, "u.", 2);
        img.n = 0;
        torch_zip(&img, &p, sizeof DATA, 0, NULL);
        expect_error(parse_image(&f, &img), CKPT_EINVAL, views[i].want);
        free(p.b);
    }
    /* a view at an offset is fine: bytes [8, 16) */
    buf p = {0};
    put(&p, "\x80\x02}(", 4);
    p_str(&p, "v");
    p_tensor(&p, "0", 4, 2, 1, two, one, false);
    put(&p, "u.", 2);
    img.n = 0;
    torch_zip(&img, &p, sizeof DATA, 0, NULL);
    assert_int_equal(parse_image(&f, &img), 0);
    assert_memory_equal(img.b + st_find(&f, "v")->offset, DATA + 2, 8);
    st_close(&f);
    free(p.b);
    free(pkl.b);
    free(img.b);
}

/* Zip directory rules, through zipdir_read directly. */
static void test_zipdir_rules(void **state)
{
    (void)state;
    zentry e[2] = {{"a/x", "hello", 5, 0}, {"a/y", "world!", 6, 0}};
    buf img = {0};
    zip_build(&img, e, 2);
    zip_dir z;
    mem m = {img.b, img.n};
    assert_int_equal(zipdir_read(&z, "z.zip", mem_read, &m, img.n), 0);
    const zip_entry *x;
    assert_int_equal(zipdir_find_stored(&z, "z.zip", "a/y", &x), 0);
    assert_memory_equal(img.b + x->data_offset, "world!", 6);
    assert_int_equal(zipdir_find_stored(&z, "z.zip", "a/q", &x), CKPT_ENOTFOUND);
    zipdir_free(&z);

    /* overlap: the first entry's sizes grown (local and central) into the second */
    buf bad = {0};
    put(&bad, img.b, img.n);
    size_t cd = img.n - 22 - 2 * (46 + 3);
    bad.b[18] = bad.b[22] = 9; /* local sizes of a/x */
    bad.b[cd + 20] = bad.b[cd + 24] = 9;
    m = (mem){bad.b, bad.n};
    expect_error(zipdir_read(&z, "z.zip", mem_read, &m, bad.n), CKPT_EINVAL, "entry 'a/x' overlaps entry 'a/y'");
    /* lying: central says more than local */
    memcpy(bad.b, img.b, img.n);
    bad.b[cd + 20] = bad.b[cd + 24] = 4;
    expect_error(zipdir_read(&z, "z.zip", mem_read, &m, bad.n), CKPT_EINVAL, "local header says 5 bytes");
    /* escaping: a local header offset beyond the data */
    memcpy(bad.b, img.b, img.n);
    bad.b[cd + 42] = 0xF0;
    expect_error(zipdir_read(&z, "z.zip", mem_read, &m, bad.n), CKPT_EINVAL, "is outside the archive");
    /* a comment that does not run to the end: no EOCD */
    memcpy(bad.b, img.b, img.n);
    bad.b[img.n - 2] = 1;
    expect_error(zipdir_read(&z, "z.zip", mem_read, &m, bad.n), CKPT_EINVAL, "no end-of-central-directory record");
    /* the same name twice */
    zentry dup[2] = {{"a/x", "hello", 5, 0}, {"a/x", "world!", 6, 0}};
    buf d = {0};
    zip_build(&d, dup, 2);
    m = (mem){d.b, d.n};
    expect_error(zipdir_read(&z, "z.zip", mem_read, &m, d.n), CKPT_EINVAL, "entry 'a/x' appears twice");
    free(d.b);
    free(bad.b);
    free(img.b);
}

/* ---- legacy ---- */

static void legacy_image(buf *o, uint64_t numel_field)
{
    put(o, "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
    put(o, "\x80\x02M\xe9\x03.", 6);
    put(o, "\x80\x02}(", 4);
    p_str(o, "little_endian");
    put(o, "\x88u.", 3);
    p_state_dict(o, true);
    put(o, "\x80\x02](", 4);
    p_str(o, "0");
    put(o, "e.", 2);
    put64(o, numel_field);
    put(o, DATA, sizeof DATA);
}

static void test_torch_legacy(void **state)
{
    (void)state;
    buf img = {0};
    legacy_image(&img, 4);
    st_file f;
    assert_int_equal(parse_image(&f, &img), 0);
    const st_tensor *t = st_find(&f, "w");
    assert_non_null(t);
    assert_int_equal(t->offset, img.n - 16);
    assert_string_equal(st_meta_get(&f, "w_tied"), "w");
    st_close(&f);
    img.n = 0;
    legacy_image(&img, 5);
    expect_error(parse_image(&f, &img), CKPT_EINVAL, "legacy storage '0' says 5 elements, the pickle 4");
    img.n = 0;
    legacy_image(&img, 4);
    img.n -= 4; /* storage cut short */
    expect_error(parse_image(&f, &img), CKPT_EINVAL, "runs past the end of the file");
    free(img.b);
    /* a pickle without the magic number is no torch file */
    buf p = {0};
    p_state_dict(&p, true);
    expect_error(parse_image(&f, &p), CKPT_EINVAL, "not a torch.save file");
    free(p.b);
}

/* Flipped bytes anywhere: an error or a table, never a crash (ASan). */
static void test_torch_mutations(void **state)
{
    (void)state;
    buf pkl = {0}, img = {0}, leg = {0};
    p_state_dict(&pkl, false);
    torch_zip(&img, &pkl, sizeof DATA, 0, "little");
    legacy_image(&leg, 4);
    buf *imgs[] = {&img, &leg};
    uint32_t seed = 16;
    for (size_t k = 0; k < 2; k++) {
        uint8_t *copy = malloc(imgs[k]->n);
        for (int iter = 0; iter < 4000; iter++) {
            memcpy(copy, imgs[k]->b, imgs[k]->n);
            for (int flips = 0; flips < 1 + iter % 3; flips++) {
                seed = seed * 1103515245u + 12345u;
                copy[(seed >> 8) % imgs[k]->n] ^= (uint8_t)(1u << ((seed >> 4) % 8));
            }
            buf b = {copy, imgs[k]->n, 0};
            st_file f;
            if (parse_image(&f, &b) == 0) {
                for (size_t i = 0; i < f.ntensors; i++) assert_true(f.tensors[i].offset + f.tensors[i].nbytes <= b.n);
                st_close(&f);
            }
        }
        free(copy);
    }
    free(pkl.b);
    free(img.b);
    free(leg.b);
}

/* A transposed view: read as its block with an axis map; only the views
 * opener (convert, inspect) accepts it. */
static void test_torch_transposed_view(void **state)
{
    (void)state;
    int size[] = {2, 2}, stride[] = {1, 2};
    buf p = {0}, img = {0};
    put(&p, "\x80\x02}(", 4);
    p_str(&p, "lm_head.weight");
    p_tensor(&p, "0", 4, 0, 2, size, stride, false);
    put(&p, "u.", 2);
    torch_zip(&img, &p, sizeof DATA, 0, NULL);
    st_file f;
    assert_int_equal(parse_image(&f, &img), 0);
    const st_tensor *t = st_find(&f, "lm_head.weight");
    assert_non_null(t);
    assert_true(t->view);
    assert_int_equal(t->view_axes[0], 1);
    assert_int_equal(t->view_axes[1], 0);
    assert_int_equal(t->nbytes, 16);
    st_close(&f);

    char path[] = "/tmp/test_torch_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, img.b, img.n), (ssize_t)img.n);
    close(fd);
    ckpt_checkpoint c;
    expect_error(ckpt_checkpoint_open(&c, path), CKPT_EINVAL, "tensor 'lm_head.weight' is a transposed (permuted) view");
    assert_int_equal(ckpt_checkpoint_open_views(&c, path), 0);
    assert_int_equal(c.ntensors, 1);
    ckpt_checkpoint_close(&c);
    unlink(path);
    free(p.b);
    free(img.b);
}

/* torch_write.h: a state dict of 12 tensors (keys "10", "11" sort before
 * "2": storages in torch's order), every storage type, a scalar and an empty
 * tensor, written to a file and read back by the reader: the same names,
 * dtypes, shapes and bytes, every storage 64-byte aligned, every CRC right
 * (the reader checks data.pkl's; zipdir's entries are compared here). */
static void test_torch_write_round_trip(void **state)
{
    (void)state;
    static const ckpt_dtype dts[] = {CKPT_DT_F32, CKPT_DT_BF16, CKPT_DT_F16, CKPT_DT_F64, CKPT_DT_I64, CKPT_DT_I32,
                                     CKPT_DT_I16, CKPT_DT_I8, CKPT_DT_U8, CKPT_DT_BOOL, CKPT_DT_F32, CKPT_DT_BF16};
    torch_out_tensor t[12];
    char names[12][32];
    for (int i = 0; i < 12; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.w", i);
        t[i] = (torch_out_tensor){.name = names[i], .dtype = dts[i], .ndim = 2, .shape = {3, (uint64_t)i + 1}};
        if (i == 10) t[i].ndim = 0; /* a scalar */
        if (i == 11) t[i].shape[1] = 0; /* empty */
        assert_int_equal(ckpt_dtype_nbytes(t[i].dtype, t[i].ndim, t[i].shape, &t[i].nbytes), 0);
    }
    torch_out o;
    assert_int_equal(torch_out_plan(&o, "pytorch_model", t, 12), 0);
    const char *base = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/ckpt-test-torch-write-XXXXXX", base && *base ? base : "/tmp");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)o.file_size), 0);
    for (int i = 0; i < 12; i++) {
        assert_int_equal(o.t[i].offset % TORCH_OUT_ALIGN, 0);
        uint8_t *b = malloc(o.t[i].nbytes + 1);
        for (uint64_t k = 0; k < o.t[i].nbytes; k++) b[k] = dts[i] == CKPT_DT_BOOL ? k & 1 : (uint8_t)(i * 16 + k);
        assert_int_equal(pwrite(fd, b, o.t[i].nbytes, (off_t)o.t[i].offset), (ssize_t)o.t[i].nbytes);
        free(b);
    }
    assert_int_equal(torch_out_finish(&o, fd, path), 0);
    close(fd);
    st_file f;
    assert_int_equal(torch_open(&f, path), 0);
    assert_int_equal(f.ntensors, 12);
    for (int i = 0; i < 12; i++) {
        const st_tensor *r = st_find(&f, names[i]);
        assert_non_null(r);
        assert_int_equal(r->dtype, dts[i]);
        assert_int_equal(r->ndim, t[i].ndim);
        for (int k = 0; k < t[i].ndim; k++) assert_int_equal(r->shape[k], t[i].shape[k]);
        if (r->nbytes) assert_int_equal(r->offset, o.t[i].offset);
        assert_int_equal(r->nbytes, t[i].nbytes);
    }
    st_close(&f);
    /* the directory: entries in torch's order, each CRC equal to its bytes' */
    FILE *fp = fopen(path, "rb");
    uint8_t *img = malloc(o.file_size);
    assert_int_equal(fread(img, 1, o.file_size, fp), o.file_size);
    fclose(fp);
    zip_dir z;
    assert_int_equal(zipdir_read(&z, path, mem_read, &(mem){img, o.file_size}, o.file_size), 0);
    assert_int_equal(z.n, 15);
    assert_string_equal(z.e[0].name, "pytorch_model/data.pkl");
    assert_string_equal(z.e[1].name, "pytorch_model/byteorder");
    assert_string_equal(z.e[2].name, "pytorch_model/data/0");
    assert_string_equal(z.e[3].name, "pytorch_model/data/1");
    assert_string_equal(z.e[4].name, "pytorch_model/data/10");
    assert_string_equal(z.e[6].name, "pytorch_model/data/2");
    assert_string_equal(z.e[14].name, "pytorch_model/version");
    for (size_t i = 0; i < z.n; i++) {
        assert_int_equal(z.e[i].method, 0);
        assert_int_equal(z.e[i].data_offset % TORCH_OUT_ALIGN, 0);
        assert_int_equal(zipdir_crc32(0, img + z.e[i].data_offset, z.e[i].size), z.e[i].crc32);
    }
    zipdir_free(&z);
    free(img);
    torch_out_free(&o);
    unlink(path);
    /* a dtype torch has no storage type for */
    torch_out_tensor bad = {.name = "u", .dtype = CKPT_DT_U32, .ndim = 1, .shape = {2}, .nbytes = 8};
    assert_int_not_equal(torch_out_plan(&o, NULL, &bad, 1), 0);
    assert_non_null(strstr(ckpt_error_last(), "tensor 'u': torch has no storage type for U32"));
}

/* torch_parse_tree: a torch optimizer's state_dict, {"state": {0: {"exp_avg":
 * tensor, "step": 7}, 1: {"exp_avg": tensor}}, "param_groups": [{"params":
 * [0, 1]}]}: the tensors at any depth named by their joined keys, the rest
 * left in the pickle; a key holding '.' (names would collide) refused. */
static void p_optim(buf *o, const char *slot_key)
{
    int two[] = {2}, one[] = {1};
    put(o, "\x80\x02", 2);
    put8(o, '}');
    put8(o, '(');
    p_str(o, "state");
    put8(o, '}');
    put8(o, '(');
    p_int(o, 0);
    put8(o, '}');
    put8(o, '(');
    p_str(o, slot_key);
    p_tensor(o, "0", 4, 0, 1, two, one, false);
    p_str(o, "step");
    p_int(o, 7);
    put8(o, 'u');
    p_int(o, 1);
    put8(o, '}');
    put8(o, '(');
    p_str(o, "exp_avg");
    p_tensor(o, "0", 4, 2, 1, two, one, false);
    put8(o, 'u');
    put8(o, 'u');
    p_str(o, "param_groups");
    put8(o, ']');
    put8(o, '}');
    put8(o, '(');
    p_str(o, "params");
    put8(o, ']');
    put8(o, '(');
    p_int(o, 0);
    p_int(o, 1);
    put8(o, 'e');
    put8(o, 'u');
    put8(o, 'a');
    put8(o, 'u');
    put8(o, '.');
}

static void test_torch_tree(void **state)
{
    (void)state;
    buf pkl = {0}, img = {0};
    p_optim(&pkl, "exp_avg");
    torch_zip(&img, &pkl, sizeof DATA, 0, "little");
    mem m = {img.b, img.n};
    st_file f;
    pk_doc doc;
    assert_int_equal(torch_parse_tree(&f, &doc, "img.bin", mem_read, &m, img.n), 0);
    assert_int_equal(f.ntensors, 2);
    const st_tensor *a = st_find(&f, "state.0.exp_avg"), *b = st_find(&f, "state.1.exp_avg");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(b->offset, a->offset + 8); /* storage offset 2 floats */
    assert_memory_equal(img.b + b->offset, (const uint8_t *)DATA + 8, 8);
    const pk_node *root = pk_at(&doc, doc.root), *groups = pk_dict_get(&doc, root, "param_groups");
    assert_non_null(groups);
    assert_int_equal(groups->kind, PK_LIST);
    const pk_node *st0 = pk_dict_get(&doc, root, "state");
    assert_non_null(st0);
    assert_int_equal(st0->n, 4); /* two entries */
    st_close(&f);
    pk_free(&doc);
    free(pkl.b);
    free(img.b);
    pkl = (buf){0};
    img = (buf){0};
    p_optim(&pkl, "exp.avg");
    torch_zip(&img, &pkl, sizeof DATA, 0, "little");
    m = (mem){img.b, img.n};
    expect_error(torch_parse_tree(&f, &doc, "img.bin", mem_read, &m, img.n), CKPT_EINVAL,
                 "a key under 'state.0' that is neither a name without '.' nor an index");
    assert_null(doc.nodes);
    free(pkl.b);
    free(img.b);
}

static void test_sniff(void **state)
{
    (void)state;
    assert_string_equal(torch_sniff((const uint8_t *)"PK\x03\x04\x14\0\0\0\0\0", 10), "zip");
    assert_null(torch_sniff((const uint8_t *)"PK\x03\x04\0\0\0\0{\"", 10)); /* a safetensors length */
    assert_null(torch_sniff((const uint8_t *)"\x80\x02\0\0\0\0\0\0{\"", 10));  /* likewise */
    assert_string_equal(torch_sniff((const uint8_t *)"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 14), "legacy");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pickle_plain_values), cmocka_unit_test(test_pickle_calls_are_recorded),
        cmocka_unit_test(test_pickle_refusals),     cmocka_unit_test(test_pickle_reduce_record),     cmocka_unit_test(test_torch_zip_state_dict),
        cmocka_unit_test(test_torch_zip_refusals),  cmocka_unit_test(test_zipdir_rules),
        cmocka_unit_test(test_torch_legacy),        cmocka_unit_test(test_torch_mutations),
        cmocka_unit_test(test_sniff),               cmocka_unit_test(test_torch_transposed_view),
        cmocka_unit_test(test_torch_zip64),         cmocka_unit_test(test_torch_write_round_trip), cmocka_unit_test(test_torch_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
