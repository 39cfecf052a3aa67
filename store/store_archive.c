/* store_archive.c — a stored checkpoint as a streamed tar (see store_archive.h). */
#include "store/store_archive.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "format/archive.h"
#include "store/materialize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct store_archive {
    store_ckpt c;
    ckpt_archive_entry *e; /* output names (a rank's files at the root) */
    char **paths;          /* stored paths */
    char (*sha)[65];       /* "" while pending (hash_pending false): filled in by the write */
    bool *pending;         /* sha was pending: store_archive_record_pending records it */
    size_t n;
    bool progress;
    uint64_t total;
    /* while writing */
    ckpt_store *s;
    store_file_reader *r;
    size_t r_i;
    ckpt_sha256 h;
    ckpt_progress prog;
    uint64_t done; /* bytes of the files before r_i */
};

void store_archive_free(store_archive *ar)
{
    if (!ar) return;
    for (size_t i = 0; i < ar->n; i++) {
        free((char *)ar->e[i].name);
        free(ar->paths[i]);
    }
    free(ar->e);
    free(ar->paths);
    free(ar->sha);
    free(ar->pending);
    store_ckpt_free(&ar->c);
    free(ar);
}

int store_archive_plan(ckpt_store *s, const store_ckpt *c, int rank, store_archive **out)
{
    store_archive_opts o = {.rank = rank, .hash_pending = true};
    return store_archive_plan_opts(s, c, &o, out);
}

int store_archive_plan_opts(ckpt_store *s, const store_ckpt *c, const store_archive_opts *o, store_archive **out)
{
    *out = NULL;
    int rank = o->rank;
    if (rank > 1023) return ckpt_error_set(CKPT_EINVAL, "rank %d is not a number 0..1023", rank);
    store_archive *ar = ckpt_calloc(1, sizeof *ar);
    if (!ar) return CKPT_ENOMEM;
    int rc = store_get(s, c->id, &ar->c);
    store_file_row *rows = NULL;
    size_t n = 0;
    if (!rc) rc = store_files_load(s, c->id, &rows, &n);
    if (!rc) rc = materialize_rank_check_files(rows, n, c->id, rank); /* the rule pull follows */
    if (!rc && o->hash_pending) {
        store_files_free(rows, n);
        rc = store_files_load_hashed(s, c, rank, &rows, &n);
    }
    if (!rc) {
        ar->e = ckpt_calloc(n + 1, sizeof *ar->e);
        ar->paths = ckpt_calloc(n + 1, sizeof *ar->paths);
        ar->sha = ckpt_calloc(n + 1, sizeof *ar->sha);
        ar->pending = ckpt_calloc(n + 1, sizeof *ar->pending);
        if (!ar->e || !ar->paths || !ar->sha || !ar->pending) rc = CKPT_ENOMEM;
    }
    ar->progress = o->progress;
    for (size_t i = 0; !rc && i < n; i++) {
        const char *p = rows[i].path;
        const char *name = materialize_rank_path(p, rank); /* the rule pull follows */
        if (!name) continue;
        ar->e[ar->n] = (ckpt_archive_entry){.name = ckpt_strdup(name), .size = rows[i].size};
        ar->paths[ar->n] = ckpt_strdup(p);
        memcpy(ar->sha[ar->n], rows[i].sha256, sizeof ar->sha[ar->n]);
        ar->pending[ar->n] = !ar->sha[ar->n][0];
        ar->total += rows[i].size;
        ar->n++;
        if (!ar->e[ar->n - 1].name || !ar->paths[ar->n - 1]) rc = CKPT_ENOMEM;
        store_file_reader *r;
        if (!rc && (rc = store_file_open_unhashed(&r, s, &ar->c, p)) == 0) store_file_close(r);
    }
    store_files_free(rows, n);
    if (rc) {
        store_archive_free(ar);
        return rc;
    }
    *out = ar;
    return 0;
}

static int archive_read(void *ctx, size_t i, uint64_t off, void *buf, size_t len)
{
    store_archive *ar = ctx;
    int rc;
    if (!ar->r || ar->r_i != i) {
        if (ckpt_fault_error("archive.entry"))
            return ckpt_error_set(CKPT_EIO, "'%s': read failed (fault point archive.entry)", ar->paths[i]);
        if (ar->r) ar->done += ar->e[ar->r_i].size;
        store_file_close(ar->r);
        ar->r = NULL;
        if ((rc = store_file_open_unhashed(&ar->r, ar->s, &ar->c, ar->paths[i]))) return rc;
        ar->r_i = i;
        ckpt_sha256_free(&ar->h);
        if ((rc = ckpt_sha256_init(&ar->h))) return rc;
    }
    if (off && ckpt_fault_error("archive.block"))
        return ckpt_error_set(CKPT_EIO, "'%s': read failed at byte %llu (fault point archive.block)", ar->paths[i],
                              (unsigned long long)off);
    if ((rc = store_file_read(ar->r, off, buf, len))) return rc;
    if ((rc = ckpt_sha256_update(&ar->h, buf, len))) return rc;
    if (ar->progress) ckpt_progress_update(&ar->prog, ar->done + off + len);
    if (off + len == ar->e[i].size) {
        char hex[65];
        rc = ckpt_sha256_final_hex(&ar->h, hex);
        if (!rc && ar->pending[i]) memcpy(ar->sha[i], hex, sizeof hex); /* what the catalog will keep */
        else if (!rc && strcmp(hex, ar->sha[i]))
            rc = ckpt_error_set(CKPT_ECORRUPT,
                                "'%s': the stored bytes hash to %s, the catalog says %s: a blob is damaged (run ckpt "
                                "verify)",
                                ar->paths[i], hex, ar->sha[i]);
    }
    return rc;
}

int store_archive_write(store_archive *ar, ckpt_store *s, int fd, bool zstd)
{
    ar->s = s;
    ar->done = 0;
    for (size_t i = 0; i < ar->n; i++)
        if (ar->pending[i]) ar->sha[i][0] = '\0'; /* a second write hashes again */
    if (ar->progress) ckpt_progress_start(&ar->prog, "pull", ar->total);
    int rc = ckpt_archive_write_entries(fd, zstd, ar->e, ar->n, ar->c.created_at, archive_read, ar);
    if (ar->progress && !rc) ckpt_progress_finish(&ar->prog);
    store_file_close(ar->r);
    ar->r = NULL;
    ckpt_sha256_free(&ar->h); /* a file an error cut short */
    ar->s = NULL;
    return rc;
}

int store_archive_record_pending(store_archive *ar, ckpt_store *s)
{
    int rc = 0;
    for (size_t i = 0; !rc && i < ar->n; i++)
        if (ar->pending[i] && ar->sha[i][0]) rc = store_file_set_sha256(s, ar->c.id, ar->paths[i], ar->sha[i]);
    return rc;
}
