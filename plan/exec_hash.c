/* exec_hash.c — the sha256 of a plan's output files without writing them
 * (exec_hash_outputs in executor.h). */
#include "plan/executor.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What a hashing thread reads in one exec_tensor_read. */
#define HASH_CHUNK_BYTES (4u << 20)

typedef struct {
    const exec_plan *p;
    const int *fds;
    char (*out)[65];
    pthread_mutex_t mu;
    size_t next;   /* next file to take */
    uint64_t done;    /* bytes hashed, for progress */
    uint64_t tensors; /* tensors hashed, for progress */
    ckpt_progress prog;
    bool quiet;
    uint64_t ntensors; /* of every file */
    int rc;
    char msg[1024]; /* the message of rc: errors are per thread */
} hash_ctx;

static int hash_zeros(ckpt_sha256 *h, uint64_t n, const uint8_t *zeros)
{
    int rc = 0;
    while (!rc && n) {
        size_t k = n < HASH_CHUNK_BYTES ? (size_t)n : HASH_CHUNK_BYTES;
        rc = ckpt_sha256_update(h, zeros, k);
        n -= k;
    }
    return rc;
}

/* n more bytes hashed, and the tensor they end when `ends`. */
static void add_done(hash_ctx *c, uint64_t n, bool ends)
{
    pthread_mutex_lock(&c->mu);
    c->done += n;
    if (ends && !c->quiet) ckpt_progress_tensors(&c->prog, ++c->tensors, c->ntensors);
    if (!c->quiet) ckpt_progress_update(&c->prog, c->done);
    pthread_mutex_unlock(&c->mu);
}

/* File f as exec_run writes it: the header, then the tensors in offset order,
 * and zeros wherever no tensor lies (exec_run leaves those bytes unwritten). */
static int hash_file(hash_ctx *c, size_t f, uint8_t *buf, const uint8_t *zeros, uint8_t *slab, uint8_t *band,
                     void *vts)
{
    const exec_file *ef = &c->p->files[f];
    const st_layout *l = &ef->layout;
    if (!l->finished) return ckpt_error_set(CKPT_EINVAL, "%s: the file's layout is not finished", ef->rel);
    size_t *order = exec_offset_order(l);
    if (!order) return ckpt_error_set(CKPT_ENOMEM, "out of memory for hashing %s", ef->rel);
    ckpt_sha256 h;
    int rc = ckpt_sha256_init(&h);
    if (rc) {
        free(order);
        return rc;
    }
    rc = ckpt_sha256_update(&h, l->header, l->header_len);
    uint64_t pos = l->header_len;
    exec_slab_cache cache = {.vts = vts};
    for (size_t i = 0; !rc && i < l->ntensors; i++) {
        const st_out_tensor *ot = &l->tensors[order[i]];
        if (ot->offset < pos || ot->nbytes > l->file_size - ot->offset) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: tensor '%s' overlaps another or the header", ef->rel, ot->name);
            break;
        }
        rc = hash_zeros(&h, ot->offset - pos, zeros);
        for (uint64_t off = 0; !rc && off < ot->nbytes;) {
            size_t n = ot->nbytes - off < HASH_CHUNK_BYTES ? (size_t)(ot->nbytes - off) : HASH_CHUNK_BYTES;
            rc = exec_tensor_read(c->p, c->fds, ef->tensors[ot->user], off, buf, n, slab, band, &cache);
            if (!rc) rc = ckpt_sha256_update(&h, buf, n);
            off += n;
            if (!rc) add_done(c, n, off == ot->nbytes);
            pthread_mutex_lock(&c->mu);
            if (!rc && c->rc) rc = c->rc; /* another thread failed: stop early */
            pthread_mutex_unlock(&c->mu);
        }
        if (!rc && ot->nbytes == 0) add_done(c, 0, true);
        pos = ot->offset + ot->nbytes;
    }
    if (!rc) rc = hash_zeros(&h, l->file_size - pos, zeros);
    if (!rc) rc = ckpt_sha256_final_hex(&h, c->out[f]);
    else ckpt_sha256_free(&h);
    if (!rc) ckpt_fault("exec.file_hashed");
    free(order);
    return rc;
}

static void *hash_main(void *arg)
{
    hash_ctx *c = arg;
    uint8_t *buf = malloc(HASH_CHUNK_BYTES), *zeros = calloc(1, HASH_CHUNK_BYTES);
    uint8_t *slab = malloc(EXEC_READ_SLAB_BYTES), *band = malloc(EXEC_BAND_BYTES);
    int rc = buf && zeros && slab && band ? 0 : ckpt_error_set(CKPT_ENOMEM, "out of memory for hashing");
    const exec_vsource *v = c->p->vsource;
    void *vts = !rc && v ? v->thread_open(v->ctx) : NULL;
    if (!rc && v && !vts) rc = CKPT_ENOMEM; /* thread_open set the error */
    for (;;) {
        pthread_mutex_lock(&c->mu);
        if (rc && !c->rc) {
            c->rc = rc;
            snprintf(c->msg, sizeof c->msg, "%s", ckpt_error_last());
        }
        size_t f = c->rc ? c->p->nfiles : c->next++;
        pthread_mutex_unlock(&c->mu);
        if (f >= c->p->nfiles) break;
        rc = hash_file(c, f, buf, zeros, slab, band, vts);
    }
    if (vts) v->thread_close(v->ctx, vts);
    free(buf);
    free(zeros);
    free(slab);
    free(band);
    return NULL;
}

int exec_hash_outputs(const exec_plan *p, int threads, const char *label, bool quiet, char (*out)[65])
{
    exec_raise_open_files(p->nsrc_paths);
    int *fds = ckpt_calloc(p->nsrc_paths + 1, sizeof *fds);
    if (!fds) return CKPT_ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < p->nsrc_paths; i++) fds[i] = -1;
    for (size_t i = 0; !rc && i < p->nsrc_paths; i++) {
        if (p->vsource && p->vsource->serves(p->vsource->ctx, i)) continue; /* fd -1: read through views */
        fds[i] = open(p->src_paths[i], O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) rc = ckpt_error_sys("%s: open", p->src_paths[i]);
        else posix_fadvise(fds[i], 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    if (!rc) rc = exec_check_sources(p, fds);
    hash_ctx c = {.p = p, .fds = fds, .out = out, .quiet = quiet};
    uint64_t total = 0;
    for (size_t f = 0; f < p->nfiles; f++) {
        total += p->files[f].layout.file_size - p->files[f].layout.header_len;
        c.ntensors += p->files[f].layout.ntensors;
    }
    if (!rc && pthread_mutex_init(&c.mu, NULL)) rc = ckpt_error_set(CKPT_EIO, "cannot create a mutex");
    if (!rc) {
        if (!quiet) ckpt_progress_start(&c.prog, label ? label : "hashing", total);
        if (!quiet) ckpt_progress_tensors(&c.prog, 0, c.ntensors);
        if (threads < 1) threads = 1;
        if ((size_t)threads > p->nfiles) threads = p->nfiles ? (int)p->nfiles : 1;
        pthread_t tids[16];
        int started = 0;
        for (int i = 0; i < threads && i < 16; i++)
            if (pthread_create(&tids[i], NULL, hash_main, &c) == 0) started++;
        if (!started) hash_main(&c); /* no thread could start: hash here */
        for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
        rc = c.rc ? ckpt_error_set(c.rc, "%s", c.msg) : 0;
        if (!rc && !quiet) ckpt_progress_finish(&c.prog);
        pthread_mutex_destroy(&c.mu);
    }
    for (size_t i = 0; i < p->nsrc_paths; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
    return rc;
}
