/*
 * store_import.c — ingest a local Hugging Face directory into the store.
 *
 * Each safetensors file is validated (st_open), then read once, in order: the
 * bytes feed the file's sha256, and each tensor's range is written to its own
 * blob (hashed as it goes). Other files become whole-file blobs. When every
 * blob is published, one transaction adds the checkpoint. A directory without
 * a commit id gets a content id: the sha256 of its files' paths and hashes,
 * so importing the same directory twice finds the same checkpoint.
 */
#include "storage/store.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "storage/safetensors.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IMPORT_CHUNK (8u << 20)

typedef struct {
    char **paths; /* relative */
    size_t n, cap;
} file_list;

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
        else if (strlen(r) > STORE_MAX_PATH) rc = ckpt_error_set(CKPT_ELIMIT, "%s: path too long", full);
        else if (stat(full, &st) < 0) rc = ckpt_error_sys("%s: stat", full);
        else if (S_ISDIR(st.st_mode)) rc = walk(root, r, fl, depth + 1);
        else if (S_ISREG(st.st_mode)) {
            if (fl->n >= STORE_MAX_FILES) rc = ckpt_error_set(CKPT_ELIMIT, "%s: more than %d files", root, STORE_MAX_FILES);
            else if (!(rc = ckpt_grow(&fl->paths, &fl->cap, fl->n + 1, sizeof *fl->paths))) {
                fl->paths[fl->n++] = r;
                r = NULL;
            }
        }
        free(r);
        free(full);
    }
    closedir(d);
    free(dir);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
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
static int import_plain(ckpt_store *s, const char *path, store_file_rec *fr, writer_list *wl, uint8_t *buf)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ckpt_error_sys("%s: open", path);
    int rc;
    store_blob_writer *w = new_writer(s, wl, &rc);
    for (;;) {
        if (rc) break;
        ssize_t n = read(fd, buf, IMPORT_CHUNK);
        if (n < 0) rc = ckpt_error_sys("%s: read", path);
        if (n <= 0) break;
        rc = store_blob_write(w, buf, (size_t)n);
    }
    close(fd);
    if (!rc) rc = store_blob_end(w);
    if (rc) return rc;
    fr->size = w->size;
    memcpy(fr->sha256, w->sha256, sizeof fr->sha256);
    fr->blob = ckpt_strdup(w->sha256);
    return fr->blob ? 0 : CKPT_ENOMEM;
}

/* One tensor's bytes [off, off + n) of fd: into the file's hash fh (unless
 * NULL), a tensor hash th (unless NULL) and a blob writer w (unless NULL). */
static int feed_tensor(int fd, const char *path, uint64_t off, uint64_t n, uint8_t *buf, ckpt_sha256 *fh,
                       ckpt_sha256 *th, store_blob_writer *w)
{
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < IMPORT_CHUNK ? (size_t)(n - done) : IMPORT_CHUNK;
        int rc = ckpt_pread_full(fd, buf, k, off + done, path);
        if (!rc && fh) rc = ckpt_sha256_update(fh, buf, k);
        if (!rc && th) rc = ckpt_sha256_update(th, buf, k);
        if (!rc && w) rc = store_blob_write(w, buf, k);
        if (rc) return rc;
        done += k;
    }
    return 0;
}

/* Safetensors file -> header bytes + one blob per tensor, file hashed
 * alongside. Tensors the store holds already are not written again: after a
 * tensor found stored (an import of the same or an overlapping checkpoint),
 * the next is hashed first and written only when it turns out new (reading it
 * twice); after a new one, the next is hashed while written. */
static int import_safetensors(ckpt_store *s, const char *path, store_file_rec *fr, writer_list *wl, uint8_t *buf,
                              bool *probe)
{
    st_file f;
    int rc = st_open(&f, path);
    if (rc) return rc;
    fr->size = f.file_size;
    fr->header_len = (size_t)f.data_start;
    fr->header = ckpt_malloc(fr->header_len);
    fr->tensors = ckpt_calloc(f.ntensors + 1, sizeof *fr->tensors);
    fr->ntensors = fr->cap = f.ntensors;
    ckpt_sha256 fh;
    bool hashing = false;
    if (!fr->header || !fr->tensors) rc = CKPT_ENOMEM;
    if (!rc) rc = ckpt_pread_full(f.fd, fr->header, fr->header_len, 0, path);
    if (!rc && !(rc = ckpt_sha256_init(&fh))) hashing = true;
    if (!rc) rc = ckpt_sha256_update(&fh, fr->header, fr->header_len);
    posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (size_t i = 0; !rc && i < f.ntensors; i++) {
        const st_tensor *t = &f.tensors[i]; /* in offset order: the data section is read front to back */
        char sha[65] = "";
        bool have = false, fed = false;
        if (*probe) {
            ckpt_sha256 th;
            if (!(rc = ckpt_sha256_init(&th))) {
                rc = feed_tensor(f.fd, path, t->offset, t->nbytes, buf, &fh, &th, NULL);
                if (!rc) rc = ckpt_sha256_final_hex(&th, sha);
                else ckpt_sha256_free(&th);
            }
            fed = !rc;
            if (!rc) rc = store_blob_claim(s, sha, t->nbytes, &have);
        }
        if (!rc && !have) {
            store_blob_writer *w = new_writer(s, wl, &rc);
            if (!rc) rc = feed_tensor(f.fd, path, t->offset, t->nbytes, buf, fed ? NULL : &fh, NULL, w);
            if (!rc) rc = store_blob_end(w);
            if (!rc && fed && strcmp(sha, w->sha256))
                rc = ckpt_error_set(CKPT_EIO, "%s: tensor '%s' changed while it was being imported", path, t->name);
            if (!rc) memcpy(sha, w->sha256, sizeof sha);
            /* Stored already: the next tensor may be too. */
            if (!rc) {
                char *bp = store_blob_path(s, sha);
                *probe = bp && access(bp, F_OK) == 0;
                free(bp);
            }
        } else if (!rc) {
            *probe = true;
        }
        if (!rc) {
            fr->tensors[i].name = ckpt_strdup(t->name);
            fr->tensors[i].blob = ckpt_strdup(sha);
            if (!fr->tensors[i].name || !fr->tensors[i].blob) rc = CKPT_ENOMEM;
        }
    }
    if (!rc) {
        rc = ckpt_sha256_final_hex(&fh, fr->sha256);
        hashing = false;
    }
    if (hashing) ckpt_sha256_free(&fh);
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

int store_import_dir(ckpt_store *s, const char *dir, const store_import_opts *o, store_ckpt *out, bool *existed)
{
    *existed = false;
    memset(out, 0, sizeof *out);
    int rc = store_repo_name_check(o->repo);
    if (rc) return rc;
    if (!ckpt_is_dir(dir)) return ckpt_error_set(CKPT_ENOTFOUND, "%s: not a directory", dir);
    file_list fl = {0};
    rc = walk(dir, "", &fl, 0);
    if (!rc && fl.n == 0) rc = ckpt_error_set(CKPT_EINVAL, "%s: no files to import", dir);
    if (!rc) qsort(fl.paths, fl.n, sizeof *fl.paths, cmp_str);
    store_ckpt_rec rec = {.repo = o->repo, .revision = o->revision ? o->revision : "main", .layout = ""};
    writer_list wl = {0};
    uint8_t *buf = rc ? NULL : ckpt_malloc(IMPORT_CHUNK);
    if (!rc && !buf) rc = CKPT_ENOMEM;
    if (!rc) rc = ckpt_grow(&rec.files, &rec.cap, fl.n, sizeof *rec.files);
    ckpt_progress prog;
    ckpt_progress_start(&prog, "import", fl.n);
    bool probe = true; /* hash a tensor before writing it: is it stored already? */
    for (size_t i = 0; !rc && i < fl.n; i++) {
        store_file_rec *fr = &rec.files[rec.nfiles++];
        memset(fr, 0, sizeof *fr);
        fr->path = fl.paths[i];
        fl.paths[i] = NULL;
        char *full = ckpt_path_join(dir, fr->path);
        if (!full) rc = CKPT_ENOMEM;
        else if (ends_with(fr->path, ".safetensors")) rc = import_safetensors(s, full, fr, &wl, buf, &probe);
        else rc = import_plain(s, full, fr, &wl, buf);
        free(full);
        if (!o->quiet) ckpt_progress_update(&prog, i + 1);
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
        for (size_t i = 0; i < wl.n; i++) store_blob_abort(&wl.w[i]);
        wl.n = 0;
        rc = store_set_ref(s, rec.repo, rev, id);
    } else if (!rc) {
        rc = store_blobs_publish(s, wl.w, wl.n);
        wl.n = 0;
        if (!rc) rc = store_commit_checkpoint(s, &rec, &id, existed);
        if (rc) store_leases_release(s);
    }
    if (!rc) rc = store_get(s, id, out);
    for (size_t i = 0; i < wl.n; i++) store_blob_abort(&wl.w[i]);
    free(wl.w);
    for (size_t i = 0; i < fl.n; i++) free(fl.paths[i]);
    free(fl.paths);
    free(buf);
    store_ckpt_rec_free(&rec);
    return rc;
}
