/* store_partial.c — the kept pieces of interrupted Hub fetches (see store_partial.h). */
#include "store/store_partial.h"

#include "common/error.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/sha256.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PARTIAL_MAX_META 8192

static char *partial_root(const ckpt_store *s)
{
    return ckpt_path_join(s->home, "partial");
}

/* Locks dir/lock without waiting. 1: locked (*fd), 0: another process holds
 * it, < 0: error. The lock file is checked to be the one in the folder after
 * locking (a gc may have removed the folder meanwhile: then 0). */
static int lock_dir(const char *dir, int *fd)
{
    char *path = ckpt_path_join(dir, "lock");
    if (!path) return CKPT_ENOMEM;
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) {
        int rc = errno == ENOENT ? 0 : ckpt_error_sys("%s: open", path);
        free(path);
        return rc;
    }
    int rc = 1;
    struct stat a, b;
    if (flock(*fd, LOCK_EX | LOCK_NB) < 0)
        rc = errno == EWOULDBLOCK ? 0 : ckpt_error_sys("%s: lock", path);
    else if (fstat(*fd, &a) < 0 || stat(path, &b) < 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev)
        rc = 0; /* removed by a gc between open and flock */
    if (rc != 1) {
        close(*fd);
        *fd = -1;
    }
    free(path);
    return rc;
}

int store_partial_open(ckpt_store *s, const char *commit, store_partial *p)
{
    p->dir = NULL;
    p->lock_fd = -1;
    char *root = partial_root(s);
    char *dir = root ? ckpt_path_join(root, commit) : NULL;
    free(root);
    if (!dir) return CKPT_ENOMEM;
    int rc = ckpt_mkdir_p(dir, 0755);
    if (!rc) rc = lock_dir(dir, &p->lock_fd);
    if (rc == 1) {
        p->dir = dir;
        return 0;
    }
    free(dir);
    return rc;
}

void store_partial_close(store_partial *p, bool remove_if_empty)
{
    if (p->dir && remove_if_empty) {
        /* Only the lock left: the folder goes (while still locked). */
        DIR *d = opendir(p->dir);
        bool empty = d != NULL;
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "lock")) empty = false;
        if (d) closedir(d);
        if (empty) ckpt_rm_rf(p->dir);
    }
    if (p->lock_fd >= 0) close(p->lock_fd);
    free(p->dir);
    p->dir = NULL;
    p->lock_fd = -1;
}

static char *file_dir(const store_partial *p, const char *path)
{
    char hex[65];
    if (ckpt_sha256_buf_hex(path, strlen(path), hex) < 0) return NULL;
    hex[32] = 0;
    return ckpt_path_join(p->dir, hex);
}

int store_partial_file(store_partial *p, const char *path, uint64_t size, const char *sha256,
                       const char *oid, bool fresh, char **out, bool *kept)
{
    *out = NULL;
    *kept = false;
    char *dir = file_dir(p, path);
    char *meta_path = dir ? ckpt_path_join(dir, "meta") : NULL;
    char *want = ckpt_sprintf("ckpt-partial 1\n%llu %s %s\n%s\n", (unsigned long long)size,
                              *sha256 ? sha256 : "-", *oid ? oid : "-", path);
    int rc = dir && meta_path && want ? 0 : CKPT_ENOMEM;
    char *have = NULL;
    size_t have_len = 0;
    if (!rc && !fresh && ckpt_read_file(meta_path, PARTIAL_MAX_META, &have, &have_len) == 0 &&
        !strcmp(have, want))
        *kept = true;
    ckpt_error_clear();
    if (!rc && !*kept) {
        rc = ckpt_rm_rf(dir);
        if (!rc) rc = ckpt_mkdir_p(dir, 0755);
        if (!rc) rc = ckpt_write_file_atomic(meta_path, want, strlen(want));
    }
    free(have);
    free(want);
    free(meta_path);
    if (rc) {
        free(dir);
        return ckpt_error_prefix(rc, "%s: keeping the download for a resume", path);
    }
    *out = dir;
    return 0;
}

static uint64_t tree_bytes(const char *dir, int depth)
{
    uint64_t n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *sub = ckpt_path_join(dir, e->d_name);
        struct stat st;
        if (sub && lstat(sub, &st) == 0) {
            if (S_ISREG(st.st_mode)) n += (uint64_t)st.st_blocks * 512;
            else if (S_ISDIR(st.st_mode) && depth > 0) n += tree_bytes(sub, depth - 1);
        }
        free(sub);
    }
    if (d) closedir(d);
    return n;
}

uint64_t store_partial_bytes(const store_partial *p)
{
    return p->dir ? tree_bytes(p->dir, 1) : 0;
}

int store_partial_file_remove(store_partial *p, const char *path)
{
    if (!p->dir) return 0;
    char *dir = file_dir(p, path);
    int rc = dir ? ckpt_rm_rf(dir) : CKPT_ENOMEM;
    free(dir);
    return rc;
}

int store_partial_journal_read(const char *dir, uint64_t size, uint64_t (**ranges)[2], size_t *n)
{
    *ranges = NULL;
    *n = 0;
    char *path = ckpt_path_join(dir, "journal");
    if (!path) return CKPT_ENOMEM;
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = ckpt_read_file(path, STORE_PARTIAL_MAX_JOURNAL, &text, &len);
    free(path);
    if (rc) { /* missing, or too long: nothing kept */
        ckpt_error_clear();
        return 0;
    }
    for (char *line = text; !rc;) {
        char *nl = memchr(line, '\n', len - (size_t)(line - text));
        if (!nl) break; /* a torn last line */
        *nl = 0;
        unsigned long long a, b;
        int used = 0;
        if (sscanf(line, "%llu %llu%n", &a, &b, &used) != 2 || line[used] || a >= b || b > size) break;
        if (ckpt_grow(ranges, &cap, *n + 1, sizeof **ranges) < 0) rc = CKPT_ENOMEM;
        else {
            (*ranges)[*n][0] = a;
            (*ranges)[*n][1] = b;
            (*n)++;
        }
        line = nl + 1;
    }
    free(text);
    if (rc) {
        free(*ranges);
        *ranges = NULL;
        *n = 0;
    }
    return rc;
}

int store_partial_journal_open(const char *dir, int *fd)
{
    char *path = ckpt_path_join(dir, "journal");
    if (!path) return CKPT_ENOMEM;
    *fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int rc = *fd < 0 ? ckpt_error_sys("%s: open", path) : 0;
    free(path);
    return rc;
}

int store_partial_journal_add(int fd, const char *dir, uint64_t start, uint64_t end)
{
    char line[64];
    int n = snprintf(line, sizeof line, "%llu %llu\n", (unsigned long long)start, (unsigned long long)end);
    int rc = ckpt_write_full(fd, line, (size_t)n, dir);
    if (!rc && fdatasync(fd) < 0) rc = ckpt_error_sys("%s/journal: sync", dir);
    if (!rc) ckpt_fault("fetch.piece_recorded");
    return rc;
}

/* The newest mtime of anything in dir (one level of file folders below). */
static time_t newest(const char *dir, int depth)
{
    struct stat st;
    time_t t = stat(dir, &st) == 0 ? st.st_mtime : 0;
    DIR *d = depth > 0 ? opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *sub = ckpt_path_join(dir, e->d_name);
        time_t u = sub ? newest(sub, depth - 1) : 0;
        if (u > t) t = u;
        free(sub);
    }
    if (d) closedir(d);
    return t;
}

int store_partial_gc(ckpt_store *s, double keep_s, bool dry_run, uint64_t *removed)
{
    char *root = partial_root(s);
    if (!root) return CKPT_ENOMEM;
    DIR *d = opendir(root);
    if (!d) {
        free(root);
        return 0; /* nothing was ever kept */
    }
    int rc = 0;
    /* The fine clock, not time(): a file's mtime may be a fine-grained stamp
     * (multigrain timestamps) ahead of the coarse second time() reads, and a
     * folder written this instant would look newer than now. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t now = ts.tv_sec;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *dir = ckpt_path_join(root, e->d_name);
        if (!dir) {
            rc = CKPT_ENOMEM;
            break;
        }
        int fd = -1;
        int locked = lock_dir(dir, &fd);
        if (locked < 0) ckpt_error_clear(); /* not ours to judge (a stray file): left alone */
        if (locked == 1 && (double)(now - newest(dir, 2)) >= keep_s) {
            if (!dry_run) rc = ckpt_rm_rf(dir);
            (*removed)++;
        }
        if (fd >= 0) close(fd);
        free(dir);
    }
    closedir(d);
    free(root);
    return rc;
}

double store_partial_keep(void)
{
    const char *v = getenv("CKPT_HUB_PARTIAL_KEEP");
    uint64_t sec;
    if (v && *v && ckpt_parse_u64(v, &sec) == 0 && sec <= 100ull * 365 * 86400) return (double)sec;
    return STORE_PARTIAL_KEEP_S;
}
