/*
 * plan_int.h: the fusion planner's working state, shared by plan.c
 * (legality, union-find, merging) and plan_build.c (driver, costs, the
 * final kf_plan). Not installed; nothing outside fusion/plan*.c includes it.
 */
#ifndef KF_PLAN_INT_H
#define KF_PLAN_INT_H

#include "kf_plan.h"

typedef enum pl_same { PL_SAME, PL_DIFFERENT, PL_UNKNOWN } pl_same;

/* Summary of one group, valid at its union-find root (a node id). */
typedef struct pl_group {
    kf_group_kind kind;
    int nred, nanchor;     /* reductions / anchors inside (the lattice allows one) */
    uint32_t ninj;         /* injective (data-movement) nodes inside */
    kf_id master;          /* the reduction or anchor node, 0 if none; with an
                            * anchor, the first (upstream) anchor */
    kf_id anc[2];          /* the anchors inside (nanchor of them), by position */
    kf_id red;             /* the reduction inside, 0 if none */
    bool layout_only;      /* every node is a layout op (see pl_layout_op) */
    uint32_t head, tail;   /* member nodes: a list through pl_state.next */
    uint32_t minpos, maxpos; /* first/last topological position of its nodes */
    uint32_t nnodes;
    int64_t cost;          /* sum of node register costs */
    int64_t flops;         /* sum of modeled node FLOPs; -1 unknown */
    kf_id *in;             /* values read from outside (any order) */
    uint32_t nin;
    kf_id *out;            /* values read outside or graph outputs */
    uint32_t nout;
    /* iteration space: the type of the elementwise outputs; for a
     * reduction group the reduction's input (red_out: its output); for an
     * anchor group the anchor's output. Value ids (0: none). */
    kf_id space, red_out;
} pl_group;

struct kf_plan_state {
    kf_model *m;
    const kf_graph *g;
    uint32_t *parent;  /* union-find over node ids */
    uint32_t *pos;     /* topological position; UINT32_MAX for dead nodes */
    kf_id *order;      /* live nodes in topological order */
    uint32_t norder;
    pl_group *gs;      /* by node id; meaningful at roots */
    uint32_t ngs;      /* slots in gs (the graph's node count when planned:
                        * the model may grow later, the plan must not care) */
    uint32_t *sc;      /* per value: space class; equal classes are provably
                        * the same shape even when the shape is unknown */
    uint32_t *stamp, stampv;   /* per node: visited marks of one search */
    uint32_t *vstamp, vstampv; /* per value: dedupe marks */
    uint32_t *stack;
    uint32_t *root_of_group;   /* final group index -> root */
    uint32_t *next;    /* per node: next member of its group's list, 0 at the end */
    kf_id *ubuf;       /* scratch: the members of a tentative union */
    uint8_t *up, *dn;  /* scratch per node: masters upstream / downstream inside
                        * a tentative union (PL_M_* bits) */
    struct kf_target *target; /* the cost model's device (owned); NULL: legality only */
    int math;          /* kf_cost_math */
    bool legal_only;   /* estimate, but merge whatever is legal */
    bool lib;          /* anchors may go to the target's vendor library (kf_plan_options.no_library) */
    kf_id *cbuf;       /* scratch: the members of a union being costed */
    kf_id *vbuf;       /* scratch: its input and output values */
};
typedef struct kf_plan_state pl_state;

kf_fclass pl_fclass(const kf_graph *g, const kf_node *n);
bool pl_layout_op(const kf_graph *g, const kf_node *n);
pl_same pl_space_cmp(const pl_state *s, kf_id a, kf_id b);
void pl_space_classes(pl_state *s);
uint32_t pl_find(pl_state *s, uint32_t x);
const char *pl_legal(pl_state *s, uint32_t ra, uint32_t rb, bool horizontal);
int64_t pl_regs(uint32_t nin, uint32_t nout, int64_t cost);
int64_t pl_node_flops(const kf_graph *g, const kf_node *n);
uint32_t pl_union_inputs(pl_state *s, uint32_t ra, uint32_t rb, kf_id *out);
uint32_t pl_union_outputs(pl_state *s, uint32_t ra, uint32_t rb, kf_id *out);
int64_t pl_value_bytes(const kf_graph *g, kf_id v);
int64_t pl_read_bytes(const kf_graph *g, kf_id v, bool (*member)(const void *ctx, kf_id node), const void *ctx);
/* plan_cost.c: the cost model on the working state */
struct kf_cost;
void pl_cost(pl_state *s, uint32_t ra, uint32_t rb, struct kf_cost *c);
const char *pl_cost_reason(pl_state *s, uint32_t ra, uint32_t rb);
/* The planner's decision: legality, then (with a target) the cost model. */
const char *pl_decide(pl_state *s, uint32_t ra, uint32_t rb, bool horizontal);
kf_status pl_merge(pl_state *s, uint32_t ra, uint32_t rb);
kf_status pl_init_node(pl_state *s, kf_id x);
void pl_state_free(pl_state *s);

#endif
