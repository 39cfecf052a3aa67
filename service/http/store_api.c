/* store_api.c — /v1/checkpoints: the store over HTTP (see store_api.h). */
#include "service/http/store_api.h"

#include "common/error.h"
#include "common/log.h"
#include "common/util.h"
#include "service/http/http_util.h"
#include "store/store_archive.h"
#include "store/store_info.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- archive.tar ---- */

/* The tar (store_archive.h) is written by a thread into a pipe that the
 * response reads: nothing is staged on disk, and a slow client just makes
 * the writer wait. A failure found before the answer starts is an error
 * status; one found after it aborts the connection (no final chunk), so a
 * client sees a truncated transfer, never a clean 200. */
typedef struct {
    store_archive *ar;
    char *home;
    char *ref; /* for the log */
    int64_t id;
    bool zstd;
    int wfd; /* the pipe's write end; closed by the writer when it ends */
    int rfd;
    int rc; /* the writer's outcome, read after joining it */
    pthread_t th;
    bool joined;
} tar_stream;

static void *tar_writer(void *arg)
{
    tar_stream *ts = arg;
    ckpt_store s; /* its own connection: the request's goes back to the pool */
    ts->rc = store_open(&s, ts->home);
    if (!ts->rc) {
        ts->rc = store_archive_write(ts->ar, &s, ts->wfd, ts->zstd);
        store_close(&s);
    }
    /* The tar has no end (store_archive_write writes none after a failure)
     * and the response ends with an error: the connection is cut. */
    if (ts->rc)
        ckpt_warn("archive.tar of %s (checkpoint %lld): aborted mid-stream: %s", ts->ref ? ts->ref : "?",
                  (long long)ts->id, ckpt_error_last());
    close(ts->wfd);
    return NULL;
}

static ssize_t tar_stream_cb(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    tar_stream *ts = cls;
    ssize_t n;
    do n = read(ts->rfd, buf, max);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
        http_answer_bytes((uint64_t)n);
        return n;
    }
    if (!ts->joined) {
        pthread_join(ts->th, NULL);
        ts->joined = true;
    }
    return n == 0 && ts->rc == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void tar_stream_free(void *cls)
{
    tar_stream *ts = cls;
    close(ts->rfd); /* a writer still at work gets EPIPE and stops */
    if (!ts->joined) pthread_join(ts->th, NULL);
    store_archive_free(ts->ar);
    free(ts->home);
    free(ts->ref);
    free(ts);
}

static enum MHD_Result send_archive(ckpt_store *s, struct MHD_Connection *c, const store_ckpt *ck, bool zstd)
{
    const char *rank_text = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "rank");
    uint64_t rank = 0;
    if (rank_text && ckpt_parse_u64_field("rank", rank_text, 0, 1023, &rank) < 0)
        return http_send_error(c, 400, ckpt_error_last(), NULL, NULL);
    tar_stream *ts = ckpt_calloc(1, sizeof *ts);
    int rc = ts ? store_archive_plan(s, ck, rank_text ? (int)rank : -1, &ts->ar) : CKPT_ENOMEM;
    unsigned status = rc == CKPT_EINVAL ? 400 : 500;
    int p[2] = {-1, -1};
    if (!rc && (!(ts->home = ckpt_strdup(s->home)) || !(ts->ref = store_ckpt_ref(ck)))) rc = CKPT_ENOMEM;
    if (!rc && pipe2(p, O_CLOEXEC) < 0) rc = ckpt_error_sys("pipe");
    if (!rc) {
        ts->id = ck->id;
        ts->zstd = zstd;
        ts->wfd = p[1];
        ts->rfd = p[0];
        if (pthread_create(&ts->th, NULL, tar_writer, ts)) {
            close(p[0]);
            close(p[1]);
            rc = ckpt_error_set(CKPT_EIO, "cannot start an archive writer");
        }
    }
    if (rc) {
        enum MHD_Result ret = http_send_error(c, status, ckpt_error_last(), NULL, NULL);
        if (ts) {
            store_archive_free(ts->ar);
            free(ts->home);
            free(ts->ref);
            free(ts);
        }
        return ret;
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, tar_stream_cb, ts, tar_stream_free);
    if (!resp) {
        tar_stream_free(ts);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", zstd ? "application/zstd" : "application/x-tar");
    enum MHD_Result ret = http_queue(c, 200, resp, 0);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result v1_checkpoints(ckpt_store *s, struct MHD_Connection *c, const http_segments *sg, bool is_delete)
{
    json_t *j;
    if (sg->n == 2) {
        const char *repo = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "repo");
        int rc = store_list_json(s, repo, &j);
        return rc ? http_send_store_error(c, rc, "list checkpoints") : http_send_json(c, 200, j);
    }
    store_ckpt ck;
    int rc = store_resolve(s, sg->seg[2], &ck);
    if (rc) return http_send_store_error(c, rc, "resolve the ref");
    enum MHD_Result ret;
    if (is_delete) {
        rc = store_rm(s, &ck);
        char *ref = rc ? NULL : store_ckpt_ref(&ck);
        ret = rc ? http_send_store_error(c, rc, "remove the checkpoint")
                 : http_send_json(c, 200, json_pack("{s:s}", "removed", ref ? ref : ""));
        free(ref);
    } else if (sg->n == 3) {
        rc = store_ckpt_json(s, &ck, true, &j);
        ret = rc ? http_send_store_error(c, rc, "describe the checkpoint") : http_send_json(c, 200, j);
    } else if (sg->n >= 5 && !strcmp(sg->seg[3], "files")) {
        char *path = http_join_from(sg, 4);
        ret = path && http_path_safe(path) ? http_send_stored_file(s, c, &ck, path, NULL)
                                           : http_send_error(c, 400, "bad file path", NULL, NULL);
        free(path);
    } else if (sg->n == 4 && (!strcmp(sg->seg[3], "archive.tar") || !strcmp(sg->seg[3], "archive.tar.zst"))) {
        ret = send_archive(s, c, &ck, !strcmp(sg->seg[3], "archive.tar.zst"));
    } else {
        ret = http_send_error(c, 404, "no such endpoint", NULL, NULL);
    }
    store_ckpt_free(&ck);
    return ret;
}

enum MHD_Result store_api_route(ckpt_store *s, struct MHD_Connection *c, const char *url, const char *method,
                                bool *handled)
{
    *handled = false;
    if (strncmp(url, "/v1/checkpoints", 15) || (url[15] && url[15] != '/' && url[15] != '?')) return MHD_NO;
    *handled = true;
    http_segments sg;
    if (!http_split_path(url, &sg)) {
        free(sg.buf);
        return http_send_error(c, 400, "bad path encoding", NULL, NULL);
    }
    enum MHD_Result ret;
    bool is_delete = !strcmp(method, "DELETE") && sg.n == 3;
    if (strcmp(method, "GET") && strcmp(method, "HEAD") && !is_delete)
        ret = http_send_error(c, 405, "method not allowed here", NULL, NULL);
    else ret = v1_checkpoints(s, c, &sg, is_delete);
    free(sg.buf);
    return ret;
}
