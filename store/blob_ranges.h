/*
 * blob_ranges.h — reading the byte ranges of blobs in a bucket that a plan
 * needs, and nothing else (store_blobs.c).
 *
 * With blobs in a bucket, a plan built from the catalog (pull, one rank of a
 * layout, a file served over HTTP, a store convert's hashing) names each
 * blob "s3://BUCKET/KEY" (store_blob_source_path) instead of a file, and its
 * exec_plan gets an exec_vsource whose views are ranged GETs straight into
 * the reading thread's buffer: no blob is downloaded whole, kept in memory
 * whole, or cached on disk. Each reading thread has its own S3 client (one
 * connection). A contiguous part of a tensor is one GET per band (at most
 * EXEC_BAND_BYTES); a strided one (a row-parallel slice) is one GET per row
 * when the gap between rows is at least CKPT_S3_RANGE_GAP bytes (default
 * 256 KiB), else one GET of the span (cheaper than many small requests).
 *
 * The requests, retries and bytes received are added to the store's totals,
 * which `CKPT_DEBUG=1` prints when the store closes.
 */
#ifndef CKPT_STORE_BLOB_RANGES_H
#define CKPT_STORE_BLOB_RANGES_H

#include "plan/executor.h"
#include "store/store.h"

typedef struct {
    exec_vsource v;
    ckpt_store *s;
    const exec_plan *p;
    size_t skip;  /* strlen("s3://BUCKET/"): src_paths[i] + skip is the key */
    uint64_t gap; /* CKPT_S3_RANGE_GAP */
} store_blob_ranges;

/* Points p->vsource at r when the store's blobs are in a bucket (nothing
 * for the local blobs/ folder). r must outlive the reads of p. */
int store_blob_ranges_attach(ckpt_store *s, exec_plan *p, store_blob_ranges *r);

/* A reader's state (an S3 client) outside the executor: for exec_slab_cache.vts
 * and store_blob_ranges_read. NULL on failure, with the error set. */
void *store_blob_ranges_open(store_blob_ranges *r);
void store_blob_ranges_close(store_blob_ranges *r, void *ts);
/* Bytes [off, off+len) of blob sha (any length) into buf, with ts. */
int store_blob_ranges_read(void *ts, const char *sha, uint64_t off, size_t len, void *buf);

#endif
