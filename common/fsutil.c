/* fsutil.c — atomic files and directories, full reads and writes. See fsutil.h. */
#include "common/fsutil.h"
#include "common/fault.h"

#include "common/error.h"
#include "common/interrupt.h"
#include "common/log.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *ckpt_path_join(const char *a, const char *b)
{
    size_t la = strlen(a);
    if (la && a[la - 1] == '/') return ckpt_sprintf("%s%s", a, b);
    return ckpt_sprintf("%s/%s", a, b);
}

const char *ckpt_basename(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static char *dirname_of(const char *path)
{
    const char *s = strrchr(path, '/');
    if (!s) return ckpt_strdup(".");
    if (s == path) return ckpt_strdup("/");
    return ckpt_strndup(path, (size_t)(s - path));
}

static void drop_dead_siblings(const char *target, size_t n);
static int64_t self_start_time(void);

/* The temp file of ckpt_atomic_open (tracked: ckpt_atomic_open_tracked). */
static int atomic_open(ckpt_atomic_file *af, const char *path, bool tracked)
{
    memset(af, 0, sizeof *af);
    af->fd = -1;
    char *dir = dirname_of(path);
    if (!dir) return CKPT_ENOMEM;
    af->path = ckpt_strdup(path);
    if (tracked) {
        drop_dead_siblings(path, strlen(path));
        af->tmp_path = ckpt_sprintf("%s.tmp-%d-%lld-XXXXXX", path, (int)getpid(), (long long)self_start_time());
    } else {
        af->tmp_path = ckpt_sprintf("%s/.%s.tmp-XXXXXX", dir, ckpt_basename(path));
    }
    free(dir);
    if (!af->path || !af->tmp_path) {
        ckpt_atomic_abort(af);
        return CKPT_ENOMEM;
    }
    af->fd = mkostemp(af->tmp_path, O_CLOEXEC);
    if (af->fd < 0) {
        int rc = ckpt_error_sys("%s: cannot create temporary file", path);
        free(af->tmp_path);
        af->tmp_path = NULL;
        ckpt_atomic_abort(af);
        return rc;
    }
    if (tracked) {
        ckpt_interrupt_track(af->tmp_path);
        af->tracked = true;
    }
    fchmod(af->fd, 0666 & ~ckpt_umask()); /* mkostemp makes 0600: the mode open(2) would give */
    return 0;
}

int ckpt_atomic_open(ckpt_atomic_file *af, const char *path)
{
    return atomic_open(af, path, false);
}

int ckpt_atomic_open_tracked(ckpt_atomic_file *af, const char *path)
{
    return atomic_open(af, path, true);
}

unsigned ckpt_umask(void)
{
    /* umask(2) can only be read by setting it, which races with other
     * threads creating files; /proc/self/status has it (Linux 4.7+). Read
     * each time: a caller may change it. */
    unsigned m = 022;
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "Umask:", 6)) {
            m = (unsigned)strtoul(line + 6, NULL, 8) & 0777;
            break;
        }
    if (f) fclose(f);
    return m;
}

int ckpt_atomic_commit(ckpt_atomic_file *af)
{
    int rc = 0;
    ckpt_fault("file.written");
    if (fsync(af->fd) < 0) rc = ckpt_error_sys("%s: fsync", af->path);
    if (close(af->fd) < 0 && !rc) rc = ckpt_error_sys("%s: close", af->path);
    af->fd = -1;
    if (!rc) ckpt_fault("file.synced");
    bool held = !rc && af->tracked;
    if (held) ckpt_interrupt_hold(); /* renamed and untracked as one step */
    if (!rc && rename(af->tmp_path, af->path) < 0) rc = ckpt_error_sys("%s: rename", af->path);
    if (!rc && af->tracked) {
        ckpt_interrupt_untrack(af->tmp_path);
        af->tracked = false;
    }
    if (held) ckpt_interrupt_release();
    if (!rc) ckpt_fault("file.renamed");
    if (!rc) rc = ckpt_fsync_parent(af->path);
    if (rc) {
        ckpt_atomic_abort(af);
        return rc;
    }
    free(af->path);
    free(af->tmp_path);
    af->path = af->tmp_path = NULL;
    return 0;
}

void ckpt_atomic_abort(ckpt_atomic_file *af)
{
    if (af->fd >= 0) close(af->fd);
    if (af->tmp_path) unlink(af->tmp_path);
    if (af->tracked) ckpt_interrupt_untrack(af->tmp_path);
    af->tracked = false;
    free(af->path);
    free(af->tmp_path);
    af->fd = -1;
    af->path = af->tmp_path = NULL;
}

int ckpt_write_file_atomic(const char *path, const void *buf, size_t len)
{
    ckpt_atomic_file af;
    int rc = ckpt_atomic_open(&af, path);
    if (rc) return rc;
    rc = ckpt_write_full(af.fd, buf, len, path);
    if (rc) {
        ckpt_atomic_abort(&af);
        return rc;
    }
    return ckpt_atomic_commit(&af);
}

int ckpt_write_file_scratch(const char *path, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return ckpt_error_sys("%s: create", path);
    int rc = ckpt_write_full(fd, buf, len, path);
    if (close(fd) < 0 && !rc) rc = ckpt_error_sys("%s: close", path);
    return rc;
}

int ckpt_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *what)
{
    char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return ckpt_error_sys("%s: read at offset %llu", what, (unsigned long long)off);
        }
        if (n == 0)
            return ckpt_error_set(CKPT_EINVAL, "%s: unexpected end of file at offset %llu", what,
                                  (unsigned long long)off);
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

int ckpt_open_direct(const char *path, int fd)
{
    int dfd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
    struct stat a, b;
    if (dfd >= 0 && (fstat(dfd, &a) < 0 || fstat(fd, &b) < 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
        close(dfd);
        dfd = -1;
    }
    return dfd;
}

int ckpt_pread_direct(int dfd, int fd, void *buf, size_t len, uint64_t off, const char *what)
{
    const uint64_t A = CKPT_DIRECT_ALIGN;
    size_t lead = (size_t)(off % A);
    uint8_t *base = (uint8_t *)buf - lead;
    if (dfd < 0 || (uintptr_t)base % A || len == 0) return ckpt_pread_full(fd, buf, len, off, what);
    uint64_t start = off - lead;
    size_t need = lead + len, want = (need + A - 1) / A * A, got = 0;
    while (got < need) {
        ssize_t n = pread(dfd, base + got, want - got, (off_t)(start + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EINVAL) break; /* refused: the rest through the page cache */
        if (n < 0) return ckpt_error_sys("%s: read at offset %llu", what, (unsigned long long)(start + got));
        if (n == 0)
            return ckpt_error_set(CKPT_EINVAL, "%s: unexpected end of file at offset %llu", what,
                                  (unsigned long long)(start + got));
        got += (size_t)n;
        if ((size_t)n % A && got < need) break; /* a short read not at the end: the rest through the page cache */
    }
    if (got >= need) return 0;
    size_t from = got > lead ? got - lead : 0;
    return ckpt_pread_full(fd, (uint8_t *)buf + from, len - from, off + from, what);
}

int ckpt_pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *what)
{
    const char *p = buf;
    while (len) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return ckpt_error_sys("%s: write at offset %llu", what, (unsigned long long)off);
        }
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

int ckpt_write_full(int fd, const void *buf, size_t len, const char *what)
{
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return ckpt_error_sys("%s: write", what);
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int ckpt_read_file(const char *path, size_t max, char **out, size_t *out_len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return ckpt_error_set(CKPT_ENOTFOUND, "%s: no such file", path);
        return ckpt_error_sys("%s: open", path);
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int rc = ckpt_error_sys("%s: stat", path);
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ckpt_error_set(CKPT_EINVAL, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        close(fd);
        return ckpt_error_set(CKPT_ELIMIT, "%s: file is %lld bytes, limit is %zu", path,
                              (long long)st.st_size, max);
    }
    size_t len = (size_t)st.st_size;
    char *buf = ckpt_malloc(len + 1);
    if (!buf) {
        close(fd);
        return CKPT_ENOMEM;
    }
    int rc = ckpt_pread_full(fd, buf, len, 0, path);
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = len;
    return 0;
}

int ckpt_copy_range(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t len,
                    const char *what)
{
    loff_t io = (loff_t)in_off, oo = (loff_t)out_off;
    while (len) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t n = copy_file_range(in_fd, &io, out_fd, &oo, chunk, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* fall back below: EXDEV, ENOSYS, EINVAL, or short source */
        len -= (uint64_t)n;
    }
    if (!len) return 0;
    /* Fallback: buffered copy. */
    size_t bufsz = 1u << 20;
    char *buf = ckpt_malloc(bufsz);
    if (!buf) return CKPT_ENOMEM;
    int rc = 0;
    while (len && !rc) {
        size_t chunk = len > bufsz ? bufsz : (size_t)len;
        rc = ckpt_pread_full(in_fd, buf, chunk, (uint64_t)io, what);
        if (!rc) rc = ckpt_pwrite_full(out_fd, buf, chunk, (uint64_t)oo, what);
        io += (loff_t)chunk;
        oo += (loff_t)chunk;
        len -= chunk;
    }
    free(buf);
    return rc;
}

int ckpt_mkdir_p(const char *path, unsigned mode)
{
    char tmp[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) return ckpt_error_set(CKPT_EINVAL, "bad directory path '%s'", path);
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, mode) < 0 && errno != EEXIST) return ckpt_error_sys("%s: mkdir", tmp);
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST) return ckpt_error_sys("%s: mkdir", tmp);
    if (!ckpt_is_dir(tmp)) return ckpt_error_set(CKPT_EEXIST, "%s: exists and is not a directory", tmp);
    return 0;
}

int ckpt_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ckpt_error_sys("%s: open directory", dir);
    int rc = 0;
    if (fsync(fd) < 0 && errno != EINVAL) rc = ckpt_error_sys("%s: fsync directory", dir);
    close(fd);
    return rc;
}

int ckpt_fsync_parent(const char *path)
{
    char *dir = dirname_of(path);
    if (!dir) return CKPT_ENOMEM;
    int rc = ckpt_fsync_dir(dir);
    free(dir);
    return rc;
}

int64_t ckpt_proc_start_time(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p) return -1;
    /* Fields after ")" start at 3 (state); the start time is field 22. */
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        ++field;
        if (field == 3 && (tok[0] == 'Z' || tok[0] == 'X')) return -1; /* exited, not reaped yet */
        if (field == 22) {
            char *end;
            errno = 0;
            long long v = strtoll(tok, &end, 10);
            return errno || end == tok || (*end != '\0' && *end != '\n') || v < 0 ? -1 : v;
        }
    }
    return -1;
}

static int64_t self_start_time(void)
{
    static _Atomic int64_t cached = -1;
    if (cached < 0) cached = ckpt_proc_start_time((int)getpid());
    return cached;
}

bool ckpt_tmp_name_writer(const char *suffix, int *pid, int64_t *start)
{
    long long st;
    int p, used = 0;
    if (sscanf(suffix, "%d-%lld-%n", &p, &st, &used) != 2 || used == 0 || p <= 0) return false;
    *pid = p;
    *start = st;
    return true;
}

/* Removes "<target>.tmp-<pid>-<start>-*" whose writer is gone (a killed run
 * into the same target). Names without a writer (older ones) are left. */
static void drop_dead_siblings(const char *target, size_t n)
{
    const char *slash = memrchr(target, '/', n);
    char *dir = slash ? ckpt_strndup(target, slash == target ? 1 : (size_t)(slash - target)) : ckpt_strdup(".");
    const char *base = slash ? slash + 1 : target;
    size_t blen = n - (size_t)(base - target);
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid;
        int64_t start;
        if (strncmp(e->d_name, base, blen) || strncmp(e->d_name + blen, ".tmp-", 5) ||
            !ckpt_tmp_name_writer(e->d_name + blen + 5, &pid, &start) || ckpt_proc_start_time(pid) == start)
            continue;
        char *p = ckpt_path_join(dir, e->d_name);
        if (p) {
            ckpt_info("removing %s, left by an interrupted run (process %d)", p, pid);
            ckpt_rm_rf(p);
        }
        free(p);
    }
    if (d) closedir(d);
    free(dir);
}

int ckpt_tmpdir_create(const char *target, char **out)
{
    size_t n = strlen(target);
    while (n > 1 && target[n - 1] == '/') n--;
    drop_dead_siblings(target, n);
    char *t = ckpt_sprintf("%.*s.tmp-%d-%lld-XXXXXX", (int)n, target, (int)getpid(),
                           (long long)self_start_time());
    if (!t) return CKPT_ENOMEM;
    if (!mkdtemp(t)) {
        int rc = ckpt_error_sys("%s: cannot create temporary directory", t);
        free(t);
        return rc;
    }
    ckpt_interrupt_track(t);
    chmod(t, 0777 & ~ckpt_umask()); /* mkdtemp makes 0700; the renamed result is an ordinary directory */
    *out = t;
    ckpt_fault("tmpdir.created");
    return 0;
}

int ckpt_dir_commit(const char *tmp, const char *target)
{
    ckpt_fault("dir.before_rename");
    ckpt_interrupt_hold(); /* renamed and untracked as one step */
    if (ckpt_is_dir(target) && ckpt_dir_is_empty_or_missing(target)) rmdir(target);
    int rc = rename(tmp, target) < 0 ? ckpt_error_sys("%s: rename into place", target) : 0;
    if (!rc) ckpt_interrupt_untrack(tmp);
    ckpt_interrupt_release();
    if (rc) return rc;
    ckpt_fault("dir.renamed");
    return ckpt_fsync_parent(target);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    if (remove(path) < 0 && errno != ENOENT) return -1;
    return 0;
}

int ckpt_rm_rf(const char *path)
{
    ckpt_interrupt_untrack(path); /* gone, or failing to go: not the handler's any more */
    struct stat st;
    if (lstat(path, &st) < 0) return errno == ENOENT ? 0 : ckpt_error_sys("%s: stat", path);
    if (!S_ISDIR(st.st_mode)) return unlink(path) < 0 ? ckpt_error_sys("%s: unlink", path) : 0;
    if (nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS) < 0) return ckpt_error_sys("%s: remove", path);
    return 0;
}

bool ckpt_dir_is_empty_or_missing(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT;
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            empty = false;
            break;
        }
    }
    closedir(d);
    return empty;
}

bool ckpt_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool ckpt_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}
