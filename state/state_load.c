/*
 * state_load.c — ckpt_state_load(): a state as saved (state/state.c), or
 * one tensor-parallel rank of a layout of a state saved in the original
 * layout, reading only the byte ranges that rank needs.
 *
 * The rank's tensors come from the planner exactly as `ckpt convert` makes
 * them: the state's model and optimizer files are opened as one checkpoint,
 * convert_plan_build_from() plans the layout (optimizer slots get their
 * parameter's parts, state_convert.c), and the tensors of rank r (and the
 * replicated ones) are assembled in memory from their parts.
 *
 * Reading: a part is a box of a source tensor. Its box is read as the
 * fewest contiguous byte runs that hold it: a run spanning several rows is
 * read whole only when it is dense (at most 1/16 of it is bytes the rank
 * does not need); otherwise the box is cut along its outermost source axis
 * until the pieces are (a row-parallel slice becomes one read per row). So
 * the bytes read are the rank's bytes plus headers, whatever the layout.
 */
#include "state/state.h"

#include "common/fsutil.h"
#include "common/json.h"
#include "common/util.h"
#include "transform/convert.h"
#include "transform/state_convert.h"

#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RANK_BAND_BYTES (16u << 20) /* largest single read */
#define RANK_SLACK_DIV 16           /* a read may carry 1/16 unneeded bytes */
#define STATE_LOAD_ATTEMPTS 3 /* loads done again because a save replaced the state meanwhile */

/* Element i of the walk (multi-index over ext) is source element src + sum i[k]*ss[k]
 * and destination element dst + sum i[k]*ds[k]. */
typedef struct {
    int nd;
    uint64_t ext[PLAN_MAX_DIM], ss[PLAN_MAX_DIM], ds[PLAN_MAX_DIM];
    uint64_t src, dst;
} box_walk;

typedef struct {
    const exec_plan *exec;
    int *fds; /* per source path, -1 until opened */
    uint8_t *band;
} gather_ctx;

static void strides(int ndim, const uint64_t *shape, uint64_t *out)
{
    uint64_t acc = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        out[k] = acc;
        acc *= shape[k];
    }
}

/* The walk of part p of tensor t, with length-1 axes dropped and axes that
 * continue each other in source and destination merged. */
static void part_walk(box_walk *w, const plan_part *p, const plan_source *s, const plan_tensor *t)
{
    uint64_t sstr[PLAN_MAX_DIM], dstr[PLAN_MAX_DIM];
    strides(s->ndim, s->shape, sstr);
    strides(t->ndim, t->shape, dstr);
    w->src = w->dst = 0;
    for (int a = 0; a < s->ndim; a++)
        w->src += p->src_lo[a] * sstr[a];
    int n = 0;
    for (int k = 0; k < t->ndim; k++) {
        w->dst += p->lo[k] * dstr[k];
        if (p->ext[k] == 1) continue;
        uint64_t ss = p->axis_map[k] >= 0 ? sstr[p->axis_map[k]] : 0;
        if (n > 0 && w->ss[n - 1] == ss * p->ext[k] && w->ds[n - 1] == dstr[k] * p->ext[k]) {
            w->ext[n - 1] *= p->ext[k];
            w->ss[n - 1] = ss;
            w->ds[n - 1] = dstr[k];
            continue;
        }
        w->ext[n] = p->ext[k];
        w->ss[n] = ss;
        w->ds[n] = dstr[k];
        n++;
    }
    w->nd = n;
}

static void copy_strided(uint8_t *dst, const uint8_t *src, size_t es, uint64_t n, uint64_t ss,
                         uint64_t ds)
{
    if (ss == 1 && ds == 1) {
        memcpy(dst, src, (size_t)(n * es));
        return;
    }
    switch (es) {
    case 1:
        for (uint64_t i = 0; i < n; i++)
            dst[i * ds] = src[i * ss];
        break;
    case 2:
        for (uint64_t i = 0; i < n; i++)
            memcpy(dst + i * ds * 2, src + i * ss * 2, 2);
        break;
    case 4:
        for (uint64_t i = 0; i < n; i++)
            memcpy(dst + i * ds * 4, src + i * ss * 4, 4);
        break;
    case 8:
        for (uint64_t i = 0; i < n; i++)
            memcpy(dst + i * ds * 8, src + i * ss * 8, 8);
        break;
    default:
        for (uint64_t i = 0; i < n; i++)
            memcpy(dst + i * ds * es, src + i * ss * es, es);
    }
}

/* Copies the walk's elements from band (band[0] = source element w->src) into dst. */
static void scatter(const box_walk *w, const uint8_t *band, uint8_t *dst, size_t es)
{
    if (w->nd == 0) {
        memcpy(dst + w->dst * es, band, es);
        return;
    }
    int in = w->nd - 1;
    uint64_t idx[PLAN_MAX_DIM] = {0};
    for (;;) {
        uint64_t so = 0, d = w->dst;
        for (int k = 0; k < in; k++) {
            so += idx[k] * w->ss[k];
            d += idx[k] * w->ds[k];
        }
        copy_strided(dst + d * es, band + so * es, es, w->ext[in], w->ss[in], w->ds[in]);
        int k = in - 1;
        while (k >= 0 && ++idx[k] == w->ext[k])
            idx[k--] = 0;
        if (k < 0) break;
    }
}

static int source_fd(gather_ctx *g, size_t file)
{
    if (g->fds[file] < 0) {
        g->fds[file] = open(g->exec->src_paths[file], O_RDONLY | O_CLOEXEC);
        if (g->fds[file] < 0) return ckpt_error_sys("%s: open", g->exec->src_paths[file]);
    }
    return 0;
}

/* Reads the walk's source elements in dense runs (see the top of the file) into dst. */
static int gather_walk(gather_ctx *g, const box_walk *w, const plan_source *s, uint8_t *dst,
                       size_t es)
{
    uint64_t needed = 1, span = 1;
    for (int k = 0; k < w->nd; k++) {
        needed *= w->ext[k];
        span += (w->ext[k] - 1) * w->ss[k];
    }
    if (span - needed <= needed / RANK_SLACK_DIV && span * es <= RANK_BAND_BYTES) {
        int fd = g->fds[s->file];
        int rc = ckpt_pread_full(fd, g->band, (size_t)(span * es), s->offset + w->src * es,
                                 g->exec->src_paths[s->file]);
        if (rc) return ckpt_error_prefix(rc, "tensor '%s'", s->name);
        scatter(w, g->band, dst, es);
        return 0;
    }
    /* Cut the axis that is outermost in the source in two. */
    int j = -1;
    for (int k = 0; k < w->nd; k++)
        if (w->ext[k] > 1 && (j < 0 || w->ss[k] > w->ss[j])) j = k;
    if (j < 0)
        return ckpt_error_set(CKPT_ELIMIT, "tensor '%s': an element larger than the read band",
                              s->name);
    box_walk a = *w, b = *w;
    a.ext[j] = w->ext[j] / 2;
    b.ext[j] = w->ext[j] - a.ext[j];
    b.src += a.ext[j] * w->ss[j];
    b.dst += a.ext[j] * w->ds[j];
    int rc = gather_walk(g, &a, s, dst, es);
    return rc ? rc : gather_walk(g, &b, s, dst, es);
}

/* Fills buf (the whole tensor, zeroed) from t's parts. */
static int gather_tensor(gather_ctx *g, const plan_tensor *t, uint8_t *buf)
{
    for (size_t i = 0; i < t->nparts; i++) {
        const plan_part *p = &t->parts[i];
        if (p->src == PLAN_ZERO) continue;
        const plan_source *s = &g->exec->sources[p->src];
        int rc = source_fd(g, s->file);
        if (rc) return rc;
        if (s->dtype != t->dtype)
            return ckpt_error_set(
                CKPT_EINVAL,
                "tensor '%s': the layout casts %s, which loading a rank does not do "
                "(use the load dtype option)",
                t->name, s->name);
        size_t es = ckpt_dtype_size(s->dtype);
        if (es == 0) {
            bool whole = t->nparts == 1 && t->ndim == s->ndim;
            for (int k = 0; whole && k < t->ndim; k++)
                whole = p->axis_map[k] == k && p->src_lo[k] == 0 && p->ext[k] == s->shape[k];
            if (!whole)
                return ckpt_error_set(CKPT_EINVAL,
                                      "tensor '%s': sub-byte dtype %s can only be copied whole",
                                      t->name, ckpt_dtype_name(s->dtype));
            rc = ckpt_pread_full(g->fds[s->file], buf, (size_t)s->nbytes, s->offset,
                                 g->exec->src_paths[s->file]);
            if (rc) return rc;
            continue;
        }
        box_walk w;
        part_walk(&w, p, s, t);
        if ((rc = gather_walk(g, &w, s, buf, es))) return rc;
    }
    return 0;
}

/* "neuron" / "neuron-tp8" with tp -> preset and tp. */
static int parse_layout(const char *layout, int tp_opt, char *preset, size_t len, int *tp)
{
    const char *dash = strstr(layout, "-tp");
    size_t pl = dash ? (size_t)(dash - layout) : strlen(layout);
    if (pl == 0 || pl >= len)
        return ckpt_error_set(CKPT_EINVAL, "layout '%s' is not PRESET or PRESET-tpN", layout);
    memcpy(preset, layout, pl);
    preset[pl] = 0;
    int from_name = 0;
    if (dash) {
        uint64_t v;
        if (ckpt_parse_u64(dash + 3, &v) < 0 || v < 1 || v > PLAN_MAX_TP)
            return ckpt_error_set(CKPT_EINVAL, "layout '%s' is not PRESET or PRESET-tpN", layout);
        from_name = (int)v;
    }
    if (tp_opt < 0 || tp_opt > PLAN_MAX_TP)
        return ckpt_error_set(CKPT_EINVAL, "tp %d is out of range", tp_opt);
    if (from_name && tp_opt && from_name != tp_opt)
        return ckpt_error_set(CKPT_EINVAL, "layout '%s' says tp %d but tp %d was asked", layout,
                              from_name, tp_opt);
    *tp = from_name ? from_name : tp_opt ? tp_opt : 1;
    return 0;
}

/* Opens the model (and optimizer) files of dir as one checkpoint, as convert opens a state. */
static int open_sources(ckpt_state *st, const char *dir, bool with_opt, ckpt_checkpoint *c)
{
    if (!with_opt) return ckpt_checkpoint_open_prefix(c, dir, "model");
    char *single = ckpt_path_join(dir, "optimizer.safetensors"),
         *index = ckpt_path_join(dir, "optimizer.safetensors.index.json");
    bool present = single && index && (ckpt_exists(single) || ckpt_exists(index));
    free(single);
    free(index);
    if (!present)
        return ckpt_error_set(CKPT_ENOTFOUND,
                              "%s: has_optimizer_state is true but there are no optimizer files",
                              dir);
    int rc = state_checkpoint_open(c, dir);
    if (!rc && (rc = state_check_optimizer(st, c, c))) ckpt_checkpoint_close(c);
    return rc;
}

static int adopt_planned(ckpt_state *st, gather_ctx *g, const plan_tensor *t, bool slot)
{
    uint64_t nbytes;
    int rc = ckpt_dtype_nbytes(t->dtype, t->ndim, t->shape, &nbytes);
    if (rc) return ckpt_error_prefix(rc, "tensor '%s'", t->name);
    if (nbytes > SIZE_MAX / 2) return ckpt_error_set(CKPT_ELIMIT, "tensor '%s' too large", t->name);
    uint8_t *buf = nbytes ? ckpt_calloc(1, (size_t)nbytes) : NULL;
    if (nbytes && !buf) return CKPT_ENOMEM;
    if ((rc = gather_tensor(g, t, buf))) {
        free(buf);
        return rc;
    }
    if (!slot) return state_adopt(NULL, st, t->name, NULL, t->dtype, t->ndim, t->shape, buf, false);
    size_t plen;
    char *param = state_split_slot_name(t->name, &plen) ? ckpt_strndup(t->name, plen) : NULL;
    if (!param) {
        free(buf);
        return ckpt_error_set(CKPT_EINVAL, "planned slot '%s' has no parameter", t->name);
    }
    rc = state_adopt(NULL, st, param, t->name + plen + 1, t->dtype, t->ndim, t->shape, buf, false);
    free(param);
    return rc;
}

static int load_rank(const char *dir, const ckpt_state_load_options *o, ckpt_state **out)
{
    char preset[64];
    int tp = 1;
    int rc = parse_layout(o->layout, o->tp, preset, sizeof preset, &tp);
    if (!rc && (o->rank < 0 || o->rank >= tp))
        rc = ckpt_error_set(CKPT_EINVAL, "rank %d is not in 0..%d (tp %d)", o->rank, tp - 1, tp);
    if (rc) return rc;
    ckpt_state *st;
    if ((rc = ckpt_state_new(&st))) return rc;
    state_info info;
    ckpt_checkpoint c;
    memset(&c, 0, sizeof c);
    json_t *config = NULL;
    rc = state_read_side_files(st, dir, o->load_optimizer, &info);
    if (!rc && !st->config)
        rc = ckpt_error_set(CKPT_ENOTFOUND,
                            "%s: the state has no config.json, which layout '%s' needs", dir,
                            preset);
    if (!rc) rc = cj_load_buf(&config, st->config, strlen(st->config), "config.json");
    if (!rc) rc = open_sources(st, dir, info.has_optimizer && o->load_optimizer, &c);
    convert_plan cp;
    memset(&cp, 0, sizeof cp);
    if (!rc) {
        convert_opts co = {.layout = preset, .tp = tp, .quiet = true, .no_hash = true};
        rc =
            convert_plan_build_from(&cp, &c, dir, config, NULL, NULL, &co); /* takes c and config */
        config = NULL;
    }
    gather_ctx g = {.exec = &cp.exec};
    if (!rc) {
        g.fds = ckpt_calloc(cp.exec.nsrc_paths + 1, sizeof *g.fds);
        g.band = ckpt_malloc(RANK_BAND_BYTES);
        if (!g.fds || !g.band) rc = CKPT_ENOMEM;
        for (size_t i = 0; g.fds && i < cp.exec.nsrc_paths; i++)
            g.fds[i] = -1;
    }
    size_t nparams = rc ? 0 : cp.set.n - state_plan_nslots(&cp);
    for (size_t i = 0; !rc && i < cp.set.n; i++) {
        const plan_tensor *t = &cp.set.t[i];
        if (t->rank != PLAN_ALL_RANKS && t->rank != o->rank) continue;
        rc = adopt_planned(st, &g, t, i >= nparams);
    }
    ckpt_dtype dt;
    if (!rc && o->dtype && !(rc = state_parse_float_dtype(o->dtype, &dt, "dtype")))
        rc = state_cast_all(st, dt);
    for (size_t i = 0; g.fds && i < cp.exec.nsrc_paths; i++)
        if (g.fds[i] >= 0) close(g.fds[i]);
    free(g.fds);
    free(g.band);
    convert_plan_free(&cp);
    ckpt_checkpoint_close(&c);
    json_decref(config);
    if (rc) {
        ckpt_state_free(st);
        return ckpt_error_prefix(rc, "load rank %d of layout %s-tp%d from %s", o->rank, preset, tp,
                                 dir);
    }
    *out = st;
    return 0;
}

static bool same_dir(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

int ckpt_state_load(const char *dir, const ckpt_state_load_options *opts, ckpt_state **out)
{
    if (!out) return ckpt_error_set(CKPT_EINVAL, "ckpt_state_load: no place for the state");
    *out = NULL;
    ckpt_state_load_options o = CKPT_STATE_LOAD_OPTIONS_INIT;
    int rc = state_load_options_get(&o, opts);
    if (rc) return rc;
    if (!dir || !*dir) return ckpt_error_set(CKPT_EINVAL, "ckpt_state_load: no directory");
    /* A save over dir swaps in a new directory: files opened before and after
     * the swap could mix two steps. Such a load is done again. */
    for (int attempt = 0;; attempt++) {
        struct stat before, after;
        bool pinned = stat(dir, &before) == 0;
        rc = o.layout ? load_rank(dir, &o, out) : state_load_dir(dir, &o, out);
        if (!pinned || (stat(dir, &after) == 0 && same_dir(&before, &after))) return rc;
        ckpt_state_free(*out);
        *out = NULL;
        if (attempt == STATE_LOAD_ATTEMPTS - 1)
            return ckpt_error_set(CKPT_EBUSY,
                                  "%s: the state was replaced %d times while loading; try again",
                                  dir, STATE_LOAD_ATTEMPTS);
    }
}
