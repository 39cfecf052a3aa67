/* error.c — thread-local error messages; see error.h for the convention. */
#include "common/error.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define ERROR_MSG_MAX 2048

static _Thread_local char error_msg[ERROR_MSG_MAX];

int ckpt_error_set(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_msg, sizeof error_msg, fmt, ap);
    va_end(ap);
    return code;
}

int ckpt_error_sys(const char *fmt, ...)
{
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(error_msg, sizeof error_msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof error_msg)
        snprintf(error_msg + n, sizeof error_msg - (size_t)n, ": %s", strerror(saved));
    errno = saved;
    return saved == ENOMEM ? CKPT_ENOMEM : CKPT_EIO;
}

int ckpt_error_prefix(int code, const char *fmt, ...)
{
    char prefix[ERROR_MSG_MAX], old[ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_msg, sizeof old);
    /* Built by hand: snprintf("%s: %s") into a buffer of the same size trips -Wformat-truncation. */
    size_t pl = strnlen(prefix, sizeof error_msg - 3), ol = strnlen(old, sizeof old);
    if (pl + 2 + ol >= sizeof error_msg) ol = sizeof error_msg - 3 - pl;
    memcpy(error_msg, prefix, pl);
    memcpy(error_msg + pl, ": ", 2);
    memcpy(error_msg + pl + 2, old, ol);
    error_msg[pl + 2 + ol] = '\0';
    return code;
}

const char *ckpt_error_last(void)
{
    return error_msg;
}

void ckpt_error_clear(void)
{
    error_msg[0] = '\0';
}

const char *ckpt_code_name(int code)
{
    switch (code) {
    case CKPT_OK: return "ok";
    case CKPT_EINVAL: return "invalid input";
    case CKPT_EIO: return "I/O error";
    case CKPT_ENOMEM: return "out of memory";
    case CKPT_ENOTFOUND: return "not found";
    case CKPT_ELIMIT: return "limit exceeded";
    case CKPT_EEXIST: return "already exists";
    case CKPT_ECORRUPT: return "corrupt data";
    case CKPT_EBUSY: return "busy";
    case CKPT_ECANCELLED: return "cancelled";
    case CKPT_EINTERNAL: return "internal error";
    default: return "error";
    }
}
