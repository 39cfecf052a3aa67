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

#include "include/ckpt.h"

#include <stdarg.h>

/* ckpt_code (CKPT_OK, CKPT_EINVAL, ...), ckpt_error_last, ckpt_error_clear and
 * ckpt_code_name are the public ones of include/ckpt.h: defined once, there. */

/* Sets the thread's error message and returns code (always negative). */
int ckpt_error_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like ckpt_error_set with ": strerror(errno)" appended; code CKPT_EIO unless ENOMEM/ENOSPC noted.
 */
int ckpt_error_sys(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prepends "<context>: " to the current message; returns code unchanged. */
int ckpt_error_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
