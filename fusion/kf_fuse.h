/*
 * kf_fuse.h: `kfuse fuse` output. A fusion plan (kf_plan.h) turned into an
 * ONNX model whose groups are calls of model-local functions in domain
 * ai.kfuse, so any ONNX runtime still runs the file; and the plan written
 * out as JSON, a readable table and a Graphviz picture.
 */
#ifndef KF_FUSE_H
#define KF_FUSE_H

#include <stdio.h>

#include "kf_plan.h"

/* Domain of the functions `kfuse fuse` writes, and the version imported. */
#define KF_FUSE_DOMAIN "ai.kfuse"
#define KF_FUSE_DOMAIN_VERSION 1

typedef struct kf_fuse_stats {
    uint32_t functions;   /* groups written as one function call each */
    uint32_t kept;        /* groups whose nodes stay as they are */
    uint32_t nodes_after; /* live nodes of the main graph afterwards */
} kf_fuse_stats;

/* Rewrites m (in place) so that every group of p with more than one node
 * becomes one node `ai.kfuse::group_N` (N = the group's index in p; a
 * suffix is added if the model already has that function) calling a
 * model-local function of the same name whose body is a copy of the group's
 * nodes, attributes included.
 *   - One-node groups keep their node: wrapping one op adds a call and says
 *     nothing a runtime could use.
 *   - A group holding a node with a subgraph attribute (If, Loop, Scan) keeps
 *     its nodes: subgraphs may read outer-scope values by name, which a
 *     function body cannot see.
 *   - Constants the body reads stay graph initializers and are passed as
 *     inputs: ONNX functions cannot hold initializers, and turning large
 *     weights into Constant nodes would copy them into every body.
 *   - Function inputs are the values the group reads from outside, in
 *     first-use order; outputs the values it writes that are read outside or
 *     are graph outputs; both are recomputed from the graph, not taken from
 *     the plan, so the file always agrees with the graph.
 * The model imports ai.kfuse version 1 and at least IR version 8 (what
 * model-local functions need) once a function is written; each function
 * imports the model's opsets. p's node ids refer to m's graph; p itself is
 * not changed and stays readable (removed nodes keep their slots).
 * Errors: KF_ERR_INVALID_ARG when a node is in two groups or a group names
 * a dead node; KF_ERR_INTERNAL when a group is not convex (the call would
 * close a cycle). On error the model may be partly rewritten: discard it. */
kf_status kf_fuse_apply(kf_model *m, const kf_plan *p, kf_fuse_stats *stats);

/* A stand-in plan for tests and for builds without the planner: maximal
 * runs of up to 16 consecutive nodes (in topological order) whose ops the
 * op table knows and does not class opaque, so every group is convex by
 * construction. Cost fields are rough (bytes from static shapes, flops -1).
 * Free with kf_fuse_simple_plan_free. */
kf_status kf_fuse_simple_plan(const kf_model *m, kf_plan **out);
void kf_fuse_simple_plan_free(kf_plan *p);

/* A deep copy of p's public fields (groups, group_of, boundaries, figures;
 * not the planner's private state), freed with kf_fuse_simple_plan_free.
 * kf_plan_build's plans read the model until freed, and kf_fuse_apply
 * changes the model: copy the plan, free the original, then apply. */
kf_status kf_fuse_plan_copy(const kf_model *m, const kf_plan *p, kf_plan **out);

/* "elemwise", "reduction", "anchor", "opaque", "const". */
const char *kf_fuse_kind_name(kf_group_kind k);

/* Figures the reports print besides the plan's own. */
typedef struct kf_fuse_summary {
    uint32_t nodes_before; /* as loaded */
    uint32_t nodes_after;  /* after kf_optimize (what the plan covers) */
    uint32_t functions;    /* from kf_fuse_stats; 0 before kf_fuse_apply */
    int64_t arena_bytes;       /* kernels/kf_memplan.h: the plan's arena, -1 if sizes unknown */
    int64_t arena_lower_bound; /* its live-bytes lower bound, -1 if sizes unknown */
} kf_fuse_summary;

/* One JSON object (one line) with the keys nodes_before, nodes_after,
 * kernels, functions, modeled_bytes_before, modeled_bytes_after,
 * modeled_bytes_lower_bound, arena_bytes, arena_lower_bound, target (the
 * cost model's device, null without one), est_us (its estimate of one run),
 * cost_refusals, est_unsized, groups [{id, kind, launch, ops, nodes, bytes_read,
 * bytes_written, flops, est_us, est_blocks, est_form, est_bound, est_epilogue_us, est_lib_us, inputs,
 * outputs}] and boundaries [{from, to, value, reason}]. Unknown figures are
 * -1 (est_us too without a target). */
void kf_fuse_write_json(FILE *f, const kf_model *m, const kf_plan *p, const kf_fuse_summary *s);

/* A readable table: one line per group, then the boundary reasons with how
 * often each occurs (most frequent first, ties by text). */
void kf_fuse_write_report(FILE *f, const kf_model *m, const kf_plan *p);
/* One line saying how many groups the cost model could not size (symbolic
 * dims, kf_plan.est_unsized) and what that means for the figures; nothing
 * when it sized them all. */
void kf_plan_write_unsized(FILE *f, const kf_plan *p);

/* Graphviz: one `subgraph cluster_N` per group, filled by kind, node boxes
 * labelled op and name, edges labelled with the value names. When `dot` is
 * on PATH, also renders path.svg (*svg set true; a failing dot is an error).
 * Without dot, *svg is false and that is not an error. */
kf_status kf_fuse_write_dot(const char *path, const kf_model *m, const kf_plan *p, bool *svg);

#endif
