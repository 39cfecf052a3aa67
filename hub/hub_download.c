/*
 * hub_download.c — the parallel downloader of hub.h, writing straight into
 * the store's blob temp files.
 *
 * Where bytes go: every file is a list of regions, each a blob writer
 * (store_blob_begin: a temp file in CKPT_HOME/tmp). A plain file is one
 * region. A safetensors file is first only its header: piece 0 asks for the
 * first HEADER_PROBE bytes, learns N from the first 8, and is cut or grown to
 * end exactly at 8 + N; its bytes go to memory. When it is complete the
 * header is parsed with st_parse (the checks of an import); its tensors
 * become the regions (one blob each, in offset order) and the rest of the
 * file becomes data pieces. A header that does not parse is treated like a
 * hash mismatch: the file is downloaded once more, then the fetch fails.
 *
 * Bounds: before any piece is set up, the declared sizes must fit the space
 * free in CKPT_HOME/tmp, so piece state (one piece per chunk) is bounded by
 * real disk space, not by what a tree claims; an error answer's body is read
 * up to HUB_MAX_ERROR_BODY, then the attempt is cut and counts as a failure;
 * each attempt has the client's request timeout and the loop stops at the
 * fetch's deadline.
 *
 * Pieces: up to `connections` are in flight at once, each a Range request on
 * one libcurl multi handle; bodies are written with pwrite into the regions
 * they cover, never held whole in memory. A piece remembers how many bytes
 * it has written: a dropped connection resumes at the next byte; a 200
 * answer to a Range request (the server ignored Range: the body starts at
 * byte 0) drops the bytes before the piece and restarts it, and takes over
 * the following pieces of the file that have not started, so a server that
 * never honours Range costs one pass, not one per piece.
 *
 * Two hasher threads follow each file's contiguous written prefix (pieces
 * finish out of order; the prefix grows as the holes fill), so hashing
 * overlaps the download: stream 0 computes the file's sha256 (and its git
 * blob id when the file is not in LFS), stream 1 each tensor's sha256 (its
 * blob's name) of a safetensors file. When a file is whole and both are
 * done, the hashes are compared with the tree's; a mismatch downloads the
 * file once more, a second one fails.
 *
 * Resume (store_partial.h, docs/hub.md "Resume"): with the commit's
 * partial folder, each file's regions are files there (r0, r1, ...) that
 * survive a failure or a kill; a finished piece is fdatasync'ed and then
 * recorded in the file's journal (record_piece), and a safetensors header is
 * kept once parsed. file_begin takes over what a file kept (resume_header,
 * resume_pieces): recorded pieces are done, the hashers read their bytes
 * back, and only the rest is requested. A second download of a file (a
 * mismatch) starts its folder over.
 *
 * Threads: the main thread owns the pieces, the multi handle, the writers and
 * the regions; the hashers read the regions' fds and the header (complete
 * and unchanging in the prefix they read). They share, under mu, each
 * file's ready/all_done/verdict and per stream its position, a queue of file
 * indexes per stream, and the queue of verdicts for the main thread (which
 * the hashers wake with curl_multi_wakeup).
 */
#include "hub/hub_internal.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "format/safetensors.h"
#include "store/store_partial.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define DL_HASH_STEP (8u << 20)
#define DL_CURL_BUFFER (512L << 10)
#define DL_POLL_MS 100
#define DL_MIN_PROGRESS                                                                            \
    (64u << 10) /* a dropped attempt that got less than this counts as a failure */
#define DL_HEADER_PROBE (1u << 20) /* first request of a safetensors file */
#define DL_MAX_PIECES_PER_FILE 65536

typedef enum { P_UNUSED, P_WAITING, P_ACTIVE, P_DONE, P_ABSORBED } piece_state;

typedef struct dl dl;
typedef struct dl_file dl_file;

typedef struct {
    dl *d;
    dl_file *f;
    uint64_t start,
        end;      /* [start, end) of the file; end moves for the header piece and when absorbing */
    uint64_t got; /* bytes of [start, end) written */
    uint64_t attempt_got;
    uint64_t skip; /* a 200 body: bytes before start still to drop */
    uint64_t error_body; /* bytes of an error answer's body read by this attempt */
    int fails, redirects;
    double not_before;
    char *url; /* after a redirect; NULL: the file's own URL */
    piece_state state;
    bool header; /* piece 0 of a safetensors file: bytes [0, 8 + N) to memory */
    bool ranged, checked, writing;
    bool elsewhere;  /* this attempt went to a redirect's target, not to the endpoint */
    const char *why; /* what went wrong with this attempt, when the callbacks know */
    hub_answer ans;
    CURL *easy;
    struct curl_slist *hdrs;
    char curl_err[CURL_ERROR_SIZE];
} dl_piece;

typedef struct {
    uint64_t off, len; /* file bytes [off, off + len) */
    int fd;            /* its blob writer's temp file */
} region;

struct dl_file {
    const hub_entry *e;
    char *url;
    char *redirect_url; /* where a redirect led and bytes came from: the next pieces go there
                           directly */
    bool st;            /* a safetensors file */
    /* the safetensors header: [0, hdr_len) in memory; hdr_len is 0 until the first 8 bytes are in
     */
    uint8_t *hdr;
    uint64_t hdr_len, hdr_cap;
    st_file sf;
    bool sf_open;
    char *bad_header; /* why the header does not parse */
    store_blob_writer *ws;
    region *rg;
    size_t nrg; /* = writers */
    char (*blob_sha)[65];
    size_t first, maxpieces, npieces, pieces_done, prefix_piece;
    uint64_t chunk; /* bytes per data piece */
    int downloads;
    /* shared with the hashers, under d->mu */
    uint64_t ready;
    bool all_done;
    uint64_t hashed[2]; /* per stream */
    bool in_work[2], sdone[2];
    int sresult[2]; /* per stream: 1 good, CKPT_ECORRUPT mismatch, another code: hashing failed */
    /* 0 pending, 1 good, CKPT_ECORRUPT: the bytes do not match (f->actual says
     * what came; downloaded again once), another negative code: verifying
     * failed (CKPT_EIO reading the temp file back, CKPT_EINTERNAL the digest
     * library, CKPT_ENOMEM), with the message in herr: the fetch stops with it */
    int verdict;
    char actual[96];
    char herr[2][300];
    /* stream 0's own */
    ckpt_sha256 fsha;
    bool fsha_on;
    EVP_MD_CTX *sha1;
    char sha256[65];
    /* stream 1's own */
    ckpt_sha256 tsha;
    bool tsha_on;
    size_t ti; /* the next tensor to finish */
    /* resume (store_partial.h): the file's folder, NULL when nothing is kept */
    char *pdir;
    int jfd;   /* its journal */
    bool wipe; /* the next file_begin drops what is kept (a second download) */
};

struct dl {
    hub_client *h;
    ckpt_store *s;
    const char *repo, *commit;
    dl_file *files;
    size_t nfiles;
    dl_piece *pieces;
    size_t npieces, cursor;
    size_t *retry;
    size_t nretry, retry_cap;
    CURLM *multi;
    CURL **pool;
    size_t npool;
    int active;
    uint64_t chunk;
    double hold_until;
    uint64_t total, done, received, kept;
    store_partial *part; /* NULL or part->dir NULL: nothing is kept for a resume */
    size_t verified;
    bool file_lines; /* not on a TTY: a line per verified file instead of the progress line */
    int fatal;
    char fatal_msg[1024];
    /* the hashers */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    int hashers_started;
    struct hasher {
        dl *d;
        int stream;
        pthread_t th;
        size_t *work, nwork, work_cap, work_head;
        uint8_t *buf;
    } hs[2];
    size_t *verdicts, nverdicts, verdict_cap;
};

/* The first permanent failure stops the download; later ones are dropped. */
static void set_fatal(dl *d, int rc)
{
    if (d->fatal) return;
    d->fatal = rc < 0 ? rc : CKPT_EIO;
    snprintf(d->fatal_msg, sizeof d->fatal_msg, "%s", ckpt_error_last());
}

void hub_blobs_abort(hub_blobs *b)
{
    for (size_t i = 0; i < b->n; i++)
        store_blob_abort(&b->w[i]);
    free(b->w);
    b->w = NULL;
    b->n = 0;
}

/* ---- where bytes go ---- */

static int add_writer(dl *d, dl_file *f, uint64_t off, uint64_t len)
{
    size_t k = f->nrg;
    store_blob_writer *w = &f->ws[k];
    int rc;
    if (f->pdir) { /* a kept region file, reopened as it is (store_blob_end_external names it) */
        char name[32];
        snprintf(name, sizeof name, "r%zu", k);
        memset(w, 0, sizeof *w);
        w->tmp_path = ckpt_path_join(f->pdir, name);
        if (!w->tmp_path) return CKPT_ENOMEM;
        w->fd = open(w->tmp_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600); /* as mkostemp makes blob temps */
        if (w->fd < 0) {
            rc = ckpt_error_sys("%s: open", w->tmp_path);
            free(w->tmp_path);
            w->tmp_path = NULL;
            return rc;
        }
    } else if ((rc = store_blob_begin(d->s, w))) {
        return rc;
    }
    f->rg[k] = (region){off, len, w->fd};
    f->nrg++;
    return 0;
}

/* Cuts [from, size) of f into data pieces after the header piece (or from 0). */
static void make_pieces(dl *d, dl_file *f, size_t first_slot, uint64_t from)
{
    uint64_t len = f->e->size - from, c = f->chunk;
    size_t n = (size_t)((len + c - 1) / c);
    assert(first_slot + n <= f->maxpieces); /* setup reserved ceil(size / chunk) + 1 slots */
    uint64_t each = n ? (len + n - 1) / n : 0;
    for (size_t k = 0; k < n; k++) {
        dl_piece *p = &d->pieces[f->first + first_slot + k];
        free(p->url);
        memset(p, 0, sizeof *p);
        p->d = d;
        p->f = f;
        p->start = from + k * each;
        p->end = k + 1 == n ? f->e->size : from + (k + 1) * each;
        p->state = P_WAITING;
    }
    f->npieces = first_slot + n;
}

/* Releases what a file holds (its writers' temp files too). */
static void file_drop(dl_file *f)
{
    for (size_t k = 0; k < f->nrg; k++) {
        store_blob_writer *w = &f->ws[k];
        if (f->pdir) { /* kept for a resume: closed, not removed */
            if (w->fd >= 0) close(w->fd);
            free(w->tmp_path);
            memset(w, 0, sizeof *w);
            w->fd = -1;
        } else {
            store_blob_abort(w);
        }
    }
    f->nrg = 0;
    if (f->jfd >= 0) close(f->jfd);
    f->jfd = -1;
    free(f->pdir);
    f->pdir = NULL;
    free(f->ws);
    free(f->rg);
    free(f->blob_sha);
    f->ws = NULL;
    f->rg = NULL;
    f->blob_sha = NULL;
    free(f->hdr);
    f->hdr = NULL;
    f->hdr_len = f->hdr_cap = 0;
    if (f->sf_open) st_close(&f->sf);
    f->sf_open = false;
    free(f->bad_header);
    f->bad_header = NULL;
}

static void publish_progress(dl *d, dl_file *f, uint64_t ready, bool all);

/* Grows f's contiguous done prefix over the pieces that are done and tells
 * the hashers. */
static void advance_prefix(dl *d, dl_file *f)
{
    uint64_t ready = f->ready; /* only this thread writes it */
    while (f->prefix_piece < f->first + f->npieces) {
        dl_piece *q = &d->pieces[f->prefix_piece];
        if (q->state == P_DONE)
            ready = q->end;
        else if (q->state != P_ABSORBED)
            break;
        f->prefix_piece++;
    }
    publish_progress(d, f, ready, f->pieces_done == f->npieces);
}

static int by_start(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* A resume: the pieces the journal records as written (fsynced) are done,
 * and a piece whose first bytes are recorded starts after them. The hashers
 * then read the kept bytes back from the region files, so the file's hashes
 * cover every byte (a kept byte that changed on disk fails the check and
 * the file is downloaded again). The caller tells the hashers (advance_prefix). */
static int resume_pieces(dl *d, dl_file *f)
{
    uint64_t(*r)[2];
    size_t nr, m = 0;
    int rc = store_partial_journal_read(f->pdir, f->e->size, &r, &nr);
    if (rc || nr == 0) {
        free(r);
        return rc;
    }
    qsort(r, nr, sizeof *r, by_start); /* then merged into disjoint ranges */
    for (size_t j = 0; j < nr; j++) {
        if (m && r[j][0] <= r[m - 1][1]) {
            if (r[j][1] > r[m - 1][1]) r[m - 1][1] = r[j][1];
        } else {
            r[m][0] = r[j][0];
            r[m][1] = r[j][1];
            m++;
        }
    }
    /* A journal claiming bytes its region files do not hold (they were
     * published into blobs/ before a crash, or removed by hand) is dropped:
     * everything is downloaded again. */
    for (size_t k = 0; k < f->nrg; k++) {
        const region *g = &f->rg[k];
        uint64_t need = 0;
        for (size_t q = 0; q < m; q++)
            if (r[q][0] < g->off + g->len && g->off < r[q][1])
                need = (r[q][1] < g->off + g->len ? r[q][1] : g->off + g->len) - g->off;
        struct stat st;
        if (need && (fstat(g->fd, &st) < 0 || (uint64_t)st.st_size < need)) {
            ckpt_debug("%s: the kept pieces are gone; downloading the file again", f->e->path);
            free(r);
            if (ftruncate(f->jfd, 0) < 0) return ckpt_error_sys("%s/journal: truncate", f->pdir);
            return 0;
        }
    }
    size_t j = 0;
    for (size_t k = 0; k < f->npieces; k++) { /* pieces are in offset order */
        dl_piece *p = &d->pieces[f->first + k];
        if (p->state != P_WAITING || p->header) continue;
        while (j < m && r[j][1] <= p->start)
            j++;
        if (j == m || r[j][0] > p->start) continue;
        uint64_t to = r[j][1] < p->end ? r[j][1] : p->end;
        p->got = to - p->start;
        d->done += p->got;
        d->kept += p->got;
        if (to == p->end) {
            p->state = P_DONE;
            f->pieces_done++;
        }
    }
    free(r);
    return 0;
}

static int header_done(dl *d, dl_file *f);
static int file_begin(dl *d, dl_file *f);

/* A resume of a safetensors file whose header was kept: piece 0 is done and
 * the header is parsed as if just downloaded. A kept header that does not
 * parse drops everything kept for the file. */
static int resume_header(dl *d, dl_file *f)
{
    char *path = ckpt_path_join(f->pdir, "header"), *buf = NULL;
    size_t len = 0;
    if (!path) return CKPT_ENOMEM;
    int rc = ckpt_read_file(path, (size_t)ST_MAX_HEADER + 8, &buf, &len);
    free(path);
    if (rc) { /* not kept: piece 0 downloads it; header_done resumes the data pieces */
        ckpt_error_clear();
        return 0;
    }
    uint64_t n = 0;
    for (int i = 7; len >= 8 && i >= 0; i--)
        n = n << 8 | (uint8_t)buf[i];
    dl_piece *p = &d->pieces[f->first];
    if (len >= 8 && n == len - 8 && len <= f->e->size) {
        f->hdr = (uint8_t *)buf;
        f->hdr_len = f->hdr_cap = len;
        p->end = p->got = len;
        p->state = P_DONE;
        f->pieces_done = 1;
        d->done += len;
        d->kept += len;
        rc = header_done(d, f);
        if (!rc && !f->bad_header) advance_prefix(d, f);
        if (rc || !f->bad_header) return rc;
    } else {
        free(buf);
    }
    for (size_t k = 0; k < f->npieces; k++) { /* a kept header that does not fit: start the file over */
        dl_piece *q = &d->pieces[f->first + k];
        d->done -= q->got;
        d->kept -= q->got;
        q->got = 0;
        q->state = P_UNUSED;
    }
    file_drop(f);
    f->wipe = true;
    return file_begin(d, f);
}

/* Sets up a file's first pieces: the header piece of a safetensors file, or
 * all pieces and the one writer of any other file. With a resume folder,
 * what an interrupted fetch kept of the file is taken over. */
static int file_begin(dl *d, dl_file *f)
{
    f->pieces_done = 0;
    f->prefix_piece = f->first;
    bool kept = false;
    if (d->part && d->part->dir && f->e->size > 0) {
        int rc = store_partial_file(d->part, f->e->path, f->e->size, f->e->sha256, f->e->oid, f->wipe,
                                    &f->pdir, &kept);
        if (!rc) rc = store_partial_journal_open(f->pdir, &f->jfd);
        if (rc) return rc;
        f->wipe = false;
    }
    if (f->st &&
        f->e->size == 0) { /* nothing to download; fails like a header that does not parse */
        f->npieces = 0;
        f->bad_header = ckpt_strdup("HeaderTooSmall: an empty file");
        return f->bad_header ? 0 : CKPT_ENOMEM;
    }
    if (f->st) {
        dl_piece *p = &d->pieces[f->first];
        free(p->url);
        memset(p, 0, sizeof *p);
        *p = (dl_piece){.d = d,
                        .f = f,
                        .start = 0,
                        .end = f->e->size < DL_HEADER_PROBE ? f->e->size : DL_HEADER_PROBE,
                        .state = P_WAITING,
                        .header = true};
        f->npieces = 1;
        return kept ? resume_header(d, f) : 0;
    }
    f->ws = ckpt_calloc(1, sizeof *f->ws);
    f->rg = ckpt_calloc(1, sizeof *f->rg);
    f->blob_sha = ckpt_calloc(1, sizeof *f->blob_sha);
    if (!f->ws || !f->rg || !f->blob_sha) return CKPT_ENOMEM;
    int rc = add_writer(d, f, 0, f->e->size);
    if (rc) return rc;
    make_pieces(d, f, 0, 0);
    if (kept && !(rc = resume_pieces(d, f))) advance_prefix(d, f);
    return rc;
}

/* The header piece is complete: parse it, make the tensors' writers and the data pieces. */
static int header_done(dl *d, dl_file *f)
{
    int rc = st_parse(&f->sf, f->e->path, f->hdr, (size_t)f->hdr_len, f->e->size);
    if (rc == CKPT_ENOMEM) return rc;
    if (rc) {
        f->bad_header = ckpt_strdup(ckpt_error_last());
        return f->bad_header ? 0 : CKPT_ENOMEM;
    }
    f->sf_open = true;
    size_t n = f->sf.ntensors;
    f->ws = ckpt_calloc(n + 1, sizeof *f->ws);
    f->rg = ckpt_calloc(n + 1, sizeof *f->rg);
    f->blob_sha = ckpt_calloc(n + 1, sizeof *f->blob_sha);
    if (!f->ws || !f->rg || !f->blob_sha) return CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++)
        rc = add_writer(d, f, f->sf.tensors[i].offset, f->sf.tensors[i].nbytes);
    if (rc) return rc;
    make_pieces(d, f, 1, f->hdr_len);
    for (size_t k = 1; k < f->npieces; k++) { /* the data pieces may start now */
        dl_piece *p = &d->pieces[f->first + k];
        p->not_before = 0;
        if (ckpt_grow(&d->retry, &d->retry_cap, d->nretry + 1, sizeof *d->retry) < 0)
            return CKPT_ENOMEM;
        d->retry[d->nretry++] = f->first + k;
    }
    return f->pdir ? resume_pieces(d, f) : 0;
}

/* The region holding file offset off (regions are sorted and contiguous). */
static size_t region_at(const dl_file *f, uint64_t off)
{
    size_t lo = 0, hi = f->nrg;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (f->rg[mid].off + f->rg[mid].len <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Writes n body bytes of p that belong at file offset off. */
static int sink_write(dl_piece *p, const char *buf, size_t n, uint64_t off)
{
    dl_file *f = p->f;
    if (p->header) {
        if (f->hdr_cap < off + n) {
            uint64_t cap = f->hdr_cap ? f->hdr_cap : 8;
            while (cap < off + n)
                cap *= 2;
            uint8_t *h = realloc(f->hdr, cap);
            if (!h)
                return ckpt_error_set(CKPT_ENOMEM, "%s: out of memory for the header", f->e->path);
            f->hdr = h;
            f->hdr_cap = cap;
        }
        memcpy(f->hdr + off, buf, n);
        return 0;
    }
    while (n) {
        size_t k = region_at(f, off);
        if (k >= f->nrg)
            return ckpt_error_set(CKPT_EINVAL, "%s: bytes past the last tensor", f->e->path);
        const region *r = &f->rg[k];
        uint64_t in = off - r->off;
        size_t m = r->len - in < n ? (size_t)(r->len - in) : n;
        int rc = ckpt_pwrite_full(r->fd, buf, m, in, f->e->path);
        if (rc) return rc;
        buf += m;
        off += m;
        n -= m;
    }
    return 0;
}

/* The header piece has its first 8 bytes: it ends at 8 + N from now on. */
static void header_length_known(dl_piece *p)
{
    dl_file *f = p->f;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | f->hdr[i];
    uint64_t end =
        n <= ST_MAX_HEADER && n + 8 <= f->e->size ? n + 8 : 8; /* a bad N: st_parse says why */
    f->hdr_len = end;
    p->end = end;
}

/* ---- the hasher ---- */

/* Queues f for both hashers (caller holds mu, or no hasher runs yet). */
static void work_push(dl *d, dl_file *f)
{
    for (int k = 0; k < 2; k++) {
        struct hasher *hs = &d->hs[k];
        if (f->in_work[k] || f->sdone[k]) continue;
        if (hs->work_head > 0 && hs->work_head == hs->nwork) hs->work_head = hs->nwork = 0;
        if (ckpt_grow(&hs->work, &hs->work_cap, hs->nwork + 1, sizeof *hs->work) < 0) {
            set_fatal(d, CKPT_ENOMEM);
            return;
        }
        hs->work[hs->nwork++] = (size_t)(f - d->files);
        f->in_work[k] = true;
    }
    pthread_cond_broadcast(&d->cv);
}

static void hash_drop(dl_file *f)
{
    if (f->fsha_on) ckpt_sha256_free(&f->fsha);
    if (f->tsha_on) ckpt_sha256_free(&f->tsha);
    f->fsha_on = f->tsha_on = false;
    if (f->sha1) EVP_MD_CTX_free(f->sha1);
    f->sha1 = NULL;
    f->ti = 0;
}

/* Finishes tensor hashes up to position pos (the tensors ending at or before it). */
static int tensors_upto(dl_file *f, uint64_t pos)
{
    int rc;
    while (f->ti < f->nrg && f->rg[f->ti].off + f->rg[f->ti].len <= pos) {
        if (!f->tsha_on && (rc = ckpt_sha256_init(&f->tsha)) < 0) return rc;
        f->tsha_on = false;
        if ((rc = ckpt_sha256_final_hex(&f->tsha, f->blob_sha[f->ti])) < 0) return rc;
        f->ti++;
    }
    return 0;
}

/* Stream 0: the file's sha256 (and git blob id) over file bytes [from, to). */
static int hash_file(dl_file *f, uint8_t *buf, uint64_t from, uint64_t to)
{
    int rc;
    if (from == 0) {
        if ((rc = ckpt_sha256_init(&f->fsha)) < 0) return rc;
        f->fsha_on = true;
        if (!f->e->sha256[0] && f->e->oid[0]) {
            char head[64];
            int hn = snprintf(head, sizeof head, "blob %llu", (unsigned long long)f->e->size) + 1;
            f->sha1 = EVP_MD_CTX_new();
            if (!f->sha1) return ckpt_error_set(CKPT_ENOMEM, "sha1: out of memory for a digest context");
            if (!EVP_DigestInit_ex(f->sha1, EVP_sha1(), NULL) || !EVP_DigestUpdate(f->sha1, head, (size_t)hn))
                return ckpt_error_set(CKPT_EINTERNAL, "sha1: the digest library failed to start");
        }
    }
    while (from < to) {
        const uint8_t *data;
        size_t n;
        if (f->st && from < f->hdr_len) {
            n = (size_t)((to < f->hdr_len ? to : f->hdr_len) - from);
            data = f->hdr + from;
        } else {
            size_t k = region_at(f, from);
            if (k >= f->nrg)
                return ckpt_error_set(CKPT_EINVAL, "%s: bytes past the last region", f->e->path);
            const region *r = &f->rg[k];
            uint64_t stop = r->off + r->len < to ? r->off + r->len : to;
            n = stop - from < DL_HASH_STEP ? (size_t)(stop - from) : DL_HASH_STEP;
            if ((rc = ckpt_pread_full(r->fd, buf, n, from - r->off, f->e->path)) < 0) return rc;
            data = buf;
        }
        if ((rc = ckpt_sha256_update(&f->fsha, data, n)) < 0) return rc;
        if (f->sha1 && !EVP_DigestUpdate(f->sha1, data, n))
            return ckpt_error_set(CKPT_EINTERNAL, "sha1: the digest library failed (update)");
        from += n;
    }
    return 0;
}

/* Stream 1: the tensors' sha256 over file bytes [from, to) of a safetensors file. */
static int hash_tensors(dl_file *f, uint8_t *buf, uint64_t from, uint64_t to)
{
    if (!f->st || f->bad_header) return 0;
    if (from < f->hdr_len) from = f->hdr_len;
    int rc;
    while (from < to) {
        if ((rc = tensors_upto(f, from)) < 0) return rc;
        size_t k = region_at(f, from);
        if (k >= f->nrg)
            return ckpt_error_set(CKPT_EINVAL, "%s: bytes past the last tensor", f->e->path);
        const region *r = &f->rg[k];
        uint64_t stop = r->off + r->len < to ? r->off + r->len : to;
        size_t n = stop - from < DL_HASH_STEP ? (size_t)(stop - from) : DL_HASH_STEP;
        if ((rc = ckpt_pread_full(r->fd, buf, n, from - r->off, f->e->path)) < 0) return rc;
        if (!f->tsha_on) {
            if ((rc = ckpt_sha256_init(&f->tsha)) < 0) return rc;
            f->tsha_on = true;
        }
        if ((rc = ckpt_sha256_update(&f->tsha, buf, n)) < 0) return rc;
        from += n;
    }
    return tensors_upto(f, to);
}

/* Stream 0's end: 1 good, CKPT_ECORRUPT mismatch (f->actual says what came),
 * another negative code: hashing failed. */
static int finish_file(dl_file *f, uint8_t *buf)
{
    const hub_entry *e = f->e;
    if (f->bad_header) {
        snprintf(f->actual, sizeof f->actual, "a header that does not parse");
        return CKPT_ECORRUPT;
    }
    int rc;
    if (!f->fsha_on && (rc = hash_file(f, buf, 0, 0)) < 0) return rc; /* an empty file */
    f->fsha_on = false;
    if ((rc = ckpt_sha256_final_hex(&f->fsha, f->sha256)) < 0) return rc;
    if (e->sha256[0] && strcmp(f->sha256, e->sha256)) {
        snprintf(f->actual, sizeof f->actual, "%s", f->sha256);
        return CKPT_ECORRUPT;
    }
    if (f->sha1) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int n = 0;
        char oid[41] = "";
        int ok = EVP_DigestFinal_ex(f->sha1, md, &n);
        EVP_MD_CTX_free(f->sha1);
        f->sha1 = NULL;
        if (!ok) return ckpt_error_set(CKPT_EINTERNAL, "sha1: the digest library failed (final)");
        for (unsigned i = 0; i < n && i < 20; i++)
            snprintf(oid + 2 * i, 3, "%02x", md[i]);
        if (strcmp(oid, e->oid)) {
            snprintf(f->actual, sizeof f->actual, "%s", oid);
            return CKPT_ECORRUPT;
        }
    }
    if (!f->st) memcpy(f->blob_sha[0], f->sha256, 65); /* a whole-file blob */
    return 1;
}

/* Stream 1's end. */
static int finish_tensors(dl_file *f)
{
    if (!f->st || f->bad_header) return 1;
    int rc = tensors_upto(f, f->e->size);
    if (rc < 0) return rc;
    if (f->ti == f->nrg) return 1;
    return ckpt_error_set(CKPT_EINTERNAL, "%s: %zu of %zu tensors hashed", f->e->path, f->ti, f->nrg);
}

/* Runs one stream over the files queued for it. */
static void *hasher_main(void *arg)
{
    struct hasher *hs = arg;
    dl *d = hs->d;
    int k = hs->stream;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        if (hs->work_head == hs->nwork) {
            if (d->stop) break;
            pthread_cond_wait(&d->cv, &d->mu);
            continue;
        }
        dl_file *f = &d->files[hs->work[hs->work_head++]];
        while (!d->stop && !f->sdone[k]) {
            uint64_t from = f->hashed[k], to = f->ready;
            int rc = 0;
            if (from < to) {
                if (to - from > DL_HASH_STEP) to = from + DL_HASH_STEP;
                pthread_mutex_unlock(&d->mu);
                rc = k == 0 ? hash_file(f, hs->buf, from, to) : hash_tensors(f, hs->buf, from, to);
                if (rc < 0) snprintf(f->herr[k], sizeof f->herr[k], "%s", ckpt_error_last());
                pthread_mutex_lock(&d->mu);
                f->hashed[k] = to;
                if (rc < 0) {
                    f->sresult[k] = rc == CKPT_ECORRUPT ? CKPT_EINTERNAL : rc; /* no mismatch before the end */
                    f->sdone[k] = true;
                }
            } else if (f->all_done) {
                pthread_mutex_unlock(&d->mu);
                int v = k == 0 ? finish_file(f, hs->buf) : finish_tensors(f);
                if (k == 1 && v == CKPT_ECORRUPT) v = CKPT_EINTERNAL; /* tensor hashes have nothing to match */
                if (v < 0 && v != CKPT_ECORRUPT && !f->herr[k][0])
                    snprintf(f->herr[k], sizeof f->herr[k], "%s", ckpt_error_last());
                pthread_mutex_lock(&d->mu);
                f->sresult[k] = v;
                f->sdone[k] = true;
            } else {
                break; /* waits for more bytes */
            }
            if (f->sdone[0] && f->sdone[1]) { /* both streams are through: the verdict */
                /* A failure to hash wins over a mismatch: the bytes were not judged. */
                int r0 = f->sresult[0], r1 = f->sresult[1];
                f->verdict = r0 < 0 && r0 != CKPT_ECORRUPT ? r0 : r1 < 0 ? r1 : r0 == CKPT_ECORRUPT ? CKPT_ECORRUPT : 1;
                if (ckpt_grow(&d->verdicts, &d->verdict_cap, d->nverdicts + 1,
                              sizeof *d->verdicts) == 0)
                    d->verdicts[d->nverdicts++] = (size_t)(f - d->files);
                curl_multi_wakeup(d->multi);
            }
        }
        f->in_work[k] = false;
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- pieces ---- */

static void requeue(dl *d, dl_piece *p, double delay)
{
    p->state = P_WAITING;
    p->not_before = ckpt_now() + delay;
    if (ckpt_grow(&d->retry, &d->retry_cap, d->nretry + 1, sizeof *d->retry) < 0) {
        set_fatal(d, CKPT_ENOMEM);
        return;
    }
    d->retry[d->nretry++] = (size_t)(p - d->pieces);
}

static void retry_or_give_up(dl *d, dl_piece *p, const char *why, double retry_after)
{
    if (++p->fails > HUB_MAX_RETRIES) {
        set_fatal(d, ckpt_error_set(CKPT_EIO, "%s: giving up after %d attempts: %s", p->f->e->path,
                                    p->fails, why));
        p->state = P_WAITING;
        return;
    }
    ckpt_debug("%s: bytes %llu-%llu: %s; retrying", p->f->e->path,
               (unsigned long long)(p->start + p->got), (unsigned long long)p->end, why);
    requeue(d, p, hub_backoff(d->h, p->fails, retry_after));
}

/* The next piece to start, or NULL: a retry that is due, else a fresh one. */
static dl_piece *next_piece(dl *d, double now)
{
    for (size_t i = 0; i < d->nretry;) {
        dl_piece *p = &d->pieces[d->retry[i]];
        if (p->state != P_WAITING) {
            d->retry[i] = d->retry[--d->nretry];
            continue;
        }
        if (p->not_before <= now) {
            d->retry[i] = d->retry[--d->nretry];
            return p;
        }
        i++;
    }
    /* Fresh pieces only: one put back (not_before set) waits in the retry list for its time. */
    while (d->cursor < d->npieces &&
           (d->pieces[d->cursor].state != P_WAITING || d->pieces[d->cursor].not_before))
        d->cursor++;
    return d->cursor < d->npieces ? &d->pieces[d->cursor++] : NULL;
}

/* A 200 answer to a Range request: the server ignores Range, so this piece
 * takes over the following pieces that have not started. */
static void absorb_following(dl *d, dl_piece *p)
{
    dl_file *f = p->f;
    for (size_t j = (size_t)(p - d->pieces) + 1; j < f->first + f->npieces; j++) {
        dl_piece *q = &d->pieces[j];
        if (q->state != P_WAITING || q->got || q->start != p->end) break;
        p->end = q->end;
        q->state = P_ABSORBED;
        f->pieces_done++;
    }
}

static size_t header_cb(char *ptr, size_t size, size_t n, void *ctx)
{
    dl_piece *p = ctx;
    hub_answer_header(&p->ans, ptr, size * n);
    return size * n;
}

/* Looks at the status of an attempt on its first body bytes. false: stop it. */
static bool check_answer(dl_piece *p)
{
    dl_file *f = p->f;
    dl *d = p->d;
    long st = 0;
    curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, &st);
    if (st == 206) {
        unsigned long long a, b, t;
        if (sscanf(p->ans.content_range, "bytes %llu-%llu/%llu", &a, &b, &t) != 3) {
            p->why = "a 206 answer without a usable Content-Range";
            return false;
        }
        if (t != f->e->size) {
            set_fatal(d, ckpt_error_set(CKPT_ECORRUPT,
                                        "%s: the Hub serves %llu bytes, the tree lists %llu",
                                        f->e->path, t, (unsigned long long)f->e->size));
            return false;
        }
        if (a != p->start + p->got) {
            p->why = "a Content-Range that does not start where asked";
            return false;
        }
        p->writing = true;
    } else if (st == 200) {
        curl_off_t cl = -1;
        curl_easy_getinfo(p->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
        if (cl >= 0 && (uint64_t)cl != f->e->size) {
            set_fatal(d, ckpt_error_set(CKPT_ECORRUPT,
                                        "%s: the Hub serves %lld bytes, the tree lists %llu",
                                        f->e->path, (long long)cl, (unsigned long long)f->e->size));
            return false;
        }
        if (p->ranged) { /* Range ignored: the body is the file from byte 0; never append it */
            ckpt_debug("%s: the server ignored Range; restarting bytes %llu-%llu", f->e->path,
                       (unsigned long long)p->start, (unsigned long long)p->end);
            d->done -= p->got;
            p->got = p->attempt_got = 0;
            p->skip = p->start;
            if (!p->header) absorb_following(d, p);
        }
        p->writing = true;
    }
    return true;
}

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *ctx)
{
    dl_piece *p = ctx;
    dl *d = p->d;
    size_t n = size * nmemb;
    d->received += n;
    if (!p->checked) {
        p->checked = true;
        if (!check_answer(p)) return 0;
    }
    if (!p->writing) { /* an error answer's body: its headers say enough */
        p->error_body += n;
        if (p->error_body <= HUB_MAX_ERROR_BODY) return n;
        p->why = "an error answer with an endless body (cut)";
        return 0;
    }
    size_t off = 0;
    if (p->skip) {
        off = p->skip < n ? (size_t)p->skip : n;
        p->skip -= off;
    }
    while (off < n && p->got < p->end - p->start) {
        uint64_t want = p->end - p->start - p->got;
        if (p->header && !p->f->hdr_len && p->got < 8 && want > 8 - p->got)
            want = 8 - p->got; /* N first */
        size_t take = n - off < want ? n - off : (size_t)want;
        int rc = sink_write(p, ptr + off, take, p->start + p->got);
        if (rc < 0) {
            set_fatal(d, rc);
            return 0;
        }
        p->got += take;
        d->done += take;
        off += take;
        if (p->header && !p->f->hdr_len && p->got == 8) header_length_known(p);
    }
    /* More than the piece needs (a whole-file answer, or a header probe past the header): stop the
     * transfer. */
    return off < n && p->got == p->end - p->start ? 0 : n;
}

static int start_piece(dl *d, dl_piece *p)
{
    dl_file *f = p->f;
    CURL *e = d->pool[--d->npool];
    curl_easy_reset(e);
    hub_easy_defaults(e);
    const char *url = p->url ? p->url : f->redirect_url ? f->redirect_url : f->url;
    p->elsewhere = url != f->url;
    uint64_t from = p->start + p->got;
    p->ranged = !(from == 0 && p->end == f->e->size);
    p->hdrs = hub_request_headers(d->h, url, from, p->ranged ? p->end : 0);
    if (!p->hdrs) {
        d->pool[d->npool++] = e;
        return ckpt_error_set(CKPT_ENOMEM, "out of memory for request headers");
    }
    p->checked = p->writing = false;
    p->why = NULL;
    p->attempt_got = p->got;
    p->skip = 0;
    p->error_body = 0;
    p->curl_err[0] = 0;
    int trc = hub_easy_timeouts(d->h, e, d->repo);
    if (trc) {
        curl_slist_free_all(p->hdrs);
        p->hdrs = NULL;
        d->pool[d->npool++] = e;
        return trc;
    }
    hub_answer_reset(&p->ans);
    p->easy = e;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, p->hdrs);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, p);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, p);
    curl_easy_setopt(e, CURLOPT_PRIVATE, p);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, p->curl_err);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, DL_CURL_BUFFER);
    if (curl_multi_add_handle(d->multi, e) != CURLM_OK) {
        curl_slist_free_all(p->hdrs);
        p->hdrs = NULL;
        p->easy = NULL;
        d->pool[d->npool++] = e;
        return ckpt_error_set(CKPT_EIO, "libcurl refused a transfer");
    }
    p->state = P_ACTIVE;
    d->active++;
    return 0;
}

/* Tells the hasher how far f is written (and whether wholly: one more download). */
static void publish_progress(dl *d, dl_file *f, uint64_t ready, bool all)
{
    if (all) f->downloads++;
    pthread_mutex_lock(&d->mu);
    f->ready = ready;
    f->all_done = all;
    work_push(d, f);
    pthread_mutex_unlock(&d->mu);
}

/* A piece whose bytes are all written. */
/* Starts writeback of a finished piece's bytes, so that publishing (which
 * syncs) finds little left to write. Advice only: errors do not matter. */
static void start_writeback(const dl_file *f, uint64_t from, uint64_t to)
{
    while (from < to && f->nrg) {
        size_t k = region_at(f, from);
        if (k >= f->nrg) return;
        const region *r = &f->rg[k];
        uint64_t stop = r->off + r->len < to ? r->off + r->len : to;
        if (stop > from)
            sync_file_range(r->fd, (off64_t)(from - r->off), (off64_t)(stop - from),
                            SYNC_FILE_RANGE_WRITE);
        from = stop > from ? stop : from + 1;
    }
}

/* A resume counts a piece only once its bytes are on disk: every region it
 * touches is fdatasync'ed, then the journal gets its line (synced too). */
static int record_piece(dl_file *f, uint64_t from, uint64_t to)
{
    for (uint64_t at = from; at < to && f->nrg;) {
        size_t k = region_at(f, at);
        if (k >= f->nrg) break;
        const region *r = &f->rg[k];
        if (fdatasync(r->fd) < 0) return ckpt_error_sys("%s: sync", f->ws[k].tmp_path);
        at = r->off + r->len;
    }
    return store_partial_journal_add(f->jfd, f->pdir, from, to);
}

static void piece_done(dl *d, dl_piece *p)
{
    dl_file *f = p->f;
    p->state = P_DONE;
    f->pieces_done++;
    ckpt_fault("fetch.piece_done");
    int rc = 0;
    if (!p->header && f->pdir)
        rc = record_piece(f, p->start, p->end);
    else if (!p->header)
        start_writeback(f, p->start, p->end);
    if (p->header) {
        rc = header_done(d, f);
        if (!rc && f->bad_header) { /* no data pieces: the hasher gives the verdict */
            publish_progress(d, f, 0, true);
            return;
        }
        if (!rc && f->pdir) { /* kept for a resume, whole or not at all */
            char *path = ckpt_path_join(f->pdir, "header");
            rc = path ? ckpt_write_file_atomic(path, f->hdr, (size_t)f->hdr_len) : CKPT_ENOMEM;
            free(path);
        }
    }
    if (rc) {
        set_fatal(d, rc);
        return;
    }
    advance_prefix(d, f);
}

static void piece_finished(dl *d, dl_piece *p, CURLcode res)
{
    long status = 0;
    curl_off_t ra = -1;
    char *loc = NULL, *redirect = NULL;
    curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(p->easy, CURLINFO_RETRY_AFTER, &ra);
    if (status >= 300 && status < 400 &&
        curl_easy_getinfo(p->easy, CURLINFO_REDIRECT_URL, &loc) == CURLE_OK && loc)
        redirect = ckpt_strdup(loc);
    curl_multi_remove_handle(d->multi, p->easy);
    d->pool[d->npool++] = p->easy;
    p->easy = NULL;
    curl_slist_free_all(p->hdrs);
    p->hdrs = NULL;
    d->active--;
    p->state = P_WAITING;
    if (d->fatal) {
        free(redirect);
        return;
    }
    dl_file *f = p->f;
    char why[CURL_ERROR_SIZE + 64];
    /* The endpoint names the LFS file's sha256 in X-Linked-Etag (quoted, or
     * weak W/"..."; on a redirect to Xet storage too): one that differs from
     * the tree's is a file that changed under the commit, not worth a byte. */
    if (!p->elsewhere && *p->ans.linked_etag && f->e->sha256[0] && (status < 400 || status >= 600) &&
        strcmp(p->ans.linked_etag, f->e->sha256)) {
        set_fatal(d, ckpt_error_set(CKPT_ECORRUPT,
                                    "%s: the Hub's X-Linked-Etag is %.70s, the tree's lfs.oid %s; nothing was stored",
                                    f->e->path, p->ans.linked_etag, f->e->sha256));
        free(redirect);
        return;
    }
    if ((status == 200 || status == 206) && p->url && !f->redirect_url)
        f->redirect_url = ckpt_strdup(p->url);
    if (p->elsewhere && (status == 401 || status == 403 || status == 404 || status == 410)) {
        /* A redirect's target (a signed CDN URL) refused: it may have expired; ask the endpoint
         * again. */
        free(p->url);
        p->url = NULL;
        free(f->redirect_url);
        f->redirect_url = NULL;
        snprintf(why, sizeof why, "the redirect's target answered %ld", status);
        retry_or_give_up(d, p, why, 0);
    } else if (status == 200 || status == 206) {
        if (p->got == p->end - p->start)
            piece_done(d, p);
        else if (p->got - p->attempt_got >=
                 DL_MIN_PROGRESS) { /* dropped mid-way: resume at the next byte */
            p->fails = 0;
            ckpt_debug("%s: connection dropped at byte %llu; resuming", f->e->path,
                       (unsigned long long)(p->start + p->got));
            requeue(d, p, 0);
        } else { /* resumed at the next byte too, but it counts as a failure */
            snprintf(why, sizeof why, "%s (after %llu bytes)",
                     p->why         ? p->why
                     : *p->curl_err ? p->curl_err
                                    : "the answer ended early",
                     (unsigned long long)(p->got - p->attempt_got));
            retry_or_give_up(d, p, why, 0);
        }
    } else if (status >= 300 && status < 400) {
        if (!redirect || ++p->redirects > HUB_MAX_REDIRECTS) {
            set_fatal(d, ckpt_error_set(CKPT_EINVAL, "%s: %s", f->e->path,
                                        redirect ? "too many redirects"
                                                 : "a redirect without a Location"));
        } else {
            free(p->url);
            p->url = redirect;
            redirect = NULL;
            requeue(d, p, 0);
        }
    } else if (status == 0 || hub_status_transient(status)) {
        double wait = ra > 0 ? (double)ra : 0;
        if ((status == 429 || status == 503) &&
            wait > 0) { /* hold every new request, not just this one */
            double until =
                ckpt_now() + (wait < HUB_RETRY_AFTER_CAP_S ? wait : HUB_RETRY_AFTER_CAP_S);
            if (until > d->hold_until) d->hold_until = until;
        }
        if (status)
            snprintf(why, sizeof why, "the Hub answered %ld", status);
        else
            snprintf(why, sizeof why, "%s", *p->curl_err ? p->curl_err : curl_easy_strerror(res));
        retry_or_give_up(d, p, why, wait);
    } else if (status == 416) {
        set_fatal(d,
                  ckpt_error_set(CKPT_ECORRUPT,
                                 "%s: the Hub has fewer bytes than the %llu the tree lists (416)",
                                 f->e->path, (unsigned long long)f->e->size));
    } else {
        hub_what w = {d->repo, d->commit, f->e->path};
        set_fatal(d, hub_answer_error(d->h, status, &p->ans, &w));
    }
    free(redirect);
}

/* Starts f over (a second download): new writers, pieces from the first byte. */
static void file_reset(dl *d, dl_file *f)
{
    for (size_t k = 0; k < f->npieces; k++) {
        dl_piece *p = &d->pieces[f->first + k];
        if (p->state != P_ABSORBED) d->done -= p->got;
        free(p->url);
        p->url = NULL;
        p->state = P_UNUSED;
    }
    file_drop(f);
    pthread_mutex_lock(&d->mu);
    f->ready = 0;
    f->all_done = false;
    for (int k = 0; k < 2; k++) {
        f->hashed[k] = 0;
        f->sdone[k] = false;
        f->sresult[k] = 0;
        f->herr[k][0] = 0;
    }
    f->verdict = 0;
    f->actual[0] = 0;
    pthread_mutex_unlock(&d->mu);
    hash_drop(f);
    f->wipe = true; /* what is kept for a resume may be what went wrong */
    int rc = file_begin(d, f);
    for (size_t k = 0; !rc && k < f->npieces; k++)
        requeue(d, &d->pieces[f->first + k], 0);
    if (rc)
        set_fatal(d, rc);
    else if (f->npieces == 0)
        publish_progress(d, f, 0, true);
}

static void take_verdicts(dl *d)
{
    pthread_mutex_lock(&d->mu);
    size_t n = d->nverdicts;
    size_t *v = n ? ckpt_malloc(n * sizeof *v) : NULL;
    if (v) memcpy(v, d->verdicts, n * sizeof *v);
    d->nverdicts = 0;
    pthread_mutex_unlock(&d->mu);
    if (n && !v) {
        set_fatal(d, CKPT_ENOMEM);
        return;
    }
    for (size_t i = 0; i < n && !d->fatal; i++) {
        dl_file *f = &d->files[v[i]];
        const hub_entry *e = f->e;
        const char *what = e->sha256[0] ? "sha256" : "git blob id";
        const char *want = e->sha256[0] ? e->sha256 : e->oid;
        if (f->verdict == 1) {
            d->verified++;
            if (d->file_lines) {
                char sz[32];
                ckpt_info("%s: %s, verified (%zu/%zu files)", e->path, ckpt_format_size(e->size, sz, sizeof sz),
                          d->verified, d->nfiles);
            }
        } else if (f->verdict != CKPT_ECORRUPT) {
            /* Not the bytes' fault: reading them back or the digest failed.
             * The code says which (CKPT_EIO is transient for the job). */
            set_fatal(d, ckpt_error_set(f->verdict, "%s: verifying the download: %s", e->path,
                                        f->herr[0][0] ? f->herr[0] : f->herr[1]));
        } else if (f->bad_header && f->downloads < 2) {
            ckpt_warn("%s: the header does not parse (%s); downloading it again", e->path,
                      f->bad_header);
            file_reset(d, f);
        } else if (f->bad_header) {
            set_fatal(
                d,
                ckpt_error_set(
                    CKPT_EINVAL,
                    "%s: not a valid safetensors file (downloaded twice): %s; nothing was stored",
                    e->path, f->bad_header));
        } else if (f->downloads < 2) {
            ckpt_warn("%s: %s of the download is %s, the Hub says %s; downloading it again",
                      e->path, what, f->actual, want);
            file_reset(d, f);
        } else {
            set_fatal(d, ckpt_error_set(CKPT_ECORRUPT,
                                        "%s: %s of the download is %s, the Hub says %s (downloaded "
                                        "twice); nothing was stored",
                                        e->path, what, f->actual, want));
        }
    }
    free(v);
}

/* ---- progress ---- */

/* One line for the whole fetch (on a TTY, rewritten in place): files
 * verified, bytes written of all files (kept ones included), the rate of
 * this run and the ETA (common/log.c draws it). */
static void show_progress(dl *d, ckpt_progress *pr, char *label, size_t len)
{
    snprintf(label, len, "fetch %zu/%zu files", d->verified, d->nfiles);
    ckpt_progress_update(pr, d->done);
}

/* ---- the record ---- */

/* Hands the verified files to rec and their writers to blobs (in file order). */
static int build_record(dl *d, store_ckpt_rec *rec, hub_blobs *blobs)
{
    size_t nw = 0;
    for (size_t i = 0; i < d->nfiles; i++)
        nw += d->files[i].nrg;
    blobs->w = ckpt_calloc(nw + 1, sizeof *blobs->w);
    int rc =
        blobs->w ? ckpt_grow(&rec->files, &rec->cap, d->nfiles, sizeof *rec->files) : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < d->nfiles; i++) {
        dl_file *f = &d->files[i];
        store_file_rec *fr = &rec->files[rec->nfiles++];
        memset(fr, 0, sizeof *fr);
        fr->path = ckpt_strdup(f->e->path);
        fr->size = f->e->size;
        memcpy(fr->sha256, f->sha256, 65);
        if (!fr->path) rc = CKPT_ENOMEM;
        for (size_t k = 0; !rc && k < f->nrg; k++)
            rc = store_blob_end_external(&f->ws[k], f->rg[k].len, f->blob_sha[k]);
        if (!rc && f->st) {
            fr->header = f->hdr; /* the exact header bytes */
            fr->header_len = (size_t)f->hdr_len;
            f->hdr = NULL;
            fr->tensors = ckpt_calloc(f->nrg + 1, sizeof *fr->tensors);
            fr->ntensors = fr->cap = f->nrg;
            for (size_t k = 0; fr->tensors && k < f->nrg; k++) {
                fr->tensors[k].name = ckpt_strdup(f->sf.tensors[k].name);
                fr->tensors[k].blob = ckpt_strdup(f->blob_sha[k]);
                if (!fr->tensors[k].name || !fr->tensors[k].blob) rc = CKPT_ENOMEM;
            }
            if (!fr->tensors) rc = CKPT_ENOMEM;
        } else if (!rc) {
            fr->blob = ckpt_strdup(f->blob_sha[0]);
            if (!fr->blob) rc = CKPT_ENOMEM;
        }
        /* The writers move to blobs: the file no longer owns their temp files. */
        for (size_t k = 0; k < f->nrg; k++)
            blobs->w[blobs->n++] = f->ws[k];
        f->nrg = 0;
    }
    return rc;
}

/* ---- the whole download ---- */

/* One blob writer per tensor stays open until publishing: lift the soft
 * limit on open files to the hard one. */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static int setup(dl *d)
{
    d->chunk = d->h->chunk_size < HUB_MIN_CHUNK ? HUB_MIN_CHUNK : d->h->chunk_size;
    size_t slots = 0;
    for (size_t i = 0; i < d->nfiles; i++) {
        dl_file *f = &d->files[i];
        size_t len = strlen(f->e->path);
        f->st = len >= 12 && !strcmp(f->e->path + len - 12, ".safetensors");
        f->chunk = d->chunk;
        while (f->e->size / f->chunk >= DL_MAX_PIECES_PER_FILE)
            f->chunk *= 2;
        f->maxpieces =
            (size_t)((f->e->size + f->chunk - 1) / f->chunk) + 1; /* + the header piece */
        f->first = slots;
        slots += f->maxpieces;
        if (!ckpt_add(d->total, f->e->size, &d->total))
            return ckpt_error_set(CKPT_ELIMIT, "%s: sizes overflow", d->repo);
    }
    /* The bytes go to temp files before publishing: they must fit, less
     * what an interrupted fetch of the commit holds on disk already. */
    struct statvfs sv;
    if (statvfs(d->s->tmp_dir, &sv) == 0) {
        uint64_t avail = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
        uint64_t held = d->part ? store_partial_bytes(d->part) : 0;
        if (d->total > avail && d->total - avail > held) {
            char a[32], b[32];
            return ckpt_error_set(CKPT_ELIMIT,
                                  "%s: the %zu files picked declare %s, more than the %s free in %s; "
                                  "nothing was downloaded",
                                  d->repo, d->nfiles, ckpt_format_size(d->total, a, sizeof a),
                                  ckpt_format_size(avail, b, sizeof b), d->s->tmp_dir);
        }
    }
    d->npieces = slots;
    d->pieces = ckpt_calloc(slots + 1, sizeof *d->pieces);
    if (!d->pieces) return CKPT_ENOMEM;
    for (size_t i = 0; i < d->nfiles; i++) {
        dl_file *f = &d->files[i];
        f->url = hub_file_url(d->h, d->repo, d->commit, f->e->path);
        if (!f->url) return CKPT_ENOMEM;
        int rc = file_begin(d, f);
        if (rc) return rc;
        if (f->npieces == 0)
            publish_progress(d, f, 0, true); /* an empty file: nothing to download, still checked */
    }
    return d->fatal;
}

static void stop_hashers(dl *d)
{
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    for (int k = 0; k < d->hashers_started; k++)
        pthread_join(d->hs[k].th, NULL);
    d->hashers_started = 0;
}

static void teardown(dl *d)
{
    stop_hashers(d);
    for (size_t i = 0; d->pieces && i < d->npieces; i++) {
        dl_piece *p = &d->pieces[i];
        if (p->easy) {
            curl_multi_remove_handle(d->multi, p->easy);
            d->pool[d->npool++] = p->easy;
        }
        curl_slist_free_all(p->hdrs);
        hub_answer_reset(&p->ans);
        free(p->url);
    }
    for (size_t i = 0; d->pool && i < d->npool; i++)
        curl_easy_cleanup(d->pool[i]);
    if (d->multi) curl_multi_cleanup(d->multi);
    for (size_t i = 0; d->files && i < d->nfiles; i++) {
        hash_drop(&d->files[i]);
        file_drop(&d->files[i]);
        free(d->files[i].url);
        free(d->files[i].redirect_url);
    }
    free(d->files);
    free(d->pieces);
    free(d->pool);
    free(d->retry);
    for (int k = 0; k < 2; k++) {
        free(d->hs[k].work);
        free(d->hs[k].buf);
    }
    free(d->verdicts);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
}

int hub_download(hub_client *h, ckpt_store *s, const char *repo, const char *commit,
                 const hub_entry *files, size_t n, bool quiet, store_partial *part,
                 store_ckpt_rec *rec, hub_blobs *blobs, uint64_t *bytes)
{
    *bytes = 0;
    memset(blobs, 0, sizeof *blobs);
    if (n == 0) return 0;
    raise_fd_limit();
    dl d;
    memset(&d, 0, sizeof d);
    d.h = h;
    d.s = s;
    d.repo = repo;
    d.commit = commit;
    d.part = part;
    d.nfiles = n;
    pthread_mutex_init(&d.mu, NULL);
    pthread_cond_init(&d.cv, NULL);
    int conns = h->connections < 1                     ? 1
                : h->connections > HUB_MAX_CONNECTIONS ? HUB_MAX_CONNECTIONS
                                                       : h->connections;
    d.files = ckpt_calloc(n, sizeof *d.files);
    d.pool = ckpt_calloc((size_t)conns, sizeof *d.pool);
    for (int k = 0; k < 2; k++) {
        d.hs[k].d = &d;
        d.hs[k].stream = k;
        d.hs[k].buf = ckpt_malloc(DL_HASH_STEP);
    }
    d.multi = curl_multi_init();
    int rc = d.files && d.pool && d.hs[0].buf && d.hs[1].buf ? 0 : CKPT_ENOMEM;
    if (!rc && !d.multi) rc = ckpt_error_set(CKPT_EIO, "libcurl: cannot make a multi handle");
    for (size_t i = 0; !rc && i < n; i++) {
        d.files[i].e = &files[i];
        d.files[i].jfd = -1;
    }
    for (int i = 0; !rc && i < conns; i++) {
        if (!(d.pool[d.npool] = curl_easy_init()))
            rc = ckpt_error_set(CKPT_ENOMEM, "libcurl: cannot make a handle");
        else
            d.npool++;
    }
    if (!rc) {
        curl_multi_setopt(d.multi, CURLMOPT_MAXCONNECTS, (long)conns);
        rc = setup(&d);
    }
    for (int k = 0; !rc && k < 2; k++) {
        if (pthread_create(&d.hs[k].th, NULL, hasher_main, &d.hs[k]))
            rc = ckpt_error_set(CKPT_EIO, "cannot start a hasher thread");
        else
            d.hashers_started++;
    }
    if (!rc && d.kept && !quiet) {
        char a[32], b[32];
        ckpt_info("%s: resuming an interrupted fetch: %s of %s kept (read back and verified at the end)", repo,
                  ckpt_format_size(d.kept, a, sizeof a), ckpt_format_size(d.total, b, sizeof b));
    }
    ckpt_progress pr;
    char label[200] = "fetch";
    ckpt_progress_start(&pr, label, d.total);
    pr.base = d.kept;   /* the rate and ETA are this run's */
    pr.no_plain = 1;    /* not on a TTY: the lines of take_verdicts */
    d.file_lines = !quiet && !pr.tty;
    double last_progress = 0;
    while (!rc && !d.fatal) {
        take_verdicts(&d);
        if (d.fatal || d.verified == d.nfiles) break;
        double now = ckpt_now();
        if (hub_past_deadline(h)) {
            set_fatal(&d, hub_deadline_error(h, repo));
            break;
        }
        while (d.active < conns && !d.fatal && now >= d.hold_until) {
            dl_piece *p = next_piece(&d, now);
            if (!p) break;
            int src = start_piece(&d, p);
            if (src) set_fatal(&d, src);
        }
        int running = 0;
        curl_multi_perform(d.multi, &running);
        CURLMsg *m;
        int left;
        bool finished = false;
        while ((m = curl_multi_info_read(d.multi, &left))) {
            if (m->msg != CURLMSG_DONE) continue;
            char *priv = NULL;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
            if (priv) piece_finished(&d, (dl_piece *)(void *)priv, m->data.result);
            finished = true;
        }
        if (!quiet && now - last_progress >= 0.1) {
            last_progress = now;
            show_progress(&d, &pr, label, sizeof label);
        }
        if (finished) continue; /* a connection is free: start the next piece at once */
        if (d.active > 0 || running)
            curl_multi_poll(d.multi, NULL, 0, DL_POLL_MS, NULL);
        else {
            /* Nothing in flight: wait for a retry to come due or for the hasher. */
            double wait = DL_POLL_MS / 1000.0;
            if (d.hold_until > now && d.hold_until - now < wait) wait = d.hold_until - now;
            curl_multi_poll(d.multi, NULL, 0, (int)(wait * 1000) + 1, NULL);
        }
    }
    if (!rc && d.fatal) rc = ckpt_error_set(d.fatal, "%s", d.fatal_msg);
    if (!rc && !quiet) {
        show_progress(&d, &pr, label, sizeof label);
        ckpt_progress_finish(&pr);
    }
    if (!rc) {
        stop_hashers(&d); /* before their files are handed over */
        rc = build_record(&d, rec, blobs);
        if (rc) hub_blobs_abort(blobs);
    }
    *bytes = d.received;
    teardown(&d);
    return rc;
}
