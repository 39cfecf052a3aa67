/*
 * pickle.h — a restricted pickle machine: it reads the pickles torch.save
 * writes (protocols 2–5) into a tree of plain values and never imports,
 * calls or executes anything.
 *
 * What a pickle may name is decided by the caller's allow-list: GLOBAL and
 * STACK_GLOBAL resolve "module.name" against it, and anything else is refused
 * at once with an error naming the global, the byte and the file:
 *   "model.bin: data.pkl: global 'os.system' at byte 2 is not allowed (nothing is imported or called)"
 * An allowed global only becomes a value of the tree; what it means is
 * decided by its kind:
 *   PKG_VALUE   a constant (torch.float16, torch.FloatStorage): a PK_GLOBAL node
 *   PKG_CALL    a function (torch._utils._rebuild_tensor_v2): REDUCE gives a
 *               PK_CALL node {func, args} — recorded, never called; the
 *               caller interprets it
 *   PKG_DICT    collections.OrderedDict, builtins.dict: REDUCE with () gives an empty PK_DICT
 *   PKG_SET     builtins.set / frozenset: REDUCE with () or (list,) gives a PK_SET
 *   PKG_ENCODE  _codecs.encode(str, "latin1"): how protocol 2 pickles bytes: PK_BYTES
 *   PKG_TUPLE   torch.Size(tuple): the tuple
 *   PKG_RECORD  a class taken as a plain record: NEWOBJ gives a PK_OBJ node
 *               {cls, args, state}, BUILD sets its state (a dict) once
 *   PKG_REDUCE_RECORD  a callable taken as a record the same way: REDUCE
 *               gives the PK_OBJ node {func, args, state} (numpy.dtype('i4',
 *               False, True) then BUILD of its state) — nothing is called
 * BUILD (__setstate__) is accepted on a PK_DICT (an OrderedDict's instance
 * dict, e.g. a state_dict's _metadata, which is dropped) and once on a
 * PK_OBJ record; on anything else it is refused. Persistent ids (BINPERSID)
 * become PK_PERSID nodes {pid} when the caller allows them.
 *
 * Opcodes: everything protocols 2–5 produce for plain data (including FRAME,
 * MEMOIZE, STACK_GLOBAL, the 8-byte strings, sets); refused: INST, OBJ, the
 * extension registry (EXT1/2/4), out-of-band buffers, and the text opcodes of
 * protocol 0 except GLOBAL, PUT and GET. Limits: every node, stack slot, mark,
 * memo entry and container item counts against pk_limits; memo indexes must be
 * written in order (as Python's pickler does), so a memo cannot be grown by a
 * large index. The machine is iterative: nesting depth costs no C stack, and
 * callers walking the tree bound their own recursion (a pickle may make cycles
 * through the memo).
 */
#ifndef CKPT_FORMAT_PICKLE_H
#define CKPT_FORMAT_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    PK_NONE,
    PK_BOOL,
    PK_INT,   /* i; an integer wider than 64 bits has s (NULL otherwise): its little-endian bytes */
    PK_FLOAT, /* f */
    PK_STR,   /* s, slen: UTF-8 as pickled, NUL-terminated */
    PK_BYTES, /* s, slen */
    PK_TUPLE, /* items */
    PK_LIST,
    PK_DICT,    /* items: key, value, key, value ... (n is twice the pairs) */
    PK_SET,     /* items */
    PK_GLOBAL,  /* tag, module, name (s = "module.name") */
    PK_CALL,    /* items: {global, args tuple} */
    PK_OBJ,     /* items: {cls global, args tuple, state or PK_NONE} */
    PK_PERSID,  /* items: {pid} */
} pk_kind;

typedef enum { PKG_VALUE, PKG_CALL, PKG_DICT, PKG_SET, PKG_ENCODE, PKG_TUPLE, PKG_RECORD, PKG_REDUCE_RECORD } pk_gkind;

typedef struct {
    const char *module, *name;
    pk_gkind kind;
    int tag; /* the caller's meaning, copied to the PK_GLOBAL node */
} pk_global_def;

typedef struct {
    size_t max_nodes;      /* 0: 1 << 24 */
    size_t max_stack;      /* 0: 1 << 20 (stack slots and marks) */
    size_t max_memo;       /* 0: 1 << 24 */
    size_t max_items;      /* 0: 1 << 24 (items of one container) */
} pk_limits;

typedef struct {
    pk_kind kind;
    int tag;
    int64_t i;
    double f;
    char *s;
    size_t slen;
    uint32_t *items;
    size_t n, cap;
} pk_node;

typedef struct {
    pk_node *nodes;
    size_t n, cap;
    uint32_t root;
    size_t consumed; /* bytes up to and including STOP */
    bool truncated;  /* after a failure: the data ended before STOP (more bytes may help) */
} pk_doc;

typedef struct {
    const pk_global_def *allow;
    size_t nallow;
    bool allow_persid;
    pk_limits limits;
} pk_opts;

/* Runs the pickle at buf[0..len) up to its STOP. `label` names it in errors
 * ("model.bin: data.pkl"). On failure *d is left empty but for d->truncated. */
int pk_parse(pk_doc *d, const char *label, const uint8_t *buf, size_t len, const pk_opts *o);
void pk_free(pk_doc *d);

static inline const pk_node *pk_at(const pk_doc *d, uint32_t id) { return &d->nodes[id]; }
/* Item k of a container node (k < n). */
static inline const pk_node *pk_item(const pk_doc *d, const pk_node *n, size_t k) { return &d->nodes[n->items[k]]; }
/* The value of string key `key` in a PK_DICT node, or NULL (also when
 * `dict` is not a dict). */
const pk_node *pk_dict_get(const pk_doc *d, const pk_node *dict, const char *key);
/* A readable name of a kind ("tuple", "dict", ...). */
const char *pk_kind_name(pk_kind k);

#endif
