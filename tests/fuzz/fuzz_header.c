/*
 * fuzz_header.c — libFuzzer harness for the safetensors header validator.
 *
 * The input is a whole file (buf = data, len = file_size = size). st_parse must
 * either reject it with an error or accept a header that really obeys
 * docs/safetensors.md; on acceptance the harness re-checks its invariants itself and
 * aborts if st_parse let anything through. Sanitizers catch the rest.
 */
#include "format/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) abort();                                                                      \
    } while (0)

static void check_accepted(const st_file *f, size_t size)
{
    REQUIRE(f->file_size == size);
    REQUIRE(f->header_len <= ST_MAX_HEADER);
    REQUIRE(f->data_start == 8 + f->header_len);
    REQUIRE(f->ntensors <= ST_MAX_TENSORS);
    uint64_t expect_begin = 0;
    for (size_t i = 0; i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        REQUIRE(t->name != NULL);
        REQUIRE(strcmp(t->name, "__metadata__") != 0);
        REQUIRE(t->ndim >= 0 && t->ndim <= CKPT_MAX_RANK);
        REQUIRE((unsigned)t->dtype < CKPT_DT_COUNT);
        REQUIRE(t->begin == expect_begin); /* no gaps, no overlaps */
        REQUIRE(t->end >= t->begin);
        REQUIRE(t->nbytes == t->end - t->begin);
        REQUIRE(t->offset == f->data_start + t->begin);
        uint64_t nbytes;
        REQUIRE(ckpt_dtype_nbytes(t->dtype, t->ndim, t->shape, &nbytes) == 0);
        REQUIRE(nbytes == t->nbytes);
        REQUIRE(st_find(f, t->name) == t); /* names are unique and findable */
        expect_begin = t->end;
    }
    REQUIRE(f->data_start + expect_begin == size); /* no trailing bytes */
    for (size_t i = 0; i < f->nmeta; i++) {
        REQUIRE(f->meta_keys[i] != NULL && f->meta_vals[i] != NULL);
        REQUIRE(st_meta_get(f, f->meta_keys[i]) != NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file f;
    if (st_parse(&f, "fuzz.safetensors", data, size, size) == 0) {
        check_accepted(&f, size);
        st_close(&f);
    }
    return 0;
}
