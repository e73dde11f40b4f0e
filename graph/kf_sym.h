/*
 * kf_sym.h: symbolic dims as small expressions, and the symbolic contents
 * of shape tensors.
 *
 * A graph's symbols (kf_graph.syms) are names the file gave (`batch`) or
 * expressions over them that inference derived (`batch*seq`, `2*seq+1`,
 * `floor(seq/2)`). Expressions are kept canonical, as polynomials with
 * integer coefficients over atoms (names and floor quotients), and interned:
 * two dims are equal exactly when their symbol ids are, so `a*b` and `b*a`
 * are one symbol. An expression that reduces to a constant is a constant.
 *
 * A kf_sdim is one dim or one element of a shape tensor: a constant, a
 * symbol, or unknown. A kf_symvec is what shape inference knows of the
 * contents of a small integer tensor (Shape's output and what Gather,
 * Concat, Slice, arithmetic... make of it), kept on the value
 * (kf_value.symval) so Reshape, Expand, ConstantOfShape and Tile outputs
 * keep their symbolic dims, and the fold pass can turn a shape computation
 * into a constant target.
 */
#ifndef KF_SYM_H
#define KF_SYM_H

#include "kf_ir.h"

/* sym of a kf_sdim whose value nothing says */
#define KF_SYM_UNKNOWN UINT32_MAX

typedef struct kf_sdim {
    int64_t v;    /* the value when sym == 0 */
    uint32_t sym; /* 0: constant v; KF_SYM_UNKNOWN: unknown; else a symbol */
} kf_sdim;

static inline kf_sdim kf_sdim_const(int64_t v) { return (kf_sdim){v, 0}; }
static inline kf_sdim kf_sdim_unknown(void) { return (kf_sdim){-1, KF_SYM_UNKNOWN}; }
static inline bool kf_sdim_known(kf_sdim d) { return d.sym != KF_SYM_UNKNOWN; }
static inline bool kf_sdim_eq(kf_sdim a, kf_sdim b) {
    return kf_sdim_known(a) && a.sym == b.sym && (a.sym || a.v == b.v);
}

/* Dim d of a type as a kf_sdim (a known dim, its symbol, or unknown). */
kf_sdim kf_type_sdim(const kf_type *t, int d);
/* Stores s as dim d of t (a negative constant or a non-symbol: unknown). */
void kf_type_set_sdim(kf_type *t, int d, kf_sdim s);

/* Arithmetic on dims. Unknown in, unknown out; so is a result the
 * canonical form cannot hold (more than a few terms or factors, overflow).
 * kf_sdim_div is the quotient of dims (non-negative numbers): exact when
 * the divisor divides every term, else floor(a / c) for a constant c > 0;
 * a symbolic divisor that does not divide exactly gives unknown. Out of
 * memory gives unknown too and marks the graph (kf_sym_take_nomem). */
kf_sdim kf_sdim_add(kf_graph *g, kf_sdim a, kf_sdim b);
kf_sdim kf_sdim_sub(kf_graph *g, kf_sdim a, kf_sdim b);
kf_sdim kf_sdim_mul(kf_graph *g, kf_sdim a, kf_sdim b);
kf_sdim kf_sdim_div(kf_graph *g, kf_sdim a, kf_sdim b);

/* Whether two types hold as many elements, whatever the symbols stand
 * for: 1 yes, 0 not provably ([N, S] against [N*S] is 1, [N] against [S]
 * 0), -1 when a rank or dim is unknown or the product does not fit the
 * canonical form. Interns nothing. */
int kf_type_numel_cmp(const kf_graph *g, const kf_type *a, const kf_type *b);

/* True when d >= 0 whatever its names stand for (names are dims, so
 * >= 0): a constant >= 0, or an expression with no negative coefficient. */
bool kf_sdim_nonneg(const kf_graph *g, kf_sdim d);

/* KF_ERR_NOMEM (with the message set) when arithmetic on g's dims ran out
 * of memory since the last call, else KF_OK; clears the mark. */
kf_status kf_sym_take_nomem(kf_graph *g);

/* The expression's text (a name for a plain symbol), as written to
 * dim_param on export; "?" for unknown. Graph-owned storage. */
const char *kf_sym_name(const kf_graph *g, uint32_t sym);
/* True when sym is a derived expression, not a name of the file. */
bool kf_sym_is_expr(const kf_graph *g, uint32_t sym);

/* The dim with symbol `name` fixed to value: constant, another expression,
 * or unchanged when it does not use the name. */
kf_sdim kf_sdim_bind(kf_graph *g, kf_sdim d, uint32_t name, int64_t value);

/* ---- symbolic contents of small integer tensors ---------------------- */

/* Element count of the longest shape tensor tracked. */
#define KF_SYMVEC_MAX 16

typedef struct kf_symvec {
    int rank;   /* 0 or 1 */
    int n;      /* elements */
    kf_sdim e[KF_SYMVEC_MAX];
} kf_symvec;

/* Same rank and elements (unknown elements compare by being unknown). */
bool kf_symvec_equal(const kf_symvec *a, const kf_symvec *b);

/* True when every element is a constant. */
bool kf_symvec_const(const kf_symvec *s);

/* What node n's outputs hold, from its inputs' constants (in[i], may be
 * NULL) and symbolic contents (sv[i], may be NULL), for the ops that move
 * shapes around (Shape, Size, Gather, Concat, Slice, Unsqueeze, Squeeze,
 * Reshape, Cast, Identity, Add, Sub, Mul, Div, Neg, Max, Min, Equal, Where,
 * ReduceProd...). Returns true and fills *out when output 0 is a tracked
 * vector holding at least one symbol; false otherwise. tin: input types. */
bool kf_symvec_node(kf_graph *g, const kf_node *n, const kf_type *const *tin, const kf_tensor *const *in,
                    const kf_symvec *const *sv, kf_symvec *out);

/* s (all constants) as a tensor of dtype dt, rank s->rank. */
kf_status kf_symvec_tensor(const kf_symvec *s, kf_dtype dt, kf_tensor *out);

/* Output type of a node whose dims are products or quotients of symbolic
 * ones, or come from a shape operand: Reshape, Expand, ConstantOfShape,
 * Tile (operand symbolic, or constant against symbolic dims), Range
 * (symbolic bounds) and Flatten. Fills out[0]'s rank/dims/syms (dtype left
 * to the op's shape function) and returns true when it has an answer. */
bool kf_symvec_shape(kf_graph *g, const kf_node *n, const kf_type *const *tin, const kf_tensor *const *in,
                     const kf_symvec *const *sv, kf_type *out);

/* A constant target that stands for symbolic target s of a Reshape
 * (reshape true; allowzero as the node says) or an Expand of x: the
 * constants of s as they are, a symbol equal to x's dim at that place as 0
 * (Reshape keeps it; not with allowzero) or 1 (Expand keeps it), and one
 * remaining symbol of a Reshape as -1. False when s needs more. */
bool kf_symvec_target(const kf_type *x, const kf_symvec *s, bool reshape, bool allowzero, int64_t *out);

#endif
