/*
 * pattern_check.c: numerical verification of rewrite rules, the engine of
 * `kfuse patterns check`. Each rule's source pattern is instantiated as a
 * small model with random shapes that satisfy its guards and examples (size
 * 1 dims and broadcasting included); the rule is applied to a copy, and both
 * run through the reference evaluator on random, negative, large and
 * NaN/Inf inputs. A disagreement rejects the rule with a counterexample.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kf_onnx.h"
#include "kf_opt.h"

/* Shape draws per rule, and value regimes per draw. */
#define CHECK_SHAPES 8
#define CHECK_REGIMES 5
/* Drawn shapes keep at most this many elements (a rank guard of 9 or 16
 * with dims of 2..6 would otherwise draw millions or more: fuzz finding);
 * an example shape, which the author wrote, may have up to CHECK_MAX_GIVEN. */
#define CHECK_MAX_DRAWN 4096
#define CHECK_MAX_GIVEN 65536

typedef struct rng {
    uint64_t s;
} rng;

static double uni(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (double)(r->s >> 11) / 9007199254740992.0;
}

static int irange(rng *r, int lo, int hi) { return lo + (int)(uni(r) * (hi - lo + 1)); }

/* The whole range of the narrow integer types quantised values live in
 * (int8/uint8/int16/uint16); false for other types, whose inputs keep the
 * float regimes rounded down (indices, axes, shapes stay small). */
static bool narrow_int_range(kf_dtype dt, double *lo, double *hi) {
    switch (dt) {
    case KF_DT_INT8: *lo = -128; *hi = 127; return true;
    case KF_DT_UINT8: *lo = 0; *hi = 255; return true;
    case KF_DT_INT16: *lo = -32768; *hi = 32767; return true;
    case KF_DT_UINT16: *lo = 0; *hi = 65535; return true;
    default: return false;
    }
}

/* A random integer of the type's whole range, the ends a fifth of the time
 * (saturation and the zero point's extremes are where rewrites go wrong). */
static double draw_narrow_int(double lo, double hi, rng *g) {
    double u = uni(g);
    if (u < 0.1) return u < 0.05 ? lo : hi;
    if (u < 0.2) return u < 0.15 ? lo + 1 : hi - 1;
    double x = floor(lo + uni(g) * (hi - lo + 1));
    return x > hi ? hi : x;
}

static const kf_pat_guard *find_guard(const kf_rule *r, int var, kf_guard_kind kind) {
    for (int i = 0; i < r->nguards; i++)
        if (r->guards[i].var == var && r->guards[i].kind == kind) return &r->guards[i];
    return NULL;
}

static const kf_pat_example *find_example(const kf_rule *r, int var) {
    for (int i = 0; i < r->nexamples; i++)
        if (r->examples[i].var == var && r->examples[i].dtype) return &r->examples[i];
    return NULL;
}

/* The attribute example for the producer of var that shape draw `draw`
 * uses (they take turns), or NULL. */
static const kf_pat_example *attr_example(const kf_rule *r, int var, int draw) {
    int n = 0;
    for (int i = 0; i < r->nexamples; i++) n += r->examples[i].var == var && !r->examples[i].dtype;
    for (int i = 0, k = 0; n && i < r->nexamples; i++)
        if (r->examples[i].var == var && !r->examples[i].dtype && k++ == draw % n) return &r->examples[i];
    return NULL;
}

/* The bounds the `const V > X` style guards on v put on its elements:
 * lo and hi are -INFINITY and INFINITY where none is given. */
static void const_bounds(const kf_rule *r, int v, double *lo, double *hi) {
    *lo = -INFINITY;
    *hi = INFINITY;
    for (int i = 0; i < r->nguards; i++) {
        const kf_pat_guard *gd = &r->guards[i];
        if (gd->var != v || gd->kind != KF_G_CONST_CMP) continue;
        if ((gd->cmp == KF_CMP_GT || gd->cmp == KF_CMP_GE) && gd->value > *lo) *lo = gd->value;
        if ((gd->cmp == KF_CMP_LT || gd->cmp == KF_CMP_LE) && gd->value < *hi) *hi = gd->value;
    }
}

static bool const_allowed(const kf_rule *r, int v, double x) {
    for (int i = 0; i < r->nguards; i++) {
        const kf_pat_guard *gd = &r->guards[i];
        if (gd->var != v || gd->kind != KF_G_CONST_CMP) continue;
        bool ok = true;
        switch (gd->cmp) {
        case KF_CMP_EQ: ok = x == gd->value; break;
        case KF_CMP_NE: ok = x != gd->value; break;
        case KF_CMP_GE: ok = x >= gd->value; break;
        case KF_CMP_LE: ok = x <= gd->value; break;
        case KF_CMP_GT: ok = x > gd->value; break;
        case KF_CMP_LT: ok = x < gd->value; break;
        }
        if (!ok) return false;
    }
    return true;
}

/*
 * One element of a constant capture v of dtype dt that its `const V cmp X`
 * guards allow. A positive quantity (a lower bound >= 0: an epsilon, a
 * quantisation scale) is drawn over many magnitudes, 10^-8 .. 10^4 above
 * its bound, since rules that are exact for scales near 1 can fail for tiny
 * or huge ones; other bounded constants lie within 2 of their bound as
 * before. Narrow integer types span their whole range.
 */
static double draw_const(const kf_rule *r, int v, kf_dtype dt, rng *g) {
    double lo, hi, ilo, ihi;
    const_bounds(r, v, &lo, &hi);
    bool narrow = narrow_int_range(dt, &ilo, &ihi);
    for (int tries = 0; tries < 16; tries++) {
        double x;
        if (narrow) x = draw_narrow_int(ilo, ihi, g);
        else if (lo >= 0 && lo < INFINITY) x = lo + pow(10, -8 + 12 * uni(g));
        else if (lo > -INFINITY) x = lo + 1e-3 + 2 * uni(g);
        else if (hi < INFINITY) x = hi - 1e-3 - 2 * uni(g);
        else x = 4 * uni(g) - 2;
        if (!kf_dtype_is_float(dt)) x = floor(x);
        if (const_allowed(r, v, x)) return x;
    }
    /* the bounds leave little room: their middle, or just past the bound */
    if (lo > -INFINITY && hi < INFINITY) return (lo + hi) / 2;
    return lo > -INFINITY ? lo + 1 : hi < INFINITY ? hi - 1 : 0;
}

static bool is_capture(const kf_rule *r, int v) {
    if (r->vars[v].src_node >= 0 || r->vars[v].dst_node >= 0) return false;
    for (int i = 0; i < r->nsrc; i++)
        for (int a = 0; a < r->src[i].nargs; a++)
            if (r->src[i].args[a].kind == KF_PA_VAR && r->src[i].args[a].var == v) return true;
    return false;
}

static kf_model *model_new(int64_t opset) {
    kf_model *m = kf_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->graph = kf_graph_new();
    m->opsets = kf_calloc(1, sizeof(kf_opset));
    if (!m->graph || !m->opsets || !(m->opsets[0].domain = kf_strdup(""))) {
        kf_model_free(m);
        return NULL;
    }
    m->nopsets = 1;
    m->opsets[0].version = opset;
    m->ir_version = 8;
    return m;
}

/* Attributes that guards on the outputs of pattern node pn ask for and
 * the pattern itself does not give: `attr V.a == X` sets a = X, and
 * `last_axis V.a W` sets a = [-1]. */
static kf_status guard_attrs(const kf_rule *r, const kf_pat_node *pn, kf_node *n) {
    for (int i = 0; i < r->nguards; i++) {
        const kf_pat_guard *gd = &r->guards[i];
        bool mine = false;
        for (int o = 0; o < pn->nouts; o++) mine |= pn->outs[o] == gd->var;
        if (!mine || !gd->attr || kf_attr_find(n, gd->attr)) continue;
        if (gd->kind == KF_G_ATTR && gd->cmp == KF_CMP_EQ) {
            KF_TRY(kf_node_add_attr(n, &gd->attr_value));
        } else if (gd->kind == KF_G_LAST_AXIS) {
            int64_t last = -1;
            kf_attr a = {.name = gd->attr, .type = KF_ATTR_INTS, .ints = &last, .n = 1};
            KF_TRY(kf_node_add_attr(n, &a));
        }
    }
    return KF_OK;
}

typedef struct instance {
    kf_model *m;
    char desc[1024]; /* shapes, for the counterexample */
} instance;

/* The rank a `rank v == N` guard names, when it is one a tensor can have
 * (the parser allows 0..KF_MAX_RANK; the value is a double), else -1. */
static int named_rank(const kf_rule *r, int v) {
    const kf_pat_guard *g = find_guard(r, v, KF_G_RANK);
    return g && g->cmp == KF_CMP_EQ && g->value >= 0 && g->value <= KF_MAX_RANK ? (int)g->value : -1;
}

/* The dtype shape draw number `draw` gives capture v: its example's or the
 * first its `dtype` guard lists, else dflt. A guard that lists only integer
 * types (`dtype q uint8 int8`) is walked through draw by draw, the same
 * position for every capture, so a quantised value and its zero point
 * guarded alike change type together. */
static kf_dtype capture_dtype(const kf_rule *r, int v, int draw, kf_dtype dflt) {
    const kf_pat_example *ex = find_example(r, v);
    const kf_pat_guard *gd = find_guard(r, v, KF_G_DTYPE);
    kf_dtype dt = ex ? ex->dtype : gd ? gd->dtypes[0] : dflt;
    if (!gd) return dt;
    bool ints = true, listed = false;
    for (int i = 0; i < gd->ndtypes; i++) {
        ints &= kf_dtype_is_int(gd->dtypes[i]);
        listed |= gd->dtypes[i] == dt;
    }
    return ints && listed ? gd->dtypes[draw % gd->ndtypes] : dt;
}

/* Builds the source pattern as a model (shape draw number draw); false if
 * a capture's shape cannot be chosen (the caller reports it). */
static kf_status instantiate(const kf_rule *r, rng *g, int64_t opset, int draw, instance *inst) {
    kf_model *m = model_new(opset);
    if (!m) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_graph *gr = m->graph;
    int64_t symsize[16];
    for (int k = 0; k < 16; k++) symsize[k] = uni(g) < 0.2 ? 1 : irange(g, 2, 5);
    /* the default shape that plain captures share */
    int rank = irange(g, 1, 4);
    int64_t dims[KF_MAX_RANK];
    for (int d = 0; d < KF_MAX_RANK; d++) dims[d] = uni(g) < 0.15 ? 1 : irange(g, 2, 6);
    int maxrank = rank; /* the widest plain capture: the shared dims it uses stay small */
    for (int v = 0; v < r->nvars; v++)
        if (is_capture(r, v) && named_rank(r, v) > maxrank) maxrank = named_rank(r, v);
    for (;;) {
        int64_t count = 1;
        int widest = 0;
        for (int d = 0; d < maxrank; d++) {
            count *= dims[d];
            if (dims[d] > dims[widest]) widest = d;
        }
        if (count <= CHECK_MAX_DRAWN) break;
        dims[widest] /= 2;
    }
    kf_dtype default_dt = KF_DT_FLOAT;
    inst->desc[0] = 0;
    size_t dl = 0;
    kf_status st = KF_OK;
    kf_id vid[KF_PAT_MAX_VARS] = {0};
    for (int v = 0; v < r->nvars && !st; v++) {
        if (!is_capture(r, v)) continue;
        const kf_pat_example *ex = find_example(r, v);
        kf_dtype dt = capture_dtype(r, v, draw, default_dt);
        kf_type ty;
        kf_type_unknown(&ty);
        ty.dtype = dt;
        if (ex) {
            ty.rank = ex->rank;
            for (int d = 0; d < ex->rank; d++) ty.dims[d] = ex->dims[d] >= 0 ? ex->dims[d] : symsize[(-1 - ex->dims[d]) % 16];
        } else if (find_guard(r, v, KF_G_SCALAR) || find_guard(r, v, KF_G_CONST_EQ)) {
            ty.rank = 0;
        } else {
            ty.rank = named_rank(r, v) >= 0 ? named_rank(r, v) : rank;
            for (int d = 0; d < ty.rank; d++) ty.dims[d] = dims[d];
        }
        int64_t count = 1;
        bool fits = true;
        for (int d = 0; fits && d < ty.rank; d++) fits = kf_mul_ok(count, ty.dims[d] > 0 ? ty.dims[d] : 1, &count);
        if (!fits || count > CHECK_MAX_GIVEN) {
            st = kf_fail(KF_ERR_UNSUPPORTED, "rule '%s' (%s:%d): capture '%s' of the example shape has more than %d elements; "
                         "the checker needs smaller examples", r->name, r->file, r->line, r->vars[v].name, CHECK_MAX_GIVEN);
            break;
        }
        if ((st = kf_graph_add_value(gr, r->vars[v].name, &vid[v]))) break;
        const kf_pat_guard *ceq = find_guard(r, v, KF_G_CONST_EQ);
        const kf_pat_guard *axes = find_guard(r, v, KF_G_LAST_AXIS);
        if (axes && axes->attr) axes = NULL;
        bool is_const = ceq || axes || find_guard(r, v, KF_G_CONST_CMP) || find_guard(r, v, KF_G_CONST) ||
                        (ex && ex->nvalues);
        if (axes) { /* an axes input naming the last axis */
            kf_tensor *t = kf_tensor_new();
            int64_t one = 1;
            if (!t || (st = kf_tensor_alloc(t, KF_DT_INT64, 1, &one))) {
                kf_tensor_free(t);
                if (!st) st = kf_fail(KF_ERR_NOMEM, "out of memory");
                break;
            }
            kf_set_i64(t, 0, -1);
            dt = KF_DT_INT64;
            ty.rank = 1;
            ty.dims[0] = 1;
            gr->values[vid[v]].init = t;
            kf_type_of_tensor(&gr->values[vid[v]].type, t);
        } else if (is_const) {
            kf_tensor *t = kf_tensor_new();
            if (!t || (st = kf_tensor_alloc(t, dt, ty.rank, ty.dims))) {
                kf_tensor_free(t);
                if (!st) st = kf_fail(KF_ERR_NOMEM, "out of memory");
                break;
            }
            for (int64_t i = 0; i < t->numel; i++)
                kf_set_f64(t, i, ex && i < ex->nvalues ? ex->values[i] : ceq ? ceq->value : draw_const(r, v, dt, g));
            gr->values[vid[v]].init = t;
            kf_type_of_tensor(&gr->values[vid[v]].type, t);
        } else {
            gr->values[vid[v]].type = ty;
            gr->values[vid[v]].has_type = true;
            st = kf_graph_mark_input(gr, vid[v]);
        }
        int w = snprintf(inst->desc + dl, sizeof inst->desc - dl, "%s%s %s[", dl ? ", " : "", r->vars[v].name,
                         kf_dtype_name(dt));
        if (w > 0 && (size_t)w < sizeof inst->desc - dl) dl += (size_t)w;
        for (int d = 0; d < ty.rank; d++) {
            w = snprintf(inst->desc + dl, sizeof inst->desc - dl, "%s%lld", d ? "," : "", (long long)ty.dims[d]);
            if (w > 0 && (size_t)w < sizeof inst->desc - dl) dl += (size_t)w;
        }
        w = snprintf(inst->desc + dl, sizeof inst->desc - dl, "]%s", is_const ? " const" : "");
        if (w > 0 && (size_t)w < sizeof inst->desc - dl) dl += (size_t)w;
        if (!axes && dt != KF_DT_FLOAT && default_dt == KF_DT_FLOAT) default_dt = dt;
    }
    for (int i = 0; i < r->nsrc && !st; i++) {
        const kf_pat_node *pn = &r->src[i];
        kf_id ins[KF_PAT_MAX_ARGS] = {0}, outs[KF_PAT_MAX_OUTS] = {0};
        for (int a = 0; a < pn->nargs && !st; a++) {
            const kf_pat_arg *pa = &pn->args[a];
            if (pa->kind == KF_PA_VAR) {
                ins[a] = vid[pa->var];
            } else if (pa->kind == KF_PA_LITERAL) {
                kf_tensor *t = kf_tensor_new();
                if (!t || (st = kf_tensor_alloc(t, default_dt, 0, NULL))) {
                    kf_tensor_free(t);
                    if (!st) st = kf_fail(KF_ERR_NOMEM, "out of memory");
                    break;
                }
                kf_set_f64(t, 0, pa->lit);
                st = kf_graph_add_constant(gr, "literal", t, &ins[a]);
            } else {
                st = kf_fail(KF_ERR_UNSUPPORTED, "rule '%s': '_' inputs cannot be instantiated for checking; give the input a name",
                             r->name);
            }
        }
        for (int o = 0; o < pn->nouts && !st; o++) st = kf_graph_add_value(gr, r->vars[pn->outs[o]].name, &outs[o]);
        kf_id nid;
        if (!st) st = kf_graph_add_node(gr, pn->op, pn->domain, pn->op, ins, pn->nargs, outs, pn->nouts, &nid);
        if (st) break;
        kf_node *n = &gr->nodes[nid];
        n->op = kf_op_lookup(pn->domain, pn->op);
        n->opset = opset;
        for (int k = 0; k < pn->nattrs && !st; k++) st = kf_node_add_attr(n, &pn->attrs[k].value);
        for (int o = 0; o < pn->nouts && !st; o++) {
            const kf_pat_example *ae = attr_example(r, pn->outs[o], draw);
            for (int k = 0; ae && k < ae->nattrs && !st; k++)
                if (!kf_attr_find(n, ae->attrs[k].name)) st = kf_node_add_attr(n, &ae->attrs[k]);
        }
        if (!st) st = guard_attrs(r, pn, n);
        for (int o = 0; o < pn->nouts; o++) vid[pn->outs[o]] = outs[o];
    }
    /* the root feeds an Identity whose output is the graph output, so a rule
     * that replaces the root by one of its inputs is not blocked by the
     * rule that graph outputs keep their names */
    if (!st) {
        kf_id root = vid[r->src[r->nsrc - 1].outs[0]], out, nid;
        st = kf_graph_add_value(gr, "instance_output", &out);
        if (!st) st = kf_graph_add_node(gr, "Identity", "", "output", &root, 1, &out, 1, &nid);
        if (!st) {
            gr->nodes[nid].op = kf_op_lookup("", "Identity");
            gr->nodes[nid].opset = opset;
            st = kf_graph_mark_output(gr, out);
        }
    }
    if (st) {
        kf_model_free(m);
        return st;
    }
    inst->m = m;
    return KF_OK;
}

static kf_model *copy_model(const kf_model *m) {
    void *buf;
    size_t len;
    kf_model *c = NULL;
    if (kf_model_save_memory(m, &buf, &len)) return NULL;
    if (kf_model_load_memory(buf, len, NULL, &c)) c = NULL;
    free(buf);
    return c;
}

/* Fills an input for value regime k: 0 uniform [-2, 2], 1 negative,
 * 2 large magnitude, 3 tiny magnitude, 4 with NaN and +-Inf sprinkled.
 * Narrow integer inputs (quantised values, zero points) take random values
 * of their type's whole range in every regime instead. */
static void fill(kf_tensor *t, int k, rng *g) {
    double ilo, ihi;
    if (narrow_int_range(t->dtype, &ilo, &ihi)) {
        for (int64_t i = 0; i < t->numel; i++) kf_set_f64(t, i, draw_narrow_int(ilo, ihi, g));
        return;
    }
    for (int64_t i = 0; i < t->numel; i++) {
        double u = uni(g), x;
        switch (k) {
        case 0: x = 4 * u - 2; break;
        case 1: x = -0.1 - 5 * u; break;
        case 2: x = 2000 * u - 1000; break;
        case 3: x = (2 * u - 1) * 1e-3; break;
        default: x = u < 0.1 ? NAN : u < 0.15 ? INFINITY : u < 0.2 ? -INFINITY : 4 * uni(g) - 2; break;
        }
        if (!kf_dtype_is_float(t->dtype)) x = floor(x);
        kf_set_f64(t, i, x);
    }
}

static void tolerance(kf_dtype dt, double *atol, double *rtol) {
    switch (dt) {
    case KF_DT_FLOAT16: *atol = 2.5e-3; *rtol = 1e-3; break;
    case KF_DT_BFLOAT16: *atol = 2e-2; *rtol = 1e-2; break;
    default: *atol = 1e-5; *rtol = 1e-4; break;
    }
}

/* First differing element of a (replacement) vs b (source) under
 * tolerance, or -1. Integer and boolean results must be equal bit for bit.
 * With nan_refined, a number may stand where the source gives NaN (a rule
 * declared `refines nan`). */
static int64_t differ(const kf_tensor *a, const kf_tensor *b, double scale, bool nan_refined) {
    if (a->dtype != b->dtype || a->rank != b->rank || a->numel != b->numel) return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return 0;
    if (kf_dtype_is_int(a->dtype) || a->dtype == KF_DT_BOOL) {
        for (int64_t i = 0; i < a->numel; i++)
            if (kf_get_i64(a, i) != kf_get_i64(b, i)) return i;
        return -1;
    }
    double atol, rtol;
    tolerance(a->dtype, &atol, &rtol);
    if (scale > 1) {
        /* Large inputs: float32 decompositions lose digits to cancellation
         * (x - mean(x) with x near 1e3), so compare against the output's
         * magnitude rather than element by element. A wrong rule is still
         * off by the order of that magnitude. */
        double mx = 0;
        for (int64_t i = 0; i < b->numel; i++) {
            double y = fabs(kf_get_f64(b, i));
            if (isfinite(y) && y > mx) mx = y;
        }
        atol += 1e-3 * mx;
    }
    for (int64_t i = 0; i < a->numel; i++) {
        double x = kf_get_f64(a, i), y = kf_get_f64(b, i);
        if (isnan(y) && nan_refined) continue;
        if (isnan(y) || isnan(x)) {
            if (isnan(x) != isnan(y)) return i;
            continue;
        }
        if (isinf(y) || isinf(x)) {
            if (x != y) return i;
            continue;
        }
        if (fabs(x - y) > atol + rtol * fabs(y)) return i;
    }
    return -1;
}

/* A float64 copy of tensor t (float types widened; others copied). With
 * wobble > 0 every widened element is multiplied by 1 + wobble * u, u drawn
 * from [-1, 1]: the float64 computation then sees inputs as uncertain as
 * the rounding of the source's own type makes them. */
static bool widened(const kf_tensor *t, double wobble, rng *g, kf_tensor *out) {
    if (!kf_dtype_is_float(t->dtype)) return kf_tensor_copy(out, t) == KF_OK;
    if (kf_tensor_alloc(out, KF_DT_DOUBLE, t->rank, t->dims)) return false;
    for (int64_t e = 0; e < t->numel; e++)
        kf_set_f64(out, e, kf_get_f64(t, e) * (wobble > 0 ? 1 + wobble * (2 * uni(g) - 1) : 1));
    return true;
}

/* The source instance computed in float64: every float value and constant
 * widened (and wobbled, see widened), the inputs too; false where that is
 * not the same computation (a node with a dtype attribute, a value the
 * shape functions refuse in double) or it fails. */
static bool source_in_double(const kf_model *src, const kf_tensor *ins, uint32_t nreal, double wobble, rng *draw,
                             kf_tensor *truth) {
    kf_model *m = copy_model(src);
    if (!m) return false;
    kf_graph *g = m->graph;
    bool ok = true;
    for (kf_id n = 1; ok && n < g->nnodes; n++)
        ok = g->nodes[n].dead || (!kf_attr_find(&g->nodes[n], "to") && !kf_attr_find(&g->nodes[n], "dtype") &&
                                  !kf_attr_find(&g->nodes[n], "value") && !kf_attr_find(&g->nodes[n], "output_dtype"));
    for (kf_id v = 1; ok && v < g->nvalues; v++) {
        kf_value *val = &g->values[v];
        if (kf_dtype_is_float(val->type.dtype)) val->type.dtype = KF_DT_DOUBLE;
        if (val->init && kf_dtype_is_float(val->init->dtype)) {
            kf_tensor w = {0};
            ok = widened(val->init, wobble, draw, &w);
            if (ok) {
                kf_tensor_release(val->init);
                *val->init = w;
            }
        }
    }
    kf_tensor *in = ok ? kf_calloc(nreal + 1, sizeof(kf_tensor)) : NULL;
    ok = ok && in && kf_infer_shapes(m) == KF_OK;
    for (uint32_t i = 0; ok && i < nreal; i++) ok = widened(&ins[i], wobble, draw, &in[i]);
    ok = ok && kf_eval_model(m, in, (int)nreal, truth, NULL) == KF_OK;
    for (uint32_t i = 0; in && i < nreal; i++) kf_tensor_release(&in[i]);
    kf_free(in);
    kf_model_free(m);
    if (!ok) kf_clear_error();
    return ok;
}

/* How much further from the float64 source than the float32 source the
 * replacement may be: rounding once where the source rounds per op (or
 * applying a scale as two square roots, as the Attention op does) changes
 * the error by a small factor, a wrong rule by the order of the values. */
#define ROUNDING_FACTOR 8.0

/* The unit roundoff of float type dt: half the gap between 1 and the next
 * number. */
static double roundoff(kf_dtype dt) {
    switch (dt) {
    case KF_DT_FLOAT16: return 0x1p-11;
    case KF_DT_BFLOAT16: return 0x1p-8;
    case KF_DT_DOUBLE: return 0x1p-53;
    default: return 0x1p-24;
    }
}

/* Draws of the wobbled float64 source that measure an instance's
 * conditioning. */
#define WOBBLE_DRAWS 2

/* Whether every element of the replacement (got) is about as close to the
 * source computed in float64 as the float32 source (want) is at its worst
 * on this instance (ROUNDING_FACTOR), within the tolerance. The builtin
 * rules replace decompositions that round after every op by one op that
 * rounds once; on an ill-conditioned instance (a LayerNorm over two
 * near-equal values with a tiny epsilon, a Softmax over logits in the
 * thousands) the float32 source is itself the inaccurate one, and comparing
 * against it would reject a correct rule. How inaccurate it is can come out
 * small by luck, so the yardstick is also the instance's own conditioning:
 * how far the float64 source moves when its inputs and constants move by
 * one rounding of their type (scales of 1e4 multiplied into logits make
 * that spread as large as the outputs; for a well-conditioned instance it
 * stays tiny). A wrong rule is far from the float64 source on
 * well-conditioned instances. */
static bool as_close_as_source(const kf_model *src, const kf_tensor *ins, uint32_t nreal, const kf_tensor *want,
                               const kf_tensor *got, bool nan_refined, rng *g) {
    /* a replacement of another shape is wrong whatever its values */
    bool same = got->rank == want->rank && got->numel == want->numel;
    for (int d = 0; same && d < want->rank; d++) same = got->dims[d] == want->dims[d];
    if (!same) return false;
    kf_tensor truth = {0};
    if (!source_in_double(src, ins, nreal, 0, g, &truth)) return false;
    double atol, rtol;
    tolerance(want->dtype, &atol, &rtol);
    bool ok = truth.numel == want->numel;
    double worst = 0; /* the float32 source's largest error on this instance */
    for (int64_t i = 0; ok && i < want->numel; i++) {
        double y = kf_get_f64(want, i), z = kf_get_f64(&truth, i);
        if (isfinite(y) && isfinite(z)) worst = fmax(worst, fabs(y - z));
    }
    for (int w = 0; ok && w < WOBBLE_DRAWS; w++) {
        kf_tensor moved = {0};
        if (!source_in_double(src, ins, nreal, roundoff(want->dtype), g, &moved)) continue;
        for (int64_t i = 0; i < want->numel && i < moved.numel; i++) {
            double z = kf_get_f64(&truth, i), m = kf_get_f64(&moved, i);
            if (isfinite(z) && isfinite(m)) worst = fmax(worst, fabs(m - z));
        }
        kf_tensor_release(&moved);
    }
    for (int64_t i = 0; ok && i < want->numel; i++) {
        double x = kf_get_f64(got, i), y = kf_get_f64(want, i), z = kf_get_f64(&truth, i);
        if (isnan(y) && nan_refined) continue;
        if (!isfinite(x) || !isfinite(y) || !isfinite(z)) {
            ok = x == y || (isnan(x) && isnan(y));
            continue;
        }
        ok = fabs(x - z) <= ROUNDING_FACTOR * worst + atol + rtol * fabs(z);
    }
    kf_tensor_release(&truth);
    return ok;
}

static const char *regime_name(int k) {
    static const char *const names[] = {"uniform [-2,2]", "negative", "large magnitude", "tiny magnitude", "NaN/Inf sprinkled"};
    return names[k];
}

/* Checks one rule; true when it held on every instance it applied to. */
static bool check_rule(kf_rule *r, rng *g, FILE *out) {
    if (r->fn) {
        fprintf(out, "SKIP %s: C callback rules are checked by their own tests\n", r->name);
        return true;
    }
    int64_t opset = r->min_opset ? r->min_opset : 17;
    /* a rule for an opset the evaluator does not cover yet is skipped, visibly */
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < (l ? r->ndst : r->nsrc); i++) {
            const kf_pat_node *pn = l ? &r->dst[i] : &r->src[i];
            const kf_op_info *info = kf_op_get(kf_op_lookup(pn->domain, pn->op));
            if (info && (opset < info->ver_lo || opset > info->ver_hi)) {
                fprintf(out, "SKIP %s: needs opset %lld, where the evaluator does not cover %s (opsets %d..%d)\n",
                        r->name, (long long)opset, pn->op, info->ver_lo, info->ver_hi);
                return true;
            }
        }
    int applied = 0, instantiated = 0, ill_conditioned = 0;
    char last_decline[512] = "";
    for (int s = 0; s < CHECK_SHAPES; s++) {
        instance inst = {0};
        if (instantiate(r, g, opset, s, &inst)) {
            fprintf(out, "FAIL %s: cannot build an instance: %s\n", r->name, kf_last_error());
            return false;
        }
        kf_model *src = inst.m;
        if (kf_infer_shapes(src) != KF_OK) { /* this shape draw is not a valid instance */
            kf_model_free(src);
            continue;
        }
        instantiated++;
        kf_model *dst = copy_model(src);
        if (!dst) {
            kf_model_free(src);
            fprintf(out, "FAIL %s: cannot copy the instance: %s\n", r->name, kf_last_error());
            return false;
        }
        kf_rule *one[1] = {r};
        kf_ruleset rs = {one, 1, 1, NULL}; /* one rule: no shared search states */
        kf_rewrite_opts ro = {1, false}; /* one rewrite: the rule's own output may match it again */
        uint64_t hits = 0;
        kf_rules_reset_stats(&rs);
        kf_status st = kf_rewrite(dst, &rs, &ro, &hits);
        if (st) {
            fprintf(out, "FAIL %s: rewriting its own instance failed: %s\n", r->name, kf_last_error());
            kf_model_free(src);
            kf_model_free(dst);
            return false;
        }
        if (!hits) {
            snprintf(last_decline, sizeof last_decline, "%s", r->nnear ? r->near[0].reason : "no match");
            kf_model_free(src);
            kf_model_free(dst);
            continue;
        }
        applied++;
        kf_id *real;
        uint32_t nreal;
        bool ok = true;
        if (kf_graph_real_inputs(src->graph, &real, &nreal)) {
            kf_model_free(src);
            kf_model_free(dst);
            return false;
        }
        for (int k = 0; k < CHECK_REGIMES && ok; k++) {
            kf_tensor *ins = kf_calloc(nreal + 1, sizeof(kf_tensor));
            kf_tensor want = {0}, got = {0};
            for (uint32_t i = 0; i < nreal && ins; i++) {
                const kf_type *ty = &src->graph->values[real[i]].type;
                if (kf_tensor_alloc(&ins[i], ty->dtype, ty->rank, ty->dims) == KF_OK) fill(&ins[i], k, g);
            }
            kf_status s1 = kf_eval_model(src, ins, (int)nreal, &want, NULL);
            char e1[256];
            snprintf(e1, sizeof e1, "%s", s1 ? kf_last_error() : "");
            kf_status s2 = kf_eval_model(dst, ins, (int)nreal, &got, NULL);
            int64_t bad = -1;
            if (!s1 && !s2) bad = differ(&got, &want, k == 2 ? 1e3 : 1.0, r->nan_refined);
            if (bad >= 0 && kf_dtype_is_float(want.dtype) && got.dtype == want.dtype &&
                as_close_as_source(src, ins, nreal, &want, &got, r->nan_refined, g)) {
                bad = -1;
                ill_conditioned++;
            }
            if ((s1 != KF_OK) != (s2 != KF_OK) || bad >= 0) {
                ok = false;
                fprintf(out, "FAIL %s (%s:%d): source and replacement disagree\n", r->name, r->file, r->line);
                fprintf(out, "  instance: %s; values: %s\n", inst.desc, regime_name(k));
                bool shape = !s1 && !s2 && (got.dtype != want.dtype || got.rank != want.rank || got.numel != want.numel);
                for (int d = 0; !s1 && !s2 && !shape && d < want.rank; d++) shape = got.dims[d] != want.dims[d];
                if (s1 || s2)
                    fprintf(out, "  source: %s; replacement: %s\n", s1 ? e1 : "ok", s2 ? kf_last_error() : "ok");
                else if (shape)
                    fprintf(out, "  the outputs differ in type or shape: source %s of rank %d (%lld elements), replacement "
                                 "%s of rank %d (%lld elements)\n",
                            kf_dtype_name(want.dtype), want.rank, (long long)want.numel, kf_dtype_name(got.dtype), got.rank,
                            (long long)got.numel);
                else
                    fprintf(out, "  element %lld: source %.9g, replacement %.9g\n", (long long)bad,
                            bad < want.numel ? kf_get_f64(&want, bad) : 0.0, bad < got.numel ? kf_get_f64(&got, bad) : 0.0);
                for (uint32_t i = 0; i < nreal; i++) {
                    fprintf(out, "  input %s:", src->graph->values[real[i]].name);
                    for (int64_t e = 0; e < ins[i].numel && e < 8; e++) fprintf(out, " %.6g", kf_get_f64(&ins[i], e));
                    fprintf(out, "%s\n", ins[i].numel > 8 ? " ..." : "");
                }
            }
            for (uint32_t i = 0; i < nreal && ins; i++) kf_tensor_release(&ins[i]);
            kf_free(ins);
            kf_tensor_release(&want);
            kf_tensor_release(&got);
        }
        kf_free(real);
        kf_model_free(src);
        kf_model_free(dst);
        if (!ok) return false;
    }
    if (!applied) {
        fprintf(out, "FAIL %s: never applied to its own instances (%d valid of %d drawn)%s%s\n", r->name, instantiated,
                CHECK_SHAPES, last_decline[0] ? "; last decline: " : "", last_decline);
        return false;
    }
    fprintf(out, "ok   %s: held on %d instances x %d value sets", r->name, applied, CHECK_REGIMES);
    if (ill_conditioned)
        fprintf(out, " (%d of them judged against the source in float64: the float32 source was off too)",
                ill_conditioned);
    fputc('\n', out);
    return true;
}

kf_status kf_rules_check(kf_ruleset *rs, uint64_t seed, FILE *out, kf_check_result *res) {
    memset(res, 0, sizeof *res);
    if (!seed) seed = (uint64_t)time(NULL) * 2654435761u + (uint64_t)clock();
    if (!seed) seed = 1;
    fprintf(out, "checking %u rules, seed %llu\n", rs->n, (unsigned long long)seed);
    rng g = {seed};
    for (uint32_t i = 0; i < rs->n; i++) {
        res->rules++;
        if (check_rule(rs->rules[i], &g, out)) res->passed++;
        else res->failed++;
    }
    return KF_OK;
}
