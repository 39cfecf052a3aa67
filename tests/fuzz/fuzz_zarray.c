/*
 * fuzz_zarray.c — libFuzzer harness for the .zarray parser (format/zarr.c).
 *
 * The input is the text of a .zarray, passed with its length and no
 * terminating NUL. An accepted array must be self-consistent: rank within
 * CKPT_MAX_RANK, positive chunks, the chunk grid covering the shape, the
 * chunk and array byte counts equal to products recomputed here without
 * overflow, within the limits, a separator of '.' or '/', and a chunk key
 * that fits for the last grid index.
 */
#include "format/zarr.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond)) abort();                                                                      \
    } while (0)

static void check_accepted(const zarr_array *a)
{
    REQUIRE(a->ndim >= 0 && a->ndim <= CKPT_MAX_RANK);
    REQUIRE(a->esize >= 1 && a->esize <= 8);
    REQUIRE(a->sep == '.' || a->sep == '/');
    unsigned __int128 cn = a->esize, nb = a->esize, nch = 1;
    uint64_t last[CKPT_MAX_RANK];
    for (int d = 0; d < a->ndim; d++) {
        REQUIRE(a->chunks[d] >= 1);
        REQUIRE(a->shape[d] <= ZARR_MAX_DIM && a->chunks[d] <= ZARR_MAX_DIM);
        /* the grid covers the shape, and no chunk lies wholly outside it */
        REQUIRE((unsigned __int128)a->grid[d] * a->chunks[d] >= a->shape[d]);
        REQUIRE(a->grid[d] == 0 || (a->grid[d] - 1) * a->chunks[d] < a->shape[d]);
        cn *= a->chunks[d];
        nb *= a->shape[d];
        nch *= a->grid[d];
        last[d] = a->grid[d] ? a->grid[d] - 1 : 0;
    }
    REQUIRE(cn == a->chunk_nbytes && cn <= ZARR_MAX_CHUNK_BYTES);
    REQUIRE(nb == a->nbytes && nb <= ZARR_MAX_ARRAY_BYTES);
    REQUIRE(nch == a->nchunks && nch <= ZARR_MAX_CHUNKS);
    char key[256];
    REQUIRE(zarr_chunk_key(a, last, key, sizeof key));
    REQUIRE(strstr(key, "..") == NULL && key[0] != '/');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size ? size : 1);
    if (!json) return 0;
    if (size) memcpy(json, data, size);
    zarr_array a;
    if (zarr_parse_meta(&a, "fuzz/.zarray", json, size) == 0) {
        check_accepted(&a);
        zarr_close(&a);
    }
    free(json);
    return 0;
}
