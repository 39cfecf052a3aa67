/*
 * easydel_tree.h — the optimizer structure of an older EasyDeL save,
 * `easydel-optstate.structure` (docs/easydel.md, "The older save"), read as
 * data on the restricted pickle machine (format/pickle.h): nothing is
 * imported or called.
 *
 * EasyDeLState.save_state (easydel/infra/base_state.py, January–August 2025)
 * wrote `pickle.dump(jax.tree_util.tree_structure(opt_state))`, later
 * `pickle.dump((tree_structure(opt_state), self.step))`; the leaves of
 * opt_state went to easydel-optstate.parameters as "param_{i}" (later
 * "param_idx_{i}") in the same order.
 *
 * A PyTreeDef pickles (jaxlib pytree.cc, PyTreeDef::ToPickle and the
 * __getstate__/__setstate__ of BuildPytreeSubmodule) as NEWOBJ of the class
 * `jaxlib.xla_extension.pytree.PyTreeDef` (jaxlib._jax.pytree from jax 0.6.1)
 * with no arguments, then BUILD of (registry, traversal): the registry is
 * `jax._src.tree_util.default_registry` (a global), the traversal a list of
 * one 6-tuple per node in post-order, children before their parent:
 *   (kind, arity, node_data, custom type, num_leaves, num_nodes)
 * kind: 0 leaf, 1 None, 2 tuple, 3 namedtuple (node_data: the class),
 * 4 list, 5 dict (node_data: the sorted keys), 6 custom (node_data: what
 * the class's flatten returned; custom type: the class), 7 dataclass.
 *
 * Accepted classes (each a global of the reader's own allow-list, a record,
 * never constructed): optax's state namedtuples (their field names are known
 * here, e.g. ScaleByAdamState = count, mu, nu), flax nnx's State (keys: the
 * sorted keys of the mapping) and Variable / VariableState (one child, the
 * value: no key component), flax's FrozenDict; for the step, an int or a
 * jax.Array / numpy array or scalar of an integer dtype
 * (jax._src.array._reconstruct_array, numpy's _reconstruct, ndarray, dtype,
 * scalar). Anything else is refused naming it.
 *
 * Each leaf gets its key path, the components joined with '.' (a tuple or
 * list index, a namedtuple field, a dict or State key): "0.mu.model.layers.0.mlp.up_proj.kernel".
 * param_at is where, in that key, the path below the outermost State /
 * FrozenDict node starts (the parameter's own key), or EDTREE_NO_PARAM.
 */
#ifndef CKPT_FORMAT_EASYDEL_TREE_H
#define CKPT_FORMAT_EASYDEL_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EASYDEL_LEGACY_OPT "easydel-optstate.parameters"
#define EASYDEL_LEGACY_OPT_INDEX "easydel-optstate.parameters.safetensors.index.json"
#define EASYDEL_LEGACY_STRUCT "easydel-optstate.structure"

#define EDTREE_MAX_FILE_BYTES (64u << 20)
#define EDTREE_MAX_NODES (1u << 21)
#define EDTREE_MAX_DEPTH 64
#define EDTREE_MAX_KEY 1024                 /* bytes of one leaf's key path */
#define EDTREE_MAX_KEY_TOTAL (64u << 20)    /* bytes of all of them */
#define EDTREE_NO_PARAM ((size_t)-1)

typedef struct {
    char *key;
    size_t param_at;
} edtree_leaf;

typedef struct {
    size_t nleaves;
    edtree_leaf *leaves; /* in tree order: leaf i is "param_{i}" */
    bool has_step;
    int64_t step;
} edtree;

/* Reads a structure pickle at buf[0..len); label names it in errors. */
int edtree_parse(edtree *t, const char *label, const uint8_t *buf, size_t len);
/* Reads the file at path (at most EDTREE_MAX_FILE_BYTES). */
int edtree_read(edtree *t, const char *path);
void edtree_free(edtree *t);

#endif
