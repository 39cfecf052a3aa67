/*
 * fuzz_dcp_meta.c — libFuzzer harness for the PyTorch DCP .metadata reader
 * (format/dcp.c over format/pickle.c).
 *
 * The input is a .metadata file. dcp_parse_metadata must reject it or return
 * entries that obey what inspect and consolidate rely on: names unique and
 * sorted, every tensor's chunks inside its shape and covering it exactly with
 * no overlap (checked again here, independently, for small tensors), every
 * file index in range, file names plain (no '/', not hidden). Small pickle
 * inputs reach the limit paths; sanitizers catch the rest.
 */
#include "format/dcp.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) abort();                                                                      \
    } while (0)

/* Every element of a small tensor (elements x chunks <= 65536) is in exactly one chunk. */
static void check_cover(const dcp_entry *e)
{
    uint64_t numel = 1;
    for (int k = 0; k < e->ndim; k++) {
        if (e->shape[k] && numel > 4096 / e->shape[k]) return;
        numel *= e->shape[k];
    }
    if (numel * e->nchunks > (1u << 16)) return;
    for (uint64_t i = 0; i < numel; i++) {
        uint64_t idx[CKPT_MAX_RANK], r = i;
        for (int k = e->ndim - 1; k >= 0; k--) {
            idx[k] = r % e->shape[k];
            r /= e->shape[k];
        }
        int hits = 0;
        for (size_t c = 0; c < e->nchunks; c++) {
            bool in = true;
            for (int k = 0; k < e->ndim && in; k++)
                in = idx[k] >= e->chunks[c].offsets[k] && idx[k] - e->chunks[c].offsets[k] < e->chunks[c].sizes[k];
            hits += in;
        }
        REQUIRE(hits == 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dcp_ckpt c;
    memset(&c, 0, sizeof c);
    if (dcp_parse_metadata(&c, "fuzz/.metadata", data, size) != 0) {
        dcp_close(&c);
        return 0;
    }
    for (size_t f = 0; f < c.nfiles; f++) {
        REQUIRE(c.files[f].name && c.files[f].name[0] && c.files[f].name[0] != '.' && !strchr(c.files[f].name, '/'));
        REQUIRE(f == 0 || strcmp(c.files[f - 1].name, c.files[f].name) < 0);
    }
    size_t chunks = 0;
    for (size_t i = 0; i < c.nentries; i++) {
        const dcp_entry *e = &c.entries[i];
        REQUIRE(i == 0 || strcmp(c.entries[i - 1].fqn, e->fqn) < 0);
        REQUIRE(dcp_find(&c, e->fqn) == e);
        if (e->is_bytes) {
            REQUIRE(e->file < c.nfiles && e->nchunks == 0);
            continue;
        }
        uint64_t nbytes;
        REQUIRE(e->ndim >= 0 && e->ndim <= CKPT_MAX_RANK);
        REQUIRE(ckpt_dtype_nbytes(e->dtype, e->ndim, e->shape, &nbytes) == 0 && nbytes == e->nbytes);
        for (size_t k = 0; k < e->nchunks; k++) {
            REQUIRE(e->chunks[k].file < c.nfiles);
            for (int d = 0; d < e->ndim; d++)
                REQUIRE(e->chunks[k].offsets[d] <= e->shape[d] && e->chunks[k].sizes[d] <= e->shape[d] - e->chunks[k].offsets[d]);
        }
        chunks += e->nchunks;
        check_cover(e);
    }
    REQUIRE(chunks == c.nchunks);
    dcp_close(&c);
    return 0;
}
