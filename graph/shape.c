/*
 * shape.c: whole-graph shape and dtype inference. Walks nodes in
 * topological order, feeds each op's shape function the input types (and
 * small constant values, computed on the way with the reference kernels so
 * shape subgraphs resolve), and merges the result with what the file
 * declared. Passes and the fusion planner read the types this leaves.
 */
#include <stdio.h>
#include <string.h>

#include "kf_ref.h"
#include "kf_sym.h"

/* Records a declared shape that the graph contradicts; the computed shape
 * replaces it. Files exported with one sequence length and traced with
 * another (the 12-layer BERT of ../shared/models) declare such shapes;
 * ONNX Runtime warns and runs them. */
static void shape_warning(kf_model *m, const kf_node *n, const char *vname, const char *what) {
    if (!m->shape_warnings++)
        snprintf(m->shape_warning, sizeof m->shape_warning, "node '%s' (%s): output '%s' %s", kf_node_label(n),
                 n->op_type, vname, what);
}

/* Merges inferred type `inf` into declared `dec` of value `v`. A dtype
 * disagreement is an error; a rank or dim disagreement is a warning and the
 * inferred shape wins. */
static kf_status merge(kf_model *m, const kf_node *n, kf_id v, kf_type *dec, const kf_type *inf) {
    const kf_graph *g = m->graph;
    const char *vname = g->values[v].name;
    if (inf->dtype) {
        if (dec->dtype && dec->dtype != inf->dtype)
            return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): output '%s' is %s, the model declares %s", kf_node_label(n),
                           n->op_type, vname, kf_dtype_name(inf->dtype), kf_dtype_name(dec->dtype));
        dec->dtype = inf->dtype;
    }
    if (inf->rank < 0) return KF_OK;
    kf_type out = *dec;
    if (dec->rank < 0 || dec->rank != inf->rank) {
        if (dec->rank >= 0) {
            char what[96];
            snprintf(what, sizeof what, "has rank %d, the model declares %d", inf->rank, dec->rank);
            shape_warning(m, n, vname, what);
        }
        out = *inf;
        out.dtype = dec->dtype;
    } else {
        for (int d = 0; d < dec->rank; d++) {
            if (inf->dims[d] >= 0) {
                if (dec->dims[d] >= 0 && dec->dims[d] != inf->dims[d]) {
                    char what[128];
                    snprintf(what, sizeof what, "dim %d is %lld, the model declares %lld", d,
                             (long long)inf->dims[d], (long long)dec->dims[d]);
                    shape_warning(m, n, vname, what);
                }
                out.dims[d] = inf->dims[d];
                out.syms[d] = 0;
            } else if (dec->dims[d] < 0 && !dec->syms[d]) {
                out.syms[d] = inf->syms[d];
            }
        }
    }
    /* The loader refuses a type whose known dims multiply past 64 bits, so
     * inference must not write one; the check is on the merged type, since
     * a declared dim can fill the one an inferred shape left open. */
    if (!kf_dims_fit(out.rank, out.dims))
        return kf_fail(KF_ERR_SHAPE, "node '%s' (%s): output '%s' would have dims whose product (zeros aside) does not fit in 64 bits",
                       kf_node_label(n), n->op_type, vname);
    *dec = out;
    return KF_OK;
}

/* Runs node n's shape function on tin/vin, refined by the symbolic contents
 * sv of shape operands, merges the result into its outputs' types and sets
 * output 0's symbolic contents (NULL when none). */
static kf_status infer_one(kf_model *m, kf_node *n, const kf_type **tin, const kf_tensor **vin,
                           const kf_symvec **sv, kf_type *tout) {
    kf_graph *g = m->graph;
    const kf_op_info *info = kf_op_get(n->op);
    for (int j = 0; j < n->nout; j++) kf_type_unknown(&tout[j]);
    KF_TRY(info->shape(n, n->nin, tin, vin, n->nout, tout));
    /* a shape operand (Reshape/Expand/ConstantOfShape/Tile/Range) that is
     * symbolic, or constant against symbolic dims (Reshape to [-1, 64] of
     * [batch, seq, 64] is [batch*seq, 64]) */
    if (n->nout >= 1 && !kf_type_is_static(&tout[0])) {
        kf_type t = tout[0];
        if (kf_symvec_shape(g, n, tin, vin, sv, &t)) tout[0] = t;
        KF_TRY(kf_sym_take_nomem(g));
    }
    for (int j = 0; j < n->nout; j++)
        if (n->out[j]) KF_TRY(merge(m, n, n->out[j], &g->values[n->out[j]].type, &tout[j]));
    if (n->nout < 1 || !n->out[0]) return KF_OK;
    kf_value *o = &g->values[n->out[0]];
    kf_free(o->symval);
    o->symval = NULL;
    kf_symvec v;
    bool known = kf_symvec_node(g, n, tin, vin, sv, &v);
    KF_TRY(kf_sym_take_nomem(g));
    if (!known) return KF_OK;
    if (!(o->symval = kf_malloc(sizeof v))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    *o->symval = v;
    return KF_OK;
}

/* Same dtype, rank, dims and dim symbols (the dims past the rank are not
 * looked at: they may never have been set). */
static bool type_equal(const kf_type *a, const kf_type *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (int d = 0; d < a->rank && d < KF_MAX_RANK; d++)
        if (a->dims[d] != b->dims[d] || a->syms[d] != b->syms[d]) return false;
    return true;
}

/* Per-value work arrays of one inference: computed small constants (all
 * empty between calls) and, with edit tracking, the types and contents
 * from before. An optimizer run keeps them in the graph from call to call
 * (each is a few hundred KB on a transformer, and allocating and freeing
 * them every round had the heap trimmed and faulted back in). */
typedef struct kf_infer_scratch {
    kf_tensor *known;
    kf_type *was;
    struct kf_symvec **was_sv;
    uint32_t cap;
} kf_infer_scratch;

static void scratch_release(kf_infer_scratch *s) {
    kf_free(s->known);
    kf_free(s->was);
    kf_free(s->was_sv);
    memset(s, 0, sizeof *s);
}

void kf_infer_scratch_free(kf_graph *g) {
    if (!g->infer_scratch) return;
    scratch_release(g->infer_scratch);
    kf_free(g->infer_scratch);
    g->infer_scratch = NULL;
}

/* Arrays for n values (known all empty; was and was_sv too when track). */
static kf_status scratch_reserve(kf_infer_scratch *s, uint32_t n, bool track) {
    if (s->cap >= n && (!track || s->was)) return KF_OK;
    scratch_release(s);
    s->known = kf_calloc(n, sizeof *s->known);
    if (track) {
        s->was = kf_malloc((size_t)n * sizeof *s->was);
        s->was_sv = kf_calloc(n, sizeof *s->was_sv);
    }
    if (!s->known || (track && (!s->was || !s->was_sv))) {
        scratch_release(s);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    s->cap = n;
    return KF_OK;
}

kf_status kf_infer_shapes(kf_model *m) {
    kf_graph *g = m->graph;
    kf_id *order;
    uint32_t norder;
    KF_TRY(kf_graph_topo(g, &order, &norder));
    kf_status st = KF_OK;
    kf_infer_scratch local = {0}, *s = &local;
    if (g->track && !g->infer_scratch && !(g->infer_scratch = kf_calloc(1, sizeof *g->infer_scratch))) {
        kf_free(order);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    if (g->track) s = g->infer_scratch;
    if ((st = scratch_reserve(s, g->nvalues, g->track))) {
        kf_free(order);
        return st;
    }
    kf_tensor *known = s->known; /* computed small constants */
    const kf_type **tin = NULL;
    const kf_tensor **vin = NULL;
    kf_type *tout = NULL;
    kf_tensor *vout = NULL;
    const kf_symvec **sv = NULL;
    kf_type *was = g->track ? s->was : NULL; /* edit tracking: types and contents before */
    struct kf_symvec **was_sv = g->track ? s->was_sv : NULL;
    uint32_t maxio = 1;
    for (uint32_t k = 0; k < norder; k++) {
        const kf_node *n = &g->nodes[order[k]];
        if ((uint32_t)n->nin > maxio) maxio = (uint32_t)n->nin;
        if ((uint32_t)n->nout > maxio) maxio = (uint32_t)n->nout;
    }
    tin = kf_calloc(maxio, sizeof *tin);
    vin = kf_calloc(maxio, sizeof *vin);
    tout = kf_calloc(maxio, sizeof *tout);
    vout = kf_calloc(maxio, sizeof *vout);
    sv = kf_calloc(maxio, sizeof *sv);
    if (!tin || !vin || !tout || !vout || !sv) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* with edit tracking on, what inference changes is touched: the types
     * and symbolic contents from before are kept to compare */
    for (kf_id v = 1; v < g->nvalues; v++) {
        if (was) {
            was[v] = g->values[v].type;
            was_sv[v] = g->values[v].symval;
        } else {
            kf_free(g->values[v].symval);
        }
        g->values[v].symval = NULL;
    }
    for (uint32_t k = 0; k < norder && !st; k++) {
        kf_node *n = &g->nodes[order[k]];
        const kf_op_info *info = kf_op_get(n->op);
        if (!info || !info->shape) continue;
        if (n->opset && (n->opset < info->ver_lo || n->opset > info->ver_hi)) continue;
        if (n->nin < info->in_min || (info->in_max >= 0 && n->nin > info->in_max)) continue;
        bool all_const = true;
        for (int i = 0; i < n->nin; i++) {
            kf_id v = n->in[i];
            tin[i] = v ? &g->values[v].type : NULL;
            vin[i] = !v ? NULL : kf_value_is_constant(m, v) ? g->values[v].init : known[v].data ? &known[v] : NULL;
            sv[i] = v && !vin[i] ? g->values[v].symval : NULL;
            if (v && !vin[i]) all_const = false;
        }
        if ((st = infer_one(m, n, tin, vin, sv, tout))) break;
        /* small constant results let later shape functions see values */
        bool small = all_const && info->eval;
        for (int j = 0; j < n->nout && small; j++) {
            int64_t cnt;
            small = kf_type_is_static(&tout[j]) &&
                    kf_shape_numel(tout[j].rank, tout[j].dims, 1, &cnt) == KF_OK && cnt <= KF_INFER_CONST_MAX;
        }
        kf_status es = small ? kf_eval_node(n, n->nin, vin, vout) : KF_ERR_UNSUPPORTED;
        if (es == KF_ERR_NOMEM) {
            st = es;
            break;
        }
        if (es == KF_OK) {
            for (int j = 0; j < n->nout; j++) {
                if (n->out[j]) kf_tensor_move(&known[n->out[j]], &vout[j]);
                else kf_tensor_release(&vout[j]);
            }
        } else if (n->nout >= 1 && n->out[0]) {
            /* a shape computation whose symbols cancelled (a static dim of
             * a partly symbolic shape) is a constant from here on */
            const kf_value *o = &g->values[n->out[0]];
            if (o->symval && kf_symvec_const(o->symval) && kf_dtype_valid(o->type.dtype))
                st = kf_symvec_tensor(o->symval, o->type.dtype, &known[n->out[0]]);
        }
        if (!st) kf_clear_error();
    }
    for (kf_id v = 1; was && !st && v < g->nvalues; v++) {
        const kf_value *val = &g->values[v];
        bool same_sv = !was_sv[v] == !val->symval && (!val->symval || kf_symvec_equal(was_sv[v], val->symval));
        if (!same_sv || !type_equal(&was[v], &val->type)) kf_graph_touch(g, v, KF_TOUCH_DEF);
    }
done:
    if (was_sv)
        for (kf_id v = 1; v < g->nvalues; v++) {
            kf_free(was_sv[v]);
            was_sv[v] = NULL;
        }
    for (kf_id v = 0; v < g->nvalues; v++)
        if (known[v].data || known[v].dtype) kf_tensor_release(&known[v]);
    if (s == &local) scratch_release(s);
    kf_free(tin);
    kf_free(vin);
    kf_free(tout);
    kf_free(vout);
    kf_free(sv);
    kf_free(order);
    return st;
}

kf_status kf_infer_node(kf_model *m, kf_id node) {
    kf_graph *g = m->graph;
    kf_node *n = &g->nodes[node];
    const kf_op_info *info = kf_op_get(n->op);
    if (!info || !info->shape || n->nin > 64 || n->nout > 64) return KF_OK;
    if (n->nin < info->in_min || (info->in_max >= 0 && n->nin > info->in_max)) return KF_OK;
    const kf_type *tin[64];
    const kf_tensor *vin[64];
    const kf_symvec *sv[64];
    kf_tensor held[64]; /* symbolic contents that turned out constant */
    kf_type tout[64];
    memset(held, 0, sizeof(kf_tensor) * (size_t)n->nin);
    kf_status st = KF_OK;
    for (int i = 0; i < n->nin && !st; i++) {
        kf_id v = n->in[i];
        const kf_value *val = v ? &g->values[v] : NULL;
        tin[i] = val ? &val->type : NULL;
        vin[i] = val && kf_value_is_constant(m, v) ? val->init : NULL;
        sv[i] = val && !vin[i] ? val->symval : NULL;
        if (sv[i] && kf_symvec_const(sv[i]) && kf_dtype_valid(val->type.dtype)) {
            st = kf_symvec_tensor(sv[i], val->type.dtype, &held[i]);
            vin[i] = &held[i];
            sv[i] = NULL;
        }
    }
    /* with edit tracking on, outputs whose type or contents this refines
     * are touched (a pass refreshing types node by node, like fold) */
    kf_type was[64];
    kf_symvec was_sv;
    bool had_sv = false;
    if (g->track) {
        for (int j = 0; j < n->nout; j++)
            if (n->out[j]) was[j] = g->values[n->out[j]].type;
        if (n->nout >= 1 && n->out[0] && g->values[n->out[0]].symval) {
            was_sv = *g->values[n->out[0]].symval;
            had_sv = true;
        }
    }
    if (!st) st = infer_one(m, n, tin, vin, sv, tout);
    for (int i = 0; i < n->nin; i++) kf_tensor_release(&held[i]);
    if (!st && g->track)
        for (int j = 0; j < n->nout; j++) {
            const kf_value *o = n->out[j] ? &g->values[n->out[j]] : NULL;
            if (!o) continue;
            bool same = type_equal(&was[j], &o->type);
            if (j == 0) same = same && had_sv == !!o->symval && (!had_sv || kf_symvec_equal(&was_sv, o->symval));
            if (!same) kf_graph_touch(g, n->out[j], KF_TOUCH_DEF);
        }
    return st;
}
