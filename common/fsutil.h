/*
 * fsutil.h — files that appear complete or not at all, and I/O that finishes.
 *
 * The durability protocol (docs/ARCHITECTURE.md, "Durability"): a thing
 * becomes visible only when it is complete. For one file:
 *
 *   ckpt_atomic_file af;
 *   if (ckpt_atomic_open(&af, "/dst/model.safetensors") < 0) ...   // creates /dst/.model.safetensors.tmp-XXXXXX
 *   ... write af.fd with ckpt_pwrite_full / ckpt_write_full ...
 *   if (ckpt_atomic_commit(&af) < 0) ...   // fsync, rename over the target, fsync the directory
 *   // or, on any failure: ckpt_atomic_abort(&af);                // unlink the temp file
 *
 * For a whole directory: write everything into a sibling "DST.tmp-XXXXXX"
 * made by ckpt_tmpdir_create(), fsync its files, then ckpt_dir_commit() renames
 * it into place and fsyncs the parent. A failure removes the temp directory
 * with ckpt_rm_rf(). Temp names start with the target name and contain
 * ".tmp-", so leftovers of a killed process are recognisable for cleanup.
 */
#ifndef CKPT_COMMON_FSUTIL_H
#define CKPT_COMMON_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct {
    int fd;
    char *path;     /* final name */
    char *tmp_path; /* temp name in the same directory */
    bool tracked;   /* removed on an interrupt (ckpt_atomic_open_tracked) */
} ckpt_atomic_file;

int ckpt_atomic_open(ckpt_atomic_file *af, const char *path);
/* The same for a long write into a user's path (an archive pull): the temp
 * file is "<path>.tmp-<pid>-<start>-XXXXXX", named after its writer as
 * ckpt_tmpdir_create's folders are (those of writers that are gone are
 * removed first), and it is removed if the process is interrupted
 * (common/interrupt.h) until commit or abort. */
int ckpt_atomic_open_tracked(ckpt_atomic_file *af, const char *path);
/* The process's umask (from /proc/self/status; 022 when unknown).
 * Files made by mkstemp/mkdtemp get 0666/0777 less this, as open/mkdir would. */
unsigned ckpt_umask(void);
int ckpt_atomic_commit(ckpt_atomic_file *af);
void ckpt_atomic_abort(ckpt_atomic_file *af);
/* Writes buf to path atomically (open, write, commit). */
int ckpt_write_file_atomic(const char *path, const void *buf, size_t len);
/* Writes buf to a new file at path (0600), with no fsync: for scratch files
 * in a temporary folder that is removed after the run, where waiting for
 * the disk buys nothing. */
int ckpt_write_file_scratch(const char *path, const void *buf, size_t len);

/* Read or write exactly len bytes (retrying short transfers and EINTR).
 * Errors name `what` (usually the path). A read past EOF is CKPT_EINVAL. */
int ckpt_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *what);

/* Reading with O_DIRECT (straight from the device into the caller's buffer,
 * no page cache filled: on a VM whose fresh memory is costly to touch, a
 * sequential read at a fraction of the system time). ckpt_open_direct opens
 * path again with O_DIRECT when the file system takes it and it is the
 * same file as fd (device and inode); -1 otherwise. ckpt_pread_direct reads
 * [off, off+len) into buf like ckpt_pread_full(fd, ...), through dfd when
 * dfd >= 0: the whole CKPT_DIRECT_ALIGN blocks around the range are read
 * into the memory around buf, so buf - off % CKPT_DIRECT_ALIGN must be
 * aligned to CKPT_DIRECT_ALIGN and lie in the caller's buffer, and the
 * buffer must hold CKPT_DIRECT_ALIGN bytes more after buf + len (the
 * bytes before and after the range are overwritten). A misaligned buf, or a
 * file system that refuses the read, is read through fd instead. */
#define CKPT_DIRECT_ALIGN 4096u
int ckpt_open_direct(const char *path, int fd);
int ckpt_pread_direct(int dfd, int fd, void *buf, size_t len, uint64_t off, const char *what);
int ckpt_pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *what);
int ckpt_write_full(int fd, const void *buf, size_t len, const char *what);

/* Reads a whole file of at most max bytes into a NUL-terminated buffer. */
int ckpt_read_file(const char *path, size_t max, char **out, size_t *out_len);

/* Copies len bytes between files, in-kernel where possible (copy_file_range). */
int ckpt_copy_range(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t len,
                    const char *what);

int ckpt_mkdir_p(const char *path, unsigned mode);
int ckpt_fsync_dir(const char *dir);
/* fsync the parent directory of path. */
int ckpt_fsync_parent(const char *path);
/* Creates "<target>.tmp-<pid>-<start>-XXXXXX" beside target (pid and start
 * time name the writer); *out is malloc'd. First removes the
 * "<target>.tmp-<pid>-<start>-*" of writers that are gone (a killed earlier
 * run into the same target). The new folder is removed if the process is
 * interrupted (common/interrupt.h) until ckpt_dir_commit or ckpt_rm_rf. */
int ckpt_tmpdir_create(const char *target, char **out);
/* The start time of process pid (field 22 of /proc/pid/stat), or -1 when it
 * is gone (or a zombie): with the pid, a writer that pid reuse cannot fake. */
int64_t ckpt_proc_start_time(int pid);
/* Parses "<pid>-<start>-..." (what follows ".tmp-" in a temp folder's name). */
bool ckpt_tmp_name_writer(const char *suffix, int *pid, int64_t *start);
/* Renames tmp onto target (which must not exist, or must be an empty dir
 * when replace_empty is set) and fsyncs the parent. */
int ckpt_dir_commit(const char *tmp, const char *target);
/* Removes a file or directory tree; missing is fine. */
int ckpt_rm_rf(const char *path);
/* True when path is a directory with no entries, or does not exist. */
bool ckpt_dir_is_empty_or_missing(const char *path);
bool ckpt_is_dir(const char *path);
bool ckpt_exists(const char *path);
/* Joins two path pieces with one '/'. malloc'd; NULL (error set) on failure. */
char *ckpt_path_join(const char *a, const char *b);
/* The last component of a path (pointer into path). */
const char *ckpt_basename(const char *path);

#endif
