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

/* Inference's work arrays: per value the small constant computed for it
 * (NULL: none), per node a mark (look at it). While edits are tracked (an
 * optimizer run) they stay in the graph from call to call, known as the
 * last inference left it (valid), so the next call looks again only
 * downstream of what edits touched since (kf_graph.inferq). */
typedef struct kf_infer_scratch {
    kf_tensor **known;
    uint32_t cap;
    uint8_t *mark;
    uint32_t capmark;
    bool valid;
} kf_infer_scratch;

static void known_drop(kf_infer_scratch *s, kf_id v) {
    kf_tensor_free(s->known[v]);
    s->known[v] = NULL;
}

static void scratch_release(kf_infer_scratch *s) {
    for (uint32_t v = 0; s->known && v < s->cap; v++) kf_tensor_free(s->known[v]);
    kf_free(s->known);
    kf_free(s->mark);
    memset(s, 0, sizeof *s);
}

void kf_infer_scratch_free(kf_graph *g) {
    if (!g->infer_scratch) return;
    scratch_release(g->infer_scratch);
    kf_free(g->infer_scratch);
    g->infer_scratch = NULL;
}

/* Per-node arrays for nodes of up to max inputs and outputs: operands,
 * results, and the outputs' types, contents and constants from before. */
typedef struct infer_io {
    const kf_type **tin;
    const kf_tensor **vin;
    kf_type *tout;
    kf_tensor *vout;
    const kf_symvec **sv;
    kf_type *was;
    kf_symvec *was_sv;
    bool *had_sv;
    kf_tensor **old;
} infer_io;

static void io_free(infer_io *io) {
    kf_free(io->tin);
    kf_free(io->vin);
    kf_free(io->tout);
    kf_free(io->vout);
    kf_free(io->sv);
    kf_free(io->was);
    kf_free(io->was_sv);
    kf_free(io->had_sv);
    kf_free(io->old);
    memset(io, 0, sizeof *io);
}

static kf_status io_alloc(infer_io *io, const kf_graph *g, const kf_id *order, uint32_t norder) {
    uint32_t maxio = 1;
    for (uint32_t k = 0; k < norder; k++) {
        const kf_node *n = &g->nodes[order[k]];
        if ((uint32_t)n->nin > maxio) maxio = (uint32_t)n->nin;
        if ((uint32_t)n->nout > maxio) maxio = (uint32_t)n->nout;
    }
    io->tin = kf_calloc(maxio, sizeof *io->tin);
    io->vin = kf_calloc(maxio, sizeof *io->vin);
    io->tout = kf_calloc(maxio, sizeof *io->tout);
    io->vout = kf_calloc(maxio, sizeof *io->vout);
    io->sv = kf_calloc(maxio, sizeof *io->sv);
    io->was = kf_calloc(maxio, sizeof *io->was);
    io->was_sv = kf_calloc(maxio, sizeof *io->was_sv);
    io->had_sv = kf_calloc(maxio, sizeof *io->had_sv);
    io->old = kf_calloc(maxio, sizeof *io->old);
    if (io->tin && io->vin && io->tout && io->vout && io->sv && io->was && io->was_sv && io->had_sv && io->old)
        return KF_OK;
    io_free(io);
    return kf_fail(KF_ERR_NOMEM, "out of memory");
}

/* Value v keeps constant t (moved; released when that fails). */
static kf_status keep_known(kf_infer_scratch *s, kf_id v, kf_tensor *t) {
    if (!(s->known[v] = kf_tensor_new())) {
        kf_tensor_release(t);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    kf_tensor_move(s->known[v], t);
    return KF_OK;
}

/* Infers node n from its inputs' types, constants (those the model fixes
 * and the small values computed so far) and symbolic contents; its
 * outputs have no known constant or contents on entry. A node whose op,
 * opset or arity inference does not cover is left alone. */
static kf_status infer_step(kf_model *m, kf_node *n, kf_infer_scratch *s, infer_io *io) {
    kf_graph *g = m->graph;
    const kf_op_info *info = kf_op_get(n->op);
    if (!info || !info->shape) return KF_OK;
    if (n->opset && (n->opset < info->ver_lo || n->opset > info->ver_hi)) return KF_OK;
    if (n->nin < info->in_min || (info->in_max >= 0 && n->nin > info->in_max)) return KF_OK;
    bool all_const = true;
    for (int i = 0; i < n->nin; i++) {
        kf_id v = n->in[i];
        io->tin[i] = v ? &g->values[v].type : NULL;
        io->vin[i] = !v ? NULL : kf_value_is_constant(m, v) ? g->values[v].init : s->known[v];
        io->sv[i] = v && !io->vin[i] ? g->values[v].symval : NULL;
        if (v && !io->vin[i]) all_const = false;
    }
    KF_TRY(infer_one(m, n, io->tin, io->vin, io->sv, io->tout));
    /* small constant results let later shape functions see values */
    bool small = all_const && info->eval;
    for (int j = 0; j < n->nout && small; j++) {
        int64_t cnt;
        small = kf_type_is_static(&io->tout[j]) &&
                kf_shape_numel(io->tout[j].rank, io->tout[j].dims, 1, &cnt) == KF_OK && cnt <= KF_INFER_CONST_MAX;
    }
    kf_status es = small ? kf_eval_node(n, n->nin, io->vin, io->vout) : KF_ERR_UNSUPPORTED;
    if (es == KF_ERR_NOMEM) return es;
    kf_status st = KF_OK;
    if (es == KF_OK) {
        for (int j = 0; j < n->nout; j++) {
            if (n->out[j] && !st) st = keep_known(s, n->out[j], &io->vout[j]);
            else kf_tensor_release(&io->vout[j]);
        }
    } else if (n->nout >= 1 && n->out[0]) {
        /* a shape computation whose symbols cancelled (a static dim of
         * a partly symbolic shape) is a constant from here on */
        const kf_value *o = &g->values[n->out[0]];
        if (o->symval && kf_symvec_const(o->symval) && kf_dtype_valid(o->type.dtype)) {
            kf_tensor t = {0};
            st = kf_symvec_tensor(o->symval, o->type.dtype, &t);
            if (!st) st = keep_known(s, n->out[0], &t);
        }
    }
    if (!st) kf_clear_error();
    return st;
}

/* Infers the marked nodes in topological order. An output whose type,
 * symbolic contents or computed constant changes marks its readers (and,
 * edits being tracked, is touched). */
static kf_status infer_marked(kf_model *m, kf_infer_scratch *s, const kf_id *order, uint32_t norder, infer_io *io) {
    kf_graph *g = m->graph;
    uint8_t *mark = s->mark;
    kf_status st = KF_OK;
    for (uint32_t k = 0; k < norder && !st; k++) {
        kf_id id = order[k];
        if (!mark[id]) continue;
        kf_node *n = &g->nodes[id];
        for (int j = 0; j < n->nout; j++) {
            kf_id v = n->out[j];
            io->old[j] = NULL;
            io->had_sv[j] = false;
            if (!v) continue;
            kf_value *o = &g->values[v];
            io->was[j] = o->type;
            if ((io->had_sv[j] = o->symval != NULL)) io->was_sv[j] = *o->symval;
            kf_free(o->symval); /* what this node's inference gives, or nothing */
            o->symval = NULL;
            io->old[j] = s->known[v];
            s->known[v] = NULL;
        }
        st = infer_step(m, n, s, io);
        for (int j = 0; j < n->nout; j++) {
            kf_id v = n->out[j];
            if (!st && v) {
                const kf_value *o = &g->values[v];
                bool same = type_equal(&io->was[j], &o->type) && io->had_sv[j] == !!o->symval &&
                            (!o->symval || kf_symvec_equal(&io->was_sv[j], o->symval));
                if (!same) kf_graph_touch(g, v, KF_TOUCH_DEF);
                const kf_tensor *now = s->known[v], *before = io->old[j];
                bool same_known = !now == !before && (!now || kf_tensor_equal(before, now));
                if (!same || !same_known)
                    for (uint32_t u = 0; u < o->nusers; u++) mark[o->users[u]] = 1;
            }
            kf_tensor_free(io->old[j]);
        }
    }
    return st;
}

/* A value no live node computes has no contents and no computed constant,
 * as a whole inference leaves it. */
static void unproduced(kf_graph *g, kf_infer_scratch *s, kf_id v) {
    kf_value *val = &g->values[v];
    if (val->producer && !g->nodes[val->producer].dead) return;
    if (val->symval) kf_graph_touch(g, v, KF_TOUCH_DEF);
    kf_free(val->symval);
    val->symval = NULL;
    known_drop(s, v);
}

/* Debugging (kf_graph.infer_check): the types and symbolic contents an
 * incremental inference left equal a whole inference's. */
static kf_status check_incremental(kf_model *m) {
    kf_graph *g = m->graph;
    kf_type *types = kf_malloc((size_t)g->nvalues * sizeof *types);
    kf_symvec *svs = kf_malloc((size_t)g->nvalues * sizeof *svs);
    bool *has = kf_calloc(g->nvalues, sizeof *has);
    if (!types || !svs || !has) {
        kf_free(types);
        kf_free(svs);
        kf_free(has);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (kf_id v = 1; v < g->nvalues; v++) {
        types[v] = g->values[v].type;
        if ((has[v] = g->values[v].symval != NULL)) svs[v] = *g->values[v].symval;
    }
    g->infer_check = false;
    g->infer_scratch->valid = false;
    kf_status st = kf_infer_shapes(m);
    g->infer_check = true;
    for (kf_id v = 1; !st && v < g->nvalues; v++) {
        const kf_value *val = &g->values[v];
        bool dead = !val->producer && !val->nusers && !val->is_output && !val->is_input && !val->init;
        if (dead) continue;
        bool same = type_equal(&types[v], &val->type) && has[v] == !!val->symval &&
                    (!has[v] || kf_symvec_equal(&svs[v], val->symval));
        if (!same)
            st = kf_fail(KF_ERR_INTERNAL,
                         "incremental shape inference left value '%s' unlike a whole inference (rank %d/%d, dtype "
                         "%d/%d, contents %s/%s)",
                         val->name, types[v].rank, val->type.rank, types[v].dtype, val->type.dtype,
                         has[v] ? "known" : "none", val->symval ? "known" : "none");
    }
    kf_free(types);
    kf_free(svs);
    kf_free(has);
    return st;
}

kf_status kf_infer_shapes(kf_model *m) {
    kf_graph *g = m->graph;
    kf_id *order;
    uint32_t norder;
    KF_TRY(kf_graph_topo(g, &order, &norder));
    kf_infer_scratch local = {0}, *s = &local;
    if (g->track && !g->infer_scratch && !(g->infer_scratch = kf_calloc(1, sizeof *g->infer_scratch))) {
        kf_free(order);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    if (g->track) s = g->infer_scratch;
    infer_io io = {0};
    uint32_t capk = s->cap, capm = s->capmark;
    kf_status st = kf_grow((void **)&s->known, &capk, g->nvalues, sizeof *s->known);
    s->cap = capk;
    if (!st) st = kf_grow((void **)&s->mark, &capm, g->nnodes, 1);
    s->capmark = capm;
    bool incremental = g->track && s->valid && !g->inferq_lost;
    s->valid = false;
    if (st) goto done;
    if (incremental) {
        /* the producers and readers of what edits touched */
        memset(s->mark, 0, g->nnodes);
        for (uint32_t i = 0; i < g->ninferq; i++) {
            kf_id v = g->inferq[i];
            if (v >= g->nvalues) continue;
            const kf_value *val = &g->values[v];
            unproduced(g, s, v);
            if (val->producer && !g->nodes[val->producer].dead) s->mark[val->producer] = 1;
            for (uint32_t u = 0; u < val->nusers; u++) s->mark[val->users[u]] = 1;
        }
    } else {
        for (kf_id v = 1; v < g->nvalues; v++) {
            known_drop(s, v);
            unproduced(g, s, v);
        }
        memset(s->mark, 1, g->nnodes);
    }
    if (!(st = io_alloc(&io, g, order, norder))) st = infer_marked(m, s, order, norder, &io);
done:
    io_free(&io);
    kf_free(order);
    if (!g->track) {
        scratch_release(s);
        return st;
    }
    kf_graph_inferq_clear(g);
    s->valid = !st; /* known stays for the next, incremental, call */
    if (!st && incremental && g->infer_check) st = check_incremental(m);
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
