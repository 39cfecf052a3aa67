/*
 * store_hub.h — how the Hub protocol names a stored checkpoint and its files
 * (docs/hub.md, "Revisions" and "File answers"): the commit a client sees,
 * which files are LFS files, their git blob ids and etags. One definition for
 * the daemon's Hub read API (service/http/hub_api.c) and the Hugging Face
 * cache `ckpt pull --hf-cache` writes (store_hfcache.h), so a cache written
 * here is the cache a client of the daemon would have written.
 */
#ifndef CKPT_STORE_STORE_HUB_H
#define CKPT_STORE_STORE_HUB_H

#include "store/store.h"

#include <stdbool.h>
#include <stddef.h>

/* A non-LFS file is hashed for its git blob id up to this size; larger files are LFS files. */
#define STORE_HUB_INLINE_OID_MAX (64u << 20)

/* The commit clients see: an original's own; a layout's sha1("<commit>.<layout>"). */
void store_hub_commit(const store_ckpt *c, char out[41]);
/* Safetensors files and files larger than STORE_HUB_INLINE_OID_MAX. */
bool store_hub_is_lfs(const store_file_row *f);
/* The file's git-lfs pointer text into buf; its length. */
size_t store_hub_lfs_pointer(const store_file_row *f, char *buf, size_t len);
/* The git blob id of the file as a Hub repository holds it: of its LFS
 * pointer for an LFS file, else of its content (read from its blob once per
 * process, then cached). A blob that cannot be read is an error. */
int store_hub_file_oid(ckpt_store *s, const store_file_row *f, char out[41]);
/* The Hub's etag of the file (unquoted), the name of its blob in an HF
 * cache: the sha256 of an LFS file, else its git blob id. */
int store_hub_etag(ckpt_store *s, const store_file_row *f, char out[65]);

#endif
