/* store_pull.c — a stored checkpoint written out (see store_pull.h). */
#include "store/store_pull.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "format/archive.h"
#include "store/materialize.h"
#include "store/store_archive.h"
#include "transform/convert.h"

#include <stdlib.h>
#include <string.h>

#define PULL_HEAP_RESERVE ((size_t)256 << 20)

int store_pull_format_parse(const char *text, store_pull_format *out)
{
    if (!strcmp(text, "dir")) *out = STORE_PULL_DIR;
    else if (!strcmp(text, "tar")) *out = STORE_PULL_TAR;
    else if (!strcmp(text, "tar.zst")) *out = STORE_PULL_TAR_ZST;
    else return ckpt_error_set(CKPT_EINVAL, "format '%s': expected dir, tar or tar.zst", text);
    return 0;
}

/* The layout (ckpt-layout.json) of a stored layout that consolidates from
 * its stored parts, without writing the layout first
 * (store_materialize_headers, consolidate_opts.stored), or NULL: anything
 * else is consolidated from a staged copy. */
static json_t *from_parts(ckpt_store *s, const store_ckpt *c)
{
    store_file_row *rows;
    size_t n;
    /* Blobs in a bucket are read in ranges through the pull's own plan
     * (blob_ranges.h), which a consolidation's composed plan does not carry. */
    if (!c->layout[0] || store_blobs_remote(s) || store_files_load(s, c->id, &rows, &n)) return NULL;
    json_t *layout = NULL;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(rows[i].path, CONVERT_LAYOUT_FILE) || !rows[i].blob) continue;
        char *path = store_blob_read_path(s, rows[i].blob);
        if (path && cj_load_file(&layout, path, CONVERT_LAYOUT_MAX_BYTES)) layout = NULL;
        free(path);
    }
    store_files_free(rows, n);
    if (!consolidate_layout_composable(layout)) {
        json_decref(layout);
        layout = NULL;
    }
    ckpt_error_clear();
    return layout;
}

/* An archive file streamed from the store (store_archive.h): each file
 * built from its blobs or recipes straight into the tar writer and hashed on
 * the way, into a temp file beside out that is fsynced and renamed into
 * place only when every file matched its sha256. */
static int pull_archive_file(ckpt_store *s, const store_ckpt *c, const char *out, const store_pull_opts *o)
{
    store_archive_opts ao = {.rank = o->rank, .hash_pending = false, .progress = !o->quiet};
    store_archive *ar;
    int rc = store_archive_plan_opts(s, c, &ao, &ar);
    if (rc) return rc;
    ckpt_atomic_file af;
    rc = ckpt_atomic_open_tracked(&af, out);
    if (!rc) {
        rc = store_archive_write(ar, s, af.fd, o->format == STORE_PULL_TAR_ZST);
        if (rc) ckpt_atomic_abort(&af);
        else rc = ckpt_atomic_commit(&af);
    }
    /* as a folder pull: a failure here costs a later reader the hashing, not this pull */
    if (!rc && store_archive_record_pending(ar, s))
        ckpt_warn("%s: the files' sha256 were not recorded: %s", out, ckpt_error_last());
    store_archive_free(ar);
    return rc;
}

int store_pull(ckpt_store *s, const store_ckpt *c, const char *out, const store_pull_opts *o)
{
    bool dir = o->format == STORE_PULL_DIR;
    if (dir && !strcmp(out, "-")) return ckpt_error_set(CKPT_EINVAL, "pull: '-' (standard output) needs a tar format");
    if (o->consolidated && o->rank >= 0)
        return ckpt_error_set(CKPT_EINVAL, "pull: --consolidated and --rank exclude each other");
    if (!dir && !o->consolidated && strcmp(out, "-")) return pull_archive_file(s, c, out, o);
    /* Directories are assembled in place; consolidation, and archives to
     * standard output (where nothing may go out before every file is known
     * good), go through a staging folder. */
    bool staged = !dir || o->consolidated;
    char *stage = NULL;
    int rc = 0;
    if (staged) {
        char *base = store_tmp_base(s, "pull");
        rc = base ? ckpt_tmpdir_create(base, &stage) : CKPT_ENOMEM;
        free(base);
    }
    store_stored_plan *parts = NULL;
    /* The layout's JSON and the plan of every part: ~220 MiB of small
     * objects for 18,867 experts' tensors, their page faults a fifth of the
     * pull's CPU on 4 KiB pages. */
    if (o->consolidated) ckpt_heap_reserve_huge(PULL_HEAP_RESERVE);
    json_t *layout = !rc && o->consolidated ? from_parts(s, c) : NULL;
    if (layout) {
        rc = store_materialize_headers(s, c, stage, &parts);
    } else if (!rc) {
        materialize_opts mo = {.rank = o->rank, .force = o->force || staged, .quiet = o->quiet};
        rc = store_materialize(s, c, staged ? stage : out, &mo);
    }
    if (!rc && o->consolidated) {
        consolidate_opts co = {.quiet = o->quiet, .force = o->force, .stored = parts ? store_stored_plan_exec(parts) : NULL,
                              .layout = parts ? layout : NULL};
        if (dir) {
            rc = consolidate_run(stage, out, &co);
        } else {
            char *cons = ckpt_sprintf("%s.consolidated", stage);
            rc = cons ? consolidate_run(stage, cons, &co) : CKPT_ENOMEM;
            ckpt_rm_rf(stage);
            free(stage);
            stage = cons;
        }
    }
    store_stored_plan_free(parts);
    json_decref(layout);
    if (!rc && !dir) rc = ckpt_archive_write_tree(stage, out, o->format == STORE_PULL_TAR_ZST);
    if (stage) {
        ckpt_rm_rf(stage);
        free(stage);
    }
    return rc;
}
