/*
 * materialize.h — turn a stored checkpoint back into files.
 *
 * Safetensors files are assembled by the executor: the stored header is
 * written as it is, and each tensor is streamed from its blob or assembled
 * from its recipe's parts. Other files are copied from their blobs. Every
 * written file is hashed and compared with the catalog's sha256 before the
 * destination appears, so a damaged blob fails the pull instead of
 * producing bad bytes.
 */
#ifndef CKPT_STORE_MATERIALIZE_H
#define CKPT_STORE_MATERIALIZE_H

#include "plan/executor.h"
#include "store/store.h"

typedef struct {
    int rank;      /* -1: all files; else only tp_rank_RR/ (written at the root) and top-level files;
                      a rank the layout does not have is an error */
    bool force;    /* replace a non-empty destination */
    bool quiet;
    int threads;
} materialize_opts;

int store_materialize(ckpt_store *s, const store_ckpt *c, const char *dst, const materialize_opts *o);
/* rank -1, or one of the checkpoint's tp_rank_NN/ folders; else CKPT_EINVAL
 * (a checkpoint without such folders has no ranks). */
int materialize_rank_check(ckpt_store *s, const store_ckpt *c, int rank);
/* The same over a checkpoint's file rows (id names it in the message): a rank
 * (>= 0) must name one of its tp_rank_NN/ folders (or vLLM model-rank-N files). */
int materialize_rank_check_files(const store_file_row *rows, size_t n, int64_t id, int rank);
/* Where stored file `path` goes when only rank `rank` is pulled (rank < 0:
 * everything, unchanged): tp_rank_NN/ files lose the folder, vLLM's
 * model-rank-R-part-P.safetensors (the vllm layout) keep their names, other
 * ranks' files and other subfolders are dropped (NULL); top-level files stay.
 * Returns a pointer into path, or NULL. */
const char *materialize_rank_path(const char *path, int rank);

/* Random access to one stored file, without materialising it: the header
 * from the catalog, tensor bytes from blobs or assembled from recipes. */
/* pull --consolidated without writing the layout first: dir (an empty
 * folder) gets every stored file of c, its safetensors files as their
 * headers alone (holes where the tensors go), and *plan the executor's plan
 * of those files from the store's blobs, for consolidate_opts.stored. The
 * plain files are checked against the catalog; the rest is checked by the
 * consolidation against the source's sha256. */
typedef struct store_stored_plan store_stored_plan;
int store_materialize_headers(ckpt_store *s, const store_ckpt *c, const char *dir, store_stored_plan **plan);
const exec_plan *store_stored_plan_exec(const store_stored_plan *p);
void store_stored_plan_free(store_stored_plan *p);

/* The sha256 of c's safetensors files a convert in the store left pending
 * (store_files_load): assembled from their recipes in memory, hashed (two
 * threads), then recorded together; only those of rank `rank` (-1: all, as
 * materialize_opts.rank) and only `path` when not NULL. Nothing to do costs
 * one catalog query. Pulls record what they write themselves; the HTTP
 * reader, the Hub API, the HF-cache export, archives and the daemon's
 * convert job call this. */
int store_hash_pending(ckpt_store *s, const store_ckpt *c, int rank, const char *path, bool quiet);

/* store_files_load with the pending sha256 of the files a rank pull of
 * `rank` would give (-1: all) filled in first. */
int store_files_load_hashed(ckpt_store *s, const store_ckpt *c, int rank, store_file_row **rows, size_t *n);

typedef struct store_file_reader store_file_reader;
int store_file_open(store_file_reader **out, ckpt_store *s, const store_ckpt *c, const char *path);
/* The same without computing a pending sha256 first: store_file_sha256 is
 * then "" for a file whose sha256 is pending (a reader that hashes what it
 * reads records it: store_archive.h's pull). */
int store_file_open_unhashed(store_file_reader **out, ckpt_store *s, const store_ckpt *c, const char *path);
uint64_t store_file_size(const store_file_reader *r);
const char *store_file_sha256(const store_file_reader *r);
int store_file_read(store_file_reader *r, uint64_t off, void *buf, size_t len);
void store_file_close(store_file_reader *r);

#endif
