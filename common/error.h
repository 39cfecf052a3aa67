/*
 * error.h — the one error convention of ckpt.
 *
 * Every call that can fail returns 0 on success or a negative ckpt_code. The
 * sentence describing the failure is kept per thread and read with
 * ckpt_error_last(); it names the file, tensor or field concerned, e.g.
 *   "model-00002-of-00004.safetensors: InvalidOffset: tensor 'x' begins at 1024, expected 512"
 *
 *   if (st_open(&f, path) < 0) { fprintf(stderr, "ckpt: %s\n", ckpt_error_last()); return 1; }
 *
 * Callers that add context wrap the message with ckpt_error_prefix(), so the
 * innermost detail survives and the outermost caller's words come first.
 */
#ifndef CKPT_COMMON_ERROR_H
#define CKPT_COMMON_ERROR_H

#include <stdarg.h>

typedef enum {
    CKPT_OK = 0,
    CKPT_EINVAL = -1,   /* bad input: a hostile or malformed file, bad rules, bad args */
    CKPT_EIO = -2,      /* the OS refused: open, read, write, fsync, rename */
    CKPT_ENOMEM = -3,   /* allocation failed */
    CKPT_ENOTFOUND = -4, /* a named thing does not exist */
    CKPT_ELIMIT = -5,   /* a size, count or length exceeds a limit */
    CKPT_EEXIST = -6,   /* the target exists and may not be replaced */
    CKPT_ECORRUPT = -7, /* stored bytes do not match their hash */
    CKPT_EBUSY = -8,    /* transient: retry may succeed */
    CKPT_ECANCELLED = -9,
    CKPT_EINTERNAL = -10, /* a library failed in a way a retry will not fix (a digest context) */
} ckpt_code;

/* Sets the thread's error message and returns code (always negative). */
int ckpt_error_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like ckpt_error_set with ": strerror(errno)" appended; code CKPT_EIO unless ENOMEM/ENOSPC noted. */
int ckpt_error_sys(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prepends "<context>: " to the current message; returns code unchanged. */
int ckpt_error_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last message set on this thread ("" if none). */
const char *ckpt_error_last(void);
void ckpt_error_clear(void);
/* A short name for a code: "invalid input", "I/O error", ... */
const char *ckpt_code_name(int code);

#endif
