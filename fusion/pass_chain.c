/*
 * pass_chain.c: rules that fold two data-movement nodes into one:
 * Reshape/Squeeze/Unsqueeze/Flatten chains into one Reshape, two Transposes
 * into one (or none), and Cast chains whose first Cast loses nothing.
 * C-callback rules (passes.def: KF_RULE_PASS(chain)); the rewrite driver
 * runs them with the text rules, so longer chains fold pairwise.
 */
#include <stdio.h>
#include <string.h>

#include "kf_opt.h"
#include "kf_sym.h"

/* Reshape takes its target shape as an input from opset 5 on. */
#define RESHAPE_SHAPE_INPUT_OPSET 5

static int64_t opset_of(const kf_node *n) { return n->opset ? n->opset : INT64_MAX; }

/* An initializer no caller can override through a graph input. */
static const kf_tensor *fixed(const kf_model *m, kf_id v) {
    return v && kf_value_is_constant(m, v) ? m->graph->values[v].init : NULL;
}

static bool params_fixed(const kf_model *m, const kf_node *n) {
    for (int i = 1; i < n->nin; i++)
        if (n->in[i] && m->graph->values[n->in[i]].init && !kf_value_is_constant(m, n->in[i])) return false;
    return true;
}

/* The live node producing input 0 of n when its op is `op`, else NULL. */
static const kf_node *inner_of(const kf_graph *g, const kf_node *n, kf_op op) {
    kf_id v = n->nin ? n->in[0] : 0;
    kf_id p = v ? g->values[v].producer : 0;
    if (!p || g->nodes[p].dead || g->nodes[p].op != op) return NULL;
    return &g->nodes[p];
}

/* Readers of node's first output read x instead; declines when the output
 * is a graph output and x already carries a name the file must keep. */
static kf_status forward(kf_model *m, kf_id node, kf_id x, bool *applied, const char **why) {
    kf_graph *g = m->graph;
    kf_id y = g->nodes[node].out[0];
    const kf_value *vx = &g->values[x], *vy = &g->values[y];
    if (vy->is_output && (vx->is_input || vx->is_output || vx->init)) {
        *why = "the chain is the identity between a graph input or constant and a graph output: removing it would "
               "rename one of them, so it stays";
        return KF_OK;
    }
    KF_TRY(kf_graph_replace_uses(g, y, x));
    *applied = true;
    return KF_OK;
}

/* A new single-output node op_type(ins) whose output replaces the first
 * output of node `root`. attr may be NULL. */
static kf_status replace_with(kf_model *m, kf_id root, const char *op_type, const kf_id *ins, int nin,
                              const kf_attr *attr) {
    kf_graph *g = m->graph;
    char base[512];
    snprintf(base, sizeof base, "%s", g->values[g->nodes[root].out[0]].name);
    kf_id out, nid;
    KF_TRY(kf_graph_fresh_value(g, base, &out));
    char name[600];
    snprintf(name, sizeof name, "%s/%s", kf_node_label(&g->nodes[root]), op_type);
    KF_TRY(kf_graph_add_node(g, op_type, "", name, ins, nin, &out, 1, &nid));
    kf_node *n = &g->nodes[nid];
    n->op = kf_op_lookup("", op_type);
    n->opset = kf_model_opset(m, "");
    if (attr) KF_TRY(kf_node_add_attr(n, attr));
    KF_TRY(kf_infer_node(m, nid));
    return kf_graph_replace_uses(g, g->nodes[root].out[0], out);
}

/* ---- Reshape / Squeeze / Unsqueeze / Flatten ------------------------------------------ */

static bool is_reshaping(kf_op op) {
    return op == KF_OP_RESHAPE || op == KF_OP_SQUEEZE || op == KF_OP_UNSQUEEZE || op == KF_OP_FLATTEN;
}

/* A Reshape whose target shape is a constant free of 0 (or with allowzero)
 * depends on its input only through the element count, which every
 * reshaping op keeps: it may read the chain's input directly. */
static bool reshape_reads_count_only(const kf_model *m, const kf_node *n, bool *oom) {
    if (n->op != KF_OP_RESHAPE) return false;
    bool allowzero = opset_of(n) >= 14 && kf_attr_i(n, "allowzero", 0) != 0;
    if (allowzero) return true;
    int64_t *shape = NULL, cnt = 0;
    if (opset_of(n) < RESHAPE_SHAPE_INPUT_OPSET) {
        int c;
        const int64_t *a = kf_attr_ints(n, "shape", &c);
        if (!a) return false;
        for (int i = 0; i < c; i++)
            if (a[i] == 0) return false;
        return true;
    }
    const kf_tensor *t = n->nin > 1 ? fixed(m, n->in[1]) : NULL;
    kf_status st = t ? kf_read_ints(n, t, "shape", &shape, &cnt) : KF_ERR_BAD_MODEL;
    if (st) {
        if (st == KF_ERR_NOMEM) *oom = true; /* an error, not a decline */
        else kf_clear_error();
        return false;
    }
    bool ok = true;
    for (int64_t i = 0; i < cnt; i++) ok &= shape[i] != 0;
    kf_free(shape);
    return ok;
}

/* reshape(reshape(x, s1), s2) -> reshape(x, s2)   (s2 constant without 0)
 * r2(r1(x)) -> reshape(x, static shape of the result)
 * for r1, r2 among Reshape, Squeeze, Unsqueeze, Flatten */
static kf_status collapse_reshape_chain(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    kf_id p = n->nin && n->in[0] ? g->values[n->in[0]].producer : 0;
    const kf_node *inner = p && !g->nodes[p].dead ? &g->nodes[p] : NULL;
    if (!inner || !is_reshaping(inner->op)) {
        *why = "the input is not computed by Reshape, Squeeze, Unsqueeze or Flatten";
        return KF_OK;
    }
    if (!params_fixed(m, n) || !params_fixed(m, inner)) {
        *why = "a shape or axes input is a graph input";
        return KF_OK;
    }
    kf_id x = inner->in[0];
    if (!x) {
        *why = "the inner node has no input";
        return KF_OK;
    }
    bool oom = false;
    if (reshape_reads_count_only(m, n, &oom)) {
        KF_TRY(kf_graph_set_input(g, node, 0, x));
        *applied = true;
        return KF_OK;
    }
    if (oom) return KF_ERR_NOMEM;
    const kf_type *y = &g->values[n->out[0]].type;
    /* the result's dims as a target: static, or symbols kept in place (0)
     * with at most one other (-1) */
    int64_t target[KF_MAX_RANK];
    kf_symvec want = {1, y->rank > 0 ? y->rank : 0, {{0, 0}}};
    for (int d = 0; d < want.n; d++) want.e[d] = kf_type_sdim(y, d);
    if (y->rank < 0 || !kf_symvec_target(&g->values[x].type, &want, true, false, target)) {
        *why = "the result's shape is neither static nor its input's symbols in place with one other, and the "
               "outer node is not a Reshape by a constant shape free of 0";
        return KF_OK;
    }
    for (int d = 0; d < y->rank; d++)
        if (y->dims[d] == 0) {
            *why = "the result has a zero-sized dim (Reshape would copy it from the input)";
            return KF_OK;
        }
    if (kf_model_opset(m, "") < RESHAPE_SHAPE_INPUT_OPSET) {
        *why = "the model's opset is below 5, where Reshape takes no shape input";
        return KF_OK;
    }
    int64_t rank = y->rank;
    kf_tensor *shape = kf_tensor_new();
    if (!shape) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = kf_tensor_alloc(shape, KF_DT_INT64, 1, &rank);
    if (st) {
        kf_tensor_free(shape);
        return st;
    }
    for (int d = 0; d < y->rank; d++) kf_set_i64(shape, d, target[d]);
    kf_id ins[2] = {x, 0};
    char base[512];
    snprintf(base, sizeof base, "%s/shape", g->values[n->out[0]].name);
    KF_TRY(kf_graph_add_constant(g, base, shape, &ins[1]));
    KF_TRY(replace_with(m, node, "Reshape", ins, 2, NULL));
    *applied = true;
    return KF_OK;
}

/* ---- Transpose ------------------------------------------------------------------------ */

/* The node's permutation for a rank-`rank` input (default: reversed), or
 * false when absent with an unknown rank or not a permutation. */
static bool perm_of(const kf_node *n, int rank, int *perm) {
    int cnt;
    const int64_t *p = kf_attr_ints(n, "perm", &cnt);
    if (!p) {
        if (rank < 0) return false;
        for (int d = 0; d < rank; d++) perm[d] = rank - 1 - d;
        return true;
    }
    if (cnt != rank || rank > KF_MAX_RANK) return false;
    bool seen[KF_MAX_RANK] = {false};
    for (int d = 0; d < cnt; d++) {
        if (p[d] < 0 || p[d] >= cnt || seen[p[d]]) return false;
        seen[p[d]] = true;
        perm[d] = (int)p[d];
    }
    return true;
}

/* transpose(transpose(x, p1), p2) -> transpose(x, q) with q[d] = p1[p2[d]],
 * or x when q is the identity */
static kf_status compose_transposes(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    const kf_node *inner = inner_of(g, n, KF_OP_TRANSPOSE);
    if (!inner || !inner->in[0]) {
        *why = "the input is not computed by a Transpose";
        return KF_OK;
    }
    kf_id x = inner->in[0];
    int rank = g->values[x].type.rank;
    int cnt;
    if (rank < 0 && kf_attr_ints(n, "perm", &cnt)) rank = cnt;
    int p1[KF_MAX_RANK], p2[KF_MAX_RANK];
    if (rank < 0 || rank > KF_MAX_RANK || !perm_of(inner, rank, p1) || !perm_of(n, rank, p2)) {
        *why = "a permutation is missing with an unknown rank, or malformed";
        return KF_OK;
    }
    int64_t q[KF_MAX_RANK];
    bool identity = true;
    for (int d = 0; d < rank; d++) {
        q[d] = p1[p2[d]];
        identity &= q[d] == d;
    }
    if (identity) return forward(m, node, x, applied, why);
    kf_attr perm = {.name = "perm", .type = KF_ATTR_INTS, .ints = q, .n = rank};
    KF_TRY(replace_with(m, node, "Transpose", &x, 1, &perm));
    *applied = true;
    return KF_OK;
}

/* ---- Cast ---------------------------------------------------------------------------- */

/* Integer range of a dtype: bits of magnitude and whether negatives exist.
 * Floats report their significand bits (with the implicit one). */
typedef struct num_kind {
    enum { K_NONE, K_BOOL, K_INT, K_FLOAT } kind;
    int bits;       /* ints: magnitude bits; floats: significand bits */
    bool is_signed; /* ints */
    int max_exp;    /* floats: largest binary exponent */
    int min_exp;    /* floats: smallest subnormal exponent */
} num_kind;

static num_kind kind_of(kf_dtype dt) {
    switch (dt) {
    case KF_DT_BOOL: return (num_kind){K_BOOL, 1, false, 0, 0};
    case KF_DT_UINT8: return (num_kind){K_INT, 8, false, 0, 0};
    case KF_DT_INT8: return (num_kind){K_INT, 7, true, 0, 0};
    case KF_DT_UINT16: return (num_kind){K_INT, 16, false, 0, 0};
    case KF_DT_INT16: return (num_kind){K_INT, 15, true, 0, 0};
    case KF_DT_UINT32: return (num_kind){K_INT, 32, false, 0, 0};
    case KF_DT_INT32: return (num_kind){K_INT, 31, true, 0, 0};
    case KF_DT_UINT64: return (num_kind){K_INT, 64, false, 0, 0};
    case KF_DT_INT64: return (num_kind){K_INT, 63, true, 0, 0};
    case KF_DT_FLOAT16: return (num_kind){K_FLOAT, 11, true, 15, -24};
    case KF_DT_BFLOAT16: return (num_kind){K_FLOAT, 8, true, 127, -133};
    case KF_DT_FLOAT: return (num_kind){K_FLOAT, 24, true, 127, -149};
    case KF_DT_DOUBLE: return (num_kind){K_FLOAT, 53, true, 1023, -1074};
    default: return (num_kind){K_NONE, 0, false, 0, 0};
    }
}

/* Does dtype a hold every value of dtype t exactly (NaN and infinities of
 * floats included)? */
static bool holds_exactly(kf_dtype a, kf_dtype t) {
    if (a == t) return true;
    num_kind ka = kind_of(a), kt = kind_of(t);
    if (ka.kind == K_NONE || kt.kind == K_NONE) return false;
    switch (kt.kind) {
    case K_BOOL: return true;
    case K_INT:
        if (ka.kind == K_INT) return (ka.is_signed || !kt.is_signed) && ka.bits >= kt.bits;
        return ka.kind == K_FLOAT && ka.bits >= kt.bits && ka.max_exp >= kt.bits;
    case K_FLOAT:
        return ka.kind == K_FLOAT && ka.bits >= kt.bits && ka.max_exp >= kt.max_exp && ka.min_exp <= kt.min_exp;
    default: return false;
    }
}

/* cast(cast(x, A), B) -> cast(x, B), or x when B is x's dtype, when A holds
 * every value of x exactly and converting to B then sees the same number
 * either way. Not when B is an integer reached from a float A while x is
 * an integer: float->int saturates where int->int wraps, so x must fit B.
 * Never through strings (their text depends on the source dtype). */
static kf_status fold_cast_chain(kf_model *m, kf_id node, void *user, bool *applied, const char **why) {
    (void)user;
    kf_graph *g = m->graph;
    const kf_node *n = &g->nodes[node];
    const kf_node *inner = inner_of(g, n, KF_OP_CAST);
    if (!inner || !inner->in[0]) {
        *why = "the input is not computed by a Cast";
        return KF_OK;
    }
    kf_id x = inner->in[0];
    kf_dtype t = g->values[x].type.dtype, a = g->values[n->in[0]].type.dtype, b = g->values[n->out[0]].type.dtype;
    if (!t || !a || !b) {
        *why = "a dtype is unknown";
        return KF_OK;
    }
    if (t == KF_DT_STRING || a == KF_DT_STRING || b == KF_DT_STRING) {
        *why = "a string is involved: text depends on the dtype it was printed from";
        return KF_OK;
    }
    if (!holds_exactly(a, t)) {
        *why = "the first Cast may round or overflow (its dtype does not hold every value of the input)";
        return KF_OK;
    }
    if (kind_of(b).kind == K_INT && kind_of(a).kind == K_FLOAT && kind_of(t).kind == K_INT && !holds_exactly(b, t)) {
        *why = "int -> float -> int: the float saturates where a direct int cast wraps";
        return KF_OK;
    }
    if (b == t) return forward(m, node, x, applied, why);
    KF_TRY(kf_graph_set_input(g, node, 0, x));
    *applied = true;
    return KF_OK;
}

kf_status kf_pass_chain_rules(kf_ruleset *rs) {
    KF_TRY(kf_rules_add_callback(rs, "collapse_reshape_chain", "Reshape", collapse_reshape_chain, NULL));
    KF_TRY(kf_rules_add_callback(rs, "collapse_squeeze_chain", "Squeeze", collapse_reshape_chain, NULL));
    KF_TRY(kf_rules_add_callback(rs, "collapse_unsqueeze_chain", "Unsqueeze", collapse_reshape_chain, NULL));
    KF_TRY(kf_rules_add_callback(rs, "collapse_flatten_chain", "Flatten", collapse_reshape_chain, NULL));
    KF_TRY(kf_rules_add_callback(rs, "compose_transposes", "Transpose", compose_transposes, NULL));
    KF_TRY(kf_rules_add_callback(rs, "fold_cast_chain", "Cast", fold_cast_chain, NULL));
    return KF_OK;
}
