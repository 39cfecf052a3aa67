/*
 * store_partial.h — what an interrupted Hub fetch keeps so the next fetch of
 * the same commit resumes instead of starting over (docs/hub.md "Resume").
 *
 * Layout, under CKPT_HOME/partial/ (beside blobs/, so a finished piece file
 * is renamed into blobs/ on the same filesystem):
 *
 *   partial/<commit>/lock          flock'd by the one fetch using the folder
 *   partial/<commit>/<key>/meta    "ckpt-partial 1\n<size> <sha256|-> <oid|->\n<path>\n"
 *   partial/<commit>/<key>/header  a safetensors file's header bytes (written atomically)
 *   partial/<commit>/<key>/r<K>    the bytes of region K (the whole file, or tensor K)
 *   partial/<commit>/<key>/journal one line "START END\n" per finished piece of the file
 *
 * <key> is the first 32 hex digits of the sha256 of the file's path. A piece
 * is recorded only after its bytes were fdatasync'ed, and the journal line is
 * fdatasync'ed before the piece counts: after a crash every recorded range
 * holds the bytes the Hub sent (a torn last line, missing its newline, is
 * ignored). The kept bytes are trusted for nothing but saving downloads: the
 * file's sha256 is computed again over the whole file as it is reassembled
 * and a mismatch downloads the file afresh.
 *
 * Bounds: a journal is read up to STORE_PARTIAL_MAX_JOURNAL bytes; a commit's
 * folder holds at most the files a fetch picked (each no larger than the
 * tree says); gc (store_partial_gc) removes a commit's folder that no live
 * fetch holds once nothing in it changed for the keep period
 * (CKPT_HUB_PARTIAL_KEEP seconds, default STORE_PARTIAL_KEEP_S).
 */
#ifndef CKPT_STORE_STORE_PARTIAL_H
#define CKPT_STORE_STORE_PARTIAL_H

#include "store/store.h"

#include <stdbool.h>
#include <stdint.h>

#define STORE_PARTIAL_KEEP_S (7 * 24 * 3600)
#define STORE_PARTIAL_MAX_JOURNAL (16u << 20)

typedef struct {
    char *dir; /* partial/<commit>; NULL: not resumable (another fetch holds it) */
    int lock_fd;
} store_partial;

/* Opens (creating) the partial folder of commit and locks it. When another
 * live fetch holds it, p->dir stays NULL and 0 is returned: this fetch then
 * downloads into tmp/ as if nothing were kept. */
int store_partial_open(ckpt_store *s, const char *commit, store_partial *p);
/* Unlocks; with remove_if_empty, the folder goes when no file folder is left. */
void store_partial_close(store_partial *p, bool remove_if_empty);

/* The folder of one file (malloc'd), made when missing. fresh: wipe what
 * it held. meta is checked: a folder kept for other bytes (another size or
 * hash under that path) is wiped. *kept says whether anything was kept. */
int store_partial_file(store_partial *p, const char *path, uint64_t size, const char *sha256,
                       const char *oid, bool fresh, char **dir, bool *kept);
/* The bytes the folder holds on disk (allocated blocks): what a resume needs
 * no more free space for. 0 when not opened. */
uint64_t store_partial_bytes(const store_partial *p);
/* Removes the file's folder (after its blobs were published). */
int store_partial_file_remove(store_partial *p, const char *path);

/* Reads the journal of a file folder: ranges[0..*n) (malloc'd pairs), every
 * one inside [0, size). A line that does not parse ends the list. */
int store_partial_journal_read(const char *dir, uint64_t size, uint64_t (**ranges)[2], size_t *n);
/* Appends [start, end) to the journal and fdatasyncs it. fd: the journal,
 * opened with store_partial_journal_open. */
int store_partial_journal_open(const char *dir, int *fd);
int store_partial_journal_add(int fd, const char *dir, uint64_t start, uint64_t end);

/* gc: removes the partial folders no live fetch holds and in which nothing
 * changed for keep_s seconds; counts them into *removed. */
int store_partial_gc(ckpt_store *s, double keep_s, bool dry_run, uint64_t *removed);
/* The keep period: CKPT_HUB_PARTIAL_KEEP (seconds) or STORE_PARTIAL_KEEP_S. */
double store_partial_keep(void);

#endif
