/*
 * cmd_inspect_nxd.c — `ckpt inspect DIR` of an optimum-neuron /
 * neuronx-distributed training save (format/nxd.h, docs/layouts.md "NxD
 * checkpoints in"): the ranks (tp, pp, ep), the serialisation, the
 * transformation specs of every stage, and every parameter with its
 * partition metadata and its shape on a rank. Every rank file's tensor table
 * is read and checked when the save opens; no tensor byte is read here.
 */
#include "service/cli/cli.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "format/nxd.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void partition_str(const json_t *m, char *buf, size_t len)
{
    if (!json_is_true(json_object_get(m, "tensor_model_parallel"))) {
        snprintf(buf, len, "replicated");
        return;
    }
    snprintf(buf, len, "tp dim %lld stride %lld", (long long)json_integer_value(json_object_get(m, "partition_dim")),
             (long long)json_integer_value(json_object_get(m, "partition_stride")));
}

/* One line per spec: its class and what it fuses. */
static void print_specs(const json_t *specs)
{
    size_t i, k;
    json_t *mod, *sp;
    json_array_foreach(specs, i, mod)
    {
        const char *mname = json_string_value(json_object_get(mod, "module_fully_qualified_name"));
        json_array_foreach(json_object_get(mod, "specs"), k, sp)
        {
            const char *cls = json_string_value(json_array_get(sp, 0));
            const json_t *f = json_array_get(sp, 1);
            if (!cls || !json_is_object(f)) continue;
            printf("  spec %s: %s", mname ? mname : "?", cls);
            if (!strcmp(cls, "GQAQKVColumnParallelLinearSpec"))
                printf(" %s (%s), %lld query heads, %lld KV heads, kv_size_multiplier %lld\n",
                       json_string_value(json_object_get(f, "gqa_qkv_projection_name")),
                       json_is_true(json_object_get(f, "fuse_qkv")) ? "fused qkv" : "separate q/k/v",
                       (long long)json_integer_value(json_object_get(f, "num_attention_heads")),
                       (long long)json_integer_value(json_object_get(f, "num_key_value_heads")),
                       (long long)json_integer_value(json_object_get(f, "kv_size_multiplier")));
            else if (!strcmp(cls, "FusedLinearsSpec")) {
                printf(" %s =", json_string_value(json_object_get(f, "fused_linear_name")));
                size_t j;
                json_t *n;
                json_array_foreach(json_object_get(f, "linear_names"), j, n) printf("%s%s", j ? " + " : " ", json_string_value(n));
                printf(" (fuse_axis %lld)\n", (long long)json_integer_value(json_object_get(f, "fuse_axis")));
            } else
                printf("\n");
        }
    }
}

int cli_inspect_nxd(const char *path, bool as_json)
{
    nxd_ckpt c;
    if (nxd_open(&c, path) < 0) return cli_fail();
    if (as_json) {
        json_t *ranks = json_array(), *params = json_array(), *stages = json_array();
        for (int s = 0; s < c.pp; s++)
            for (int e = 0; e < c.ep; e++)
                for (int t = 0; t < c.tp; t++) {
                    const nxd_rank *r = nxd_rank_at(&c, s, e, t);
                    json_array_append_new(ranks, json_pack("{s:s, s:i, s:i, s:i, s:I}", "file", nxd_rank_name(r), "tp", t,
                                                           "pp", s, "ep", e, "tensors", (json_int_t)r->ck.ntensors));
                }
        for (int s = 0; s < c.pp; s++) {
            json_array_append_new(stages, json_pack("{s:i, s:s, s:O}", "pp", s, "metadata", ckpt_basename(c.meta_paths[s]),
                                                    "model_weight_transformation_specs",
                                                    json_object_get(c.meta[s], "model_weight_transformation_specs")));
            const char *name;
            json_t *m;
            json_object_foreach(json_object_get(c.meta[s], "parameters"), name, m)
            {
                char *saved = nxd_saved_name(name);
                const ckpt_tensor_ref *ref = saved ? ckpt_checkpoint_find(&nxd_rank_at(&c, s, 0, 0)->ck, saved) : NULL;
                free(saved);
                json_t *p = json_deep_copy(m);
                json_object_set_new(p, "name", json_string(name));
                json_object_set_new(p, "pp", json_integer(s));
                json_object_set_new(p, "dtype", ref ? json_string(ckpt_dtype_name(ref->t->dtype)) : json_null());
                json_object_set_new(p, "rank_shape", ref ? cli_dims_json(ref->t->ndim, ref->t->shape) : json_null());
                json_array_append_new(params, p);
            }
        }
        json_t *doc = json_pack("{s:s, s:s, s:s?, s:b, s:i, s:i, s:i, s:s, s:b, s:o, s:o, s:o}", "format", "nxd", "shards",
                                c.shards, "root", c.root, "adapter", c.adapter, "tp", c.tp, "pp", c.pp, "ep", c.ep, "serialization",
                                c.xser ? "xser" : "torch.save", "optimizer", c.has_optim, "ranks", ranks, "stages", stages,
                                "parameters", params);
        nxd_close(&c);
        return cli_print_json(doc);
    }
    printf("neuronx-distributed %s %s: tp %d, pp %d, ep %d, %s, %d rank files%s\n", c.adapter ? "PEFT adapter save" : "save",
           c.shards, c.tp, c.pp, c.ep,
           c.xser ? "xser (TensorReference + .tensors/)" : "torch.save state dicts", c.tp * c.pp * c.ep,
           c.has_optim ? ", optimizer in optim/ (consolidate --state reads it)" : "");
    int pw = 9;
    for (int s = 0; s < c.pp; s++) {
        const char *name;
        json_t *m;
        json_object_foreach(json_object_get(c.meta[s], "parameters"), name, m)
        {
            int n = (int)strlen(name);
            pw = n > pw ? (n > 90 ? 90 : n) : pw;
        }
    }
    size_t nparams = 0;
    for (int s = 0; s < c.pp; s++) {
        printf("stage %d (%s): %zu parameters\n", s, ckpt_basename(c.meta_paths[s]),
               json_object_size(json_object_get(c.meta[s], "parameters")));
        print_specs(json_object_get(c.meta[s], "model_weight_transformation_specs"));
    }
    printf("%-*s  %2s  %-22s  %-5s  %s\n", pw, "parameter", "pp", "partition", "dtype", "shape on a rank");
    for (int s = 0; s < c.pp; s++) {
        const char *name;
        json_t *m;
        json_object_foreach(json_object_get(c.meta[s], "parameters"), name, m)
        {
            char *saved = nxd_saved_name(name);
            const ckpt_tensor_ref *ref = saved ? ckpt_checkpoint_find(&nxd_rank_at(&c, s, 0, 0)->ck, saved) : NULL;
            free(saved);
            char part[64], shape[CKPT_MAX_RANK * 24 + 4] = "(not saved)";
            partition_str(m, part, sizeof part);
            if (ref) ckpt_shape_str(ref->t->ndim, ref->t->shape, shape, sizeof shape);
            printf("%-*s  %2d  %-22s  %-5s  %s\n", pw, name, s, part, ref ? ckpt_dtype_name(ref->t->dtype) : "-", shape);
            nparams++;
        }
    }
    printf("%zu parameters\n", nparams);
    int rc = fflush(stdout) ? ckpt_error_sys("stdout") : 0;
    nxd_close(&c);
    return rc < 0 ? cli_fail() : CLI_OK;
}
