/*
 * store_blobs.c — where the store's blobs live: CKPT_HOME/blobs (the
 * default) or a bucket of an S3-compatible object store (CKPT_BLOBS =
 * s3://BUCKET/PREFIX, store/s3.h). The catalog, the leases and the staging
 * folder tmp/ stay in CKPT_HOME either way.
 *
 * In a bucket, blob SHA is the object PREFIX/ab/cdef... (the local layout's
 * names). It is uploaded once (If-None-Match: *; a 412 means the same bytes
 * are there) from its temp file after the temp is durable and leased, and the
 * catalog commits only after every upload was acknowledged. Plans read
 * tensor bytes in ranges (blob_ranges.h, below); the few readers that need a
 * whole small file get a local copy in CKPT_HOME/blob-cache/ab/cdef...,
 * downloaded in ranges and checked against its name before it is renamed
 * into place, in a cache of bounded size (least recently used out first).
 */
#include "store/store.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/util.h"
#include "store/blob_ranges.h"
#include "store/s3.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Bytes of one ranged GET when a blob is copied or hashed. */
#define BLOB_GET_CHUNK (64ull << 20)
/* The defaults of CKPT_BLOB_CACHE_MB and CKPT_S3_RANGE_GAP. */
#define BLOB_CACHE_MB_DEFAULT 1024
#define RANGE_GAP_DEFAULT (256u << 10)
/* The default of CKPT_S3_UPLOADS: blobs uploaded at once. */
#define UPLOADS_DEFAULT 4
/* Bytes submitted for upload and not yet acknowledged before a submitter waits. */
#define UPLOAD_AHEAD (512ull << 20)

int64_t store_self_start_time(void)
{
    static int64_t cached = -1;
    if (cached < 0) cached = ckpt_proc_start_time((int)getpid());
    return cached;
}

char *store_tmp_base(const ckpt_store *s, const char *kind)
{
    return ckpt_sprintf("%s/%s-%d-%lld", s->tmp_dir, kind, (int)getpid(), (long long)store_self_start_time());
}

char *store_blob_path(const ckpt_store *s, const char *sha)
{
    return ckpt_sprintf("%s/%.2s/%s", s->blob_dir, sha, sha + 2);
}

int store_blobs_config(ckpt_store *s)
{
    const char *url = getenv("CKPT_BLOBS");
    if (!url || !*url) return 0;
    if (strncmp(url, "s3://", 5))
        return ckpt_error_set(CKPT_EINVAL, "CKPT_BLOBS / --blobs '%s': expected s3://BUCKET/PREFIX (unset: the store's blobs/ folder)", url);
    const char *mb = getenv("CKPT_BLOB_CACHE_MB");
    uint64_t limit = BLOB_CACHE_MB_DEFAULT;
    if (mb && *mb && (ckpt_parse_u64(mb, &limit) < 0 || limit > (1ull << 30)))
        return ckpt_error_set(CKPT_EINVAL, "CKPT_BLOB_CACHE_MB '%s': expected a number of megabytes", mb);
    s->cache_limit = limit << 20;
    int rc = s3_url_parse(url, &s->s3_bucket, &s->s3_prefix);
    if (!rc && !(s->cache_dir = ckpt_path_join(s->home, "blob-cache"))) rc = CKPT_ENOMEM;
    if (!rc) rc = ckpt_mkdir_p(s->cache_dir, 0755);
    return rc;
}

bool store_blobs_remote(const ckpt_store *s) { return s->s3_bucket != NULL; }

/* A temp name for a download of blob sha, unique in this process too (the
 * daemon's HTTP threads may fetch the same blob at once). malloc'd. */
static char *download_tmp(const ckpt_store *s, const char *kind, const char *sha)
{
    static atomic_uint seq;
    char *base = store_tmp_base(s, kind);
    char *tmp = base ? ckpt_sprintf("%s-%.16s-%u", base, sha, atomic_fetch_add(&seq, 1)) : NULL;
    free(base);
    return tmp;
}

/* The client, opened on first use (a command that never touches a blob
 * never loads libcurl). */
static int client(ckpt_store *s, s3_client **c)
{
    if (!s->s3) {
        int rc = s3_open(s->s3_bucket, (s3_client **)&s->s3);
        if (rc) return rc;
    }
    *c = s->s3;
    return 0;
}

void store_blobs_close(ckpt_store *s)
{
    store_blobs_uploads_end(s, true);
    uint64_t req = 0, retries = 0, in = 0;
    if (s->s3) s3_stats(s->s3, &req, &retries, &in);
    req += s->s3_requests, retries += s->s3_retries, in += s->s3_bytes;
    if (s->s3_bucket && req)
        ckpt_debug("blobs s3://%s/%s: %llu requests, %llu retries, %llu bytes received", s->s3_bucket, s->s3_prefix,
                   (unsigned long long)req, (unsigned long long)retries, (unsigned long long)in);
    s3_close(s->s3);
    s->s3 = NULL;
    free(s->s3_bucket), free(s->s3_prefix), free(s->cache_dir);
    s->s3_bucket = s->s3_prefix = s->cache_dir = NULL;
}

char *store_blob_key(const ckpt_store *s, const char *sha)
{
    return ckpt_sprintf("%s%s%.2s/%s", s->s3_prefix, *s->s3_prefix ? "/" : "", sha, sha + 2);
}

int store_blob_stat(ckpt_store *s, const char *sha, bool *exists, uint64_t *size)
{
    *exists = false;
    if (!store_blobs_remote(s)) {
        char *path = store_blob_path(s, sha);
        struct stat st;
        if (!path) return CKPT_ENOMEM;
        if (stat(path, &st) == 0) {
            *exists = true;
            if (size) *size = (uint64_t)st.st_size;
        }
        free(path);
        return 0;
    }
    s3_client *c;
    char *key = store_blob_key(s, sha);
    int rc = key ? client(s, &c) : CKPT_ENOMEM;
    if (!rc) rc = s3_head(c, key, exists, size);
    free(key);
    return rc;
}

/* Adds a client's requests, retries and bytes to the store's totals. */
static void stats_add(ckpt_store *s, const s3_client *c)
{
    uint64_t req = 0, retries = 0, in = 0;
    s3_stats(c, &req, &retries, &in);
    __atomic_fetch_add(&s->s3_requests, req, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->s3_retries, retries, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->s3_bytes, in, __ATOMIC_RELAXED);
}

/* The upload queue of one store handle: temps submitted as they are
 * finished, uploaded by CKPT_S3_UPLOADS threads while the caller stages the
 * next ones. The submitter waits while more than UPLOAD_AHEAD bytes are
 * queued and not yet acknowledged, so the staged temps stay in the page
 * cache and are gone before the kernel writes them back. */
typedef struct {
    char *tmp_path;
    char sha256[65];
    uint64_t size;
} upload_item;

struct store_uploads {
    ckpt_store *s;
    upload_item *v;
    size_t n, cap, next;
    uint64_t ahead; /* bytes submitted and not yet acknowledged */
    bool closing, cancelled;
    bool last_existed; /* the last upload acknowledged found its blob stored */
    uint64_t acked, announced; /* uploads acknowledged; of those, passed to the fault point */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th[64];
    size_t nth;
    int rc;
    char msg[1024];
};

static int upload_one(ckpt_store *s, s3_client *c, const upload_item *w, bool *existed)
{
    char *key = store_blob_key(s, w->sha256);
    int fd = key ? open(w->tmp_path, O_RDONLY | O_CLOEXEC) : -1;
    int rc = !key ? CKPT_ENOMEM : fd < 0 ? ckpt_error_sys("%s: open", w->tmp_path) : 0;
    if (!rc) rc = s3_put_fd(c, key, fd, 0, w->size, w->sha256, existed);
    if (fd >= 0) close(fd);
    free(key);
    if (!rc) unlink(w->tmp_path); /* acknowledged: durable in the bucket */
    return rc;
}

/* Records the first failure (under u->mu). */
static void uploads_fail(store_uploads *u, int rc)
{
    if (rc && !u->rc) {
        u->rc = rc;
        snprintf(u->msg, sizeof u->msg, "%s", ckpt_error_last());
    }
}

static void *upload_main(void *arg)
{
    store_uploads *u = arg;
    s3_client *c = NULL;
    int rc = s3_open(u->s->s3_bucket, &c);
    pthread_mutex_lock(&u->mu);
    uploads_fail(u, rc);
    for (;;) {
        while (!u->rc && !u->cancelled && u->next == u->n && !u->closing) pthread_cond_wait(&u->cv, &u->mu);
        if (u->rc || u->cancelled || u->next == u->n) break;
        upload_item it = u->v[u->next++];
        pthread_mutex_unlock(&u->mu);
        bool existed = false;
        rc = upload_one(u->s, c, &it, &existed);
        pthread_mutex_lock(&u->mu);
        uploads_fail(u, rc);
        if (!rc) u->last_existed = existed;
        if (!rc) u->acked++;
        u->ahead -= it.size;
        pthread_cond_broadcast(&u->cv);
    }
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    if (c) stats_add(u->s, c);
    s3_close(c);
    return NULL;
}

static int uploads_start(ckpt_store *s)
{
    if (s->uploads) return 0;
    const char *e = getenv("CKPT_S3_UPLOADS");
    uint64_t want = UPLOADS_DEFAULT;
    if (e && *e && (ckpt_parse_u64(e, &want) < 0 || want < 1 || want > 64))
        return ckpt_error_set(CKPT_EINVAL, "CKPT_S3_UPLOADS '%s': expected 1 to 64", e);
    store_uploads *u = ckpt_calloc(1, sizeof *u);
    if (!u) return CKPT_ENOMEM;
    u->s = s;
    if (pthread_mutex_init(&u->mu, NULL)) {
        free(u);
        return ckpt_error_set(CKPT_EIO, "cannot create a mutex");
    }
    pthread_cond_init(&u->cv, NULL);
    for (size_t i = 0; i < want; i++)
        if (pthread_create(&u->th[u->nth], NULL, upload_main, u) == 0) u->nth++;
    if (!u->nth) {
        pthread_cond_destroy(&u->cv);
        pthread_mutex_destroy(&u->mu);
        free(u);
        return ckpt_error_set(CKPT_EIO, "cannot start an upload thread");
    }
    s->uploads = u;
    return 0;
}

/* Queues w's temp (leased by the caller); the first failure of an upload is
 * returned here as soon as it is known. */
int store_blobs_enqueue(ckpt_store *s, store_blob_writer *w)
{
    int rc = uploads_start(s);
    if (rc) return rc;
    store_uploads *u = s->uploads;
    upload_item it = {.tmp_path = ckpt_strdup(w->tmp_path), .size = w->size};
    memcpy(it.sha256, w->sha256, sizeof it.sha256);
    if (!it.tmp_path) return CKPT_ENOMEM;
    pthread_mutex_lock(&u->mu);
    while (!u->rc && u->ahead && u->ahead + w->size > UPLOAD_AHEAD) pthread_cond_wait(&u->cv, &u->mu);
    if (!u->rc) rc = ckpt_grow(&u->v, &u->cap, u->n + 1, sizeof *u->v);
    if (!u->rc && !rc) {
        u->v[u->n++] = it;
        it.tmp_path = NULL;
        u->ahead += w->size;
        w->submitted = true;
        pthread_cond_broadcast(&u->cv);
    }
    if (u->rc) rc = ckpt_error_set(u->rc, "%s", u->msg);
    pthread_mutex_unlock(&u->mu);
    free(it.tmp_path);
    return rc;
}

/* The crash point blob.published once per upload acknowledged since the
 * last call. It is passed here, in the thread that leases and commits,
 * between its transactions, not in the upload thread: a process stopped there
 * (STOP) must not hold a transaction open (on PostgreSQL, a lease being
 * inserted keeps gc's lock of blob_leases waiting). */
static void announce_published(store_uploads *u)
{
    pthread_mutex_lock(&u->mu);
    uint64_t n = u->acked - u->announced;
    u->announced = u->acked;
    pthread_mutex_unlock(&u->mu);
    while (n--) ckpt_fault("blob.published");
}

void store_blobs_published_points(ckpt_store *s)
{
    if (s->uploads) announce_published(s->uploads);
}

bool store_blobs_upload_found_stored(ckpt_store *s)
{
    store_uploads *u = s->uploads;
    if (!u) return false;
    pthread_mutex_lock(&u->mu);
    bool found = u->last_existed;
    pthread_mutex_unlock(&u->mu);
    return found;
}

int store_blobs_uploads_end(ckpt_store *s, bool cancel)
{
    store_uploads *u = s->uploads;
    if (!u) return 0;
    pthread_mutex_lock(&u->mu);
    u->closing = true;
    u->cancelled = cancel;
    pthread_cond_broadcast(&u->cv);
    pthread_mutex_unlock(&u->mu);
    for (size_t i = 0; i < u->nth; i++) pthread_join(u->th[i], NULL);
    int rc = u->rc && !cancel ? ckpt_error_set(u->rc, "%s", u->msg) : 0;
    if (!cancel) announce_published(u);
    for (size_t i = 0; i < u->n; i++) free(u->v[i].tmp_path);
    free(u->v);
    pthread_cond_destroy(&u->cv);
    pthread_mutex_destroy(&u->mu);
    free(u);
    s->uploads = NULL;
    return rc;
}

int store_blobs_upload(ckpt_store *s, store_blob_writer *ws, size_t n)
{
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++)
        if (!ws[i].submitted) rc = store_blobs_enqueue(s, &ws[i]);
    int end = store_blobs_uploads_end(s, rc != 0);
    return rc ? rc : end;
}

int store_blob_copy_to_fd(ckpt_store *s, const char *sha, uint64_t size, int fd)
{
    s3_client *c;
    char *key = store_blob_key(s, sha);
    int rc = key ? client(s, &c) : CKPT_ENOMEM;
    for (uint64_t off = 0; !rc && off < size; off += BLOB_GET_CHUNK)
        rc = s3_get_fd(c, key, off, size - off < BLOB_GET_CHUNK ? size - off : BLOB_GET_CHUNK, fd, off);
    free(key);
    return rc;
}

typedef struct {
    char *path;
    uint64_t size;
    struct timespec mtime;
} cached_blob;

static int cached_older(const void *a, const void *b)
{
    const struct timespec *x = &((const cached_blob *)a)->mtime, *y = &((const cached_blob *)b)->mtime;
    return x->tv_sec != y->tv_sec ? (x->tv_sec < y->tv_sec ? -1 : 1) : (x->tv_nsec > y->tv_nsec) - (x->tv_nsec < y->tv_nsec);
}

/* Makes room for `incoming` bytes in blob-cache/: removes the least
 * recently used copies (a hit refreshes a copy's mtime) until what stays
 * and the newcomer fit in s->cache_limit. Best effort: a copy another
 * process removed first is simply gone. */
static void cache_trim(const ckpt_store *s, uint64_t incoming)
{
    cached_blob *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    DIR *top = opendir(s->cache_dir);
    struct dirent *d, *e;
    while (top && (d = readdir(top))) {
        if (strlen(d->d_name) != 2 || d->d_name[0] == '.') continue;
        char *sub = ckpt_path_join(s->cache_dir, d->d_name);
        DIR *dd = sub ? opendir(sub) : NULL;
        while (dd && (e = readdir(dd))) {
            struct stat st;
            char *path = e->d_name[0] == '.' ? NULL : ckpt_path_join(sub, e->d_name);
            if (path && stat(path, &st) == 0 && S_ISREG(st.st_mode) && ckpt_grow(&v, &cap, n + 1, sizeof *v) == 0) {
                v[n++] = (cached_blob){path, (uint64_t)st.st_size, st.st_mtim};
                total += (uint64_t)st.st_size;
            } else {
                free(path);
            }
        }
        if (dd) closedir(dd);
        free(sub);
    }
    if (top) closedir(top);
    if (n) qsort(v, n, sizeof *v, cached_older);
    for (size_t i = 0; i < n; i++) {
        if (total + incoming > s->cache_limit && unlink(v[i].path) == 0) total -= v[i].size;
        free(v[i].path);
    }
    free(v);
}

char *store_blob_source_path(const ckpt_store *s, const char *sha)
{
    if (!store_blobs_remote(s)) return store_blob_path(s, sha);
    char *key = store_blob_key(s, sha);
    char *name = key ? ckpt_sprintf("s3://%s/%s", s->s3_bucket, key) : NULL;
    free(key);
    return name;
}

char *store_blob_read_path(ckpt_store *s, const char *sha)
{
    if (!store_blobs_remote(s)) return store_blob_path(s, sha);
    char *dst = ckpt_sprintf("%s/%.2s/%s", s->cache_dir, sha, sha + 2);
    if (!dst) return NULL;
    if (access(dst, R_OK) == 0) {
        utimensat(AT_FDCWD, dst, NULL, 0); /* recently used: evicted last */
        return dst;
    }
    bool exists = false;
    uint64_t size = 0;
    char *dir = ckpt_sprintf("%s/%.2s", s->cache_dir, sha), *tmp = download_tmp(s, "blobget", sha), hex[65];
    int rc = dir && tmp ? 0 : CKPT_ENOMEM;
    if (!rc) rc = store_blob_stat(s, sha, &exists, &size);
    if (!rc && !exists)
        rc = ckpt_error_set(CKPT_ECORRUPT, "blob %s is missing from %s (run ckpt verify)", sha, s->s3_bucket);
    if (!rc) cache_trim(s, size);
    if (!rc) rc = ckpt_mkdir_p(dir, 0755);
    int fd = rc ? -1 : open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (!rc && fd < 0) rc = ckpt_error_sys("%s: create", tmp);
    if (!rc) rc = store_blob_copy_to_fd(s, sha, size, fd);
    if (!rc) rc = ckpt_sha256_fd_range_hex(fd, 0, size, hex, tmp);
    if (!rc && strcmp(hex, sha))
        rc = ckpt_error_set(CKPT_ECORRUPT, "blob %s in s3://%s: its bytes hash to %.16s...", sha, s->s3_bucket, hex);
    if (fd >= 0) close(fd);
    if (!rc && rename(tmp, dst) < 0) rc = ckpt_error_sys("%s: rename", dst);
    if (rc && tmp) unlink(tmp);
    free(dir), free(tmp);
    if (rc) {
        free(dst);
        return NULL;
    }
    return dst;
}

int store_blob_hash(ckpt_store *s, const char *sha, bool *exists, char hex[65])
{
    uint64_t size = 0;
    int rc = store_blob_stat(s, sha, exists, &size);
    if (rc || !*exists) return rc;
    if (!store_blobs_remote(s)) {
        char *path = store_blob_path(s, sha);
        rc = path ? ckpt_sha256_file_hex(path, hex) : CKPT_ENOMEM;
        free(path);
        return rc;
    }
    /* streamed through a temp file in tmp/, never whole in memory */
    char *tmp = download_tmp(s, "blobhash", sha);
    int fd = tmp ? open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    if (!tmp) rc = CKPT_ENOMEM;
    else if (fd < 0) rc = ckpt_error_sys("%s: create", tmp);
    if (fd >= 0) unlink(tmp);
    if (!rc) rc = store_blob_copy_to_fd(s, sha, size, fd);
    if (!rc) rc = ckpt_sha256_fd_range_hex(fd, 0, size, hex, sha);
    if (fd >= 0) close(fd);
    free(tmp);
    return rc;
}

typedef struct {
    const ckpt_store *s;
    size_t skip;
    store_blob_list_cb cb;
    void *ud;
} list_ctx;

static int list_one(void *ud, const char *key, uint64_t size, int64_t mtime)
{
    list_ctx *l = ud;
    const char *rest = key + l->skip; /* "ab/cdef..." */
    if (strlen(key) < l->skip || strlen(rest) != 65 || rest[2] != '/') return 0; /* not a blob of ours */
    char sha[65];
    snprintf(sha, sizeof sha, "%.2s%.62s", rest, rest + 3);
    for (int i = 0; i < 64; i++)
        if (!((sha[i] >= '0' && sha[i] <= '9') || (sha[i] >= 'a' && sha[i] <= 'f'))) return 0;
    return l->cb(l->ud, sha, size, mtime);
}

int store_blob_list(ckpt_store *s, store_blob_list_cb cb, void *ud)
{
    s3_client *c;
    char *prefix = ckpt_sprintf("%s%s", s->s3_prefix, *s->s3_prefix ? "/" : "");
    int rc = prefix ? client(s, &c) : CKPT_ENOMEM;
    list_ctx l = {.s = s, .skip = prefix ? strlen(prefix) : 0, .cb = cb, .ud = ud};
    if (!rc) rc = s3_list(c, prefix, 0, list_one, &l);
    free(prefix);
    return rc;
}

int store_blob_delete(ckpt_store *s, const char *sha)
{
    s3_client *c;
    char *key = store_blob_key(s, sha);
    int rc = key ? client(s, &c) : CKPT_ENOMEM;
    if (!rc) rc = s3_delete(c, key);
    free(key);
    if (!rc && s->cache_dir) {
        char *cached = ckpt_sprintf("%s/%.2s/%s", s->cache_dir, sha, sha + 2);
        if (cached) unlink(cached);
        free(cached);
    }
    return rc;
}

/* ---- ranged reads for plans (blob_ranges.h) ---- */

typedef struct {
    store_blob_ranges *r;
    s3_client *c;
    uint8_t *buf;
    size_t cap;
} range_reader;

void *store_blob_ranges_open(store_blob_ranges *r)
{
    range_reader *t = ckpt_calloc(1, sizeof *t);
    if (!t) {
        ckpt_error_set(CKPT_ENOMEM, "out of memory");
        return NULL;
    }
    t->r = r;
    if (s3_open(r->s->s3_bucket, &t->c) < 0) {
        free(t);
        return NULL;
    }
    return t;
}

void store_blob_ranges_close(store_blob_ranges *r, void *ts)
{
    range_reader *t = ts;
    if (!t) return;
    stats_add(r->s, t->c);
    s3_close(t->c);
    free(t->buf);
    free(t);
}

/* One ranged GET of key; a missing object is a damaged store, named so. */
static int range_get(range_reader *t, const char *key, uint64_t off, size_t len, void *buf)
{
    int rc = s3_get(t->c, key, off, len, buf);
    size_t n = strlen(key);
    if (rc == CKPT_ENOTFOUND && n >= 65 && key[n - 63] == '/') /* PREFIX/ab/cdef...: name the blob */
        rc = ckpt_error_set(CKPT_ECORRUPT, "blob %.2s%s is missing from s3://%s (run ckpt verify)", key + n - 65,
                            key + n - 62, t->r->s->s3_bucket);
    else if (rc == CKPT_ENOTFOUND)
        rc = ckpt_error_set(CKPT_ECORRUPT, "%s is missing from s3://%s (run ckpt verify)", key, t->r->s->s3_bucket);
    return rc;
}

int store_blob_ranges_read(void *ts, const char *sha, uint64_t off, size_t len, void *buf)
{
    range_reader *t = ts;
    char *key = store_blob_key(t->r->s, sha);
    int rc = key ? range_get(t, key, off, len, buf) : CKPT_ENOMEM;
    free(key);
    return rc;
}

static bool ranges_serves(void *ctx, size_t file)
{
    store_blob_ranges *r = ctx;
    return file < r->p->nsrc_paths && !strncmp(r->p->src_paths[file], "s3://", 5) &&
           strlen(r->p->src_paths[file]) > r->skip;
}

static void *ranges_thread_open(void *ctx) { return store_blob_ranges_open(ctx); }
static void ranges_thread_close(void *ctx, void *ts) { store_blob_ranges_close(ctx, ts); }

static int reader_buf(range_reader *t, size_t len)
{
    if (len <= t->cap) return 0;
    uint8_t *b = realloc(t->buf, len);
    if (!b) return ckpt_error_set(CKPT_ENOMEM, "out of memory for a %zu-byte range", len);
    t->buf = b;
    t->cap = len;
    return 0;
}

static int ranges_view(void *ctx, void *ts, size_t file, uint64_t off, size_t len, const uint8_t **out)
{
    store_blob_ranges *r = ctx;
    range_reader *t = ts;
    int rc = reader_buf(t, len);
    if (!rc) rc = range_get(t, r->p->src_paths[file] + r->skip, off, len, t->buf);
    *out = t->buf;
    return rc;
}

/* Rows far apart (a row-parallel slice) are fetched one GET each, packed;
 * rows close together are left to one GET of their span (1). */
static int ranges_view_rows(void *ctx, void *ts, size_t file, uint64_t off, uint64_t rows, uint64_t stride,
                            size_t len, const uint8_t **out, uint64_t *out_stride)
{
    store_blob_ranges *r = ctx;
    range_reader *t = ts;
    if (rows < 2 || stride <= len || stride - len < r->gap) return 1; /* adjacent or close: the span */
    int rc = reader_buf(t, (size_t)(rows * len));
    for (uint64_t i = 0; !rc && i < rows; i++)
        rc = range_get(t, r->p->src_paths[file] + r->skip, off + i * stride, len, t->buf + i * len);
    *out = t->buf;
    *out_stride = len;
    return rc;
}

int store_blob_ranges_attach(ckpt_store *s, exec_plan *p, store_blob_ranges *r)
{
    memset(r, 0, sizeof *r);
    if (!store_blobs_remote(s)) return 0;
    const char *g = getenv("CKPT_S3_RANGE_GAP");
    uint64_t gap = RANGE_GAP_DEFAULT;
    if (g && *g && ckpt_parse_u64(g, &gap) < 0)
        return ckpt_error_set(CKPT_EINVAL, "CKPT_S3_RANGE_GAP '%s': expected a number of bytes", g);
    *r = (store_blob_ranges){.v = {.ctx = r,
                                   .serves = ranges_serves,
                                   .thread_open = ranges_thread_open,
                                   .thread_close = ranges_thread_close,
                                   .view = ranges_view,
                                   .view_rows = ranges_view_rows},
                             .s = s,
                             .p = p,
                             .skip = strlen(s->s3_bucket) + 6,
                             .gap = gap};
    p->vsource = &r->v;
    return 0;
}
