/*
 * fuzz_torch_zip.c — libFuzzer harness for the torch.save reader
 * (format/torch.c over format/zipdir.c and format/pickle.c).
 *
 * The input is a whole file (a zip torch.save, or a legacy one). torch_parse
 * must reject it or return a tensor table that obeys what the planner relies
 * on: every tensor inside the file, its bytes matching dtype x shape, names
 * unique and findable, no two tensors sharing bytes, aliases naming kept
 * tensors. The same input read as nested dicts (torch_parse_tree, what the
 * optimizer files of a neuronx-distributed save are read with) obeys the same
 * rules, its names joined key paths. Sanitizers catch the rest.
 */
#include "tests/fuzz/fuzz_mem.h"
#include "format/torch.h"

#include "common/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(const st_file *f, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mem m = {data, size};
    st_file f;
    pk_doc doc;
    if (torch_parse_tree(&f, &doc, "fuzz.bin", mem_read, &m, size) == 0) {
        REQUIRE(doc.n > 0);
        check(&f, size);
        st_close(&f);
        pk_free(&doc);
    }
    m = (mem){data, size};
    if (torch_parse(&f, "fuzz.bin", mem_read, &m, size) != 0) return 0;
    check(&f, size);
    st_close(&f);
    return 0;
}

static void check(const st_file *f, size_t size)
{
    REQUIRE(f->from_torch && f->file_size == size);
    uint64_t prev_end = 0;
    for (size_t i = 0; i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        uint64_t nbytes;
        REQUIRE(t->ndim >= 0 && t->ndim <= CKPT_MAX_RANK);
        REQUIRE(ckpt_dtype_nbytes(t->dtype, t->ndim, t->shape, &nbytes) == 0 && nbytes == t->nbytes);
        REQUIRE(t->offset <= size && t->nbytes <= size - t->offset);
        REQUIRE(t->nbytes == 0 || t->offset >= prev_end); /* in offset order, sharing no bytes */
        if (t->nbytes) prev_end = t->offset + t->nbytes;
        REQUIRE(st_find(f, t->name) == t);
    }
    for (size_t i = 0; i < f->nmeta; i++) {
        REQUIRE(st_find(f, f->meta_vals[i]) != NULL);
        REQUIRE(st_find(f, f->meta_keys[i]) == NULL);
    }
}
