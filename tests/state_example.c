/*
 * state_example.c — a program that links libckpt through ckpt.h alone, the
 * way a training loop would: it trains nothing, but updates parameters and
 * Adam moments every step, saves its state every few steps (replacing the
 * previous save), loads it back and checks it is what it saved, and finally
 * resumes from the saved state and carries on.
 *
 *   state_example DIR [STEPS]
 *
 * Built with only -Iinclude (see the Makefile), so it proves the public
 * header stands alone. Exit 0 when every check held.
 */
#include "ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAVE_EVERY 5

static int fail(const char *what)
{
    fprintf(stderr, "state_example: %s: %s\n", what, ckpt_error_last());
    return 1;
}

static float get(const ckpt_tensor *t, uint64_t i)
{
    if (t->dtype == CKPT_DT_BF16) return ckpt_bf16_to_f32(((const uint16_t *)t->data)[i]);
    return ((const float *)t->data)[i];
}

static void put(ckpt_tensor *t, uint64_t i, float v)
{
    if (t->dtype == CKPT_DT_BF16)
        ((uint16_t *)t->data)[i] = ckpt_f32_to_bf16(v);
    else
        ((float *)t->data)[i] = v;
}

/* One Adam-like update of every parameter with a made-up gradient. */
static int train_step(ckpt_state *st, uint64_t step)
{
    double lr;
    if (ckpt_state_hyperparameter(&lr, st, "lr") < 0) return -1;
    for (size_t p = 0; p < ckpt_state_param_count(st); p++) {
        ckpt_tensor *w = ckpt_state_param_at(st, p);
        ckpt_tensor *m = ckpt_state_slot(st, w->name, "adam_m"),
                    *v = ckpt_state_slot(st, w->name, "adam_v");
        if (!m || !v) return -1;
        for (uint64_t i = 0; i < w->numel; i++) {
            float g = (float)sin((double)(step * 31 + p * 7 + i));
            float mi = 0.9f * get(m, i) + 0.1f * g, vi = 0.999f * get(v, i) + 0.001f * g * g;
            put(m, i, mi);
            put(v, i, vi);
            put(w, i, get(w, i) - (float)lr * mi / (sqrtf(vi) + 1e-8f));
        }
    }
    ckpt_state_set_step(st, step);
    return ckpt_state_set_scalar(st, "count", (double)step);
}

static int same(const ckpt_state *a, const ckpt_state *b)
{
    if (ckpt_state_step(a) != ckpt_state_step(b) ||
        ckpt_state_param_count(a) != ckpt_state_param_count(b) ||
        ckpt_state_slot_count(a) != ckpt_state_slot_count(b))
        return 0;
    for (size_t i = 0; i < ckpt_state_param_count(a) + ckpt_state_slot_count(a); i++) {
        const ckpt_tensor *t = i < ckpt_state_param_count(a)
                                   ? ckpt_state_param_at(a, i)
                                   : ckpt_state_slot_at(a, i - ckpt_state_param_count(a));
        const ckpt_tensor *u =
            t->slot ? ckpt_state_slot(b, t->param, t->slot) : ckpt_state_param(b, t->name);
        if (!u || u->dtype != t->dtype || u->nbytes != t->nbytes ||
            memcmp(u->data, t->data, t->nbytes))
            return 0;
    }
    double ca, cb;
    return ckpt_state_scalar(&ca, a, "count") == 0 && ckpt_state_scalar(&cb, b, "count") == 0 &&
           ca == cb;
}

static int build(ckpt_state **out)
{
    static const struct {
        const char *name;
        ckpt_dtype dtype;
        int ndim;
        uint64_t shape[2];
    } params[] = {
        {"model.embed_tokens.weight", CKPT_DT_BF16, 2, {64, 16}},
        {"model.layers.0.mlp.up_proj.weight", CKPT_DT_F32, 2, {32, 16}},
        {"model.norm.weight", CKPT_DT_F32, 1, {16}},
    };
    ckpt_state *st;
    if (ckpt_state_new(&st) < 0) return -1;
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        ckpt_tensor *w;
        if (ckpt_state_add_param(&w, st, params[i].name, params[i].dtype, params[i].ndim,
                                 params[i].shape, NULL) < 0 ||
            ckpt_state_add_slot(NULL, st, w->name, "adam_m", CKPT_DT_F32, NULL) < 0 ||
            ckpt_state_add_slot(NULL, st, w->name, "adam_v", CKPT_DT_F32, NULL) < 0) {
            ckpt_state_free(st);
            return -1;
        }
        for (uint64_t k = 0; k < w->numel; k++)
            put(w, k, 0.02f * (float)((k * 2654435761u) % 1000) / 1000.0f);
    }
    if (ckpt_state_set_optimizer(st, "adamw") < 0 ||
        ckpt_state_set_hyperparameter(st, "lr", 1e-3) < 0 ||
        ckpt_state_set_hyperparameter(st, "b1", 0.9) < 0 ||
        ckpt_state_set_hyperparameter(st, "b2", 0.999) < 0 ||
        ckpt_state_set_scalar(st, "count", 0) < 0) {
        ckpt_state_free(st);
        return -1;
    }
    *out = st;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: state_example DIR [STEPS]\n");
        return 2;
    }
    const char *dir = argv[1];
    uint64_t steps = argc == 3 ? strtoull(argv[2], NULL, 10) : 20;
    if (strcmp(ckpt_dtype_name(CKPT_DT_BF16), "BF16") || ckpt_dtype_size(CKPT_DT_F32) != 4) {
        fprintf(stderr, "state_example: ckpt.h's dtypes disagree with the library\n");
        return 1;
    }
    ckpt_state *st;
    if (build(&st) < 0) return fail("build");
    unsigned saves = 0;
    ckpt_state_save_options so = CKPT_STATE_SAVE_OPTIONS_INIT;
    so.max_shard_size = 4096; /* several shards even for a toy */
    for (uint64_t step = 1; step <= steps; step++) {
        if (train_step(st, step) < 0) return fail("train");
        if (step % SAVE_EVERY && step != steps) continue;
        if (ckpt_state_save(dir, st, &so) < 0) return fail("save");
        saves++;
        ckpt_state *back;
        if (ckpt_state_load(dir, NULL, &back) < 0) return fail("load");
        if (!same(st, back)) {
            fprintf(stderr,
                    "state_example: step %llu: the loaded state differs from the saved one\n",
                    (unsigned long long)step);
            return 1;
        }
        ckpt_state_free(back);
    }
    /* Resume from the last save (tensors mapped from the files, written in place) and train on. */
    ckpt_state *resumed;
    if (ckpt_state_load(dir, NULL, &resumed) < 0) return fail("resume");
    for (uint64_t step = steps + 1; step <= steps + SAVE_EVERY; step++) {
        if (train_step(resumed, step) < 0 || train_step(st, step) < 0)
            return fail("train after resume");
    }
    if (!same(st, resumed)) {
        fprintf(stderr, "state_example: training on from the loaded state diverged\n");
        return 1;
    }
    if (ckpt_state_save(dir, resumed, &so) < 0) return fail("save after resume");
    ckpt_state *last;
    if (ckpt_state_load(dir, NULL, &last) < 0) return fail("final load");
    int ok = same(st, last) && ckpt_state_step(last) == steps + SAVE_EVERY;
    printf("state_example: %llu steps, %u saves, resumed at step %llu, final step %llu: %s\n",
           (unsigned long long)(steps + SAVE_EVERY), saves + 1, (unsigned long long)steps,
           (unsigned long long)ckpt_state_step(last), ok ? "every load matched" : "MISMATCH");
    ckpt_state_free(last);
    ckpt_state_free(resumed);
    ckpt_state_free(st);
    return ok ? 0 : 1;
}
