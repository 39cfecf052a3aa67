/*
 * store_import.c — ingest a local Hugging Face directory into the store.
 *
 * Each safetensors file is validated (st_open), then read once, in order, in
 * chunks: a thread hashes the whole file (its sha256), another cuts the
 * chunks into the tensors and writes each to its own blob (hashed as it
 * goes), while the importing thread reads on. Other files become whole-file blobs. When every
 * blob is published, one transaction adds the checkpoint. A directory without
 * a commit id gets a content id: the sha256 of its files' paths and hashes,
 * so importing the same directory twice finds the same checkpoint.
 */
#include "store/store.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "format/safetensors.h"
#include "transform/convert.h"

#include <jansson.h>

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IMPORT_CHUNK (8u << 20)
#define IMPORT_RING 3 /* chunks in flight between the reader and the file hasher */
#define IMPORT_BUF (IMPORT_CHUNK + 2 * CKPT_DIRECT_ALIGN)

typedef struct {
    char *path; /* relative */
    dev_t dev;  /* what walk found there: the file opened later must be it */
    ino_t ino;
    uint64_t size; /* when found: the progress counts bytes */
} found_file;

typedef struct {
    found_file *v;
    size_t n, cap;
} file_list;

/* Import reads regular files only and follows no symbolic link, not even one
 * that stays in the folder: a link is resolved when it is opened, so what it
 * pointed to when checked says nothing about what is read, and a folder that
 * is given to the daemon could otherwise hand it ~/.ssh/id_rsa or
 * /proc/self/environ. Devices, FIFOs and sockets are refused too. Walked with
 * lstat; each file opened is checked to be the one walked (import_open). */
static int walk(const char *root, const char *rel, file_list *fl, int depth)
{
    if (depth > 16) return ckpt_error_set(CKPT_ELIMIT, "%s/%s: folders nested too deep", root, rel);
    char *dir = *rel ? ckpt_path_join(root, rel) : ckpt_strdup(root);
    if (!dir) return CKPT_ENOMEM;
    DIR *d = opendir(dir);
    if (!d) {
        int rc = ckpt_error_sys("%s: open directory", dir);
        free(dir);
        return rc;
    }
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue; /* ., .., .git, .cache, temp files */
        char *r = *rel ? ckpt_sprintf("%s/%s", rel, e->d_name) : ckpt_strdup(e->d_name);
        char *full = r ? ckpt_path_join(root, r) : NULL;
        struct stat st;
        if (!r || !full) rc = CKPT_ENOMEM;
        else if ((rc = store_path_check(r))) ckpt_error_prefix(rc, "%s", root);
        else if (lstat(full, &st) < 0) rc = ckpt_error_sys("%s: stat", full);
        else if (S_ISLNK(st.st_mode))
            rc = ckpt_error_set(CKPT_EINVAL,
                                "%s: a symbolic link; import reads regular files only and follows no link "
                                "(copy the folder with cp -rL to import what the links point to)",
                                full);
        else if (S_ISDIR(st.st_mode)) rc = walk(root, r, fl, depth + 1);
        else if (!S_ISREG(st.st_mode))
            rc = ckpt_error_set(CKPT_EINVAL, "%s: not a regular file (a device, FIFO or socket); import refuses it",
                                full);
        else if (fl->n >= STORE_MAX_FILES) rc = ckpt_error_set(CKPT_ELIMIT, "%s: more than %d files", root, STORE_MAX_FILES);
        else if (!(rc = ckpt_grow(&fl->v, &fl->cap, fl->n + 1, sizeof *fl->v))) {
            fl->v[fl->n++] = (found_file){.path = r, .dev = st.st_dev, .ino = st.st_ino, .size = (uint64_t)st.st_size};
            r = NULL;
        }
        free(r);
        free(full);
    }
    closedir(d);
    free(dir);
    return rc;
}

/* fd (open path) is the regular file walk found there, not something put in
 * its place since (a link, a FIFO, another file). */
static int check_same_file(int fd, const char *path, const found_file *ff)
{
    struct stat st;
    if (fstat(fd, &st) < 0) return ckpt_error_sys("%s: stat", path);
    if (!S_ISREG(st.st_mode) || st.st_dev != ff->dev || st.st_ino != ff->ino)
        return ckpt_error_set(CKPT_EINVAL, "%s: replaced while the folder was being imported; import refuses it", path);
    return 0;
}

static int cmp_found(const void *a, const void *b)
{
    return strcmp(((const found_file *)a)->path, ((const found_file *)b)->path);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Blob writers of one import, published together. */
typedef struct {
    store_blob_writer *w;
    size_t n, cap;
} writer_list;

static store_blob_writer *new_writer(ckpt_store *s, writer_list *wl, int *rc)
{
    *rc = ckpt_grow(&wl->w, &wl->cap, wl->n + 1, sizeof *wl->w);
    if (*rc) return NULL;
    store_blob_writer *w = &wl->w[wl->n];
    *rc = store_blob_begin(s, w);
    if (*rc) return NULL;
    wl->n++;
    return w;
}

/* Whole file -> one blob. */
static int import_plain(ckpt_store *s, const char *path, const found_file *ff, store_file_rec *fr, writer_list *wl,
                        uint8_t *buf)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return ckpt_error_sys("%s: open", path);
    int rc = check_same_file(fd, path, ff);
    store_blob_writer *w = rc ? NULL : new_writer(s, wl, &rc);
    for (;;) {
        if (rc) break;
        ssize_t n = read(fd, buf, IMPORT_CHUNK);
        if (n < 0) rc = ckpt_error_sys("%s: read", path);
        if (n <= 0) break;
        rc = store_blob_write(w, buf, (size_t)n);
    }
    close(fd);
    if (!rc) rc = store_blob_end(w);
    if (!rc) rc = store_blob_submit(s, w);
    if (rc) return rc;
    fr->size = w->size;
    memcpy(fr->sha256, w->sha256, sizeof fr->sha256);
    fr->blob = ckpt_strdup(w->sha256);
    return fr->blob ? 0 : CKPT_ENOMEM;
}

/* A safetensors file is read once, front to back, in chunks of a ring, by
 * the importing thread, and two threads take every chunk: the file hasher
 * (the file's sha256) and the tensor thread, which cuts the data section into
 * its tensors (they tile it in offset order: st_open checks) and hashes and
 * writes each to its blob. Reading, hashing the file and writing the blobs
 * are then on both cores at once, and the per-tensor work (a temp file, a
 * hash, a close) waits for no read. A chunk is refilled once both are done
 * with it. */
typedef struct {
    uint8_t *ring[IMPORT_RING];
    size_t len[IMPORT_RING];
    uint64_t posted, hashed, taken; /* chunks read; hashed; cut into tensors */
    ckpt_sha256 h;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool closing;
    bool cut;                 /* the tensor thread took every tensor */
    int err;                  /* the first failure of any of the three */
    char msg[1024];           /* its message (errors are per thread) */
} file_hasher;

/* Records the first failure (rc, with this thread's message) and wakes everyone. */
static void file_hasher_fail(file_hasher *fh, int rc)
{
    pthread_mutex_lock(&fh->mu);
    if (!fh->err) {
        fh->err = rc;
        snprintf(fh->msg, sizeof fh->msg, "%s", ckpt_error_last());
    }
    pthread_cond_broadcast(&fh->cv);
    pthread_mutex_unlock(&fh->mu);
}

static void *file_hasher_main(void *arg)
{
    file_hasher *fh = arg;
    pthread_mutex_lock(&fh->mu);
    for (;;) {
        while (fh->hashed == fh->posted && !fh->closing) pthread_cond_wait(&fh->cv, &fh->mu);
        if (fh->hashed == fh->posted) break;
        size_t slot = (size_t)(fh->hashed % IMPORT_RING);
        bool failed = fh->err != 0;
        pthread_mutex_unlock(&fh->mu);
        int rc = failed ? 0 : ckpt_sha256_update(&fh->h, fh->ring[slot], fh->len[slot]);
        if (rc) file_hasher_fail(fh, rc);
        pthread_mutex_lock(&fh->mu);
        fh->hashed++;
        pthread_cond_broadcast(&fh->cv);
    }
    pthread_mutex_unlock(&fh->mu);
    return NULL;
}

/* The next chunk to read into, once both takers are done with it; NULL
 * after a failure. */
static uint8_t *file_hasher_slot(file_hasher *fh)
{
    pthread_mutex_lock(&fh->mu);
    while (!fh->err && (fh->posted - fh->hashed >= IMPORT_RING || (!fh->cut && fh->posted - fh->taken >= IMPORT_RING)))
        pthread_cond_wait(&fh->cv, &fh->mu);
    uint8_t *b = fh->err ? NULL : fh->ring[fh->posted % IMPORT_RING];
    pthread_mutex_unlock(&fh->mu);
    return b;
}

static void file_hasher_post(file_hasher *fh, size_t len)
{
    pthread_mutex_lock(&fh->mu);
    fh->len[fh->posted % IMPORT_RING] = len;
    fh->posted++;
    pthread_cond_broadcast(&fh->cv);
    pthread_mutex_unlock(&fh->mu);
}

/* Starts hashing a file whose first bytes (the header) are head. */
static int file_hasher_start(file_hasher *fh, uint8_t *const bufs[IMPORT_RING], const void *head, size_t head_len)
{
    memset(fh, 0, sizeof *fh);
    memcpy(fh->ring, bufs, sizeof fh->ring);
    int rc = ckpt_sha256_init(&fh->h);
    if (!rc) rc = ckpt_sha256_update(&fh->h, head, head_len);
    if (rc) {
        ckpt_sha256_free(&fh->h);
        return rc;
    }
    pthread_mutex_init(&fh->mu, NULL);
    pthread_cond_init(&fh->cv, NULL);
    if (pthread_create(&fh->thread, NULL, file_hasher_main, fh)) {
        pthread_mutex_destroy(&fh->mu);
        pthread_cond_destroy(&fh->cv);
        ckpt_sha256_free(&fh->h);
        return ckpt_error_set(CKPT_EIO, "cannot start a hashing thread");
    }
    return 0;
}

/* Waits for what was posted; the file's sha256 into hex (when hex). */
static int file_hasher_finish(file_hasher *fh, char hex[65])
{
    pthread_mutex_lock(&fh->mu);
    fh->closing = true;
    pthread_cond_broadcast(&fh->cv);
    pthread_mutex_unlock(&fh->mu);
    pthread_join(fh->thread, NULL);
    pthread_mutex_destroy(&fh->mu);
    pthread_cond_destroy(&fh->cv);
    int rc = fh->err ? ckpt_error_set(fh->err, "%s", fh->msg) : 0;
    if (!rc && hex) return ckpt_sha256_final_hex(&fh->h, hex);
    ckpt_sha256_free(&fh->h);
    return rc;
}

/* The tensor thread's view of the ring: up to `want` bytes of the chunk it
 * is in (waiting for one to be read), or NULL when the reader stopped
 * (*err: a failure's code, or 0 when the data ended). */
static const uint8_t *ring_take(file_hasher *fh, size_t at, uint64_t want, size_t *len, int *err)
{
    pthread_mutex_lock(&fh->mu);
    while (!fh->err && !fh->closing && fh->taken == fh->posted) pthread_cond_wait(&fh->cv, &fh->mu);
    size_t slot = (size_t)(fh->taken % IMPORT_RING);
    const uint8_t *b = fh->err || fh->taken == fh->posted ? NULL : fh->ring[slot] + at;
    if (b) *len = fh->len[slot] - at < want ? fh->len[slot] - at : (size_t)want;
    *err = fh->err;
    pthread_mutex_unlock(&fh->mu);
    return b;
}

/* The tensor thread is done with the chunk it was in. */
static void ring_release(file_hasher *fh)
{
    pthread_mutex_lock(&fh->mu);
    fh->taken++;
    pthread_cond_broadcast(&fh->cv);
    pthread_mutex_unlock(&fh->mu);
}

typedef struct {
    ckpt_store *s;
    const char *path;
    st_file *f;
    store_file_rec *fr;
    writer_list *wl;
    uint8_t *spare; /* a chunk of its own, for a tensor read again */
    bool *probe;
    file_hasher *fh;
    size_t at; /* bytes of the current chunk already cut */
} tensor_cutter;

/* The next n bytes of the ring into a tensor hash th (unless NULL) and a
 * blob writer w (unless NULL). */
static int cut_tensor(tensor_cutter *tc, uint64_t n, ckpt_sha256 *th, store_blob_writer *w)
{
    for (uint64_t done = 0; done < n;) {
        size_t k = 0;
        int err = 0;
        const uint8_t *b = ring_take(tc->fh, tc->at, n - done, &k, &err);
        if (!b) return err ? err : ckpt_error_set(CKPT_EIO, "%s: the data ended early", tc->path);
        int rc = th ? ckpt_sha256_update(th, b, k) : 0;
        if (!rc && w) rc = store_blob_write(w, b, k);
        if (rc) return rc;
        done += k;
        tc->at += k;
        if (tc->at == tc->fh->len[tc->fh->taken % IMPORT_RING]) {
            tc->at = 0;
            ring_release(tc->fh);
        }
    }
    return 0;
}

/* One tensor's bytes [off, off + n) of fd read again, into a blob writer. */
static int reread_tensor(int fd, const char *path, uint64_t off, uint64_t n, uint8_t *buf, store_blob_writer *w)
{
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < IMPORT_CHUNK ? (size_t)(n - done) : IMPORT_CHUNK;
        int rc = ckpt_pread_full(fd, buf, k, off + done, path);
        if (!rc) rc = store_blob_write(w, buf, k);
        if (rc) return rc;
        done += k;
    }
    return 0;
}

/* Every tensor of the file, in offset order, to its blob. Tensors the store
 * holds already are not written again: after a tensor found stored (an
 * import of the same or an overlapping checkpoint), the next is hashed first
 * and written only when it turns out new (reading it twice); after a new
 * one, the next is hashed while written. */
static int cut_tensors(tensor_cutter *tc)
{
    ckpt_store *s = tc->s;
    const st_file *f = tc->f;
    int rc = 0;
    for (size_t i = 0; !rc && i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        char sha[65] = "";
        bool have = false, fed = false;
        if (*tc->probe) {
            ckpt_sha256 th;
            if (!(rc = ckpt_sha256_init(&th))) {
                rc = cut_tensor(tc, t->nbytes, &th, NULL);
                if (!rc) rc = ckpt_sha256_final_hex(&th, sha);
                else ckpt_sha256_free(&th);
            }
            fed = !rc;
            if (!rc) rc = store_blob_claim(s, sha, t->nbytes, &have);
        }
        if (!rc && !have) {
            store_blob_writer *w = new_writer(s, tc->wl, &rc);
            if (!rc) rc = fed ? reread_tensor(f->fd, tc->path, t->offset, t->nbytes, tc->spare, w)
                              : cut_tensor(tc, t->nbytes, NULL, w);
            if (!rc) rc = store_blob_end(w);
            if (!rc && fed && strcmp(sha, w->sha256))
                rc = ckpt_error_set(CKPT_EIO, "%s: tensor '%s' changed while it was being imported", tc->path, t->name);
            if (!rc) rc = store_blob_submit(s, w); /* a bucket: uploaded while the next tensors are staged */
            if (!rc) memcpy(sha, w->sha256, sizeof sha);
            /* Stored already: the next tensor may be too. In a bucket the
             * uploads tell, without a HEAD of each new blob here. */
            if (!rc && store_blobs_remote(s)) {
                *tc->probe = store_blobs_upload_found_stored(s);
            } else if (!rc) {
                bool stored = false;
                rc = store_blob_stat(s, sha, &stored, NULL);
                *tc->probe = stored;
            }
        } else if (!rc) {
            *tc->probe = true;
        }
        if (!rc) {
            tc->fr->tensors[i].name = ckpt_strdup(t->name);
            tc->fr->tensors[i].blob = ckpt_strdup(sha);
            if (!tc->fr->tensors[i].name || !tc->fr->tensors[i].blob) rc = CKPT_ENOMEM;
        }
    }
    return rc;
}

static void *tensor_cutter_main(void *arg)
{
    tensor_cutter *tc = arg;
    int rc = cut_tensors(tc);
    if (rc) file_hasher_fail(tc->fh, rc);
    pthread_mutex_lock(&tc->fh->mu);
    tc->fh->cut = true; /* the reader waits no more for this thread */
    pthread_cond_broadcast(&tc->fh->cv);
    pthread_mutex_unlock(&tc->fh->mu);
    return NULL;
}

/* Safetensors file -> header bytes + one blob per tensor, file hashed
 * alongside (see file_hasher). */
static int import_safetensors(ckpt_store *s, const char *path, const found_file *ff, store_file_rec *fr,
                              writer_list *wl, uint8_t *const bufs[IMPORT_RING + 1], bool *probe)
{
    st_file f;
    int rc = st_open(&f, path);
    if (rc) return rc;
    if ((rc = check_same_file(f.fd, path, ff))) {
        st_close(&f);
        return rc;
    }
    fr->size = f.file_size;
    fr->header_len = (size_t)f.data_start;
    fr->header = ckpt_malloc(fr->header_len);
    fr->tensors = ckpt_calloc(f.ntensors + 1, sizeof *fr->tensors);
    fr->ntensors = fr->cap = f.ntensors;
    /* The data section is read with O_DIRECT where the file system takes it
     * (a model is read once: no page cache filled, and on a VM whose fresh
     * memory is costly to touch a fraction of the system time); a chunk
     * starts where its offset lies in a block, so that the blocks around
     * it are read into its buffer (ckpt_pread_direct). */
    int dfd = ckpt_open_direct(path, f.fd);
    uint8_t *ring[IMPORT_RING];
    for (size_t i = 0; i < IMPORT_RING; i++) ring[i] = bufs[i] + f.data_start % CKPT_DIRECT_ALIGN;
    file_hasher fh;
    tensor_cutter tc = {.s = s, .path = path, .f = &f, .fr = fr, .wl = wl, .spare = bufs[IMPORT_RING], .probe = probe, .fh = &fh};
    pthread_t cutter;
    bool hashing = false, cutting = false;
    if (!fr->header || !fr->tensors) rc = CKPT_ENOMEM;
    if (!rc) rc = ckpt_pread_full(f.fd, fr->header, fr->header_len, 0, path);
    if (!rc && !(rc = file_hasher_start(&fh, ring, fr->header, fr->header_len))) hashing = true;
    if (!rc && pthread_create(&cutter, NULL, tensor_cutter_main, &tc)) rc = ckpt_error_set(CKPT_EIO, "cannot start a thread");
    if (!rc) cutting = true;
    posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (uint64_t off = f.data_start; !rc && off < f.file_size;) {
        size_t k = f.file_size - off < IMPORT_CHUNK ? (size_t)(f.file_size - off) : IMPORT_CHUNK;
        uint8_t *buf = file_hasher_slot(&fh);
        if (!buf) break; /* a taker failed: finish says why */
        rc = ckpt_pread_direct(dfd, f.fd, buf, k, off, path);
        if (!rc) file_hasher_post(&fh, k);
        off += k;
    }
    if (rc && hashing) file_hasher_fail(&fh, rc);
    if (cutting) {
        pthread_mutex_lock(&fh.mu);
        fh.closing = true; /* no more chunks: a cutter still waiting for one stops */
        pthread_cond_broadcast(&fh.cv);
        pthread_mutex_unlock(&fh.mu);
        pthread_join(cutter, NULL);
    }
    if (hashing) {
        int hrc = file_hasher_finish(&fh, rc ? NULL : fr->sha256);
        if (!rc) rc = hrc;
    }
    if (dfd >= 0) close(dfd);
    st_close(&f);
    return rc;
}

int store_content_id(const store_ckpt_rec *r, char out[41])
{
    ckpt_sha256 h;
    int rc = ckpt_sha256_init(&h);
    for (size_t f = 0; !rc && f < r->nfiles; f++) {
        rc = ckpt_sha256_update(&h, r->files[f].path, strlen(r->files[f].path) + 1);
        if (!rc) rc = ckpt_sha256_update(&h, r->files[f].sha256, 64);
        if (!rc) rc = ckpt_sha256_update(&h, "\n", 1);
    }
    char hex[65];
    if (rc) {
        ckpt_sha256_free(&h);
        return rc;
    }
    rc = ckpt_sha256_final_hex(&h, hex);
    memcpy(out, hex, 40);
    out[40] = 0;
    return rc;
}

static bool is_commit_sha(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n]) || isupper((unsigned char)s[n])) return false;
    return n == 40;
}

/* ckpt-source.json of a consolidated save: what it was, and every file of it
 * with its size and sha256 (in walk order). */
static int write_source_record(const char *save, const char *kind, const char *dst)
{
    file_list fl = {0};
    int rc = walk(save, "", &fl, 0);
    if (!rc) qsort(fl.v, fl.n, sizeof *fl.v, cmp_found);
    json_t *files = json_array(), *doc = json_pack("{s:s,s:s,s:O}", "format", "ckpt-source", "kind", kind, "files", files);
    if (!rc && (!files || !doc)) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < fl.n; i++) {
        char *full = ckpt_path_join(save, fl.v[i].path), hex[65];
        struct stat st;
        rc = full ? ckpt_sha256_file_hex(full, hex) : CKPT_ENOMEM;
        if (!rc && stat(full, &st) < 0) rc = ckpt_error_sys("%s: stat", full);
        if (!rc)
            json_array_append_new(files, json_pack("{s:s,s:I,s:s}", "path", fl.v[i].path, "size", (json_int_t)st.st_size,
                                                   "sha256", hex));
        free(full);
    }
    char *path = rc ? NULL : ckpt_path_join(dst, "ckpt-source.json");
    char *text = rc ? NULL : json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!rc) rc = path && text ? ckpt_write_file_atomic(path, text, strlen(text)) : CKPT_ENOMEM;
    free(path);
    free(text);
    json_decref(files);
    json_decref(doc);
    for (size_t i = 0; i < fl.n; i++) free(fl.v[i].path);
    free(fl.v);
    return rc;
}

static int import_dir(ckpt_store *s, const char *dir, const store_import_opts *o, store_ckpt *out, bool *existed);

/* A training save (neuronx-distributed, PyTorch DCP, EasyDeL) is stored as
 * what `ckpt consolidate` makes of it, with ckpt-source.json recording the
 * save's files and their sha256: consolidated into the store's temp space,
 * imported, removed. */
static int import_save(ckpt_store *s, const char *dir, const char *kind, const store_import_opts *o, store_ckpt *out,
                       bool *existed)
{
    char *base = store_tmp_base(s, "consolidate"), *tmp = NULL, *dst = NULL;
    int rc = base ? ckpt_tmpdir_create(base, &tmp) : CKPT_ENOMEM;
    free(base);
    if (!rc && !(dst = ckpt_path_join(tmp, "model"))) rc = CKPT_ENOMEM;
    if (!rc && !o->quiet) ckpt_info("%s: a %s: consolidating it, then importing the result", dir, kind);
    consolidate_opts co = {.quiet = o->quiet};
    if (!rc) rc = consolidate_run(dir, dst, &co);
    if (!rc) rc = write_source_record(dir, kind, dst);
    if (!rc) rc = import_dir(s, dst, o, out, existed);
    if (tmp) ckpt_rm_rf(tmp);
    free(tmp);
    free(dst);
    return rc;
}

int store_import_dir(ckpt_store *s, const char *dir, const store_import_opts *o, store_ckpt *out, bool *existed)
{
    *existed = false;
    memset(out, 0, sizeof *out);
    int rc = store_repo_name_check(o->repo);
    if (rc) return rc;
    if (!ckpt_is_dir(dir)) return ckpt_error_set(CKPT_ENOTFOUND, "%s: not a directory", dir);
    const char *kind = consolidate_save_kind(dir);
    return kind ? import_save(s, dir, kind, o, out, existed) : import_dir(s, dir, o, out, existed);
}

static int import_dir(ckpt_store *s, const char *dir, const store_import_opts *o, store_ckpt *out, bool *existed)
{
    int rc = 0;
    file_list fl = {0};
    rc = walk(dir, "", &fl, 0);
    if (!rc && fl.n == 0) rc = ckpt_error_set(CKPT_EINVAL, "%s: no files to import", dir);
    if (!rc) qsort(fl.v, fl.n, sizeof *fl.v, cmp_found);
    store_ckpt_rec rec = {.repo = o->repo, .revision = o->revision ? o->revision : "main", .layout = ""};
    writer_list wl = {0};
    /* The file hasher's ring, and one spare; room for ckpt_pread_direct's blocks around a chunk. */
    uint8_t *bufs[IMPORT_RING + 1] = {0};
    for (size_t i = 0; !rc && i <= IMPORT_RING; i++)
        if (!(bufs[i] = ckpt_big_alloc(IMPORT_BUF))) rc = ckpt_error_set(CKPT_ENOMEM, "out of memory for I/O buffers");
    if (!rc) rc = ckpt_grow(&rec.files, &rec.cap, fl.n, sizeof *rec.files);
    /* Progress in bytes, as every job reports it (the dashboard, the bytes.import figure). */
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < fl.n; i++) total += fl.v[i].size;
    ckpt_progress prog;
    ckpt_progress_start(&prog, "import", total);
    bool probe = true; /* hash a tensor before writing it: is it stored already? */
    for (size_t i = 0; !rc && i < fl.n; i++) {
        store_file_rec *fr = &rec.files[rec.nfiles++];
        memset(fr, 0, sizeof *fr);
        fr->path = fl.v[i].path;
        fl.v[i].path = NULL;
        char *full = ckpt_path_join(dir, fr->path);
        if (!full) rc = CKPT_ENOMEM;
        else if (ends_with(fr->path, ".safetensors")) rc = import_safetensors(s, full, &fl.v[i], fr, &wl, bufs, &probe);
        else rc = import_plain(s, full, &fl.v[i], fr, &wl, bufs[0]);
        free(full);
        done += fl.v[i].size;
        if (!o->quiet) ckpt_progress_update(&prog, done > total ? total : done);
    }
    char commit[41];
    if (!rc) rc = store_content_id(&rec, commit);
    const char *rev = rec.revision;
    rec.commit = is_commit_sha(rev) ? rev : commit;
    int64_t id = 0;
    if (!rc) rc = store_find(s, rec.repo, rec.commit, "", &id);
    if (!rc && id) {
        /* Same content already stored: keep its blobs, point the revision at it. */
        *existed = true;
        store_blobs_uploads_end(s, true);
        for (size_t i = 0; i < wl.n; i++) store_blob_abort(&wl.w[i]);
        wl.n = 0;
        rc = store_set_ref(s, rec.repo, rev, id);
        store_leases_release(s); /* what the probe claimed */
    } else if (!rc) {
        rc = store_blobs_publish(s, wl.w, wl.n);
        wl.n = 0;
        if (!rc) rc = store_commit_checkpoint(s, &rec, &id, existed);
    }
    if (rc) store_blobs_uploads_end(s, true); /* before the temps go */
    if (rc) store_leases_release_after_error(s);
    if (!rc) rc = store_get(s, id, out);
    for (size_t i = 0; i < wl.n; i++) store_blob_abort(&wl.w[i]);
    free(wl.w);
    for (size_t i = 0; i < fl.n; i++) free(fl.v[i].path);
    free(fl.v);
    for (size_t i = 0; i <= IMPORT_RING; i++) ckpt_big_free(bufs[i], IMPORT_BUF);
    store_ckpt_rec_free(&rec);
    return rc;
}
