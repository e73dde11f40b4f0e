/*
 * ops_shape.c: shape functions and reference kernels of the ops that only
 * rearrange or relabel data: Identity, Dropout (inference), Transpose,
 * Reshape, Flatten, Squeeze, Unsqueeze, Concat, Split, Shape and Size; and
 * the helpers the other ops_shape_*.c files share (ops_shape.h). Symbolic
 * dims pass through wherever a dim moves unchanged, so later passes keep them.
 */
#include <string.h>

#include "ops_shape.h"

/* ---- shared helpers ------------------------------------------------------ */

int64_t kf_layout_opset(const kf_node *n) { return n->opset > 0 ? n->opset : INT64_MAX; }

kf_status kf_layout_copy_elem(kf_tensor *dst, int64_t j, const kf_tensor *src, int64_t i) {
    if (src->dtype == KF_DT_STRING) {
        const kf_bytes *s = (const kf_bytes *)src->data + i;
        kf_bytes *d = (kf_bytes *)dst->data + j;
        size_t len = s->ptr ? s->len : 0;
        char *p = kf_strndup(s->ptr ? s->ptr : "", len);
        if (!p) return kf_fail(KF_ERR_NOMEM, "out of memory copying a string");
        kf_free(d->ptr);
        d->ptr = p;
        d->len = len;
        return KF_OK;
    }
    size_t esz = kf_dtype_size(src->dtype);
    memcpy((char *)dst->data + (size_t)j * esz, (const char *)src->data + (size_t)i * esz, esz);
    return KF_OK;
}

kf_status kf_layout_set_empty_string(kf_tensor *dst, int64_t j) {
    kf_bytes *d = (kf_bytes *)dst->data + j;
    char *p = kf_strdup("");
    if (!p) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_free(d->ptr);
    d->ptr = p;
    d->len = 0;
    return KF_OK;
}

kf_status kf_layout_copy_view(kf_tensor *dst, const kf_tensor *src, const kf_layout_view *v) {
    int r = v->rank;
    KF_ASSERT(r >= 0 && r <= KF_LAYOUT_MAX_VIEW_RANK);
    int64_t total = 1;
    for (int k = 0; k < r; k++)
        if (v->dims[k] == 0) return KF_OK;
    for (int k = 0; k < r; k++)
        /* distinct destination elements, so no more than dst->numel */
        if (!kf_mul_ok(total, v->dims[k], &total) || total > dst->numel)
            return kf_fail(KF_ERR_INTERNAL, "copy view larger than its destination");
    bool strings = src->dtype == KF_DT_STRING;
    size_t esz = kf_dtype_size(src->dtype);
    /* the innermost dim, when contiguous on both sides, is one memcpy */
    int64_t run = 1;
    int outer = r;
    if (!strings && r > 0 && v->sstr[r - 1] == 1 && v->dstr[r - 1] == 1) {
        run = v->dims[r - 1];
        outer = r - 1;
    }
    int64_t idx[KF_LAYOUT_MAX_VIEW_RANK] = {0};
    int64_t s = v->soff, d = v->doff;
    for (int64_t done = 0; done < total; done += run) {
        if (strings)
            KF_TRY(kf_layout_copy_elem(dst, d, src, s));
        else
            memcpy((char *)dst->data + (size_t)d * esz, (const char *)src->data + (size_t)s * esz,
                   (size_t)run * esz);
        for (int k = outer - 1; k >= 0; k--) {
            s += v->sstr[k];
            d += v->dstr[k];
            if (++idx[k] < v->dims[k]) break;
            s -= v->sstr[k] * v->dims[k];
            d -= v->dstr[k] * v->dims[k];
            idx[k] = 0;
        }
    }
    return KF_OK;
}

static bool same_shape(const kf_tensor *t, const kf_type *ty) {
    if (t->dtype != ty->dtype || t->rank != ty->rank || !t->data) return false;
    for (int d = 0; d < t->rank; d++)
        if (t->dims[d] != ty->dims[d]) return false;
    return true;
}

kf_status kf_layout_prepare(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                            kf_tensor *out, kf_shape_fn fn) {
    kf_status st = KF_OK;
    kf_type *types = kf_calloc((size_t)nin + 1, sizeof(kf_type));
    const kf_type **tp = kf_calloc((size_t)nin + 1, sizeof(kf_type *));
    kf_type *ot = kf_calloc((size_t)nout + 1, sizeof(kf_type));
    if (!types || !tp || !ot) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < nin; i++) {
        if (!in[i]) continue;
        kf_type_of_tensor(&types[i], in[i]);
        tp[i] = &types[i];
    }
    for (int j = 0; j < nout; j++) kf_type_unknown(&ot[j]);
    if ((st = fn(n, nin, tp, in, nout, ot))) goto done;
    for (int j = 0; j < nout; j++) {
        if (!kf_dtype_valid(ot[j].dtype) || !kf_type_is_static(&ot[j])) {
            st = kf_fail(KF_ERR_INTERNAL, "node '%s' (%s): output %d has no static shape",
                         kf_node_label(n), n->op_type, j);
            goto done;
        }
        if (same_shape(&out[j], &ot[j])) continue;
        if ((st = kf_tensor_alloc(&out[j], ot[j].dtype, ot[j].rank, ot[j].dims))) {
            kf_fail_context(st, "node '%s' (%s) output %d", kf_node_label(n), n->op_type, j);
            goto done;
        }
    }
done:
    kf_free(types);
    kf_free(tp);
    kf_free(ot);
    return st;
}

kf_status kf_layout_int_list(const kf_node *n, int nin, const kf_type *const *in,
                             const kf_tensor *const *val, int idx, const char *attr,
                             int64_t input_from, int64_t **vals, int64_t *count, bool *present,
                             bool *known) {
    *vals = NULL;
    *count = 0;
    *present = false;
    *known = true;
    if (kf_layout_opset(n) < input_from) {
        const kf_attr *a = kf_attr_find(n, attr);
        if (!a) return KF_OK;
        if (a->type != KF_ATTR_INTS)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' must be a list of ints",
                           kf_node_label(n), n->op_type, attr);
        int64_t *v = kf_calloc((size_t)a->n + 1, sizeof(int64_t));
        if (!v) return kf_fail(KF_ERR_NOMEM, "out of memory");
        for (int k = 0; k < a->n; k++) v[k] = a->ints[k];
        *vals = v;
        *count = a->n;
        *present = true;
        return KF_OK;
    }
    if (idx >= nin || !in[idx]) return KF_OK;
    *present = true;
    if (!val || !val[idx]) {
        *known = false;
        return KF_OK;
    }
    return kf_read_ints(n, val[idx], attr, vals, count);
}

/* Copies every element of src into dst in order (same element count). */
static kf_status copy_all(const kf_node *n, kf_tensor *dst, const kf_tensor *src) {
    if (dst->numel != src->numel || dst->dtype != src->dtype)
        return kf_fail(KF_ERR_INTERNAL, "node '%s' (%s): output does not match input size",
                       kf_node_label(n), n->op_type);
    if (src->dtype != KF_DT_STRING) {
        if (src->numel) memcpy(dst->data, src->data, (size_t)src->numel * kf_dtype_size(src->dtype));
        return KF_OK;
    }
    for (int64_t i = 0; i < src->numel; i++) KF_TRY(kf_layout_copy_elem(dst, i, src, i));
    return KF_OK;
}

/* Normalises axis into [0, rank) (or [0, rank] when allow_end); BAD_MODEL
 * naming the node otherwise. */
static kf_status norm_axis(const kf_node *n, int64_t axis, int rank, bool allow_end, int *out) {
    int64_t lim = allow_end ? rank + 1 : rank;
    int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= lim)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is out of range for rank %d",
                       kf_node_label(n), n->op_type, (long long)axis, rank);
    *out = (int)a;
    return KF_OK;
}

/* ---- Identity --------------------------------------------------------------- */

kf_status kf_layout_identity_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                  kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_shape_same));
    return copy_all(n, &out[0], in[0]);
}

/* ---- Dropout (inference) ------------------------------------------------------ */

/* out[0] = data; out[1] (mask) same shape, bool from opset 10, else data's dtype. */
kf_status kf_layout_dropout_shape(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    if (nin < 1 || !in[0]) return KF_OK;
    out[0] = *in[0];
    if (nout > 1) {
        out[1] = *in[0];
        if (kf_layout_opset(n) >= 10) out[1].dtype = KF_DT_BOOL;
        else if (in[0]->dtype == KF_DT_STRING)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): a string tensor has no dropout mask",
                           kf_node_label(n), n->op_type);
    }
    return KF_OK;
}

/* Dropout only runs when it is the identity: inference mode, or a ratio of 0.
 * A random mask would make the oracle depend on a generator. */
kf_status kf_layout_dropout_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    int64_t opset = kf_layout_opset(n);
    bool training = false;
    double ratio = 0.5;
    if (opset < 7) {
        training = kf_attr_i(n, "is_test", 0) == 0;
        ratio = kf_attr_f(n, "ratio", 0.5f);
    } else if (opset < 12) {
        ratio = kf_attr_f(n, "ratio", 0.5f);
    } else {
        if (nin > 1 && in[1]) {
            if (in[1]->numel != 1 || !kf_dtype_is_float(in[1]->dtype))
                return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): ratio must be a float scalar",
                               kf_node_label(n), n->op_type);
            ratio = kf_get_f64(in[1], 0);
        }
        if (nin > 2 && in[2]) {
            if (in[2]->numel != 1 || in[2]->dtype != KF_DT_BOOL)
                return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): training_mode must be a bool scalar",
                               kf_node_label(n), n->op_type);
            training = kf_get_i64(in[2], 0) != 0;
        }
    }
    if (training && ratio != 0)
        return kf_fail(KF_ERR_UNSUPPORTED,
                       "node '%s' (%s): training-mode dropout (ratio %g) is random; the reference "
                       "evaluator runs inference only",
                       kf_node_label(n), n->op_type, ratio);
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_dropout_shape));
    KF_TRY(copy_all(n, &out[0], in[0]));
    if (nout > 1)
        for (int64_t i = 0; i < out[1].numel; i++) kf_set_f64(&out[1], i, 1.0);
    return KF_OK;
}

/* ---- Transpose ------------------------------------------------------------------ */

/* perm attribute (default: reversed dims), validated as a permutation of rank. */
static kf_status transpose_perm(const kf_node *n, int rank, int *perm) {
    int cnt;
    const int64_t *p = kf_attr_ints(n, "perm", &cnt);
    if (!p) {
        for (int d = 0; d < rank; d++) perm[d] = rank - 1 - d;
        return KF_OK;
    }
    if (cnt != rank)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): perm has %d entries for a rank-%d input",
                       kf_node_label(n), n->op_type, cnt, rank);
    bool seen[KF_MAX_RANK] = {false};
    for (int d = 0; d < rank; d++) {
        if (p[d] < 0 || p[d] >= rank || seen[p[d]])
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): perm is not a permutation of 0..%d",
                           kf_node_label(n), n->op_type, rank - 1);
        seen[p[d]] = true;
        perm[d] = (int)p[d];
    }
    return KF_OK;
}

kf_status kf_layout_transpose_shape(const kf_node *n, int nin, const kf_type *const *in,
                                    const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    out[0].dtype = in[0]->dtype;
    int cnt;
    const int64_t *p = kf_attr_ints(n, "perm", &cnt);
    int rank = in[0]->rank;
    if (rank < 0) {
        if (p && cnt <= KF_MAX_RANK) {
            out[0].rank = cnt;
            for (int d = 0; d < cnt; d++) out[0].dims[d] = -1;
        }
        return KF_OK;
    }
    int perm[KF_MAX_RANK];
    KF_TRY(transpose_perm(n, rank, perm));
    out[0].rank = rank;
    for (int d = 0; d < rank; d++) {
        out[0].dims[d] = in[0]->dims[perm[d]];
        out[0].syms[d] = in[0]->syms[perm[d]];
    }
    return KF_OK;
}

kf_status kf_layout_transpose_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                   kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_transpose_shape));
    const kf_tensor *x = in[0];
    int perm[KF_MAX_RANK];
    KF_TRY(transpose_perm(n, x->rank, perm));
    int64_t istr[KF_MAX_RANK];
    kf_strides(x->rank, x->dims, istr);
    kf_layout_view v = {.rank = x->rank};
    kf_strides(out[0].rank, out[0].dims, v.dstr);
    for (int d = 0; d < x->rank; d++) {
        v.dims[d] = out[0].dims[d];
        v.sstr[d] = istr[perm[d]];
    }
    return kf_layout_copy_view(&out[0], x, &v);
}

/* ---- Reshape ------------------------------------------------------------------- */

/* Fills the -1 entry `neg` of out from the input's size. Unknown input dims
 * cancel against output dims copied from them (same symbol), so [N,3,4] ->
 * [0,-1] still gives [N,12]. Leaves it unknown when that is not enough. */
static kf_status reshape_infer(const kf_node *n, const kf_type *x, kf_type *o, int neg) {
    bool used[KF_MAX_RANK] = {false};
    int64_t known_in = 1, known_out = 1;
    for (int d = 0; d < o->rank; d++) {
        if (d == neg) continue;
        if (o->dims[d] >= 0) {
            if (!kf_mul_ok(known_out, o->dims[d], &known_out)) return KF_OK;
            continue;
        }
        int match = -1;
        for (int k = 0; k < x->rank && o->syms[d]; k++)
            if (!used[k] && x->dims[k] < 0 && x->syms[k] == o->syms[d]) {
                match = k;
                break;
            }
        if (match < 0) return KF_OK;
        used[match] = true;
    }
    for (int k = 0; k < x->rank; k++) {
        if (used[k]) continue;
        if (x->dims[k] < 0) return KF_OK;
        if (!kf_mul_ok(known_in, x->dims[k], &known_in)) return KF_OK;
    }
    if (known_out == 0)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): cannot infer the -1 dim next to a zero dim",
                       kf_node_label(n), n->op_type);
    if (known_in % known_out != 0)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): %lld elements cannot be reshaped with %lld per -1",
                       kf_node_label(n), n->op_type, (long long)known_in, (long long)known_out);
    o->dims[neg] = known_in / known_out;
    return KF_OK;
}

kf_status kf_layout_reshape_shape(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    kf_type *o = &out[0];
    o->dtype = x->dtype;
    int64_t *shape = NULL, cnt = 0;
    bool present, known;
    KF_TRY(kf_layout_int_list(n, nin, in, val, 1, "shape", 5, &shape, &cnt, &present, &known));
    kf_status st = KF_OK;
    if (!present) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): the target shape is missing",
                     kf_node_label(n), n->op_type);
        goto done;
    }
    if (!known) {
        if (in[1]->rank == 1 && in[1]->dims[0] >= 0 && in[1]->dims[0] <= KF_MAX_RANK) {
            o->rank = (int)in[1]->dims[0];
            for (int d = 0; d < o->rank; d++) o->dims[d] = -1;
        }
        goto done;
    }
    if (cnt > KF_MAX_RANK) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): target rank %lld exceeds %d",
                     kf_node_label(n), n->op_type, (long long)cnt, KF_MAX_RANK);
        goto done;
    }
    bool allowzero = kf_layout_opset(n) >= 14 && kf_attr_i(n, "allowzero", 0) != 0;
    int neg = -1;
    bool has_zero = false;
    o->rank = (int)cnt;
    for (int d = 0; d < o->rank; d++) {
        int64_t v = shape[d];
        o->dims[d] = -1;
        o->syms[d] = 0;
        if (v == -1) {
            if (neg >= 0) {
                st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): more than one -1 in the target shape",
                             kf_node_label(n), n->op_type);
                goto done;
            }
            neg = d;
        } else if (v < -1) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): invalid dim %lld in the target shape",
                         kf_node_label(n), n->op_type, (long long)v);
            goto done;
        } else if (v == 0 && !allowzero) {
            if (x->rank < 0) continue;
            if (d >= x->rank) {
                st = kf_fail(KF_ERR_SHAPE, "node '%s' (%s): target dim %d copies a dim the rank-%d input lacks",
                             kf_node_label(n), n->op_type, d, x->rank);
                goto done;
            }
            o->dims[d] = x->dims[d];
            o->syms[d] = x->syms[d];
        } else {
            has_zero |= v == 0;
            o->dims[d] = v;
        }
    }
    if (allowzero && has_zero && neg >= 0) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): allowzero target shape has both 0 and -1",
                     kf_node_label(n), n->op_type);
        goto done;
    }
    if (x->rank < 0) goto done;
    if (neg >= 0) {
        if ((st = reshape_infer(n, x, o, neg))) goto done;
    }
    if (kf_type_is_static(x) && kf_type_is_static(o)) {
        int64_t a, b;
        if ((st = kf_shape_numel(x->rank, x->dims, 1, &a)) || (st = kf_shape_numel(o->rank, o->dims, 1, &b))) {
            kf_fail_context(st, "node '%s' (%s)", kf_node_label(n), n->op_type);
            goto done;
        }
        if (a != b)
            st = kf_fail(KF_ERR_SHAPE, "node '%s' (%s): cannot reshape %lld elements into %lld",
                         kf_node_label(n), n->op_type, (long long)a, (long long)b);
    }
done:
    kf_free(shape);
    return st;
}

kf_status kf_layout_reshape_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_reshape_shape));
    return copy_all(n, &out[0], in[0]);
}

/* ---- Flatten ----------------------------------------------------------------------- */

/* Product of x's dims [lo, hi): known, 0 when any known dim is 0, the one
 * dim itself (symbol kept) when the range holds one dim, else unknown. */
static void dims_product(const kf_type *x, int lo, int hi, int64_t *dim, uint32_t *sym) {
    *sym = 0;
    if (hi - lo == 1) {
        *dim = x->dims[lo];
        *sym = x->syms[lo];
        return;
    }
    int64_t p = 1;
    bool unknown = false;
    for (int d = lo; d < hi; d++) {
        if (x->dims[d] == 0) {
            *dim = 0;
            return;
        }
        if (x->dims[d] < 0 || !kf_mul_ok(p, x->dims[d], &p)) unknown = true;
    }
    *dim = unknown ? -1 : p;
}

kf_status kf_layout_flatten_shape(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    out[0].dtype = x->dtype;
    out[0].rank = 2;
    out[0].dims[0] = out[0].dims[1] = -1;
    if (x->rank < 0) return KF_OK;
    int64_t axis = kf_attr_i(n, "axis", 1);
    if (axis < 0 && kf_layout_opset(n) < 11)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): negative axis needs opset 11",
                       kf_node_label(n), n->op_type);
    int a = 0;
    KF_TRY(norm_axis(n, axis, x->rank, true, &a));
    dims_product(x, 0, a, &out[0].dims[0], &out[0].syms[0]);
    dims_product(x, a, x->rank, &out[0].dims[1], &out[0].syms[1]);
    return KF_OK;
}

kf_status kf_layout_flatten_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_flatten_shape));
    return copy_all(n, &out[0], in[0]);
}

/* ---- Squeeze / Unsqueeze ---------------------------------------------------------- */

/* Marks normalised axes in `mark` (size rank); duplicates are an error. */
static kf_status mark_axes(const kf_node *n, const int64_t *axes, int64_t cnt, int rank, bool *mark) {
    for (int d = 0; d < rank; d++) mark[d] = false;
    for (int64_t k = 0; k < cnt; k++) {
        int a = 0;
        KF_TRY(norm_axis(n, axes[k], rank, false, &a));
        if (mark[a])
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is repeated",
                           kf_node_label(n), n->op_type, (long long)axes[k]);
        mark[a] = true;
    }
    return KF_OK;
}

kf_status kf_layout_squeeze_shape(const kf_node *n, int nin, const kf_type *const *in,
                                  const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    out[0].dtype = x->dtype;
    int64_t *axes = NULL, cnt = 0;
    bool present, known;
    KF_TRY(kf_layout_int_list(n, nin, in, val, 1, "axes", 13, &axes, &cnt, &present, &known));
    if (present && cnt == 0 && kf_layout_opset(n) < 13) present = false; /* [] attr: all 1s */
    kf_status st = KF_OK;
    if (x->rank >= 0 && !known && in[1]->rank == 1 && in[1]->dims[0] >= 0 &&
        in[1]->dims[0] <= x->rank) {
        out[0].rank = x->rank - (int)in[1]->dims[0]; /* which dims go is not known */
        for (int d = 0; d < out[0].rank; d++) out[0].dims[d] = -1;
    }
    if (x->rank < 0 || !known) goto done;
    bool mark[KF_MAX_RANK];
    if (present) {
        if ((st = mark_axes(n, axes, cnt, x->rank, mark))) goto done;
        for (int d = 0; d < x->rank; d++)
            if (mark[d] && x->dims[d] >= 0 && x->dims[d] != 1) {
                st = kf_fail(KF_ERR_SHAPE, "node '%s' (%s): cannot squeeze dim %d of size %lld",
                             kf_node_label(n), n->op_type, d, (long long)x->dims[d]);
                goto done;
            }
    } else {
        for (int d = 0; d < x->rank; d++) {
            if (x->dims[d] < 0) goto done; /* might be 1: rank unknown */
            mark[d] = x->dims[d] == 1;
        }
    }
    out[0].rank = 0;
    for (int d = 0; d < x->rank; d++) {
        if (mark[d]) continue;
        out[0].dims[out[0].rank] = x->dims[d];
        out[0].syms[out[0].rank] = x->syms[d];
        out[0].rank++;
    }
done:
    kf_free(axes);
    return st;
}

kf_status kf_layout_squeeze_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                 kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_squeeze_shape));
    return copy_all(n, &out[0], in[0]);
}

kf_status kf_layout_unsqueeze_shape(const kf_node *n, int nin, const kf_type *const *in,
                                    const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    out[0].dtype = x->dtype;
    int64_t *axes = NULL, cnt = 0;
    bool present, known;
    KF_TRY(kf_layout_int_list(n, nin, in, val, 1, "axes", 13, &axes, &cnt, &present, &known));
    kf_status st = KF_OK;
    if (!present) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axes are required", kf_node_label(n),
                     n->op_type);
        goto done;
    }
    if (x->rank >= 0 && !known && in[1]->rank == 1 && in[1]->dims[0] >= 0 &&
        in[1]->dims[0] <= KF_MAX_RANK - x->rank) {
        out[0].rank = x->rank + (int)in[1]->dims[0]; /* where the 1s go is not known */
        for (int d = 0; d < out[0].rank; d++) out[0].dims[d] = -1;
    }
    if (x->rank < 0 || !known) goto done;
    if (cnt > KF_MAX_RANK - x->rank) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): output rank exceeds %d", kf_node_label(n),
                     n->op_type, KF_MAX_RANK);
        goto done;
    }
    int r = x->rank + (int)cnt;
    bool mark[KF_MAX_RANK];
    if ((st = mark_axes(n, axes, cnt, r, mark))) goto done;
    out[0].rank = r;
    for (int d = 0, k = 0; d < r; d++) {
        if (mark[d]) {
            out[0].dims[d] = 1;
            out[0].syms[d] = 0;
        } else {
            out[0].dims[d] = x->dims[k];
            out[0].syms[d] = x->syms[k];
            k++;
        }
    }
done:
    kf_free(axes);
    return st;
}

kf_status kf_layout_unsqueeze_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                   kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_unsqueeze_shape));
    return copy_all(n, &out[0], in[0]);
}

/* ---- Concat ------------------------------------------------------------------------ */

static kf_status concat_axis(const kf_node *n, int64_t *axis) {
    const kf_attr *a = kf_attr_find(n, "axis");
    if (a && a->type == KF_ATTR_INT) {
        *axis = a->i;
        return KF_OK;
    }
    if (!a && kf_layout_opset(n) < 4) {
        *axis = 1;
        return KF_OK;
    }
    return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): integer attribute 'axis' is required",
                   kf_node_label(n), n->op_type);
}

static kf_status concat_shape(const kf_node *n, int nin, const kf_type *const *in, int64_t axis, kf_type *out);

/* PyTorch 1.4 exported shape computations as Concat of 1-D pieces with 0-D
 * constants (the 12-layer BERT in ../shared/models does); the spec wants
 * equal ranks. kfuse reads a 0-D input of an otherwise 1-D Concat as a
 * one-element vector, so such exports run; the result is the same vector
 * those exporters meant. True when input i is such a scalar. */
static bool lenient_scalar(int nin, const kf_type *const *in, int i) {
    if (!in[i] || in[i]->rank != 0) return false;
    for (int k = 0; k < nin; k++)
        if (in[k] && in[k]->rank == 1) return true;
    return false;
}

kf_status kf_layout_concat_shape(const kf_node *n, int nin, const kf_type *const *in_decl,
                                 const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    int64_t axis = 0;
    KF_TRY(concat_axis(n, &axis));
    kf_type *fixed = NULL;
    const kf_type **inp = kf_calloc((size_t)nin + 1, sizeof *inp);
    if (!inp) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int i = 0; i < nin; i++) {
        inp[i] = in_decl[i];
        if (!lenient_scalar(nin, in_decl, i)) continue;
        if (!fixed && !(fixed = kf_calloc((size_t)nin, sizeof *fixed))) {
            kf_free(inp);
            return kf_fail(KF_ERR_NOMEM, "out of memory");
        }
        fixed[i] = *in_decl[i];
        fixed[i].rank = 1;
        fixed[i].dims[0] = 1;
        fixed[i].syms[0] = 0;
        inp[i] = &fixed[i];
    }
    kf_status st = concat_shape(n, nin, inp, axis, out);
    kf_free(fixed);
    kf_free(inp);
    return st;
}

static kf_status concat_shape(const kf_node *n, int nin, const kf_type *const *in, int64_t axis, kf_type *out) {
    int rank = -1;
    kf_dtype dt = KF_DT_UNDEFINED;
    for (int i = 0; i < nin; i++) {
        if (!in[i]) continue;
        if (!dt) dt = in[i]->dtype;
        else if (in[i]->dtype && in[i]->dtype != dt)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input %d is %s, input 0 is %s",
                           kf_node_label(n), n->op_type, i, kf_dtype_name(in[i]->dtype),
                           kf_dtype_name(dt));
        if (in[i]->rank < 0) continue;
        if (rank >= 0 && in[i]->rank != rank)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input %d has rank %d, expected %d",
                           kf_node_label(n), n->op_type, i, in[i]->rank, rank);
        rank = in[i]->rank;
    }
    out[0].dtype = dt;
    if (rank < 0) return KF_OK;
    if (rank == 0)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): scalars cannot be concatenated",
                       kf_node_label(n), n->op_type);
    int a = 0;
    KF_TRY(norm_axis(n, axis, rank, false, &a));
    out[0].rank = rank;
    for (int d = 0; d < rank; d++) {
        int64_t dim = d == a ? 0 : -1;
        uint32_t sym = 0;
        int present = 0;
        for (int i = 0; i < nin; i++) {
            if (!in[i]) continue;
            present++;
            int64_t x = in[i]->rank < 0 ? -1 : in[i]->dims[d];
            uint32_t s = in[i]->rank < 0 ? 0 : in[i]->syms[d];
            if (d == a) {
                if (dim < 0 || x < 0 || !kf_add_ok(dim, x, &dim)) {
                    dim = -1;
                    if (!sym) sym = s;
                }
            } else if (x >= 0) {
                if (dim >= 0 && dim != x)
                    return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input %d has dim %d = %lld, expected %lld",
                                   kf_node_label(n), n->op_type, i, d, (long long)x, (long long)dim);
                dim = x;
            } else if (!sym) {
                sym = s;
            }
        }
        out[0].dims[d] = dim;
        /* the axis keeps a symbol only when it is the single input's */
        out[0].syms[d] = dim < 0 && (d != a || present == 1) ? sym : 0;
    }
    return KF_OK;
}

kf_status kf_layout_concat_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_concat_shape));
    int64_t axis = 0;
    KF_TRY(concat_axis(n, &axis));
    int a = 0;
    KF_TRY(norm_axis(n, axis, out[0].rank, false, &a));
    int64_t ostr[KF_MAX_RANK];
    kf_strides(out[0].rank, out[0].dims, ostr);
    int64_t off = 0;
    for (int i = 0; i < nin; i++) {
        if (!in[i]) continue;
        /* a lenient 0-D input (see lenient_scalar) is a one-element vector */
        bool scalar = in[i]->rank == 0 && out[0].rank == 1;
        kf_layout_view v = {.rank = scalar ? 1 : in[i]->rank, .doff = off * ostr[a]};
        kf_strides(in[i]->rank, in[i]->dims, v.sstr);
        if (scalar) v.sstr[0] = 1;
        for (int d = 0; d < v.rank; d++) {
            v.dims[d] = scalar ? 1 : in[i]->dims[d];
            v.dstr[d] = ostr[d];
        }
        KF_TRY(kf_layout_copy_view(&out[0], in[i], &v));
        off += scalar ? 1 : in[i]->dims[a];
    }
    return KF_OK;
}

/* ---- Split -------------------------------------------------------------------------- */

/* Lengths of the nout parts along the axis (dim: the axis size, maybe -1).
 * *lens malloc'ed (caller frees); entries -1 when unknown. */
static kf_status split_lengths(const kf_node *n, int nin, const kf_type *const *in,
                               const kf_tensor *const *val, int nout, int64_t dim, int64_t **lens) {
    int64_t opset = kf_layout_opset(n);
    int64_t *split = NULL, cnt = 0;
    bool present = false, known = true;
    kf_status st = KF_OK;
    if (opset < 2) {
        KF_TRY(kf_layout_int_list(n, nin, in, val, 1, "split", 2, &split, &cnt, &present, &known));
        if (!present) /* Split-1 also takes the lengths as a second input */
            KF_TRY(kf_layout_int_list(n, nin, in, val, 1, "split", 0, &split, &cnt, &present, &known));
    } else {
        KF_TRY(kf_layout_int_list(n, nin, in, val, 1, "split", 13, &split, &cnt, &present, &known));
    }
    int64_t parts = nout;
    const kf_attr *na = opset >= 18 ? kf_attr_find(n, "num_outputs") : NULL;
    int64_t *l = kf_calloc((size_t)nout + 1, sizeof(int64_t));
    if (!l) {
        kf_free(split);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    if (na) {
        if (present) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): both 'split' and 'num_outputs' are given",
                         kf_node_label(n), n->op_type);
            goto done;
        }
        if (na->type != KF_ATTR_INT || na->i != nout) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): num_outputs does not match the %d outputs",
                         kf_node_label(n), n->op_type, nout);
            goto done;
        }
    }
    if (present && known) {
        if (cnt != nout) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): split has %lld entries for %d outputs",
                         kf_node_label(n), n->op_type, (long long)cnt, nout);
            goto done;
        }
        int64_t sum = 0;
        for (int j = 0; j < nout; j++) {
            if (split[j] < 0 || !kf_add_ok(sum, split[j], &sum)) {
                st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): invalid split length %lld",
                             kf_node_label(n), n->op_type, (long long)split[j]);
                goto done;
            }
            l[j] = split[j];
        }
        if (dim >= 0 && sum != dim)
            st = kf_fail(KF_ERR_SHAPE, "node '%s' (%s): split lengths sum to %lld, the axis has %lld",
                         kf_node_label(n), n->op_type, (long long)sum, (long long)dim);
        goto done;
    }
    for (int j = 0; j < nout; j++) l[j] = -1;
    if (present || dim < 0) goto done;
    int64_t chunk = dim / parts;
    if (dim % parts) {
        if (opset < 18) {
            st = kf_fail(KF_ERR_SHAPE, "node '%s' (%s): axis of %lld does not split into %lld equal parts",
                         kf_node_label(n), n->op_type, (long long)dim, (long long)parts);
            goto done;
        }
        chunk++;
        if (chunk * (parts - 1) > dim) {
            st = kf_fail(KF_ERR_SHAPE, "node '%s' (%s): axis of %lld cannot give %lld parts",
                         kf_node_label(n), n->op_type, (long long)dim, (long long)parts);
            goto done;
        }
    }
    for (int j = 0; j < nout; j++) l[j] = j + 1 < nout ? chunk : dim - chunk * (parts - 1);
done:
    kf_free(split);
    if (st) kf_free(l);
    else *lens = l;
    return st;
}

kf_status kf_layout_split_shape(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    for (int j = 0; j < nout; j++) out[j].dtype = x->dtype;
    if (x->rank < 0) return KF_OK;
    int a = 0;
    KF_TRY(norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, false, &a));
    int64_t *lens = NULL;
    KF_TRY(split_lengths(n, nin, in, val, nout, x->dims[a], &lens));
    for (int j = 0; j < nout; j++) {
        out[j] = *x;
        out[j].dims[a] = lens[j];
        if (!(nout == 1 && lens[j] < 0)) out[j].syms[a] = 0;
    }
    kf_free(lens);
    return KF_OK;
}

kf_status kf_layout_split_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_split_shape));
    const kf_tensor *x = in[0];
    int a = 0;
    KF_TRY(norm_axis(n, kf_attr_i(n, "axis", 0), x->rank, false, &a));
    int64_t istr[KF_MAX_RANK];
    kf_strides(x->rank, x->dims, istr);
    int64_t off = 0;
    for (int j = 0; j < nout; j++) {
        kf_layout_view v = {.rank = x->rank, .soff = off * istr[a]};
        kf_strides(out[j].rank, out[j].dims, v.dstr);
        for (int d = 0; d < x->rank; d++) {
            v.dims[d] = out[j].dims[d];
            v.sstr[d] = istr[d];
        }
        KF_TRY(kf_layout_copy_view(&out[j], x, &v));
        off += out[j].dims[a];
    }
    return KF_OK;
}

/* ---- Shape / Size --------------------------------------------------------------------- */

/* [start, end) of the dims Shape reports (attributes from opset 15). */
static void shape_range(const kf_node *n, int rank, int64_t *lo, int64_t *hi) {
    int64_t s = 0, e = rank;
    if (kf_layout_opset(n) >= 15) {
        s = kf_attr_i(n, "start", 0);
        e = kf_attr_i(n, "end", rank);
    }
    if (s < 0) s += rank;
    if (e < 0) e += rank;
    s = s < 0 ? 0 : s > rank ? rank : s;
    e = e < 0 ? 0 : e > rank ? rank : e;
    *lo = s;
    *hi = e > s ? e : s;
}

kf_status kf_layout_shape_shape(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    out[0].dtype = KF_DT_INT64;
    out[0].rank = 1;
    out[0].dims[0] = -1;
    if (nin < 1 || !in[0] || in[0]->rank < 0) return KF_OK;
    int64_t lo, hi;
    shape_range(n, in[0]->rank, &lo, &hi);
    out[0].dims[0] = hi - lo;
    return KF_OK;
}

kf_status kf_layout_shape_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_shape_shape));
    int64_t lo, hi;
    shape_range(n, in[0]->rank, &lo, &hi);
    for (int64_t d = lo; d < hi; d++) kf_set_i64(&out[0], d - lo, in[0]->dims[d]);
    return KF_OK;
}

kf_status kf_layout_size_shape(const kf_node *n, int nin, const kf_type *const *in,
                               const kf_tensor *const *val, int nout, kf_type *out) {
    (void)n;
    (void)nin;
    (void)in;
    (void)val;
    (void)nout;
    out[0].dtype = KF_DT_INT64;
    out[0].rank = 0;
    return KF_OK;
}

kf_status kf_layout_size_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                              kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_size_shape));
    kf_set_i64(&out[0], 0, in[0]->numel);
    return KF_OK;
}
