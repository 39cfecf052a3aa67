/*
 * cmd_s3.c — `ckpt s3`: the store's S3 client (store/s3.h) from the command
 * line, for tests, benchmarks and checking a bucket's configuration. Not a
 * general S3 tool: every object it writes is written once (If-None-Match).
 */
#include "service/cli/cli.h"

#include "common/error.h"
#include "common/util.h"
#include "store/s3.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void help(void)
{
    printf("usage: ckpt s3 mb s3://BUCKET\n"
           "       ckpt s3 put s3://BUCKET/KEY FILE\n"
           "       ckpt s3 get s3://BUCKET/KEY -o FILE [--range OFF:LEN]\n"
           "       ckpt s3 head s3://BUCKET/KEY\n"
           "       ckpt s3 ls s3://BUCKET[/PREFIX] [--max-keys N]\n"
           "       ckpt s3 rm s3://BUCKET/KEY\n"
           "\n"
           "The S3 client the store uses for blobs in a bucket, on its own: endpoint,\n"
           "region and credentials from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and\n"
           "AWS_SECRET_ACCESS_KEY (path-style addressing, SigV4). put writes FILE once\n"
           "(If-None-Match: *; in parts above CKPT_S3_MULTIPART_MB, default 64) and prints\n"
           "\"stored\" or \"existed\"; get writes the object (or --range OFF:LEN of it) to\n"
           "FILE; head prints the size (exit 1 when the key does not exist); ls prints\n"
           "\"KEY SIZE MTIME\" per key, following continuation tokens (--max-keys per\n"
           "request); rm deletes. Failed requests are retried (CKPT_S3_RETRIES,\n"
           "CKPT_S3_BACKOFF_MS). With --stats, the requests, retries and bytes received\n"
           "go to stderr.\n");
}

/* Splits s3://BUCKET/KEY and opens a client. */
static int open_url(const char *url, s3_client **c, char **key)
{
    char *bucket = NULL;
    *c = NULL;
    int rc = s3_url_parse(url, &bucket, key);
    if (!rc) rc = s3_open(bucket, c);
    free(bucket);
    if (rc < 0) {
        free(*key);
        *key = NULL;
    }
    return rc;
}

typedef struct {
    uint64_t n;
} ls_state;

static int print_key(void *ud, const char *key, uint64_t size, int64_t mtime)
{
    ((ls_state *)ud)->n++;
    printf("%s %" PRIu64 " %" PRId64 "\n", key, size, mtime);
    return 0;
}

int cmd_s3(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    if (argc < 3) return cli_usage_error("s3", "needs an operation and an s3:// URL");
    const char *op = argv[1], *url = argv[2], *out = NULL, *range = NULL;
    const char *pos[2] = {0};
    int npos = 0;
    uint64_t max_keys = 0;
    bool stats = false;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--range") && i + 1 < argc) range = argv[++i];
        else if (!strcmp(argv[i], "--max-keys") && i + 1 < argc) {
            if (ckpt_parse_u64_field("--max-keys", argv[++i], 1, 1000, &max_keys) < 0)
                return cli_usage_error("s3", "%s", ckpt_error_last());
        } else if (!strcmp(argv[i], "--stats")) stats = true;
        else if (argv[i][0] != '-' && npos < 2) pos[npos++] = argv[i];
        else return cli_usage_error("s3", "unexpected argument '%s'", argv[i]);
    }
    s3_client *c = NULL;
    char *key = NULL;
    int rc = 0, res = CLI_OK;
    if (!strcmp(op, "mb")) {
        if ((rc = open_url(url, &c, &key)) == 0) rc = s3_make_bucket(c);
    } else if (!strcmp(op, "put")) {
        if (npos != 1) return cli_usage_error("s3", "put needs s3://BUCKET/KEY FILE");
        int fd = open(pos[0], O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
            rc = ckpt_error_sys("%s", pos[0]);
        } else if ((rc = open_url(url, &c, &key)) == 0) {
            bool existed = false;
            if (!*key) rc = ckpt_error_set(CKPT_EINVAL, "%s: no key", url);
            else rc = s3_put_fd(c, key, fd, 0, (uint64_t)st.st_size, NULL, &existed);
            if (!rc) printf("%s\n", existed ? "existed" : "stored");
        }
        if (fd >= 0) close(fd);
    } else if (!strcmp(op, "get")) {
        if (!out) return cli_usage_error("s3", "get needs -o FILE");
        uint64_t off = 0, len = 0;
        bool whole = !range;
        if (range) {
            const char *colon = strchr(range, ':');
            char *a = colon ? ckpt_strndup(range, (size_t)(colon - range)) : NULL;
            bool ok = a && ckpt_parse_u64(a, &off) == 0 && ckpt_parse_u64(colon + 1, &len) == 0;
            free(a);
            if (!ok) return cli_usage_error("s3", "--range must be OFF:LEN");
        }
        if ((rc = open_url(url, &c, &key)) == 0 && whole) {
            bool exists = false;
            rc = s3_head(c, key, &exists, &len);
            if (!rc && !exists) rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: no such object", url);
        }
        if (!rc) {
            int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd < 0) rc = ckpt_error_sys("%s", out);
            else {
                rc = s3_get_fd(c, key, off, len, fd, 0);
                if (close(fd) < 0 && !rc) rc = ckpt_error_sys("%s", out);
            }
        }
    } else if (!strcmp(op, "head")) {
        if ((rc = open_url(url, &c, &key)) == 0) {
            bool exists = false;
            uint64_t size = 0;
            rc = s3_head(c, key, &exists, &size);
            if (!rc && exists) printf("%" PRIu64 "\n", size);
            if (!rc && !exists) rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: no such object", url);
        }
    } else if (!strcmp(op, "ls")) {
        if ((rc = open_url(url, &c, &key)) == 0) {
            ls_state st = {0};
            rc = s3_list(c, key, (unsigned)max_keys, print_key, &st);
        }
    } else if (!strcmp(op, "rm")) {
        if ((rc = open_url(url, &c, &key)) == 0) rc = s3_delete(c, key);
    } else {
        return cli_usage_error("s3", "unknown operation '%s' (mb, put, get, head, ls, rm)", op);
    }
    if (rc < 0) res = cli_fail();
    if (c && stats) {
        uint64_t req, retries, in;
        s3_stats(c, &req, &retries, &in);
        fprintf(stderr, "s3: %" PRIu64 " requests, %" PRIu64 " retries, %" PRIu64 " bytes in\n", req, retries, in);
    }
    s3_close(c);
    free(key);
    return res;
}
