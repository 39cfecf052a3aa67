/* lazylib_stubs.c — the functions ckpt calls from libcurl, libarchive,
 * libmicrohttpd, OpenBLAS and libpq, each forwarding to the library loaded on first
 * use (lazylib.h says why). The compiler checks every definition here against
 * the library's own header; a function used elsewhere but missing here is a
 * link error, so the list cannot silently fall behind. */
#define CURL_DISABLE_TYPECHECK 1 /* curl.h's type-checking macros would rename the definitions below */
#include "common/lazylib.h"

#include <archive.h>
#include <archive_entry.h>
#include <cblas.h>
#include <curl/curl.h>
#include <libpq-fe.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <string.h>

static lazylib lib_curl = {"libcurl.so.4", "libcurl4", NULL};
static lazylib lib_archive = {"libarchive.so.13", "libarchive13", NULL};
static lazylib lib_mhd = {"libmicrohttpd.so.12", "libmicrohttpd12", NULL};
static lazylib lib_blas = {"libopenblas.so.0", "libopenblas0", NULL};
static lazylib lib_pq = {"libpq.so.5", "libpq5", NULL};

/* FN is a static pointer of type T, resolved once (racing threads store the
 * same address). dlsym's void * becomes a function pointer through memcpy, the
 * way POSIX sanctions. */
#define LAZY_RESOLVE(lib, fn, name)                                                                    \
    do {                                                                                               \
        if (!__atomic_load_n(&fn, __ATOMIC_ACQUIRE)) {                                                 \
            void *p_ = lazylib_sym(&lib, name);                                                        \
            __typeof__(fn) f_;                                                                         \
            memcpy(&f_, &p_, sizeof f_);                                                               \
            __atomic_store_n(&fn, f_, __ATOMIC_RELEASE);                                               \
        }                                                                                              \
    } while (0)

#define LAZY(lib, ret, name, params, args)                                                             \
    ret name params                                                                                    \
    {                                                                                                  \
        static ret(*fn) params;                                                                        \
        LAZY_RESOLVE(lib, fn, #name);                                                                  \
        return fn args;                                                                                \
    }

#define LAZY_VOID(lib, name, params, args)                                                             \
    void name params                                                                                   \
    {                                                                                                  \
        static void(*fn) params;                                                                       \
        LAZY_RESOLVE(lib, fn, #name);                                                                  \
        fn args;                                                                                       \
    }

/* ---- libcurl ---- */
LAZY(lib_curl, CURLcode, curl_global_init, (long flags), (flags))
LAZY(lib_curl, CURL *, curl_easy_init, (void), ())
LAZY_VOID(lib_curl, curl_easy_cleanup, (CURL *h), (h))
LAZY_VOID(lib_curl, curl_easy_reset, (CURL *h), (h))
LAZY(lib_curl, CURLcode, curl_easy_perform, (CURL *h), (h))
LAZY(lib_curl, const char *, curl_easy_strerror, (CURLcode c), (c))
LAZY_VOID(lib_curl, curl_free, (void *p), (p))
LAZY(lib_curl, CURLM *, curl_multi_init, (void), ())
LAZY(lib_curl, CURLMcode, curl_multi_cleanup, (CURLM *m), (m))
LAZY(lib_curl, CURLMcode, curl_multi_add_handle, (CURLM *m, CURL *h), (m, h))
LAZY(lib_curl, CURLMcode, curl_multi_remove_handle, (CURLM *m, CURL *h), (m, h))
LAZY(lib_curl, CURLMsg *, curl_multi_info_read, (CURLM *m, int *left), (m, left))
LAZY(lib_curl, CURLMcode, curl_multi_perform, (CURLM *m, int *running), (m, running))
LAZY(lib_curl, CURLMcode, curl_multi_poll,
     (CURLM *m, struct curl_waitfd extra[], unsigned int n, int timeout_ms, int *numfds),
     (m, extra, n, timeout_ms, numfds))
LAZY(lib_curl, CURLMcode, curl_multi_wakeup, (CURLM *m), (m))
LAZY(lib_curl, struct curl_slist *, curl_slist_append, (struct curl_slist *l, const char *s), (l, s))
LAZY_VOID(lib_curl, curl_slist_free_all, (struct curl_slist *l), (l))
LAZY(lib_curl, CURLU *, curl_url, (void), ())
LAZY_VOID(lib_curl, curl_url_cleanup, (CURLU *u), (u))
LAZY(lib_curl, CURLUcode, curl_url_get, (CURLU *u, CURLUPart what, char **part, unsigned int flags),
     (u, what, part, flags))
LAZY(lib_curl, CURLUcode, curl_url_set, (CURLU *u, CURLUPart what, const char *part, unsigned int flags),
     (u, what, part, flags))

/* The option number says the argument's type (curl.h, CURLOPTTYPE_*), the
 * way libcurl itself reads it; CURLMoption numbers follow the same scheme. */
#define CURL_FORWARD_OPTION(call, opt, ap)                                                             \
    ((opt) < CURLOPTTYPE_OBJECTPOINT     ? call(va_arg(ap, long))                                      \
     : (opt) < CURLOPTTYPE_FUNCTIONPOINT ? call(va_arg(ap, void *))                                    \
     : (opt) < CURLOPTTYPE_OFF_T         ? call(va_arg(ap, void (*)(void)))                            \
     : (opt) < CURLOPTTYPE_BLOB          ? call(va_arg(ap, curl_off_t))                                \
                                         : call(va_arg(ap, void *)))

CURLcode curl_easy_setopt(CURL *h, CURLoption opt, ...)
{
    static CURLcode (*fn)(CURL *, CURLoption, ...);
    LAZY_RESOLVE(lib_curl, fn, "curl_easy_setopt");
    va_list ap;
    va_start(ap, opt);
#define CALL(v) fn(h, opt, v)
    CURLcode rc = CURL_FORWARD_OPTION(CALL, opt, ap);
#undef CALL
    va_end(ap);
    return rc;
}

CURLMcode curl_multi_setopt(CURLM *m, CURLMoption opt, ...)
{
    static CURLMcode (*fn)(CURLM *, CURLMoption, ...);
    LAZY_RESOLVE(lib_curl, fn, "curl_multi_setopt");
    va_list ap;
    va_start(ap, opt);
#define CALL(v) fn(m, opt, v)
    CURLMcode rc = CURL_FORWARD_OPTION(CALL, opt, ap);
#undef CALL
    va_end(ap);
    return rc;
}

/* Every CURLINFO takes one pointer to where the answer goes. */
CURLcode curl_easy_getinfo(CURL *h, CURLINFO info, ...)
{
    static CURLcode (*fn)(CURL *, CURLINFO, ...);
    LAZY_RESOLVE(lib_curl, fn, "curl_easy_getinfo");
    va_list ap;
    va_start(ap, info);
    void *out = va_arg(ap, void *);
    va_end(ap);
    return fn(h, info, out);
}

/* ---- libarchive ---- */
LAZY(lib_archive, struct archive *, archive_read_new, (void), ())
LAZY(lib_archive, int, archive_read_free, (struct archive *a), (a))
LAZY(lib_archive, int, archive_read_support_filter_all, (struct archive *a), (a))
LAZY(lib_archive, int, archive_read_support_format_tar, (struct archive *a), (a))
LAZY(lib_archive, int, archive_read_open_filename, (struct archive *a, const char *path, size_t block),
     (a, path, block))
LAZY(lib_archive, int, archive_read_next_header, (struct archive *a, struct archive_entry **e), (a, e))
LAZY(lib_archive, la_ssize_t, archive_read_data, (struct archive *a, void *buf, size_t n), (a, buf, n))
LAZY(lib_archive, const char *, archive_error_string, (struct archive *a), (a))
LAZY(lib_archive, int, archive_filter_count, (struct archive *a), (a))
LAZY(lib_archive, la_int64_t, archive_entry_size, (struct archive_entry *e), (e))
LAZY(lib_archive, int, archive_entry_size_is_set, (struct archive_entry *e), (e))
LAZY(lib_archive, struct archive *, archive_write_new, (void), ())
LAZY(lib_archive, int, archive_write_free, (struct archive *a), (a))
LAZY(lib_archive, int, archive_write_close, (struct archive *a), (a))
LAZY(lib_archive, int, archive_write_open2,
     (struct archive *a, void *cd, archive_open_callback *o, archive_write_callback *w, archive_close_callback *c,
      archive_free_callback *f),
     (a, cd, o, w, c, f))
LAZY(lib_archive, int, archive_write_add_filter_zstd, (struct archive *a), (a))
LAZY(lib_archive, int, archive_write_set_filter_option, (struct archive *a, const char *m, const char *o, const char *v), (a, m, o, v))
LAZY(lib_archive, int, archive_write_set_format_pax_restricted, (struct archive *a), (a))
LAZY(lib_archive, int, archive_write_set_bytes_in_last_block, (struct archive *a, int n), (a, n))
LAZY(lib_archive, int, archive_write_open_fd, (struct archive *a, int fd), (a, fd))
LAZY(lib_archive, int, archive_write_open_filename, (struct archive *a, const char *path), (a, path))
LAZY(lib_archive, int, archive_write_header, (struct archive *a, struct archive_entry *e), (a, e))
LAZY(lib_archive, la_ssize_t, archive_write_data, (struct archive *a, const void *buf, size_t n), (a, buf, n))
LAZY(lib_archive, struct archive_entry *, archive_entry_new, (void), ())
LAZY_VOID(lib_archive, archive_entry_free, (struct archive_entry *e), (e))
LAZY(lib_archive, const char *, archive_entry_pathname, (struct archive_entry *e), (e))
LAZY(lib_archive, __LA_MODE_T, archive_entry_filetype, (struct archive_entry *e), (e))
LAZY_VOID(lib_archive, archive_entry_set_filetype, (struct archive_entry *e, unsigned int t), (e, t))
LAZY_VOID(lib_archive, archive_entry_set_pathname, (struct archive_entry *e, const char *p), (e, p))
LAZY_VOID(lib_archive, archive_entry_set_perm, (struct archive_entry *e, __LA_MODE_T m), (e, m))
LAZY_VOID(lib_archive, archive_entry_set_size, (struct archive_entry *e, la_int64_t n), (e, n))
LAZY_VOID(lib_archive, archive_entry_set_mtime, (struct archive_entry *e, time_t s, long ns), (e, s, ns))

/* ---- libmicrohttpd ---- */
LAZY(lib_mhd, struct MHD_Response *, MHD_create_response_from_buffer,
     (size_t n, void *buf, enum MHD_ResponseMemoryMode mode), (n, buf, mode))
LAZY(lib_mhd, struct MHD_Response *, MHD_create_response_from_callback,
     (uint64_t size, size_t block, MHD_ContentReaderCallback crc, void *cls, MHD_ContentReaderFreeCallback crfc),
     (size, block, crc, cls, crfc))
LAZY(lib_mhd, struct MHD_Response *, MHD_create_response_from_pipe, (int fd), (fd))
LAZY(lib_mhd, enum MHD_Result, MHD_add_response_header, (struct MHD_Response *r, const char *h, const char *v),
     (r, h, v))
LAZY_VOID(lib_mhd, MHD_destroy_response, (struct MHD_Response *r), (r))
LAZY(lib_mhd, enum MHD_Result, MHD_queue_response,
     (struct MHD_Connection *c, unsigned int status, struct MHD_Response *r), (c, status, r))
LAZY(lib_mhd, const char *, MHD_lookup_connection_value,
     (struct MHD_Connection *c, enum MHD_ValueKind kind, const char *key), (c, kind, key))
LAZY(lib_mhd, int, MHD_get_connection_values,
     (struct MHD_Connection *c, enum MHD_ValueKind kind, MHD_KeyValueIterator it, void *cls), (c, kind, it, cls))
LAZY_VOID(lib_mhd, MHD_stop_daemon, (struct MHD_Daemon *d), (d))

/* The options list goes on as a va_list to the library's own _va entry. */
struct MHD_Daemon *MHD_start_daemon(unsigned int flags, uint16_t port, MHD_AcceptPolicyCallback apc, void *apc_cls,
                                    MHD_AccessHandlerCallback dh, void *dh_cls, ...)
{
    static struct MHD_Daemon *(*fn)(unsigned int, uint16_t, MHD_AcceptPolicyCallback, void *,
                                    MHD_AccessHandlerCallback, void *, va_list);
    LAZY_RESOLVE(lib_mhd, fn, "MHD_start_daemon_va");
    va_list ap;
    va_start(ap, dh_cls);
    struct MHD_Daemon *d = fn(flags, port, apc, apc_cls, dh, dh_cls, ap);
    va_end(ap);
    return d;
}

/* No MHD_DaemonInfoType this libmicrohttpd knows reads the variadic part. */
const union MHD_DaemonInfo *MHD_get_daemon_info(struct MHD_Daemon *d, enum MHD_DaemonInfoType type, ...)
{
    static const union MHD_DaemonInfo *(*fn)(struct MHD_Daemon *, enum MHD_DaemonInfoType, ...);
    LAZY_RESOLVE(lib_mhd, fn, "MHD_get_daemon_info");
    return fn(d, type);
}

/* ---- OpenBLAS ---- */
LAZY_VOID(lib_blas, cblas_sgemm,
          (CBLAS_LAYOUT layout, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
           const blasint k, const float alpha, const float *a, const blasint lda, const float *b,
           const blasint ldb, const float beta, float *c, const blasint ldc),
          (layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
LAZY_VOID(lib_blas, openblas_set_num_threads, (int n), (n))

/* libpq: only a catalog on PostgreSQL (--db postgresql://...) loads it. */
LAZY(lib_pq, PGconn *, PQconnectdb, (const char *conninfo), (conninfo))
LAZY(lib_pq, ConnStatusType, PQstatus, (const PGconn *c), (c))
LAZY(lib_pq, char *, PQerrorMessage, (const PGconn *c), (c))
LAZY_VOID(lib_pq, PQfinish, (PGconn *c), (c))
LAZY_VOID(lib_pq, PQreset, (PGconn *c), (c))
LAZY(lib_pq, PQnoticeProcessor, PQsetNoticeProcessor, (PGconn *c, PQnoticeProcessor p, void *arg), (c, p, arg))
LAZY(lib_pq, PGresult *, PQexec, (PGconn *c, const char *q), (c, q))
LAZY(lib_pq, PGresult *, PQexecParams,
     (PGconn *c, const char *q, int n, const Oid *types, const char *const *vals, const int *lens, const int *fmts,
      int rfmt),
     (c, q, n, types, vals, lens, fmts, rfmt))
LAZY(lib_pq, ExecStatusType, PQresultStatus, (const PGresult *r), (r))
LAZY(lib_pq, char *, PQresultErrorField, (const PGresult *r, int field), (r, field))
LAZY_VOID(lib_pq, PQclear, (PGresult *r), (r))
LAZY(lib_pq, int, PQntuples, (const PGresult *r), (r))
LAZY(lib_pq, char *, PQgetvalue, (const PGresult *r, int row, int col), (r, row, col))
LAZY(lib_pq, int, PQgetisnull, (const PGresult *r, int row, int col), (r, row, col))
LAZY(lib_pq, char *, PQcmdTuples, (PGresult *r), (r))
LAZY(lib_pq, int, PQsocket, (const PGconn *c), (c))
LAZY(lib_pq, int, PQconsumeInput, (PGconn *c), (c))
LAZY(lib_pq, PGnotify *, PQnotifies, (PGconn *c), (c))
LAZY_VOID(lib_pq, PQfreemem, (void *p), (p))
LAZY(lib_pq, unsigned char *, PQunescapeBytea, (const unsigned char *from, size_t *len), (from, len))
LAZY(lib_pq, int, PQsendQueryParams,
     (PGconn *c, const char *q, int n, const Oid *types, const char *const *vals, const int *lens, const int *fmts,
      int rfmt),
     (c, q, n, types, vals, lens, fmts, rfmt))
LAZY(lib_pq, PGresult *, PQgetResult, (PGconn *c), (c))
LAZY(lib_pq, int, PQenterPipelineMode, (PGconn *c), (c))
LAZY(lib_pq, int, PQexitPipelineMode, (PGconn *c), (c))
LAZY(lib_pq, int, PQpipelineSync, (PGconn *c), (c))
