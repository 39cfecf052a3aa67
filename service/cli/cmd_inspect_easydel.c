/*
 * cmd_inspect_easydel.c — `ckpt inspect DIR` of an EasyDeL / eformer
 * TensorStore checkpoint (format/easydel.h, docs/easydel.md): every array of
 * every prefix (model, tx) with its dtype, shape, chunking, stored
 * (compressed) and raw bytes, and the step. Every .zarray is validated when
 * the checkpoint opens; chunk files are only sized here, not decompressed.
 */
#include "service/cli/cli.h"

#include "common/error.h"
#include "common/util.h"
#include "format/easydel.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_inspect_easydel(const char *path, bool as_json)
{
    easydel_ckpt c;
    if (easydel_open(&c, path) < 0) return cli_fail();
    zarr_stats *st = ckpt_calloc(c.narrays + 1, sizeof *st);
    int rc = st ? 0 : CKPT_ENOMEM;
    uint64_t raw = 0, stored = 0;
    for (size_t i = 0; !rc && i < c.narrays; i++) {
        rc = zarr_stat(&c.arrays[i].z, &st[i]);
        raw += c.arrays[i].z.nbytes;
        stored += st[i].stored_bytes;
    }
    if (rc) goto out;
    if (as_json) {
        json_t *arrays = json_array();
        for (size_t i = 0; arrays && i < c.narrays; i++) {
            const zarr_array *z = &c.arrays[i].z;
            json_array_append_new(
                arrays, json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:s, s:s, s:I, s:I, s:I, s:I}", "path",
                                  c.arrays[i].path, "prefix", c.arrays[i].prefix, "key", c.arrays[i].key, "dtype",
                                  ckpt_dtype_name(z->dtype), "shape", cli_dims_json(z->ndim, z->shape), "chunks",
                                  cli_dims_json(z->ndim, z->chunks), "compressor", z->zstd ? "zstd" : "none",
                                  "dimension_separator", z->sep == '/' ? "/" : ".", "nchunks", (json_int_t)z->nchunks,
                                  "chunks_present", (json_int_t)st[i].chunks_present, "stored_bytes",
                                  (json_int_t)st[i].stored_bytes, "nbytes", (json_int_t)z->nbytes));
        }
        json_t *doc = json_pack("{s:s, s:s?, s:o, s:o, s:I, s:I}", "format", "easydel-tensorstore", "version", c.version,
                                "step", c.has_step ? json_integer(c.step) : json_null(), "arrays", arrays,
                                "stored_bytes", (json_int_t)stored, "total_bytes", (json_int_t)raw);
        easydel_close(&c);
        free(st);
        return cli_print_json(doc);
    }
    int pw = 4;
    for (size_t i = 0; i < c.narrays; i++) {
        int n = (int)strlen(c.arrays[i].path);
        pw = n > pw ? (n > 90 ? 90 : n) : pw;
    }
    char shape[CKPT_MAX_RANK * 24 + 4], chunks[CKPT_MAX_RANK * 24 + 4], h1[32], h2[32];
    printf("EasyDeL TensorStore checkpoint %s, step %s%lld\n", c.dir, c.has_step ? "" : "unknown ",
           c.has_step ? (long long)c.step : 0LL);
    printf("%-*s  %-5s  %-20s  %-20s  %-4s  %10s  %10s\n", pw, "path", "dtype", "shape", "chunks", "comp", "stored", "raw");
    for (size_t i = 0; i < c.narrays; i++) {
        const zarr_array *z = &c.arrays[i].z;
        ckpt_shape_str(z->ndim, z->shape, shape, sizeof shape);
        ckpt_shape_str(z->ndim, z->chunks, chunks, sizeof chunks);
        printf("%-*s  %-5s  %-20s  %-20s  %-4s  %10s  %10s\n", pw, c.arrays[i].path, ckpt_dtype_name(z->dtype), shape,
               chunks, z->zstd ? "zstd" : "none", ckpt_format_size(st[i].stored_bytes, h1, sizeof h1),
               ckpt_format_size(z->nbytes, h2, sizeof h2));
    }
    printf("%zu arrays, %llu bytes stored, %llu bytes raw (%s)\n", c.narrays, (unsigned long long)stored,
           (unsigned long long)raw, ckpt_format_size(raw, h1, sizeof h1));
    rc = fflush(stdout) ? ckpt_error_sys("stdout") : 0;
out:
    free(st);
    easydel_close(&c);
    return rc < 0 ? cli_fail() : CLI_OK;
}
