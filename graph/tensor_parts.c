/*
 * tensor_parts.c: tensors whose contents are parts not yet put side by
 * side (kf_tensor.h, "deferred concatenation"). Row-major, the tensor is
 * `outer` rows, each the parts' blocks in order: part p contributes
 * prod(p.dims[axis..]) elements per row, and outer = prod(dims[0..axis)).
 *
 *     axis 1, parts [K, n0] [K, n1]:   row k = part0 row k | part1 row k
 *     axis 0, parts [n0, K] [n1, K]:   one row = part0 | part1
 */
#include <string.h>

#include "kf_tensor.h"

/* Elements of part (or t) from axis on: one block of a row. */
static int64_t block_of(const kf_tensor *t, int axis) {
    int64_t b = 1;
    for (int d = axis; d < t->rank; d++) b *= t->dims[d];
    return b;
}

static int64_t outer_of(const kf_tensor *t, int axis) {
    int64_t o = 1;
    for (int d = 0; d < axis; d++) o *= t->dims[d];
    return o;
}

kf_status kf_tensor_concat_deferred(kf_tensor *t, kf_tensor *const *parts, int n, int axis) {
    if (n < 1 || !parts[0] || axis < 0 || axis >= parts[0]->rank)
        return kf_fail(KF_ERR_SHAPE, "a deferred concatenation needs parts and an axis within their rank");
    const kf_tensor *p0 = parts[0];
    if (p0->dtype == KF_DT_STRING || kf_dtype_is_small(p0->dtype))
        return kf_fail(KF_ERR_UNSUPPORTED, "a deferred concatenation of %s elements", kf_dtype_name(p0->dtype));
    int64_t dims[KF_MAX_RANK];
    memcpy(dims, p0->dims, sizeof(int64_t) * (size_t)p0->rank);
    dims[axis] = 0;
    for (int i = 0; i < n; i++) {
        const kf_tensor *p = parts[i];
        if (p->dtype != p0->dtype || p->rank != p0->rank)
            return kf_fail(KF_ERR_SHAPE, "the parts of a concatenation differ in dtype or rank");
        for (int d = 0; d < p->rank; d++)
            if (d != axis && p->dims[d] != p0->dims[d])
                return kf_fail(KF_ERR_SHAPE, "the parts of a concatenation differ in dim %d", d);
        if (!kf_add_ok(dims[axis], p->dims[axis], &dims[axis]))
            return kf_fail(KF_ERR_SHAPE, "a concatenation's dims overflow");
    }
    int64_t numel;
    KF_TRY(kf_shape_numel(p0->rank, dims, kf_dtype_size(p0->dtype), &numel));
    for (int i = 0; i < n; i++) KF_TRY(kf_tensor_settle(parts[i]));
    kf_tensor_parts *ps = kf_calloc(1, sizeof *ps + sizeof(kf_tensor) * (size_t)n);
    if (!ps) return kf_fail(KF_ERR_NOMEM, "out of memory");
    ps->axis = axis;
    ps->n = n;
    for (int i = 0; i < n; i++) ps->part[i] = *parts[i];
    kf_tensor_release(t);
    t->dtype = p0->dtype;
    t->rank = p0->rank;
    memcpy(t->dims, dims, sizeof(int64_t) * (size_t)p0->rank);
    t->numel = numel;
    t->parts = ps;
    return KF_OK;
}

void kf_tensor_adopt_parts(kf_tensor *t, kf_tensor *const *parts) {
    kf_tensor_parts *ps = t->parts;
    if (!ps || ps->owned) return;
    for (int i = 0; i < ps->n; i++) memset(parts[i], 0, sizeof *parts[i]);
    ps->owned = true;
}

void kf_tensor_parts_release(kf_tensor_parts *ps) {
    if (!ps) return;
    for (int i = 0; ps->owned && i < ps->n; i++) kf_tensor_release(&ps->part[i]);
    kf_free(ps);
}

bool kf_tensor_visit_bytes(const kf_tensor *t, bool (*emit)(void *ctx, const void *p, size_t n), void *ctx) {
    if (t->dtype == KF_DT_STRING) return false;
    size_t esz = kf_dtype_size(t->dtype);
    const kf_tensor_parts *ps = t->parts;
    if (!ps) return !t->numel || emit(ctx, t->data, (size_t)t->numel * esz);
    int64_t outer = outer_of(t, ps->axis);
    if (outer == 1) { /* each part is one run */
        for (int i = 0; i < ps->n; i++)
            if (ps->part[i].numel && !emit(ctx, ps->part[i].data, (size_t)ps->part[i].numel * esz)) return false;
        return true;
    }
    for (int64_t o = 0; o < outer; o++)
        for (int i = 0; i < ps->n; i++) {
            const kf_tensor *p = &ps->part[i];
            size_t run = (size_t)block_of(p, ps->axis) * esz;
            if (run && !emit(ctx, (const char *)p->data + (size_t)o * run, run)) return false;
        }
    return true;
}

kf_status kf_tensor_settle(kf_tensor *t) {
    if (!t || !t->parts) return KF_OK;
    kf_tensor whole = {0};
    KF_TRY(kf_tensor_copy(&whole, t)); /* copies a deferred tensor run by run */
    kf_tensor_move(t, &whole);        /* t's parts are released */
    return KF_OK;
}

const kf_tensor *kf_tensor_part_at(const kf_tensor *t, int64_t i, int64_t *j) {
    const kf_tensor_parts *ps = t->parts;
    int64_t row = block_of(t, ps->axis), o = i / row, r = i % row;
    for (int k = 0; k < ps->n; k++) {
        int64_t b = block_of(&ps->part[k], ps->axis);
        if (r < b) {
            *j = o * b + r;
            return &ps->part[k];
        }
        r -= b;
    }
    *j = 0; /* unreachable for i < numel */
    return &ps->part[ps->n - 1];
}
