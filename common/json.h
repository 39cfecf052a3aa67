/*
 * json.h — jansson with the error convention: loading with a size limit and
 * typed field access whose errors name the file and the field.
 *
 *   json_t *cfg; if (cj_load_file(&cfg, "config.json", 16 << 20) < 0) return rc;
 *   int64_t heads; if (cj_int(cfg, "num_attention_heads", &heads, "config.json") < 0) ...
 */
#ifndef CKPT_COMMON_JSON_H
#define CKPT_COMMON_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

int cj_load_file(json_t **out, const char *path, size_t max_bytes);
int cj_load_buf(json_t **out, const char *buf, size_t len, const char *what);
/* Required fields: CKPT_ENOTFOUND when missing, CKPT_EINVAL when mistyped. */
int cj_int(const json_t *obj, const char *key, int64_t *out, const char *what);
int cj_str(const json_t *obj, const char *key, const char **out, const char *what);
/* Optional fields: leave *out unchanged when missing; error when mistyped. */
int cj_int_opt(const json_t *obj, const char *key, int64_t *out, const char *what);
int cj_bool_opt(const json_t *obj, const char *key, bool *out, const char *what);
int cj_str_opt(const json_t *obj, const char *key, const char **out, const char *what);
int cj_num_opt(const json_t *obj, const char *key, double *out, const char *what);
/* JSON text as files hold it: indent 2, keys in insertion order, trailing newline. malloc'd. */
char *cj_render(const json_t *v);
/* Writes cj_render(v) atomically to path. */
int cj_write_file(const char *path, const json_t *v);
/* json_dumps with a reported error; caller frees. */
char *cj_dumps(const json_t *v, size_t flags);

#endif
