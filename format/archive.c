/* archive.c — tar in and out with libarchive (see archive.h). */
#include "format/archive.h"

#include "common/bqueue.h"
#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define ARCHIVE_BLOCK (1u << 20)
#define QUEUE_SLOTS 8 /* blocks of ARCHIVE_BLOCK in flight between two threads: 8 MiB */

/* Where a tar being written goes: an fd, until a failure. Then the sink
 * discards, so closing the archive (which frees libarchive's buffers) writes
 * no tar end: a reader of the stream sees a truncated archive, never a valid
 * short one.
 *
 * With a writer thread (sink_start), the bytes libarchive hands over are
 * gathered into blocks of a bqueue (common/bqueue.h) that the thread writes to the fd in
 * order: the caller goes on compressing while a write() waits on the disk
 * (dirty-page throttling) or on a slow reader of a pipe. A failed write
 * cancels the queue, so the next sink_write fails with the errno kept in
 * err; sink_finish joins the thread on every path. */
typedef struct {
    int fd;
    bool discard;
    int err; /* errno of a failed write */
    bool threaded;
    pthread_t th;
    bqueue q;
    char *cur; /* the slot being filled, fill bytes in it */
    size_t fill;
} tar_sink;

static int write_all(tar_sink *k, const char *p, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t w = write(k->fd, p + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            k->err = errno;
            return -1;
        }
        done += (size_t)w;
    }
    return 0;
}

static void *sink_thread(void *arg)
{
    tar_sink *k = arg;
    const char *b;
    size_t len;
    while ((b = bqueue_get(&k->q, 0, &len))) {
        if (write_all(k, b, len)) {
            bqueue_cancel(&k->q); /* after k->err is set: the caller reads it once it sees the cancel */
            break;
        }
        bqueue_done(&k->q, 0);
    }
    return NULL;
}

/* Starts the writer thread; without one (no memory, no thread) the sink
 * writes in the caller's thread, as it then does for everything. */
static void sink_start(tar_sink *k)
{
    if (bqueue_init(&k->q, QUEUE_SLOTS, ARCHIVE_BLOCK, 1)) return;
    if (pthread_create(&k->th, NULL, sink_thread, k)) {
        bqueue_free(&k->q);
        return;
    }
    k->threaded = true;
}

static la_ssize_t sink_write(struct archive *a, void *cd, const void *buf, size_t n)
{
    (void)a;
    tar_sink *k = cd;
    if (k->discard) return (la_ssize_t)n;
    if (!k->threaded) return write_all(k, buf, n) ? -1 : (la_ssize_t)n;
    const char *p = buf;
    for (size_t done = 0; done < n;) {
        if (!k->cur && !(k->cur = bqueue_slot(&k->q))) return -1; /* the writer failed: k->err */
        size_t c = n - done < ARCHIVE_BLOCK - k->fill ? n - done : ARCHIVE_BLOCK - k->fill;
        memcpy(k->cur + k->fill, p + done, c);
        k->fill += c;
        done += c;
        if (k->fill == ARCHIVE_BLOCK) {
            bqueue_put(&k->q, k->fill);
            k->cur = NULL;
            k->fill = 0;
        }
    }
    return (la_ssize_t)n;
}

/* Stops the writer thread: after every byte handed over so far is written
 * (drain), or at once, dropping what is queued (after the fd failed). */
static void sink_stop(tar_sink *k, bool drain)
{
    if (!k->threaded) return;
    if (drain && k->cur && k->fill) bqueue_put(&k->q, k->fill);
    if (drain) bqueue_close(&k->q, 0);
    else bqueue_cancel(&k->q);
    pthread_join(k->th, NULL);
    bqueue_free(&k->q);
    k->threaded = false;
    k->cur = NULL;
    k->fill = 0;
}

/* The error of an archive_write_data that fell short. */
static int sink_error(struct archive *a, const tar_sink *k)
{
    return k->err ? ckpt_error_set(CKPT_EIO, "writing the archive: %s", strerror(k->err))
                  : ckpt_error_set(CKPT_EIO, "writing the archive: %s", archive_error_string(a));
}

/* Closes a, its tar end going to the sink only when rc is 0; frees it. */
static int sink_finish(struct archive *a, tar_sink *k, int rc)
{
    if (rc) k->discard = true;
    if (archive_write_close(a) != ARCHIVE_OK && !rc)
        rc = k->err ? ckpt_error_set(CKPT_EIO, "writing the archive: %s", strerror(k->err))
                    : ckpt_error_set(CKPT_EIO, "closing the archive: %s", archive_error_string(a));
    archive_write_free(a);
    /* After a failure of the input the bytes written before it still go out
     * (as they do without a writer thread), whatever the writer thread had
     * reached: a cut stream is cut where the failure was, not earlier. */
    sink_stop(k, !k->err);
    if (!rc && k->err) rc = ckpt_error_set(CKPT_EIO, "writing the archive: %s", strerror(k->err));
    return rc;
}

static bool entry_name_safe(const char *name)
{
    if (!*name || name[0] == '/' || strlen(name) > 4096) return false;
    for (const char *p = name; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if ((n == 2 && !strncmp(p, "..", 2))) return false;
        if (!slash) break;
        p = slash + 1;
    }
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if (*p < 0x20) return false;
    return true;
}

/* When root holds one folder and nothing else (`tar cf m.tar llama/`), that
 * folder becomes root: moved aside next to root (a sibling, so nothing inside
 * it can collide), root removed, and the folder renamed to root. */
static int hoist_single_folder(const char *root)
{
    DIR *d = opendir(root);
    if (!d) return ckpt_error_sys("%s: open", root);
    struct dirent *e;
    char *only = NULL;
    int n = 0;
    while ((e = readdir(d)) && n < 2) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (++n == 1) only = ckpt_strdup(e->d_name);
    }
    closedir(d);
    char *top = only && n == 1 ? ckpt_path_join(root, only) : NULL;
    free(only);
    if (!top || !ckpt_is_dir(top)) {
        free(top);
        return 0;
    }
    char *aside = ckpt_sprintf("%s.hoist", root);
    int rc = aside ? 0 : CKPT_ENOMEM;
    if (!rc && rename(top, aside) < 0) rc = ckpt_error_sys("%s: rename", top);
    else if (!rc && rmdir(root) < 0) {
        rc = ckpt_error_sys("%s: remove", root);
        rename(aside, top);
    } else if (!rc && rename(aside, root) < 0) {
        rc = ckpt_error_sys("%s: rename", aside);
        ckpt_rm_rf(aside);
    }
    free(aside);
    free(top);
    return rc;
}

/* How many bytes an archive of archive_size bytes may expand to in dir: what
 * the filesystem has free for this user less a reserve of 1/16 of it, at most
 * ARCHIVE_MAX_BYTES, and for a compressed archive at most ARCHIVE_MAX_RATIO
 * times its size (plus 64 MiB for small ones): a 33 KB .tar.zst of zeros is
 * not allowed to fill the disk. */
static uint64_t expand_budget(const char *dir, uint64_t archive_size, bool compressed)
{
    uint64_t cap = ARCHIVE_MAX_BYTES;
    struct statvfs v;
    if (statvfs(dir, &v) == 0) {
        uint64_t avail = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
        avail -= avail / 16;
        if (avail < cap) cap = avail;
    }
    if (compressed) {
        uint64_t r;
        if (!ckpt_mul(archive_size, ARCHIVE_MAX_RATIO, &r) || !ckpt_add(r, 64ULL << 20, &r)) r = UINT64_MAX;
        if (r < cap) cap = r;
    }
    return cap;
}

static int too_large(const char *archive_path, const char *entry, uint64_t budget)
{
    char size[32];
    return ckpt_error_set(CKPT_ELIMIT,
                          "%s: entry '%s' takes the archive past %s unpacked (the free space less a reserve, and "
                          "for a compressed archive %d times its size); refused, nothing was imported",
                          archive_path, entry, ckpt_format_size(budget, size, sizeof size), ARCHIVE_MAX_RATIO);
}

int ckpt_archive_extract(const char *archive_path, const char *tmp_base, char **out)
{
    *out = NULL;
    struct stat ast;
    if (stat(archive_path, &ast) < 0)
        return errno == ENOENT ? ckpt_error_set(CKPT_ENOTFOUND, "%s: no such file or folder", archive_path)
                               : ckpt_error_sys("%s", archive_path);
    if (!S_ISREG(ast.st_mode))
        return ckpt_error_set(CKPT_EINVAL, "%s: neither a folder nor a tar archive file", archive_path);
    int rc = ckpt_tmpdir_create(tmp_base, out);
    if (rc) return rc;
    struct archive *a = archive_read_new();
    archive_read_support_filter_all(a);
    archive_read_support_format_tar(a);
    if (archive_read_open_filename(a, archive_path, ARCHIVE_BLOCK) != ARCHIVE_OK)
        rc = ckpt_error_set(CKPT_EINVAL, "%s: not a readable tar archive: %s", archive_path, archive_error_string(a));
    struct archive_entry *e;
    size_t count = 0;
    uint64_t total = 0, budget = 0;
    bool budget_set = false;
    char *buf = rc ? NULL : ckpt_malloc(ARCHIVE_BLOCK);
    if (!rc && !buf) rc = CKPT_ENOMEM;
    while (!rc) {
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF) break;
        if (r != ARCHIVE_OK) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: %s", archive_path, archive_error_string(a));
            break;
        }
        const char *name = archive_entry_pathname(e);
        while (name && name[0] == '.' && name[1] == '/') name += 2;
        if (!name || !*name || !strcmp(name, ".")) continue;
        if (++count > ARCHIVE_MAX_ENTRIES) {
            rc = ckpt_error_set(CKPT_ELIMIT, "%s: more than %d entries", archive_path, ARCHIVE_MAX_ENTRIES);
            break;
        }
        if (!entry_name_safe(name)) {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: unsafe entry name '%s'", archive_path, name);
            break;
        }
        if (!budget_set) { /* the filters are known once the first header is read */
            budget = expand_budget(*out, (uint64_t)ast.st_size, archive_filter_count(a) > 1);
            budget_set = true;
        }
        mode_t type = archive_entry_filetype(e);
        if (type == AE_IFREG && archive_entry_size_is_set(e) && archive_entry_size(e) > 0 &&
            (uint64_t)archive_entry_size(e) > budget - total) {
            rc = too_large(archive_path, name, budget);
            break;
        }
        char *path = ckpt_path_join(*out, name);
        if (!path) {
            rc = CKPT_ENOMEM;
            break;
        }
        if (type == AE_IFDIR) {
            rc = ckpt_mkdir_p(path, 0755);
        } else if (type == AE_IFREG) {
            char *slash = strrchr(path, '/');
            *slash = 0;
            rc = ckpt_mkdir_p(path, 0755);
            *slash = '/';
            int fd = rc ? -1 : open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            if (!rc && fd < 0) rc = ckpt_error_sys("%s: create", path);
            while (!rc) {
                la_ssize_t n = archive_read_data(a, buf, ARCHIVE_BLOCK);
                if (n < 0) rc = ckpt_error_set(CKPT_EINVAL, "%s: %s", archive_path, archive_error_string(a));
                if (n <= 0) break;
                total += (uint64_t)n;
                if (total > budget) rc = too_large(archive_path, name, budget);
                else rc = ckpt_write_full(fd, buf, (size_t)n, path);
            }
            if (fd >= 0) close(fd);
        } else {
            rc = ckpt_error_set(CKPT_EINVAL, "%s: entry '%s' is not a file or folder (links are refused)", archive_path, name);
        }
        free(path);
    }
    free(buf);
    archive_read_free(a);
    if (!rc) rc = hoist_single_folder(*out);
    if (rc) {
        ckpt_rm_rf(*out);
        free(*out);
        *out = NULL;
    }
    return rc;
}

typedef struct {
    char **v;
    size_t n, cap;
} name_list;

static int list_tree(const char *root, const char *rel, name_list *nl)
{
    char *dir = *rel ? ckpt_path_join(root, rel) : ckpt_strdup(root);
    DIR *d = dir ? opendir(dir) : NULL;
    int rc = d ? 0 : dir ? ckpt_error_sys("%s: open directory", dir) : CKPT_ENOMEM;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *r = *rel ? ckpt_sprintf("%s/%s", rel, e->d_name) : ckpt_strdup(e->d_name);
        char *full = r ? ckpt_path_join(root, r) : NULL;
        if (!full) {
            free(r);
            rc = CKPT_ENOMEM;
            break;
        }
        if (ckpt_is_dir(full)) {
            rc = list_tree(root, r, nl);
            free(r);
        } else if (!(rc = ckpt_grow(&nl->v, &nl->cap, nl->n + 1, sizeof *nl->v))) {
            nl->v[nl->n++] = r;
        } else {
            free(r);
        }
        free(full);
    }
    if (d) closedir(d);
    free(dir);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The zstd filter at level 1, compressing on every online core (at most 8).
 * Weights barely compress (bf16 mantissas are noise): on the bench model
 * level 3 saves 0.15% more than level 1 for three times the CPU (about 9 s
 * against 3 s per GB and core), which made a 16 GB pull --format tar.zst
 * CPU-bound at 1.3x a durable copy on 2 cores. libzstd's multithreaded
 * frames are the same bytes for any number of workers. */
static int add_zstd(struct archive *a)
{
    if (archive_write_add_filter_zstd(a) != ARCHIVE_OK)
        return ckpt_error_set(CKPT_EIO, "zstd compression is not available: %s", archive_error_string(a));
    if (archive_write_set_filter_option(a, "zstd", "compression-level", "1") != ARCHIVE_OK)
        return ckpt_error_set(CKPT_EIO, "zstd compression level: %s", archive_error_string(a));
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    char threads[8];
    snprintf(threads, sizeof threads, "%ld", n < 1 ? 1 : n > 8 ? 8 : n);
    (void)archive_write_set_filter_option(a, "zstd", "threads", threads); /* best effort: older libarchive */
    return 0;
}

int ckpt_archive_write_tree(const char *dir, const char *out, bool zstd)
{
    name_list nl = {0};
    int rc = list_tree(dir, "", &nl);
    if (!rc) qsort(nl.v, nl.n, sizeof *nl.v, cmp_str);
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_set_bytes_in_last_block(a, 1); /* no zero padding after a zstd frame on stdout */
    if (zstd && !rc) rc = add_zstd(a);
    bool to_stdout = !strcmp(out, "-");
    tar_sink sink = {.fd = to_stdout ? 1 : -1};
    if (!rc && !to_stdout && (sink.fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
        rc = ckpt_error_sys("%s: create", out);
    if (!rc) sink_start(&sink);
    if (!rc && archive_write_open2(a, &sink, NULL, sink_write, NULL, NULL) != ARCHIVE_OK)
        rc = ckpt_error_set(CKPT_EIO, "%s: %s", to_stdout ? "standard output" : out, archive_error_string(a));
    char *buf = rc ? NULL : ckpt_malloc(ARCHIVE_BLOCK);
    if (!rc && !buf) rc = CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < nl.n; i++) {
        char *path = ckpt_path_join(dir, nl.v[i]);
        int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
            rc = path ? ckpt_error_sys("%s: open", path) : CKPT_ENOMEM;
        } else {
            struct archive_entry *e = archive_entry_new();
            archive_entry_set_pathname(e, nl.v[i]);
            archive_entry_set_size(e, st.st_size);
            archive_entry_set_filetype(e, AE_IFREG);
            archive_entry_set_perm(e, 0644);
            archive_entry_set_mtime(e, st.st_mtime, 0);
            if (archive_write_header(a, e) != ARCHIVE_OK)
                rc = ckpt_error_set(CKPT_EIO, "%s: %s", nl.v[i], archive_error_string(a));
            while (!rc) {
                ssize_t n = read(fd, buf, ARCHIVE_BLOCK);
                if (n < 0) rc = ckpt_error_sys("%s: read", path);
                if (n <= 0) break;
                if (archive_write_data(a, buf, (size_t)n) != n)
                    rc = sink_error(a, &sink);
            }
            archive_entry_free(e);
        }
        if (fd >= 0) close(fd);
        free(path);
    }
    rc = sink_finish(a, &sink, rc); /* no tar end after a failure */
    if (!to_stdout && sink.fd >= 0 && close(sink.fd) < 0 && !rc) rc = ckpt_error_sys("%s: close", out);
    free(buf);
    for (size_t i = 0; i < nl.n; i++) free(nl.v[i]);
    free(nl.v);
    if (rc && !to_stdout) unlink(out);
    return rc;
}

/* The reader thread of ckpt_archive_write_entries: every block of every
 * entry read through rd, in order, into a bqueue that the caller's thread
 * feeds to libarchive. It stops at rd's first error (the queue closed with
 * it and its message, which is per thread, for the caller to report once it
 * wrote what came before) or when the caller cancels the queue. */
typedef struct {
    bqueue q;
    const ckpt_archive_entry *e;
    size_t n;
    ckpt_archive_read_fn rd;
    void *ctx;
} entry_reader;

static void *reader_thread(void *arg)
{
    entry_reader *r = arg;
    for (size_t i = 0; i < r->n; i++)
        for (uint64_t off = 0; off < r->e[i].size;) {
            size_t len = r->e[i].size - off < ARCHIVE_BLOCK ? (size_t)(r->e[i].size - off) : ARCHIVE_BLOCK;
            char *b = bqueue_slot(&r->q);
            if (!b) return NULL;
            int rc = r->rd(r->ctx, i, off, b, len);
            if (rc) { /* what was read before still goes out: a cut stream holds every whole block */
                bqueue_close(&r->q, rc);
                return NULL;
            }
            bqueue_put(&r->q, len);
            off += len;
        }
    bqueue_close(&r->q, 0);
    return NULL;
}

int ckpt_archive_write_entries(int fd, bool zstd, const ckpt_archive_entry *e, size_t n, int64_t mtime,
                               ckpt_archive_read_fn rd, void *ctx)
{
    for (size_t i = 0; i < n; i++)
        if (!entry_name_safe(e[i].name)) return ckpt_error_set(CKPT_EINVAL, "'%s' is not a safe archive name", e[i].name);
    struct archive *a = archive_write_new();
    if (!a) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    int rc = 0;
    archive_write_set_format_pax_restricted(a);
    archive_write_set_bytes_in_last_block(a, 1); /* no zero padding after a zstd frame */
    if (zstd) rc = add_zstd(a);
    tar_sink sink = {.fd = fd};
    if (!rc) sink_start(&sink);
    if (!rc && archive_write_open2(a, &sink, NULL, sink_write, NULL, NULL) != ARCHIVE_OK)
        rc = ckpt_error_set(CKPT_EIO, "archive output: %s", archive_error_string(a));
    entry_reader r = {.e = e, .n = n, .rd = rd, .ctx = ctx};
    pthread_t th;
    bool started = false;
    if (!rc && !(rc = bqueue_init(&r.q, QUEUE_SLOTS, ARCHIVE_BLOCK, 1))) {
        if (pthread_create(&th, NULL, reader_thread, &r)) {
            bqueue_free(&r.q);
            rc = ckpt_error_set(CKPT_EIO, "cannot start the archive's reader thread");
        } else {
            started = true;
        }
    }
    for (size_t i = 0; !rc && i < n; i++) {
        struct archive_entry *ae = archive_entry_new();
        if (!ae) {
            rc = CKPT_ENOMEM;
            break;
        }
        archive_entry_set_pathname(ae, e[i].name);
        archive_entry_set_size(ae, (la_int64_t)e[i].size);
        archive_entry_set_filetype(ae, AE_IFREG);
        archive_entry_set_perm(ae, 0644);
        archive_entry_set_mtime(ae, (time_t)mtime, 0);
        if (archive_write_header(a, ae) != ARCHIVE_OK)
            rc = ckpt_error_set(CKPT_EIO, "%s: %s", e[i].name, archive_error_string(a));
        for (uint64_t off = 0; !rc && off < e[i].size;) {
            size_t len;
            const char *b = bqueue_get(&r.q, 0, &len);
            if (!b) { /* the reader stopped: its failure, kept in the queue */
                if (!(rc = bqueue_error(&r.q)))
                    rc = ckpt_error_set(CKPT_EIO, "'%s': the archive's reader ended early", e[i].name);
                break;
            }
            if (archive_write_data(a, b, len) != (la_ssize_t)len)
                rc = sink_error(a, &sink);
            bqueue_done(&r.q, 0);
            off += len;
        }
        archive_entry_free(ae);
    }
    if (started) { /* on every path: the reader may be waiting for a free slot */
        bqueue_cancel(&r.q);
        pthread_join(th, NULL);
        bqueue_free(&r.q);
    }
    return sink_finish(a, &sink, rc); /* no tar end after a failure */
}
