/*
 * ops_shape_slice.c: shape functions and reference kernels of the strided
 * data-movement ops: Slice, Expand, Tile, SpaceToDepth and DepthToSpace.
 * Each kernel describes its output as one strided view of its input
 * (kf_layout_copy_view): slices step through the input, broadcast dims get
 * stride 0, and the block ops are 6-D transposes.
 */
#include <string.h>

#include "ops_shape.h"

/* ---- Slice ------------------------------------------------------------------------ */

/* What a Slice does to each dim: start element, step and output count.
 * sliced[d] is false for dims the node leaves alone. */
typedef struct slice_plan {
    bool known;                /* starts/ends/axes/steps values are known */
    bool sliced[KF_MAX_RANK];
    int64_t start[KF_MAX_RANK], step[KF_MAX_RANK], count[KF_MAX_RANK];
    int64_t raw_start[KF_MAX_RANK], raw_end[KF_MAX_RANK];
} slice_plan;

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Start and count along one dim of size dim (numpy slicing rules, the ONNX
 * way: negative starts/ends count from the back, then clamp). */
static void slice_dim(int64_t s, int64_t e, int64_t step, int64_t dim, int64_t *start,
                      int64_t *count) {
    if (dim == 0) {
        *start = 0;
        *count = 0;
        return;
    }
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    uint64_t span, mag;
    if (step > 0) {
        s = clamp64(s, 0, dim);
        e = clamp64(e, 0, dim);
        span = e > s ? (uint64_t)(e - s) : 0;
        mag = (uint64_t)step;
    } else {
        s = clamp64(s, 0, dim - 1);
        e = clamp64(e, -1, dim - 1);
        span = s > e ? (uint64_t)(s - e) : 0;
        mag = (uint64_t)0 - (uint64_t)step;
    }
    *start = s;
    *count = span ? (int64_t)((span - 1) / mag + 1) : 0;
}

/* Reads the slice parameters (attributes before opset 10, inputs after) and
 * validates them against the input rank. */
static kf_status slice_read(const kf_node *n, int nin, const kf_type *const *in,
                            const kf_tensor *const *val, int rank, slice_plan *p) {
    memset(p, 0, sizeof *p);
    static const char *const names[4] = {"starts", "ends", "axes", "steps"};
    int64_t *v[4] = {NULL, NULL, NULL, NULL}, cnt[4] = {0, 0, 0, 0};
    bool present[4], known[4];
    kf_status st = KF_OK;
    for (int k = 0; k < 4; k++) {
        if (k == 3 && kf_layout_opset(n) < 10) {
            present[k] = false;
            known[k] = true;
            continue;
        }
        if ((st = kf_layout_int_list(n, nin, in, val, k + 1, names[k], 10, &v[k], &cnt[k],
                                     &present[k], &known[k])))
            goto done;
    }
    if (!present[0] || !present[1]) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): starts and ends are required",
                     kf_node_label(n), n->op_type);
        goto done;
    }
    p->known = known[0] && known[1] && known[2] && known[3];
    if (!p->known) goto done;
    int64_t m = cnt[0];
    if (cnt[1] != m || (present[2] && cnt[2] != m) || (present[3] && cnt[3] != m)) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): starts, ends, axes and steps differ in length",
                     kf_node_label(n), n->op_type);
        goto done;
    }
    if (!present[2] && m > rank) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %lld starts for a rank-%d input",
                     kf_node_label(n), n->op_type, (long long)m, rank);
        goto done;
    }
    for (int64_t k = 0; k < m; k++) {
        int64_t axis = present[2] ? v[2][k] : k;
        int64_t a = axis < 0 ? axis + rank : axis;
        if (a < 0 || a >= rank) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is out of range for rank %d",
                         kf_node_label(n), n->op_type, (long long)axis, rank);
            goto done;
        }
        if (p->sliced[a]) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): axis %lld is repeated", kf_node_label(n),
                         n->op_type, (long long)axis);
            goto done;
        }
        int64_t step = present[3] ? v[3][k] : 1;
        if (step == 0) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): step is 0", kf_node_label(n), n->op_type);
            goto done;
        }
        p->sliced[a] = true;
        p->raw_start[a] = v[0][k];
        p->raw_end[a] = v[1][k];
        p->step[a] = step;
    }
done:
    for (int k = 0; k < 4; k++) kf_free(v[k]);
    return st;
}

kf_status kf_layout_slice_shape(const kf_node *n, int nin, const kf_type *const *in,
                                const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    out[0].dtype = x->dtype;
    if (x->rank < 0) return KF_OK;
    slice_plan p;
    KF_TRY(slice_read(n, nin, in, val, x->rank, &p));
    out[0].rank = x->rank;
    for (int d = 0; d < x->rank; d++) {
        out[0].dims[d] = -1;
        out[0].syms[d] = 0;
        if (p.known && !p.sliced[d]) {
            out[0].dims[d] = x->dims[d];
            out[0].syms[d] = x->syms[d];
        } else if (p.known && x->dims[d] >= 0) {
            int64_t start;
            slice_dim(p.raw_start[d], p.raw_end[d], p.step[d], x->dims[d], &start, &out[0].dims[d]);
        } else if (p.known && p.raw_start[d] == 0 && p.raw_end[d] == INT64_MAX && p.step[d] == 1) {
            out[0].syms[d] = x->syms[d]; /* x[0:] of an unknown dim */
        }
    }
    return KF_OK;
}

kf_status kf_layout_slice_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                               kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_slice_shape));
    const kf_tensor *x = in[0];
    kf_type ty;
    kf_type_of_tensor(&ty, x);
    const kf_type *tp[5] = {&ty, NULL, NULL, NULL, NULL};
    kf_type it[5];
    for (int i = 1; i < nin && i < 5; i++)
        if (in[i]) {
            kf_type_of_tensor(&it[i], in[i]);
            tp[i] = &it[i];
        }
    slice_plan p;
    KF_TRY(slice_read(n, nin < 5 ? nin : 5, tp, in, x->rank, &p));
    int64_t istr[KF_MAX_RANK];
    kf_strides(x->rank, x->dims, istr);
    kf_layout_view v = {.rank = x->rank};
    kf_strides(out[0].rank, out[0].dims, v.dstr);
    for (int d = 0; d < x->rank; d++) {
        int64_t start = 0, step = 1;
        if (p.sliced[d]) {
            int64_t cnt;
            slice_dim(p.raw_start[d], p.raw_end[d], p.step[d], x->dims[d], &start, &cnt);
            step = p.step[d];
        }
        v.dims[d] = out[0].dims[d];
        /* only used when the output is non-empty, where start and
         * start + (count-1)*step lie inside the dim */
        if (out[0].numel) {
            v.soff += start * istr[d];
            v.sstr[d] = v.dims[d] > 1 ? step * istr[d] : 0;
        }
    }
    return kf_layout_copy_view(&out[0], x, &v);
}

/* ---- Expand ---------------------------------------------------------------------------- */

kf_status kf_layout_expand_shape(const kf_node *n, int nin, const kf_type *const *in,
                                 const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    out[0].dtype = in[0]->dtype;
    if (nin < 2 || !in[1] || !val || !val[1]) return KF_OK;
    int64_t *shape, cnt;
    KF_TRY(kf_read_ints(n, val[1], "shape", &shape, &cnt));
    kf_status st = KF_OK;
    kf_type target;
    kf_type_unknown(&target);
    if (cnt > KF_MAX_RANK) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): shape has %lld dims, more than %d",
                     kf_node_label(n), n->op_type, (long long)cnt, KF_MAX_RANK);
        goto done;
    }
    target.dtype = in[0]->dtype;
    target.rank = (int)cnt;
    for (int d = 0; d < target.rank; d++) {
        if (shape[d] < 0) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): shape has negative dim %lld",
                         kf_node_label(n), n->op_type, (long long)shape[d]);
            goto done;
        }
        target.dims[d] = shape[d];
    }
    if (in[0]->rank < 0) goto done;
    const kf_type *both[2] = {in[0], &target};
    st = kf_broadcast_shapes(n, 2, both, &out[0]);
done:
    kf_free(shape);
    return st;
}

kf_status kf_layout_expand_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                                kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_expand_shape));
    const kf_tensor *x = in[0];
    kf_tensor *o = &out[0];
    int off = o->rank - x->rank;
    int64_t istr[KF_MAX_RANK];
    kf_strides(x->rank, x->dims, istr);
    kf_layout_view v = {.rank = o->rank};
    kf_strides(o->rank, o->dims, v.dstr);
    for (int d = 0; d < o->rank; d++) {
        v.dims[d] = o->dims[d];
        v.sstr[d] = d < off || x->dims[d - off] == 1 ? 0 : istr[d - off];
    }
    return kf_layout_copy_view(o, x, &v);
}

/* ---- Tile ---------------------------------------------------------------------------- */

kf_status kf_layout_tile_shape(const kf_node *n, int nin, const kf_type *const *in,
                               const kf_tensor *const *val, int nout, kf_type *out) {
    (void)nout;
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    out[0].dtype = x->dtype;
    if (x->rank < 0) return KF_OK;
    out[0].rank = x->rank;
    for (int d = 0; d < x->rank; d++) out[0].dims[d] = -1;
    if (nin < 2 || !in[1] || !val || !val[1]) return KF_OK;
    int64_t *rep, cnt;
    KF_TRY(kf_read_ints(n, val[1], "repeats", &rep, &cnt));
    kf_status st = KF_OK;
    if (cnt != x->rank) {
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %lld repeats for a rank-%d input",
                     kf_node_label(n), n->op_type, (long long)cnt, x->rank);
        goto done;
    }
    for (int d = 0; d < x->rank; d++) {
        if (rep[d] < 0) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): negative repeat %lld",
                         kf_node_label(n), n->op_type, (long long)rep[d]);
            goto done;
        }
        if (rep[d] == 1) {
            out[0].dims[d] = x->dims[d];
            out[0].syms[d] = x->syms[d];
        } else if (x->dims[d] >= 0 && !kf_mul_ok(x->dims[d], rep[d], &out[0].dims[d])) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): tiled dim %d overflows",
                         kf_node_label(n), n->op_type, d);
            goto done;
        } else if (rep[d] == 0) {
            out[0].dims[d] = 0;
        }
    }
done:
    kf_free(rep);
    return st;
}

/* Output dim d is viewed as (repeat, dim): the repeat index has source
 * stride 0, so one view copy does the whole tiling. */
kf_status kf_layout_tile_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                              kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_tile_shape));
    const kf_tensor *x = in[0];
    kf_tensor *o = &out[0];
    if (o->numel == 0) return KF_OK;
    int64_t istr[KF_MAX_RANK], ostr[KF_MAX_RANK];
    kf_strides(x->rank, x->dims, istr);
    kf_strides(o->rank, o->dims, ostr);
    kf_layout_view v = {.rank = 2 * x->rank};
    for (int d = 0; d < x->rank; d++) {
        v.dims[2 * d] = o->dims[d] / x->dims[d];
        v.sstr[2 * d] = 0;
        v.dstr[2 * d] = x->dims[d] * ostr[d];
        v.dims[2 * d + 1] = x->dims[d];
        v.sstr[2 * d + 1] = istr[d];
        v.dstr[2 * d + 1] = ostr[d];
    }
    return kf_layout_copy_view(o, x, &v);
}

/* ---- SpaceToDepth / DepthToSpace ---------------------------------------------------- */

static kf_status block_size(const kf_node *n, int64_t *bs) {
    const kf_attr *a = kf_attr_find(n, "blocksize");
    if (!a || a->type != KF_ATTR_INT || a->i <= 0)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): a positive 'blocksize' is required",
                       kf_node_label(n), n->op_type);
    *bs = a->i;
    return KF_OK;
}

/* Block order: true for CRD, false for DCR (the default). DepthToSpace
 * has the `mode` attribute from opset 11, SpaceToDepth from 28. */
static kf_status block_crd(const kf_node *n, bool *crd) {
    int64_t since = n->op == KF_OP_SPACE_TO_DEPTH ? 28 : 11;
    const char *mode = kf_layout_opset(n) >= since ? kf_attr_s(n, "mode", "DCR") : "DCR";
    *crd = strcmp(mode, "CRD") == 0;
    if (!*crd && strcmp(mode, "DCR") != 0)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): unknown mode '%s'", kf_node_label(n),
                       n->op_type, mode);
    return KF_OK;
}

/* Shared by both block ops: to_depth picks SpaceToDepth. */
static kf_status block_shape(const kf_node *n, int nin, const kf_type *const *in, kf_type *out,
                             bool to_depth) {
    if (nin < 1 || !in[0]) return KF_OK;
    const kf_type *x = in[0];
    int64_t bs = 0;
    KF_TRY(block_size(n, &bs));
    bool crd;
    KF_TRY(block_crd(n, &crd));
    out[0].dtype = x->dtype;
    if (x->rank < 0) return KF_OK;
    if (x->rank != 4)
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): input must be 4-D, it has rank %d",
                       kf_node_label(n), n->op_type, x->rank);
    int64_t sq;
    if (!kf_mul_ok(bs, bs, &sq))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): blocksize %lld is too large",
                       kf_node_label(n), n->op_type, (long long)bs);
    out[0] = *x;
    out[0].syms[1] = out[0].syms[2] = out[0].syms[3] = 0;
    int64_t c = x->dims[1], h = x->dims[2], w = x->dims[3];
    if (to_depth) {
        if ((h >= 0 && h % bs) || (w >= 0 && w % bs))
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): %lldx%lld is not a multiple of blocksize %lld",
                           kf_node_label(n), n->op_type, (long long)h, (long long)w, (long long)bs);
        if (c >= 0 && !kf_mul_ok(c, sq, &out[0].dims[1]))
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): channels overflow", kf_node_label(n),
                           n->op_type);
        out[0].dims[2] = h >= 0 ? h / bs : -1;
        out[0].dims[3] = w >= 0 ? w / bs : -1;
    } else {
        if (c >= 0 && c % sq)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): %lld channels are not a multiple of %lld",
                           kf_node_label(n), n->op_type, (long long)c, (long long)sq);
        out[0].dims[1] = c >= 0 ? c / sq : -1;
        if ((h >= 0 && !kf_mul_ok(h, bs, &out[0].dims[2])) || (w >= 0 && !kf_mul_ok(w, bs, &out[0].dims[3])))
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): spatial dims overflow",
                           kf_node_label(n), n->op_type);
    }
    return KF_OK;
}

kf_status kf_layout_spacetodepth_shape(const kf_node *n, int nin, const kf_type *const *in,
                                       const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    return block_shape(n, nin, in, out, true);
}

kf_status kf_layout_depthtospace_shape(const kf_node *n, int nin, const kf_type *const *in,
                                       const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    return block_shape(n, nin, in, out, false);
}

/* SpaceToDepth: x viewed as [N, C, H/b, b, W/b, b], transposed to
 * [N, b, b, C, H/b, W/b] (DCR) or [N, C, b, b, H/b, W/b] (CRD), which is
 * the output's element order. */
kf_status kf_layout_spacetodepth_eval(const kf_node *n, int nin, const kf_tensor *const *in,
                                      int nout, kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_spacetodepth_shape));
    const kf_tensor *x = in[0];
    int64_t bs = 0;
    bool crd;
    KF_TRY(block_size(n, &bs));
    KF_TRY(block_crd(n, &crd));
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    kf_layout_view v = {.rank = 6};
    int64_t dims[6] = {N, bs, bs, C, H / bs, W / bs};
    int64_t sstr[6] = {C * H * W, W, 1, H * W, bs * W, bs};
    if (crd) {
        int64_t cd[6] = {N, C, bs, bs, H / bs, W / bs};
        int64_t cs[6] = {C * H * W, H * W, W, 1, bs * W, bs};
        memcpy(dims, cd, sizeof cd);
        memcpy(sstr, cs, sizeof cs);
    }
    memcpy(v.dims, dims, sizeof dims);
    memcpy(v.sstr, sstr, sizeof sstr);
    kf_strides(6, v.dims, v.dstr);
    return kf_layout_copy_view(&out[0], x, &v);
}

/* DepthToSpace: the output [N, C', H, b, W, b] reads channel
 * (by*b + bx)*C' + c (DCR) or c*b*b + by*b + bx (CRD). */
kf_status kf_layout_depthtospace_eval(const kf_node *n, int nin, const kf_tensor *const *in,
                                      int nout, kf_tensor *out) {
    KF_TRY(kf_layout_prepare(n, nin, in, nout, out, kf_layout_depthtospace_shape));
    const kf_tensor *x = in[0];
    int64_t bs = 0;
    bool crd;
    KF_TRY(block_size(n, &bs));
    KF_TRY(block_crd(n, &crd));
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], Co = C / (bs * bs);
    int64_t hw = H * W;
    kf_layout_view v = {.rank = 6};
    int64_t dims[6] = {N, Co, H, bs, W, bs};
    int64_t dcr[6] = {C * hw, hw, W, bs * Co * hw, 1, Co * hw};
    int64_t crdv[6] = {C * hw, bs * bs * hw, W, bs * hw, 1, hw};
    memcpy(v.dims, dims, sizeof dims);
    memcpy(v.sstr, crd ? crdv : dcr, sizeof dcr);
    kf_strides(6, v.dims, v.dstr);
    return kf_layout_copy_view(&out[0], x, &v);
}
