/*
 * store_pull.h — a stored checkpoint written out: the one implementation of
 * `ckpt pull` (the CLI only resolves the ref, or fetches it from a remote
 * daemon first). The daemon's GET /v1/checkpoints/{ref}/archive.tar streams
 * the same files through store_archive.h (the tar writer and per-file sha256
 * checks this uses for nothing staged), and the Hub API reads them through
 * materialize.h's store_file_reader.
 *
 *   dir      every file rebuilt (materialize.h) into DST, sha256-checked
 *            before DST appears
 *   tar, tar.zst   to a file: streamed through store_archive.h, each file
 *            built from its blobs or recipes into the tar writer and hashed on
 *            the way (nothing staged; a pending sha256 recorded as a folder
 *            pull records it), into "<out>.tmp-<pid>-<start>-XXXXXX" beside
 *            out, fsynced and renamed into place once every file matched;
 *            to standard output (out "-"): rebuilt into a staging folder under
 *            CKPT_HOME/tmp first, so that a damaged store fails before the
 *            first byte is written
 *   consolidated   (a converted layout) the original layout rebuilt from it
 *            (transform/convert.h consolidate_run), as a folder or archived
 *   rank     of a tensor-parallel layout, only rank R's folder (at the root)
 *            and the top-level files
 */
#ifndef CKPT_STORE_STORE_PULL_H
#define CKPT_STORE_STORE_PULL_H

#include "store/store.h"

#include <stdbool.h>

typedef enum { STORE_PULL_DIR, STORE_PULL_TAR, STORE_PULL_TAR_ZST } store_pull_format;

typedef struct {
    store_pull_format format;
    int rank;          /* -1: every file */
    bool consolidated; /* c must hold a converted layout (its ckpt-layout.json): the caller
                          checks (a layout fetched from a remote daemon is stored without
                          its layout name) */
    bool force;        /* replace a non-empty destination folder */
    bool quiet;
} store_pull_opts;

/* "dir", "tar" or "tar.zst"; CKPT_EINVAL naming the others. */
int store_pull_format_parse(const char *text, store_pull_format *out);
/* Writes c to out (a folder, an archive file, or "-" for standard output). */
int store_pull(ckpt_store *s, const store_ckpt *c, const char *out, const store_pull_opts *o);

#endif
