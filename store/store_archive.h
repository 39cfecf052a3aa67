/*
 * store_archive.h — a stored checkpoint as a tar stream, straight from the
 * store's readers (materialize.h): nothing is staged on disk, and every
 * file is hashed on the way and compared with the catalog's sha256.
 *
 *   store_archive *ar;
 *   if (store_archive_plan(s, &c, rank, &ar) == 0) {   // what can fail early
 *       rc = store_archive_write(ar, s, fd, zstd);      // then the bytes
 *       store_archive_free(ar);
 *   }
 *
 * Planning checks the rank (-1: every file; else a tensor-parallel layout
 * must have that rank: its tp_rank_RR/ files go at the root, with the
 * top-level files) and opens every file's reader once, so a missing blob is
 * an error before the first byte. Writing may still fail later (damaged
 * bytes): the caller must make that visible (the HTTP API aborts the
 * connection, `pull` fails).
 */
#ifndef CKPT_STORE_STORE_ARCHIVE_H
#define CKPT_STORE_STORE_ARCHIVE_H

#include "store/store.h"

#include <stdbool.h>

typedef struct store_archive store_archive;

typedef struct {
    int rank;          /* -1: every file */
    bool hash_pending; /* true: the sha256 a convert in the store left pending are computed
                          first (store_hash_pending: every such file read once more), so every
                          file is checked as it is written. false (ckpt pull): such a file's
                          sha256 is the one computed as it is written, recorded afterwards by
                          store_archive_record_pending, as a folder pull records what it wrote */
    bool progress;     /* a progress line ("pull") while writing */
} store_archive_opts;

/* CKPT_EINVAL for a bad rank (*ar NULL), CKPT_ECORRUPT for a missing blob. */
int store_archive_plan_opts(ckpt_store *s, const store_ckpt *c, const store_archive_opts *o, store_archive **ar);
/* The same with {rank, hash_pending = true}: the HTTP API, whose files have their sha256 before a byte goes out. */
int store_archive_plan(ckpt_store *s, const store_ckpt *c, int rank, store_archive **ar);
/* Writes the tar to fd with s (any connection to the same CKPT_HOME). A
 * file whose bytes do not hash to the catalog's sha256 fails it with
 * CKPT_ECORRUPT naming the file. */
int store_archive_write(store_archive *ar, ckpt_store *s, int fd, bool zstd);
/* After a write that succeeded: the pending sha256 it computed into the catalog. */
int store_archive_record_pending(store_archive *ar, ckpt_store *s);
void store_archive_free(store_archive *ar);

#endif
