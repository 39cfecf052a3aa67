/*
 * s3.h — a client of S3-compatible object stores (AWS S3, Ceph RGW, MinIO),
 * for the store's blobs in a bucket.
 *
 * Requests go through libcurl (loaded on first use, common/lazylib.h) and are
 * signed with AWS Signature Version 4 by libcurl (CURLOPT_AWS_SIGV4). Debian
 * 12's libcurl 7.88 neither sends x-amz-content-sha256 nor canonicalises the
 * query string, so this client sends the header on every request (the body's
 * sha256, or UNSIGNED-PAYLOAD) and builds every query string already in
 * canonical form: parameters sorted by name, names and values percent-encoded
 * with uppercase hex, a parameter without a value written "name=". Addressing
 * is path-style (ENDPOINT/BUCKET/KEY), which self-hosted stores need.
 *
 * Configuration comes from the environment, as the AWS tools read it:
 *   AWS_ENDPOINT_URL        e.g. http://127.0.0.1:7480 (default https://s3.REGION.amazonaws.com)
 *   AWS_REGION              (or AWS_DEFAULT_REGION; default us-east-1)
 *   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY   required
 *   CKPT_S3_RETRIES         attempts per request (default 6)
 *   CKPT_S3_BACKOFF_MS      first backoff (default 200, doubled per attempt, at most 5 s)
 *   CKPT_S3_MULTIPART_MB    objects larger than this go up in parts (default 64; at least 8)
 *   CKPT_S3_PART_UPLOADS    parts of one object sent at once, each on a connection
 *                           of its own (default 4, 1 to 64)
 * The secret never appears in an error message or a log line; errors name the
 * bucket, the key, the operation, the HTTP status and the store's error code.
 *
 * Every request is retried with backoff on a connection error (refused, reset,
 * cut mid-transfer, timed out) and on HTTP 500, 502, 503 (SlowDown) and 504;
 * a retried upload re-sends its body (a whole part) from the file, a retried
 * download starts its range again. Nothing here holds a whole object in
 * memory: uploads stream from a file descriptor, downloads go to the caller's
 * buffer or file descriptor.
 *
 * A client is one connection (one CURL handle) and is not shared between
 * threads; a multipart upload opens CKPT_S3_PART_UPLOADS - 1 more clients for
 * its parts while it runs.
 */
#ifndef CKPT_STORE_S3_H
#define CKPT_STORE_S3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct s3_client s3_client;

/* The smallest part of a multipart upload, and the most parts of one object. */
#define S3_PART_MIN (8ull << 20)
#define S3_MAX_PARTS 10000u
/* A LIST response larger than this is refused (1000 keys take ~300 KB). */
#define S3_LIST_MAX_BYTES (16u << 20)

/* Splits "s3://BUCKET[/PREFIX]" (the URL's form is checked: a bucket name of
 * 3..63 of [a-z0-9.-]); *bucket and *prefix are allocated (prefix without
 * leading or trailing '/', maybe ""). */
int s3_url_parse(const char *url, char **bucket, char **prefix);

/* A client of BUCKET, configured from the environment (above). */
int s3_open(const char *bucket, s3_client **out);
void s3_close(s3_client *c);
/* "s3://BUCKET" for messages. */
const char *s3_bucket_name(const s3_client *c);

/* Creates the bucket; one that exists and is ours is success. */
int s3_make_bucket(s3_client *c);

/* Writes bytes [off, off+len) of fd as KEY, once: a single PUT with
 * If-None-Match: * up to the multipart threshold (412, the key exists, is
 * success with *existed = true), above it a HEAD and then a multipart upload
 * in parts of at least S3_PART_MIN (at most S3_MAX_PARTS), aborted on
 * failure so no partial object is ever visible. sha256_hex is the bytes'
 * sha256 when the caller knows it (a blob's name), else NULL (then it is
 * computed). existed may be NULL. */
int s3_put_fd(s3_client *c, const char *key, int fd, uint64_t off, uint64_t len, const char *sha256_hex,
              bool *existed);

/* HEAD: *exists, and *size when it exists (size may be NULL). */
int s3_head(s3_client *c, const char *key, bool *exists, uint64_t *size);

/* Ranged GET of bytes [off, off+len) of KEY into buf (exactly len bytes, or
 * an error naming what came instead); CKPT_ENOTFOUND when KEY does not exist. */
int s3_get(s3_client *c, const char *key, uint64_t off, uint64_t len, void *buf);
/* The same into fd at fd_off (pwrite). */
int s3_get_fd(s3_client *c, const char *key, uint64_t off, uint64_t len, int fd, uint64_t fd_off);

/* ListObjectsV2 of every key starting with prefix, max_keys per request (0:
 * the server's default, 1000), following continuation tokens. cb gets each
 * key, its size and its last-modified time (Unix seconds); a non-zero return
 * stops the listing and is returned. */
typedef int (*s3_list_cb)(void *ud, const char *key, uint64_t size, int64_t mtime);
int s3_list(s3_client *c, const char *prefix, unsigned max_keys, s3_list_cb cb, void *ud);

/* DELETE; a key that does not exist is success. */
int s3_delete(s3_client *c, const char *key);

/* The requests a client made (each attempt counted) and the response bytes
 * it received, for tests and benchmarks. */
void s3_stats(const s3_client *c, uint64_t *requests, uint64_t *retries, uint64_t *bytes_in);

#endif
