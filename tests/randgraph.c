/*
 * randgraph.c: random valid graphs and the differential check behind
 * tests/test_random_graphs.c and kfuse_randgraph (DESIGN.md testing layer 3).
 * The generator keeps, for every float value it made, its concrete shape and
 * an interval holding all its elements, and only applies an op where the
 * result stays finite and well conditioned (no log of ~0, no division by
 * ~0, magnitudes bounded), so any disagreement between paths is a bug and
 * not rounding noise. Discontinuous ops (comparisons, casts that round) only
 * read "exact" values: inputs, constants and data movement of those, which
 * every path computes bit for bit.
 */
#include "randgraph.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kf_fuse.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "kf_precision.h"
#include "kf_run.h"
#include "onnx.pb-c.h"

/* ---- random numbers (splitmix64: a seed alone fixes every draw) -------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next64(rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double unif(rng *r, double lo, double hi) {
    return lo + (hi - lo) * ((double)(next64(r) >> 11) / 9007199254740992.0);
}
static int irand(rng *r, int n) { return n <= 1 ? 0 : (int)(next64(r) % (uint64_t)n); }
static bool chance(rng *r, double p) { return unif(r, 0, 1) < p; }

/* Out of memory inside the test generator: nothing sensible to do but stop. */
static void need(kf_status st) {
    if (st == KF_OK) return;
    fprintf(stderr, "randgraph: %s: %s\n", kf_status_name(st), kf_last_error());
    exit(3);
}

/* ---- generator state ------------------------------------------------------ */

/* Largest |element| a float value may reach. fp32 rounding of a value of 64
 * is ~4e-6, below the 1e-5 absolute tolerance, so a difference of two
 * differently rounded values never fails the comparison on its own. fp16 is
 * held to 4 for the same reason against its 2.5e-3. */
#define MAG32 64.0
#define MAG16 4.0
/* Elements per value: keeps the reference evaluator and PoCL fast enough
 * for thousands of graphs per CI minute. */
#define MAX_NUMEL 1024
/* Values the generator tracks (well above 40 nodes plus their constants). */
#define MAX_VALS 256
#define MAX_R 4 /* rank of generated values: covers conv's NCHW */

typedef struct val {
    kf_id id;
    int rank;
    int64_t dims[MAX_R + 2];
    double lo, hi; /* every element lies in [lo, hi] */
    bool exact;    /* computed bit for bit by every path */
} val;

typedef struct gen {
    rng r;
    kf_model *m;
    kf_graph *g;
    val v[MAX_VALS];
    int nv;
    int nodes, target;
    int64_t opset;
    kf_dtype ft; /* float dtype of this graph */
    double mag;
    int names;
} gen;

static kf_id new_value(gen *G, char prefix) {
    char nm[32];
    snprintf(nm, sizeof nm, "%c%d", prefix, G->names++);
    kf_id id;
    need(kf_graph_add_value(G->g, nm, &id));
    return id;
}

static int64_t numel(int rank, const int64_t *d) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= d[i];
    return n;
}

static val *push(gen *G, kf_id id, int rank, const int64_t *dims, double lo, double hi, bool exact) {
    if (G->nv >= MAX_VALS) return NULL;
    val *x = &G->v[G->nv++];
    x->id = id;
    x->rank = rank;
    memcpy(x->dims, dims, sizeof(int64_t) * (size_t)rank);
    x->lo = lo;
    x->hi = hi;
    x->exact = exact;
    return x;
}

static bool bounded(const gen *G, double lo, double hi) {
    return isfinite(lo) && isfinite(hi) && fabs(lo) <= G->mag && fabs(hi) <= G->mag;
}

/* A node with one output; attributes go on the returned pointer before any
 * other node is added (the node array may move). */
static kf_node *mk(gen *G, const char *op, const kf_id *in, int nin, kf_id *out) {
    *out = new_value(G, 'v');
    char nm[32];
    snprintf(nm, sizeof nm, "n%d", G->nodes);
    kf_id nid;
    need(kf_graph_add_node(G->g, op, "", nm, in, nin, out, 1, &nid));
    kf_node *n = &G->g->nodes[nid];
    n->op = kf_op_lookup("", op);
    n->opset = G->opset;
    G->nodes++;
    return n;
}

static void attr_i(kf_node *n, const char *name, int64_t v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_INT, .i = v};
    need(kf_node_add_attr(n, &a));
}
static void attr_f(kf_node *n, const char *name, float v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_FLOAT, .f = v};
    need(kf_node_add_attr(n, &a));
}
static void attr_ints(kf_node *n, const char *name, int count, const int64_t *v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_INTS, .ints = (int64_t *)v, .n = count};
    need(kf_node_add_attr(n, &a));
}

/* A float constant with values uniform in [lo, hi); pushed to the pool when
 * push is set. Returns the tracked value (or a temporary when not pushed). */
static val *fconst(gen *G, int rank, const int64_t *dims, double lo, double hi, bool pushit) {
    static val tmp;
    kf_tensor *t = kf_tensor_new();
    if (!t) need(KF_ERR_NOMEM);
    need(kf_tensor_alloc(t, G->ft, rank, dims));
    double mn = INFINITY, mx = -INFINITY;
    for (int64_t i = 0; i < t->numel; i++) {
        kf_set_f64(t, i, unif(&G->r, lo, hi));
        double x = kf_get_f64(t, i);
        mn = fmin(mn, x);
        mx = fmax(mx, x);
    }
    kf_id id = new_value(G, 'c');
    G->g->values[id].init = t;
    kf_type_of_tensor(&G->g->values[id].type, t);
    if (pushit) {
        val *p = push(G, id, rank, dims, mn, mx, true);
        if (p) return p;
    }
    tmp = (val){.id = id, .rank = rank, .lo = mn, .hi = mx, .exact = true};
    memcpy(tmp.dims, dims, sizeof(int64_t) * (size_t)rank);
    return &tmp;
}

static kf_id fscalar(gen *G, double v, bool rank1) {
    int64_t one = 1;
    val *c = fconst(G, rank1 ? 1 : 0, &one, v, v, false);
    return c->id;
}

static kf_id iconst(gen *G, int rank, const int64_t *dims, const int64_t *vals) {
    kf_tensor *t = kf_tensor_new();
    if (!t) need(KF_ERR_NOMEM);
    need(kf_tensor_alloc(t, KF_DT_INT64, rank, dims));
    for (int64_t i = 0; i < t->numel; i++) ((int64_t *)t->data)[i] = vals[i];
    kf_id id = new_value(G, 'c');
    G->g->values[id].init = t;
    kf_type_of_tensor(&G->g->values[id].type, t);
    return id;
}
static kf_id ilist(gen *G, int n, const int64_t *vals) {
    int64_t d = n;
    return iconst(G, 1, &d, vals);
}

/* A new graph input; dims of size 3 may be declared symbolic ("N" or "S"),
 * the size gt_random_inputs and rg_inputs give symbols. */
static val *finput(gen *G, int rank, const int64_t *dims) {
    kf_id id = new_value(G, 'x');
    kf_value *v = &G->g->values[id];
    kf_type_unknown(&v->type);
    v->type.dtype = G->ft;
    v->type.rank = rank;
    for (int i = 0; i < rank; i++) {
        v->type.dims[i] = dims[i];
        if (dims[i] == 3 && chance(&G->r, 0.5)) {
            v->type.dims[i] = -1;
            v->type.syms[i] = kf_graph_sym(G->g, chance(&G->r, 0.5) ? "N" : "S");
        }
    }
    v->has_type = true;
    need(kf_graph_mark_input(G->g, id));
    return push(G, id, rank, dims, -2, 2, true);
}

static int64_t rdim(gen *G) {
    static const int64_t d[] = {1, 2, 3, 3, 4, 4, 5, 8};
    return d[irand(&G->r, 8)];
}

static val *fresh_input(gen *G, int minrank) {
    int rank = minrank + irand(&G->r, MAX_R + 1 - minrank);
    int64_t dims[MAX_R];
    for (int i = 0; i < rank; i++) dims[i] = rdim(G);
    /* now and then a long last axis on a small input: rows that codegen holds
     * in registers (steps of 4 or 8 along a row of 32+ steps, KF_CG_ROW_CACHE) */
    if (rank >= 1 && rank <= 2 && chance(&G->r, 0.15)) dims[rank - 1] = chance(&G->r, 0.5) ? 128 : 264;
    return finput(G, rank, dims);
}

/* Picks a pooled value satisfying ok (NULL: any), preferring recent ones so
 * graphs grow deep as well as wide. */
typedef bool (*val_ok)(const gen *G, const val *x);
static val *pick(gen *G, val_ok ok) {
    int idx[MAX_VALS], n = 0;
    for (int i = 0; i < G->nv; i++)
        if (!ok || ok(G, &G->v[i])) idx[n++] = i;
    if (!n) return NULL;
    int k = chance(&G->r, 0.6) ? n - 1 - irand(&G->r, n < 4 ? n : 4) : irand(&G->r, n);
    return &G->v[idx[k]];
}

/* ---- shapes --------------------------------------------------------------- */

static bool bcast(int ra, const int64_t *a, int rb, const int64_t *b, int *ro, int64_t *o) {
    int r = ra > rb ? ra : rb;
    for (int i = 0; i < r; i++) {
        int64_t x = i < r - ra ? 1 : a[i - (r - ra)];
        int64_t y = i < r - rb ? 1 : b[i - (r - rb)];
        if (x != y && x != 1 && y != 1) return false;
        o[i] = x == 1 ? y : x;
    }
    *ro = r;
    return numel(r, o) <= MAX_NUMEL;
}

/* A shape that broadcasts with a's: a suffix of it with some dims set to 1,
 * a's size-1 dims sometimes widened, sometimes an extra leading dim. */
static int partner_shape(gen *G, const val *a, int64_t *d) {
    int r = irand(&G->r, a->rank + 1);
    if (chance(&G->r, 0.5)) r = a->rank;
    for (int i = 0; i < r; i++) {
        int64_t ad = a->dims[a->rank - r + i];
        d[i] = ad;
        if (ad == 1 && chance(&G->r, 0.4)) d[i] = 2 + irand(&G->r, 3);
        else if (chance(&G->r, 0.25)) d[i] = 1;
    }
    if (r == a->rank && r < MAX_R && chance(&G->r, 0.1)) {
        memmove(d + 1, d, sizeof(int64_t) * (size_t)r);
        d[0] = 1 + irand(&G->r, 3);
        r++;
    }
    return r;
}

/* The second operand of a broadcasting op: an existing value that
 * broadcasts with a, or a new constant or input. lo/hi bound new values. */
static val *partner(gen *G, const val *a, double lo, double hi, val_ok ok) {
    if (chance(&G->r, 0.45)) {
        int idx[MAX_VALS], n = 0;
        for (int i = 0; i < G->nv; i++) {
            int ro;
            int64_t o[MAX_R + 2];
            if (G->v[i].rank <= MAX_R && bcast(a->rank, a->dims, G->v[i].rank, G->v[i].dims, &ro, o) && ro <= MAX_R &&
                (!ok || ok(G, &G->v[i])))
                idx[n++] = i;
        }
        if (n) return &G->v[idx[irand(&G->r, n)]];
    }
    int64_t d[MAX_R + 1];
    int r = partner_shape(G, a, d);
    if (r > MAX_R || numel(r, d) > MAX_NUMEL) return NULL;
    if (lo >= -2 && hi <= 2 && lo < 0 && hi > 0 && chance(&G->r, 0.3)) return finput(G, r, d);
    return fconst(G, r, d, lo, hi, true);
}

/* ---- elementwise ops with interval bounds -------------------------------- */

static double sigm(double x) { return 1 / (1 + exp(-x)); }

/* Swish (opset 24), or SwiGLU (28) gating a value of x's shape: an existing
 * one or a new constant. For alpha > 0, Swish(x) = x * sigmoid(alpha * x)
 * lies between max(x, -0.279 / alpha) (its minimum is -0.2785 / alpha)
 * and max(x, 0). */
static bool emit_swish(gen *G, const val *x) {
    static const float alphas[] = {1.0f, 0.5f, 1.702f};
    float alpha = alphas[irand(&G->r, 3)];
    double lo = x->lo >= 0 ? 0 : fmax(x->lo, -0.279 / alpha), hi = fmax(x->hi, 0);
    kf_id in[2] = {x->id, 0};
    int nin = 1;
    const char *op = "Swish";
    if (G->opset >= 28 && chance(&G->r, 0.5)) {
        val b = {0};
        int idx[MAX_VALS], n = 0;
        for (int i = 0; i < G->nv; i++)
            if (G->v[i].rank == x->rank && !memcmp(G->v[i].dims, x->dims, sizeof(int64_t) * (size_t)x->rank))
                idx[n++] = i;
        if (n && chance(&G->r, 0.5)) b = G->v[idx[irand(&G->r, n)]];
        else b = *fconst(G, x->rank, x->dims, -2, 2, false);
        double c[4] = {lo * b.lo, lo * b.hi, hi * b.lo, hi * b.hi};
        lo = fmin(fmin(c[0], c[1]), fmin(c[2], c[3]));
        hi = fmax(fmax(c[0], c[1]), fmax(c[2], c[3]));
        op = "SwiGLU";
        in[1] = b.id;
        nin = 2;
    }
    if (!bounded(G, lo, hi)) return false;
    val xv = *x;
    kf_id out;
    kf_node *n = mk(G, op, in, nin, &out);
    if (alpha != 1.0f || chance(&G->r, 0.5)) attr_f(n, "alpha", alpha);
    push(G, out, xv.rank, xv.dims, lo, hi, false);
    return true;
}

static bool emit_unary(gen *G) {
    val *x = pick(G, NULL);
    if (!x) return false;
    if (G->opset >= 24 && chance(&G->r, 0.12)) return emit_swish(G, x);
    static const char *ops[] = {"Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Erf", "LeakyRelu", "Exp",
                                "Log", "Sqrt", "Reciprocal", "Softplus", "Clip", "Identity", "Floor", "Sign",
                                "HardSigmoid", "Elu", "Softsign", "Selu", "Sin", "Cos", "Ceil", "Round"};
    const char *op = ops[irand(&G->r, (int)(sizeof ops / sizeof *ops))];
    if (G->opset >= 20 && chance(&G->r, 0.1)) op = "Gelu";
    double lo = x->lo, hi = x->hi;
    float alpha = 0;
    double cmin = 0, cmax = 0;
    if (!strcmp(op, "Relu")) lo = fmax(lo, 0), hi = fmax(hi, 0);
    else if (!strcmp(op, "Sigmoid")) lo = sigm(lo), hi = sigm(hi);
    else if (!strcmp(op, "Tanh")) lo = tanh(lo), hi = tanh(hi);
    else if (!strcmp(op, "Erf")) lo = erf(lo), hi = erf(hi);
    else if (!strcmp(op, "Neg")) lo = -x->hi, hi = -x->lo;
    else if (!strcmp(op, "Abs")) {
        hi = fmax(fabs(x->lo), fabs(x->hi));
        lo = x->lo >= 0 ? x->lo : x->hi <= 0 ? -x->hi : 0;
    } else if (!strcmp(op, "LeakyRelu")) {
        static const float a[] = {0.01f, 0.1f, 0.2f};
        alpha = a[irand(&G->r, 3)];
        lo = lo < 0 ? lo * alpha : lo;
        hi = hi < 0 ? hi * alpha : hi;
    } else if (!strcmp(op, "Exp")) {
        if (hi > 4) return false;
        lo = exp(lo), hi = exp(hi);
    } else if (!strcmp(op, "Log")) {
        if (lo < 0.1) return false;
        lo = log(lo), hi = log(hi);
    } else if (!strcmp(op, "Sqrt")) {
        if (lo < 0.05) return false;
        lo = sqrt(lo), hi = sqrt(hi);
    } else if (!strcmp(op, "Reciprocal")) {
        if (lo < 0.25 && hi > -0.25) return false;
        double a = 1 / hi, b = 1 / lo;
        lo = a, hi = b;
    } else if (!strcmp(op, "Softplus")) {
        if (hi > 15) return false;
        lo = log1p(exp(lo)), hi = log1p(exp(hi));
    } else if (!strcmp(op, "Clip")) {
        cmin = unif(&G->r, -1.5, 0.5);
        cmax = cmin + unif(&G->r, 0.1, 2);
        lo = fmin(fmax(lo, cmin), cmax), hi = fmin(fmax(hi, cmin), cmax);
    } else if (!strcmp(op, "Floor") || !strcmp(op, "Sign") || !strcmp(op, "Ceil") || !strcmp(op, "Round")) {
        if (!x->exact) return false; /* discontinuous: exact inputs only */
        if (op[0] == 'F') lo = floor(lo), hi = floor(hi);
        else if (op[0] == 'C') lo = ceil(lo), hi = ceil(hi);
        else if (op[0] == 'R') lo = round(lo) - 1, hi = round(hi) + 1;
        else lo = lo < 0 ? -1 : lo > 0 ? 1 : 0, hi = hi < 0 ? -1 : hi > 0 ? 1 : 0;
    } else if (!strcmp(op, "HardSigmoid")) {
        lo = fmin(fmax(0.2 * lo + 0.5, 0), 1), hi = fmin(fmax(0.2 * hi + 0.5, 0), 1);
    } else if (!strcmp(op, "Elu")) {
        lo = lo < 0 ? exp(lo) - 1 : lo, hi = hi < 0 ? exp(hi) - 1 : hi;
    } else if (!strcmp(op, "Selu")) {
        const double a = 1.67326319217681884765625, g = 1.05070102214813232421875;
        lo = lo < 0 ? g * a * (exp(lo) - 1) : g * lo, hi = hi < 0 ? g * a * (exp(hi) - 1) : g * hi;
    } else if (!strcmp(op, "Softsign")) {
        lo = lo / (1 + fabs(lo)), hi = hi / (1 + fabs(hi));
    } else if (!strcmp(op, "Sin") || !strcmp(op, "Cos")) {
        lo = -1, hi = 1;
    } else if (!strcmp(op, "Gelu")) {
        lo = fmin(lo, -0.2), hi = fmax(hi, 0);
    }
    if (!bounded(G, lo, hi)) return false;
    kf_id in[3] = {x->id, 0, 0};
    int nin = 1;
    if (!strcmp(op, "Clip")) {
        /* the fp32 bounds are rounded to the graph's dtype */
        in[1] = fscalar(G, cmin, false);
        in[2] = fscalar(G, cmax, false);
        nin = 3;
        if (chance(&G->r, 0.2)) in[1] = 0; /* absent min */
        if (!in[1]) lo = fmin(x->lo, lo);
    }
    kf_id out;
    kf_node *n = mk(G, op, in, nin, &out);
    if (alpha > 0) attr_f(n, "alpha", alpha);
    if (!strcmp(op, "Gelu") && chance(&G->r, 0.5)) {
        kf_attr a = {.name = "approximate", .type = KF_ATTR_STRING, .s = {"tanh", 4}};
        need(kf_node_add_attr(n, &a));
    }
    bool exact = x->exact && (!strcmp(op, "Relu") || !strcmp(op, "Neg") || !strcmp(op, "Abs") ||
                              !strcmp(op, "Identity") || !strcmp(op, "Floor") || !strcmp(op, "Sign") ||
                              !strcmp(op, "Clip") || !strcmp(op, "Ceil") || !strcmp(op, "Round"));
    push(G, out, x->rank, x->dims, fmin(lo, hi), fmax(lo, hi), exact);
    return true;
}

static bool pos_ok(const gen *G, const val *x) { (void)G; return x->lo >= 0.1; }
static bool away_ok(const gen *G, const val *x) { (void)G; return x->lo >= 0.25 || x->hi <= -0.25; }
static bool exact_ok(const gen *G, const val *x) { (void)G; return x->exact; }

static bool emit_binary(gen *G) {
    static const char *ops[] = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Add", "Mul"};
    const char *op = ops[irand(&G->r, (int)(sizeof ops / sizeof *ops))];
    bool isdiv = !strcmp(op, "Div"), ispow = !strcmp(op, "Pow");
    val *a = pick(G, ispow ? pos_ok : NULL);
    if (!a) return false;
    val *b;
    double e = 0;
    if (isdiv) {
        double s = chance(&G->r, 0.5) ? 1 : -1;
        b = partner(G, a, s > 0 ? 0.5 : -2, s > 0 ? 2 : -0.5, away_ok);
    } else if (ispow) {
        static const double ex[] = {2, 3, 0.5, -1, 1.5};
        e = ex[irand(&G->r, 5)];
        int64_t one = 1;
        b = fconst(G, irand(&G->r, 2), &one, e, e, false);
    } else {
        b = partner(G, a, -2, 2, NULL);
    }
    if (!b) return false;
    val bb = *b; /* the pool may move when partner adds values */
    int ro;
    int64_t od[MAX_R + 2];
    if (!bcast(a->rank, a->dims, bb.rank, bb.dims, &ro, od) || ro > MAX_R) return false;
    double lo, hi;
    double p[4] = {a->lo * bb.lo, a->lo * bb.hi, a->hi * bb.lo, a->hi * bb.hi};
    if (!strcmp(op, "Add") || !strcmp(op, "Sum")) lo = a->lo + bb.lo, hi = a->hi + bb.hi;
    else if (!strcmp(op, "Sub")) lo = a->lo - bb.hi, hi = a->hi - bb.lo;
    else if (!strcmp(op, "Mean")) lo = (a->lo + bb.lo) / 2, hi = (a->hi + bb.hi) / 2;
    else if (!strcmp(op, "Max")) lo = fmax(a->lo, bb.lo), hi = fmax(a->hi, bb.hi);
    else if (!strcmp(op, "Min")) lo = fmin(a->lo, bb.lo), hi = fmin(a->hi, bb.hi);
    else if (!strcmp(op, "Mul")) lo = fmin(fmin(p[0], p[1]), fmin(p[2], p[3])), hi = fmax(fmax(p[0], p[1]), fmax(p[2], p[3]));
    else if (isdiv) {
        if (bb.lo < 0.25 && bb.hi > -0.25) return false;
        double q[4] = {a->lo / bb.lo, a->lo / bb.hi, a->hi / bb.lo, a->hi / bb.hi};
        lo = fmin(fmin(q[0], q[1]), fmin(q[2], q[3])), hi = fmax(fmax(q[0], q[1]), fmax(q[2], q[3]));
    } else { /* Pow with a positive base */
        double x = pow(a->lo, e), y = pow(a->hi, e);
        lo = fmin(x, y), hi = fmax(x, y);
    }
    if (!bounded(G, lo, hi)) return false;
    kf_id in[3] = {a->id, bb.id, 0};
    int nin = 2;
    if ((!strcmp(op, "Sum") || !strcmp(op, "Max") || !strcmp(op, "Min")) && chance(&G->r, 0.3)) {
        /* variadic: a third operand shaped like the result */
        val *c = fconst(G, ro, od, -1, 1, false);
        in[nin++] = c->id;
        if (op[0] == 'S') lo += c->lo, hi += c->hi;
        else if (op[1] == 'a') lo = fmax(lo, c->lo), hi = fmax(hi, c->hi);
        else lo = fmin(lo, c->lo), hi = fmin(hi, c->hi);
        if (!bounded(G, lo, hi)) return false;
    }
    if (!ispow && !isdiv && strcmp(op, "Sub") && chance(&G->r, 0.3)) { /* commutative: either order */
        kf_id t = in[0];
        in[0] = in[1];
        in[1] = t;
    }
    kf_id out;
    mk(G, op, in, nin, &out);
    bool exact = a->exact && bb.exact && (!strcmp(op, "Max") || !strcmp(op, "Min"));
    push(G, out, ro, od, lo, hi, exact);
    return true;
}

/* Where(x > c, a, b) with x exact, so the condition is the same bit on
 * every path. */
static bool emit_where(gen *G) {
    val *x = pick(G, exact_ok);
    if (!x) return false;
    val xx = *x;
    static const char *cmps[] = {"Greater", "Less", "GreaterOrEqual", "LessOrEqual"};
    double cv = unif(&G->r, -1, 1);
    bool rk1 = chance(&G->r, 0.3);
    kf_id cin[2] = {xx.id, fscalar(G, cv, rk1)};
    kf_id cond;
    mk(G, cmps[irand(&G->r, G->opset >= 12 ? 4 : 2)], cin, 2, &cond); /* *OrEqual: opset 12 */
    val *a = partner(G, &xx, -2, 2, NULL);
    if (!a) return false;
    val aa = *a;
    int r1, ro;
    int64_t d1[MAX_R + 2], od[MAX_R + 2], one = 1;
    if (rk1 && !bcast(xx.rank, xx.dims, 1, &one, &xx.rank, xx.dims)) return false; /* the condition's shape */
    if (!bcast(xx.rank, xx.dims, aa.rank, aa.dims, &r1, d1) || r1 > MAX_R) return false;
    val *b = partner(G, &xx, -2, 2, NULL);
    if (!b) return false;
    val bb = *b;
    if (!bcast(r1, d1, bb.rank, bb.dims, &ro, od) || ro > MAX_R) return false;
    kf_id in[3] = {cond, aa.id, bb.id};
    kf_id out;
    mk(G, "Where", in, 3, &out);
    push(G, out, ro, od, fmin(aa.lo, bb.lo), fmax(aa.hi, bb.hi), aa.exact && bb.exact);
    return true;
}

/* Casts: in fp32 graphs an exact value round-trips through float16 or
 * int32 (lossy, so folding the pair would be a bug); any value may be cast
 * to its own type (a no-op the optimizer removes). */
static bool emit_cast(gen *G) {
    val *x = pick(G, NULL);
    if (!x) return false;
    val xx = *x;
    kf_id in = xx.id, mid, out;
    if (xx.exact && chance(&G->r, 0.7)) {
        kf_dtype to = G->ft == KF_DT_FLOAT ? (chance(&G->r, 0.5) ? KF_DT_FLOAT16 : KF_DT_INT32)
                                           : (chance(&G->r, 0.5) ? KF_DT_FLOAT : KF_DT_INT32);
        attr_i(mk(G, "Cast", &in, 1, &mid), "to", to);
        attr_i(mk(G, "Cast", &mid, 1, &out), "to", G->ft);
        double lo = xx.lo, hi = xx.hi;
        if (to == KF_DT_INT32) lo = trunc(lo), hi = trunc(hi);
        else lo = floor(lo) - 1, hi = ceil(hi) + 1; /* rounding to fp16 widens a little */
        push(G, out, xx.rank, xx.dims, lo, hi, true);
        return true;
    }
    attr_i(mk(G, "Cast", &in, 1, &out), "to", G->ft);
    push(G, out, xx.rank, xx.dims, xx.lo, xx.hi, xx.exact);
    return true;
}

/* ---- reductions and normalisation ----------------------------------------- */

/* Adds the axes of a reduction as the attribute or the input the opset
 * wants (ReduceSum takes an input from 13, the others from 18). */
static kf_id reduce(gen *G, const char *op, kf_id x, int naxes, const int64_t *axes, int keep) {
    bool as_input = !strcmp(op, "ReduceSum") ? G->opset >= 13 : G->opset >= 18;
    kf_id in[2] = {x, 0}, out;
    if (as_input) in[1] = ilist(G, naxes, axes);
    kf_node *n = mk(G, op, in, as_input ? 2 : 1, &out);
    if (!as_input) attr_ints(n, "axes", naxes, axes);
    if (keep >= 0) attr_i(n, "keepdims", keep);
    return out;
}

static bool rank1_ok(const gen *G, const val *x) { (void)G; return x->rank >= 1; }

static bool emit_reduce(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    static const char *ops[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"};
    const char *op = ops[irand(&G->r, 4)];
    int64_t axes[MAX_R];
    int na = 0;
    int64_t n = 1;
    for (int i = 0; i < xx.rank; i++)
        if (chance(&G->r, 0.4)) {
            axes[na++] = chance(&G->r, 0.3) ? i - xx.rank : i;
            n *= xx.dims[i];
        }
    if (!na) {
        axes[na++] = -1;
        n = xx.dims[xx.rank - 1];
    }
    double lo = xx.lo, hi = xx.hi;
    if (op[6] == 'S') lo = xx.lo < 0 ? xx.lo * (double)n : xx.lo, hi = xx.hi > 0 ? xx.hi * (double)n : xx.hi;
    if (!bounded(G, lo, hi)) return false;
    int keep = irand(&G->r, 3) - 1; /* -1: attribute absent (default 1) */
    int64_t od[MAX_R];
    int ro = 0;
    for (int i = 0; i < xx.rank; i++) {
        bool red = false;
        for (int k = 0; k < na; k++) red |= (axes[k] + (axes[k] < 0 ? xx.rank : 0)) == i;
        if (!red) od[ro++] = xx.dims[i];
        else if (keep != 0) od[ro++] = 1;
    }
    kf_id out = reduce(G, op, xx.id, na, axes, keep);
    push(G, out, ro, od, lo, hi, xx.exact && (op[6] == 'M' && op[7] != 'e'));
    return true;
}

static bool emit_softmax(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    int axis = irand(&G->r, 2 * xx.rank) - xx.rank;
    if (chance(&G->r, 0.5)) axis = -1;
    int64_t n = xx.dims[axis < 0 ? axis + xx.rank : axis];
    if (G->opset < 13) /* before 13: over the 2-D coercion, every dim from axis on */
        n = numel(xx.rank - (axis < 0 ? axis + xx.rank : axis), xx.dims + (axis < 0 ? axis + xx.rank : axis));
    bool logsm = chance(&G->r, 0.3);
    double span = xx.hi - xx.lo;
    double mn = 1 / (1 + (double)(n - 1) * exp(span));
    kf_id out;
    kf_node *nd = mk(G, logsm ? "LogSoftmax" : "Softmax", &xx.id, 1, &out);
    if (axis != -1 || chance(&G->r, 0.5)) attr_i(nd, "axis", axis);
    if (logsm) push(G, out, xx.rank, xx.dims, fmax(log(mn), -G->mag), 0, false);
    else push(G, out, xx.rank, xx.dims, mn, 1, false);
    return true;
}

static bool lastdim2_ok(const gen *G, const val *x) { (void)G; return x->rank >= 1 && x->dims[x->rank - 1] >= 2; }

/* NORM_EPS_NOTE: normalisation epsilons are 1e-2 or 5e-2, not the 1e-5
 * exporters write. On a row of near-equal values (two elements 1e-3 apart
 * happen often enough), (x - mean) / sqrt(var + eps) magnifies a rounding
 * difference of its input by up to 1/sqrt(eps): 316 for 1e-5, so the
 * decomposed graph (rounded to fp32 per op) and LayerNormalization
 * (accumulated in double) differ by 2e-5 > the fp32 atol of 1e-5, with the
 * decomposition the inaccurate one (campaign seeds 330247, 338619). With
 * eps >= 1e-2 the factor is <= 10. The rules accept any eps > 0, so they
 * fire all the same. */
/* LayerNormalization, or from opset 23 RMSNormalization, over the last
 * dims from a random axis. */
static bool emit_layernorm(gen *G) {
    /* Not in fp16: normalising a row of near-equal values divides by a tiny
     * deviation and magnifies any upstream rounding difference (a folded
     * BatchNorm, a fused softmax) past the fp16 tolerance; seeds 309763,
     * 311863, 313329 of the campaign. */
    if (G->opset < 17 || G->ft == KF_DT_FLOAT16) return false;
    val *x = pick(G, lastdim2_ok);
    if (!x) return false;
    val xx = *x;
    int axis = xx.rank - 1;
    if (chance(&G->r, 0.3)) axis = irand(&G->r, xx.rank);
    int64_t nn = numel(xx.rank - axis, xx.dims + axis);
    val *sc = fconst(G, xx.rank - axis, xx.dims + axis, 0.5, 1.5, false);
    /* both norms bound an element by sqrt(row) * |scale|: a normalised row
     * has unit variance (LayerNorm) or unit mean square (RMSNorm) */
    double bound = sqrt((double)nn) * fmax(fabs(sc->lo), fabs(sc->hi));
    kf_id in[3] = {xx.id, sc->id, 0};
    int nin = 2;
    bool rms = G->opset >= 23 && chance(&G->r, 0.4);
    if (!rms && chance(&G->r, 0.6)) {
        val *b = fconst(G, xx.rank - axis, xx.dims + axis, -1, 1, false);
        in[nin++] = b->id;
        bound += fmax(fabs(b->lo), fabs(b->hi));
    }
    if (!bounded(G, -bound, bound)) return false;
    kf_id out;
    kf_node *n = mk(G, rms ? "RMSNormalization" : "LayerNormalization", in, nin, &out);
    if (axis != xx.rank - 1 || chance(&G->r, 0.5)) attr_i(n, "axis", chance(&G->r, 0.5) ? axis : axis - xx.rank);
    attr_f(n, "epsilon", chance(&G->r, 0.5) ? 1e-2f : 5e-2f); /* see NORM_EPS_NOTE */
    push(G, out, xx.rank, xx.dims, -bound, bound, false);
    return true;
}

/* ---- GEMM, conv, BatchNorm ------------------------------------------------ */

/* max over output columns of sum |w| along the contraction, for a weight
 * laid out [k, n] (colmajor false) or [n, k] (true). */
static double colsum(const kf_tensor *w, int64_t k, int64_t n, bool nk) {
    double best = 0;
    for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t i = 0; i < k; i++) s += fabs(kf_get_f64(w, nk ? j * k + i : i * n + j));
        best = fmax(best, s);
    }
    return best;
}
static double vmax(const val *x) { return fmax(fabs(x->lo), fabs(x->hi)); }

/* y = BatchNormalization(y) over channel dim 1 with c channels. */
static bool add_bn(gen *G, kf_id y, int rank, const int64_t *dims, double bound, double *outb, kf_id *out) {
    int64_t c = dims[1];
    val s = *fconst(G, 1, &c, 0.5, 1.5, false);
    val b = *fconst(G, 1, &c, -1, 1, false);
    val mu = *fconst(G, 1, &c, -0.5, 0.5, false);
    val var = *fconst(G, 1, &c, 0.5, 2, false);
    double nb = (bound + vmax(&mu)) / sqrt(var.lo) * vmax(&s) + vmax(&b);
    if (!bounded(G, -nb, nb)) return false;
    kf_id in[5] = {y, s.id, b.id, mu.id, var.id};
    kf_node *n = mk(G, "BatchNormalization", in, 5, out);
    if (chance(&G->r, 0.3)) attr_f(n, "epsilon", 1e-3f);
    (void)rank;
    *outb = nb;
    return true;
}

static bool emit_matmul(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    int64_t k = xx.dims[xx.rank - 1], n = 1 + irand(&G->r, 8);
    int64_t wd[2] = {k, n};
    double s = 1 / sqrt((double)k);
    int64_t od[MAX_R];
    int ro = xx.rank;
    memcpy(od, xx.dims, sizeof od);
    od[ro - 1] = n;
    if (numel(ro, od) > MAX_NUMEL) return false;
    int copies = chance(&G->r, 0.25) ? 2 + irand(&G->r, 2) : 1; /* siblings: horizontal merge */
    bool any = false;
    for (int c = 0; c < copies; c++) {
        val w = *fconst(G, 2, wd, -s, s, false);
        double bound = colsum(G->g->values[w.id].init, k, n, false) * vmax(&xx);
        if (!bounded(G, -bound, bound)) return any;
        kf_id in[2] = {xx.id, w.id}, y;
        mk(G, "MatMul", in, 2, &y);
        if (chance(&G->r, 0.4)) { /* bias: MatMul + Add -> Gemm */
            val b = *fconst(G, 1, &n, -1, 1, false);
            kf_id ain[2] = {y, b.id};
            if (chance(&G->r, 0.3)) ain[0] = b.id, ain[1] = y;
            mk(G, "Add", ain, 2, &y);
            bound += vmax(&b);
        }
        if (ro == 2 && chance(&G->r, 0.3)) {
            double nb;
            kf_id z;
            if (add_bn(G, y, ro, od, bound, &nb, &z)) y = z, bound = nb;
        }
        push(G, y, ro, od, -bound, bound, false);
        any = true;
    }
    return any;
}

static bool rank2_ok(const gen *G, const val *x) { (void)G; return x->rank == 2; }

static bool emit_gemm(gen *G) {
    val *x = pick(G, rank2_ok);
    if (!x) x = fresh_input(G, 2), x = x && x->rank == 2 ? x : NULL;
    if (!x) return false;
    val xx = *x;
    bool ta = chance(&G->r, 0.3), tb = chance(&G->r, 0.5);
    int64_t m = ta ? xx.dims[1] : xx.dims[0], k = ta ? xx.dims[0] : xx.dims[1], n = 1 + irand(&G->r, 8);
    int64_t wd[2] = {tb ? n : k, tb ? k : n};
    double s = 1 / sqrt((double)k);
    val w = *fconst(G, 2, wd, -s, s, false);
    static const float al[] = {1.0f, 0.5f, 2.0f};
    float alpha = al[irand(&G->r, 3)], beta = al[irand(&G->r, 3)];
    double bound = colsum(G->g->values[w.id].init, k, n, tb) * vmax(&xx) * alpha;
    kf_id in[3] = {xx.id, w.id, 0};
    int nin = 2;
    if (chance(&G->r, 0.6)) {
        int64_t cd[2] = {1, n};
        int form = irand(&G->r, 4);
        val c;
        if (form == 0) c = *fconst(G, 1, &n, -1, 1, false);
        else if (form == 1) c = *fconst(G, 2, cd, -1, 1, false);
        else if (form == 2) cd[0] = m, c = *fconst(G, 2, cd, -1, 1, false);
        else c = *fconst(G, 0, cd, -1, 1, false);
        in[nin++] = c.id;
        bound += vmax(&c) * beta;
    }
    if (!bounded(G, -bound, bound)) return false;
    kf_id y;
    kf_node *nd = mk(G, "Gemm", in, nin, &y);
    if (ta) attr_i(nd, "transA", 1);
    if (tb) attr_i(nd, "transB", 1);
    if (alpha != 1.0f) attr_f(nd, "alpha", alpha);
    if (nin == 3 && beta != 1.0f) attr_f(nd, "beta", beta);
    int64_t od[2] = {m, n};
    if (chance(&G->r, 0.3)) {
        double nb;
        kf_id z;
        if (add_bn(G, y, 2, od, bound, &nb, &z)) y = z, bound = nb;
    }
    push(G, y, 2, od, -bound, bound, false);
    return true;
}

static bool rank4_ok(const gen *G, const val *x) { (void)G; return x->rank == 4 && x->dims[2] >= 2 && x->dims[3] >= 2; }

static bool emit_conv(gen *G) {
    val *x = pick(G, rank4_ok);
    if (!x || chance(&G->r, 0.3)) {
        int64_t d[4];
        d[0] = 1 + irand(&G->r, 2);
        d[1] = 1 + irand(&G->r, 4);
        d[2] = 3 + irand(&G->r, 4);
        d[3] = 3 + irand(&G->r, 4);
        x = finput(G, 4, d);
    }
    if (!x) return false;
    val xx = *x;
    int64_t c = xx.dims[1], mch = 1 + irand(&G->r, 4);
    int64_t group = 1;
    /* ConvTranspose: weight [C, M, kh, kw], output (in - 1) * stride - 2 pad + k */
    bool tr = chance(&G->r, 0.25);
    if (!tr && c > 1 && chance(&G->r, 0.2)) group = c, mch = c; /* depthwise */
    int64_t kh = 1 + irand(&G->r, 3), kw = 1 + irand(&G->r, 3);
    int64_t pad = irand(&G->r, 2), stride = 1 + irand(&G->r, 2);
    if (tr && (pad >= kh || pad >= kw)) pad = 0; /* keeps every output dim >= 1 */
    if (!tr && (kh > xx.dims[2] + 2 * pad || kw > xx.dims[3] + 2 * pad)) return false;
    int64_t wd[4] = {tr ? c : mch, tr ? mch : c / group, kh, kw};
    double s = 1 / sqrt((double)((tr ? c : wd[1]) * kh * kw));
    val w = *fconst(G, 4, wd, -s, s, false);
    int64_t per = wd[1] * kh * kw;
    double bound;
    if (tr) { /* an output element sums at most every weight of its channel */
        const kf_tensor *wt = G->g->values[w.id].init;
        bound = 0;
        for (int64_t m = 0; m < mch; m++) {
            double sum = 0;
            for (int64_t ci = 0; ci < c; ci++)
                for (int64_t e = 0; e < kh * kw; e++) sum += fabs(kf_get_f64(wt, (ci * mch + m) * kh * kw + e));
            bound = fmax(bound, sum);
        }
        bound *= vmax(&xx);
    } else {
        bound = colsum(G->g->values[w.id].init, per, mch, true) * vmax(&xx);
    }
    kf_id in[3] = {xx.id, w.id, 0};
    int nin = 2;
    if (chance(&G->r, 0.5)) {
        val b = *fconst(G, 1, &mch, -1, 1, false);
        in[nin++] = b.id;
        bound += vmax(&b);
    }
    if (!bounded(G, -bound, bound)) return false;
    int64_t od[4] = {xx.dims[0], mch, (xx.dims[2] + 2 * pad - kh) / stride + 1, (xx.dims[3] + 2 * pad - kw) / stride + 1};
    if (tr) od[2] = (xx.dims[2] - 1) * stride - 2 * pad + kh, od[3] = (xx.dims[3] - 1) * stride - 2 * pad + kw;
    if (numel(4, od) > MAX_NUMEL) return false;
    kf_id y;
    kf_node *n = mk(G, tr ? "ConvTranspose" : "Conv", in, nin, &y);
    int64_t pads[4] = {pad, pad, pad, pad}, strides[2] = {stride, stride};
    if (pad || chance(&G->r, 0.3)) attr_ints(n, "pads", 4, pads);
    if (stride > 1 || chance(&G->r, 0.3)) attr_ints(n, "strides", 2, strides);
    if (group > 1) attr_i(n, "group", group);
    if (chance(&G->r, 0.5)) {
        int64_t ks[2] = {kh, kw};
        attr_ints(n, "kernel_shape", 2, ks);
    }
    int r = irand(&G->r, 4);
    if (r == 0) {
        double nb;
        kf_id z;
        if (add_bn(G, y, 4, od, bound, &nb, &z)) y = z, bound = nb;
    } else if (r == 1) { /* per-channel bias or scale as exporters write it */
        int64_t bd[3] = {mch, 1, 1};
        val b = *fconst(G, 3, bd, chance(&G->r, 0.5) ? 0.5 : -1, 1, false);
        kf_id ain[2] = {y, b.id};
        bool mul = b.lo > 0;
        mk(G, mul ? "Mul" : "Add", ain, 2, &y);
        bound = mul ? bound * vmax(&b) : bound + vmax(&b);
    }
    if (chance(&G->r, 0.4)) {
        kf_id pre = y;
        mk(G, "Relu", &pre, 1, &y);
    }
    push(G, y, 4, od, -bound, bound, false);
    return true;
}

/* ---- data movement -------------------------------------------------------- */

static bool rank2p_ok(const gen *G, const val *x) { (void)G; return x->rank >= 2; }

static bool emit_transpose(gen *G) {
    val *x = pick(G, rank2p_ok);
    if (!x) return false;
    val xx = *x;
    int times = chance(&G->r, 0.3) ? 2 : 1; /* a pair: compose_transposes */
    kf_id cur = xx.id;
    int64_t d[MAX_R];
    memcpy(d, xx.dims, sizeof d);
    for (int t = 0; t < times; t++) {
        int64_t perm[MAX_R];
        for (int i = 0; i < xx.rank; i++) perm[i] = i;
        for (int i = xx.rank - 1; i > 0; i--) {
            int j = irand(&G->r, i + 1);
            int64_t s = perm[i];
            perm[i] = perm[j];
            perm[j] = s;
        }
        bool def = chance(&G->r, 0.1);
        if (def)
            for (int i = 0; i < xx.rank; i++) perm[i] = xx.rank - 1 - i;
        kf_id out;
        kf_node *n = mk(G, "Transpose", &cur, 1, &out);
        if (!def) attr_ints(n, "perm", xx.rank, perm);
        int64_t nd[MAX_R];
        for (int i = 0; i < xx.rank; i++) nd[i] = d[perm[i]];
        memcpy(d, nd, sizeof d);
        cur = out;
    }
    push(G, cur, xx.rank, d, xx.lo, xx.hi, xx.exact);
    return true;
}

/* A random factorisation of n into rank dims. */
static int factor(gen *G, int64_t n, int64_t *d) {
    int rank = 1 + irand(&G->r, MAX_R);
    for (int i = 0; i < rank; i++) d[i] = 1;
    for (int64_t p = 2; n > 1;) {
        if (n % p == 0) {
            d[irand(&G->r, rank)] *= p;
            n /= p;
        } else {
            p++;
        }
    }
    return rank;
}

static bool emit_reshape(gen *G) {
    val *x = pick(G, NULL);
    if (!x) return false;
    val xx = *x;
    int times = chance(&G->r, 0.3) ? 2 : 1; /* a chain: collapse_reshape_chain */
    kf_id cur = xx.id;
    int rank = xx.rank;
    int64_t d[MAX_R];
    memcpy(d, xx.dims, sizeof d);
    for (int t = 0; t < times; t++) {
        int64_t nd[MAX_R], spec[MAX_R];
        int nr = factor(G, numel(rank, d), nd);
        for (int i = 0; i < nr; i++) spec[i] = nd[i];
        if (chance(&G->r, 0.3)) spec[irand(&G->r, nr)] = -1;
        for (int i = 0; i < nr && i < rank; i++)
            if (nd[i] == d[i] && spec[i] != -1 && chance(&G->r, 0.3)) spec[i] = 0;
        kf_id in[2] = {cur, ilist(G, nr, spec)}, out;
        mk(G, "Reshape", in, 2, &out);
        cur = out;
        rank = nr;
        memcpy(d, nd, sizeof d);
    }
    push(G, cur, rank, d, xx.lo, xx.hi, xx.exact);
    return true;
}

static bool has1_ok(const gen *G, const val *x) {
    (void)G;
    for (int i = 0; i < x->rank; i++)
        if (x->dims[i] == 1) return true;
    return false;
}

static bool emit_squeeze(gen *G) {
    val *x = pick(G, has1_ok);
    bool unsq = !x || chance(&G->r, 0.5);
    if (unsq) x = pick(G, NULL);
    if (!x) return false;
    val xx = *x;
    int64_t axes[MAX_R + 2], d[MAX_R + 2];
    int na = 0, ro = 0;
    if (!unsq) {
        for (int i = 0; i < xx.rank; i++) {
            if (xx.dims[i] == 1 && (chance(&G->r, 0.6) || (!na && i == xx.rank - 1))) axes[na++] = chance(&G->r, 0.3) ? i - xx.rank : i;
            else d[ro++] = xx.dims[i];
        }
        if (!na) return false;
    } else {
        if (xx.rank >= MAX_R) return false;
        ro = xx.rank + 1 + (xx.rank + 2 <= MAX_R && chance(&G->r, 0.3));
        bool ins[MAX_R + 2] = {0};
        for (int k = 0; k < ro - xx.rank;) {
            int p = irand(&G->r, ro);
            if (!ins[p]) ins[p] = true, k++;
        }
        for (int i = 0, j = 0; i < ro; i++) {
            if (ins[i]) d[i] = 1, axes[na++] = chance(&G->r, 0.3) ? i - ro : i;
            else d[i] = xx.dims[j++];
        }
    }
    const char *op = unsq ? "Unsqueeze" : "Squeeze";
    kf_id in[2] = {xx.id, 0}, out;
    bool as_input = G->opset >= 13;
    if (as_input) in[1] = ilist(G, na, axes);
    kf_node *n = mk(G, op, in, as_input ? 2 : 1, &out);
    if (!as_input) attr_ints(n, "axes", na, axes);
    push(G, out, ro, d, xx.lo, xx.hi, xx.exact);
    return true;
}

static bool emit_concat(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    int axis = irand(&G->r, xx.rank);
    kf_id in[3] = {xx.id, 0, 0};
    int nin = 2 + chance(&G->r, 0.25);
    int64_t d[MAX_R];
    memcpy(d, xx.dims, sizeof d);
    double lo = xx.lo, hi = xx.hi;
    bool exact = xx.exact;
    for (int k = 1; k < nin; k++) {
        val *p = NULL;
        for (int i = 0; i < G->nv && !p; i++) {
            const val *c = &G->v[i];
            bool same = c->rank == xx.rank && chance(&G->r, 0.5);
            for (int j = 0; same && j < xx.rank; j++) same = j == axis || c->dims[j] == xx.dims[j];
            if (same) p = &G->v[i];
        }
        int64_t pd[MAX_R];
        memcpy(pd, xx.dims, sizeof pd);
        pd[axis] = 1 + irand(&G->r, 4);
        if (!p) p = chance(&G->r, 0.5) ? fconst(G, xx.rank, pd, -2, 2, true) : finput(G, xx.rank, pd);
        if (!p) return false;
        in[k] = p->id;
        d[axis] += p->dims[axis];
        lo = fmin(lo, p->lo), hi = fmax(hi, p->hi);
        exact &= p->exact;
    }
    if (numel(xx.rank, d) > MAX_NUMEL) return false;
    if (chance(&G->r, 0.3)) { /* operand order */
        kf_id t = in[0];
        in[0] = in[1];
        in[1] = t;
    }
    kf_id out;
    attr_i(mk(G, "Concat", in, nin, &out), "axis", chance(&G->r, 0.3) ? axis - xx.rank : axis);
    push(G, out, xx.rank, d, lo, hi, exact);
    return true;
}

/* Elements ONNX Slice selects along one axis of size n. */
static int64_t slice_len(int64_t n, int64_t start, int64_t end, int64_t step) {
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (step > 0) {
        start = start < 0 ? 0 : start > n ? n : start;
        end = end < 0 ? 0 : end > n ? n : end;
        return end > start ? (end - start + step - 1) / step : 0;
    }
    start = start < 0 ? -1 : start > n - 1 ? n - 1 : start;
    end = end < -1 ? -1 : end > n - 1 ? n - 1 : end;
    return start > end ? (start - end + (-step) - 1) / (-step) : 0;
}

static bool emit_slice(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    int64_t st[MAX_R], en[MAX_R], ax[MAX_R], sp[MAX_R], d[MAX_R];
    memcpy(d, xx.dims, sizeof d);
    int na = 0;
    bool all = chance(&G->r, 0.2);
    bool unit = true;
    for (int i = 0; i < xx.rank; i++) {
        if (!all && !chance(&G->r, 0.5) && !(i == xx.rank - 1 && !na)) continue;
        int64_t n = xx.dims[i];
        static const int64_t steps[] = {1, 1, 1, 2, -1, -2};
        int64_t step = steps[irand(&G->r, 6)];
        int64_t s, e;
        if (step > 0) {
            s = irand(&G->r, (int)n);
            e = s + 1 + irand(&G->r, (int)(n - s));
            if (e == n && chance(&G->r, 0.3)) e = 1000; /* past the end: clamped */
        } else {
            s = irand(&G->r, (int)n);
            e = s - 1 - irand(&G->r, (int)s + 1);
            if (e == -1) e = -1000; /* through element 0 needs an end below -n */
        }
        if (s != 1000 && chance(&G->r, 0.3)) s -= n;
        if (e >= 0 && e <= n && chance(&G->r, 0.3)) e -= n;
        if (e == 0 - n && step < 0) e = -1000; /* -n would mean element 0 */
        st[na] = s, en[na] = e, sp[na] = step;
        ax[na] = chance(&G->r, 0.3) ? i - xx.rank : i;
        unit &= step == 1;
        d[i] = slice_len(n, s, e, step);
        if (d[i] < 1) return false;
        na++;
    }
    kf_id in[5] = {xx.id, ilist(G, na, st), ilist(G, na, en), 0, 0};
    int nin = 3;
    if (!all || !unit || chance(&G->r, 0.5)) in[nin++] = ilist(G, na, ax);
    if (nin == 4 && (!unit || chance(&G->r, 0.5))) in[nin++] = ilist(G, na, sp);
    if (nin == 3) { /* axes omitted: starts/ends must cover every axis in order */
        for (int i = 0; i < na; i++) {
            int64_t a = ax[i] < 0 ? ax[i] + xx.rank : ax[i];
            if (a != i) return false;
        }
        if (na != xx.rank) return false;
    }
    kf_id out;
    mk(G, "Slice", in, nin, &out);
    push(G, out, xx.rank, d, xx.lo, xx.hi, xx.exact);
    return true;
}

static bool emit_expand(gen *G) {
    val *x = pick(G, NULL);
    if (!x) return false;
    val xx = *x;
    int64_t tgt[MAX_R], d[MAX_R];
    int extra = xx.rank < MAX_R && chance(&G->r, 0.3);
    int r = xx.rank + extra;
    for (int i = 0; i < r; i++) {
        int64_t xd = i < extra ? 1 : xx.dims[i - extra];
        tgt[i] = xd;
        if (xd == 1 && chance(&G->r, 0.6)) tgt[i] = 1 + irand(&G->r, 4);
        else if (xd > 1 && chance(&G->r, 0.2)) tgt[i] = 1; /* Expand broadcasts both ways */
        d[i] = xd == 1 ? tgt[i] : xd;
    }
    if (numel(r, d) > MAX_NUMEL) return false;
    kf_id in[2] = {xx.id, ilist(G, r, tgt)}, out;
    mk(G, "Expand", in, 2, &out);
    push(G, out, r, d, xx.lo, xx.hi, xx.exact);
    return true;
}

/* GatherND of x with constant index tuples of 1 or 2 elements (negatives
 * count from the end), batch_dims 0 or 1. */
static bool emit_gathernd(gen *G, const val *x) {
    val xx = *x;
    int b = xx.rank >= 2 && chance(&G->r, 0.3) ? 1 : 0;
    int kmax = xx.rank - b > 2 ? 2 : xx.rank - b;
    int k = 1 + irand(&G->r, kmax);
    int64_t m = 1 + irand(&G->r, 4), idims[3], iv[64];
    int ir = 0;
    if (b) idims[ir++] = xx.dims[0];
    idims[ir++] = m;
    idims[ir++] = k;
    int64_t cnt = numel(ir, idims);
    if (cnt > 64) return false;
    for (int64_t i = 0; i < cnt; i++) {
        int64_t dim = xx.dims[b + i % k];
        iv[i] = irand(&G->r, (int)(2 * dim)) - dim;
    }
    int64_t d[MAX_R + 2];
    int ro = 0;
    for (int i = 0; i < ir - 1; i++) d[ro++] = idims[i];
    for (int i = b + k; i < xx.rank; i++) d[ro++] = xx.dims[i];
    if (ro > MAX_R || numel(ro, d) > MAX_NUMEL) return false;
    kf_id in[2] = {xx.id, iconst(G, ir, idims, iv)}, out;
    kf_node *nd = mk(G, "GatherND", in, 2, &out);
    if (b) attr_i(nd, "batch_dims", b);
    push(G, out, ro, d, xx.lo, xx.hi, xx.exact);
    return true;
}

/* Gather along a random axis (from opset 12 sometimes GatherND instead). */
static bool emit_gather(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    if (G->opset >= 12 && chance(&G->r, 0.25)) return emit_gathernd(G, x);
    val xx = *x;
    int axis = irand(&G->r, xx.rank);
    int64_t n = xx.dims[axis];
    int ir = irand(&G->r, 3);
    int64_t idims[2], iv[12];
    idims[0] = 1 + irand(&G->r, 4);
    idims[1] = 1 + irand(&G->r, 3);
    int64_t cnt = numel(ir, idims);
    for (int64_t i = 0; i < cnt; i++) iv[i] = irand(&G->r, (int)(2 * n)) - n;
    if (n <= 12 && chance(&G->r, 0.25)) {
        /* every index in order (the exporter's as_strided form): a Reshape */
        ir = 1 + irand(&G->r, 2);
        idims[0] = ir == 1 || chance(&G->r, 0.5) ? n : 1;
        idims[1] = idims[0] == n ? 1 : n;
        for (int64_t i = 0; i < n; i++) iv[i] = i;
    }
    int64_t d[MAX_R + 2];
    int ro = 0;
    for (int i = 0; i < axis; i++) d[ro++] = xx.dims[i];
    for (int i = 0; i < ir; i++) d[ro++] = idims[i];
    for (int i = axis + 1; i < xx.rank; i++) d[ro++] = xx.dims[i];
    if (ro > MAX_R || numel(ro, d) > MAX_NUMEL) return false;
    kf_id in[2] = {xx.id, iconst(G, ir, idims, iv)}, out;
    kf_node *nd = mk(G, "Gather", in, 2, &out);
    if (axis || chance(&G->r, 0.3)) attr_i(nd, "axis", chance(&G->r, 0.3) ? axis - xx.rank : axis);
    push(G, out, ro, d, xx.lo, xx.hi, xx.exact);
    return true;
}

static bool emit_split(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    int axis = irand(&G->r, xx.rank);
    int64_t n = xx.dims[axis];
    if (n < 2) return false;
    int64_t parts[4];
    int np = 2 + irand(&G->r, n > 3 ? 3 : (int)n - 1);
    bool equal = n % np == 0 && chance(&G->r, 0.5);
    if (equal) {
        for (int i = 0; i < np; i++) parts[i] = n / np;
    } else { /* np positive sizes summing to n */
        int64_t left = n;
        for (int i = 0; i < np - 1; i++) {
            parts[i] = 1 + irand(&G->r, (int)(left - (np - 1 - i)));
            left -= parts[i];
        }
        parts[np - 1] = left;
    }
    kf_id in[2] = {xx.id, 0}, outs[4];
    int nin = 1;
    bool as_input = G->opset >= 13;
    if (!equal && as_input) in[nin++] = ilist(G, np, parts);
    if (equal && G->opset >= 18) equal = true; /* needs num_outputs from 18 */
    for (int i = 0; i < np; i++) outs[i] = new_value(G, 'v');
    char nm[32];
    snprintf(nm, sizeof nm, "n%d", G->nodes);
    kf_id nid;
    need(kf_graph_add_node(G->g, "Split", "", nm, in, nin, outs, np, &nid));
    kf_node *nd = &G->g->nodes[nid];
    nd->op = kf_op_lookup("", "Split");
    nd->opset = G->opset;
    G->nodes++;
    if (axis || chance(&G->r, 0.3)) attr_i(nd, "axis", chance(&G->r, 0.3) ? axis - xx.rank : axis);
    if (!equal && !as_input) attr_ints(nd, "split", np, parts);
    if (equal && G->opset >= 18) attr_i(nd, "num_outputs", np);
    for (int i = 0; i < np; i++) {
        int64_t d[MAX_R];
        memcpy(d, xx.dims, sizeof d);
        d[axis] = parts[i];
        push(G, outs[i], xx.rank, d, xx.lo, xx.hi, xx.exact);
    }
    return true;
}

static bool emit_flatten(gen *G) {
    val *x = pick(G, NULL);
    if (!x) return false;
    val xx = *x;
    int axis = irand(&G->r, xx.rank + 1);
    int64_t d[2] = {numel(axis, xx.dims), numel(xx.rank - axis, xx.dims + axis)};
    kf_id out;
    kf_node *n = mk(G, "Flatten", &xx.id, 1, &out);
    if (axis != 1 || chance(&G->r, 0.3)) attr_i(n, "axis", axis < xx.rank && chance(&G->r, 0.3) ? axis - xx.rank : axis);
    push(G, out, 2, d, xx.lo, xx.hi, xx.exact);
    return true;
}

static bool emit_tile_pad(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    int64_t d[MAX_R], v[2 * MAX_R];
    memcpy(d, xx.dims, sizeof d);
    kf_id out;
    double lo = xx.lo, hi = xx.hi;
    if (chance(&G->r, 0.5)) {
        for (int i = 0; i < xx.rank; i++) v[i] = 1 + irand(&G->r, 2), d[i] *= v[i];
        if (numel(xx.rank, d) > MAX_NUMEL) return false;
        kf_id in[2] = {xx.id, ilist(G, xx.rank, v)};
        mk(G, "Tile", in, 2, &out);
    } else {
        static const char *modes[] = {"constant", "edge", "reflect"};
        int mode = irand(&G->r, 3);
        for (int i = 0; i < xx.rank; i++) {
            int64_t lim = mode == 2 ? xx.dims[i] - 1 : 2; /* reflect pads less than the dim */
            v[i] = irand(&G->r, (int)(lim < 2 ? lim : 2) + 1);
            v[i + xx.rank] = irand(&G->r, (int)(lim < 2 ? lim : 2) + 1);
            d[i] += v[i] + v[i + xx.rank];
        }
        if (numel(xx.rank, d) > MAX_NUMEL) return false;
        kf_id in[3] = {xx.id, ilist(G, 2 * xx.rank, v), 0};
        int nin = 2;
        if (mode == 0) {
            double cv = chance(&G->r, 0.5) ? 0 : unif(&G->r, -1, 1);
            if (cv != 0) in[nin++] = fscalar(G, cv, false);
            lo = fmin(lo, cv - 0.01), hi = fmax(hi, cv + 0.01);
        }
        kf_node *n = mk(G, "Pad", in, nin, &out);
        if (mode || chance(&G->r, 0.3)) {
            kf_attr a = {.name = "mode", .type = KF_ATTR_STRING, .s = {(char *)modes[mode], strlen(modes[mode])}};
            need(kf_node_add_attr(n, &a));
        }
    }
    push(G, out, xx.rank, d, lo, hi, xx.exact);
    return true;
}

static bool emit_prelu(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    int64_t d[MAX_R + 1];
    int r = partner_shape(G, &xx, d);
    int ro;
    int64_t od[MAX_R + 2];
    if (r > MAX_R || !bcast(xx.rank, xx.dims, r, d, &ro, od) || ro != xx.rank || memcmp(od, xx.dims, sizeof(int64_t) * (size_t)ro))
        return false; /* the slope broadcasts to x, not the other way */
    val sl = *fconst(G, r, d, -0.5, 0.5, false);
    kf_id in[2] = {xx.id, sl.id}, out;
    mk(G, "PRelu", in, 2, &out);
    double m = vmax(&xx) * 0.5;
    push(G, out, xx.rank, xx.dims, fmin(xx.lo, -m), fmax(xx.hi, m), false);
    return true;
}

/* ---- pooling and a BatchNormalization on its own --------------------------------- */

static bool rank3p_ok(const gen *G, const val *x) {
    (void)G;
    if (x->rank < 3) return false;
    for (int d = 2; d < x->rank; d++)
        if (x->dims[d] < 2) return false;
    return true;
}

/* MaxPool, AveragePool, LpPool (kernel, strides, pads, ceil_mode, dilations,
 * count_include_pad as the opset has them) or a Global pool over dims 2.. */
static bool emit_pool(gen *G) {
    val *x = pick(G, rank3p_ok);
    if (!x) return false;
    val xx = *x;
    int nsp = xx.rank - 2, kind = irand(&G->r, 4);
    static const char *ops[] = {"MaxPool", "AveragePool", "LpPool"};
    if (kind == 3 || chance(&G->r, 0.2)) { /* global */
        static const char *gops[] = {"GlobalAveragePool", "GlobalMaxPool"};
        int k = irand(&G->r, 2);
        int64_t od[MAX_R + 2];
        memcpy(od, xx.dims, sizeof od);
        for (int d = 2; d < xx.rank; d++) od[d] = 1;
        kf_id y;
        mk(G, gops[k], &xx.id, 1, &y);
        push(G, y, xx.rank, od, xx.lo, xx.hi, false);
        return true;
    }
    bool mx = kind == 0, avg = kind == 1;
    bool dil_ok = (mx && G->opset >= 10) || (avg && G->opset >= 19) || (!mx && !avg && G->opset >= 18);
    bool ceil_ok = (mx || avg) ? G->opset >= 10 : G->opset >= 18;
    int64_t k[MAX_R], st[MAX_R], dl[MAX_R], pads[2 * MAX_R], od[MAX_R + 2];
    bool ceil = ceil_ok && chance(&G->r, 0.3), any_pad = false, any_dil = false, any_st = false;
    memcpy(od, xx.dims, sizeof od);
    for (int d = 0; d < nsp; d++) {
        int64_t in = xx.dims[2 + d];
        k[d] = 1 + irand(&G->r, in < 3 ? (int)in : 3);
        st[d] = 1 + irand(&G->r, 2);
        dl[d] = dil_ok && chance(&G->r, 0.2) ? 2 : 1;
        pads[d] = k[d] > 1 ? irand(&G->r, (int)k[d]) : 0; /* pads stay under the kernel */
        pads[nsp + d] = k[d] > 1 ? irand(&G->r, (int)k[d]) : 0;
        int64_t ext = (k[d] - 1) * dl[d] + 1, span = in + pads[d] + pads[nsp + d] - ext;
        if (span < 0) return false;
        int64_t o = (ceil ? (span + st[d] - 1) / st[d] : span / st[d]) + 1;
        if (ceil && (o - 1) * st[d] >= in + pads[d]) o--; /* a last window starting in the end padding is dropped */
        od[2 + d] = o;
        any_pad |= pads[d] || pads[nsp + d];
        any_dil |= dl[d] > 1;
        any_st |= st[d] > 1;
    }
    if (numel(xx.rank, od) > MAX_NUMEL) return false;
    int64_t kk = 1;
    for (int d = 0; d < nsp; d++) kk *= k[d];
    double lo = xx.lo, hi = xx.hi;
    bool cip = avg && any_pad && G->opset >= 7 && chance(&G->r, 0.5);
    if (cip) lo = fmin(lo, 0), hi = fmax(hi, 0);
    if (!mx && !avg) lo = 0, hi = sqrt((double)kk) * vmax(&xx); /* LpPool p = 2 */
    if (!bounded(G, lo, hi)) return false;
    kf_id y;
    kf_node *n = mk(G, ops[kind], &xx.id, 1, &y);
    attr_ints(n, "kernel_shape", nsp, k);
    if (any_st || chance(&G->r, 0.3)) attr_ints(n, "strides", nsp, st);
    if (any_pad) attr_ints(n, "pads", 2 * nsp, pads);
    if (any_dil) attr_ints(n, "dilations", nsp, dl);
    if (ceil) attr_i(n, "ceil_mode", 1);
    if (cip) attr_i(n, "count_include_pad", 1);
    if (!mx && !avg) attr_i(n, "p", 2);
    push(G, y, xx.rank, od, lo, hi, false);
    return true;
}

/* BatchNormalization of a value of rank >= 2 that no conv absorbs */
static bool emit_batchnorm(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x || x->rank < 2 || G->opset < 7) return false;
    val xx = *x;
    double nb;
    kf_id y;
    if (!add_bn(G, xx.id, xx.rank, xx.dims, vmax(&xx), &nb, &y)) return false;
    push(G, y, xx.rank, xx.dims, -nb, nb, false);
    return true;
}

/* ---- attention and rotary embeddings (opset 23) ---------------------------- */

/* Q of an Attention: a value every path computes bit for bit (an input, a
 * constant or data movement of those). The op runs on the host in every
 * path, so it then sees the same operands everywhere; fed a value computed
 * differently by each path, its softmax over scores of up to ~20 would turn
 * rounding noise into differences past the float32 tolerance. */
static bool attn_ok(const gen *G, const val *x) {
    (void)G;
    return (x->rank == 3 || x->rank == 4) && x->exact && vmax(x) <= 3;
}

/* A random divisor of n (n >= 1) up to 16. */
static int64_t divisor(gen *G, int64_t n) {
    int64_t d[16];
    int k = 0;
    for (int64_t i = 1; i <= n && i <= 16; i++)
        if (n % i == 0) d[k++] = i;
    return d[irand(&G->r, k)];
}

/* K, V or a past cache: a constant, now and then a graph input. */
static val attn_operand(gen *G, int rank, const int64_t *dims) {
    if (chance(&G->r, 0.25)) {
        val *x = finput(G, rank, dims);
        if (x) return *x;
    }
    return *fconst(G, rank, dims, -2, 2, false);
}

/* A node with nout outputs, all present. */
static kf_node *mk_multi(gen *G, const char *op, const kf_id *in, int nin, kf_id *outs, int nout) {
    for (int o = 0; o < nout; o++) outs[o] = new_value(G, 'v');
    char nm[32];
    snprintf(nm, sizeof nm, "n%d", G->nodes);
    kf_id nid;
    need(kf_graph_add_node(G->g, op, "", nm, in, nin, outs, nout, &nid));
    kf_node *n = &G->g->nodes[nid];
    n->op = kf_op_lookup("", op);
    n->opset = G->opset;
    G->nodes++;
    return n;
}

/* Attention over a 3-D or 4-D Q with small random K and V (grouped heads,
 * value head size of its own), sometimes a past cache with the present
 * outputs, a boolean or additive mask (broadcast, or covering fewer keys),
 * causal, scale, softcap and the qk_matmul_output. */
static bool emit_attention(gen *G) {
    if (G->opset < 23) return false;
    val *x = pick(G, attn_ok);
    if (!x) return false;
    val q = *x;
    int rank = q.rank;
    int64_t B = q.dims[0], Hq, Sq, D;
    if (rank == 4) {
        Hq = q.dims[1], Sq = q.dims[2], D = q.dims[3];
    } else {
        Sq = q.dims[1], Hq = divisor(G, q.dims[2]), D = q.dims[2] / Hq;
        if (q.dims[2] % Hq) return false;
    }
    if (D > 16) return false;
    int64_t Hkv = divisor(G, Hq), Skv = 1 + irand(&G->r, 5), Dv = 1 + irand(&G->r, 4);
    if (Hq % Hkv) return false;
    int64_t P = chance(&G->r, 0.3) ? 1 + irand(&G->r, 3) : 0, T = P + Skv;
    int64_t kd[4] = {B, Hkv, Skv, D}, vd[4] = {B, Hkv, Skv, Dv}, yd[4] = {B, Hq, Sq, Dv};
    if (rank == 3) {
        int64_t k3[3] = {B, Skv, Hkv * D}, v3[3] = {B, Skv, Hkv * Dv}, y3[3] = {B, Sq, Hq * Dv};
        memcpy(kd, k3, sizeof k3);
        memcpy(vd, v3, sizeof v3);
        memcpy(yd, y3, sizeof y3);
    }
    int64_t pkd[4] = {B, Hkv, T, D}, pvd[4] = {B, Hkv, T, Dv}, qkd[4] = {B, Hq, Sq, T};
    if (numel(rank, yd) > MAX_NUMEL || numel(4, pkd) > MAX_NUMEL || numel(4, pvd) > MAX_NUMEL ||
        numel(4, qkd) > MAX_NUMEL)
        return false;
    val k = attn_operand(G, rank, kd), v = attn_operand(G, rank, vd);
    kf_id in[6] = {q.id, k.id, v.id, 0, 0, 0};
    int nin = 3;
    bool causal = chance(&G->r, 0.4), neginf = causal;
    int mask = irand(&G->r, 3); /* none, boolean, additive */
    if (mask) {
        int64_t md[4];
        int mr = 1 + irand(&G->r, 4);
        int64_t full[4] = {B, Hq, Sq, T};
        for (int d = 0; d < mr; d++) md[d] = chance(&G->r, 0.4) ? 1 : full[4 - mr + d];
        md[mr - 1] = T;
        if (T > 1 && chance(&G->r, 0.2)) md[mr - 1] = T - 1; /* the last key is masked */
        neginf = neginf || mask == 1 || md[mr - 1] < T;
        if (mask == 1) {
            kf_tensor *t = kf_tensor_new();
            if (!t) need(KF_ERR_NOMEM);
            need(kf_tensor_alloc(t, KF_DT_BOOL, mr, md));
            for (int64_t i = 0; i < t->numel; i++) kf_set_i64(t, i, chance(&G->r, 0.75));
            kf_id id = new_value(G, 'c');
            G->g->values[id].init = t;
            kf_type_of_tensor(&G->g->values[id].type, t);
            in[3] = id;
        } else {
            in[3] = fconst(G, mr, md, -1, 1, false)->id;
        }
        nin = 4;
    }
    val pk = {0}, pv = {0};
    if (P) {
        int64_t pd[4] = {B, Hkv, P, D}, pvdd[4] = {B, Hkv, P, Dv};
        pk = attn_operand(G, 4, pd);
        pv = attn_operand(G, 4, pvdd);
        in[4] = pk.id, in[5] = pv.id;
        nin = 6;
    }
    double scale = chance(&G->r, 0.3) ? unif(&G->r, 0.1, 0.5) : 0;
    double softcap = chance(&G->r, 0.25) ? unif(&G->r, 2, 5) : 0;
    int nout = P && chance(&G->r, 0.6) ? 3 : 1;
    if (chance(&G->r, 0.3)) nout = 4;
    int mode = irand(&G->r, 4);
    if (mode == 2 && neginf) mode = 3; /* scores + -inf are not a value to compute on */
    double kmax = fmax(vmax(&k), P ? vmax(&pk) : 0);
    double raw = (scale ? scale : 1 / sqrt((double)D)) * (double)D * vmax(&q) * kmax, qk_lo = -raw, qk_hi = raw;
    if (softcap && mode != 0) qk_lo = fmax(qk_lo, -softcap), qk_hi = fmin(qk_hi, softcap);
    if (mode == 2) qk_lo -= 1, qk_hi += 1;
    if (mode == 3) qk_lo = 0, qk_hi = 1;
    if (nout == 4 && !bounded(G, qk_lo, qk_hi)) nout = 3;
    kf_id outs[4];
    kf_node *n = mk_multi(G, "Attention", in, nin, outs, nout);
    if (rank == 3) {
        attr_i(n, "q_num_heads", Hq);
        attr_i(n, "kv_num_heads", Hkv);
    }
    if (causal) attr_i(n, "is_causal", 1);
    if (scale) attr_f(n, "scale", (float)scale);
    if (softcap) attr_f(n, "softcap", (float)softcap);
    if (nout == 4 && (mode || chance(&G->r, 0.3))) attr_i(n, "qk_matmul_output_mode", mode);
    /* Y mixes value rows (a row that may attend nothing is 0) */
    double vlo = fmin(v.lo, P ? pv.lo : v.lo), vhi = fmax(v.hi, P ? pv.hi : v.hi);
    push(G, outs[0], rank, yd, fmin(vlo, 0), fmax(vhi, 0), false);
    if (nout >= 3) {
        bool exact = k.exact && v.exact && (!P || (pk.exact && pv.exact));
        push(G, outs[1], 4, pkd, fmin(k.lo, P ? pk.lo : k.lo), fmax(k.hi, P ? pk.hi : k.hi), exact);
        push(G, outs[2], 4, pvd, vlo, vhi, exact);
    }
    if (nout == 4) push(G, outs[3], 4, qkd, qk_lo, qk_hi, false);
    return true;
}

/* X of a RotaryEmbedding: rank 3 or 4 with an even last dim, small enough
 * that a rotation (|pair| grows by up to sqrt 2 per element) stays bounded. */
static bool rope_ok(const gen *G, const val *x) {
    return (x->rank == 3 || x->rank == 4) && x->dims[x->rank - 1] % 2 == 0 && 1.5 * vmax(x) <= G->mag;
}

/* RotaryEmbedding with caches of cos/sin of random angles, by position_ids
 * or per (batch, position), halves or interleaved pairs, sometimes only part
 * of each head rotated. */
static bool emit_rotary(gen *G) {
    if (G->opset < 23) return false;
    val *x = pick(G, rope_ok);
    if (!x) return false;
    val xx = *x;
    int64_t B = xx.dims[0], H, S, D;
    if (xx.rank == 4) {
        H = xx.dims[1], S = xx.dims[2], D = xx.dims[3];
    } else {
        S = xx.dims[1];
        H = divisor(G, xx.dims[2]);
        if (xx.dims[2] % H || (xx.dims[2] / H) % 2) H = 1;
        D = xx.dims[2] / H;
    }
    int64_t dim = D;
    if (D >= 4 && chance(&G->r, 0.4)) dim = 2 * (1 + irand(&G->r, (int)(D / 2) - 1));
    int64_t half = dim / 2, npos = S + irand(&G->r, 4);
    bool by_pos = chance(&G->r, 0.6);
    int64_t cd[3] = {B, S, half}, cd2[2] = {npos, half};
    int crank = by_pos ? 2 : 3;
    const int64_t *cdims = by_pos ? cd2 : cd;
    if (numel(crank, cdims) > MAX_NUMEL) return false;
    kf_id cs[2];
    for (int c = 0; c < 2; c++) cs[c] = fconst(G, crank, cdims, -1, 1, false)->id;
    kf_tensor *ct = G->g->values[cs[0]].init, *st = G->g->values[cs[1]].init;
    for (int64_t i = 0; i < ct->numel; i++) {
        double theta = unif(&G->r, -3.14159, 3.14159);
        kf_set_f64(ct, i, cos(theta));
        kf_set_f64(st, i, sin(theta));
    }
    kf_id in[4] = {xx.id, cs[0], cs[1], 0}, out;
    int nin = 3;
    if (by_pos) {
        int64_t pd[2] = {B, S}, ids[MAX_NUMEL];
        if (B * S > MAX_NUMEL) return false;
        for (int64_t i = 0; i < B * S; i++) ids[i] = irand(&G->r, (int)npos);
        in[nin++] = iconst(G, 2, pd, ids);
    }
    kf_node *n = mk(G, "RotaryEmbedding", in, nin, &out);
    if (xx.rank == 3) attr_i(n, "num_heads", H);
    if (chance(&G->r, 0.5)) attr_i(n, "interleaved", 1);
    if (dim != D || chance(&G->r, 0.2)) attr_i(n, "rotary_embedding_dim", dim);
    double m = 1.5 * vmax(&xx);
    push(G, out, xx.rank, xx.dims, -m, m, false);
    return true;
}

/* ---- newer ops: cumulative, BitCast, TensorScatter, causal conv, linear
 * attention (opsets 24-27). Every path runs them on the host; what the
 * paths can get wrong is the graph around them. ---------------------------- */

static bool rank_is3(const gen *G, const val *x) { (void)G; return x->rank == 3; }

static void attr_s(kf_node *n, const char *name, const char *v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_STRING, .s = {(char *)v, strlen(v)}};
    need(kf_node_add_attr(n, &a));
}

/* CumSum (11) or CumProd (26) along a random axis given as a constant
 * input, exclusive and reverse by chance. A product of n elements of at
 * most M is at most max(M, 1)^n: only drawn while that stays bounded. */
static bool emit_cumulative(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    int axis = irand(&G->r, xx.rank);
    int64_t n = xx.dims[axis];
    bool prod = G->opset >= 26 && chance(&G->r, 0.5);
    double m = vmax(&xx), lo, hi;
    if (prod) {
        double b = pow(fmax(m, 1), (double)n);
        lo = -b, hi = b;
    } else {
        lo = xx.lo < 0 ? xx.lo * (double)n : fmin(xx.lo, 0), hi = xx.hi > 0 ? xx.hi * (double)n : fmax(xx.hi, 0);
    }
    if (!bounded(G, lo, hi)) return false;
    int64_t a = chance(&G->r, 0.3) ? axis - xx.rank : axis;
    kf_id in[2] = {xx.id, iconst(G, 0, NULL, &a)}, out;
    kf_node *nd = mk(G, prod ? "CumProd" : "CumSum", in, 2, &out);
    if (chance(&G->r, 0.4)) attr_i(nd, "exclusive", 1);
    if (chance(&G->r, 0.4)) attr_i(nd, "reverse", 1);
    push(G, out, xx.rank, xx.dims, lo, hi, false);
    return true;
}

/* x -> BitCast to a signed or unsigned integer of the same width -> BitCast
 * back: the identity. The integer view of an exact x is sometimes an output
 * too (compared bit for bit). */
static bool emit_bitcast(gen *G) {
    if (G->opset < 26) return false;
    val *x = pick(G, rank1_ok);
    if (!x) return false;
    val xx = *x;
    bool wide = G->ft == KF_DT_FLOAT;
    kf_dtype it = chance(&G->r, 0.5) ? (wide ? KF_DT_INT32 : KF_DT_INT16) : (wide ? KF_DT_UINT32 : KF_DT_UINT16);
    kf_id bits, back;
    attr_i(mk(G, "BitCast", &xx.id, 1, &bits), "to", it);
    attr_i(mk(G, "BitCast", &bits, 1, &back), "to", G->ft);
    if (xx.exact && chance(&G->r, 0.3)) need(kf_graph_mark_output(G->g, bits));
    push(G, back, xx.rank, xx.dims, xx.lo, xx.hi, xx.exact);
    return true;
}

/* A cache of rank >= 2 updated by x along a non-batch axis (the default -2
 * or another): write_indices per batch row, linear (in range) or circular
 * (any index, wrapping), or absent (0). */
static bool emit_tensor_scatter(gen *G) {
    if (G->opset < 24) return false;
    val *x = pick(G, rank1_ok);
    if (!x || x->rank < 2) return false;
    val u = *x;
    int axis = u.rank >= 3 && chance(&G->r, 0.6) ? u.rank - 2 : 1 + irand(&G->r, u.rank - 1);
    int64_t S = u.dims[axis], L = S + irand(&G->r, 4), B = u.dims[0], cd[MAX_R];
    memcpy(cd, u.dims, sizeof(int64_t) * (size_t)u.rank);
    cd[axis] = L;
    if (numel(u.rank, cd) > MAX_NUMEL) return false;
    val cache = attn_operand(G, u.rank, cd);
    bool circular = chance(&G->r, 0.4);
    kf_id in[3] = {cache.id, u.id, 0}, out;
    int nin = 2;
    if (chance(&G->r, 0.8)) {
        int64_t w[MAX_NUMEL];
        for (int64_t b = 0; b < B; b++)
            w[b] = circular ? irand(&G->r, (int)(3 * L)) - L : irand(&G->r, (int)(L - S + 1));
        in[2] = iconst(G, 1, &B, w);
        nin = 3;
    }
    kf_node *nd = mk(G, "TensorScatter", in, nin, &out);
    if (axis != u.rank - 2 || chance(&G->r, 0.3)) attr_i(nd, "axis", chance(&G->r, 0.5) ? axis : axis - u.rank);
    if (circular) attr_s(nd, "mode", "circular");
    push(G, out, u.rank, cd, fmin(u.lo, cache.lo), fmax(u.hi, cache.hi), u.exact && cache.exact);
    return true;
}

/* CausalConvWithState over a [N, C, L] x: depthwise kernels of 1-4 taps, a
 * bias and a past state by chance, silu now and then; the present state is
 * an output sometimes. */
static bool emit_causal_conv(gen *G) {
    if (G->opset < 27) return false;
    val *x = pick(G, rank_is3);
    if (!x) return false;
    val xx = *x;
    int64_t N = xx.dims[0], C = xx.dims[1], k = 1 + irand(&G->r, 4), wd[3] = {C, 1, k}, sd[3] = {N, C, k - 1};
    val w = *fconst(G, 3, wd, -0.5, 0.5, false);
    kf_id in[4] = {xx.id, w.id, 0, 0};
    int nin = 2;
    double bmax = 0, pmax = 0;
    if (chance(&G->r, 0.6)) {
        val b = *fconst(G, 1, &C, -1, 1, false);
        in[nin++] = b.id;
        bmax = vmax(&b);
    }
    if (k > 1 && chance(&G->r, 0.6)) {
        if (nin == 2) in[nin++] = 0; /* no bias: the optional input left empty */
        val ps = attn_operand(G, 3, sd);
        in[nin++] = ps.id;
        pmax = vmax(&ps);
    }
    double m = fmax(vmax(&xx), pmax), y = 0.5 * (double)k * m + bmax;
    if (!bounded(G, -y, y)) return false;
    bool state = k > 1 && chance(&G->r, 0.4);
    kf_id outs[2];
    kf_node *nd = mk_multi(G, "CausalConvWithState", in, nin, outs, state ? 2 : 1);
    bool silu = chance(&G->r, 0.4);
    if (silu) attr_s(nd, "activation", chance(&G->r, 0.5) ? "silu" : "swish");
    push(G, outs[0], 3, xx.dims, silu ? -0.28 : -y, y, false);
    if (state) push(G, outs[1], 3, sd, -m, m, false);
    return true;
}

/* LinearAttention over a [B, T, Hq * dk] query with small keys and values,
 * every update rule (decays <= 0, so exp(decay) <= 1; beta in [0, 1]),
 * grouped heads, a past state by chance and the present state as an output
 * sometimes. With |k| <= 0.25 and dk <= 4, |k|^2 <= 1/4, so a delta step
 * never grows the state: the bounds below hold for every rule. */
static bool emit_linear_attention(gen *G) {
    if (G->opset < 27) return false;
    val *x = pick(G, rank_is3);
    if (!x) return false;
    val q = *x;
    int64_t B = q.dims[0], T = q.dims[1], Hq = divisor(G, q.dims[2]), dk = q.dims[2] / Hq;
    if (q.dims[2] % Hq || dk > 4) return false;
    int64_t Hkv = divisor(G, Hq), dv = 1 + irand(&G->r, 3);
    if (Hq % Hkv) return false;
    int64_t kd[3] = {B, T, Hkv * dk}, vd[3] = {B, T, Hkv * dv}, yd[3] = {B, T, Hq * dv}, sd[4] = {B, Hkv, dk, dv};
    if (numel(3, yd) > MAX_NUMEL || numel(4, sd) > MAX_NUMEL) return false;
    static const char *rules[] = {"linear", "gated", "delta", "gated_delta"};
    int rule = irand(&G->r, 4);
    bool gated = rule & 1, delta = rule & 2;
    val k = *fconst(G, 3, kd, -0.25, 0.25, false), v = *fconst(G, 3, vd, -0.5, 0.5, false);
    kf_id in[6] = {q.id, k.id, v.id, 0, 0, 0};
    int nin = 3;
    double pmax = 0;
    if (chance(&G->r, 0.4)) {
        val ps = *fconst(G, 4, sd, -1, 1, false);
        in[3] = ps.id;
        pmax = vmax(&ps);
    }
    if (gated) {
        int64_t dd[3] = {B, T, chance(&G->r, 0.5) ? Hkv : Hkv * dk};
        in[4] = fconst(G, 3, dd, -1, 0, false)->id;
    }
    if (delta) {
        int64_t bd[3] = {B, T, chance(&G->r, 0.5) ? Hkv : 1};
        in[5] = fconst(G, 3, bd, 0, 1, false)->id;
    }
    nin = delta ? 6 : gated ? 5 : in[3] ? 4 : 3;
    double scale = chance(&G->r, 0.4) ? unif(&G->r, 0.2, 1) : 1 / sqrt((double)dk);
    double smax = sqrt((double)(dk * dv)) * pmax + (double)T * sqrt((double)dk) * 0.25 * sqrt((double)dv) * 0.5;
    double y = scale * sqrt((double)dk) * vmax(&q) * smax;
    if (!bounded(G, -y, y) || !bounded(G, -smax, smax)) return false;
    bool state = chance(&G->r, 0.4);
    kf_id outs[2];
    kf_node *nd = mk_multi(G, "LinearAttention", in, nin, outs, state ? 2 : 1);
    attr_i(nd, "q_num_heads", Hq);
    attr_i(nd, "kv_num_heads", Hkv);
    if (rule != 3 || chance(&G->r, 0.3)) attr_s(nd, "update_rule", rules[rule]);
    if (scale != 1 / sqrt((double)dk)) attr_f(nd, "scale", (float)scale);
    push(G, outs[0], 3, yd, -y, y, false);
    if (state) push(G, outs[1], 4, sd, -smax, smax, false);
    return true;
}

/* ---- motifs: decompositions as exporters write them ------------------------ */

static kf_id bin(gen *G, const char *op, kf_id a, kf_id b, bool swap) {
    kf_id in[2] = {swap ? b : a, swap ? a : b}, out;
    mk(G, op, in, 2, &out);
    return out;
}
static kf_id un(gen *G, const char *op, kf_id a) {
    kf_id out;
    mk(G, op, &a, 1, &out);
    return out;
}
static bool sw(gen *G) { return chance(&G->r, 0.3); }

static bool small_ok(const gen *G, const val *x) { (void)G; return x->rank >= 1 && vmax(x) <= 3; }

static bool motif_gelu(gen *G) {
    val *x = pick(G, small_ok);
    if (!x || G->nodes + 8 > G->target) return false;
    val xx = *x;
    bool r1 = chance(&G->r, 0.5);
    /* one draw per statement: argument evaluation order is unspecified, and
     * the same seed must give the same graph with every compiler */
    kf_id y, d, e, a, h, c, p, q, i, b, t;
    bool s;
    if (chance(&G->r, 0.5)) { /* erf form */
        if (chance(&G->r, 0.5)) {
            c = fscalar(G, 1.4142135623730951, r1);
            d = bin(G, "Div", xx.id, c, false);
        } else {
            c = fscalar(G, 0.7071067811865476, r1);
            s = sw(G);
            d = bin(G, "Mul", xx.id, c, s);
        }
        e = un(G, "Erf", d);
        c = fscalar(G, 1, r1);
        s = sw(G);
        a = bin(G, "Add", e, c, s);
    } else { /* tanh form */
        int cube = irand(&G->r, 3);
        if (cube == 2) { /* factored: sqrt(2/pi) * x * (1 + 0.044715 * x * x) */
            c = fscalar(G, 0.044715, r1);
            s = sw(G);
            q = bin(G, "Mul", xx.id, c, s);
            s = sw(G);
            q = bin(G, "Mul", xx.id, q, s);
            c = fscalar(G, 1, r1);
            s = sw(G);
            i = bin(G, "Add", q, c, s);
            c = fscalar(G, 0.7978845608028654, r1);
            s = sw(G);
            b = bin(G, "Mul", xx.id, c, s);
            s = sw(G);
            b = bin(G, "Mul", b, i, s);
        } else {
            if (cube == 0) {
                c = fscalar(G, 3, r1);
                p = bin(G, "Pow", xx.id, c, false);
            } else {
                p = bin(G, "Mul", xx.id, xx.id, false);
                s = sw(G);
                p = bin(G, "Mul", p, xx.id, s);
            }
            c = fscalar(G, 0.044715, r1);
            s = sw(G);
            q = bin(G, "Mul", p, c, s);
            s = sw(G);
            i = bin(G, "Add", xx.id, q, s);
            c = fscalar(G, 0.7978845608028654, r1);
            s = sw(G);
            b = bin(G, "Mul", i, c, s);
        }
        t = un(G, "Tanh", b);
        c = fscalar(G, 1, r1);
        s = sw(G);
        a = bin(G, "Add", t, c, s);
    }
    if (chance(&G->r, 0.15)) push(G, a, xx.rank, xx.dims, -1, 2, false); /* a second consumer: must not fuse */
    /* where the 0.5 goes: on x (PyTorch), on the product (half_last) or on
     * the 1 + erf/tanh term (TF's x * cdf) */
    int half = irand(&G->r, 3);
    c = fscalar(G, 0.5, r1);
    s = sw(G);
    h = half == 0 ? bin(G, "Mul", xx.id, c, s) : half == 1 ? bin(G, "Mul", xx.id, a, s) : bin(G, "Mul", a, c, s);
    s = sw(G);
    y = half == 0 ? bin(G, "Mul", h, a, s) : half == 1 ? bin(G, "Mul", h, c, s) : bin(G, "Mul", xx.id, h, s);
    push(G, y, xx.rank, xx.dims, fmin(-0.2, xx.lo), fmax(xx.hi, 0), false);
    return true;
}

/* 1 / sqrt(ve) as exporters write it, or 0 for the caller's Div by
 * Sqrt(ve): Reciprocal(Sqrt) (TF's Rsqrt), Div(1, Sqrt) (torch.rsqrt) or
 * Pow(ve, -0.5). */
static kf_id inv_std(gen *G, kf_id ve) {
    int k = irand(&G->r, 5);
    if (k < 2) return 0; /* the Div form, the most common */
    if (k == 4) return bin(G, "Pow", ve, fscalar(G, -0.5, false), false);
    kf_id sd = un(G, "Sqrt", ve);
    return k == 2 ? un(G, "Reciprocal", sd) : bin(G, "Div", fscalar(G, 1, false), sd, false);
}

static bool motif_norm(gen *G) {
    /* Not in fp16: the decomposed form cancels (x - mean over rows of
     * similar values) and rounds every step to 11 bits, so it is further
     * from the exact result than the fused op is, by more than the fp16
     * tolerance (seeds 736 and 1614 of the first campaign). */
    if (G->ft == KF_DT_FLOAT16) return false;
    val *x = pick(G, lastdim2_ok);
    if (!x || G->nodes + 10 > G->target) return false;
    val xx = *x;
    int64_t h = xx.dims[xx.rank - 1], m1 = -1;
    double eps = chance(&G->r, 0.5) ? 1e-2 : 5e-2; /* see NORM_EPS_NOTE */
    val gamma = *fconst(G, 1, &h, 0.5, 1.5, false);
    double bound = sqrt((double)h) * vmax(&gamma);
    kf_id y, mu, d, sq, v, c, ve, sd, n;
    int keep;
    bool s;
    if (chance(&G->r, 0.7)) { /* LayerNorm */
        keep = chance(&G->r, 0.5) ? 1 : -1;
        mu = reduce(G, "ReduceMean", xx.id, 1, &m1, keep);
        d = bin(G, "Sub", xx.id, mu, false);
        if (chance(&G->r, 0.15)) push(G, d, xx.rank, xx.dims, xx.lo - xx.hi, xx.hi - xx.lo, false);
        if (chance(&G->r, 0.5)) {
            sq = bin(G, "Mul", d, d, false);
        } else {
            c = fscalar(G, 2, false);
            sq = bin(G, "Pow", d, c, false);
        }
        keep = chance(&G->r, 0.5) ? 1 : -1;
        v = reduce(G, "ReduceMean", sq, 1, &m1, keep);
        c = fscalar(G, eps, false);
        s = sw(G);
        ve = bin(G, "Add", v, c, s);
        bool with_beta = chance(&G->r, 0.7);
        kf_id r = inv_std(G, ve);
        bool scaled = r && with_beta && chance(&G->r, 0.4); /* d * (r * gamma): the _scaled forms */
        if (!r) {
            sd = un(G, "Sqrt", ve);
            n = bin(G, "Div", d, sd, false);
        } else {
            if (scaled) {
                s = sw(G);
                r = bin(G, "Mul", r, gamma.id, s);
            }
            s = sw(G);
            n = bin(G, "Mul", d, r, s);
        }
        s = sw(G);
        y = scaled ? n : bin(G, "Mul", n, gamma.id, s);
        if (with_beta) {
            val beta = *fconst(G, 1, &h, -1, 1, false);
            s = sw(G);
            y = bin(G, "Add", y, beta.id, s);
            bound += vmax(&beta);
        }
    } else { /* RMSNorm */
        sq = bin(G, "Mul", xx.id, xx.id, false);
        v = reduce(G, "ReduceMean", sq, 1, &m1, 1);
        c = fscalar(G, eps, false);
        s = sw(G);
        ve = bin(G, "Add", v, c, s);
        kf_id r = inv_std(G, ve);
        if (!r) {
            sd = un(G, "Sqrt", ve);
            n = bin(G, "Div", xx.id, sd, false);
        } else {
            s = sw(G);
            n = bin(G, "Mul", xx.id, r, s);
        }
        s = sw(G);
        y = bin(G, "Mul", n, gamma.id, s);
    }
    if (!bounded(G, -bound, bound)) bound = G->mag; /* still finite; only the pool bound is loose */
    push(G, y, xx.rank, xx.dims, -bound, bound, false);
    return true;
}

static bool motif_softmax(gen *G) {
    val *x = pick(G, rank1_ok);
    if (!x || G->nodes + 5 > G->target) return false;
    val xx = *x;
    int64_t m1 = -1;
    kf_id mx = reduce(G, "ReduceMax", xx.id, 1, &m1, chance(&G->r, 0.5) ? 1 : -1);
    kf_id d = bin(G, "Sub", xx.id, mx, false);
    kf_id e = un(G, "Exp", d);
    if (chance(&G->r, 0.15)) push(G, e, xx.rank, xx.dims, exp(xx.lo - xx.hi), 1, false);
    kf_id s = reduce(G, "ReduceSum", e, 1, &m1, chance(&G->r, 0.5) ? 1 : -1);
    kf_id y = bin(G, "Div", e, s, false);
    double span = xx.hi - xx.lo;
    push(G, y, xx.rank, xx.dims, 1 / (1 + (double)(xx.dims[xx.rank - 1] - 1) * exp(span)), 1, false);
    return true;
}

static bool rank3_ok(const gen *G, const val *x) { (void)G; return x->rank >= 3; }

/* Attention as exporters write it: MatMul(q, Transpose(k)) scaled by
 * 1/sqrt(d), an additive mask now and then (a constant over the keys, 0 or
 * down to -4), Softmax over the keys, MatMul with v. q, k and v are one
 * value or fresh inputs of its shape (self- or cross-attention over the same
 * lengths); the planner makes it one group, codegen the streaming kernel. */
/* A product of x (last axis K) with constant weights within 1/K, so each
 * output stays within x's bound, cut by a Split into n equal parts of
 * width columns along the last axis, as exporters write merged
 * projections (q/k/v, gate/up); the parts' ids go to outs. */
static void split_projection(gen *G, kf_id x, int64_t K, int n, int64_t width, kf_id *outs) {
    int64_t wd[2] = {K, n * width};
    kf_id w = fconst(G, 2, wd, -1.0 / (double)K, 1.0 / (double)K, false)->id;
    kf_id y = bin(G, "MatMul", x, w, false);
    kf_node *sp = mk_multi(G, "Split", &y, 1, outs, n);
    if (G->opset >= 18) attr_i(sp, "num_outputs", n);
    attr_i(sp, "axis", -1);
}

static bool motif_attention(gen *G) {
    val *x = pick(G, rank3_ok);
    if (!x || G->nodes + 6 > G->target) return false;
    val q = *x;
    int r = q.rank;
    int64_t s = q.dims[r - 2], d = q.dims[r - 1];
    int64_t sd[MAX_R];
    memcpy(sd, q.dims, sizeof sd);
    sd[r - 1] = s; /* scores [.., s, s] */
    if (numel(r, sd) > MAX_NUMEL) return false;
    val k = q, v = q, *f;
    if (chance(&G->r, 0.4) && G->nodes + 9 <= G->target) {
        /* q, k and v of one merged projection, cut apart by a Split (the
         * planner gives the Split to the attention group: plan_build.c,
         * select_edge); weights within 1/d keep each within x's bound */
        kf_id qkv[3];
        split_projection(G, q.id, d, 3, d, qkv);
        double m = vmax(&q);
        q.lo = -m, q.hi = m, q.exact = false;
        k = v = q;
        q.id = qkv[0], k.id = qkv[1], v.id = qkv[2];
    } else {
        if (chance(&G->r, 0.5) && (f = finput(G, r, q.dims))) k = *f;
        if (chance(&G->r, 0.5) && (f = finput(G, r, q.dims))) v = *f;
    }
    double scale = 1 / sqrt((double)d), bound = (double)d * vmax(&q) * vmax(&k) * scale;
    if (!bounded(G, -bound - 4, bound)) return false;
    int64_t perm[MAX_R];
    for (int i = 0; i < r; i++) perm[i] = i;
    perm[r - 2] = r - 1, perm[r - 1] = r - 2;
    kf_id kt;
    kf_node *tn = mk(G, "Transpose", &k.id, 1, &kt);
    attr_ints(tn, "perm", r, perm);
    kf_id m = bin(G, "MatMul", q.id, kt, false);
    kf_id a = bin(G, "Mul", m, fscalar(G, scale, false), chance(&G->r, 0.3));
    if (chance(&G->r, 0.6)) {
        int64_t md[MAX_R];
        for (int i = 0; i < r; i++) md[i] = 1;
        md[r - 1] = s;
        val mk_ = *fconst(G, r, md, -4, 0, false);
        a = bin(G, "Add", a, mk_.id, chance(&G->r, 0.3));
    }
    kf_id p;
    kf_node *sm = mk(G, "Softmax", &a, 1, &p);
    if (G->opset < 13 || chance(&G->r, 0.5)) attr_i(sm, "axis", -1); /* before 13 the default is 1 */
    kf_id o = bin(G, "MatMul", p, v.id, false);
    push(G, o, r, q.dims, -vmax(&v), vmax(&v), false);
    return true;
}

static bool rank2plus_ok(const gen *G, const val *x) {
    (void)G;
    return x->rank >= 2;
}

static bool even_last_ok(const gen *G, const val *x) {
    (void)G;
    return x->rank >= 1 && x->dims[x->rank - 1] >= 2 && x->dims[x->rank - 1] % 2 == 0;
}

/* Rotary embedding as exporters write it without the opset-23 op:
 * rotate_half(x) = Concat(-x2, x1) of x's halves along the last axis (two
 * Slices and a Neg), then x cos + rotate_half(x) sin, cos and sin over the
 * last one or two axes. The planner puts the Slices and the Neg in the
 * Concat's kernel (plan.c, broadcast_producer). */
static bool motif_rotate_half(gen *G) {
    val *x = pick(G, even_last_ok);
    if (!x || G->nodes + 8 > G->target) return false;
    val xx = *x;
    int r = xx.rank;
    int64_t D = xx.dims[r - 1], h = D / 2, z = 0, ax = -1;
    int64_t e = chance(&G->r, 0.3) ? 1000 : D; /* past the end: clamped */
    double m = 2 * vmax(&xx);
    if (!bounded(G, -m, m)) return false;
    kf_id a, b, c;
    kf_id in1[4] = {xx.id, ilist(G, 1, &z), ilist(G, 1, &h), ilist(G, 1, &ax)};
    mk(G, "Slice", in1, 4, &a);
    kf_id in2[4] = {xx.id, ilist(G, 1, &h), ilist(G, 1, &e), ilist(G, 1, &ax)};
    mk(G, "Slice", in2, 4, &b);
    kf_id cin[2] = {un(G, "Neg", b), a};
    bool neg_axis = chance(&G->r, 0.5);
    attr_i(mk(G, "Concat", cin, 2, &c), "axis", neg_axis ? -1 : r - 1);
    int cr = r >= 2 && chance(&G->r, 0.5) ? 2 : 1;
    int64_t cd[2] = {xx.dims[r - 2 >= 0 ? r - 2 : 0], D};
    const int64_t *cdims = cr == 2 ? cd : &D;
    kf_id cs = fconst(G, cr, cdims, -1, 1, false)->id;
    kf_id sn = fconst(G, cr, cdims, -1, 1, false)->id;
    kf_id xc = bin(G, "Mul", xx.id, cs, sw(G));
    kf_id rs = bin(G, "Mul", c, sn, sw(G));
    kf_id y = bin(G, "Add", xc, rs, sw(G));
    push(G, y, r, xx.dims, -m, m, false);
    return true;
}

/* SwiGLU on one merged product, as exporters write gate and up fused: a
 * MatMul to 2F columns, a Split in two, silu(gate) * up. After a library
 * call the epilogue kernel takes the tail; a generated GEMM cannot (two
 * parts of its output in one op: plan.c, KF_REASON_EPI_PARTS). */
static bool motif_split_glu(gen *G) {
    val *x = pick(G, rank2plus_ok);
    if (!x || G->nodes + 6 > G->target) return false;
    val xx = *x;
    int r = xx.rank;
    int64_t K = xx.dims[r - 1], F = 1 + irand(&G->r, 8), od[MAX_R];
    memcpy(od, xx.dims, sizeof od);
    od[r - 1] = 2 * F;
    if (numel(r, od) > MAX_NUMEL) return false;
    od[r - 1] = F;
    double m = vmax(&xx); /* weights within 1/K: |gate|, |up| <= m */
    if (!bounded(G, -m * m - 1, m * m + 1)) return false;
    kf_id gu[2];
    split_projection(G, xx.id, K, 2, F, gu);
    kf_id sg = un(G, "Sigmoid", gu[0]);
    kf_id sl = bin(G, "Mul", gu[0], sg, sw(G));
    kf_id o = bin(G, "Mul", sl, gu[1], sw(G));
    push(G, o, r, od, -m * m - 1, m * m + 1, false);
    return true;
}

/* What exporters write for dynamic axes: the leading two dims merged by a
 * target computed from Shape (Gather, Mul, Unsqueeze, Slice, Concat), and
 * split back by a target read off the original's Shape; an identity on the
 * values. Symbolic inputs make the targets symbolic (kf_sym.h); the fold
 * pass must turn them into constants or the smallest computation. */
static bool motif_shape_reshape(gen *G) {
    val *x = G->opset >= 13 ? pick(G, rank2plus_ok) : NULL; /* Unsqueeze axes as an input */
    if (!x || G->nodes + 12 > G->target) return false;
    val xx = *x;
    int r = xx.rank;
    int64_t zero = 0, one = 1, two = 2, end = r, ax = 0;
    kf_id s, g0, g1, m, u, rest, t, y, s2, h, h1, t2, z;
    mk(G, "Shape", &xx.id, 1, &s);
    kf_id in0[2] = {s, iconst(G, 0, NULL, &zero)}, in1[2] = {s, iconst(G, 0, NULL, &one)};
    attr_i(mk(G, "Gather", in0, 2, &g0), "axis", 0);
    attr_i(mk(G, "Gather", in1, 2, &g1), "axis", 0);
    m = bin(G, "Mul", g0, g1, false);
    kf_id uin[2] = {m, ilist(G, 1, &ax)};
    mk(G, "Unsqueeze", uin, 2, &u);
    kf_id sl[3] = {s, ilist(G, 1, &two), ilist(G, 1, &end)};
    mk(G, "Slice", sl, 3, &rest);
    kf_id cin[2] = {u, rest};
    attr_i(mk(G, "Concat", cin, 2, &t), "axis", 0);
    kf_id rin[2] = {xx.id, t};
    mk(G, "Reshape", rin, 2, &y);
    /* back: [d0, d1, rest...] from y's own shape: d0 = y.shape[0] / d1 */
    mk(G, "Shape", &y, 1, &s2);
    kf_id hin[2] = {s2, iconst(G, 0, NULL, &zero)};
    attr_i(mk(G, "Gather", hin, 2, &h), "axis", 0);
    h1 = bin(G, "Div", h, g1, false);
    kf_id u2in[2] = {h1, ilist(G, 1, &ax)}, u3in[2] = {g1, ilist(G, 1, &ax)};
    kf_id a2, a3;
    mk(G, "Unsqueeze", u2in, 2, &a2);
    mk(G, "Unsqueeze", u3in, 2, &a3);
    kf_id c2[3] = {a2, a3, rest};
    attr_i(mk(G, "Concat", c2, 3, &t2), "axis", 0);
    kf_id r2[2] = {y, t2};
    mk(G, "Reshape", r2, 2, &z);
    push(G, z, r, xx.dims, xx.lo, xx.hi, xx.exact);
    return true;
}

/* A graph input without size-1 or symbolic dims: Squeeze without axes
 * keeps it as it is. (Any dim derived from a symbolic one may be 1 as far
 * as the model says, so the squeezed rank would be unknown to inference;
 * the generator does not track which dims derive from symbols.) */
static bool no_unit_dim(const gen *G, const val *x) {
    const kf_value *v = &G->g->values[x->id];
    if (!v->is_input || x->rank < 1) return false;
    for (int i = 0; i < x->rank; i++)
        if (x->dims[i] == 1 || v->type.syms[i]) return false;
    return true;
}

/* x*1, x+0, x-0, x/1, Identity, Dropout: no-ops, unless the constant is
 * shaped so that it broadcasts x to a bigger shape. Also CastLike to x's
 * own type, Squeeze of a value without size-1 dims, Split into one part
 * and Concat of one input. */
/* An 8-bit constant of one value (a zero point). */
static kf_id qconst(gen *G, kf_dtype dt, int rank, const int64_t *dims, int64_t v) {
    kf_tensor *t = kf_tensor_new();
    if (!t) need(KF_ERR_NOMEM);
    need(kf_tensor_alloc(t, dt, rank, dims));
    for (int64_t i = 0; i < t->numel; i++) kf_set_f64(t, i, (double)v);
    kf_id id = new_value(G, 'c');
    G->g->values[id].init = t;
    kf_type_of_tensor(&G->g->values[id].type, t);
    return id;
}

/* What QDQ models hold: an activation quantised per tensor to uint8 (or a
 * float8 format, uint4, uint16 or float4) and dequantised, times weights
 * quantised per output column to int8 (the same float8 format, int4, int16
 * or float4) and
 * dequantised (the optimizer folds the weights' QuantizeLinear, and int8
 * plans keep their DequantizeLinear), one product or two sibling ones
 * (which the sibling merge makes one). The activation is a fresh graph
 * input, so its codes are the same on every backend: a computed value
 * differs in its last bits between a kernel and the reference, and a code
 * on a rounding boundary would move by a whole step. */
static bool motif_qdq(gen *G) {
    if (G->ft != KF_DT_FLOAT || G->opset < 13 || G->nodes + 6 > G->target) return false;
    /* a zero point off the middle: int8 plans move it out of the product.
     * Sometimes float8 codes instead (opset 19+; zero point 0, which the
     * reference ignores): generated kernels round into and read them */
    static const kf_dtype f8[] = {KF_DT_FLOAT8E4M3FN, KF_DT_FLOAT8E4M3FNUZ, KF_DT_FLOAT8E5M2, KF_DT_FLOAT8E5M2FNUZ};
    kf_dtype at = KF_DT_UINT8, wt = KF_DT_INT8;
    double half = 127; /* the codes' half range: scales of 2/half and 1/half */
    if (G->opset >= 19 && chance(&G->r, 0.3)) at = wt = f8[irand(&G->r, 4)];
    else if (G->opset >= 21 && chance(&G->r, 0.2)) at = KF_DT_UINT4, wt = KF_DT_INT4, half = 7; /* 4-bit, opset 21 */
    else if (G->opset >= 21 && chance(&G->r, 0.15)) at = KF_DT_UINT16, wt = KF_DT_INT16, half = 32767;
    else if (G->opset >= 23 && chance(&G->r, 0.15)) at = wt = KF_DT_FLOAT4E2M1, half = 6; /* E2M1's largest value */
    /* half of the E4M3FN/E5M2 draws are float8 products as fp8 plans take
     * them (fusion/kf_cost.h kf_fp8_product_form): K and N multiples of 16,
     * weights per tensor or (fp8_column, kf_fuse_fp8's form) per column */
    bool fp8_form = (at == KF_DT_FLOAT8E4M3FN || at == KF_DT_FLOAT8E5M2) && chance(&G->r, 0.5);
    bool fp8_column = fp8_form && chance(&G->r, 0.5);
    if (fp8_form && at == KF_DT_FLOAT8E5M2) wt = KF_DT_FLOAT8E4M3FN; /* cuBLASLt takes E5M2 x E4M3, not E5M2 x E5M2 */
    int r = 2 + irand(&G->r, 2);
    int64_t dims[MAX_R], one = 1;
    for (int i = 0; i < r; i++) dims[i] = rdim(G);
    if (fp8_form) dims[r - 1] = 16 * (1 + irand(&G->r, 2));
    val *xp = finput(G, r, dims);
    if (!xp) return false;
    val x = *xp;
    int64_t K = dims[r - 1], N = fp8_form ? 16 * (1 + irand(&G->r, 2)) : rdim(G), wdims[2] = {K, N};
    double bound = (double)K * 2 * 1;
    if (!bounded(G, -bound, bound)) return false;
    int64_t zv = at == KF_DT_UINT8    ? 100 + irand(&G->r, 57)
                 : at == KF_DT_UINT4  ? 6 + irand(&G->r, 4)
                 : at == KF_DT_UINT16 ? 30000 + irand(&G->r, 5000)
                                      : 0;
    /* float4 without zero points: a QuantizeLinear to float4 adds one as a
     * value, which generated kernels leave to the host */
    int nz = at == KF_DT_FLOAT4E2M1 ? 2 : 3;
    kf_id sx = fscalar(G, 2.0 / half, false), zx = nz == 3 ? qconst(G, at, 0, &one, zv) : 0;
    kf_id qin[3] = {x.id, sx, zx}, q, d;
    kf_node *qn = mk(G, "QuantizeLinear", qin, nz, &q);
    if (nz == 2) attr_i(qn, "output_dtype", at);
    kf_id din[3] = {q, sx, zx};
    mk(G, "DequantizeLinear", din, nz, &d);
    /* sometimes a sibling product of the same activation (Q/K/V-like): the
     * sibling merge concatenates dequantized weights and their scales */
    int products = G->nodes + 9 <= G->target && irand(&G->r, 2) ? 2 : 1;
    for (int p = 0; p < products; p++) {
        if (p) N = fp8_form ? 16 * (1 + irand(&G->r, 2)) : rdim(G), wdims[1] = N;
        kf_id w = fconst(G, 2, wdims, -1, 1, false)->id;
        bool tensor_w = fp8_form && !fp8_column;
        kf_id sw = tensor_w ? fscalar(G, 1.25 / half, false) : fconst(G, 1, &N, 1.0 / half, 1.5 / half, false)->id;
        kf_id zw = nz == 3 ? qconst(G, wt, tensor_w ? 0 : 1, &N, 0) : 0, wq, wd;
        kf_id wqin[3] = {w, sw, zw};
        kf_node *wqn = mk(G, "QuantizeLinear", wqin, nz, &wq);
        attr_i(wqn, "axis", 1);
        if (nz == 2) attr_i(wqn, "output_dtype", wt);
        kf_id wdin[3] = {wq, sw, zw};
        attr_i(mk(G, "DequantizeLinear", wdin, nz, &wd), "axis", 1);
        kf_id y = bin(G, "MatMul", d, wd, false);
        dims[r - 1] = N;
        push(G, y, r, dims, -bound, bound, false);
        /* sometimes the product's rows normalized at once (a projection
         * into LayerNorm: an integer anchor with a row reduction) */
        if (G->opset >= 17 && N >= 2 && chance(&G->r, 0.3)) {
            val *sc = fconst(G, 1, &N, 0.5, 1.5, false);
            double nb = sqrt((double)N) * 1.5;
            kf_id lin[2] = {y, sc->id}, ln;
            attr_f(mk(G, "LayerNormalization", lin, 2, &ln), "epsilon", 1e-2f); /* see NORM_EPS_NOTE */
            push(G, ln, r, dims, -nb, nb, false);
        }
    }
    return true;
}

/* A QDQ convolution as quantizers write it: the input quantized per
 * tensor (uint8, a zero point off the middle), the weights per output
 * channel (int8, zero point 0), Conv with random window, pads, strides and
 * dilations (sometimes two groups), sometimes a Relu. int8 plans make it a
 * ConvInteger: the tensor-core tiles for one group, the direct template
 * for more. Sometimes (opset 19+) both are float8 instead, E4M3FN or E5M2
 * each (zero points 0): an fp8 plan's float8 convolution (the float8
 * tiles for one group), sometimes requantized for a second, 1x1 float8
 * conv. Bounded like emit_conv's. */
static bool motif_qdq_conv(gen *G) {
    if (G->ft != KF_DT_FLOAT || G->opset < 13 || G->nodes + 6 > G->target) return false;
    int64_t d[4], one = 1;
    d[0] = 1 + irand(&G->r, 2);
    d[1] = 1 + irand(&G->r, 6);
    d[2] = 3 + irand(&G->r, 6);
    d[3] = 3 + irand(&G->r, 6);
    val *xp = finput(G, 4, d);
    if (!xp) return false;
    val x = *xp;
    int64_t c = d[1], group = c % 2 == 0 && chance(&G->r, 0.2) ? 2 : 1, mch = group * (1 + irand(&G->r, 5));
    int64_t kh = 1 + irand(&G->r, 3), kw = 1 + irand(&G->r, 3), pad = irand(&G->r, 2), stride = 1 + irand(&G->r, 2);
    int64_t dil = kh > 1 && kw > 1 && chance(&G->r, 0.2) ? 2 : 1;
    int64_t eh = (kh - 1) * dil + 1, ew = (kw - 1) * dil + 1;
    if (eh > d[2] + 2 * pad || ew > d[3] + 2 * pad) return false;
    int64_t wd[4] = {mch, c / group, kh, kw};
    double sc = 1 / sqrt((double)(wd[1] * kh * kw));
    kf_id w = fconst(G, 4, wd, -sc, sc, false)->id;
    double bound = colsum(G->g->values[w].init, wd[1] * kh * kw, mch, true) * 1.02 * vmax(&x);
    if (!bounded(G, -bound, bound)) return false;
    int64_t od[4] = {d[0], mch, (d[2] + 2 * pad - eh) / stride + 1, (d[3] + 2 * pad - ew) / stride + 1};
    kf_dtype at = KF_DT_UINT8, wt = KF_DT_INT8;
    if (G->opset >= 19 && chance(&G->r, 0.3)) {
        at = chance(&G->r, 0.5) ? KF_DT_FLOAT8E4M3FN : KF_DT_FLOAT8E5M2;
        wt = chance(&G->r, 0.5) ? KF_DT_FLOAT8E4M3FN : KF_DT_FLOAT8E5M2;
    }
    kf_id sx = fscalar(G, 2.0 / 127, false), zx = qconst(G, at, 0, &one, at == KF_DT_UINT8 ? 100 + irand(&G->r, 57) : 0);
    kf_id sw = fconst(G, 1, &mch, 1.0 / 127, 1.5 / 127, false)->id, zw = qconst(G, wt, 1, &mch, 0);
    kf_id qin[3] = {x.id, sx, zx}, q, xd, wq, wdq, y;
    mk(G, "QuantizeLinear", qin, 3, &q);
    kf_id din[3] = {q, sx, zx};
    mk(G, "DequantizeLinear", din, 3, &xd);
    kf_id wqin[3] = {w, sw, zw};
    attr_i(mk(G, "QuantizeLinear", wqin, 3, &wq), "axis", 0);
    kf_id wdin[3] = {wq, sw, zw};
    attr_i(mk(G, "DequantizeLinear", wdin, 3, &wdq), "axis", 0);
    kf_id cin[2] = {xd, wdq};
    kf_node *n = mk(G, "Conv", cin, 2, &y);
    int64_t pads[4] = {pad, pad, pad, pad}, strides[2] = {stride, stride}, dils[2] = {dil, dil};
    if (pad) attr_ints(n, "pads", 4, pads);
    if (stride > 1) attr_ints(n, "strides", 2, strides);
    if (dil > 1) attr_ints(n, "dilations", 2, dils);
    if (group > 1) attr_i(n, "group", group);
    if (chance(&G->r, 0.4)) {
        kf_id pre = y;
        mk(G, "Relu", &pre, 1, &y);
    }
    /* float8: sometimes requantized after (as in a QDQ ResNet) for a 1x1
     * float8 conv: the planner's choice of the float8 tile reading codes
     * the first conv's epilogue wrote, or (small shapes) both convs back
     * to back with the requantization between */
    if (at != KF_DT_UINT8 && G->nodes + 6 <= G->target && chance(&G->r, 0.6)) {
        int64_t m2 = 1 + irand(&G->r, 6), w2d[4] = {m2, mch, 1, 1};
        kf_id w2 = fconst(G, 4, w2d, -1 / sqrt((double)mch), 1 / sqrt((double)mch), false)->id;
        double bound2 = colsum(G->g->values[w2].init, mch, m2, true) * 1.02 * bound;
        if (bounded(G, -bound2, bound2)) {
            kf_id sy = fscalar(G, bound / 200, false), sw2 = fscalar(G, 1.0 / 127, false);
            kf_id zw2 = qconst(G, wt, 0, &one, 0);
            kf_id yqin[3] = {y, sy, zx}, yq, yd, w2q, w2d_;
            mk(G, "QuantizeLinear", yqin, 3, &yq);
            kf_id ydin[3] = {yq, sy, zx};
            mk(G, "DequantizeLinear", ydin, 3, &yd);
            kf_id w2qin[3] = {w2, sw2, zw2};
            mk(G, "QuantizeLinear", w2qin, 3, &w2q);
            kf_id w2din[3] = {w2q, sw2, zw2};
            mk(G, "DequantizeLinear", w2din, 3, &w2d_);
            kf_id c2in[2] = {yd, w2d_};
            mk(G, "Conv", c2in, 2, &y);
            od[1] = m2, bound = bound2;
        }
    }
    push(G, y, 4, od, -bound, bound, false);
    return true;
}

static bool motif_noop(gen *G) {
    val *x = pick(G, NULL);
    if (!x) return false;
    val xx = *x;
    int k = irand(&G->r, 10);
    if (k == 6 && G->opset < 15) k = 4; /* CastLike: opset 15 */
    if (k >= 7 && xx.rank < 1) k = 5;   /* Squeeze, Split and Concat need an axis */
    if (k == 7 && !no_unit_dim(G, &xx)) { /* another value, or Identity */
        val *q = pick(G, no_unit_dim);
        if (q) xx = *q;
        else k = 4;
    }
    kf_id y = 0;
    if (k == 4 || k == 5) {
        y = un(G, k == 4 ? "Identity" : "Dropout", xx.id);
    } else if (k == 6) {
        val *like = pick(G, NULL); /* any value of the graph's float type */
        y = bin(G, "CastLike", xx.id, like ? like->id : fscalar(G, 0, false), false);
    } else if (k == 7) { /* Squeeze without axes removes every size-1 dim: none here */
        y = un(G, "Squeeze", xx.id);
    } else if (k == 8) {
        int axis = irand(&G->r, xx.rank);
        kf_node *n = mk(G, "Split", &xx.id, 1, &y);
        if (axis || chance(&G->r, 0.3)) attr_i(n, "axis", axis);
        if (G->opset >= 18) attr_i(n, "num_outputs", 1);
    } else if (k == 9) {
        kf_node *n = mk(G, "Concat", &xx.id, 1, &y);
        attr_i(n, "axis", irand(&G->r, xx.rank));
    }
    if (y) {
        push(G, y, xx.rank, xx.dims, xx.lo, xx.hi, xx.exact);
        return true;
    }
    static const char *ops[] = {"Mul", "Add", "Sub", "Div"};
    double v = (k == 0 || k == 3) ? 1 : 0;
    int64_t d[MAX_R + 1];
    int r = chance(&G->r, 0.5) ? 0 : partner_shape(G, &xx, d);
    for (int i = 0; i < r; i++)
        if (chance(&G->r, 0.5)) d[i] = 1;
    int ro;
    int64_t od[MAX_R + 2];
    if (r > MAX_R || !bcast(xx.rank, xx.dims, r, d, &ro, od) || ro > MAX_R) return false;
    val c = *fconst(G, r, d, v, v, false);
    y = bin(G, ops[k], xx.id, c.id, k < 2 && sw(G));
    push(G, y, ro, od, xx.lo, xx.hi, xx.exact);
    return true;
}

/* ---- control flow ------------------------------------------------------------
 * If and Loop with bodies that read values of the generated graph by name
 * (the node captures them). Bodies always run on the reference evaluator,
 * on every path, so what the paths can get wrong is the graph around them:
 * captured values kept, redirected and renamed through opt, fuse, export
 * and the host steps of OpenCL. */

/* A body under construction: a model of its own; values it reads from the
 * generated graph are named there with no producer, input or initializer. */
static kf_model *body_new(gen *G) {
    kf_model *b = calloc(1, sizeof *b);
    if (!b || !(b->graph = kf_graph_new()) || !(b->opsets = calloc(1, sizeof(kf_opset))) ||
        !(b->opsets[0].domain = strdup("")))
        need(KF_ERR_NOMEM);
    b->nopsets = 1;
    b->opsets[0].version = G->opset;
    b->ir_version = 8;
    return b;
}

/* Body value `name`: created when new; a typed formal input when ty is set. */
static kf_id body_value(kf_model *b, const char *name, const kf_type *ty) {
    kf_id v;
    need(kf_graph_intern_value(b->graph, name, &v));
    if (ty) {
        b->graph->values[v].type = *ty;
        b->graph->values[v].has_type = true;
        need(kf_graph_mark_input(b->graph, v));
    }
    return v;
}

/* A node of body b with one fresh output, whose id it returns. */
static kf_id body_node(gen *G, kf_model *b, const char *op, const kf_id *in, int nin) {
    char nm[32];
    snprintf(nm, sizeof nm, "q%d", G->names++);
    kf_id out = body_value(b, nm, NULL), nid;
    need(kf_graph_add_node(b->graph, op, "", NULL, in, nin, &out, 1, &nid));
    b->graph->nodes[nid].op = kf_op_lookup("", op);
    b->graph->nodes[nid].opset = G->opset;
    return out;
}

/* A scalar float constant of body b. */
static kf_id body_scalar(gen *G, kf_model *b, double v) {
    kf_tensor *t = kf_tensor_new();
    if (!t) need(KF_ERR_NOMEM);
    need(kf_tensor_alloc(t, G->ft, 0, NULL));
    kf_set_f64(t, 0, v);
    char nm[32];
    snprintf(nm, sizeof nm, "k%d", G->names++);
    kf_id id = body_value(b, nm, NULL);
    b->graph->values[id].init = t;
    kf_type_of_tensor(&b->graph->values[id].type, t);
    return id;
}

/* Gives body b (freed here) to node nid as graph attribute `attr`, packed
 * the way the loader keeps it, and captures what it reads. */
static void attach_body(gen *G, kf_id nid, const char *attr, kf_model *b) {
    void *buf;
    size_t len;
    need(kf_model_save_memory(b, &buf, &len));
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, buf);
    free(buf);
    if (!mp || !mp->graph) need(KF_ERR_NOMEM);
    Onnx__AttributeProto ap;
    onnx__attribute_proto__init(&ap);
    ap.name = (char *)attr;
    ap.has_type = 1;
    ap.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
    ap.g = mp->graph;
    kf_attr a = {.name = (char *)attr, .type = KF_ATTR_GRAPH};
    a.packed_len = onnx__attribute_proto__get_packed_size(&ap);
    if (!(a.packed = malloc(a.packed_len + 1))) need(KF_ERR_NOMEM);
    onnx__attribute_proto__pack(&ap, a.packed);
    need(kf_node_add_attr(&G->g->nodes[nid], &a));
    free(a.packed);
    onnx__model_proto__free_unpacked(mp, NULL);
    const kf_graph *bg = b->graph;
    for (kf_id v = 1; v < bg->nvalues; v++) {
        const kf_value *x = &bg->values[v];
        if (x->producer || x->is_input || x->init || (!x->nusers && !x->is_output)) continue;
        kf_id ov = kf_graph_find(G->g, x->name);
        const kf_node *n = &G->g->nodes[nid];
        bool have = false;
        for (int k = 0; k < n->ncap; k++) have = have || !strcmp(n->capname[k], x->name);
        if (ov && !have) need(kf_node_add_capture(G->g, nid, ov, x->name));
    }
    kf_model_free(b);
}

/* [lo, hi] of f(x) for x in [xlo, xhi] and f one of Relu, Neg, Abs. */
static void unary_range(int f, double xlo, double xhi, double *lo, double *hi) {
    if (f == 0) *lo = fmax(xlo, 0), *hi = fmax(xhi, 0);
    else if (f == 1) *lo = -xhi, *hi = -xlo;
    else *hi = fmax(fabs(xlo), fabs(xhi)), *lo = xlo >= 0 ? xlo : xhi <= 0 ? -xhi : 0;
}

/* y = If(c) then f(a) else a*k: the condition a constant (constant folding
 * runs the If) or max(x) > t of an exact x (the same bit on every path). */
static bool emit_if(gen *G) {
    val *a = pick(G, NULL);
    if (!a) return false;
    val aa = *a;
    kf_id c;
    if (chance(&G->r, 0.3)) {
        kf_tensor *t = kf_tensor_new();
        if (!t) need(KF_ERR_NOMEM);
        need(kf_tensor_alloc(t, KF_DT_BOOL, 0, NULL));
        kf_set_i64(t, 0, chance(&G->r, 0.5));
        c = new_value(G, 'c');
        G->g->values[c].init = t;
        kf_type_of_tensor(&G->g->values[c].type, t);
    } else {
        val *x = pick(G, exact_ok);
        if (!x) return false;
        val xx = *x;
        kf_id mx, in2[2];
        attr_i(mk(G, "ReduceMax", &xx.id, 1, &mx), "keepdims", 0);
        in2[0] = mx;
        in2[1] = fscalar(G, unif(&G->r, xx.lo, xx.hi), false);
        mk(G, "Greater", in2, 2, &c);
    }
    static const char *fs[] = {"Relu", "Neg", "Abs"};
    int f = irand(&G->r, 3);
    double k = unif(&G->r, -1, 1), tlo, thi;
    unary_range(f, aa.lo, aa.hi, &tlo, &thi);
    double elo = fmin(aa.lo * k, aa.hi * k), ehi = fmax(aa.lo * k, aa.hi * k);
    double lo = fmin(tlo, elo), hi = fmax(thi, ehi);
    if (!bounded(G, lo, hi)) return false;
    const char *an = G->g->values[aa.id].name;
    kf_model *tb = body_new(G), *eb = body_new(G);
    kf_id ta = body_value(tb, an, NULL), ty = body_node(G, tb, fs[f], &ta, 1);
    if (chance(&G->r, 0.5)) { /* times 1: a rewrite for the body's own optimizer */
        kf_id one[2] = {ty, body_scalar(G, tb, 1.0)};
        ty = body_node(G, tb, "Mul", one, 2);
    }
    need(kf_graph_mark_output(tb->graph, ty));
    kf_id ein[2] = {body_value(eb, an, NULL), body_scalar(G, eb, k)};
    need(kf_graph_mark_output(eb->graph, body_node(G, eb, "Mul", ein, 2)));
    kf_id out;
    mk(G, "If", &c, 1, &out);
    kf_id nid = G->g->nnodes - 1;
    attach_body(G, nid, "then_branch", tb);
    attach_body(G, nid, "else_branch", eb);
    push(G, out, aa.rank, aa.dims, lo, hi, false);
    return true;
}

/* v = Loop(trip, "", a) with v <- v*0.5 + a (a read from the graph), so v
 * stays between a and 2a; now and then v of every step as a scan output. */
static bool emit_loop(gen *G) {
    val *a = pick(G, NULL);
    if (!a) return false;
    val aa = *a;
    double lo = fmin(aa.lo, 2 * aa.lo), hi = fmax(aa.hi, 2 * aa.hi);
    if (!bounded(G, lo, hi)) return false;
    int64_t trips = 1 + irand(&G->r, 4);
    bool scan = aa.rank < MAX_R && numel(aa.rank, aa.dims) * trips <= MAX_NUMEL && chance(&G->r, 0.5);
    kf_model *b = body_new(G);
    kf_type ti, tc, tv;
    kf_type_unknown(&ti);
    ti.dtype = KF_DT_INT64;
    ti.rank = 0;
    tc = ti;
    tc.dtype = KF_DT_BOOL;
    kf_type_unknown(&tv);
    tv.dtype = G->ft;
    tv.rank = aa.rank;
    memcpy(tv.dims, aa.dims, sizeof(int64_t) * (size_t)aa.rank);
    char nm[3][32];
    for (int i = 0; i < 3; i++) snprintf(nm[i], sizeof nm[i], "q%d", G->names++);
    body_value(b, nm[0], &ti);
    kf_id cin = body_value(b, nm[1], &tc), v = body_value(b, nm[2], &tv);
    kf_id hin[2] = {v, body_scalar(G, b, 0.5)};
    kf_id h = body_node(G, b, "Mul", hin, 2);
    kf_id ain[2] = {h, body_value(b, G->g->values[aa.id].name, NULL)};
    kf_id v2 = body_node(G, b, "Add", ain, 2);
    need(kf_graph_mark_output(b->graph, body_node(G, b, "Identity", &cin, 1)));
    need(kf_graph_mark_output(b->graph, v2));
    if (scan) need(kf_graph_mark_output(b->graph, body_node(G, b, "Identity", &v2, 1)));
    kf_id in[3] = {iconst(G, 0, NULL, &trips), 0, aa.id}, outs[2] = {new_value(G, 'v'), 0}, nid;
    if (scan) outs[1] = new_value(G, 'v');
    char nname[32];
    snprintf(nname, sizeof nname, "n%d", G->nodes);
    need(kf_graph_add_node(G->g, "Loop", "", nname, in, 3, outs, scan ? 2 : 1, &nid));
    G->g->nodes[nid].op = KF_OP_LOOP;
    G->g->nodes[nid].opset = G->opset;
    G->nodes++;
    attach_body(G, nid, "body", b);
    push(G, outs[0], aa.rank, aa.dims, lo, hi, false);
    if (scan) {
        int64_t d[MAX_R + 2];
        d[0] = trips;
        memcpy(d + 1, aa.dims, sizeof(int64_t) * (size_t)aa.rank);
        push(G, outs[1], aa.rank + 1, d, lo, hi, false);
    }
    return true;
}

/* s, ys = Scan(a, xs) with s <- s*0.5 + x_t*c + a over the T rows of xs (a
 * constant or an input), a read from the graph by name inside the body, so
 * |s| stays below 2|a| + 1; forwards or backwards, ys stacked forwards or
 * backwards. */
static bool emit_scan(gen *G) {
    val *a = pick(G, NULL);
    if (!a || a->rank >= MAX_R) return false;
    val aa = *a;
    double m = 2 * vmax(&aa) + 1;
    int64_t T = 1 + irand(&G->r, 4), xd[MAX_R + 1];
    xd[0] = T;
    memcpy(xd + 1, aa.dims, sizeof(int64_t) * (size_t)aa.rank);
    if (!bounded(G, -m, m) || numel(aa.rank + 1, xd) > MAX_NUMEL) return false;
    val xs = attn_operand(G, aa.rank + 1, xd);
    double c = unif(&G->r, -0.25, 0.25);
    kf_model *b = body_new(G);
    kf_type ts;
    kf_type_unknown(&ts);
    ts.dtype = G->ft;
    ts.rank = aa.rank;
    memcpy(ts.dims, aa.dims, sizeof(int64_t) * (size_t)aa.rank);
    char nm[2][32];
    for (int i = 0; i < 2; i++) snprintf(nm[i], sizeof nm[i], "q%d", G->names++);
    kf_id sv = body_value(b, nm[0], &ts), xv = body_value(b, nm[1], &ts);
    kf_id hin[2] = {sv, body_scalar(G, b, 0.5)}, xin[2] = {xv, body_scalar(G, b, c)};
    kf_id sum_in[2] = {body_node(G, b, "Mul", hin, 2), body_node(G, b, "Mul", xin, 2)};
    kf_id ain[2] = {body_node(G, b, "Add", sum_in, 2), body_value(b, G->g->values[aa.id].name, NULL)};
    kf_id s2 = body_node(G, b, "Add", ain, 2);
    need(kf_graph_mark_output(b->graph, s2));
    need(kf_graph_mark_output(b->graph, body_node(G, b, "Identity", &s2, 1)));
    kf_id in[2] = {aa.id, xs.id}, outs[2] = {new_value(G, 'v'), new_value(G, 'v')}, nid;
    char nname[32];
    snprintf(nname, sizeof nname, "n%d", G->nodes);
    need(kf_graph_add_node(G->g, "Scan", "", nname, in, 2, outs, 2, &nid));
    kf_node *n = &G->g->nodes[nid];
    n->op = kf_op_lookup("", "Scan");
    n->opset = G->opset;
    G->nodes++;
    attr_i(n, "num_scan_inputs", 1);
    if (chance(&G->r, 0.4)) attr_ints(&G->g->nodes[nid], "scan_input_directions", 1, (int64_t[]){1});
    if (chance(&G->r, 0.4)) attr_ints(&G->g->nodes[nid], "scan_output_directions", 1, (int64_t[]){1});
    attach_body(G, nid, "body", b);
    push(G, outs[0], aa.rank, aa.dims, -m, m, false);
    push(G, outs[1], aa.rank + 1, xd, -m, m, false);
    return true;
}

/* ---- the generator --------------------------------------------------------- */

typedef bool (*emit_fn)(gen *G);
typedef struct emitter {
    emit_fn fn;
    int weight;
} emitter;

static const emitter emitters[] = {
    {emit_unary, 14},    {emit_binary, 16},   {emit_where, 3},     {emit_cast, 3},    {emit_reduce, 5},
    {emit_softmax, 3},   {emit_layernorm, 2}, {emit_matmul, 5},    {emit_gemm, 3},    {emit_conv, 3},
    {emit_transpose, 4}, {emit_reshape, 4},   {emit_squeeze, 4},   {emit_concat, 3},  {emit_slice, 4},
    {emit_expand, 2},    {emit_gather, 3},    {motif_gelu, 3},     {motif_norm, 3},   {motif_softmax, 2},
    {motif_noop, 3},     {emit_split, 2},     {emit_flatten, 1},   {emit_tile_pad, 2}, {emit_prelu, 1},
    {emit_pool, 3},      {emit_batchnorm, 1}, {emit_attention, 6}, {emit_rotary, 4}, {motif_attention, 2},
    {emit_if, 2},        {emit_loop, 2},       {motif_shape_reshape, 2}, {motif_qdq, 2}, {motif_qdq_conv, 2},
    {emit_scan, 2},      {emit_cumulative, 2}, {emit_bitcast, 2}, {emit_tensor_scatter, 3},
    {emit_causal_conv, 4}, {emit_linear_attention, 6}, {motif_rotate_half, 2}, {motif_split_glu, 2},
};
/* emitters[FIRST_MOTIF..FIRST_MOTIF+3] need several nodes of room */
#define FIRST_MOTIF 17

kf_model *rg_generate(uint64_t seed) {
    gen *G = calloc(1, sizeof *G);
    kf_model *m = calloc(1, sizeof *m);
    if (!G || !m || !(m->graph = kf_graph_new()) || !(m->opsets = calloc(1, sizeof(kf_opset))) ||
        !(m->opsets[0].domain = strdup(""))) {
        free(G);
        if (m) kf_model_free(m);
        return NULL;
    }
    G->r.s = seed;
    next64(&G->r);
    G->m = m;
    G->g = m->graph;
    m->nopsets = 1;
    m->ir_version = 8;
    /* 17 mostly (LayerNormalization); 18 moves every reduction's axes to an
     * input; 20 has Gelu; 23 Attention and RotaryEmbedding; 28 Swish and
     * SwiGLU; 24 TensorScatter; 26 CumProd and BitCast; 27
     * CausalConvWithState and LinearAttention; 11-13 have Softmax over a
     * 2-D coercion (before 13) and the older Split/Squeeze/ReduceSum
     * attribute forms */
    static const int64_t opsets[] = {17, 17, 17, 17, 17, 18, 18, 20, 23, 23, 24, 27, 28, 28, 13, 12, 11};
    G->opset = opsets[irand(&G->r, (int)(sizeof opsets / sizeof *opsets))];
    m->opsets[0].version = G->opset;
    bool fp16 = chance(&G->r, 0.15);
    G->ft = fp16 ? KF_DT_FLOAT16 : KF_DT_FLOAT;
    G->mag = fp16 ? MAG16 : MAG32;
    G->target = RG_MIN_NODES + irand(&G->r, (fp16 ? RG_MAX_NODES_FP16 : RG_MAX_NODES) - RG_MIN_NODES + 1);
    int ninputs = 1 + irand(&G->r, 3);
    for (int i = 0; i < ninputs; i++) fresh_input(G, 0);
    int total = 0;
    for (size_t i = 0; i < sizeof emitters / sizeof *emitters; i++) total += emitters[i].weight;
    for (int tries = 0; G->nodes < G->target && tries < 2000 && G->nv < MAX_VALS - 16; tries++) {
        int w = irand(&G->r, total);
        size_t e = 0;
        while (w >= emitters[e].weight) w -= emitters[e++].weight;
        int before = G->nodes;
        if (G->target - G->nodes < 3 && e >= FIRST_MOTIF && e < FIRST_MOTIF + 4) continue; /* motifs need room */
        emitters[e].fn(G);
        if (G->nodes > RG_MAX_NODES) break;
        (void)before;
    }
    /* outputs: every value nobody reads, and some in the middle of chains */
    kf_graph *g = G->g;
    for (int i = 0; i < G->nv; i++) {
        kf_value *v = &g->values[G->v[i].id];
        if (v->is_input || v->init || v->is_output || !v->producer) continue;
        if (v->nusers == 0 || chance(&G->r, 0.08)) need(kf_graph_mark_output(g, G->v[i].id));
    }
    /* values made by motifs and not pooled (all have users) stay internal;
     * a graph with nothing to output still needs one */
    if (!g->noutputs)
        for (kf_id v = g->nvalues - 1; v > 0 && !g->noutputs; v--)
            if (g->values[v].producer) need(kf_graph_mark_output(g, v));
    /* dead ends of abandoned attempts: nodes whose result nobody reads */
    for (kf_id v = 1; v < g->nvalues; v++)
        if (g->values[v].producer && !g->values[v].nusers && !g->values[v].is_output) need(kf_graph_mark_output(g, v));
    /* an initializer that is also a graph input is only a default the caller
     * may override: passes must not fold it */
    if (chance(&G->r, 0.05)) {
        for (kf_id v = 1; v < g->nvalues; v++)
            if (g->values[v].init && g->values[v].init->dtype == G->ft && g->values[v].nusers) {
                g->values[v].has_type = true;
                need(kf_graph_mark_input(g, v));
                break;
            }
    }
    kf_status st = kf_infer_shapes(m);
    if (st) fprintf(stderr, "randgraph: seed %llu: shape inference: %s\n", (unsigned long long)seed, kf_last_error());
    /* the generator's shapes against inference's */
    for (int i = 0; i < G->nv && !st; i++) {
        const kf_type *ty = &g->values[G->v[i].id].type;
        bool same = ty->rank == G->v[i].rank;
        for (int d = 0; same && d < ty->rank; d++) same = ty->dims[d] < 0 || ty->dims[d] == G->v[i].dims[d];
        if (!same)
            fprintf(stderr, "randgraph: seed %llu: value %s: inferred rank %d, the generator's %d (dims %lld %lld)\n",
                    (unsigned long long)seed, g->values[G->v[i].id].name, ty->rank, G->v[i].rank,
                    (long long)(ty->rank > 0 ? ty->dims[0] : -9), (long long)(G->v[i].rank > 0 ? G->v[i].dims[0] : -9));
    }
    free(G);
    return m;
}

/* ---- inputs ----------------------------------------------------------------- */

kf_status rg_inputs(const kf_model *m, uint64_t seed, kf_tensor **ins, int *nins) {
    kf_id *real;
    uint32_t n;
    KF_TRY(kf_graph_real_inputs(m->graph, &real, &n));
    kf_tensor *t = calloc(n + 1, sizeof(kf_tensor));
    if (!t) {
        free(real);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    rng r = {seed ^ 0x5eedf00dULL};
    kf_status st = KF_OK;
    for (uint32_t i = 0; i < n && !st; i++) {
        const kf_type *ty = &m->graph->values[real[i]].type;
        int64_t dims[KF_MAX_RANK];
        int rank = ty->rank < 0 ? 0 : ty->rank;
        for (int d = 0; d < rank; d++) dims[d] = ty->dims[d] >= 0 ? ty->dims[d] : 3;
        st = kf_tensor_alloc(&t[i], ty->dtype ? ty->dtype : KF_DT_FLOAT, rank, dims);
        for (int64_t k = 0; !st && k < t[i].numel; k++) {
            double v = unif(&r, -2, 2);
            if (!kf_dtype_is_float(t[i].dtype)) v = floor(v);
            kf_set_f64(&t[i], k, v);
        }
    }
    free(real);
    if (st) {
        rg_free_tensors(t, (int)n);
        return st;
    }
    *ins = t;
    *nins = (int)n;
    return KF_OK;
}

void rg_free_tensors(kf_tensor *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) kf_tensor_release(&t[i]);
    free(t);
}

/* ---- printing as graph text -------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) need(KF_ERR_NOMEM);
        b->p = np;
        b->cap = nc;
    }
}

/* A float with a '.' or 'e' so gt_parse reads it as a float attribute. */
static void put_float(sbuf *b, double v) {
    char s[40];
    snprintf(s, sizeof s, "%.9g", v);
    put(b, "%s%s", s, strpbrk(s, ".en") ? "" : ".0");
}

static void put_type(sbuf *b, const kf_graph *g, const kf_type *ty) {
    put(b, "%s[", kf_dtype_name(ty->dtype));
    for (int i = 0; i < ty->rank; i++) {
        if (i) put(b, ", ");
        if (ty->dims[i] >= 0) put(b, "%lld", (long long)ty->dims[i]);
        else if (ty->syms[i]) put(b, "%s", g->syms[ty->syms[i]]);
        else put(b, "unk%d", i);
    }
    put(b, "]");
}

static void put_graph(sbuf *b, const kf_model *m, const kf_graph *g, uint32_t nformal, int depth, int *nbodies);

/* A node's line (and, before it, the bodies of its graph attributes as
 * "graph bN" ... "end" blocks, named in the order they are printed). Only
 * the ONNX inputs are printed: parsing the bodies gives the captures back. */
static void put_node(sbuf *b, const kf_model *m, const kf_graph *g, const kf_node *n, int depth, int *nbodies) {
    int names[64];
    for (int a = 0; a < n->nattrs && a < 64; a++) {
        const kf_attr *at = &n->attrs[a];
        names[a] = -1;
        if (at->type != KF_ATTR_GRAPH) continue;
        kf_body bd;
        if (kf_onnx_node_body(n, at->name, m->opsets, m->nopsets, NULL, &bd)) {
            kf_clear_error();
            continue;
        }
        names[a] = (*nbodies)++;
        put(b, "%*sgraph b%d\n", 2 * depth, "", names[a]);
        put_graph(b, m, bd.g, (uint32_t)bd.nin, depth + 1, nbodies);
        put(b, "%*send\n", 2 * depth, "");
        kf_body_release(&bd);
    }
    put(b, "%*s", 2 * depth, "");
    for (int o = 0; o < n->nout; o++) put(b, "%s%s", o ? ", " : "", n->out[o] ? g->values[n->out[o]].name : "_");
    put(b, " = %s(", n->op_type);
    for (int i = 0; i < kf_node_onnx_nin(n); i++) put(b, "%s%s", i ? ", " : "", n->in[i] ? g->values[n->in[i]].name : "");
    put(b, ")");
    for (int a = 0; a < n->nattrs; a++) {
        const kf_attr *at = &n->attrs[a];
        put(b, "%s%s=", a ? ", " : " {", at->name);
        if (at->type == KF_ATTR_INT) put(b, "%lld", (long long)at->i);
        else if (at->type == KF_ATTR_FLOAT) put_float(b, at->f);
        else if (at->type == KF_ATTR_STRING) put(b, "\"%.*s\"", (int)at->s.len, at->s.ptr);
        else if (at->type == KF_ATTR_INTS || at->type == KF_ATTR_FLOATS) {
            put(b, "[");
            for (int j = 0; j < at->n; j++) {
                if (j) put(b, ", ");
                if (at->type == KF_ATTR_INTS) put(b, "%lld", (long long)at->ints[j]);
                else put_float(b, at->floats[j]);
            }
            put(b, "]");
        } else if (at->type == KF_ATTR_GRAPH && a < 64 && names[a] >= 0) put(b, "@b%d", names[a]);
        else put(b, "\"<attribute kind %d>\"", (int)at->type);
    }
    put(b, "%s\n", n->nattrs ? "}" : "");
}

/* Graph g (the model's, or a body whose first nformal inputs are its own;
 * the rest are the outer names it reads, which text leaves implicit). */
static void put_graph(sbuf *b, const kf_model *m, const kf_graph *g, uint32_t nformal, int depth, int *nbodies) {
    int ind = 2 * depth;
    for (kf_id v = 1; v < g->nvalues; v++) {
        const kf_value *x = &g->values[v];
        if (!x->init || (!x->nusers && !x->is_output)) continue;
        kf_type ty;
        kf_type_of_tensor(&ty, x->init);
        put(b, "%*sconst %s ", ind, "", x->name);
        put_type(b, g, &ty);
        put(b, " =");
        for (int64_t i = 0; i < x->init->numel; i++) {
            if (kf_dtype_is_float(x->init->dtype)) put(b, " %.9g", kf_get_f64(x->init, i));
            else put(b, " %lld", (long long)kf_get_i64(x->init, i));
        }
        put(b, "\n");
    }
    for (uint32_t i = 0; i < g->ninputs && i < nformal; i++) {
        const kf_value *x = &g->values[g->inputs[i]];
        put(b, "%*sinput %s ", ind, "", x->name);
        put_type(b, g, &x->type);
        put(b, "\n");
    }
    kf_id *order;
    uint32_t count;
    if (kf_graph_topo(g, &order, &count) == KF_OK) {
        for (uint32_t k = 0; k < count; k++) put_node(b, m, g, &g->nodes[order[k]], depth, nbodies);
        free(order);
    }
    put(b, "%*soutput", ind, "");
    for (uint32_t i = 0; i < g->noutputs; i++) put(b, "%s %s", i ? "," : "", g->values[g->outputs[i]].name);
    put(b, "\n");
}

char *rg_print(const kf_model *m) {
    sbuf b = {0};
    put(&b, "opset %lld\n", (long long)kf_model_opset(m, ""));
    int nbodies = 0;
    put_graph(&b, m, m->graph, UINT32_MAX, 0, &nbodies);
    return b.p;
}

/* ---- the differential check ---------------------------------------------------- */

kf_status rg_copy(const kf_model *m, kf_model **out) {
    void *buf;
    size_t len;
    KF_TRY(kf_model_save_memory(m, &buf, &len));
    kf_status st = kf_model_load_memory(buf, len, NULL, out);
    free(buf);
    return st;
}

typedef struct family {
    char name[32];
    char *list; /* comma-separated names for kf_opt_options.disable */
} family;
static family fams[24];
static int nfams = -1;

static void fam_add(const char *name, const char *rule) {
    int i = 0;
    while (i < nfams && strcmp(fams[i].name, name)) i++;
    if (i == nfams) {
        if (nfams >= (int)(sizeof fams / sizeof *fams)) return;
        snprintf(fams[i].name, sizeof fams[i].name, "%s", name);
        fams[i].list = NULL;
        nfams++;
    }
    size_t old = fams[i].list ? strlen(fams[i].list) : 0;
    char *p = realloc(fams[i].list, old + strlen(rule) + 2);
    if (!p) need(KF_ERR_NOMEM);
    if (old) p[old++] = ',';
    strcpy(p + old, rule);
    fams[i].list = p;
}

static void fam_rules(const char *name, kf_status (*add)(kf_ruleset *)) {
    kf_ruleset rs = {0};
    need(add(&rs));
    for (uint32_t i = 0; i < rs.n; i++) fam_add(name, rs.rules[i]->name);
    kf_rules_free(&rs);
}

static void fam_init(void) {
    if (nfams >= 0) return;
    nfams = 0;
    kf_ruleset rs = {0};
    need(kf_rules_add_builtin(&rs));
    for (uint32_t i = 0; i < rs.n; i++) {
        const char *f = rs.rules[i]->file ? rs.rules[i]->file : "builtin";
        const char *slash = strrchr(f, '/');
        char base[32];
        snprintf(base, sizeof base, "%s", slash ? slash + 1 : f);
        char *dot = strchr(base, '.');
        if (dot) *dot = 0;
        fam_add(base, rs.rules[i]->name);
    }
    kf_rules_free(&rs);
#define KF_RULE_PASS(name) fam_rules(#name, kf_pass_##name##_rules);
#define KF_GRAPH_PASS(name) fam_add(#name, #name);
#include "passes.def"
#undef KF_RULE_PASS
#undef KF_GRAPH_PASS
}

int rg_family_count(void) {
    fam_init();
    return nfams;
}
const char *rg_family_name(int i) {
    fam_init();
    return i >= 0 && i < nfams ? fams[i].name : "?";
}

/* Compares outputs; fills why on the first difference. */
static bool same_outputs(const kf_tensor *got, uint32_t ngot, const kf_tensor *want, uint32_t nwant, char *why,
                         size_t whylen) {
    if (ngot != nwant) {
        snprintf(why, whylen, "%u outputs, want %u", ngot, nwant);
        return false;
    }
    for (uint32_t i = 0; i < nwant; i++) {
        char w[400];
        if (!kf_run_close(&got[i], &want[i], w, sizeof w)) {
            snprintf(why, whylen, "output %u: %s", i, w);
            return false;
        }
    }
    return true;
}

static void release_all(kf_tensor *t, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) kf_tensor_release(&t[i]);
}

/* Rewrites per rule over every default-options opt run of this process. */
#define MAX_TALLY 128
static struct {
    char name[48];
    uint64_t hits, graphs;
} tallies[MAX_TALLY];
static int ntallies;

static void tally(const char *name, uint64_t hits) {
    int i = 0;
    while (i < ntallies && strcmp(tallies[i].name, name)) i++;
    if (i == ntallies) {
        if (ntallies == MAX_TALLY) return;
        snprintf(tallies[ntallies++].name, sizeof tallies[i].name, "%s", name);
    }
    tallies[i].hits += hits;
    tallies[i].graphs += hits > 0;
}

void rg_write_rule_hits(FILE *f) {
    fprintf(f, "rule hits (rewrites / graphs where it fired):");
    for (int i = 0; i < ntallies; i++)
        fprintf(f, "%s %s %llu/%llu", i ? "," : "", tallies[i].name, (unsigned long long)tallies[i].hits,
                (unsigned long long)tallies[i].graphs);
    fprintf(f, "\n");
}

/* Optimizes c in place with `disable` (NULL: every rule and pass); every_node:
 * the rules try every node every sweep (kf_opt_options.every_node), and
 * every weight merge is deferred to the save (defer_concat_bytes); else each
 * incremental shape inference is checked against a whole one. */
static kf_status do_opt(kf_model *c, const char *disable, const char *patterns, bool every_node) {
    kf_opt_options o;
    kf_opt_options_default(&o);
    o.every_node = every_node;
    o.check_inference = !every_node;
    o.defer_concat_bytes = every_node ? 1 : 0;
    o.fuel = -1;
    o.trace = false;
    o.disable = disable;
    o.pattern_files = &patterns;
    o.npattern_files = patterns ? 1 : 0;
    kf_opt_result res;
    kf_status st = kf_optimize(c, &o, &res);
    for (uint32_t i = 0; !st && !disable && !every_node && i < res.rules.n; i++)
        tally(res.rules.rules[i]->name, res.rules.rules[i]->hits);
    kf_rules_free(&res.rules);
    return st;
}

/* Plans c and writes the groups as ai.kfuse functions, then copies the
 * result through ONNX (the functions must survive export). */
static kf_status do_fuse(kf_model *c, kf_model **out) {
    kf_plan_options po;
    kf_plan_options_default(&po);
    po.disable = false;
    po.fuel = -1;
    po.trace = false;
    kf_plan *built, *p;
    KF_TRY(kf_plan_build(c, &po, &built));
    kf_status st = kf_fuse_plan_copy(c, built, &p);
    kf_plan_free(built);
    if (st) return st;
    kf_fuse_stats fs;
    st = kf_fuse_apply(c, p, &fs);
    kf_fuse_simple_plan_free(p);
    if (!st) st = rg_copy(c, out);
    return st;
}

typedef struct ctx {
    const kf_model *m;
    const char *patterns;
    const kf_tensor *ins;
    int nins;
    kf_tensor *want;
    uint32_t nwant;
    char *path, *why;
    size_t pathlen, whylen;
} ctx;

static bool failed(ctx *x, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool failed(ctx *x, const char *path, const char *fmt, ...) {
    snprintf(x->path, x->pathlen, "%s", path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->why, x->whylen, fmt, ap);
    va_end(ap);
    /* KF_RANDGRAPH_SAVE=FILE: the failing graph as ONNX, for `kfuse run` */
    const char *save = getenv("KF_RANDGRAPH_SAVE");
    if (save && *save && kf_model_save(x->m, save)) {
        fprintf(stderr, "kfuse_randgraph: could not save the graph to %s: %s\n", save, kf_last_error());
        kf_clear_error();
    }
    return false;
}

/* Evaluates c and compares with the reference outputs. */
static bool eval_cmp(ctx *x, const kf_model *c, const char *path) {
    uint32_t n = c->graph->noutputs;
    kf_tensor *got = calloc(n + 1, sizeof(kf_tensor));
    if (!got) need(KF_ERR_NOMEM);
    kf_status st = kf_eval_model(c, x->ins, x->nins, got, NULL);
    bool ok;
    if (st) {
        ok = failed(x, path, "evaluation: %s: %s", kf_status_name(st), kf_last_error());
    } else {
        char w[512];
        ok = same_outputs(got, n, x->want, x->nwant, w, sizeof w) || failed(x, path, "%s", w);
        release_all(got, n);
    }
    free(got);
    return ok;
}

const char *rg_file_save_differs(const kf_model *d, const kf_model *m) {
    char file[] = "/tmp/kf_randgraph_saveXXXXXX";
    int fd = mkstemp(file);
    if (fd < 0) return "cannot make a temporary file";
    close(fd);
    const char *why = NULL;
    void *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    if (kf_model_save(d, file) || kf_model_save_memory(m, &a, &la)) why = "cannot save the optimized models";
    FILE *f = why ? NULL : fopen(file, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        lb = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        if (!(b = malloc(lb + 1)) || fread(b, 1, lb, f) != lb) why = "cannot read the saved model back";
        fclose(f);
    }
    if (!why && (la != lb || memcmp(a, b, la)))
        why = "the model with merges deferred, saved to a file, differs from the one merging at once";
    remove(file);
    free(a);
    free(b);
    return why;
}

/* opt with `disable`, compare; then fuse, compare. */
static bool opt_and_fuse(ctx *x, const char *disable, const char *optpath, const char *fusepath, bool fuse,
                         rg_stats *s, bool family) {
    kf_model *c;
    kf_status st = rg_copy(x->m, &c);
    if (st) return failed(x, optpath, "copy: %s", kf_last_error());
    bool ok = true;
    if ((st = do_opt(c, disable, x->patterns, false))) ok = failed(x, optpath, "kf_optimize: %s: %s", kf_status_name(st), kf_last_error());
    if (ok) ok = eval_cmp(x, c, optpath);
    if (ok && !family) { /* retrying only where edits reached must give the graph of trying everywhere */
        kf_model *e = NULL;
        if ((st = rg_copy(x->m, &e))) {
            ok = failed(x, optpath, "copy: %s", kf_last_error());
        } else if ((st = do_opt(e, disable, x->patterns, true))) {
            ok = failed(x, optpath, "kf_optimize trying every node: %s: %s", kf_status_name(st), kf_last_error());
        } else {
            char *a = rg_print(c), *b = rg_print(e);
            if (!a || !b) ok = failed(x, optpath, "out of memory");
            else if (strcmp(a, b)) ok = failed(x, optpath, "trying every node every sweep (merges deferred) gives a different graph:\n%s\nagainst\n%s", b, a);
            free(a);
            free(b);
            const char *why = ok ? rg_file_save_differs(e, c) : NULL;
            if (why) ok = failed(x, optpath, "%s", why);
        }
        if (e) kf_model_free(e);
    }
    if (ok && s) (family ? s->family++ : s->opt++);
    if (ok && fuse) {
        kf_model *f = NULL;
        if ((st = do_fuse(c, &f))) ok = failed(x, fusepath, "plan/fuse: %s: %s", kf_status_name(st), kf_last_error());
        if (ok) ok = eval_cmp(x, f, fusepath);
        if (ok && s && !family) s->fuse++;
        if (f) kf_model_free(f);
    }
    kf_model_free(c);
    return ok;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* got (n outputs) against x->want at precision p's whole-model tolerance
 * (kf_run_close_model, depths of the original graph); *out_of_range when
 * got is not finite where want is (a value past the low type's range). */
static bool close_low(ctx *x, const kf_tensor *got, uint32_t n, kf_precision p, const uint32_t *depth,
                      bool *out_of_range, char *why, size_t whylen) {
    *out_of_range = false;
    if (n != x->nwant) {
        snprintf(why, whylen, "%u outputs, want %u", n, x->nwant);
        return false;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (kf_dtype_is_float(got[i].dtype) && got[i].dtype == x->want[i].dtype && got[i].numel == x->want[i].numel)
            for (int64_t k = 0; k < got[i].numel; k++)
                if (!isfinite(kf_get_f64(&got[i], k))) *out_of_range = true;
        char w[400];
        if (!*out_of_range && !kf_run_close_model(&got[i], &x->want[i], p, depth[i], w, sizeof w)) {
            snprintf(why, whylen, "output %u: %s", i, w);
            return false;
        }
    }
    return true;
}

/* Whether ref on the original graph stays within p's tolerance of
 * x->want when its float inputs and constants move by about one rounding
 * to the low type (rounded to it; scaled by 1 + 2u): when it does not, an output
 * depends on its inputs discontinuously there (Floor, a Cast to an
 * integer, a comparison near a tie) or through a cancellation, and no
 * low-precision run can be expected to match. Such graphs are counted
 * and skipped, not failed. */
static void perturb(kf_tensor *t, kf_precision p, int trial) {
    if (t->dtype != KF_DT_FLOAT) return;
    for (int64_t k = 0; k < t->numel; k++) {
        float v = ((float *)t->data)[k];
        if (trial == 1) v *= p == KF_PRECISION_BF16 ? 1 + 2 * 0x1p-8f : 1 + 2 * 0x1p-11f;
        else v = p == KF_PRECISION_BF16 ? kf_bf16_to_float(kf_float_to_bf16(v)) : kf_half_to_float(kf_float_to_half(v));
        ((float *)t->data)[k] = v;
    }
}

/* Trial 2 of well_conditioned: every float32 value a node computes rounded
 * to the low type as it is made (the 16-bit graph's storage, without its
 * casts), through the evaluator's per-node hook; the outputs' data is the
 * evaluator's own, rounded in place. */
static void round_outputs(void *user, const kf_graph *g, kf_id node, const kf_tensor *outs) {
    kf_precision p = *(const kf_precision *)user;
    for (int j = 0; j < g->nodes[node].nout; j++) {
        if (!g->nodes[node].out[j] || outs[j].dtype != KF_DT_FLOAT || !outs[j].data) continue;
        float *f = outs[j].data;
        for (int64_t k = 0; k < outs[j].numel; k++)
            f[k] = p == KF_PRECISION_BF16 ? kf_bf16_to_float(kf_float_to_bf16(f[k])) : kf_half_to_float(kf_float_to_half(f[k]));
    }
}

/* Trials 0 and 1 move inputs and constants by a rounding; trial 2 rounds
 * every intermediate value (a LayerNorm over a difference of near-equal
 * values loses its digits there, not in the inputs: seed 18046242806);
 * trial 3 does both, as a 16-bit run does: each alone may stay inside the
 * tolerance while together they do not (a LayerNorm over two elements of
 * a MaxPool, whose gain near equal elements is 1/sqrt(eps): seed
 * 47983104868). */
static bool well_conditioned(ctx *x, kf_precision p, const uint32_t *depth) {
    bool ok = true;
    for (int trial = 0; ok && trial < 4; trial++) {
        kf_model *c = NULL;
        kf_tensor *in = calloc((size_t)x->nins + 1, sizeof(kf_tensor)), *out = calloc(x->nwant + 1, sizeof(kf_tensor));
        if (!in || !out) need(KF_ERR_NOMEM);
        need(rg_copy(x->m, &c));
        bool move = trial != 2, round_all = trial >= 2;
        int how = trial == 3 ? 0 : trial; /* trial 3 rounds the inputs as trial 0 does */
        for (kf_id v = 1; move && v < c->graph->nvalues; v++)
            if (c->graph->values[v].init) perturb(c->graph->values[v].init, p, how);
        for (int i = 0; i < x->nins; i++) {
            need(kf_tensor_alloc(&in[i], x->ins[i].dtype, x->ins[i].rank, x->ins[i].dims));
            memcpy(in[i].data, x->ins[i].data, (size_t)in[i].numel * kf_dtype_size(in[i].dtype));
            if (move) perturb(&in[i], p, how);
        }
        bool skip = false;
        char w[256];
        kf_eval_opts eo = {round_outputs, &p};
        ok = kf_eval_model(c, in, x->nins, out, round_all ? &eo : NULL) == KF_OK &&
             close_low(x, out, x->nwant, p, depth, &skip, w, sizeof w) && !skip;
        kf_clear_error();
        release_all(out, x->nwant);
        release_all(in, (uint32_t)x->nins);
        free(in);
        free(out);
        kf_model_free(c);
    }
    return ok;
}

/* RG_P_PREC: the graph through kf_fuse_precision, run on ref (and on
 * OpenCL with RG_P_CL), against ref on the original. */
static bool precision_paths(ctx *x, const rg_check_opts *o, rg_stats *st) {
    kf_precision p = o->low == KF_DT_BFLOAT16 ? KF_PRECISION_BF16 : KF_PRECISION_FP16;
    kf_model *c = NULL;
    bool ok = true, skip = false;
    uint32_t *depth = calloc(x->nwant + 1, sizeof(uint32_t));
    kf_tensor *got = calloc(x->nwant + 1, sizeof(kf_tensor));
    if (!depth || !got) need(KF_ERR_NOMEM);
    kf_status s = kf_run_output_depths(x->m, depth);
    if (!s) s = rg_copy(x->m, &c);
    if (!s) s = kf_fuse_precision(c, p == KF_PRECISION_BF16 ? KF_DT_BFLOAT16 : KF_DT_FLOAT16, NULL);
    if (!s) s = kf_eval_model(c, x->ins, x->nins, got, NULL);
    char w[512];
    if (s) ok = failed(x, "prec", "%s: %s", kf_status_name(s), kf_last_error());
    else if (!close_low(x, got, c->graph->noutputs, p, depth, &skip, w, sizeof w) && well_conditioned(x, p, depth))
        ok = failed(x, "prec", "%s", w);
    else if (!skip && !well_conditioned(x, p, depth))
        skip = true;
    if (c) release_all(got, c->graph->noutputs);
    if (ok && st) *(skip ? &st->prec_skipped : &st->prec) += 1;
    if (ok && !skip && (o->paths & RG_P_CL) && !kf_cl_unavailable()) {
        /* the converted graph is an ordinary 16-bit graph: optimized, planned
         * and generated again by kf_run_opencl */
        s = kf_run_opencl(c, x->ins, x->nins, got, NULL, NULL);
        if (s) ok = failed(x, "prec-opencl", "%s: %s", kf_status_name(s), kf_last_error());
        else if (!close_low(x, got, c->graph->noutputs, p, depth, &skip, w, sizeof w))
            ok = failed(x, "prec-opencl", "%s", w);
        else if (st && !skip)
            st->prec_cl++;
        release_all(got, c->graph->noutputs);
    }
    free(got);
    free(depth);
    if (c) kf_model_free(c);
    return ok;
}

/* RG_P_INT8: a graph whose QDQ products pass_qint takes: its int8 form
 * (optimized as an int8 plan is, then kf_fuse_int8) on ref against ref on
 * the original at the whole-model fp32 bound (the integer form rounds once
 * where the float one rounds per product), and with RG_P_CL an int8 plan
 * on OpenCL against ref on that form (integers exact). */
static bool int8_paths(ctx *x, const rg_check_opts *o, rg_stats *st) {
    kf_model *c = NULL;
    bool ok = true;
    uint32_t *depth = calloc(x->nwant + 1, sizeof(uint32_t));
    kf_tensor *got = calloc(x->nwant + 1, sizeof(kf_tensor)), *want8 = calloc(x->nwant + 1, sizeof(kf_tensor));
    if (!depth || !got || !want8) need(KF_ERR_NOMEM);
    kf_int8_stats is = {0};
    kf_status s = kf_run_output_depths(x->m, depth);
    if (!s) s = rg_copy(x->m, &c);
    if (!s) {
        kf_opt_options oo;
        kf_opt_options_default(&oo);
        oo.keep_quantized = true;
        kf_opt_result res;
        memset(&res, 0, sizeof res);
        s = kf_optimize(c, &oo, &res);
        kf_rules_free(&res.rules);
    }
    if (!s) s = kf_fuse_int8(c, &is);
    if (!s && is.anchors) s = kf_eval_model(c, x->ins, x->nins, want8, NULL);
    char w[512];
    if (s) ok = failed(x, "int8", "%s: %s", kf_status_name(s), kf_last_error());
    for (uint32_t i = 0; ok && is.anchors && i < x->nwant; i++)
        if (!kf_run_close_model(&want8[i], &x->want[i], KF_PRECISION_FP32, depth[i], w, sizeof w))
            ok = failed(x, "int8", "output %u: %s", i, w);
    if (ok && is.anchors && st) st->int8++;
    if (ok && is.anchors && (o->paths & RG_P_CL) && !kf_cl_unavailable()) {
        kf_model *c2 = NULL;
        s = rg_copy(x->m, &c2);
        if (!s) s = kf_run_backend(c2, KF_EXEC_OPENCL, KF_PRECISION_INT8, x->ins, x->nins, got, NULL, NULL);
        if (s) ok = failed(x, "int8-opencl", "%s: %s", kf_status_name(s), kf_last_error());
        for (uint32_t i = 0; ok && i < x->nwant; i++)
            if (!kf_run_close_model(&got[i], &want8[i], KF_PRECISION_FP32, depth[i], w, sizeof w))
                ok = failed(x, "int8-opencl", "output %u: %s", i, w);
        if (!s) release_all(got, x->nwant);
        if (ok && st) st->int8_cl++;
        if (c2) kf_model_free(c2);
    }
    /* INT8_FP16 (o->low float16): the same integer products, the rest in
     * float16, against ref on the original at the float16 bound, where that
     * bound can hold (well_conditioned; values past float16's range skip) */
    if (ok && is.anchors && (o->paths & RG_P_CL) && o->low == KF_DT_FLOAT16 && !kf_cl_unavailable() &&
        well_conditioned(x, KF_PRECISION_FP16, depth)) {
        kf_model *c3 = NULL;
        bool skip = false;
        s = rg_copy(x->m, &c3);
        if (!s) s = kf_run_backend(c3, KF_EXEC_OPENCL, KF_PRECISION_INT8_FP16, x->ins, x->nins, got, NULL, NULL);
        if (s) ok = failed(x, "int8-fp16-opencl", "%s: %s", kf_status_name(s), kf_last_error());
        else if (!close_low(x, got, x->nwant, KF_PRECISION_FP16, depth, &skip, w, sizeof w))
            ok = failed(x, "int8-fp16-opencl", "%s", w);
        else if (st && !skip)
            st->int8_fp16_cl++;
        if (!s) release_all(got, x->nwant);
        if (c3) kf_model_free(c3);
    }
    if (is.anchors) release_all(want8, x->nwant);
    free(want8);
    free(got);
    free(depth);
    if (c) kf_model_free(c);
    return ok;
}

/* FP8 (RG_P_INT8 | RG_P_CL, o->low float16): a graph that dequantizes
 * E4M3FN or E5M2 values, as an fp8 plan on OpenCL with the library
 * call's host model in place of cuBLASLt (KFUSE_LIBANCHOR_HOST), against
 * ref on the original at the float16 bound where it can hold. */
static bool fp8_path(ctx *x, const rg_check_opts *o, rg_stats *st) {
    if (!(o->paths & RG_P_CL) || o->low != KF_DT_FLOAT16 || kf_cl_unavailable()) return true;
    const kf_graph *g = x->m->graph;
    bool f8 = false;
    for (kf_id id = 1; id < g->nnodes && !f8; id++) {
        const kf_node *n = &g->nodes[id];
        kf_dtype q = n->nin && n->in[0] ? g->values[n->in[0]].type.dtype : KF_DT_UNDEFINED;
        f8 = !n->dead && n->op == KF_OP_DEQUANTIZE_LINEAR && (q == KF_DT_FLOAT8E4M3FN || q == KF_DT_FLOAT8E5M2);
    }
    if (!f8) return true;
    uint32_t *depth = calloc(x->nwant + 1, sizeof(uint32_t));
    kf_tensor *got = calloc(x->nwant + 1, sizeof(kf_tensor));
    if (!depth || !got) need(KF_ERR_NOMEM);
    bool ok = true, skip = false;
    kf_model *c = NULL;
    kf_status s = kf_run_output_depths(x->m, depth);
    if (!s && well_conditioned(x, KF_PRECISION_FP16, depth)) {
        const char *had = getenv("KFUSE_LIBANCHOR_HOST");
        setenv("KFUSE_LIBANCHOR_HOST", "1", 1);
        kf_run_summary sum = {0};
        s = rg_copy(x->m, &c);
        if (!s) /* KF_RANDGRAPH_TRACE=1: where each group ran */
            s = kf_run_backend(c, KF_EXEC_OPENCL, KF_PRECISION_FP8, x->ins, x->nins, got,
                               getenv("KF_RANDGRAPH_TRACE") ? stderr : NULL, &sum);
        if (!had) unsetenv("KFUSE_LIBANCHOR_HOST");
        char w[512];
        if (s) ok = failed(x, "fp8-opencl", "%s: %s", kf_status_name(s), kf_last_error());
        else if (!close_low(x, got, x->nwant, KF_PRECISION_FP16, depth, &skip, w, sizeof w))
            ok = failed(x, "fp8-opencl", "%s", w);
        else if (st && !skip)
            st->fp8_cl++;
        if (!s) release_all(got, x->nwant);
    } else if (s) {
        ok = failed(x, "fp8-opencl", "%s: %s", kf_status_name(s), kf_last_error());
    }
    free(got);
    free(depth);
    if (c) kf_model_free(c);
    return ok;
}

bool rg_check(const kf_model *m, const kf_tensor *ins, int nins, const rg_check_opts *o, char *path,
              size_t pathlen, char *why, size_t whylen, rg_stats *st) {
    fam_init();
    double t0 = now_s();
    ctx x = {m, o->patterns, ins, nins, NULL, m->graph->noutputs, path, why, pathlen, whylen};
    path[0] = why[0] = 0;
    x.want = calloc(x.nwant + 1, sizeof(kf_tensor));
    if (!x.want) need(KF_ERR_NOMEM);
    bool ok = true;
    kf_status s = kf_eval_model(m, ins, nins, x.want, NULL);
    if (s) {
        ok = failed(&x, "ref", "%s: %s", kf_status_name(s), kf_last_error());
    } else {
        /* the graphs are built to stay finite: a NaN or Inf is a generator bug
         * (or an evaluator one) */
        for (uint32_t i = 0; ok && i < x.nwant; i++)
            for (int64_t k = 0; ok && kf_dtype_is_float(x.want[i].dtype) && k < x.want[i].numel; k++)
                if (!isfinite(kf_get_f64(&x.want[i], k)))
                    ok = failed(&x, "ref", "output %u element %lld is %g", i, (long long)k, kf_get_f64(&x.want[i], k));
    }
    if (ok && st) st->ref++;
    if (ok && (o->paths & (RG_P_OPT | RG_P_FUSE)))
        ok = opt_and_fuse(&x, NULL, "opt", "fuse", (o->paths & RG_P_FUSE) != 0, st, false);
    if (ok && (o->paths & RG_P_CL)) {
        const char *why_cl = kf_cl_unavailable();
        if (why_cl) {
            if (st) st->cl_skipped++;
        } else {
            kf_model *c = NULL;
            kf_status cs = rg_copy(m, &c);
            kf_tensor *got = calloc(x.nwant + 1, sizeof(kf_tensor));
            if (!got) need(KF_ERR_NOMEM);
            kf_run_summary sum = {0};
            /* RG_P_LIB: the anchors the library would run go through the
             * host model of the call (its bias, activation and residual) */
            bool lib = (o->paths & RG_P_LIB) != 0;
            const char *cl_path = lib ? "opencl-lib" : "opencl", *had = getenv("KFUSE_LIBANCHOR_HOST");
            if (lib) setenv("KFUSE_LIBANCHOR_HOST", "1", 1);
            /* KF_RANDGRAPH_TRACE=1: where each group ran and why */
            if (!cs) cs = kf_run_opencl(c, ins, nins, got, getenv("KF_RANDGRAPH_TRACE") ? stderr : NULL, &sum);
            if (lib && !had) unsetenv("KFUSE_LIBANCHOR_HOST");
            if (!cs && st) st->cl_groups_cl += sum.groups_cl, st->cl_groups_ref += sum.groups_ref;
            if (cs) {
                ok = failed(&x, cl_path, "%s: %s", kf_status_name(cs), kf_last_error());
            } else {
                char w[512];
                ok = same_outputs(got, c->graph->noutputs, x.want, x.nwant, w, sizeof w) || failed(&x, cl_path, "%s", w);
                release_all(got, c->graph->noutputs);
                if (ok && st) st->cl++;
                if (ok && st && lib) st->cl_lib++, st->cl_groups_lib += sum.groups_lib;
            }
            free(got);
            if (c) kf_model_free(c);
        }
    }
    if (ok && (o->paths & RG_P_PREC)) ok = precision_paths(&x, o, st);
    if (ok && (o->paths & RG_P_INT8)) ok = int8_paths(&x, o, st);
    if (ok && (o->paths & RG_P_INT8)) ok = fp8_path(&x, o, st);
    if (ok && (o->paths & RG_P_FAMILY)) {
        for (int f = 0; ok && f < nfams; f++) {
            if (o->family >= 0 && f != o->family) continue;
            char op[64], fp[64];
            snprintf(op, sizeof op, "opt-no-%s", fams[f].name);
            snprintf(fp, sizeof fp, "fuse-no-%s", fams[f].name);
            ok = opt_and_fuse(&x, fams[f].list, op, fp, true, st, true);
        }
    }
    release_all(x.want, x.nwant);
    free(x.want);
    if (st) {
        double dt = now_s() - t0;
        st->graphs++;
        st->nodes += kf_graph_live_nodes(m->graph);
        if (!ok) st->fail++;
        if (dt > st->slowest_s) st->slowest_s = dt;
    }
    return ok;
}

/* ---- shrinking ----------------------------------------------------------------- */

/* Does c still fail on `path` (same path, any message)? */
static bool still_fails(const kf_model *c, uint64_t in_seed, const rg_check_opts *o, const char *path) {
    kf_tensor *ins;
    int nins;
    if (rg_inputs(c, in_seed, &ins, &nins)) return false;
    char p[64], w[1024];
    bool ok = rg_check(c, ins, nins, o, p, sizeof p, w, sizeof w, NULL);
    rg_free_tensors(ins, nins);
    return !ok && !strcmp(p, path);
}

/* still_fails with inputs from *seed, or else from one of a few other
 * seeds (a cut node's output becomes an input of fresh random values, which
 * may miss the values that failed: a Relu -> Abs bug needs a negative one);
 * *seed becomes the seed that failed. */
static bool still_fails_some(const kf_model *c, uint64_t *seed, const rg_check_opts *o, const char *path) {
    for (uint64_t k = 0; k < 4; k++) {
        uint64_t s = *seed + k * 0x9e3779b97f4a7c15ULL;
        if (still_fails(c, s, o, path)) {
            *seed = s;
            return true;
        }
    }
    return false;
}

/* Drops graph inputs nobody reads. */
static void prune_inputs(kf_graph *g) {
    uint32_t k = 0;
    for (uint32_t i = 0; i < g->ninputs; i++) {
        kf_value *v = &g->values[g->inputs[i]];
        if (v->nusers || v->is_output) g->inputs[k++] = g->inputs[i];
        else v->is_input = false;
    }
    g->ninputs = k;
}

/* Cuts the i-th live node of c: its outputs become graph inputs. False when
 * that cannot be done (an output is a graph output or has no known type). */
static bool cut_node(kf_model *c, uint32_t i, int alt) {
    kf_graph *g = c->graph;
    kf_id nid = 0;
    for (kf_id k = 1, live = 0; k < g->nnodes; k++)
        if (!g->nodes[k].dead && live++ == i) nid = k;
    if (!nid) return false;
    kf_node *n = &g->nodes[nid];
    bool writes_output = false, read = false;
    for (int o = 0; o < n->nout; o++)
        if (n->out[o]) writes_output |= g->values[n->out[o]].is_output, read |= g->values[n->out[o]].nusers > 0;
    if (writes_output) {
        /* the end of a chain (a Split's included): its alt-th non-constant
         * input becomes the graph output instead of its outputs */
        kf_id in = 0;
        for (int i = 0; i < n->nin && !in; i++)
            if (n->in[i] && !g->values[n->in[i]].init && alt-- == 0) in = n->in[i];
        if (!in || read) return false;
        kf_id outs[8];
        int nout = n->nout < 8 ? n->nout : 8;
        memcpy(outs, n->out, sizeof(kf_id) * (size_t)nout);
        kf_graph_remove_node(g, nid);
        uint32_t k = 0;
        bool listed = g->values[in].is_output;
        for (uint32_t i = 0; i < g->noutputs; i++) {
            bool mine = false;
            for (int o = 0; o < nout; o++) mine |= outs[o] && g->outputs[i] == outs[o];
            if (!mine) g->outputs[k++] = g->outputs[i];
            else if (!listed) g->outputs[k++] = in, listed = true;
        }
        g->noutputs = k;
        for (int o = 0; o < nout; o++)
            if (outs[o]) g->values[outs[o]].is_output = false;
        g->values[in].is_output = true;
        return true;
    }
    if (alt) return false;
    for (int o = 0; o < n->nout; o++) {
        if (!n->out[o]) continue;
        kf_value *v = &g->values[n->out[o]];
        if (v->is_output || v->type.rank < 0 || !v->type.dtype) return false;
    }
    kf_id outs[8];
    int nout = n->nout < 8 ? n->nout : 8;
    memcpy(outs, n->out, sizeof(kf_id) * (size_t)nout);
    kf_graph_remove_node(g, nid);
    for (int o = 0; o < nout; o++)
        if (outs[o] && g->values[outs[o]].nusers) {
            g->values[outs[o]].has_type = true;
            need(kf_graph_mark_input(g, outs[o]));
        }
    return true;
}

static kf_model *settle(kf_model *c) {
    need(kf_graph_dce(c->graph, NULL));
    prune_inputs(c->graph);
    kf_model *r;
    if (rg_copy(c, &r)) r = NULL;
    kf_model_free(c);
    if (r && kf_infer_shapes(r)) {
        kf_model_free(r);
        r = NULL;
    }
    return r;
}

kf_model *rg_shrink(const kf_model *m, uint64_t *in_seed_p, const rg_check_opts *o, const char *path) {
    kf_model *cur;
    uint64_t in_seed = *in_seed_p;
    if (rg_copy(m, &cur)) return NULL;
    if (kf_infer_shapes(cur) || !still_fails(cur, in_seed, o, path)) {
        kf_model_free(cur);
        return NULL;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t i = cur->graph->noutputs; i-- > 0 && cur->graph->noutputs > 1;) {
            kf_model *c;
            if (rg_copy(cur, &c)) continue;
            kf_graph *g = c->graph;
            g->values[g->outputs[i]].is_output = false;
            memmove(g->outputs + i, g->outputs + i + 1, sizeof(kf_id) * (g->noutputs - i - 1));
            g->noutputs--;
            if ((c = settle(c)) && still_fails_some(c, &in_seed, o, path)) {
                kf_model_free(cur);
                cur = c;
                changed = true;
            } else if (c) {
                kf_model_free(c);
            }
        }
        /* alt: which non-constant input replaces a node that writes a graph output */
        for (uint32_t i = kf_graph_live_nodes(cur->graph); i-- > 0;) {
            for (int alt = 0; alt < 4; alt++) {
                kf_model *c;
                if (rg_copy(cur, &c)) continue;
                if (kf_infer_shapes(c) || !cut_node(c, i, alt)) {
                    kf_model_free(c);
                    break;
                }
                if ((c = settle(c)) && still_fails_some(c, &in_seed, o, path)) {
                    kf_model_free(cur);
                    cur = c;
                    changed = true;
                    break;
                }
                if (c) kf_model_free(c);
            }
        }
    }
    *in_seed_p = in_seed;
    return cur;
}
