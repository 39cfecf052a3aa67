/* layout_meta.c — builds ckpt-layout.json from a conversion plan (format in layout_meta.h). */
#include "transform/layout_meta.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/util.h"
#include "transform/lora_plan.h"
#include "transform/state_convert.h"

#include <string.h>

static json_t *shape_json(int ndim, const uint64_t *shape)
{
    json_t *a = json_array();
    for (int k = 0; a && k < ndim; k++) json_array_append_new(a, json_integer((json_int_t)shape[k]));
    return a;
}

static json_t *source_json(const convert_plan *cp, char (*hashes)[65])
{
    const ckpt_checkpoint *c = &cp->src;
    json_t *files = json_array();
    for (size_t f = 0; files && f < c->nfiles; f++) {
        const st_file *sf = &c->files[f];
        json_t *meta = json_object(), *tensors = json_array();
        for (size_t m = 0; m < sf->nmeta; m++) json_object_set_new(meta, sf->meta_keys[m], json_string(sf->meta_vals[m]));
        for (size_t i = 0; i < sf->ntensors; i++) {
            const st_tensor *t = &sf->tensors[i];
            json_array_append_new(tensors, json_pack("{s:s,s:s,s:o}", "name", t->name, "dtype",
                                                     ckpt_dtype_name(t->dtype), "shape", shape_json(t->ndim, t->shape)));
        }
        json_t *jf = json_pack("{s:s,s:I,s:o,s:o}", "name", ckpt_basename(sf->path), "size",
                               (json_int_t)sf->file_size, "metadata", meta, "tensors", tensors);
        if (jf && hashes && hashes[f][0]) json_object_set_new(jf, "sha256", json_string(hashes[f]));
        json_array_append_new(files, jf);
    }
    json_t *src = json_pack("{s:o}", "files", files);
    if (src && cp->index_text) {
        json_object_set_new(src, "index_name", json_string(cp->index_name));
        json_object_set_new(src, "index", json_string(cp->index_text));
    }
    return src;
}

static json_t *tensor_json(const convert_plan *cp, const plan_tensor *t, bool with_parts)
{
    json_t *j = json_pack("{s:s,s:o,s:s,s:o}", "name", t->name, "rank",
                          t->rank == PLAN_ALL_RANKS ? json_null() : json_integer(t->rank), "dtype",
                          ckpt_dtype_name(t->dtype), "shape", shape_json(t->ndim, t->shape));
    if (!j) return NULL;
    if (t->meta) json_object_update(j, t->meta);
    if (with_parts) {
        json_object_set_new(j, "parts", plan_parts_to_json(t->parts, t->nparts, t->ndim, cp->exec.sources));
    }
    return j;
}

/* optimum-neuron's "parameters" and "model_weight_transformation_specs". */
static void neuron_compat(json_t *root, const convert_plan *cp)
{
    json_t *params = json_object(), *specs = json_array();
    for (size_t i = 0; i < cp->set.n; i++) {
        const plan_tensor *t = &cp->set.t[i];
        if (!t->meta || json_object_get(params, t->name)) continue;
        json_t *tmp = json_object_get(t->meta, "tensor_model_parallel");
        if (tmp) {
            json_object_set_new(params, t->name,
                                json_pack("{s:O,s:O,s:O,s:O}", "tensor_model_parallel", tmp, "partition_dim",
                                          json_object_get(t->meta, "partition_dim"), "partition_stride",
                                          json_object_get(t->meta, "partition_stride"), "num_partitions",
                                          json_object_get(t->meta, "num_partitions")));
        }
        if (t->rank > 0) continue; /* one spec per parameter, from rank 0 (or the unsplit tensor) */
        json_t *fused = json_object_get(t->meta, "fused"), *gqa = json_object_get(t->meta, "gqa");
        if (fused)
            json_array_append_new(specs, json_pack("{s:s,s:s,s:O,s:O,s:O}", "type", "FusedLinearsSpec",
                                                   "fused_linear_name", t->name, "linear_names",
                                                   json_object_get(fused, "members"), "original_dims",
                                                   json_object_get(fused, "original_dims"), "fuse_axis",
                                                   json_object_get(fused, "axis")));
        if (gqa && strstr(t->name, "qkv"))
            json_array_append_new(specs, json_pack("{s:s,s:s,s:O}", "type", "GQAQKVColumnParallelLinearSpec",
                                                   "fused_linear_name", t->name, "gqa", gqa));
    }
    json_object_set_new(root, "parameters", params);
    json_object_set_new(root, "model_weight_transformation_specs", specs);
}

json_t *layout_meta_build(const convert_plan *cp, char (*hashes)[65], bool with_parts)
{
    json_t *root = json_pack("{s:s,s:i,s:s,s:i,s:b}", "format", "ckpt-layout", "version", 1, "layout",
                             cp->layout_name, "tp", cp->tp, "lossy", cp->result.lossy);
    if (!root) return NULL;
    json_object_set_new(root, "source", source_json(cp, hashes));
    json_object_set(root, "rules", cp->rules.doc);
    json_t *lora = lora_plan_meta(cp);
    if (lora) json_object_set_new(root, "lora_merge", lora); /* the adapters merged, with their files' sha256 */
    json_t *folders = json_array();
    for (size_t r = 0; r < cp->nfolders; r++) {
        json_t *files = json_array();
        const char *dir = cp->folder_dirs[r];
        for (size_t f = 0; f < cp->exec.nfiles; f++) {
            const char *rel = cp->exec.files[f].rel;
            size_t dl = strlen(dir);
            bool in = cp->folder_files ? f >= cp->folder_files[r] && f < cp->folder_files[r + 1]
                      : dl             ? !strncmp(rel, dir, dl) && rel[dl] == '/'
                                       : strchr(rel, '/') == NULL;
            if (in) json_array_append_new(files, json_string(rel));
        }
        json_array_append_new(folders, json_pack("{s:I,s:s,s:o}", "rank", (json_int_t)r, "dir", dir, "files", files));
    }
    json_object_set_new(root, "folders", folders);
    json_t *tensors = json_array();
    for (size_t i = 0; tensors && i < cp->set.n; i++) json_array_append_new(tensors, tensor_json(cp, &cp->set.t[i], with_parts));
    json_object_set_new(root, "tensors", tensors);
    neuron_compat(root, cp);
    state_plan_meta(cp, root); /* a training state's optimizer index */
    return root;
}
