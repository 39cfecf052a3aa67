/*
 * pickle.c — the restricted pickle machine (see pickle.h). Follows CPython's
 * Lib/pickle.py _Unpickler opcode by opcode for the opcodes it accepts, with
 * the stack of node ids and a separate stack of marks (pickle's metastack).
 */
#include "format/pickle.h"

#include "common/error.h"
#include "common/util.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    pk_doc *d;
    const pk_opts *o;
    const char *label;
    const uint8_t *buf;
    size_t len, pos, op_pos;
    uint32_t *stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks, marks_cap;
    uint32_t *memo;
    size_t nmemo, memo_cap;
    size_t max_nodes, max_stack, max_memo, max_items;
    bool truncated;
} pk_m;

const char *pk_kind_name(pk_kind k)
{
    static const char *names[] = {"None", "bool", "int", "float", "str", "bytes", "tuple", "list",
                                  "dict", "set", "global", "call", "object", "persistent id"};
    return (unsigned)k < CKPT_ARRAY_LEN(names) ? names[k] : "?";
}

static int fail(pk_m *m, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(pk_m *m, int code, const char *fmt, ...)
{
    char what[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return ckpt_error_set(code, "%s: pickle: %s at byte %zu", m->label, what, m->op_pos);
}

static int new_node(pk_m *m, pk_kind kind, uint32_t *id)
{
    pk_doc *d = m->d;
    if (d->n >= m->max_nodes) return fail(m, CKPT_ELIMIT, "more than the limit of values");
    if (d->n == d->cap && ckpt_grow(&d->nodes, &d->cap, d->n + 1, sizeof *d->nodes)) return CKPT_ENOMEM;
    memset(&d->nodes[d->n], 0, sizeof d->nodes[0]);
    d->nodes[d->n].kind = kind;
    *id = (uint32_t)d->n++;
    return 0;
}

static int push(pk_m *m, uint32_t id)
{
    if (m->sp >= m->max_stack) return fail(m, CKPT_ELIMIT, "stack deeper than the limit");
    if (m->sp == m->stack_cap && ckpt_grow(&m->stack, &m->stack_cap, m->sp + 1, sizeof *m->stack)) return CKPT_ENOMEM;
    m->stack[m->sp++] = id;
    return 0;
}

static int push_new(pk_m *m, pk_kind kind, uint32_t *id)
{
    uint32_t tmp = 0;
    int rc = new_node(m, kind, id ? id : &tmp);
    return rc ? rc : push(m, id ? *id : tmp);
}

static int pop(pk_m *m, uint32_t *id)
{
    size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
    if (m->sp <= floor) return fail(m, CKPT_EINVAL, "stack underflow (opcode 0x%02x)", m->buf[m->op_pos]);
    *id = m->stack[--m->sp];
    return 0;
}

static int top(pk_m *m, uint32_t *id)
{
    size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
    if (m->sp <= floor) return fail(m, CKPT_EINVAL, "stack underflow (opcode 0x%02x)", m->buf[m->op_pos]);
    *id = m->stack[m->sp - 1];
    return 0;
}

/* Pops the items above the last mark and the mark: *from is their start in the stack. */
static int pop_mark(pk_m *m, size_t *from)
{
    if (!m->nmarks) return fail(m, CKPT_EINVAL, "no MARK for opcode 0x%02x", m->buf[m->op_pos]);
    *from = m->marks[--m->nmarks];
    return 0;
}

static int add_item(pk_m *m, uint32_t container, uint32_t item)
{
    pk_node *c = &m->d->nodes[container];
    if (c->n >= m->max_items) return fail(m, CKPT_ELIMIT, "a container with more items than the limit");
    if (c->n == c->cap && ckpt_grow(&c->items, &c->cap, c->n + 1, sizeof *c->items)) return CKPT_ENOMEM;
    c->items[c->n++] = item;
    return 0;
}

/* A new container node holding stack[from..sp), which is then popped. */
static int make_from_stack(pk_m *m, pk_kind kind, size_t from, uint32_t *id)
{
    int rc = new_node(m, kind, id);
    for (size_t k = from; !rc && k < m->sp; k++) rc = add_item(m, *id, m->stack[k]);
    m->sp = from;
    return rc;
}

static int need(pk_m *m, size_t n, const uint8_t **p)
{
    if (m->len - m->pos < n) {
        m->truncated = true;
        if (m->op_pos >= m->len) return fail(m, CKPT_EINVAL, "truncated (no opcode)");
        return fail(m, CKPT_EINVAL, "truncated (opcode 0x%02x needs more bytes)", m->buf[m->op_pos]);
    }
    *p = m->buf + m->pos;
    m->pos += n;
    return 0;
}

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--) v = v << 8 | p[k];
    return v;
}

static int push_int(pk_m *m, int64_t v)
{
    uint32_t id = 0;
    int rc = push_new(m, PK_INT, &id);
    if (!rc) m->d->nodes[id].i = v;
    return rc;
}

static int push_string(pk_m *m, pk_kind kind, size_t n)
{
    const uint8_t *p = NULL;
    uint32_t id = 0;
    int rc = need(m, n, &p);
    if (!rc) rc = push_new(m, kind, &id);
    if (rc) return rc;
    pk_node *node = &m->d->nodes[id];
    if (!(node->s = ckpt_malloc(n + 1))) return CKPT_ENOMEM;
    memcpy(node->s, p, n);
    node->s[n] = 0;
    node->slen = n;
    return 0;
}

/* A string of n bytes whose length field is lenbytes wide. */
static int op_sized_string(pk_m *m, pk_kind kind, int lenbytes)
{
    const uint8_t *p = NULL;
    int rc = need(m, (size_t)lenbytes, &p);
    if (rc) return rc;
    uint64_t n = rd_le(p, lenbytes);
    if (n > m->len - m->pos) m->truncated = true;
    if (n > m->len - m->pos) return fail(m, CKPT_EINVAL, "a string runs past the end of the pickle");
    return push_string(m, kind, (size_t)n);
}

/* LONG1 / LONG4: two's complement little-endian. Up to 8 bytes give i; wider
 * ones (the legacy format's magic number) keep their bytes in s. */
static int op_long(pk_m *m, int lenbytes)
{
    const uint8_t *p = NULL;
    int rc = need(m, (size_t)lenbytes, &p);
    if (rc) return rc;
    uint64_t n = rd_le(p, lenbytes);
    if (n > 64) return fail(m, CKPT_ELIMIT, "an integer of %" PRIu64 " bytes (at most 64)", n);
    if ((rc = need(m, (size_t)n, &p))) return rc;
    if (n > 8) {
        m->pos -= (size_t)n;
        if ((rc = push_string(m, PK_INT, (size_t)n))) return rc;
        return 0;
    }
    uint64_t v = n ? rd_le(p, (int)n) : 0;
    if (n && n < 8 && (p[n - 1] & 0x80)) v |= ~0ULL << (8 * n);
    return push_int(m, (int64_t)v);
}

/* A text line (GLOBAL, PUT, GET): up to '\n', without it. */
static int read_line(pk_m *m, const char **s, size_t *n)
{
    const uint8_t *start = m->buf + m->pos, *nl = memchr(start, '\n', m->len - m->pos);
    if (!nl) m->truncated = true;
    if (!nl) return fail(m, CKPT_EINVAL, "unterminated text argument (opcode 0x%02x)", m->buf[m->op_pos]);
    *s = (const char *)start;
    *n = (size_t)(nl - start);
    m->pos += *n + 1;
    return 0;
}

static int resolve_global(pk_m *m, const char *mod, size_t mlen, const char *name, size_t nlen)
{
    char full[512];
    if (mlen + nlen + 2 > sizeof full || memchr(mod, 0, mlen) || memchr(name, 0, nlen))
        return fail(m, CKPT_EINVAL, "a global with an overlong or NUL name");
    snprintf(full, sizeof full, "%.*s.%.*s", (int)mlen, mod, (int)nlen, name);
    for (size_t i = 0; i < m->o->nallow; i++) {
        const pk_global_def *g = &m->o->allow[i];
        if (strlen(g->module) == mlen && strlen(g->name) == nlen && !memcmp(g->module, mod, mlen) && !memcmp(g->name, name, nlen)) {
            uint32_t id;
            int rc = push_new(m, PK_GLOBAL, &id);
            if (rc) return rc;
            pk_node *node = &m->d->nodes[id];
            node->tag = g->tag;
            node->i = (int64_t)i; /* the allow-list entry */
            node->s = ckpt_strdup(full);
            node->slen = node->s ? strlen(node->s) : 0;
            return node->s ? 0 : CKPT_ENOMEM;
        }
    }
    return fail(m, CKPT_EINVAL, "global '%s' is not allowed (nothing is imported or called)", full);
}

static int op_global(pk_m *m)
{
    const char *mod, *name;
    size_t mlen = 0, nlen = 0;
    int rc = read_line(m, &mod, &mlen);
    if (!rc) rc = read_line(m, &name, &nlen);
    return rc ? rc : resolve_global(m, mod, mlen, name, nlen);
}

static int op_stack_global(pk_m *m)
{
    uint32_t a = 0, b = 0;
    int rc = pop(m, &b);
    if (!rc) rc = pop(m, &a);
    if (rc) return rc;
    const pk_node *mod = &m->d->nodes[a], *name = &m->d->nodes[b];
    if (mod->kind != PK_STR || name->kind != PK_STR) return fail(m, CKPT_EINVAL, "STACK_GLOBAL of non-strings");
    return resolve_global(m, mod->s, mod->slen, name->s, name->slen);
}

static const pk_global_def *global_def(pk_m *m, const pk_node *g)
{
    return g->kind == PK_GLOBAL ? &m->o->allow[g->i] : NULL;
}

/* _codecs.encode(str, "latin1"): the code points (all < 256) as bytes. */
static int encode_latin1(pk_m *m, const pk_node *args, uint32_t *out)
{
    const pk_node *s = args->n == 2 ? &m->d->nodes[args->items[0]] : NULL;
    const pk_node *enc = args->n == 2 ? &m->d->nodes[args->items[1]] : NULL;
    if (!s || s->kind != PK_STR || enc->kind != PK_STR || (strcmp(enc->s, "latin1") && strcmp(enc->s, "latin-1")))
        return fail(m, CKPT_EINVAL, "_codecs.encode takes (str, 'latin1') here");
    char *bytes = ckpt_malloc(s->slen + 1);
    if (!bytes) return CKPT_ENOMEM;
    size_t n = 0;
    for (size_t k = 0; k < s->slen; k++) {
        uint8_t c = (uint8_t)s->s[k];
        if (c < 0x80) {
            bytes[n++] = (char)c;
        } else if ((c == 0xC2 || c == 0xC3) && k + 1 < s->slen && ((uint8_t)s->s[k + 1] & 0xC0) == 0x80) {
            bytes[n++] = (char)(((c & 0x1F) << 6) | ((uint8_t)s->s[++k] & 0x3F));
        } else {
            free(bytes);
            return fail(m, CKPT_EINVAL, "_codecs.encode of a character above U+00FF");
        }
    }
    int rc = new_node(m, PK_BYTES, out);
    if (rc) {
        free(bytes);
        return rc;
    }
    m->d->nodes[*out].s = bytes;
    m->d->nodes[*out].slen = n;
    return 0;
}

/* A PK_OBJ record {cls, args, None}: what NEWOBJ of a PKG_RECORD class and
 * REDUCE of a PKG_REDUCE_RECORD global give; BUILD may set its state once. */
static int make_record(pk_m *m, uint32_t cid, uint32_t aid, uint32_t *id)
{
    uint32_t none = 0;
    int rc = new_node(m, PK_OBJ, id);
    if (!rc) rc = new_node(m, PK_NONE, &none);
    if (!rc) rc = add_item(m, *id, cid);
    if (!rc) rc = add_item(m, *id, aid);
    if (!rc) rc = add_item(m, *id, none);
    return rc;
}

static int op_reduce(pk_m *m)
{
    uint32_t fid = 0, aid = 0, id = 0;
    int rc = pop(m, &aid);
    if (!rc) rc = pop(m, &fid);
    if (rc) return rc;
    const pk_node *f = &m->d->nodes[fid], *args = &m->d->nodes[aid];
    const pk_global_def *g = global_def(m, f);
    if (!g) return fail(m, CKPT_EINVAL, "REDUCE calls a %s, not an allowed global", pk_kind_name(f->kind));
    if (args->kind != PK_TUPLE) return fail(m, CKPT_EINVAL, "REDUCE of '%s' without an argument tuple", f->s);
    switch (g->kind) {
    case PKG_CALL:
        rc = new_node(m, PK_CALL, &id);
        if (!rc) rc = add_item(m, id, fid);
        if (!rc) rc = add_item(m, id, aid);
        break;
    case PKG_DICT:
        if (args->n) return fail(m, CKPT_EINVAL, "'%s' takes no arguments here", f->s);
        rc = new_node(m, PK_DICT, &id);
        break;
    case PKG_SET: {
        uint32_t lid = args->n == 1 ? args->items[0] : 0;
        const pk_node *l = args->n == 1 ? &m->d->nodes[lid] : NULL;
        if (args->n > 1 || (l && l->kind != PK_LIST && l->kind != PK_TUPLE))
            return fail(m, CKPT_EINVAL, "'%s' takes () or (list,) here", f->s);
        size_t nl = l ? l->n : 0;
        rc = new_node(m, PK_SET, &id); /* may move the nodes: l, f, args are stale below */
        for (size_t k = 0; !rc && k < nl; k++) rc = add_item(m, id, m->d->nodes[lid].items[k]);
        break;
    }
    case PKG_ENCODE:
        rc = encode_latin1(m, args, &id);
        break;
    case PKG_TUPLE:
        if (args->n != 1 || m->d->nodes[args->items[0]].kind != PK_TUPLE)
            return fail(m, CKPT_EINVAL, "'%s' takes (tuple,) here", f->s);
        id = args->items[0];
        break;
    case PKG_REDUCE_RECORD:
        rc = make_record(m, fid, aid, &id);
        break;
    default:
        return fail(m, CKPT_EINVAL, "global '%s' may not be called (REDUCE)", f->s);
    }
    return rc ? rc : push(m, id);
}

static int op_newobj(pk_m *m, bool ex)
{
    uint32_t cid, aid, kid = 0, id;
    int rc = ex ? pop(m, &kid) : 0;
    if (!rc) rc = pop(m, &aid);
    if (!rc) rc = pop(m, &cid);
    if (rc) return rc;
    const pk_node *cls = &m->d->nodes[cid];
    const pk_global_def *g = global_def(m, cls);
    if (!g || g->kind != PKG_RECORD)
        return fail(m, CKPT_EINVAL, "NEWOBJ of '%s', which is not an allowed record class", g ? cls->s : pk_kind_name(cls->kind));
    if (m->d->nodes[aid].kind != PK_TUPLE || (ex && m->d->nodes[kid].kind != PK_DICT))
        return fail(m, CKPT_EINVAL, "NEWOBJ of '%s' with malformed arguments", cls->s);
    rc = make_record(m, cid, aid, &id);
    return rc ? rc : push(m, id);
}

static int op_build(pk_m *m)
{
    uint32_t sid = 0, oid = 0;
    int rc = pop(m, &sid);
    if (!rc) rc = top(m, &oid);
    if (rc) return rc;
    pk_node *obj = &m->d->nodes[oid];
    if (obj->kind == PK_DICT) return 0; /* an OrderedDict's instance dict (state_dict._metadata): dropped */
    if (obj->kind == PK_OBJ && m->d->nodes[obj->items[2]].kind == PK_NONE) {
        pk_kind sk = m->d->nodes[sid].kind;
        if (sk != PK_DICT && sk != PK_TUPLE)
            return fail(m, CKPT_EINVAL, "BUILD of a record with a %s state", pk_kind_name(sk));
        obj->items[2] = sid;
        return 0;
    }
    const char *what = obj->kind == PK_CALL ? m->d->nodes[obj->items[0]].s : pk_kind_name(obj->kind);
    return fail(m, CKPT_EINVAL, "BUILD (__setstate__) on '%s' is not allowed", what);
}

static int memo_put(pk_m *m, uint64_t idx)
{
    uint32_t id = 0;
    int rc = top(m, &id);
    if (rc) return rc;
    if (idx > m->nmemo) return fail(m, CKPT_EINVAL, "memo index out of order");
    if (idx == m->nmemo) {
        if (m->nmemo >= m->max_memo) return fail(m, CKPT_ELIMIT, "more memo entries than the limit");
        if (m->nmemo == m->memo_cap && ckpt_grow(&m->memo, &m->memo_cap, m->nmemo + 1, sizeof *m->memo)) return CKPT_ENOMEM;
        m->nmemo++;
    }
    m->memo[idx] = id;
    return 0;
}

static int memo_get(pk_m *m, uint64_t idx)
{
    if (idx >= m->nmemo) return fail(m, CKPT_EINVAL, "memo entry not defined");
    return push(m, m->memo[idx]);
}

static int text_index(pk_m *m, uint64_t *idx)
{
    const char *s;
    size_t n = 0;
    int rc = read_line(m, &s, &n);
    if (rc) return rc;
    *idx = 0;
    if (n == 0 || n > 9) return fail(m, CKPT_EINVAL, "bad memo index text");
    for (size_t k = 0; k < n; k++) {
        if (s[k] < '0' || s[k] > '9') return fail(m, CKPT_EINVAL, "bad memo index text");
        *idx = *idx * 10 + (uint64_t)(s[k] - '0');
    }
    return 0;
}

/* APPEND(S), ADDITEMS: items onto a list (or a set). */
static int extend(pk_m *m, size_t from, pk_kind want)
{
    if (from == 0 || from > m->sp) return fail(m, CKPT_EINVAL, "no container for opcode 0x%02x", m->buf[m->op_pos]);
    uint32_t target = m->stack[from - 1];
    if (m->d->nodes[target].kind != want)
        return fail(m, CKPT_EINVAL, "adding items to a %s", pk_kind_name(m->d->nodes[target].kind));
    int rc = 0;
    for (size_t k = from; !rc && k < m->sp; k++) rc = add_item(m, target, m->stack[k]);
    m->sp = from;
    return rc;
}

static int setitems(pk_m *m, size_t from)
{
    if (from == 0 || from > m->sp || (m->sp - from) % 2)
        return fail(m, CKPT_EINVAL, "SETITEMS without a dict and key/value pairs");
    uint32_t target = m->stack[from - 1];
    if (m->d->nodes[target].kind != PK_DICT)
        return fail(m, CKPT_EINVAL, "setting items on a %s", pk_kind_name(m->d->nodes[target].kind));
    int rc = 0;
    for (size_t k = from; !rc && k < m->sp; k++) rc = add_item(m, target, m->stack[k]);
    m->sp = from;
    return rc;
}

static int push_mark(pk_m *m)
{
    if (m->nmarks >= m->max_stack) return fail(m, CKPT_ELIMIT, "more marks than the limit");
    if (m->nmarks == m->marks_cap && ckpt_grow(&m->marks, &m->marks_cap, m->nmarks + 1, sizeof *m->marks)) return CKPT_ENOMEM;
    m->marks[m->nmarks++] = m->sp;
    return 0;
}

static int tuple_n(pk_m *m, size_t n)
{
    size_t floor = m->nmarks ? m->marks[m->nmarks - 1] : 0;
    if (m->sp - floor < n) return fail(m, CKPT_EINVAL, "stack underflow (opcode 0x%02x)", m->buf[m->op_pos]);
    uint32_t id = 0;
    int rc = make_from_stack(m, PK_TUPLE, m->sp - n, &id);
    return rc ? rc : push(m, id);
}

/* One opcode; *stop set at STOP. */
static int step(pk_m *m, bool *stop)
{
    const uint8_t *p = NULL;
    uint32_t id = 0, a = 0;
    size_t from = 0;
    uint64_t idx = 0;
    int rc;
    m->op_pos = m->pos;
    if ((rc = need(m, 1, &p))) return fail(m, CKPT_EINVAL, "no STOP before the end of the data");
    uint8_t op = *p;
    switch (op) {
    case 0x80: /* PROTO */
        if ((rc = need(m, 1, &p))) return rc;
        if (*p < 2 || *p > 5) return fail(m, CKPT_EINVAL, "protocol %u is not one of 2-5", *p);
        return 0;
    case 0x95: /* FRAME: a length hint only */
        return need(m, 8, &p);
    case '.':
        *stop = true;
        return 0;
    case '(':
        return push_mark(m);
    case ')':
        return push_new(m, PK_TUPLE, NULL);
    case 't':
        if ((rc = pop_mark(m, &from))) return rc;
        if ((rc = make_from_stack(m, PK_TUPLE, from, &id))) return rc;
        return push(m, id);
    case 0x85:
    case 0x86:
    case 0x87:
        return tuple_n(m, (size_t)(op - 0x84));
    case ']':
        return push_new(m, PK_LIST, NULL);
    case 'l':
        if ((rc = pop_mark(m, &from))) return rc;
        if ((rc = make_from_stack(m, PK_LIST, from, &id))) return rc;
        return push(m, id);
    case 'a':
        if ((rc = pop(m, &a))) return rc;
        if ((rc = top(m, &id))) return rc;
        if (m->d->nodes[id].kind != PK_LIST) return fail(m, CKPT_EINVAL, "APPEND to a %s", pk_kind_name(m->d->nodes[id].kind));
        return add_item(m, id, a);
    case 'e':
        if ((rc = pop_mark(m, &from))) return rc;
        return extend(m, from, PK_LIST);
    case '}':
        return push_new(m, PK_DICT, NULL);
    case 'd':
        if ((rc = pop_mark(m, &from))) return rc;
        if ((m->sp - from) % 2) return fail(m, CKPT_EINVAL, "DICT with an odd number of items");
        if ((rc = make_from_stack(m, PK_DICT, from, &id))) return rc;
        return push(m, id);
    case 's':
        if (m->sp < 3 + (m->nmarks ? m->marks[m->nmarks - 1] : 0))
            return fail(m, CKPT_EINVAL, "stack underflow (opcode 0x%02x)", op);
        return setitems(m, m->sp - 2);
    case 'u':
        if ((rc = pop_mark(m, &from))) return rc;
        return setitems(m, from);
    case 0x8f: /* EMPTY_SET */
        return push_new(m, PK_SET, NULL);
    case 0x90: /* ADDITEMS */
        if ((rc = pop_mark(m, &from))) return rc;
        return extend(m, from, PK_SET);
    case 0x91: /* FROZENSET */
        if ((rc = pop_mark(m, &from))) return rc;
        if ((rc = make_from_stack(m, PK_SET, from, &id))) return rc;
        return push(m, id);
    case 'N':
        return push_new(m, PK_NONE, NULL);
    case 0x88:
    case 0x89:
        if ((rc = push_new(m, PK_BOOL, &id))) return rc;
        m->d->nodes[id].i = op == 0x88;
        return 0;
    case 'J':
        if ((rc = need(m, 4, &p))) return rc;
        return push_int(m, (int32_t)(uint32_t)rd_le(p, 4));
    case 'K':
        if ((rc = need(m, 1, &p))) return rc;
        return push_int(m, *p);
    case 'M':
        if ((rc = need(m, 2, &p))) return rc;
        return push_int(m, (int64_t)rd_le(p, 2));
    case 0x8a:
        return op_long(m, 1);
    case 0x8b:
        return op_long(m, 4);
    case 'G': {
        if ((rc = need(m, 8, &p))) return rc;
        uint64_t bits = 0;
        for (int k = 0; k < 8; k++) bits = bits << 8 | p[k];
        double f;
        memcpy(&f, &bits, sizeof f);
        if ((rc = push_new(m, PK_FLOAT, &id))) return rc;
        m->d->nodes[id].f = f;
        return 0;
    }
    case 'X':
        return op_sized_string(m, PK_STR, 4);
    case 0x8c:
        return op_sized_string(m, PK_STR, 1);
    case 0x8d:
        return op_sized_string(m, PK_STR, 8);
    case 'T': /* BINSTRING (Python 2 str), read as text */
        return op_sized_string(m, PK_STR, 4);
    case 'U':
        return op_sized_string(m, PK_STR, 1);
    case 'C':
        return op_sized_string(m, PK_BYTES, 1);
    case 'B':
        return op_sized_string(m, PK_BYTES, 4);
    case 0x8e:
    case 0x96: /* BYTEARRAY8 */
        return op_sized_string(m, PK_BYTES, 8);
    case 'q':
        if ((rc = need(m, 1, &p))) return rc;
        return memo_put(m, *p);
    case 'r':
        if ((rc = need(m, 4, &p))) return rc;
        return memo_put(m, rd_le(p, 4));
    case 'p':
        if ((rc = text_index(m, &idx))) return rc;
        return memo_put(m, idx);
    case 0x94: /* MEMOIZE */
        return memo_put(m, m->nmemo);
    case 'h':
        if ((rc = need(m, 1, &p))) return rc;
        return memo_get(m, *p);
    case 'j':
        if ((rc = need(m, 4, &p))) return rc;
        return memo_get(m, rd_le(p, 4));
    case 'g':
        if ((rc = text_index(m, &idx))) return rc;
        return memo_get(m, idx);
    case 'c':
        return op_global(m);
    case 0x93:
        return op_stack_global(m);
    case 'R':
        return op_reduce(m);
    case 'b':
        return op_build(m);
    case 0x81:
        return op_newobj(m, false);
    case 0x92:
        return op_newobj(m, true);
    case 'Q':
        if (!m->o->allow_persid) return fail(m, CKPT_EINVAL, "persistent ids are not expected here");
        if ((rc = pop(m, &a))) return rc;
        if ((rc = new_node(m, PK_PERSID, &id))) return rc;
        if ((rc = add_item(m, id, a))) return rc;
        return push(m, id);
    case '0':
        return pop(m, &a);
    case '1':
        if ((rc = pop_mark(m, &from))) return rc;
        m->sp = from;
        return 0;
    case '2':
        if ((rc = top(m, &id))) return rc;
        return push(m, id);
    default:
        return fail(m, CKPT_EINVAL, "opcode 0x%02x is not supported (nothing outside plain data is)", op);
    }
}

static size_t or_default(size_t v, size_t d) { return v ? v : d; }

int pk_parse(pk_doc *d, const char *label, const uint8_t *buf, size_t len, const pk_opts *o)
{
    memset(d, 0, sizeof *d);
    pk_m m = {.d = d, .o = o, .label = label, .buf = buf, .len = len};
    m.max_nodes = or_default(o->limits.max_nodes, (size_t)1 << 24);
    m.max_stack = or_default(o->limits.max_stack, (size_t)1 << 20);
    m.max_memo = or_default(o->limits.max_memo, (size_t)1 << 24);
    m.max_items = or_default(o->limits.max_items, (size_t)1 << 24);
    bool stop = false;
    int rc = 0;
    while (!rc && !stop) rc = step(&m, &stop);
    if (!rc && (m.sp != 1 || m.nmarks))
        rc = ckpt_error_set(CKPT_EINVAL, "%s: pickle: STOP with %zu values and %zu marks on the stack, expected 1 and 0", label,
                            m.sp, m.nmarks);
    if (!rc) {
        d->root = m.stack[0];
        d->consumed = m.pos;
    }
    free(m.stack);
    free(m.marks);
    free(m.memo);
    if (rc) {
        pk_free(d);
        d->truncated = m.truncated;
    }
    return rc;
}

void pk_free(pk_doc *d)
{
    for (size_t i = 0; i < d->n; i++) {
        free(d->nodes[i].s);
        free(d->nodes[i].items);
    }
    free(d->nodes);
    memset(d, 0, sizeof *d);
}

const pk_node *pk_dict_get(const pk_doc *d, const pk_node *dict, const char *key)
{
    for (size_t k = 0; dict->kind == PK_DICT && k + 1 < dict->n; k += 2) {
        const pk_node *kn = pk_item(d, dict, k);
        if (kn->kind == PK_STR && !strcmp(kn->s, key)) return pk_item(d, dict, k + 1);
    }
    return NULL;
}
