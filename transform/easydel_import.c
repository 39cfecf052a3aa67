/* easydel_import.c — EasyDeL TensorStore checkpoint to Hugging Face (easydel_import.h). */
#include "transform/easydel_import.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/easydel.h"
#include "format/safetensors.h"
#include "transform/state_convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *easydel_inverse_rules(void)
{
    /* The easydel preset (presets.c) in reverse order, each op inverted. */
    return json_pack(
        "{s:s, s:i, s:s, s:i, s:[{s:s, s:s, s:s, s:b}, {s:s, s:s, s:s}, {s:s, s:s, s:s}, {s:s, s:s, s:s}]}", "format",
        "ckpt-rules", "version", 1, "layout", "hf", "tp", 1, "rules",
        /* stacked experts [E, in, out] -> E tensors [out, in] */
        "op", "unstack_experts", "pattern", "^(.*)\\.experts\\.([A-Za-z0-9_]+)\\.kernel$", "output",
        "$1.experts.{e}.$2.weight", "transpose_last2", 1,
        /* embeddings and norms were renamed */
        "op", "rename", "pattern", "^(.*embed_tokens)\\.embedding$", "replacement", "$1.weight",
        "op", "rename", "pattern", "^(.*norm)\\.scale$", "replacement", "$1.weight",
        /* every other kernel [in, out] was transposed from [out, in] */
        "op", "transpose", "pattern", "^(.*)\\.kernel$", "replacement", "$1.weight");
}

typedef struct {
    const easydel_ckpt *c;
    const size_t *which; /* st_out_tensor.user -> index in c->arrays */
} stage_ctx;

typedef struct {
    int fd;
    uint64_t base, nbytes;
    const char *path;
} sink_ctx;

static int to_file(void *vctx, uint64_t off, const void *buf, size_t len)
{
    sink_ctx *s = vctx;
    if (off > s->nbytes || len > s->nbytes - off)
        return ckpt_error_set(CKPT_EINVAL, "%s: array bytes out of range", s->path);
    return ckpt_pwrite_full(s->fd, buf, len, s->base + off, s->path);
}

static int fill(void *vctx, const st_out_tensor *t, int fd, const char *path)
{
    stage_ctx *sc = vctx;
    const easydel_array *a = &sc->c->arrays[t->user];
    sink_ctx s = {.fd = fd, .base = t->offset, .nbytes = t->nbytes, .path = path};
    return zarr_read(&a->z, to_file, &s, NULL);
}

/* Writes the model/ arrays into staging/model.safetensors under their keys. */
static int stage_model(const easydel_ckpt *c, const char *staging)
{
    st_layout l;
    st_layout_init(&l);
    int rc = 0;
    size_t n = 0;
    for (size_t i = 0; !rc && i < c->narrays; i++) {
        const easydel_array *a = &c->arrays[i];
        if (strcmp(a->prefix, "model") && *a->prefix) continue;
        rc = st_layout_add(&l, a->key, a->z.dtype, a->z.ndim, a->z.shape, i);
        if (rc) rc = ckpt_error_prefix(rc, "%s: array '%s'", c->dir, a->path);
        n++;
    }
    if (!rc && !n) rc = ckpt_error_set(CKPT_EINVAL, "%s: %s lists no arrays under model/", c->dir, EASYDEL_INDEX_FILE);
    if (!rc) rc = st_layout_set_meta(&l, "format", "pt");
    if (!rc) rc = st_layout_finish(&l);
    char *path = rc ? NULL : ckpt_path_join(staging, "model.safetensors");
    if (!rc && !path) rc = CKPT_ENOMEM;
    stage_ctx sc = {.c = c};
    if (!rc) rc = st_write_file(path, &l, fill, &sc);
    free(path);
    st_layout_free(&l);
    return rc;
}

/* Copies a small array (a scalar) into buf. */
static int to_buf(void *vctx, uint64_t off, const void *buf, size_t len)
{
    uint8_t *dst = vctx;
    if (off > 8 || len > 8 - off) return ckpt_error_set(CKPT_EINVAL, "scalar array bytes out of range");
    memcpy(dst + off, buf, len);
    return 0;
}

static int scalar_value(const easydel_array *a, double *out)
{
    uint8_t b[8] = {0};
    int rc = a->z.ndim == 0 ? zarr_read(&a->z, to_buf, b, NULL) : CKPT_EINVAL;
    if (rc) return rc;
    return ckpt_scalar_value(a->z.dtype, b, out) < 0 ? CKPT_EINVAL : 0;
}

static bool is_model_key(void *c, const char *name) { return easydel_find(c, "model", name) != NULL; }

/* The model parameter a tx/ leaf belongs to (the longest suffix of its key
 * that is a model/ key: "0.mu.model.layers.0.mlp.up_proj.kernel" ->
 * "model.layers.0.mlp.up_proj.kernel") and its slot ("mu"); NULL when none. */
static const easydel_array *tx_param(const easydel_ckpt *c, const char *key, char *slot, size_t slot_len)
{
    size_t at = easydel_param_suffix(key, is_model_key, (void *)c);
    if (at == (size_t)-1 || !easydel_slot_before(key, at, slot, slot_len)) return NULL;
    return easydel_find(c, "model", key + at);
}

/* --state: the tx/ arrays that are per-parameter slots (mu, nu, ...: shaped
 * like a model/ array whose key ends theirs) into staging/optimizer.safetensors
 * as "<param key>/<slot>", their scalars (count) into optimizer.json, the
 * save's step into metadata.json: staging becomes a ckpt training state in
 * EasyDeL's names, which the inverse conversion carries slots and all. */
static int stage_optimizer(const easydel_ckpt *c, const char *staging, bool quiet)
{
    st_layout l;
    st_layout_init(&l);
    json_t *scalars = json_object(), *slotset = json_object(), *left_out = json_array();
    size_t n = 0;
    int rc = scalars && slotset && left_out ? 0 : CKPT_ENOMEM;
    for (size_t i = 0; !rc && i < c->narrays; i++) {
        const easydel_array *a = &c->arrays[i];
        if (strcmp(a->prefix, "tx")) continue;
        double v;
        if (a->z.ndim == 0 && scalar_value(a, &v) == 0) {
            const char *last = strrchr(a->key, '.');
            json_object_set_new(scalars, last ? last + 1 : a->key, json_real(v));
            continue;
        }
        char slot[256];
        const easydel_array *m = tx_param(c, a->key, slot, sizeof slot);
        bool fits = m && m->z.ndim == a->z.ndim && !memcmp(m->z.shape, a->z.shape, (size_t)a->z.ndim * sizeof *a->z.shape);
        const char *why = m ? "not a slot of its parameter (another shape, or a second one)" : "names no model/ array";
        rc = fits ? easydel_add_slot(&l, m->key, slot, a->z.dtype, a->z.ndim, a->z.shape, i, slotset, &fits) : 0;
        if (rc) break;
        if (fits) n++;
        else rc = easydel_left_out(left_out, c->dir, "tx/ array", a->path, NULL, why, quiet);
    }
    if (!rc && !n) rc = ckpt_error_set(CKPT_EINVAL, "%s: --state: no tx/ array is a slot of a model/ parameter", c->dir);
    if (!rc) rc = st_layout_finish(&l);
    char *path = rc ? NULL : ckpt_path_join(staging, "optimizer.safetensors");
    if (!rc && !path) rc = CKPT_ENOMEM;
    stage_ctx sc = {.c = c};
    if (!rc) rc = st_write_file(path, &l, fill, &sc);
    free(path);
    st_layout_free(&l);
    int64_t step = c->has_step ? c->step : 0;
    if (!rc) rc = easydel_write_state_files(staging, slotset, scalars, left_out, step);
    if (!rc && !quiet)
        ckpt_info("%s: %zu tx/ arrays became optimizer slots (%zu left out), step %lld", c->dir, n,
                  json_array_size(left_out), (long long)step);
    json_decref(scalars);
    json_decref(slotset);
    json_decref(left_out);
    return rc;
}

/* The staged folder (or, for an older save, the opened weights c with the
 * staged side files) converted with the inverse rules into dst. */
static int inverse_convert(const char *src, const char *staging, ckpt_checkpoint *c, const char *dst,
                           consolidate_opts *o)
{
    json_t *rules = easydel_inverse_rules(), *config = NULL;
    char *rules_path = ckpt_path_join(staging, ".easydel-inverse-rules.json");
    int rc = rules && rules_path ? cj_write_file(rules_path, rules) : ckpt_error_set(CKPT_ENOMEM, "out of memory");
    convert_opts co = {.rules_file = rules_path, .threads = o->threads, .force = o->force, .quiet = o->quiet,
                       .no_hash = true, .no_layout_file = true};
    convert_plan cp;
    if (!rc && c) {
        char *cfg = ckpt_path_join(staging, "config.json");
        if (!cfg) rc = CKPT_ENOMEM;
        else if (ckpt_exists(cfg)) rc = cj_load_file(&config, cfg, CONVERT_CONFIG_MAX_BYTES);
        free(cfg);
        if (!rc) rc = convert_plan_build_from(&cp, c, staging, config, NULL, NULL, &co); /* owns c, config */
        else ckpt_checkpoint_close(c);
    } else if (!rc) {
        rc = convert_plan_build(&cp, staging, &co);
    } else if (c) {
        ckpt_checkpoint_close(c);
    }
    if (rc) rc = ckpt_error_prefix(rc, "%s: mapping EasyDeL names back to Hugging Face", src);
    if (!rc) {
        rc = convert_write(&cp, dst, &co);
        convert_plan_free(&cp);
    }
    free(rules_path);
    json_decref(rules);
    return rc;
}

int easydel_consolidate(const char *src, const char *dst, consolidate_opts *o)
{
    if (!o->force && !ckpt_dir_is_empty_or_missing(dst))
        return ckpt_error_set(CKPT_EEXIST, "%s exists and is not empty (--force replaces it)", dst);
    char *weights = easydel_is_checkpoint(src) ? NULL : easydel_legacy_weights(src);
    bool legacy = weights != NULL;
    easydel_ckpt c;
    ckpt_checkpoint lc;
    int rc = legacy ? ckpt_checkpoint_open(&lc, weights) : easydel_open(&c, src);
    free(weights);
    if (rc) return rc;
    char *staging = NULL;
    rc = ckpt_tmpdir_create(dst, &staging);
    if (!rc && legacy && o->state) rc = easydel_legacy_state(src, &lc, staging, o->quiet);
    if (!rc && !legacy) rc = stage_model(&c, staging);
    if (!rc && !legacy && o->state) rc = stage_optimizer(&c, staging, o->quiet);
    if (!rc) rc = outdir_copy_model_files(src, staging);
    if (!rc) rc = inverse_convert(src, staging, legacy ? &lc : NULL, dst, o);
    else if (legacy) ckpt_checkpoint_close(&lc);
    if (staging) ckpt_rm_rf(staging);
    free(staging);
    if (!legacy) easydel_close(&c);
    return rc;
}
