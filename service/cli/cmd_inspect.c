/*
 * cmd_inspect.c — `ckpt inspect`: what a safetensors file or checkpoint holds.
 *
 * Everything is validated by ckpt_checkpoint_open() first, so a listing is
 * only ever printed for a checkpoint that passed every check; otherwise the
 * one-line error names the file, the check and the tensor.
 */
#include "service/cli/cli.h"
#include "service/cli/cli_opts.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "common/json.h"
#include "common/log.h"
#include "common/util.h"
#include "format/checkpoint.h"
#include "format/dcp.h"
#include "format/easydel.h"
#include "format/easydel_tree.h"
#include "format/nxd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void help(void)
{
    printf("usage: ckpt inspect PATH [--json]\n"
           "\n"
           "Validates and lists the tensors of PATH, which is a .safetensors file, a\n"
           "model.safetensors.index.json, or a checkpoint directory (model.safetensors, or\n"
           "shards listed by model.safetensors.index.json). Every file is checked against\n"
           "the safetensors rules and the index against the files; on the first problem\n"
           "ckpt prints one line naming the file, the check and the tensor, and exits 1.\n"
           "torch.save files (pytorch_model.bin, .pt) open the same way; a PyTorch\n"
           "Distributed Checkpoint folder (.metadata + __<rank>_<n>.distcp) lists every\n"
           "entry with its global shape, dtype and chunks (docs/torch.md).\n"
           "\n"
           "The text listing has one line per tensor in name order (name, dtype, shape,\n"
           "size, file), then the totals.\n"
           "\n"
           "PATH may also be an EasyDeL TensorStore save (docs/easydel.md) or an\n"
           "optimum-neuron / neuronx-distributed training save, the folder holding\n"
           "shards/ (or adapter_shards/) or that folder itself (docs/layouts.md): then\n"
           "the listing gives the ranks (tp, pp, ep), plain torch.save or xser, the\n"
           "model_weight_transformation_specs, and every parameter with its partition\n"
           "metadata and its shape on a rank; --json gives the same as\n"
           "{\"format\": \"nxd\", \"tp\", \"pp\", \"ep\", \"serialization\", \"ranks\", \"stages\",\n"
           " \"parameters\": [{\"name\", \"pp\", \"tensor_model_parallel\", ..., \"dtype\", \"rank_shape\"}]}.\n"
           "\n"
           "options:\n"
           "  --json   print JSON instead:\n"
           "           {\"files\": [{\"path\", \"size\", \"tensors\"}],\n"
           "            \"tensors\": [{\"name\", \"dtype\", \"shape\", \"file\", \"offset\", "
           "\"nbytes\"}],\n"
           "            \"total_bytes\": N, \"metadata\": {...}}\n"
           "           where offset is the tensor's absolute byte offset in its file,\n"
           "           total_bytes the sum of tensor bytes (headers excluded) and metadata\n"
           "           the __metadata__ of the first file\n"
           "\n"
           "examples:\n"
           "  ckpt inspect /models/qwen2\n"
           "  ckpt inspect model-00001-of-00002.safetensors --json\n"
           "  ckpt inspect ./checkpoints/step-1000     # a DCP folder: tensors and their chunks\n"
           "  ckpt inspect ./llama-trn1/checkpoint-100 # a neuronx-distributed save\n");
}

/* "[896, 14]" into buf. */
static const char *shape_str(const st_tensor *t, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%llu", d ? ", " : "",
                                 (unsigned long long)t->shape[d]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

static int print_text(const ckpt_checkpoint *c)
{
    int name_w = 4, shape_w = 5;
    char shape[CKPT_MAX_RANK * 24 + 4], human[32], *owned;
    for (size_t i = 0; i < c->ntensors; i++) {
        const st_tensor *t = c->tensors[i].t;
        int n = (int)strlen(cli_printable(t->name, &owned));
        int s = (int)strlen(shape_str(t, shape, sizeof shape));
        free(owned);
        name_w = n > name_w ? (n > 80 ? 80 : n) : name_w;
        shape_w = s > shape_w ? s : shape_w;
    }
    printf("%-*s  %-11s  %-*s  %10s  %s\n", name_w, "name", "dtype", shape_w, "shape", "size",
           "file");
    for (size_t i = 0; i < c->ntensors; i++) {
        const st_tensor *t = c->tensors[i].t;
        char *owned_file;
        printf("%-*s  %-11s  %-*s  %10s  %s\n", name_w, cli_printable(t->name, &owned),
               ckpt_dtype_name(t->dtype), shape_w, shape_str(t, shape, sizeof shape),
               ckpt_format_size(t->nbytes, human, sizeof human),
               cli_printable(ckpt_basename(c->files[c->tensors[i].file].path), &owned_file));
        free(owned);
        free(owned_file);
    }
    printf("%zu tensors in %zu file%s, %llu bytes (%s)\n", c->ntensors, c->nfiles,
           c->nfiles == 1 ? "" : "s", (unsigned long long)c->total_size,
           ckpt_format_size(c->total_size, human, sizeof human));
    return fflush(stdout) ? ckpt_error_sys("stdout") : 0;
}

/* An older EasyDeL save's step, from its optimizer structure read as records
 * (format/easydel_tree.h); a structure that cannot be read is said on stderr
 * and the parameters are listed anyway. */
static bool legacy_step(const char *dir, int64_t *step)
{
    char *p = ckpt_path_join(dir, EASYDEL_LEGACY_STRUCT);
    edtree t;
    bool ok = p && ckpt_exists(p);
    if (ok && edtree_read(&t, p) < 0) {
        ckpt_warn("no step: %s", ckpt_error_last());
        ok = false;
    } else if (ok) {
        ok = t.has_step;
        *step = t.step;
        edtree_free(&t);
    }
    free(p);
    return ok;
}

/* A non-negative count or offset as a JSON integer (json_int_t is signed). */
static json_t *json_u64(uint64_t v)
{
    return v <= INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static json_t *tensor_json(const ckpt_checkpoint *c, const ckpt_tensor_ref *ref)
{
    const st_tensor *t = ref->t;
    json_t *shape = json_array();
    for (int d = 0; shape && d < t->ndim; d++) {
        if (json_array_append_new(shape, json_u64(t->shape[d]))) {
            json_decref(shape);
            return NULL;
        }
    }
    return json_pack("{s:s, s:s, s:o, s:s, s:o, s:o}", "name", t->name, "dtype",
                     ckpt_dtype_name(t->dtype), "shape", shape, "file",
                     ckpt_basename(c->files[ref->file].path), "offset", json_u64(t->offset),
                     "nbytes", json_u64(t->nbytes));
}

/* The --json document, or NULL when jansson could not build some part of it
 * (json_pack and the *_new setters consume their arguments even on failure). */
static json_t *checkpoint_json(const ckpt_checkpoint *c)
{
    json_t *files = json_array(), *tensors = json_array(), *meta = json_object();
    bool ok = files && tensors && meta;
    for (size_t i = 0; ok && i < c->nfiles; i++) {
        const st_file *f = &c->files[i];
        ok = !json_array_append_new(
            files, json_pack("{s:s, s:o, s:o}", "path", ckpt_basename(f->path), "size",
                             json_u64(f->file_size), "tensors", json_u64(f->ntensors)));
    }
    for (size_t i = 0; ok && i < c->ntensors; i++)
        ok = !json_array_append_new(tensors, tensor_json(c, &c->tensors[i]));
    const st_file *first = c->nfiles ? &c->files[0] : NULL;
    for (size_t i = 0; ok && first && i < first->nmeta; i++)
        ok = !json_object_set_new(meta, first->meta_keys[i], json_string(first->meta_vals[i]));
    if (!ok) {
        json_decref(files);
        json_decref(tensors);
        json_decref(meta);
        return NULL;
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "files", files, "tensors", tensors, "total_bytes",
                     json_u64(c->total_size), "metadata", meta);
}

/* step: an older EasyDeL save's step (easydel-optstate.structure), or NULL */
static int print_json(const ckpt_checkpoint *c, const int64_t *step)
{
    json_t *doc = checkpoint_json(c);
    if (doc && step && json_object_set_new(doc, "step", json_integer((json_int_t)*step))) {
        json_decref(doc);
        doc = NULL;
    }
    char *text = doc ? cj_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(doc);
    if (!text) return ckpt_error_set(CKPT_ENOMEM, "cannot render the listing as JSON");
    int rc = puts(text) < 0 || fflush(stdout) ? ckpt_error_sys("stdout") : 0;
    free(text);
    return rc;
}

int cmd_inspect(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        help();
        return CLI_OK;
    }
    static const int shared[] = {CLI_OPT_JSON, CLI_OPT_END};
    const char *cmd = argv[0], *path = NULL;
    cli_common common = {0};
    cli_parser p = {.cmd = cmd, .shared = shared, .common = &common};
    int opt;
    while ((opt = cli_getopt(&p, argc, argv)) > 0) {
    }
    if (opt < 0) return CLI_USAGE;
    if (p.nargs > 1) return cli_usage_error(cmd, "expected one PATH, got '%s' and '%s'", p.args[0], p.args[1]);
    if (p.nargs) path = p.args[0];
    bool as_json = common.json;
    if (!path) return cli_usage_error(cmd, "expected a PATH (a .safetensors file or a directory)");
    if (easydel_is_checkpoint(path)) return cli_inspect_easydel(path, as_json);
    if (dcp_is_checkpoint(path)) return cli_inspect_dcp(path, as_json);
    if (nxd_is_checkpoint(path)) return cli_inspect_nxd(path, as_json);
    char *legacy = easydel_legacy_weights(path); /* an older EasyDeL save: its parameters */
    ckpt_checkpoint c;
    int orc = ckpt_checkpoint_open_views(&c, legacy ? legacy : path);
    int64_t step = 0;
    bool has_step = legacy && legacy_step(path, &step);
    free(legacy);
    if (orc < 0) return cli_fail();
    int rc = as_json ? print_json(&c, has_step ? &step : NULL) : print_text(&c);
    if (!rc && !as_json && has_step) rc = printf("step %lld (%s)\n", (long long)step, EASYDEL_LEGACY_STRUCT) < 0 ? ckpt_error_sys("stdout") : 0;
    ckpt_checkpoint_close(&c);
    return rc < 0 ? cli_fail() : CLI_OK;
}
