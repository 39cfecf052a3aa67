/*
 * store_hfcache.h — a stored checkpoint written into a Hugging Face cache
 * (`ckpt pull REF --hf-cache [DIR]`), laid out as huggingface_hub writes it
 * (file_download.py, _snapshot_download.py, _tree_cache.py) so transformers
 * and huggingface_hub load it offline:
 *
 *   DIR/models--ORG--NAME/
 *     blobs/{etag}                the sha256 of an LFS file, else its git blob id
 *                                 (store_hub.h: the daemon's etags); a hardlink of
 *                                 the store's blob when it is one whole file on the
 *                                 same filesystem, else a copy checked against the
 *                                 catalog's sha256
 *     snapshots/{commit}/{path}   relative symlinks to ../../blobs/{etag} (copies
 *                                 when symlinks are disabled or refused)
 *     refs/{name}                 the commit (no newline)
 *     trees/{commit}.json         the tree listing, so offline snapshot_download
 *                                 sees the snapshot is complete
 *
 * {commit} is the commit the Hub API gives (a layout's pseudo-commit). The
 * names in refs/ are the branches the Hub API lists for it: an original's
 * revision name; a layout's <commit>.<layout>, and <layout> for a layout of
 * main. What is already there and right is left alone, so a second pull
 * adds nothing.
 */
#ifndef CKPT_STORE_STORE_HFCACHE_H
#define CKPT_STORE_STORE_HFCACHE_H

#include "store/store.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool no_symlinks; /* HF_HUB_DISABLE_SYMLINKS: snapshot files are the files, no blobs/ */
} store_hfcache_opts;

typedef struct {
    size_t files;   /* files of the checkpoint */
    size_t written; /* blobs, snapshot entries, refs and trees written (0: all there already) */
    size_t linked;  /* files hardlinked from the store */
    size_t copied;  /* files copied or assembled */
} store_hfcache_stats;

/* The cache huggingface_hub uses: HF_HUB_CACHE, else HF_HOME/hub, else
 * XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. malloc'd. */
char *store_hfcache_default_dir(void);
/* true when HF_HUB_DISABLE_SYMLINKS is 1, ON, YES or TRUE (any case), as huggingface_hub reads it. */
bool store_hfcache_symlinks_disabled(void);
/* Writes c into the cache folder dir (created when missing). */
int store_hfcache_write(ckpt_store *s, const store_ckpt *c, const char *dir, const store_hfcache_opts *o,
                        store_hfcache_stats *st);

#endif
