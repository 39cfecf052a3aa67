/*
 * store_import.c — ingest a local Hugging Face directory into the store.
 *
 * Each safetensors file is validated (st_open), then read once, in order, in
 * chunks: a thread hashes the whole file (its sha256), two others cut the
 * chunks into the tensors, each its share, and write each to its own blob
 * (hashed as it goes), while the importing thread reads on. Other files
 * become whole-file blobs. When every
 * blob is published, one transaction adds the checkpoint. A directory without
 * a commit id gets a content id: the sha256 of its files' paths and hashes,
 * so importing the same directory twice finds the same checkpoint.
 */
#include "store/store.h"

#include "common/bqueue.h"
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
#define IMPORT_CUTTERS 2 /* tensor threads of a file (into a local blob folder) */
#define IMPORT_RING 4    /* chunks in flight between the reader and the threads that take them */
/* A chunk's buffer: the chunk, and the blocks around it ckpt_pread_direct reads. */
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

/* A safetensors file is read once, front to back, in chunks of a ring (a
 * bqueue of IMPORT_RING chunks, common/bqueue.h), by the importing thread,
 * and every chunk is taken by the file hasher (reader HASHER: the file's
 * sha256) and by IMPORT_CUTTERS tensor threads (readers CUTTER + k), which
 * cut the data section into its tensors (they tile it in offset order:
 * st_open checks): each tensor is one thread's, which hashes and writes it
 * to its blob, and the others pass over its bytes. The tensors are shared
 * out in offset order, each to the thread with the fewest bytes so far, so
 * that the threads move through the file together. Reading, hashing the
 * file, hashing the tensors and writing the blobs (the file's hash and the
 * tensors' are as much work, and the writes as much again: a second tensor
 * thread is what puts that on both cores) then run at once, and the
 * per-tensor work (a temp file, a hash, a close) waits for no read. A chunk
 * is refilled once every reader is done with it. The first failure of any
 * thread is kept in the queue (bqueue_fail) and stops the others. Into a
 * bucket one tensor thread: the uploads bound the import there. */
enum { HASHER, CUTTER };

typedef struct {
    bqueue *ring;
    ckpt_sha256 h;
    pthread_t thread;
} file_hasher;

static void *file_hasher_main(void *arg)
{
    file_hasher *fh = arg;
    const uint8_t *b;
    size_t len;
    while ((b = bqueue_get(fh->ring, HASHER, &len))) {
        int rc = ckpt_sha256_update(&fh->h, b, len);
        if (rc) {
            bqueue_fail(fh->ring, rc);
            break;
        }
        bqueue_done(fh->ring, HASHER);
    }
    return NULL;
}

/* Starts hashing a file whose first bytes (the header) are head. */
static int file_hasher_start(file_hasher *fh, bqueue *ring, const void *head, size_t head_len)
{
    fh->ring = ring;
    int rc = ckpt_sha256_init(&fh->h);
    if (!rc) rc = ckpt_sha256_update(&fh->h, head, head_len);
    if (!rc && pthread_create(&fh->thread, NULL, file_hasher_main, fh))
        rc = ckpt_error_set(CKPT_EIO, "cannot start a hashing thread");
    if (rc) ckpt_sha256_free(&fh->h);
    return rc;
}

/* Waits for the hasher (the ring closed or cancelled); the file's sha256
 * into hex (when hex). */
static int file_hasher_finish(file_hasher *fh, char hex[65])
{
    pthread_join(fh->thread, NULL);
    int rc = bqueue_error(fh->ring);
    if (!rc && hex) return ckpt_sha256_final_hex(&fh->h, hex);
    ckpt_sha256_free(&fh->h);
    return rc;
}

typedef struct {
    ckpt_store *s;
    const char *path;
    st_file *f;
    store_file_rec *fr;
    writer_list wl;       /* this thread's blobs, added to the import's at the end */
    uint8_t *spare;       /* a chunk of its own, for a tensor read again */
    bool probe;           /* hash the next tensor first: the last was stored already */
    const uint8_t *owner; /* per tensor of f, the thread that cuts it */
    int k;                /* this thread: reader CUTTER + k */
    pthread_mutex_t *mu;  /* the store's calls, one thread at a time */
    bqueue *ring;
    const uint8_t *chunk; /* the chunk being cut (NULL: none taken), len bytes */
    size_t len;
    size_t at; /* bytes of it already cut */
} tensor_cutter;

/* The next n bytes of the ring into a tensor hash th (unless NULL) and a
 * blob writer w (unless NULL); neither: passed over. */
static int cut_tensor(tensor_cutter *tc, uint64_t n, ckpt_sha256 *th, store_blob_writer *w)
{
    for (uint64_t done = 0; done < n;) {
        if (!tc->chunk) {
            if (!(tc->chunk = bqueue_get(tc->ring, CUTTER + tc->k, &tc->len))) {
                int err = bqueue_error(tc->ring);
                return err ? err : ckpt_error_set(CKPT_EIO, "%s: the data ended early", tc->path);
            }
            tc->at = 0;
        }
        size_t k = tc->len - tc->at < n - done ? tc->len - tc->at : (size_t)(n - done);
        const uint8_t *b = tc->chunk + tc->at;
        int rc = th ? ckpt_sha256_update(th, b, k) : 0;
        if (!rc && w) rc = store_blob_write(w, b, k);
        if (rc) return rc;
        done += k;
        tc->at += k;
        if (tc->at == tc->len) {
            tc->chunk = NULL;
            bqueue_done(tc->ring, CUTTER + tc->k);
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

/* Every tensor of the file that is this thread's, in offset order, to its
 * blob. Tensors the store holds already are not written again: after a
 * tensor found stored (an import of the same or an overlapping checkpoint),
 * the next is hashed first and written only when it turns out new (reading
 * it twice); after a new one, the next is hashed while written. */
static int cut_tensors(tensor_cutter *tc)
{
    ckpt_store *s = tc->s;
    const st_file *f = tc->f;
    int rc = 0;
    for (size_t i = 0; !rc && i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        if (tc->owner[i] != tc->k) {
            rc = cut_tensor(tc, t->nbytes, NULL, NULL);
            continue;
        }
        char sha[65] = "";
        bool have = false, fed = false;
        if (tc->probe) {
            ckpt_sha256 th;
            if (!(rc = ckpt_sha256_init(&th))) {
                rc = cut_tensor(tc, t->nbytes, &th, NULL);
                if (!rc) rc = ckpt_sha256_final_hex(&th, sha);
                else ckpt_sha256_free(&th);
            }
            fed = !rc;
            if (!rc) {
                pthread_mutex_lock(tc->mu);
                rc = store_blob_claim(s, sha, t->nbytes, &have);
                pthread_mutex_unlock(tc->mu);
            }
        }
        if (!rc && !have) {
            store_blob_writer *w = new_writer(s, &tc->wl, &rc);
            if (!rc) rc = fed ? reread_tensor(f->fd, tc->path, t->offset, t->nbytes, tc->spare, w)
                              : cut_tensor(tc, t->nbytes, NULL, w);
            if (!rc) rc = store_blob_end(w);
            if (!rc && fed && strcmp(sha, w->sha256))
                rc = ckpt_error_set(CKPT_EIO, "%s: tensor '%s' changed while it was being imported", tc->path, t->name);
            if (!rc) memcpy(sha, w->sha256, sizeof sha);
            pthread_mutex_lock(tc->mu);
            if (!rc) rc = store_blob_submit(s, w); /* a bucket: uploaded while the next tensors are staged */
            /* Stored already: the next tensor may be too. In a bucket the
             * uploads tell, without a HEAD of each new blob here. */
            if (!rc && store_blobs_remote(s)) {
                tc->probe = store_blobs_upload_found_stored(s);
            } else if (!rc) {
                bool stored = false;
                rc = store_blob_stat(s, sha, &stored, NULL);
                tc->probe = stored;
            }
            pthread_mutex_unlock(tc->mu);
        } else if (!rc) {
            tc->probe = true;
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
    if (rc) bqueue_fail(tc->ring, rc);
    bqueue_leave(tc->ring, CUTTER + tc->k); /* the reader waits no more for this thread */
    return NULL;
}

/* The tensors of f shared out among n threads in offset order, each to the
 * one with the fewest bytes so far; NULL: out of memory. */
static uint8_t *share_tensors(const st_file *f, int n)
{
    uint8_t *owner = ckpt_calloc(f->ntensors + 1, 1);
    uint64_t load[IMPORT_CUTTERS] = {0};
    for (size_t i = 0; owner && i < f->ntensors; i++) {
        int k = 0;
        for (int j = 1; j < n; j++)
            if (load[j] < load[k]) k = j;
        owner[i] = (uint8_t)k;
        load[k] += f->tensors[i].nbytes;
    }
    return owner;
}

/* Adds a tensor thread's blobs to the import's (every one, also after a
 * failure: the import's cleanup removes their temps). */
static int take_writers(writer_list *wl, writer_list *from)
{
    int rc = ckpt_grow(&wl->w, &wl->cap, wl->n + from->n, sizeof *wl->w);
    for (size_t i = 0; i < from->n; i++) {
        if (!rc) wl->w[wl->n++] = from->w[i];
        else store_blob_abort(&from->w[i]);
    }
    free(from->w);
    *from = (writer_list){0};
    return rc;
}

/* Safetensors file -> header bytes + one blob per tensor, file hashed
 * alongside (see file_hasher). */
static int import_safetensors(ckpt_store *s, const char *path, const found_file *ff, store_file_rec *fr,
                              writer_list *wl, bqueue *ring, uint8_t *spare, bool *probe)
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
    bqueue_reset(ring);
    /* The data section is read with O_DIRECT where the file system takes it
     * (a model is read once: no page cache filled, and on a VM whose fresh
     * memory is costly to touch a fraction of the system time); a chunk
     * starts where its offset lies in a block, so that the blocks around
     * it are read into its buffer (ckpt_pread_direct). */
    int dfd = ckpt_open_direct(path, f.fd);
    bqueue_skip(ring, (size_t)(f.data_start % CKPT_DIRECT_ALIGN));
    file_hasher fh;
    int ncut = store_blobs_remote(s) ? 1 : IMPORT_CUTTERS, started = 0;
    uint8_t *owner = share_tensors(&f, ncut);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    tensor_cutter tc[IMPORT_CUTTERS];
    pthread_t cutters[IMPORT_CUTTERS];
    for (int k = 0; k < IMPORT_CUTTERS; k++)
        tc[k] = (tensor_cutter){.s = s, .path = path, .f = &f, .fr = fr, .spare = spare + (size_t)k * IMPORT_CHUNK,
                                .probe = *probe, .owner = owner, .k = k, .mu = &mu, .ring = ring};
    bool hashing = false;
    if (!fr->header || !fr->tensors || !owner) rc = CKPT_ENOMEM;
    if (!rc) rc = ckpt_pread_full(f.fd, fr->header, fr->header_len, 0, path);
    if (!rc && !(rc = file_hasher_start(&fh, ring, fr->header, fr->header_len))) hashing = true;
    for (int k = 0; !rc && k < ncut; k++) {
        if (pthread_create(&cutters[k], NULL, tensor_cutter_main, &tc[k])) rc = ckpt_error_set(CKPT_EIO, "cannot start a thread");
        else started++;
    }
    for (int k = started; k < IMPORT_CUTTERS; k++) bqueue_leave(ring, CUTTER + k); /* readers that take nothing */
    posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (uint64_t off = f.data_start; !rc && off < f.file_size;) {
        size_t k = f.file_size - off < IMPORT_CHUNK ? (size_t)(f.file_size - off) : IMPORT_CHUNK;
        uint8_t *buf = bqueue_slot(ring);
        if (!buf) break; /* a taker failed: finish says why */
        rc = ckpt_pread_direct(dfd, f.fd, buf, k, off, path);
        if (!rc) bqueue_put(ring, k);
        off += k;
    }
    if (rc) bqueue_fail(ring, rc); /* the takers stop at once */
    else bqueue_close(ring, 0);    /* no more chunks: they end once they took every one */
    *probe = false;
    for (int k = 0; k < started; k++) {
        pthread_join(cutters[k], NULL);
        *probe |= tc[k].probe;
    }
    for (int k = 0; k < IMPORT_CUTTERS; k++) {
        int mrc = take_writers(wl, &tc[k].wl);
        if (!rc) rc = mrc;
    }
    if (hashing) {
        int hrc = file_hasher_finish(&fh, rc ? NULL : fr->sha256);
        if (!rc) rc = hrc;
    }
    free(owner);
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
    bqueue ring; /* the chunks between the reader, the file hasher and the tensor threads */
    bool have_ring = !rc && !(rc = bqueue_init(&ring, IMPORT_RING, IMPORT_BUF, 1 + IMPORT_CUTTERS));
    uint8_t *spare = rc ? NULL : ckpt_malloc((size_t)IMPORT_CUTTERS * IMPORT_CHUNK); /* a chunk per tensor thread */
    if (!rc && !spare) rc = CKPT_ENOMEM;
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
        else if (ends_with(fr->path, ".safetensors")) rc = import_safetensors(s, full, &fl.v[i], fr, &wl, &ring, spare, &probe);
        else rc = import_plain(s, full, &fl.v[i], fr, &wl, spare);
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
    if (have_ring) bqueue_free(&ring);
    free(spare);
    store_ckpt_rec_free(&rec);
    return rc;
}
