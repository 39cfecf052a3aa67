/* outdir.c — writing a checkpoint folder as one step (see outdir.h). */
#include "format/outdir.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/interrupt.h"
#include "common/util.h"
#include "format/torch.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int outdir_prepare(const char *dst, bool force, char **tmpdir)
{
    struct stat st;
    if (stat(dst, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return ckpt_error_set(CKPT_EEXIST, "%s exists and is not a directory", dst);
        if (!force && !ckpt_dir_is_empty_or_missing(dst))
            return ckpt_error_set(CKPT_EEXIST, "%s is not empty (use --force to replace it)", dst);
    }
    return ckpt_tmpdir_create(dst, tmpdir);
}

int outdir_commit(const char *tmpdir, const char *dst, bool force)
{
    if (force && ckpt_is_dir(dst) && !ckpt_dir_is_empty_or_missing(dst)) {
        char *old = NULL;
        int rc = ckpt_tmpdir_create(dst, &old);
        if (rc) return rc;
        /* An interrupt waits until the old output is back or the new one in place. */
        ckpt_interrupt_hold();
        rmdir(old);
        if (rename(dst, old) < 0) {
            rc = ckpt_error_sys("%s: cannot move the old directory aside", dst);
            ckpt_interrupt_release();
            free(old);
            return rc;
        }
        rc = ckpt_dir_commit(tmpdir, dst);
        if (rc) rename(old, dst);
        ckpt_interrupt_release();
        if (!rc) ckpt_rm_rf(old);
        free(old);
        return rc;
    }
    return ckpt_dir_commit(tmpdir, dst);
}

bool outdir_is_weight_name(const char *name)
{
    size_t n = strlen(name);
    /* torch.save weights too (format/torch.h): converted, not copied */
    const char *suffixes[] = {".safetensors", ".safetensors.index.json", OUTDIR_LAYOUT_FILE, ".bin.index.json", ".pt", ".pth"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(suffixes); i++) {
        size_t l = strlen(suffixes[i]);
        if (n >= l && !strcmp(name + n - l, suffixes[i])) return true;
    }
    if (!strncmp(name, "pytorch_model", 13) && n >= 4 && !strcmp(name + n - 4, ".bin")) return true;
    return name[0] == '.' || strstr(name, ".tmp-") != NULL;
}

/* Any other .bin that is a torch.save file: weights (or a pickle), not a side file. */
static bool is_torch_bin(const char *path, const char *name)
{
    size_t n = strlen(name);
    if (n < 4 || strcmp(name + n - 4, ".bin")) return false;
    uint8_t head[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd < 0 ? -1 : pread(fd, head, sizeof head, 0);
    if (fd >= 0) close(fd);
    return got > 0 && torch_sniff(head, (size_t)got) != NULL;
}

int outdir_copy_side_files(const char *src_dir, const char *out_dir)
{
    DIR *d = opendir(src_dir);
    if (!d) return ckpt_error_sys("%s: open directory", src_dir);
    int rc = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (outdir_is_weight_name(e->d_name)) continue;
        char *from = ckpt_path_join(src_dir, e->d_name), *to = ckpt_path_join(out_dir, e->d_name);
        if (from && is_torch_bin(from, e->d_name)) {
            free(from);
            free(to);
            continue;
        }
        struct stat st;
        if (!from || !to) rc = CKPT_ENOMEM;
        else if (lstat(from, &st) == 0 && S_ISREG(st.st_mode)) {
            char *buf;
            size_t len;
            rc = ckpt_read_file(from, OUTDIR_SIDE_FILE_MAX_BYTES, &buf, &len);
            if (!rc) {
                rc = ckpt_write_file_atomic(to, buf, len);
                free(buf);
            }
        }
        free(from);
        free(to);
    }
    closedir(d);
    return rc;
}

int outdir_copy_model_files(const char *src_dir, const char *out_dir, bool scratch)
{
    static const char *const names[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"};
    for (size_t i = 0; i < CKPT_ARRAY_LEN(names); i++) {
        char *from = ckpt_path_join(src_dir, names[i]), *to = ckpt_path_join(out_dir, names[i]);
        int rc = from && to ? 0 : CKPT_ENOMEM;
        if (!rc && ckpt_exists(from)) {
            char *buf = NULL;
            size_t len = 0;
            rc = ckpt_read_file(from, OUTDIR_SIDE_FILE_MAX_BYTES, &buf, &len);
            if (!rc) rc = scratch ? ckpt_write_file_scratch(to, buf, len) : ckpt_write_file_atomic(to, buf, len);
            free(buf);
        }
        free(from);
        free(to);
        if (rc) return rc;
    }
    return 0;
}
