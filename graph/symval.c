/*
 * symval.c: the symbolic contents of shape tensors. Shape(x) of a value
 * with symbolic dims holds those symbols; Gather, Concat, Slice, Unsqueeze,
 * arithmetic and the rest of an exporter's shape computation move them
 * along; Reshape, Expand, ConstantOfShape and Tile turn them back into
 * dims. Shape inference (shape.c) runs these on the way and keeps the
 * result on the value (kf_value.symval); elements all constant are handed
 * on as an ordinary constant, so every shape function sees them.
 */
#include <string.h>

#include "kf_ref.h"
#include "kf_sym.h"

bool kf_symvec_equal(const kf_symvec *a, const kf_symvec *b) {
    if (a->rank != b->rank || a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (a->e[i].sym != b->e[i].sym || (!a->e[i].sym && a->e[i].v != b->e[i].v)) return false;
    return true;
}

bool kf_symvec_const(const kf_symvec *s) {
    for (int i = 0; i < s->n; i++)
        if (s->e[i].sym) return false;
    return true;
}

/* Input i as a vector: its symbolic contents, or a small integer (or
 * boolean) constant. */
static bool vec_of(const kf_tensor *const *in, const kf_symvec *const *sv, int nin, int i, kf_symvec *v) {
    if (i >= nin) return false;
    if (sv[i]) {
        *v = *sv[i];
        return true;
    }
    const kf_tensor *t = in[i];
    if (!t || t->rank > 1 || t->numel > KF_SYMVEC_MAX) return false;
    if (!kf_dtype_is_int(t->dtype) && t->dtype != KF_DT_BOOL) return false;
    v->rank = t->rank;
    v->n = (int)t->numel;
    for (int k = 0; k < v->n; k++) v->e[k] = kf_sdim_const(kf_get_i64(t, k));
    return true;
}

/* A constant integer operand's values (axes, indices, slice bounds). */
static bool ints_of(const kf_tensor *t, int64_t *out, int max, int *n) {
    if (!t || !kf_dtype_is_int(t->dtype) || t->numel > max || t->rank > 1) return false;
    *n = (int)t->numel;
    for (int k = 0; k < *n; k++) out[k] = kf_get_i64(t, k);
    return true;
}

typedef kf_sdim (*binop)(kf_graph *, kf_sdim, kf_sdim);

/* ONNX integer Div truncates; on dims (non-negative) that is the floor. */
static kf_sdim div_trunc(kf_graph *g, kf_sdim a, kf_sdim b) {
    if (a.sym == 0 && b.sym == 0 && kf_sdim_known(a) && kf_sdim_known(b)) {
        if (b.v == 0 || (a.v == INT64_MIN && b.v == -1)) return kf_sdim_unknown();
        return kf_sdim_const(a.v / b.v);
    }
    if (!kf_sdim_nonneg(g, a) || !kf_sdim_nonneg(g, b)) return kf_sdim_unknown();
    return kf_sdim_div(g, a, b);
}

static kf_sdim max_of(kf_graph *g, kf_sdim a, kf_sdim b) {
    if (kf_sdim_eq(a, b)) return a;
    if (a.sym == 0 && b.sym == 0 && kf_sdim_known(a) && kf_sdim_known(b)) return a.v > b.v ? a : b;
    if (b.sym == 0 && kf_sdim_known(b) && b.v <= 0 && kf_sdim_nonneg(g, a)) return a;
    if (a.sym == 0 && kf_sdim_known(a) && a.v <= 0 && kf_sdim_nonneg(g, b)) return b;
    return kf_sdim_unknown();
}

static kf_sdim min_of(kf_graph *g, kf_sdim a, kf_sdim b) {
    if (kf_sdim_eq(a, b)) return a;
    if (a.sym == 0 && b.sym == 0 && kf_sdim_known(a) && kf_sdim_known(b)) return a.v < b.v ? a : b;
    if (b.sym == 0 && kf_sdim_known(b) && b.v <= 0 && kf_sdim_nonneg(g, a)) return b;
    if (a.sym == 0 && kf_sdim_known(a) && a.v <= 0 && kf_sdim_nonneg(g, b)) return a;
    return kf_sdim_unknown();
}

/* 1 or 0 when decidable: equal symbols, two constants, or a dim against a
 * negative constant (Reshape's -1 in PyTorch's Where(Equal(shape, -1))). */
static kf_sdim equal_of(kf_graph *g, kf_sdim a, kf_sdim b) {
    if (!kf_sdim_known(a) || !kf_sdim_known(b)) return kf_sdim_unknown();
    if (kf_sdim_eq(a, b)) return kf_sdim_const(1);
    if (a.sym == 0 && b.sym == 0) return kf_sdim_const(0);
    kf_sdim s = a.sym ? a : b, c = a.sym ? b : a;
    if (c.sym == 0 && c.v < 0 && kf_sdim_nonneg(g, s)) return kf_sdim_const(0);
    return kf_sdim_unknown();
}

/* Elementwise f over two vectors with numpy broadcasting of [1]/[] against
 * [n]. */
static bool zip(kf_graph *g, const kf_symvec *a, const kf_symvec *b, binop f, kf_symvec *out) {
    if (a->n != b->n && a->n != 1 && b->n != 1) return false;
    out->rank = a->rank > b->rank ? a->rank : b->rank;
    out->n = a->n > b->n ? a->n : b->n;
    for (int k = 0; k < out->n; k++) out->e[k] = f(g, a->e[a->n == 1 ? 0 : k], b->e[b->n == 1 ? 0 : k]);
    return true;
}

static bool any_known(const kf_symvec *s) {
    for (int i = 0; i < s->n; i++)
        if (kf_sdim_known(s->e[i])) return true;
    return false;
}

/* Clamped [start, end) of Slice along a length-n axis for step > 0, or
 * the walk for step < 0, as the ONNX reference computes it. */
static int slice_pick(int64_t n, int64_t start, int64_t end, int64_t step, int *idx, int max) {
    if (start < 0) start += n;
    if (end < 0) end += n;
    int cnt = 0;
    if (step > 0) {
        if (start < 0) start = 0;
        if (start > n) start = n;
        if (end < 0) end = 0;
        if (end > n) end = n;
        for (int64_t i = start; i < end && cnt < max; i += step) idx[cnt++] = (int)i;
    } else {
        if (start < 0) start = -1;
        if (start > n - 1) start = n - 1;
        if (end < -1) end = -1;
        if (end > n - 1) end = n - 1;
        for (int64_t i = start; i > end && cnt < max; i += step) idx[cnt++] = (int)i;
    }
    return cnt;
}

bool kf_symvec_node(kf_graph *g, const kf_node *n, const kf_type *const *tin, const kf_tensor *const *in,
                    const kf_symvec *const *sv, kf_symvec *out) {
    memset(out, 0, sizeof *out);
    int nin = kf_node_onnx_nin(n);
    kf_symvec a, b, c;
    switch (n->op) {
    case KF_OP_SHAPE: {
        const kf_type *x = nin >= 1 ? tin[0] : NULL;
        if (!x || x->rank < 0) return false;
        int64_t r = x->rank, lo = kf_attr_i(n, "start", 0), hi = kf_attr_i(n, "end", r);
        if (lo < 0) lo += r;
        if (hi < 0) hi += r;
        lo = lo < 0 ? 0 : lo > r ? r : lo;
        hi = hi < 0 ? 0 : hi > r ? r : hi;
        out->rank = 1;
        for (int64_t d = lo; d < hi; d++) out->e[out->n++] = kf_type_sdim(x, (int)d);
        break;
    }
    case KF_OP_SIZE: {
        const kf_type *x = nin >= 1 ? tin[0] : NULL;
        if (!x || x->rank < 0) return false;
        kf_sdim p = kf_sdim_const(1);
        for (int d = 0; d < x->rank; d++) p = kf_sdim_mul(g, p, kf_type_sdim(x, d));
        out->rank = 0;
        out->n = 1;
        out->e[0] = p;
        break;
    }
    case KF_OP_IDENTITY:
        if (!vec_of(in, sv, nin, 0, out)) return false;
        break;
    case KF_OP_CAST: {
        int64_t to = kf_attr_i(n, "to", 0);
        if ((to != KF_DT_INT64 && to != KF_DT_INT32) || !vec_of(in, sv, nin, 0, out)) return false;
        break;
    }
    case KF_OP_GATHER: {
        int64_t idx[KF_SYMVEC_MAX];
        int ni;
        int64_t axis = kf_attr_i(n, "axis", 0);
        if ((axis != 0 && axis != -1) || !vec_of(in, sv, nin, 0, &a) || a.rank != 1 || nin < 2 ||
            !ints_of(in[1], idx, KF_SYMVEC_MAX, &ni))
            return false;
        out->rank = in[1]->rank;
        for (int k = 0; k < ni; k++) {
            int64_t i = idx[k] < 0 ? idx[k] + a.n : idx[k];
            if (i < 0 || i >= a.n) return false;
            out->e[out->n++] = a.e[i];
        }
        break;
    }
    case KF_OP_CONCAT:
        out->rank = 1;
        for (int i = 0; i < nin; i++) {
            if (!vec_of(in, sv, nin, i, &a) || a.rank != 1 || out->n + a.n > KF_SYMVEC_MAX) return false;
            for (int k = 0; k < a.n; k++) out->e[out->n++] = a.e[k];
        }
        break;
    case KF_OP_UNSQUEEZE:
    case KF_OP_SQUEEZE:
    case KF_OP_RESHAPE: {
        /* a scalar <-> [1] or a vector kept 1-D: the elements stay */
        if (!vec_of(in, sv, nin, 0, out)) return false;
        if (n->op == KF_OP_UNSQUEEZE) {
            if (out->rank != 0) return false;
            out->rank = 1;
        } else if (n->op == KF_OP_SQUEEZE) {
            if (out->rank != 1 || out->n != 1) return false;
            out->rank = 0;
        } else {
            int64_t shp[2];
            int ns;
            if (nin < 2 || !ints_of(in[1], shp, 2, &ns) || ns > 1) return false;
            if (ns == 0 && out->n != 1) return false;
            if (ns == 1 && shp[0] != -1 && shp[0] != out->n) return false;
            out->rank = ns;
        }
        break;
    }
    case KF_OP_SLICE: {
        int64_t st[1], en[1], ax[1] = {0}, sp[1] = {1};
        int k1, k2, k3 = 1, k4 = 1;
        if (!vec_of(in, sv, nin, 0, &a) || a.rank != 1) return false;
        if (n->opset && n->opset < 10) {
            const kf_attr *s = kf_attr_find(n, "starts"), *e = kf_attr_find(n, "ends"), *x = kf_attr_find(n, "axes");
            if (!s || !e || s->n != 1 || e->n != 1 || (x && (x->n != 1 || (x->ints[0] != 0 && x->ints[0] != -1))))
                return false;
            st[0] = s->ints[0];
            en[0] = e->ints[0];
        } else {
            if (nin < 3 || !ints_of(in[1], st, 1, &k1) || !ints_of(in[2], en, 1, &k2) || k1 != 1 || k2 != 1)
                return false;
            if (nin > 3 && n->in[3] && (!ints_of(in[3], ax, 1, &k3) || k3 != 1 || (ax[0] != 0 && ax[0] != -1)))
                return false;
            if (nin > 4 && n->in[4] && (!ints_of(in[4], sp, 1, &k4) || k4 != 1 || sp[0] == 0)) return false;
        }
        int idx[KF_SYMVEC_MAX];
        int cnt = slice_pick(a.n, st[0], en[0], sp[0], idx, KF_SYMVEC_MAX);
        out->rank = 1;
        for (int k = 0; k < cnt; k++) out->e[out->n++] = a.e[idx[k]];
        break;
    }
    case KF_OP_ADD:
    case KF_OP_SUB:
    case KF_OP_MUL:
    case KF_OP_DIV:
    case KF_OP_MAX:
    case KF_OP_MIN:
    case KF_OP_EQUAL: {
        if (nin != 2 || !vec_of(in, sv, nin, 0, &a) || !vec_of(in, sv, nin, 1, &b)) return false;
        if (n->op != KF_OP_EQUAL && tin[0] && !kf_dtype_is_int(tin[0]->dtype)) return false;
        binop f = n->op == KF_OP_ADD   ? kf_sdim_add
                  : n->op == KF_OP_SUB ? kf_sdim_sub
                  : n->op == KF_OP_MUL ? kf_sdim_mul
                  : n->op == KF_OP_DIV ? div_trunc
                  : n->op == KF_OP_MAX ? max_of
                  : n->op == KF_OP_MIN ? min_of
                                       : equal_of;
        if (!zip(g, &a, &b, f, out)) return false;
        break;
    }
    case KF_OP_NEG:
        if (!vec_of(in, sv, nin, 0, &a)) return false;
        b = (kf_symvec){0, 1, {kf_sdim_const(-1)}};
        if (!zip(g, &a, &b, kf_sdim_mul, out)) return false;
        break;
    case KF_OP_WHERE: {
        if (nin != 3 || !vec_of(in, sv, nin, 0, &c) || !vec_of(in, sv, nin, 1, &a) || !vec_of(in, sv, nin, 2, &b))
            return false;
        int len = c.n > a.n ? c.n : a.n;
        if (b.n > len) len = b.n;
        if ((c.n != len && c.n != 1) || (a.n != len && a.n != 1) || (b.n != len && b.n != 1)) return false;
        out->rank = c.rank > a.rank ? c.rank : a.rank;
        if (b.rank > out->rank) out->rank = b.rank;
        out->n = len;
        for (int k = 0; k < len; k++) {
            kf_sdim cond = c.e[c.n == 1 ? 0 : k];
            if (cond.sym) out->e[k] = kf_sdim_unknown();
            else out->e[k] = cond.v ? a.e[a.n == 1 ? 0 : k] : b.e[b.n == 1 ? 0 : k];
        }
        break;
    }
    case KF_OP_REDUCE_PROD: {
        if (!vec_of(in, sv, nin, 0, &a) || a.rank != 1) return false;
        if (kf_attr_i(n, "noop_with_empty_axes", 0)) return false;
        const kf_attr *ax = kf_attr_find(n, "axes");
        if ((ax && ax->n > 0) || (nin > 1 && n->in[1] && (!in[1] || in[1]->numel > 0))) return false;
        kf_sdim p = kf_sdim_const(1);
        for (int k = 0; k < a.n; k++) p = kf_sdim_mul(g, p, a.e[k]);
        out->rank = kf_attr_i(n, "keepdims", 1) ? 1 : 0;
        out->n = 1;
        out->e[0] = p;
        break;
    }
    default:
        return false;
    }
    return out->n <= KF_SYMVEC_MAX && (out->n == 0 || any_known(out));
}

/* numel of x as a dim expression. */
static kf_sdim numel_of(kf_graph *g, const kf_type *x) {
    if (x->rank < 0) return kf_sdim_unknown();
    kf_sdim p = kf_sdim_const(1);
    for (int d = 0; d < x->rank; d++) p = kf_sdim_mul(g, p, kf_type_sdim(x, d));
    return p;
}

bool kf_symvec_shape(kf_graph *g, const kf_node *n, const kf_type *const *tin, const kf_tensor *const *in,
                     const kf_symvec *const *sv, kf_type *out) {
    int nin = kf_node_onnx_nin(n);
    if (n->op == KF_OP_RANGE) {
        kf_symvec a, b, c;
        if (nin != 3 || !vec_of(in, sv, nin, 0, &a) || !vec_of(in, sv, nin, 1, &b) || !vec_of(in, sv, nin, 2, &c) ||
            a.n != 1 || b.n != 1 || c.n != 1 || c.e[0].sym || c.e[0].v <= 0 || (!a.e[0].sym && !b.e[0].sym))
            return false;
        if (tin[0] && !kf_dtype_is_int(tin[0]->dtype)) return false;
        /* ceil((limit - start) / delta), which is >= 0 when limit - start is */
        kf_sdim span = kf_sdim_sub(g, b.e[0], a.e[0]);
        if (!kf_sdim_nonneg(g, span)) return false;
        kf_sdim cnt = kf_sdim_div(g, kf_sdim_add(g, span, kf_sdim_const(c.e[0].v - 1)), c.e[0]);
        out->rank = 1;
        kf_type_set_sdim(out, 0, cnt);
        return kf_sdim_known(cnt);
    }
    if (n->op == KF_OP_FLATTEN) {
        const kf_type *x = nin >= 1 ? tin[0] : NULL;
        if (!x || x->rank < 0) return false;
        int64_t axis = kf_attr_i(n, "axis", 1);
        if (axis < 0) axis += x->rank;
        if (axis < 0 || axis > x->rank) return false;
        kf_sdim lo = kf_sdim_const(1), hi = kf_sdim_const(1);
        for (int d = 0; d < x->rank; d++) {
            if (d < axis) lo = kf_sdim_mul(g, lo, kf_type_sdim(x, d));
            else hi = kf_sdim_mul(g, hi, kf_type_sdim(x, d));
        }
        out->rank = 2;
        kf_type_set_sdim(out, 0, lo);
        kf_type_set_sdim(out, 1, hi);
        return true;
    }
    if (n->op != KF_OP_RESHAPE && n->op != KF_OP_EXPAND && n->op != KF_OP_TILE && n->op != KF_OP_CONSTANT_OF_SHAPE)
        return false;
    int slot = n->op == KF_OP_CONSTANT_OF_SHAPE ? 0 : 1;
    kf_symvec sh;
    if (!vec_of(in, sv, nin, slot, &sh)) return false;
    const kf_symvec *s = &sh;
    if (s->rank != 1 || s->n > KF_MAX_RANK) return false;
    const kf_type *x = n->op == KF_OP_CONSTANT_OF_SHAPE ? NULL : tin[0];
    switch (n->op) {
    case KF_OP_CONSTANT_OF_SHAPE:
        out->rank = s->n;
        for (int d = 0; d < s->n; d++) {
            if (s->e[d].sym == 0 && s->e[d].v < 0) return false;
            kf_type_set_sdim(out, d, s->e[d]);
        }
        return true;
    case KF_OP_RESHAPE: {
        if (!x || x->rank < 0) return false;
        bool allowzero = kf_attr_i(n, "allowzero", 0) != 0;
        int infer = -1;
        kf_sdim rest = kf_sdim_const(1);
        out->rank = s->n;
        for (int d = 0; d < s->n; d++) {
            kf_sdim e = s->e[d];
            if (e.sym == 0 && e.v == -1) {
                if (infer >= 0) return false;
                infer = d;
                continue;
            }
            if (e.sym == 0 && e.v == 0 && !allowzero) e = kf_type_sdim(x, d);
            else if (e.sym == 0 && e.v < 0) return false;
            kf_type_set_sdim(out, d, e);
            rest = kf_sdim_mul(g, rest, e);
        }
        if (infer >= 0) kf_type_set_sdim(out, infer, kf_sdim_div(g, numel_of(g, x), rest));
        return true;
    }
    case KF_OP_EXPAND: {
        if (!x || x->rank < 0) return false;
        int r = x->rank > s->n ? x->rank : s->n;
        out->rank = r;
        for (int d = 0; d < r; d++) {
            int dx = d - (r - x->rank), ds = d - (r - s->n);
            kf_sdim a = dx >= 0 ? kf_type_sdim(x, dx) : kf_sdim_const(1);
            kf_sdim b = ds >= 0 ? s->e[ds] : kf_sdim_const(1);
            kf_sdim o;
            if (a.sym == 0 && a.v == 1) o = b;
            else if (b.sym == 0 && b.v == 1) o = a;
            else if (kf_sdim_eq(a, b)) o = a;
            else if (a.sym == 0 && kf_sdim_known(a)) o = a; /* b is a or 1 */
            else if (b.sym == 0 && kf_sdim_known(b)) o = b;
            else o = kf_sdim_unknown();
            kf_type_set_sdim(out, d, o);
        }
        return true;
    }
    case KF_OP_TILE:
        if (!x || x->rank != s->n) return false;
        out->rank = x->rank;
        for (int d = 0; d < x->rank; d++) kf_type_set_sdim(out, d, kf_sdim_mul(g, kf_type_sdim(x, d), s->e[d]));
        return true;
    default:
        return false;
    }
}

kf_status kf_symvec_tensor(const kf_symvec *s, kf_dtype dt, kf_tensor *out) {
    int64_t dims[1] = {s->n};
    if (!kf_symvec_const(s)) return kf_fail(KF_ERR_INVALID_ARG, "shape vector holds symbols");
    KF_TRY(kf_tensor_alloc(out, dt, s->rank, dims));
    for (int k = 0; k < s->n; k++) kf_set_i64(out, k, s->e[k].v);
    return KF_OK;
}

bool kf_symvec_target(const kf_type *x, const kf_symvec *s, bool reshape, bool allowzero, int64_t *out) {
    if (x->rank < 0 || s->rank != 1 || s->n > KF_MAX_RANK) return false;
    int open = -1;
    for (int d = 0; d < s->n; d++) {
        kf_sdim e = s->e[d];
        if (!kf_sdim_known(e)) return false;
        if (e.sym == 0) {
            if (!reshape && e.v < 0) return false;
            out[d] = e.v;
            if (reshape && e.v == -1) {
                if (open >= 0) return false;
                open = d;
            }
            continue;
        }
        int dx = reshape ? d : d - (s->n - x->rank); /* Expand aligns the ends */
        if (dx >= 0 && dx < x->rank && kf_sdim_eq(kf_type_sdim(x, dx), e) && !allowzero) {
            out[d] = reshape ? 0 : 1;
        } else if (reshape && open < 0) {
            out[d] = -1;
            open = d;
        } else {
            return false;
        }
    }
    return true;
}
