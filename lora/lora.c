/*
 * lora.c — reading a PEFT LoRA adapter and checking it against a base (see
 * lora.h). Nothing here reads tensor bytes: the config, the safetensors
 * header and the base's headers say everything the checks need.
 */
#include "lora/lora.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <float.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- adapter_config.json ---- */

/* Fields read (their meaning is in lora.h). */
static const char *const read_fields[] = {"r",
                                          "lora_alpha",
                                          "use_rslora",
                                          "fan_in_fan_out",
                                          "target_modules",
                                          "rank_pattern",
                                          "alpha_pattern",
                                          "peft_type"};
/* Fields that only matter to training or loading, whatever their value. */
static const char *const ignored_fields[] = {
    "task_type",         "base_model_name_or_path", "revision",     "inference_mode",
    "lora_dropout",      "init_lora_weights",       "auto_mapping", "megatron_core",
    "loftq_config",      "runtime_config",          "eva_config",   "corda_config",
    "qalora_group_size", "layers_pattern",          "peft_version", "ensure_weight_tying"};
/* Fields that would change the update beyond s * B @ A unless neutral (null,
 * false, "none", empty). */
static const char *const neutral_fields[] = {"use_dora",          "bias",
                                             "modules_to_save",   "layers_to_transform",
                                             "layer_replication", "megatron_config",
                                             "lora_bias",         "trainable_token_indices",
                                             "use_qalora",        "target_parameters",
                                             "exclude_modules",   "alora_invocation_tokens",
                                             "arrow_config"};

static bool in_list(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i])) return true;
    return false;
}

static bool is_neutral(const json_t *v)
{
    if (json_is_null(v) || json_is_false(v)) return true;
    if (json_is_string(v)) return !strcmp(json_string_value(v), "none");
    if (json_is_array(v)) return json_array_size(v) == 0;
    if (json_is_object(v)) return json_object_size(v) == 0;
    return false;
}

static int check_fields(const lora_adapter *a, const char *what)
{
    const char *key;
    json_t *val;
    json_object_foreach(a->config, key, val)
    {
        if (in_list(key, read_fields, CKPT_ARRAY_LEN(read_fields)) ||
            in_list(key, ignored_fields, CKPT_ARRAY_LEN(ignored_fields)))
            continue;
        if (in_list(key, neutral_fields, CKPT_ARRAY_LEN(neutral_fields))) {
            if (is_neutral(val)) continue;
            char *text = json_dumps(val, JSON_COMPACT | JSON_ENCODE_ANY);
            int rc = ckpt_error_set(
                CKPT_EINVAL,
                "%s: '%s' is %.200s; only adapters whose update is s * B @ A are supported "
                "(it must be null, false, \"none\" or empty)",
                what, key, text ? text : "set");
            free(text);
            return rc;
        }
        return ckpt_error_set(CKPT_EINVAL, "%s: unknown field '%s' (is this a newer PEFT feature?)",
                              what, key);
    }
    return 0;
}

/* A compiled regex: fullmatch when `full`, else PEFT's pattern-key rule
 * `(.*\.)?(key)$` from the start. NULL (error set) when it does not compile. */
static pcre2_code *compile_regex(const char *pattern, bool full, const char *what)
{
    char *p = full ? ckpt_sprintf("(?:%s)", pattern) : ckpt_sprintf("(.*\\.)?(%s)$", pattern);
    if (!p) return NULL;
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | PCRE2_ANCHORED | (full ? PCRE2_ENDANCHORED : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
    free(p);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        ckpt_error_set(CKPT_EINVAL, "%s: bad regex '%s': %s", what, pattern, (const char *)msg);
    }
    return re;
}

/* 1 on match, 0 on none, <0 on error. */
static int regex_match(pcre2_code *re, const char *s)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return ckpt_error_set(CKPT_ENOMEM, "out of memory");
    int rc = pcre2_match(re, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return ckpt_error_set(CKPT_EINVAL, "regex failed on '%s' (error %d)", s, rc);
    return 1;
}

/* The value of `pattern` (rank_pattern or alpha_pattern) for module, PEFT's
 * way: an exact key first, else the first key matching `(.*\.)?(key)$`. */
static int pattern_value(const json_t *pattern, const char *module, const json_t **out,
                         const char *what)
{
    *out = json_object_get(pattern, module);
    if (*out) return 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)pattern, key, val)
    {
        pcre2_code *re = compile_regex(key, false, what);
        if (!re) return CKPT_EINVAL;
        int hit = regex_match(re, module);
        pcre2_code_free(re);
        if (hit < 0) return hit;
        if (hit) {
            *out = val;
            return 0;
        }
    }
    return 0;
}

static int read_config(lora_adapter *a, const char *what)
{
    if (!json_is_object(a->config))
        return ckpt_error_set(CKPT_EINVAL, "%s: must be a JSON object", what);
    int rc = check_fields(a, what);
    if (rc) return rc;
    const char *type = "LORA";
    if ((rc = cj_str_opt(a->config, "peft_type", &type, what))) return rc;
    if (strcmp(type, "LORA"))
        return ckpt_error_set(
            CKPT_EINVAL, "%s: peft_type is '%s'; only LORA adapters are supported", what, type);
    json_t *r = json_object_get(a->config, "r"), *alpha = json_object_get(a->config, "lora_alpha");
    if (!r) return ckpt_error_set(CKPT_EINVAL, "%s: missing field 'r' (the LoRA rank)", what);
    if (!alpha) return ckpt_error_set(CKPT_EINVAL, "%s: missing field 'lora_alpha'", what);
    if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > LORA_MAX_RANK)
        return ckpt_error_set(CKPT_EINVAL, "%s: 'r' must be an integer from 1 to %d", what,
                              LORA_MAX_RANK);
    if (!json_is_number(alpha) || !isfinite(json_number_value(alpha)))
        return ckpt_error_set(CKPT_EINVAL, "%s: 'lora_alpha' must be a finite number", what);
    a->r = json_integer_value(r);
    a->alpha = json_number_value(alpha);
    if ((rc = cj_bool_opt(a->config, "use_rslora", &a->rslora, what)) ||
        (rc = cj_bool_opt(a->config, "fan_in_fan_out", &a->fan_in_fan_out, what)))
        return rc;
    a->targets = json_object_get(a->config, "target_modules");
    if (!a->targets || json_is_null(a->targets))
        return ckpt_error_set(CKPT_EINVAL, "%s: missing field 'target_modules'", what);
    if (json_is_string(a->targets)) {
        const char *s = json_string_value(a->targets);
        if (strcmp(s, "all-linear")) {
            pcre2_code *re = compile_regex(s, true, what);
            if (!re) return CKPT_EINVAL;
            pcre2_code_free(re);
        }
    } else if (json_is_array(a->targets) && json_array_size(a->targets) > 0) {
        size_t i;
        json_t *v;
        json_array_foreach(
            a->targets, i,
            v) if (!json_is_string(v) ||
                   !json_string_length(
                       v)) return ckpt_error_set(CKPT_EINVAL,
                                                 "%s: 'target_modules' must hold module names",
                                                 what);
    } else {
        return ckpt_error_set(
            CKPT_EINVAL, "%s: 'target_modules' must be a list of module names or a regex", what);
    }
    const char *pats[] = {"rank_pattern", "alpha_pattern"};
    for (size_t p = 0; p < 2; p++) {
        json_t *o = json_object_get(a->config, pats[p]);
        if (!o || json_is_null(o)) continue;
        if (!json_is_object(o))
            return ckpt_error_set(CKPT_EINVAL, "%s: '%s' must be an object", what, pats[p]);
        const char *key;
        json_t *val;
        json_object_foreach(o, key, val)
        {
            bool ok = p == 0 ? json_is_integer(val) && json_integer_value(val) >= 1 &&
                                   json_integer_value(val) <= LORA_MAX_RANK
                             : json_is_number(val) && isfinite(json_number_value(val));
            if (!ok)
                return ckpt_error_set(CKPT_EINVAL, "%s: %s['%s'] must be %s", what, pats[p], key,
                                      p == 0 ? "a rank from 1 to 65536" : "a finite number");
            pcre2_code *re = compile_regex(key, false, what);
            if (!re) return CKPT_EINVAL;
            pcre2_code_free(re);
        }
    }
    return 0;
}

/* ---- adapter_model.safetensors ---- */

static int cmp_module(const void *x, const void *y)
{
    return strcmp(((const lora_module *)x)->module, ((const lora_module *)y)->module);
}

const lora_module *lora_adapter_find(const lora_adapter *a, const char *module)
{
    lora_module key = {.module = (char *)module};
    return a->nmods ? bsearch(&key, a->mods, a->nmods, sizeof *a->mods, cmp_module) : NULL;
}

/* Splits "base_model.model.<module>.lora_X.weight" into module and X ('A'/'B'). */
static char *parse_name(const char *name, char *which)
{
    size_t n = strlen(name), p = strlen(LORA_NAME_PREFIX);
    static const char suffix_a[] = ".lora_A.weight", suffix_b[] = ".lora_B.weight";
    size_t s = sizeof suffix_a - 1;
    if (n <= p + s || strncmp(name, LORA_NAME_PREFIX, p)) return NULL;
    if (!strcmp(name + n - s, suffix_a))
        *which = 'A';
    else if (!strcmp(name + n - s, suffix_b))
        *which = 'B';
    else
        return NULL;
    return ckpt_strndup(name + p, n - p - s);
}

static int module_scale(lora_adapter *a, lora_module *m, const char *what)
{
    const json_t *rv = NULL, *av = NULL;
    int rc = pattern_value(json_object_get(a->config, "rank_pattern"), m->module, &rv, what);
    if (!rc) rc = pattern_value(json_object_get(a->config, "alpha_pattern"), m->module, &av, what);
    if (rc) return rc;
    m->rank = rv ? (uint64_t)json_integer_value(rv) : (uint64_t)a->r;
    m->alpha = av ? json_number_value(av) : a->alpha;
    m->scale = a->rslora ? m->alpha / sqrt((double)m->rank) : m->alpha / (double)m->rank;
    if (!isfinite(m->scale) || fabs(m->scale) > FLT_MAX)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: module '%s': the scale lora_alpha / %s = %g / %llu does not fit "
                              "a float32 (every merged weight would be inf)",
                              what, m->module, a->rslora ? "sqrt(r)" : "r", m->alpha,
                              (unsigned long long)m->rank);
    return 0;
}

static int check_module(const lora_adapter *a, const lora_module *m, const char *what)
{
    char sa[96], sb[96];
    const st_tensor *A = m->a, *B = m->b;
    if (!A || !B)
        return ckpt_error_set(CKPT_EINVAL,
                              "%s: module '%s' has lora_%s.weight but no lora_%s.weight", what,
                              m->module, A ? "A" : "B", A ? "B" : "A");
    const st_tensor *ts[2] = {A, B};
    for (int i = 0; i < 2; i++)
        if (!ckpt_dtype_is_castable_float(ts[i]->dtype))
            return ckpt_error_set(
                CKPT_EINVAL,
                "%s: tensor '%s' has dtype %s; LoRA weights must be F16, BF16, F32 or F64", what,
                ts[i]->name, ckpt_dtype_name(ts[i]->dtype));
    if (A->ndim != 2 || B->ndim != 2 || A->shape[0] != B->shape[1])
        return ckpt_error_set(
            CKPT_EINVAL,
            "%s: module '%s': lora_A %s and lora_B %s are not [r, in] and [out, r] with one r",
            what, m->module, plan_shape_str(A->ndim, A->shape, sa, sizeof sa),
            plan_shape_str(B->ndim, B->shape, sb, sizeof sb));
    if (A->shape[0] != m->rank)
        return ckpt_error_set(
            CKPT_EINVAL, "%s: module '%s' has rank %llu but adapter_config.json says r = %llu",
            what, m->module, (unsigned long long)A->shape[0], (unsigned long long)m->rank);
    (void)a;
    return 0;
}

static int read_modules(lora_adapter *a, const char *what)
{
    a->mods = ckpt_calloc(a->ck.ntensors + 1, sizeof *a->mods);
    if (!a->mods) return CKPT_ENOMEM;
    for (size_t i = 0; i < a->ck.ntensors; i++) {
        const st_tensor *t = a->ck.tensors[i].t;
        char which;
        char *mod = parse_name(t->name, &which);
        if (!mod)
            return ckpt_error_set(
                CKPT_EINVAL,
                "%s: tensor '%s' is not base_model.model.<module>.lora_A.weight or .lora_B.weight "
                "(embedding, DoRA and bias adapters are not supported)",
                what, t->name);
        /* Tensors are sorted by name, and A sorts just before B of one module. */
        lora_module *m = a->nmods ? &a->mods[a->nmods - 1] : NULL;
        if (m && !strcmp(m->module, mod)) {
            free(mod);
        } else {
            m = &a->mods[a->nmods++];
            m->module = mod;
            m->a_index = m->b_index = -1;
        }
        if (which == 'A') {
            m->a = t;
            m->a_index = (int32_t)i;
        } else {
            m->b = t;
            m->b_index = (int32_t)i;
        }
    }
    if (a->nmods == 0) return ckpt_error_set(CKPT_EINVAL, "%s: holds no LoRA weights", what);
    qsort(a->mods, a->nmods, sizeof *a->mods, cmp_module);
    for (size_t i = 0; i < a->nmods; i++) {
        int rc = module_scale(a, &a->mods[i], what);
        if (!rc) rc = check_module(a, &a->mods[i], what);
        if (rc) return rc;
    }
    return 0;
}

int lora_adapter_open(lora_adapter *a, const char *dir)
{
    memset(a, 0, sizeof *a);
    a->dir = ckpt_strdup(dir);
    char *cfg = ckpt_path_join(dir, LORA_CONFIG_FILE);
    int rc = a->dir && cfg ? 0 : CKPT_ENOMEM;
    if (!rc && !ckpt_is_dir(dir))
        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: not a directory (expected a PEFT adapter)", dir);
    if (!rc && !ckpt_exists(cfg))
        rc = ckpt_error_set(CKPT_ENOTFOUND, "%s: no %s here; is this a PEFT LoRA adapter?", dir,
                            LORA_CONFIG_FILE);
    size_t len = 0;
    if (!rc) rc = ckpt_read_file(cfg, LORA_CONFIG_MAX_BYTES, &a->config_text, &len);
    if (!rc) rc = cj_load_buf(&a->config, a->config_text, len, cfg);
    if (!rc) rc = read_config(a, cfg);
    if (!rc) rc = ckpt_checkpoint_open_prefix(&a->ck, dir, LORA_WEIGHTS_PREFIX);
    if (!rc) {
        char *w = ckpt_path_join(dir, LORA_WEIGHTS_PREFIX ".safetensors");
        rc = w ? read_modules(a, w) : CKPT_ENOMEM;
        free(w);
    }
    free(cfg);
    if (rc) lora_adapter_free(a);
    return rc;
}

void lora_adapter_free(lora_adapter *a)
{
    for (size_t i = 0; a->mods && i < a->nmods; i++)
        free(a->mods[i].module);
    free(a->mods);
    ckpt_checkpoint_close(&a->ck);
    json_decref(a->config);
    free(a->config_text);
    free(a->dir);
    memset(a, 0, sizeof *a);
}

/* ---- against a base ---- */

static bool suffix_match(const char *module, const char *key)
{
    size_t n = strlen(module), k = strlen(key);
    if (n == k) return !strcmp(module, key);
    return n > k && module[n - k - 1] == '.' && !strcmp(module + n - k, key);
}

/* PEFT's all-linear: every Linear but the output layer; by name, embeddings
 * and lm_head are not Linear layers of the body. */
static bool all_linear(const char *module)
{
    return !suffix_match(module, "lm_head") && !strstr(module, "embed");
}

/* 1 when target entry `key` (or the regex) names module, 0 when not, <0 on error. */
static int targets_match(const lora_adapter *a, const char *module)
{
    if (json_is_string(a->targets)) {
        const char *s = json_string_value(a->targets);
        if (!strcmp(s, "all-linear")) return all_linear(module);
        pcre2_code *re = compile_regex(s, true, "target_modules");
        if (!re) return CKPT_EINVAL;
        int hit = regex_match(re, module);
        pcre2_code_free(re);
        return hit;
    }
    size_t i;
    json_t *v;
    json_array_foreach(a->targets, i, v) if (suffix_match(module, json_string_value(v))) return 1;
    return 0;
}

bool lora_adapter_targets(const lora_adapter *a, const char *module)
{
    return targets_match(a, module) > 0;
}

/* The module of a base tensor "<module>.weight" of rank 2, malloc'd, or NULL. */
static char *base_module(const st_tensor *t)
{
    size_t n = strlen(t->name);
    if (t->ndim != 2 || n <= 7 || strcmp(t->name + n - 7, ".weight")) return NULL;
    return ckpt_strndup(t->name, n - 7);
}

int lora_check_weight(const lora_adapter *a, const lora_module *m, const char *name, ckpt_dtype dtype, int ndim,
                      const uint64_t *shape)
{
    char sw[96], sa[96], sb[96];
    if (dtype != CKPT_DT_F32 && dtype != CKPT_DT_BF16 && dtype != CKPT_DT_F16)
        return ckpt_error_set(CKPT_EINVAL,
                              "base tensor '%s' has dtype %s; merging supports F32, BF16 and F16",
                              name, ckpt_dtype_name(dtype));
    uint64_t out = m->b->shape[0], in = m->a->shape[1];
    bool ok = ndim == 2 && (a->fan_in_fan_out ? shape[0] == in && shape[1] == out
                                              : shape[0] == out && shape[1] == in);
    if (!ok)
        return ckpt_error_set(
            CKPT_EINVAL,
            "module '%s': base weight '%s' is %s but lora_A %s and lora_B %s make a %s update of "
            "[%llu, %llu]",
            m->module, name, plan_shape_str(ndim, shape, sw, sizeof sw),
            plan_shape_str(2, m->a->shape, sa, sizeof sa),
            plan_shape_str(2, m->b->shape, sb, sizeof sb),
            a->fan_in_fan_out ? "fan_in_fan_out" : "[out, in]",
            (unsigned long long)(a->fan_in_fan_out ? in : out),
            (unsigned long long)(a->fan_in_fan_out ? out : in));
    return 0;
}

int lora_adapter_check_base(const lora_adapter *a, const ckpt_checkpoint *base)
{
    for (size_t i = 0; i < a->nmods; i++) {
        const lora_module *m = &a->mods[i];
        char *wname = ckpt_sprintf("%s.weight", m->module);
        if (!wname) return CKPT_ENOMEM;
        const ckpt_tensor_ref *ref = ckpt_checkpoint_find(base, wname);
        int rc =
            ref ? lora_check_weight(a, m, ref->t->name, ref->t->dtype, ref->t->ndim, ref->t->shape)
                : ckpt_error_set(CKPT_EINVAL, "adapter module '%s': the base %s has no tensor '%s'",
                                 m->module, base->path, wname);
        free(wname);
        if (!rc) {
            int hit = targets_match(a, m->module);
            if (hit == 0)
                rc = ckpt_error_set(
                    CKPT_EINVAL,
                    "adapter holds weights for '%s', which target_modules does not name",
                    m->module);
            else if (hit < 0)
                rc = hit;
        }
        if (rc) return rc;
    }
    /* Every target names a base module, and every module it names is adapted. */
    size_t nt = json_is_array(a->targets) ? json_array_size(a->targets) : 1;
    bool *used = ckpt_calloc(nt + 1, sizeof *used);
    if (!used) return CKPT_ENOMEM;
    int rc = 0;
    for (size_t i = 0; !rc && i < base->ntensors; i++) {
        char *mod = base_module(base->tensors[i].t);
        if (!mod) continue;
        int hit = targets_match(a, mod);
        if (hit < 0) rc = hit;
        if (hit > 0) {
            if (json_is_array(a->targets)) {
                for (size_t k = 0; k < nt; k++)
                    used[k] |= suffix_match(mod, json_string_value(json_array_get(a->targets, k)));
            } else {
                used[0] = true;
            }
            if (!lora_adapter_find(a, mod))
                rc = ckpt_error_set(CKPT_EINVAL,
                                    "target_modules names '%s' of the base, but the adapter has no "
                                    "lora_A/lora_B weights for it",
                                    mod);
        }
        free(mod);
    }
    for (size_t k = 0; !rc && k < nt; k++) {
        if (used[k]) continue;
        const char *t = json_is_array(a->targets) ? json_string_value(json_array_get(a->targets, k))
                                                  : json_string_value(a->targets);
        rc = ckpt_error_set(CKPT_EINVAL,
                            "target_modules entry '%s' matches no weight of the base %s", t,
                            base->path);
    }
    free(used);
    return rc;
}
