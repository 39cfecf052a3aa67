/*
 * fuzz_rebuild.c — libFuzzer harness for the store's file rebuild: the code
 * pull, serve, verify and state export use to plan a stored safetensors file
 * from its stored header (store/rebuild.c), then the executor's random
 * access reads over that plan (what `ckpt serve` answers a GET with).
 *
 * The input is a whole safetensors file. Its header is the stored header; a
 * tensor is stored as a blob unless __metadata__ holds "recipe.<name>": then
 * that JSON is its recipe (parts over blobs and zeros), as a converted
 * layout's catalog rows are. Every blob reads the input's data section. A
 * header the store would refuse must end in an error, never a crash; for an
 * accepted one the first bytes of every tensor are read.
 */
#include "common/util.h"
#include "store/rebuild.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BLOB "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define READ_MAX 4096

typedef struct {
    st_file f;
    char key[ST_MAX_NAME + 16];
} fuzz_ctx;

static char *blob_path(void *ctx, const char *sha256)
{
    (void)ctx;
    return ckpt_sprintf("blobs/%s", sha256);
}

static int lookup(void *ctx, const char *path, const char *name, const char **blob, const char **recipe)
{
    fuzz_ctx *fc = ctx;
    (void)path;
    snprintf(fc->key, sizeof fc->key, "recipe.%s", name);
    *recipe = st_meta_get(&fc->f, fc->key);
    *blob = *recipe ? NULL : BLOB;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t *slab, *band, out[READ_MAX];
    static int blob_fd = -1;
    if (!slab) {
        slab = malloc(EXEC_READ_SLAB_BYTES);
        band = malloc(EXEC_BAND_BYTES);
        blob_fd = memfd_create("blob", 0);
        if (!slab || !band || blob_fd < 0) abort();
    }
    fuzz_ctx fc;
    if (st_parse(&fc.f, "fuzz.safetensors", data, size, size)) return 0;
    size_t header_len = (size_t)fc.f.data_start;
    /* Every blob is the data section. */
    if (ftruncate(blob_fd, 0) || pwrite(blob_fd, data + header_len, size - header_len, 0) != (ssize_t)(size - header_len))
        abort();

    exec_plan ep;
    memset(&ep, 0, sizeof ep);
    ep.files = calloc(1, sizeof *ep.files);
    plan_tensor *pts = calloc(fc.f.ntensors + 1, sizeof *pts);
    if (!ep.files || !pts) abort();
    size_t npt = 0;
    ep.nfiles = 1;
    rebuild_ctx rb = {.exec = &ep, .tensors = pts, .ntensors = &npt, .blob_path = blob_path, .lookup = lookup, .ctx = &fc};
    int rc = rebuild_plan_file(&rb, "fuzz.safetensors", "fuzz.safetensors", data, header_len, size, &ep.files[0]);
    if (!rc) {
        bool short_blob = false;
        int *fds = calloc(ep.nsrc_paths + 1, sizeof *fds);
        if (!fds) abort();
        for (size_t i = 0; i < ep.nsrc_paths; i++) fds[i] = blob_fd;
        /* As store_file_open does: blobs shorter than their recipes read are an error. */
        if (exec_check_sources(&ep, fds)) short_blob = true;
        exec_slab_cache cache;
        memset(&cache, 0, sizeof cache);
        const st_layout *l = &ep.files[0].layout;
        for (size_t i = 0; !short_blob && i < l->ntensors; i++) {
            const st_out_tensor *ot = &l->tensors[i];
            size_t n = ot->nbytes < READ_MAX ? (size_t)ot->nbytes : READ_MAX;
            if (n) (void)exec_tensor_read(&ep, fds, ep.files[0].tensors[ot->user], 0, out, n, slab, band, &cache);
        }
        free(fds);
    }
    for (size_t i = 0; i < npt; i++) plan_tensor_free(&pts[i]);
    free(pts);
    exec_plan_free(&ep);
    st_close(&fc.f);
    return 0;
}
