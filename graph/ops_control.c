/*
 * ops_control.c: the control-flow ops If, Loop and Scan. Their bodies stay
 * packed in the IR (graph attributes) and are decoded when needed
 * (kf_onnx_node_body); values a body reads from the graphs around it arrive
 * as the node's captured inputs (kf_node.ncap). Here: the check of a body
 * against its node (the loader runs it), shape inference through the
 * bodies, and the reference kernels, which run each body with the
 * evaluator's own graph driver (kf_eval_graph), nested bodies included.
 *
 *   Loop(M, cond, v...)          body(i, cond, v...) -> (cond', v'..., y...)
 *   Scan(s..., x...)             body(s..., x[t]...) -> (s'..., y[t]...)
 *   If(c)                        then_branch() / else_branch() -> (out...)
 */
#include <stdio.h>
#include <string.h>

#include "kf_onnx.h"
#include "kf_ref.h"
#include "ops_shape.h"

/* Loop iterations one node may run: far beyond what a real model asks of
 * the reference evaluator (a decoding loop runs hundreds), small enough
 * that a corrupt or hostile trip count ends with an error within seconds
 * instead of hanging. */
#define MAX_LOOP_ITERS ((int64_t)1 << 20)
/* Shape inference runs a Loop or Scan body again with carried types widened
 * to what both the input and the body's output allow, until they stop
 * changing; a body whose shapes keep changing after this many rounds gets
 * carried outputs of unknown shape. */
#define MAX_WIDEN_ROUNDS 3
/* Bodies nested deeper than this inside one another get no shape inference
 * (their node's outputs stay unknown): each level may infer its body up to
 * MAX_WIDEN_ROUNDS + 1 times, so the cost grows as a power of the depth;
 * real models nest two or three levels. */
#define MAX_INFER_NESTING 6

static _Thread_local int infer_nesting; /* bodies being inferred around this call */

static int onnx_nin(const kf_node *n) { return n->nin - n->ncap; }

/* Scan-8: batch axis first, optional sequence_lens input 0. */
static bool scan8(const kf_node *n) { return n->op == KF_OP_SCAN && n->opset > 0 && n->opset < 9; }

const char *const *kf_control_bodies(const kf_node *n) {
    static const char *const branches[] = {"then_branch", "else_branch", NULL};
    static const char *const body[] = {"body", NULL};
    static const char *const none[] = {NULL};
    switch (n->op) {
    case KF_OP_IF: return branches;
    case KF_OP_LOOP:
    case KF_OP_SCAN: return body;
    default: return none;
    }
}

kf_status kf_control_check_body(const kf_node *n, const char *attr, int bnin, int bnout) {
    int nin = onnx_nin(n);
    if (n->op == KF_OP_IF) {
        if (bnin != 0)
            return kf_node_fail(n, KF_ERR_BAD_MODEL, "branch '%s' takes %d inputs; If branches take none", attr, bnin);
        if (bnout != n->nout)
            return kf_node_fail(n, KF_ERR_BAD_MODEL, "branch '%s' has %d outputs, the node %d", attr, bnout, n->nout);
        return KF_OK;
    }
    if (n->op == KF_OP_LOOP) {
        if (nin < 2)
            return kf_node_fail(n, KF_ERR_BAD_MODEL,
                                "has %d inputs; Loop takes the trip count and the condition (empty names when "
                                "absent), then the loop-carried values",
                                nin);
        int N = nin - 2;
        if (n->nout < N)
            return kf_node_fail(n, KF_ERR_BAD_MODEL, "has %d outputs, fewer than its %d loop-carried values", n->nout, N);
        if (bnin != 2 + N)
            return kf_node_fail(n, KF_ERR_BAD_MODEL,
                                "body takes %d inputs; with %d loop-carried values it must take %d (iteration "
                                "number, condition, the values)",
                                bnin, N, 2 + N);
        if (bnout != 1 + n->nout)
            return kf_node_fail(n, KF_ERR_BAD_MODEL,
                                "body has %d outputs; the node's %d outputs need %d (condition, loop-carried "
                                "values, scan outputs)",
                                bnout, n->nout, 1 + n->nout);
        return KF_OK;
    }
    if (n->op == KF_OP_SCAN) {
        int64_t M = kf_attr_i(n, "num_scan_inputs", -1);
        int first = scan8(n) ? 1 : 0;
        if (M < 1 || M > nin - first)
            return kf_node_fail(n, KF_ERR_BAD_MODEL, "num_scan_inputs is %lld; it must be 1..%d (the scanned inputs)",
                                (long long)M, nin - first);
        int N = nin - first - (int)M;
        if (n->nout < N)
            return kf_node_fail(n, KF_ERR_BAD_MODEL, "has %d outputs, fewer than its %d state values", n->nout, N);
        if (bnin != N + (int)M)
            return kf_node_fail(n, KF_ERR_BAD_MODEL, "body takes %d inputs; %d state values and %lld scanned inputs need %d",
                                bnin, N, (long long)M, N + (int)M);
        if (bnout != n->nout)
            return kf_node_fail(n, KF_ERR_BAD_MODEL, "body has %d outputs, the node %d", bnout, n->nout);
        return KF_OK;
    }
    return KF_OK;
}

kf_status kf_control_body(const kf_model *m, const kf_node *n, const char *attr, kf_body *b) {
    kf_opset own = {(char *)"", n->opset};
    kf_status st = m ? kf_onnx_node_body(n, attr, m->opsets, m->nopsets, m->dir, b)
                     : kf_onnx_node_body(n, attr, &own, n->opset ? 1 : 0, NULL, b);
    if (!st && (st = kf_control_check_body(n, attr, b->nin, (int)b->g->noutputs))) kf_body_release(b);
    return st;
}

/* Slot in in[] of the captured value that body input k (an outer name)
 * stands for; -1 when the node captures no such name. */
static int outer_slot(const kf_node *n, const kf_body *b, uint32_t k) {
    const char *name = b->g->values[b->g->inputs[k]].name;
    for (int c = 0; c < n->ncap; c++)
        if (!strcmp(n->capname[c], name)) return n->nin - n->ncap + c;
    return -1;
}

/* ---- shape inference ----------------------------------------------------- */

/* a := what both a and b allow: equal dims (or the same named symbol) stay,
 * others become unknown; different ranks give an unknown rank. */
static void widen(kf_type *a, const kf_type *b) {
    if (a->dtype != b->dtype) a->dtype = a->dtype && !b->dtype ? a->dtype : b->dtype && !a->dtype ? b->dtype : 0;
    if (a->rank < 0 || b->rank != a->rank) {
        kf_dtype dt = a->dtype;
        kf_type_unknown(a);
        a->dtype = dt;
        return;
    }
    for (int d = 0; d < a->rank; d++) {
        bool same = a->dims[d] >= 0 ? a->dims[d] == b->dims[d] : b->dims[d] < 0 && a->syms[d] && a->syms[d] == b->syms[d];
        if (!same) {
            a->dims[d] = -1;
            a->syms[d] = 0;
        }
    }
}

static bool same_type(const kf_type *a, const kf_type *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d] || a->syms[d] != b->syms[d]) return false;
    return true;
}

/* Output types (res[0..noutputs)) of body `attr` of n with formal inputs
 * of types fin[0..nin) and the node's captured inputs' types. A body kfuse
 * cannot read (KF_ERR_UNSUPPORTED) leaves *ok false and is no error. */
static kf_status infer_body(const kf_node *n, const kf_type *const *in, const char *attr, const kf_type *fin,
                            kf_type *res, int nres, bool *ok) {
    *ok = false;
    if (infer_nesting >= MAX_INFER_NESTING) return KF_OK;
    kf_body b;
    kf_status st = kf_control_body(NULL, n, attr, &b);
    if (st == KF_ERR_UNSUPPORTED) {
        kf_clear_error();
        return KF_OK;
    }
    if (st) return st;
    kf_graph *g = b.g;
    for (int i = 0; i < b.nin; i++) {
        kf_type *t = &g->values[g->inputs[i]].type;
        if (fin[i].rank >= 0) *t = fin[i];
        if (fin[i].dtype) t->dtype = fin[i].dtype;
    }
    for (uint32_t k = (uint32_t)b.nin; k < g->ninputs; k++) {
        int slot = outer_slot(n, &b, k);
        kf_type *t = &g->values[g->inputs[k]].type;
        if (slot >= 0 && in[slot]) *t = *in[slot];
        else kf_type_unknown(t);
    }
    kf_model tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.graph = g;
    infer_nesting++;
    st = kf_infer_shapes(&tmp);
    infer_nesting--;
    if (st == KF_ERR_UNSUPPORTED) {
        kf_clear_error();
        st = KF_OK;
    } else if (st) {
        kf_fail_context(st, "node '%s' (%s) body '%s'", kf_node_label(n), n->op_type, attr);
    } else {
        for (int o = 0; o < nres && o < (int)g->noutputs; o++) res[o] = g->values[g->outputs[o]].type;
        *ok = true;
    }
    kf_body_release(&b);
    return st;
}

kf_status kf_control_if_shape(const kf_node *n, int nin, const kf_type *const *in, const kf_tensor *const *val,
                              int nout, kf_type *out) {
    (void)nin;
    if (in[0] && in[0]->dtype && in[0]->dtype != KF_DT_BOOL)
        return kf_node_fail(n, KF_ERR_SHAPE, "condition is %s; it must be bool", kf_dtype_name(in[0]->dtype));
    int pick = -1; /* a known condition decides the branch */
    if (val[0] && val[0]->dtype == KF_DT_BOOL && val[0]->numel == 1) pick = kf_get_i64(val[0], 0) ? 0 : 1;
    const char *const *names = kf_control_bodies(n);
    kf_type *res = kf_calloc((size_t)nout + 1, sizeof(kf_type));
    if (!res) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = KF_OK;
    bool first = true;
    int failed = 0; /* branches whose shapes contradict themselves */
    for (int br = 0; br < 2 && !st; br++) {
        if (pick >= 0 && br != pick) continue;
        bool ok;
        st = infer_body(n, in, names[br], NULL, res, nout, &ok);
        if (st == KF_ERR_SHAPE && pick < 0 && !failed++) {
            /* A branch that cannot run for these inputs is one the
             * condition never picks (models choose between a 2-D and a 3-D
             * branch this way): the other branch decides the shapes. */
            kf_clear_error();
            st = KF_OK;
            continue;
        }
        if (st || !ok) {
            for (int j = 0; j < nout; j++) kf_type_unknown(&out[j]);
            break;
        }
        for (int j = 0; j < nout && !st; j++) {
            if (first) {
                out[j] = res[j];
                continue;
            }
            if (out[j].dtype && res[j].dtype && out[j].dtype != res[j].dtype)
                st = kf_node_fail(n, KF_ERR_SHAPE, "output %d is %s in then_branch and %s in else_branch", j,
                                  kf_dtype_name(out[j].dtype), kf_dtype_name(res[j].dtype));
            else widen(&out[j], &res[j]);
        }
        first = false;
    }
    kf_free(res);
    return st;
}

/* Shapes of Loop and Scan: the body runs with carried (state) types
 * fin[lo..hi) widened until stable; nres body outputs land in res. */
static kf_status infer_carried(const kf_node *n, const kf_type *const *in, kf_type *fin, int nfin, int lo, int hi,
                               int res_lo, kf_type *res, int nres, bool *ok) {
    *ok = false;
    for (int round = 0; round <= MAX_WIDEN_ROUNDS; round++) {
        (void)nfin;
        KF_TRY(infer_body(n, in, "body", fin, res, nres, ok));
        if (!*ok) return KF_OK;
        bool stable = true;
        for (int i = lo; i < hi; i++) {
            kf_type u = fin[i];
            widen(&u, &res[res_lo + i - lo]);
            if (!same_type(&u, &fin[i])) stable = false;
            fin[i] = u;
        }
        if (stable) return KF_OK;
    }
    for (int i = lo; i < hi; i++) { /* still changing: keep only the dtype */
        kf_dtype dt = fin[i].dtype;
        kf_type_unknown(&fin[i]);
        fin[i].dtype = dt;
    }
    for (int o = 0; o < nres; o++) {
        kf_dtype dt = res[o].dtype;
        kf_type_unknown(&res[o]);
        res[o].dtype = dt;
    }
    return KF_OK;
}

/* t with a dim of size len (-1 unknown) inserted at axis (0..rank). */
static void insert_dim(kf_type *t, int axis, int64_t len) {
    if (t->rank < 0 || t->rank >= KF_MAX_RANK || axis < 0 || axis > t->rank) {
        kf_dtype dt = t->dtype;
        kf_type_unknown(t);
        t->dtype = dt;
        return;
    }
    for (int d = t->rank; d > axis; d--) {
        t->dims[d] = t->dims[d - 1];
        t->syms[d] = t->syms[d - 1];
    }
    t->dims[axis] = len;
    t->syms[axis] = 0;
    t->rank++;
}

/* t without dim axis (unknown rank stays unknown). */
static void remove_dim(kf_type *t, int axis) {
    if (t->rank < 0) return;
    if (axis < 0 || axis >= t->rank) {
        kf_dtype dt = t->dtype;
        kf_type_unknown(t);
        t->dtype = dt;
        return;
    }
    for (int d = axis; d + 1 < t->rank; d++) {
        t->dims[d] = t->dims[d + 1];
        t->syms[d] = t->syms[d + 1];
    }
    t->rank--;
}

kf_status kf_control_loop_shape(const kf_node *n, int nin, const kf_type *const *in, const kf_tensor *const *val,
                                int nout, kf_type *out) {
    (void)nin;
    int N = onnx_nin(n) - 2, K = nout - N;
    if (N < 0 || K < 0) return KF_OK; /* the loader reports the counts */
    kf_type *fin = kf_calloc((size_t)N + 2, sizeof(kf_type));
    kf_type *res = kf_calloc((size_t)(1 + N + K), sizeof(kf_type));
    if (!fin || !res) {
        kf_free(fin);
        kf_free(res);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    kf_type_unknown(&fin[0]);
    fin[0].dtype = KF_DT_INT64;
    fin[0].rank = 0;
    kf_type_unknown(&fin[1]);
    fin[1].dtype = KF_DT_BOOL;
    fin[1].rank = 0;
    for (int i = 0; i < N; i++) {
        if (in[2 + i]) fin[2 + i] = *in[2 + i];
        else kf_type_unknown(&fin[2 + i]);
    }
    bool ok;
    kf_status st = infer_carried(n, in, fin, N + 2, 2, 2 + N, 1, res, 1 + N + K, &ok);
    if (!st && ok) {
        /* a known trip count with no condition fixes the scan outputs' length */
        int64_t trips = -1;
        if (val[0] && !in[1] && val[0]->numel == 1 && kf_dtype_is_int(val[0]->dtype)) {
            trips = kf_get_i64(val[0], 0);
            if (trips < 0) trips = 0;
        }
        for (int i = 0; i < N; i++) out[i] = fin[2 + i];
        for (int k = 0; k < K; k++) {
            out[N + k] = res[1 + N + k];
            insert_dim(&out[N + k], 0, trips);
        }
        if (res[0].dtype && res[0].dtype != KF_DT_BOOL)
            st = kf_node_fail(n, KF_ERR_SHAPE, "body condition output is %s; it must be bool", kf_dtype_name(res[0].dtype));
    }
    kf_free(fin);
    kf_free(res);
    return st;
}

/* The axes and directions of a Scan (form 9 and later; Scan-8 scans axis 1
 * of each input, forward unless `directions` says otherwise, and stacks
 * outputs along axis 1). Lists are malloc'ed in one block the caller frees
 * through *iax. */
typedef struct scan_attrs {
    int M, N, K;
    int64_t *iax, *idir, *oax, *odir; /* M, M, K, K entries */
} scan_attrs;

/* Reads list `name` into dst[0..cnt) (def where absent); a list of another
 * length is KF_ERR_BAD_MODEL. */
static kf_status read_list(const kf_node *n, const char *name, int64_t *dst, int cnt, int64_t def) {
    int c;
    const int64_t *v = kf_attr_ints(n, name, &c);
    if (v && c != cnt) return kf_node_fail(n, KF_ERR_BAD_MODEL, "%s has %d entries, expected %d", name, c, cnt);
    for (int i = 0; i < cnt; i++) {
        dst[i] = v ? v[i] : def;
        if ((!strcmp(name, "scan_input_directions") || !strcmp(name, "scan_output_directions") ||
             !strcmp(name, "directions")) &&
            dst[i] != 0 && dst[i] != 1)
            return kf_node_fail(n, KF_ERR_BAD_MODEL, "%s[%d] is %lld; directions are 0 or 1", name, i, (long long)dst[i]);
    }
    return KF_OK;
}

static kf_status scan_attrs_read(const kf_node *n, int nout, scan_attrs *a) {
    memset(a, 0, sizeof *a);
    int first = scan8(n) ? 1 : 0;
    int64_t M = kf_attr_i(n, "num_scan_inputs", -1);
    if (M < 1 || M > onnx_nin(n) - first)
        return kf_node_fail(n, KF_ERR_BAD_MODEL, "num_scan_inputs is %lld; it must be 1..%d", (long long)M,
                            onnx_nin(n) - first);
    a->M = (int)M;
    a->N = onnx_nin(n) - first - a->M;
    a->K = nout - a->N;
    if (a->K < 0) return kf_node_fail(n, KF_ERR_BAD_MODEL, "has %d outputs, fewer than its %d state values", nout, a->N);
    if (!(a->iax = kf_calloc((size_t)(2 * a->M + 2 * a->K) + 1, sizeof(int64_t))))
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    a->idir = a->iax + a->M;
    a->oax = a->idir + a->M;
    a->odir = a->oax + a->K;
    kf_status st;
    if (scan8(n)) {
        st = read_list(n, "directions", a->idir, a->M, 0);
    } else if (!(st = read_list(n, "scan_input_axes", a->iax, a->M, 0)) &&
               !(st = read_list(n, "scan_input_directions", a->idir, a->M, 0)) &&
               !(st = read_list(n, "scan_output_axes", a->oax, a->K, 0))) {
        st = read_list(n, "scan_output_directions", a->odir, a->K, 0);
    }
    if (st) {
        kf_free(a->iax);
        a->iax = NULL;
    }
    return st;
}

kf_status kf_control_scan_shape(const kf_node *n, int nin, const kf_type *const *in, const kf_tensor *const *val,
                                int nout, kf_type *out) {
    (void)nin;
    (void)val;
    scan_attrs a;
    KF_TRY(scan_attrs_read(n, nout, &a));
    bool s8 = scan8(n);
    int first = s8 ? 1 : 0, N = a.N, M = a.M, K = a.K;
    kf_type *fin = kf_calloc((size_t)(N + M) + 1, sizeof(kf_type));
    kf_type *res = kf_calloc((size_t)(N + K) + 1, sizeof(kf_type));
    kf_status st = !fin || !res ? kf_fail(KF_ERR_NOMEM, "out of memory") : KF_OK;
    int64_t len = -1, batch = -1;
    for (int i = 0; i < N + M && !st; i++) {
        const kf_type *t = in[first + i];
        if (t) fin[i] = *t;
        else kf_type_unknown(&fin[i]);
        if (s8 && fin[i].rank >= 1 && fin[i].dims[0] >= 0) batch = fin[i].dims[0];
        if (s8) remove_dim(&fin[i], 0);
        if (i < N) continue;
        int j = i - N, axis = s8 ? 0 : (int)a.iax[j];
        if (fin[i].rank >= 0) {
            if (axis < -fin[i].rank || axis >= fin[i].rank) {
                st = kf_node_fail(n, KF_ERR_BAD_MODEL, "scan input %d has rank %d; axis %d is out of range", j,
                                  fin[i].rank + (s8 ? 1 : 0), axis);
                break;
            }
            if (axis < 0) axis += fin[i].rank;
            int64_t l = fin[i].dims[axis];
            if (l >= 0 && len >= 0 && l != len && !s8) {
                st = kf_node_fail(n, KF_ERR_SHAPE, "scan input %d has %lld steps along axis %d, another input %lld", j,
                                  (long long)l, axis, (long long)len);
                break;
            }
            if (l >= 0) len = l;
        }
        remove_dim(&fin[i], axis);
    }
    bool ok = false;
    if (!st) st = infer_carried(n, in, fin, N + M, 0, N, 0, res, N + K, &ok);
    if (!st && ok) {
        for (int i = 0; i < N; i++) {
            out[i] = fin[i];
            if (s8) insert_dim(&out[i], 0, batch);
        }
        for (int k = 0; k < K; k++) {
            out[N + k] = res[N + k];
            if (s8) {
                insert_dim(&out[N + k], 0, len);
                insert_dim(&out[N + k], 0, batch);
                continue;
            }
            int r = out[N + k].rank + 1;
            int axis = (int)a.oax[k];
            if (out[N + k].rank >= 0 && (axis < -r || axis >= r)) {
                st = kf_node_fail(n, KF_ERR_BAD_MODEL, "scan_output_axes[%d] is %d; output rank is %d", k, axis, r);
                break;
            }
            if (axis < 0) axis += r;
            insert_dim(&out[N + k], axis, len);
        }
    }
    kf_free(a.iax);
    kf_free(fin);
    kf_free(res);
    return st;
}

/* ---- evaluation ---------------------------------------------------------- */

/* dst = x[..., idx, ...]: index idx taken along axis (rank one less). */
static kf_status take(const kf_tensor *x, int axis, int64_t idx, kf_tensor *dst) {
    int64_t dims[KF_MAX_RANK], xs[KF_MAX_RANK], ds[KF_MAX_RANK];
    int r = 0;
    for (int d = 0; d < x->rank; d++)
        if (d != axis) dims[r++] = x->dims[d];
    KF_TRY(kf_tensor_alloc(dst, x->dtype, r, dims));
    kf_strides(x->rank, x->dims, xs);
    kf_strides(r, dims, ds);
    kf_layout_view v;
    memset(&v, 0, sizeof v);
    v.rank = r;
    for (int d = 0, k = 0; d < x->rank; d++) {
        if (d == axis) continue;
        v.dims[k] = x->dims[d];
        v.sstr[k] = xs[d];
        v.dstr[k] = ds[k];
        k++;
    }
    v.soff = idx * xs[axis];
    return kf_layout_copy_view(dst, x, &v);
}

/* dst[..., idx, ...] = y along axis (dst has one dim more than y; y's
 * dims may be smaller than dst's, the rest of dst keeps its zeros). */
static kf_status place(kf_tensor *dst, int axis, int64_t idx, const kf_tensor *y) {
    int64_t ys[KF_MAX_RANK], ds[KF_MAX_RANK];
    kf_strides(y->rank, y->dims, ys);
    kf_strides(dst->rank, dst->dims, ds);
    kf_layout_view v;
    memset(&v, 0, sizeof v);
    v.rank = y->rank;
    for (int k = 0; k < y->rank; k++) {
        int d = k < axis ? k : k + 1;
        KF_ASSERT(y->dims[k] <= dst->dims[d]);
        v.dims[k] = y->dims[k];
        v.sstr[k] = ys[k];
        v.dstr[k] = ds[d];
    }
    v.doff = idx * ds[axis];
    return kf_layout_copy_view(dst, y, &v);
}

static bool same_shape(const kf_tensor *a, const kf_tensor *b) {
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

static void shape_str(const kf_tensor *t, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->rank && o < len; d++) o += (size_t)snprintf(buf + o, len - o, d ? ", %lld" : "%lld", (long long)t->dims[d]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* A body to run: decoded once per node evaluation, outer names bound. */
typedef struct runner {
    const kf_model *m;
    const kf_node *n;
    const char *attr;
    kf_body b;
    const kf_tensor **bound; /* b.g->ninputs */
    kf_tensor *res;          /* b.g->noutputs */
    int depth;
} runner;

static void runner_free(runner *r) {
    if (r->res)
        for (uint32_t o = 0; o < r->b.g->noutputs; o++) kf_tensor_release(&r->res[o]);
    kf_free(r->bound);
    kf_free(r->res);
    kf_body_release(&r->b);
}

static kf_status runner_init(runner *r, const kf_model *m, const kf_node *n, const char *attr,
                             const kf_tensor *const *in, int depth) {
    memset(r, 0, sizeof *r);
    r->m = m;
    r->n = n;
    r->attr = attr;
    r->depth = depth;
    KF_TRY(kf_control_body(m, n, attr, &r->b));
    const kf_graph *g = r->b.g;
    r->bound = kf_calloc(g->ninputs + 1, sizeof(kf_tensor *));
    r->res = kf_calloc(g->noutputs + 1, sizeof(kf_tensor));
    if (!r->bound || !r->res) {
        runner_free(r);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (uint32_t k = (uint32_t)r->b.nin; k < g->ninputs; k++) {
        int slot = outer_slot(n, &r->b, k);
        if (slot < 0 || !in[slot]) {
            kf_status st = kf_node_fail(n, KF_ERR_BAD_MODEL, "body '%s' reads '%s', which the node does not %s", attr,
                                        g->values[g->inputs[k]].name, slot < 0 ? "capture" : "have a value for");
            runner_free(r);
            return st;
        }
        r->bound[k] = in[slot];
    }
    return KF_OK;
}

static _Thread_local kf_body_run_fn body_fn; /* kf_set_body_runner */
static _Thread_local void *body_ctx;

void kf_set_body_runner(kf_body_run_fn fn, void *ctx, kf_body_run_fn *prev, void **prev_ctx) {
    if (prev) *prev = body_fn;
    if (prev_ctx) *prev_ctx = body_ctx;
    body_fn = fn;
    body_ctx = ctx;
}

/* Runs the body on r->bound; results in r->res (released first). */
static kf_status runner_go(runner *r) {
    for (uint32_t o = 0; o < r->b.g->noutputs; o++) kf_tensor_release(&r->res[o]);
    kf_status st = body_fn && r->depth == 0
                       ? body_fn(body_ctx, r->n, r->attr, &r->b, r->bound, r->res, r->depth + 1)
                       : kf_eval_graph(r->m, r->b.g, r->bound, r->res, r->depth + 1);
    if (st) kf_fail_context(st, "node '%s' (%s) body '%s'", kf_node_label(r->n), r->n->op_type, r->attr);
    return st;
}

/* Output o of a body that never ran, with a dim of 0 inserted at axis:
 * the body's shape inference, with formal inputs of types fin and the
 * node's actual inputs, gives the rest of the shape (dims it cannot tell
 * are 0; float when even the dtype is unknown). */
static kf_status zero_steps(const runner *r, const kf_tensor *const *in, const kf_type *fin, int o, int axis,
                            kf_tensor *out) {
    const kf_node *n = r->n;
    kf_type *ty = kf_calloc((size_t)n->nin + 1, sizeof(kf_type));
    const kf_type **tp = kf_calloc((size_t)n->nin + 1, sizeof(kf_type *));
    kf_type *res = kf_calloc(r->b.g->noutputs + 1, sizeof(kf_type));
    kf_status st = !ty || !tp || !res ? kf_fail(KF_ERR_NOMEM, "out of memory") : KF_OK;
    bool ok = false;
    for (int i = 0; !st && i < n->nin; i++)
        if (in[i]) {
            kf_type_of_tensor(&ty[i], in[i]);
            tp[i] = &ty[i];
        }
    if (!st) st = infer_body(n, tp, r->attr, fin, res, (int)r->b.g->noutputs, &ok);
    kf_type t;
    if (ok) t = res[o];
    else t = r->b.g->values[r->b.g->outputs[o]].type;
    kf_free(ty);
    kf_free(tp);
    kf_free(res);
    if (st) return st;
    int64_t dims[KF_MAX_RANK];
    int rank = t.rank < 0 ? 0 : t.rank;
    if (rank + 1 > KF_MAX_RANK) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "output rank exceeds %d", KF_MAX_RANK);
    if (axis < 0) axis += rank + 1;
    if (axis < 0 || axis > rank) return kf_node_fail(n, KF_ERR_BAD_MODEL, "output axis is out of range for rank %d", rank + 1);
    for (int d = 0, k = 0; d <= rank; d++) dims[d] = d == axis ? 0 : (t.dims[k] < 0 ? 0 : t.dims[k]), k += d != axis;
    return kf_tensor_alloc(out, t.dtype ? t.dtype : KF_DT_FLOAT, rank + 1, dims);
}

/* Stacks ys[0..count) (equal shapes) along a new axis; step t goes to index
 * count-1-t when reverse. */
static kf_status stack(const kf_node *n, kf_tensor *ys, int64_t count, int64_t axis, bool reverse, kf_tensor *out) {
    const kf_tensor *y0 = &ys[0];
    int r = y0->rank + 1;
    if (r > KF_MAX_RANK) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "output rank %d exceeds %d", r, KF_MAX_RANK);
    if (axis < -r || axis >= r) return kf_node_fail(n, KF_ERR_BAD_MODEL, "output axis %lld is out of range for rank %d", (long long)axis, r);
    if (axis < 0) axis += r;
    int64_t dims[KF_MAX_RANK];
    for (int d = 0, k = 0; d < r; d++) dims[d] = d == axis ? count : y0->dims[k++];
    KF_TRY(kf_tensor_alloc(out, y0->dtype, r, dims));
    for (int64_t t = 0; t < count; t++) KF_TRY(place(out, (int)axis, reverse ? count - 1 - t : t, &ys[t]));
    return KF_OK;
}

/* Appends res (moved) to a growing list of per-step outputs, checking it
 * has the shape and dtype of the first. */
static kf_status collect(const kf_node *n, int k, kf_tensor **list, int64_t *cnt, int64_t *cap, kf_tensor *res) {
    if (*cnt && (!same_shape(&(*list)[0], res) || (*list)[0].dtype != res->dtype)) {
        char a[160], b[160];
        shape_str(&(*list)[0], a, sizeof a);
        shape_str(res, b, sizeof b);
        return kf_node_fail(n, KF_ERR_SHAPE, "scan output %d is %s %s in step %lld but %s %s in step 0", k,
                            kf_dtype_name(res->dtype), b, (long long)*cnt, kf_dtype_name((*list)[0].dtype), a);
    }
    if (*cnt == *cap) {
        int64_t c = *cap ? *cap * 2 : 8;
        kf_tensor *nl = kf_realloc(*list, (size_t)c * sizeof(kf_tensor));
        if (!nl) return kf_fail(KF_ERR_NOMEM, "out of memory");
        memset(nl + *cap, 0, (size_t)(c - *cap) * sizeof(kf_tensor));
        *list = nl;
        *cap = c;
    }
    kf_tensor_move(&(*list)[(*cnt)++], res);
    return KF_OK;
}

static void free_lists(kf_tensor **lists, int64_t *cnt, int K) {
    for (int k = 0; lists && k < K; k++) {
        for (int64_t t = 0; t < cnt[k]; t++) kf_tensor_release(&lists[k][t]);
        kf_free(lists[k]);
    }
    kf_free(lists);
    kf_free(cnt);
}

/* Replaces carried value cur with body result res (moved), which must
 * keep its dtype. */
static kf_status carry(const kf_node *n, const char *what, int i, kf_tensor *cur, kf_tensor *res) {
    if (cur->dtype != res->dtype)
        return kf_node_fail(n, KF_ERR_SHAPE, "%s %d changes from %s to %s in the body", what, i, kf_dtype_name(cur->dtype),
                            kf_dtype_name(res->dtype));
    kf_tensor_move(cur, res);
    return KF_OK;
}

static kf_status run_if(const kf_model *m, const kf_node *n, const kf_tensor *const *in, kf_tensor *out, int depth) {
    const kf_tensor *c = in[0];
    if (!c || c->dtype != KF_DT_BOOL || c->numel != 1)
        return kf_node_fail(n, KF_ERR_SHAPE, "condition must be one bool, got %s with %lld elements",
                            c ? kf_dtype_name(c->dtype) : "nothing", c ? (long long)c->numel : 0LL);
    runner r;
    KF_TRY(runner_init(&r, m, n, kf_control_bodies(n)[kf_get_i64(c, 0) ? 0 : 1], in, depth));
    kf_status st = runner_go(&r);
    for (int j = 0; j < n->nout && !st; j++) kf_tensor_move(&out[j], &r.res[j]);
    runner_free(&r);
    return st;
}

static kf_status run_loop(const kf_model *m, const kf_node *n, const kf_tensor *const *in, kf_tensor *out, int depth) {
    int N = onnx_nin(n) - 2, K = n->nout - N;
    const kf_tensor *Mt = in[0], *ct = in[1];
    if (Mt && (!kf_dtype_is_int(Mt->dtype) || Mt->numel != 1))
        return kf_node_fail(n, KF_ERR_SHAPE, "trip count must be one int64, got %s with %lld elements",
                            kf_dtype_name(Mt->dtype), (long long)Mt->numel);
    if (ct && (ct->dtype != KF_DT_BOOL || ct->numel != 1))
        return kf_node_fail(n, KF_ERR_SHAPE, "condition must be one bool, got %s with %lld elements",
                            kf_dtype_name(ct->dtype), (long long)ct->numel);
    if (!Mt && !ct) return kf_node_fail(n, KF_ERR_UNSUPPORTED, "has neither a trip count nor a condition: it never ends");
    for (int i = 0; i < N; i++)
        if (!in[2 + i]) return kf_node_fail(n, KF_ERR_BAD_MODEL, "loop-carried value %d is missing", i);
    int64_t trips = Mt ? kf_get_i64(Mt, 0) : INT64_MAX;
    bool cond = ct ? kf_get_i64(ct, 0) != 0 : true;
    runner r;
    KF_TRY(runner_init(&r, m, n, "body", in, depth));
    kf_status st = KF_OK;
    kf_tensor iter = {0}, cv = {0};
    kf_tensor *cur = kf_calloc((size_t)N + 1, sizeof(kf_tensor));
    kf_tensor **lists = kf_calloc((size_t)K + 1, sizeof(kf_tensor *));
    int64_t *cnt = kf_calloc((size_t)(2 * K) + 1, sizeof(int64_t)), *cap = cnt + K;
    if (!cur || !lists || !cnt) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st) st = kf_tensor_alloc(&iter, KF_DT_INT64, 0, NULL);
    if (!st) st = kf_tensor_alloc(&cv, KF_DT_BOOL, 0, NULL);
    for (int i = 0; i < N && !st; i++) st = kf_tensor_copy(&cur[i], in[2 + i]);
    r.bound[0] = &iter;
    r.bound[1] = &cv;
    for (int i = 0; i < N && cur; i++) r.bound[2 + i] = &cur[i];
    int64_t it = 0;
    for (; !st && it < trips && cond; it++) {
        if (it >= MAX_LOOP_ITERS) {
            st = kf_node_fail(n, KF_ERR_UNSUPPORTED, "runs more than %lld iterations", (long long)MAX_LOOP_ITERS);
            break;
        }
        kf_set_i64(&iter, 0, it);
        kf_set_i64(&cv, 0, cond);
        if ((st = runner_go(&r))) break;
        if (ct) { /* without a condition input the body's condition is ignored */
            const kf_tensor *c2 = &r.res[0];
            if (c2->dtype != KF_DT_BOOL || c2->numel != 1) {
                st = kf_node_fail(n, KF_ERR_SHAPE, "body condition must be one bool, got %s with %lld elements",
                                  kf_dtype_name(c2->dtype), (long long)c2->numel);
                break;
            }
            cond = kf_get_i64(c2, 0) != 0;
        }
        for (int i = 0; i < N && !st; i++) st = carry(n, "loop-carried value", i, &cur[i], &r.res[1 + i]);
        for (int k = 0; k < K && !st; k++) st = collect(n, k, &lists[k], &cnt[k], &cap[k], &r.res[1 + N + k]);
    }
    for (int i = 0; i < N && !st; i++) kf_tensor_move(&out[i], &cur[i]);
    kf_type *fin = NULL; /* the body's input types, for scan outputs of no step */
    for (int k = 0; k < K && !st; k++) {
        if (cnt[k]) {
            st = stack(n, lists[k], cnt[k], 0, false, &out[N + k]);
            continue;
        }
        if (!fin && !(fin = kf_calloc((size_t)N + 2, sizeof(kf_type)))) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            break;
        }
        kf_type_of_tensor(&fin[0], &iter);
        kf_type_of_tensor(&fin[1], &cv);
        for (int i = 0; i < N; i++) kf_type_of_tensor(&fin[2 + i], &out[i]);
        st = zero_steps(&r, in, fin, 1 + N + k, 0, &out[N + k]);
    }
    kf_free(fin);
    for (int i = 0; cur && i < N; i++) kf_tensor_release(&cur[i]);
    kf_free(cur);
    free_lists(lists, cnt, K);
    kf_tensor_release(&iter);
    kf_tensor_release(&cv);
    runner_free(&r);
    return st;
}

/* One scan: states st0[0..N) and scanned inputs xs[0..M) (axes iax,
 * directions idir, `len` steps) through the body; final states go to
 * fs[0..N), scan outputs stacked along oax/odir to so[0..K). */
static kf_status scan_core(runner *r, const kf_tensor *const *in, const scan_attrs *a, const kf_tensor *const *st0,
                           const kf_tensor *const *xs, const int *iax, int64_t len, kf_tensor *fs, kf_tensor *so) {
    const kf_node *n = r->n;
    int N = a->N, M = a->M, K = a->K;
    kf_status st = KF_OK;
    kf_tensor *slices = kf_calloc((size_t)M + 1, sizeof(kf_tensor));
    kf_tensor **lists = kf_calloc((size_t)K + 1, sizeof(kf_tensor *));
    int64_t *cnt = kf_calloc((size_t)(2 * K) + 1, sizeof(int64_t)), *cap = cnt ? cnt + K : NULL;
    if (!slices || !lists || !cnt) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int i = 0; i < N && !st; i++) st = kf_tensor_copy(&fs[i], st0[i]);
    for (int i = 0; i < N; i++) r->bound[i] = &fs[i];
    for (int j = 0; j < M && slices; j++) r->bound[N + j] = &slices[j];
    for (int64_t t = 0; t < len && !st; t++) {
        for (int j = 0; j < M && !st; j++) st = take(xs[j], iax[j], a->idir[j] ? len - 1 - t : t, &slices[j]);
        if (st || (st = runner_go(r))) break;
        for (int i = 0; i < N && !st; i++) st = carry(n, "state value", i, &fs[i], &r->res[i]);
        for (int k = 0; k < K && !st; k++) st = collect(n, k, &lists[k], &cnt[k], &cap[k], &r->res[N + k]);
    }
    for (int k = 0; k < K && !st; k++) {
        int64_t axis = a->oax[k];
        if (len) {
            st = stack(n, lists[k], cnt[k], axis, a->odir[k] != 0, &so[k]);
            continue;
        }
        kf_type *fin = kf_calloc((size_t)(N + M) + 1, sizeof(kf_type));
        if (!fin) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            break;
        }
        for (int i = 0; i < N; i++) kf_type_of_tensor(&fin[i], &fs[i]);
        for (int j = 0; j < M; j++) {
            kf_type_of_tensor(&fin[N + j], xs[j]);
            remove_dim(&fin[N + j], iax[j]);
        }
        st = zero_steps(r, in, fin, N + k, (int)axis, &so[k]);
        kf_free(fin);
    }
    for (int j = 0; slices && j < M; j++) kf_tensor_release(&slices[j]);
    kf_free(slices);
    free_lists(lists, cnt, K);
    return st;
}

static kf_status run_scan(const kf_model *m, const kf_node *n, const kf_tensor *const *in, kf_tensor *out, int depth) {
    scan_attrs a;
    KF_TRY(scan_attrs_read(n, n->nout, &a));
    bool s8 = scan8(n);
    int first = s8 ? 1 : 0, N = a.N, M = a.M, K = a.K;
    kf_status st = KF_OK;
    int *axes = kf_calloc((size_t)M + 1, sizeof(int));
    if (!axes) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    for (int i = 0; i < N + M && !st; i++)
        if (!in[first + i]) st = kf_node_fail(n, KF_ERR_BAD_MODEL, "input %d is missing", first + i);
    /* every scanned input must have the same number of steps */
    int64_t len = -1;
    for (int j = 0; j < M && !st; j++) {
        const kf_tensor *x = in[first + N + j];
        int64_t ax = s8 ? 1 : a.iax[j];
        if (ax < -x->rank || ax >= x->rank || (s8 && x->rank < 2)) {
            st = kf_node_fail(n, KF_ERR_BAD_MODEL, "scan input %d has rank %d; axis %lld is out of range", j, x->rank,
                              (long long)ax);
            break;
        }
        if (ax < 0) ax += x->rank;
        axes[j] = (int)ax;
        if (len >= 0 && x->dims[ax] != len)
            st = kf_node_fail(n, KF_ERR_SHAPE, "scan input %d has %lld steps along axis %lld, scan input 0 has %lld", j,
                              (long long)x->dims[ax], (long long)ax, (long long)len);
        len = x->dims[ax];
    }
    runner r;
    memset(&r, 0, sizeof r);
    if (!st) st = runner_init(&r, m, n, "body", in, depth);
    if (st) {
        kf_free(axes);
        kf_free(a.iax);
        return st;
    }
    if (!s8) {
        const kf_tensor **st0 = kf_calloc((size_t)(N + M) + 1, sizeof(kf_tensor *));
        if (!st0) st = kf_fail(KF_ERR_NOMEM, "out of memory");
        for (int i = 0; st0 && i < N + M; i++) st0[i] = in[i];
        if (!st) st = scan_core(&r, in, &a, st0, st0 + N, axes, len, out, out + N);
        kf_free(st0);
    } else {
        /* Scan-8: every item of the batch (axis 0) is its own scan along
         * axis 1, over its first sequence_lens[b] steps; shorter items
         * leave zeros after their last step */
        const kf_tensor *sl = in[0];
        int64_t B = -1;
        for (int i = 0; i < N + M && !st; i++) {
            const kf_tensor *x = in[1 + i];
            if (x->rank < 1 || (B >= 0 && x->dims[0] != B))
                st = kf_node_fail(n, KF_ERR_SHAPE, "input %d does not have the batch size %lld as its first dim", 1 + i,
                                  (long long)B);
            else B = x->dims[0];
        }
        if (!st && sl && (!kf_dtype_is_int(sl->dtype) || sl->numel != B))
            st = kf_node_fail(n, KF_ERR_SHAPE, "sequence_lens must hold %lld integers", (long long)B);
        kf_tensor *items = kf_calloc((size_t)(2 * (N + M) + N + K) + 1, sizeof(kf_tensor));
        const kf_tensor **ip = kf_calloc((size_t)(N + M) + 1, sizeof(kf_tensor *));
        int *ax0 = kf_calloc((size_t)M + 1, sizeof(int)); /* axis 1 is axis 0 of an item */
        if (!st && (!items || !ip || !ax0)) st = kf_fail(KF_ERR_NOMEM, "out of memory");
        kf_tensor *fs = items ? items + (N + M) : NULL, *so = fs ? fs + N : NULL;
        for (int64_t b = 0; b < B && !st; b++) {
            int64_t lb = sl ? kf_get_i64(sl, b) : len;
            if (lb < 0 || lb > len) {
                st = kf_node_fail(n, KF_ERR_SHAPE, "sequence_lens[%lld] is %lld; the inputs have %lld steps",
                                  (long long)b, (long long)lb, (long long)len);
                break;
            }
            for (int i = 0; i < N + M && !st; i++) {
                st = take(in[1 + i], 0, b, &items[i]);
                ip[i] = &items[i];
            }
            if (st || (st = scan_core(&r, in, &a, ip, ip + N, ax0, lb, fs, so))) break;
            for (int i = 0; i < N + K && !st; i++) {
                kf_tensor *y = &fs[i]; /* fs and so are adjacent */
                kf_tensor *o = &out[i];
                if (b == 0) {
                    int64_t dims[KF_MAX_RANK];
                    if (y->rank + 1 > KF_MAX_RANK) {
                        st = kf_node_fail(n, KF_ERR_UNSUPPORTED, "output rank exceeds %d", KF_MAX_RANK);
                        break;
                    }
                    dims[0] = B;
                    for (int d = 0; d < y->rank; d++) dims[d + 1] = y->dims[d];
                    if (i >= N) dims[1] = len;
                    st = kf_tensor_alloc(o, y->dtype, y->rank + 1, dims);
                    if (st) break;
                }
                bool fits = o->dtype == y->dtype && o->rank == y->rank + 1;
                for (int d = 0; fits && d < y->rank; d++) fits = i >= N && d == 0 ? y->dims[0] <= o->dims[1] : y->dims[d] == o->dims[d + 1];
                if (!fits) {
                    st = kf_node_fail(n, KF_ERR_SHAPE, "output %d of batch item %lld has another dtype or shape than item 0", i,
                                      (long long)b);
                    break;
                }
                st = place(o, 0, b, y);
            }
            for (int i = 0; i < 2 * (N + M) + N + K; i++) kf_tensor_release(&items[i]);
        }
        if (!st && B == 0) /* no batch item: nothing says the outputs' shapes */
            st = kf_node_fail(n, KF_ERR_UNSUPPORTED, "a batch of 0 items is not supported");
        kf_free(items);
        kf_free(ip);
        kf_free(ax0);
    }
    runner_free(&r);
    kf_free(axes);
    kf_free(a.iax);
    return st;
}

kf_status kf_control_run(const kf_model *m, const kf_node *n, const kf_tensor *const *in, kf_tensor *out, int depth) {
    if (depth >= KF_MAX_EVAL_DEPTH)
        return kf_node_fail(n, KF_ERR_UNSUPPORTED, "bodies and function calls nested deeper than %d levels",
                            KF_MAX_EVAL_DEPTH);
    for (int j = 0; j < n->nout; j++) kf_tensor_release(&out[j]);
    kf_status st;
    switch (n->op) {
    case KF_OP_IF: st = run_if(m, n, in, out, depth); break;
    case KF_OP_LOOP: st = run_loop(m, n, in, out, depth); break;
    case KF_OP_SCAN: st = run_scan(m, n, in, out, depth); break;
    default: return kf_node_fail(n, KF_ERR_INTERNAL, "not a control-flow op");
    }
    if (st)
        for (int j = 0; j < n->nout; j++) kf_tensor_release(&out[j]);
    return st;
}

kf_status kf_control_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout, kf_tensor *out) {
    (void)nin;
    (void)nout;
    return kf_control_run(NULL, n, in, out, 0);
}
