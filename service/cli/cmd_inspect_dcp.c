/*
 * cmd_inspect_dcp.c — `ckpt inspect DIR` of a PyTorch Distributed Checkpoint
 * folder (format/dcp.h, docs/torch.md): every tensor with its global shape,
 * dtype and chunks (offsets, sizes, file, byte offset of its bytes), the
 * bytes entries as such, and which entries are optimizer state (optim.*),
 * which `ckpt consolidate` leaves out. Everything is validated first: every
 * chunk's torch.save is parsed and checked against the metadata.
 */
#include "service/cli/cli.h"

#include "common/error.h"
#include "common/util.h"
#include "format/dcp.h"
#include "plan/plan.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *dims_json(int n, const uint64_t *d)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer((json_int_t)d[i]));
    return a;
}

static bool is_optim(const char *fqn)
{
    const char *k = dcp_non_model_kind(fqn);
    return k && !strcmp(k, "optimizer state");
}

static int cmp_natural(const void *a, const void *b, void *ctx)
{
    const dcp_ckpt *c = ctx;
    return plan_name_cmp(c->entries[*(const size_t *)a].fqn, c->entries[*(const size_t *)b].fqn);
}

static int print_json(const dcp_ckpt *c, const size_t *order)
{
    json_t *files = json_array(), *tensors = json_array(), *bytes = json_array();
    for (size_t f = 0; files && f < c->nfiles; f++)
        json_array_append_new(files, json_pack("{s:s, s:I}", "path", c->files[f].name, "size", (json_int_t)c->files[f].size));
    size_t noptim = 0;
    for (size_t i = 0; tensors && bytes && i < c->nentries; i++) {
        const dcp_entry *e = &c->entries[order[i]];
        noptim += is_optim(e->fqn);
        if (e->is_bytes) {
            json_array_append_new(bytes, json_pack("{s:s, s:s, s:I, s:I, s:b, s:s?}", "name", e->fqn, "file", c->files[e->file].name,
                                                   "offset", (json_int_t)e->item_off, "nbytes", (json_int_t)e->item_len,
                                                   "optimizer", is_optim(e->fqn), "left_out", dcp_non_model_kind(e->fqn)));
            continue;
        }
        json_t *chunks = json_array();
        for (size_t k = 0; chunks && k < e->nchunks; k++) {
            const dcp_chunk *ch = &e->chunks[k];
            json_t *j = json_pack("{s:o, s:o, s:s, s:I, s:I}", "offsets", dims_json(e->ndim, ch->offsets), "sizes",
                                  dims_json(e->ndim, ch->sizes), "file", c->files[ch->file].name, "offset",
                                  (json_int_t)ch->data_off, "nbytes", (json_int_t)ch->nbytes);
            if (j && ch->view) { /* which stored axis each axis walks */
                json_t *ax = json_array();
                for (int d = 0; ax && d < e->ndim; d++) json_array_append_new(ax, json_integer(ch->axes[d]));
                json_object_set_new(j, "view_axes", ax);
            }
            json_array_append_new(chunks, j);
        }
        json_array_append_new(tensors, json_pack("{s:s, s:s, s:o, s:I, s:b, s:s?, s:o}", "name", e->fqn, "dtype",
                                                 ckpt_dtype_name(e->dtype), "shape", dims_json(e->ndim, e->shape), "nbytes",
                                                 (json_int_t)e->nbytes, "optimizer", is_optim(e->fqn), "left_out",
                                                 dcp_non_model_kind(e->fqn), "chunks", chunks));
    }
    json_t *doc = json_pack("{s:s, s:s, s:o, s:o, s:o, s:I, s:I, s:I}", "format", "torch-dcp", "path", c->dir, "files", files,
                            "tensors", tensors, "bytes", bytes, "total_bytes", (json_int_t)c->total_bytes, "nchunks",
                            (json_int_t)c->nchunks, "optimizer_entries", (json_int_t)noptim);
    return cli_print_json(doc);
}

static void dims_str(int n, const uint64_t *d, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? ", " : "", (unsigned long long)d[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static int print_text(const dcp_ckpt *c, const size_t *order)
{
    char shape[CKPT_MAX_RANK * 24 + 4], sizes[CKPT_MAX_RANK * 24 + 4], h[32], *owned = NULL, *owned2 = NULL;
    size_t ntensors = 0, nbytes = 0, noptim = 0, ntrain = 0;
    int w = 4;
    for (size_t i = 0; i < c->nentries; i++) {
        const dcp_entry *e = &c->entries[i];
        e->is_bytes ? nbytes++ : ntensors++;
        noptim += is_optim(e->fqn);
        ntrain += !e->is_bytes && dcp_non_model_kind(e->fqn) && !is_optim(e->fqn);
        int n = (int)strlen(e->fqn);
        w = n > w ? (n > 90 ? 90 : n) : w;
    }
    printf("PyTorch DCP checkpoint %s: %zu tensors in %zu chunks, %zu bytes entries, %zu files, %s of tensors\n",
           cli_printable(c->dir, &owned), ntensors, c->nchunks, nbytes, c->nfiles, ckpt_format_size(c->total_bytes, h, sizeof h));
    free(owned);
    printf("%-*s  %-5s  %-20s  %10s  %s\n", w, "name", "dtype", "shape", "size", "chunks: offsets + sizes  file @ byte");
    for (size_t i = 0; i < c->nentries; i++) {
        const dcp_entry *e = &c->entries[order[i]];
        const char *name = cli_printable(e->fqn, &owned);
        if (e->is_bytes) {
            printf("%-*s  %-5s  %-20s  %10s  %s @ %llu\n", w, name, "bytes", "-", ckpt_format_size(e->item_len, h, sizeof h),
                   cli_printable(c->files[e->file].name, &owned2), (unsigned long long)e->item_off);
            free(owned);
            free(owned2);
            continue;
        }
        dims_str(e->ndim, e->shape, shape, sizeof shape);
        printf("%-*s  %-5s  %-20s  %10s  %zu chunk%s\n", w, name, ckpt_dtype_name(e->dtype), shape,
               ckpt_format_size(e->nbytes, h, sizeof h), e->nchunks, e->nchunks == 1 ? "" : "s");
        free(owned);
        for (size_t k = 0; k < e->nchunks; k++) {
            const dcp_chunk *ch = &e->chunks[k];
            dims_str(e->ndim, ch->offsets, shape, sizeof shape);
            dims_str(e->ndim, ch->sizes, sizes, sizeof sizes);
            printf("    %s + %s  %s @ %llu%s\n", shape, sizes, cli_printable(c->files[ch->file].name, &owned2),
                   (unsigned long long)ch->data_off, ch->view ? " (a permuted view: copied through the plan)" : "");
            free(owned2);
        }
    }
    if (noptim)
        printf("%zu optim.* / optimizer.* entries are optimizer state: `ckpt consolidate` writes the model without them\n", noptim);
    if (ntrain)
        printf("%zu lr_scheduler.* / train_state.* / dataloader.* tensors are training state: `ckpt consolidate` leaves them out\n",
               ntrain);
    if (nbytes) printf("%zu bytes entries (pickled Python values) are listed only: `ckpt consolidate` skips them\n", nbytes);
    return fflush(stdout) ? ckpt_error_sys("stdout") : 0;
}

int cli_inspect_dcp(const char *path, bool as_json)
{
    dcp_ckpt c;
    if (dcp_open(&c, path) < 0) return cli_fail();
    size_t *order = ckpt_calloc(c.nentries + 1, sizeof *order);
    int rc = order ? 0 : CKPT_ENOMEM;
    if (!rc) {
        for (size_t i = 0; i < c.nentries; i++) order[i] = i;
        qsort_r(order, c.nentries, sizeof *order, cmp_natural, &c);
        rc = as_json ? print_json(&c, order) : print_text(&c, order);
    }
    free(order);
    dcp_close(&c);
    return rc < 0 ? cli_fail() : CLI_OK;
}
