/* store_lora.c — merge-lora inside the store: new blobs for merged weights only (see store_lora.h).
 */
#include "store/store_lora.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "lora/lora.h"
#include "store/materialize.h"
#include "store/store_convert.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HASH_CHUNK (8u << 20)

typedef struct {
    ckpt_store *s;
    const store_lora_opts *o;
    store_ckpt base;
    store_file_row *rows;
    size_t nrows;
    store_tensor_blobs stored; /* the base's tensor blobs */
    ckpt_checkpoint ck; /* the base, from its stored headers */
    json_t *config;
    char *index_text;
    const char *index_name; /* points into rows */
    char (*hashes)[65];
    lora_adapter ad;
    char *adapter_tmp; /* a stored adapter, materialized */
    char **merged;     /* per adapter module: the merged weight's blob */
    char *repo;        /* the merged checkpoint's repo */
} lora_job;

/* ---- the adapter ---- */

static int open_adapter(lora_job *j, const char *adapter)
{
    if (adapter[0] == '/') return lora_adapter_open(&j->ad, adapter);
    store_ckpt c;
    int rc = store_resolve(j->s, adapter, &c);
    if (rc) return ckpt_error_prefix(rc, "adapter");
    char *base = store_tmp_base(j->s, "lora");
    j->adapter_tmp = base ? ckpt_sprintf("%s-adapter", base) : NULL;
    free(base);
    materialize_opts mo = {.rank = -1, .quiet = true, .threads = j->o->threads};
    rc = j->adapter_tmp ? store_materialize(j->s, &c, j->adapter_tmp, &mo) : CKPT_ENOMEM;
    store_ckpt_free(&c);
    return rc ? rc : lora_adapter_open(&j->ad, j->adapter_tmp);
}

/* sha256 of "ckpt-merge-lora 1", each adapter file's name and sha256, the
 * scale and the direction: what the merged checkpoint's name says. */
static int adapter_identity(lora_job *j, char out[65])
{
    const lora_adapter *ad = &j->ad;
    ckpt_sha256 h;
    int rc = ckpt_sha256_init(&h);
    if (rc) return rc;
    rc = ckpt_sha256_update(&h, "ckpt-merge-lora 1\n", 18);
    size_t nfiles = 1 + ad->ck.nfiles;
    for (size_t i = 0; !rc && i < nfiles; i++) {
        char *path = i == 0 ? ckpt_path_join(ad->dir, LORA_CONFIG_FILE)
                            : ckpt_strdup(ad->ck.files[i - 1].path);
        char hex[65];
        rc = path ? ckpt_sha256_file_hex(path, hex) : CKPT_ENOMEM;
        const char *name = path ? ckpt_basename(path) : "";
        if (!rc) rc = ckpt_sha256_update(&h, name, strlen(name) + 1);
        if (!rc) rc = ckpt_sha256_update(&h, hex, 64);
        free(path);
    }
    char tail[96];
    int n = snprintf(tail, sizeof tail, "\nscale %.17g unmerge %d\n",
                     j->o->scale != 0 ? j->o->scale : 1.0, (int)j->o->unmerge);
    if (!rc) rc = ckpt_sha256_update(&h, tail, (size_t)n);
    if (rc) {
        ckpt_sha256_free(&h);
        return rc;
    }
    return ckpt_sha256_final_hex(&h, out);
}

/* ---- merging into blobs ---- */

static const ckpt_tensor_ref *module_weight(const lora_job *j, const lora_module *m)
{
    char *w = ckpt_sprintf("%s.weight", m->module);
    const ckpt_tensor_ref *ref = w ? ckpt_checkpoint_find(&j->ck, w) : NULL;
    free(w);
    return ref;
}

static int blob_fd(ckpt_store *s, const char *blob, int *fd)
{
    char *path = store_blob_read_path(s, blob);
    if (!path) return CKPT_ENOMEM;
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = *fd < 0 ? ckpt_error_sys("%s: open blob", path) : 0;
    free(path);
    return rc;
}

/* Modules [m0, m1): each weight merged from its base blob into a new blob,
 * hashed and published. */
static int merge_batch(lora_job *j, size_t m0, size_t m1, uint64_t *bytes)
{
    size_t n = m1 - m0;
    store_blob_writer *ws = ckpt_calloc(n + 1, sizeof *ws);
    lora_merge_target *t = ckpt_calloc(n + 1, sizeof *t);
    int *src = ckpt_calloc(n + 1, sizeof *src);
    int rc = ws && t && src ? 0 : CKPT_ENOMEM;
    size_t nw = 0;
    for (size_t k = 0; src && k < n; k++)
        src[k] = -1;
    for (size_t k = 0; !rc && k < n; k++) {
        const lora_module *m = &j->ad.mods[m0 + k];
        const ckpt_tensor_ref *ref = module_weight(j, m);
        char *blob = NULL;
        rc = store_tensor_blobs_get(&j->stored, j->ck.files[ref->file].path, ref->t->name, &blob);
        if (!rc) rc = blob_fd(j->s, blob, &src[k]);
        free(blob);
        if (!rc && !(rc = store_blob_begin(j->s, &ws[k]))) nw++;
        t[k] = (lora_merge_target){.m = m,
                                   .dtype = ref->t->dtype,
                                   .rows = ref->t->shape[0],
                                   .cols = ref->t->shape[1],
                                   .src_fd = src[k],
                                   .src_path = ref->t->name,
                                   .dst_fd = ws[k].fd,
                                   .dst_path = ws[k].tmp_path};
    }
    lora_merge_opts mo = {
        .scale = j->o->scale, .unmerge = j->o->unmerge, .threads = j->o->threads, .quiet = true};
    lora_merge_stats st;
    if (!rc) rc = lora_merge_targets(&j->ad, t, n, &mo, &st);
    for (size_t k = 0; src && k < n; k++)
        if (src[k] >= 0) close(src[k]);
    for (size_t k = 0; !rc && k < n; k++) {
        const ckpt_tensor_ref *ref = module_weight(j, &j->ad.mods[m0 + k]);
        char hex[65];
        rc = ckpt_sha256_file_hex(ws[k].tmp_path, hex);
        if (!rc) rc = store_blob_end_external(&ws[k], ref->t->nbytes, hex);
        if (!rc && !(j->merged[m0 + k] = ckpt_strdup(hex))) rc = CKPT_ENOMEM;
        *bytes += ref->t->nbytes;
    }
    if (!rc)
        rc = store_blobs_publish(j->s, ws, nw);
    else
        for (size_t k = 0; k < nw; k++)
            store_blob_abort(&ws[k]);
    free(ws);
    free(t);
    free(src);
    return rc;
}

static int merge_all(lora_job *j, uint64_t *bytes)
{
    j->merged = ckpt_calloc(j->ad.nmods + 1, sizeof *j->merged);
    if (!j->merged) return CKPT_ENOMEM;
    uint64_t total = 0;
    for (size_t i = 0; i < j->ad.nmods; i++)
        total += module_weight(j, &j->ad.mods[i])->t->nbytes;
    ckpt_progress prog;
    if (!j->o->quiet)
        ckpt_progress_start(&prog, j->o->unmerge ? "unmerge-lora" : "merge-lora", total);
    int rc = 0;
    for (size_t m0 = 0; !rc && m0 < j->ad.nmods; m0 += STORE_LORA_BATCH) {
        size_t m1 = m0 + STORE_LORA_BATCH < j->ad.nmods ? m0 + STORE_LORA_BATCH : j->ad.nmods;
        rc = merge_batch(j, m0, m1, bytes);
        if (!rc && !j->o->quiet) ckpt_progress_update(&prog, *bytes);
    }
    if (!rc && !j->o->quiet) ckpt_progress_finish(&prog);
    return rc;
}

/* The record reuses the base's blobs (untouched tensors, side files): lease
 * them until the commit, so a concurrent rm of the base and gc cannot take
 * them away (the merged tensors' new blobs are leased by their publish). */
static int lease_record_blobs(ckpt_store *s, const store_ckpt_rec *r)
{
    size_t n = 0, cap = 0;
    char **v = NULL;
    int rc = 0;
    for (size_t f = 0; !rc && f < r->nfiles; f++) {
        const store_file_rec *fr = &r->files[f];
        if (fr->blob && !(rc = ckpt_grow(&v, &cap, n + 1, sizeof *v))) v[n++] = fr->blob;
        for (size_t t = 0; !rc && t < fr->ntensors; t++)
            if (fr->tensors[t].blob && !(rc = ckpt_grow(&v, &cap, n + 1, sizeof *v))) v[n++] = fr->tensors[t].blob;
    }
    if (!rc) rc = store_blobs_lease(s, v, n);
    free(v);
    return rc;
}

/* ---- the record ---- */

static const store_file_row *find_row(const lora_job *j, const char *path)
{
    for (size_t i = 0; i < j->nrows; i++)
        if (!strcmp(j->rows[i].path, path)) return &j->rows[i];
    return NULL;
}

/* A stored whole-file row (index, config.json, ...) as it is. */
static int add_plain(store_ckpt_rec *r, const store_file_row *row)
{
    store_file_rec *f = store_convert_rec_add_file(r, row->path);
    if (!f) return CKPT_ENOMEM;
    f->size = row->size;
    memcpy(f->sha256, row->sha256, 65);
    return (f->blob = ckpt_strdup(row->blob)) ? 0 : CKPT_ENOMEM;
}

static int hash_zeros(ckpt_sha256 *h, uint64_t n, const uint8_t *zeros)
{
    int rc = 0;
    for (uint64_t done = 0; !rc && done < n; done += HASH_CHUNK)
        rc = ckpt_sha256_update(h, zeros, n - done < HASH_CHUNK ? (size_t)(n - done) : HASH_CHUNK);
    return rc;
}

/* sha256 of the file header + tensor blobs (in offset order) would assemble. */
static int hash_file(lora_job *j, const st_layout *l, const store_file_rec *fr, uint8_t *buf,
                     char out[65])
{
    ckpt_sha256 h;
    int rc = ckpt_sha256_init(&h);
    if (rc) return rc;
    rc = ckpt_sha256_update(&h, l->header, l->header_len);
    uint64_t pos = l->header_len;
    for (size_t k = 0; !rc && k < l->ntensors; k++) {
        const st_out_tensor *ot = &l->tensors[k];
        if (ot->offset > pos) {
            memset(buf, 0, HASH_CHUNK);
            rc = hash_zeros(&h, ot->offset - pos, buf);
        }
        int fd = -1;
        if (!rc && ot->nbytes) rc = blob_fd(j->s, fr->tensors[k].blob, &fd);
        for (uint64_t done = 0; !rc && done < ot->nbytes;) {
            size_t n = ot->nbytes - done < HASH_CHUNK ? (size_t)(ot->nbytes - done) : HASH_CHUNK;
            rc = ckpt_pread_full(fd, buf, n, done, fr->tensors[k].blob);
            if (!rc) rc = ckpt_sha256_update(&h, buf, n);
            done += n;
        }
        if (fd >= 0) close(fd);
        pos = ot->offset + ot->nbytes;
    }
    if (!rc && l->file_size > pos) {
        memset(buf, 0, HASH_CHUNK);
        rc = hash_zeros(&h, l->file_size - pos, buf);
    }
    if (rc) {
        ckpt_sha256_free(&h);
        return rc;
    }
    return ckpt_sha256_final_hex(&h, out);
}

/* Model file f as merge-lora writes it: the rendered header, merged blobs
 * for adapted weights, the base's blobs for the rest. */
static int add_model_file(lora_job *j, store_ckpt_rec *r, size_t f, uint8_t *buf)
{
    const st_file *sf = &j->ck.files[f];
    const store_file_row *row = find_row(j, sf->path);
    st_layout l;
    int rc = lora_merge_layout(&l, sf);
    if (rc) return rc;
    store_file_rec *fr = row ? store_convert_rec_add_file(r, sf->path) : NULL;
    if (!row)
        rc = ckpt_error_set(CKPT_ECORRUPT, "catalog: no file row for '%s'", sf->path);
    else if (!fr)
        rc = CKPT_ENOMEM;
    bool changed = false;
    if (!rc) {
        fr->size = l.file_size;
        fr->header_len = l.header_len;
        fr->header = ckpt_malloc(l.header_len);
        fr->tensors = ckpt_calloc(l.ntensors + 1, sizeof *fr->tensors);
        if (!fr->header || !fr->tensors)
            rc = CKPT_ENOMEM;
        else
            memcpy(fr->header, l.header, l.header_len);
        changed = l.header_len != row->header_len ||
                  (fr->header && memcmp(l.header, row->header, l.header_len));
    }
    for (size_t k = 0; !rc && k < l.ntensors; k++) {
        const st_tensor *t = &sf->tensors[l.tensors[k].user];
        store_tensor_rec *tr = &fr->tensors[fr->ntensors++];
        size_t n = strlen(t->name);
        const lora_module *m = NULL;
        if (n > 7 && !strcmp(t->name + n - 7, ".weight")) {
            char *mod = ckpt_strndup(t->name, n - 7);
            m = mod ? lora_adapter_find(&j->ad, mod) : NULL;
            free(mod);
        }
        tr->name = ckpt_strdup(t->name);
        if (m) {
            tr->blob = ckpt_strdup(j->merged[m - j->ad.mods]);
            changed = true;
        } else {
            rc = store_tensor_blobs_get(&j->stored, sf->path, t->name, &tr->blob);
        }
        if (!rc && (!tr->name || !tr->blob)) rc = CKPT_ENOMEM;
    }
    /* A file without merged weights and with its own header is the base's file. */
    if (!rc && !changed)
        memcpy(fr->sha256, row->sha256, 65);
    else if (!rc)
        rc = hash_file(j, &l, fr, buf, fr->sha256);
    st_layout_free(&l);
    return rc;
}

static int cmp_file_rec(const void *a, const void *b)
{
    return strcmp(((const store_file_rec *)a)->path, ((const store_file_rec *)b)->path);
}

static int build_record(lora_job *j, store_ckpt_rec *r)
{
    uint8_t *buf = ckpt_malloc(HASH_CHUNK);
    int rc = buf ? 0 : CKPT_ENOMEM;
    for (size_t f = 0; !rc && f < j->ck.nfiles; f++)
        rc = add_model_file(j, r, f, buf);
    free(buf);
    for (size_t i = 0; !rc && i < j->nrows; i++) {
        const store_file_row *row = &j->rows[i];
        bool index = j->index_name && !strcmp(row->path, j->index_name);
        if (row->blob && (index || store_convert_is_side_file(row->path))) rc = add_plain(r, row);
    }
    if (!rc) qsort(r->files, r->nfiles, sizeof *r->files, cmp_file_rec);
    return rc;
}

/* ---- the job ---- */

/* The merged checkpoint of this adapter, when this base's run made it already. */
static bool find_existing(lora_job *j, store_lora_result *res)
{
    char *ref = ckpt_sprintf("%s@%s", j->repo, j->base.revision);
    store_ckpt c;
    bool found = ref && store_resolve(j->s, ref, &c) == 0;
    free(ref);
    if (found && c.source_id == j->base.id && !*c.layout) {
        res->ckpt = c;
        return true;
    }
    if (found) store_ckpt_free(&c);
    ckpt_error_clear();
    return false;
}

static void job_free(lora_job *j)
{
    for (size_t i = 0; j->merged && i < j->ad.nmods; i++)
        free(j->merged[i]);
    free(j->merged);
    lora_adapter_free(&j->ad);
    if (j->adapter_tmp) ckpt_rm_rf(j->adapter_tmp);
    free(j->adapter_tmp);
    ckpt_checkpoint_close(&j->ck);
    json_decref(j->config);
    free(j->index_text);
    free(j->hashes);
    store_files_free(j->rows, j->nrows);
    store_tensor_blobs_free(&j->stored);
    store_ckpt_free(&j->base);
    free(j->repo);
}

int store_lora_merge(ckpt_store *s, const char *base_ref, const char *adapter,
                     const store_lora_opts *o, store_lora_result *res)
{
    memset(res, 0, sizeof *res);
    lora_job j;
    memset(&j, 0, sizeof j);
    j.s = s;
    j.o = o;
    int rc = store_resolve(s, base_ref, &j.base);
    if (!rc && *j.base.layout)
        rc = ckpt_error_set(
            CKPT_EINVAL,
            "'%s' is a converted layout; merge into the original (%s@%s), then convert the result",
            base_ref, j.base.repo, j.base.revision);
    if (!rc) rc = store_files_load(s, j.base.id, &j.rows, &j.nrows);
    if (!rc) rc = store_tensor_blobs_load(s, j.base.id, &j.stored);
    if (!rc)
        rc = store_convert_open_source(s, &j.base, j.rows, j.nrows, false, &j.ck, &j.config, &j.index_text,
                                       &j.index_name, &j.hashes);
    if (!rc) rc = open_adapter(&j, adapter);
    if (!rc) rc = lora_adapter_check_base(&j.ad, &j.ck);
    if (!rc) rc = adapter_identity(&j, res->adapter_id);
    if (!rc && !(j.repo = ckpt_sprintf("%s-%s-%.12s", j.base.repo, o->unmerge ? "unlora" : "lora",
                                       res->adapter_id)))
        rc = CKPT_ENOMEM;
    if (!rc) rc = store_repo_name_check(j.repo);
    if (!rc && find_existing(&j, res)) {
        res->existed = true;
        job_free(&j);
        return 0;
    }
    store_ckpt_rec r = {
        .repo = j.repo, .revision = j.base.revision, .layout = "", .source_id = j.base.id};
    char commit[41];
    if (!rc) rc = merge_all(&j, &res->new_bytes);
    if (!rc) rc = build_record(&j, &r);
    if (!rc) rc = lease_record_blobs(s, &r);
    if (!rc) rc = store_content_id(&r, commit);
    r.commit = commit;
    int64_t id = 0;
    if (!rc) rc = store_commit_checkpoint(s, &r, &id, &res->existed);
    if (rc) store_leases_release_after_error(s);
    if (!rc) rc = store_get(s, id, &res->ckpt);
    if (!rc) res->modules = j.ad.nmods;
    store_ckpt_rec_free(&r);
    job_free(&j);
    return rc;
}

void store_lora_result_free(store_lora_result *res)
{
    store_ckpt_free(&res->ckpt);
}
