/*
 * exec.c: compiled plans (kf_exec.h). Create: copy and optimize the model.
 * Per distinct input-shape set (a "spec", memoised): specialise the copy's
 * input dims, plan fusion, generate every group's kernel, compile the
 * distinct texts in parallel through the kernel cache, upload weights,
 * plan the arena (kf_memplan). Run: take a run slot (stream + arena, kept
 * for the next run), move values between host and device only where a
 * reference group or the caller needs them, and on CUDA replay a captured
 * graph when every group is a kernel.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kf_cost.h"
#include "kf_exec.h"
#include "kf_libanchor.h"
#include "kf_memplan.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "kf_precision.h"

/* A distinct kernel text and what it compiled to. */
typedef struct ukern {
    char *src;    /* prelude + body */
    char *entry;
    void *handle; /* the device's kernel; NULL when compile-only */
} ukern;

/* One group of the plan as run. */
typedef struct step {
    uint32_t group;
    int kern;        /* index into spec.kerns; STEP_REF, STEP_CONST or STEP_ALIAS */
    kf_cg_kernel k;  /* parameters (value ids, sizes) when kern >= 0 */
    kf_la_anchor *lib; /* a library anchor (kf_libanchor.h): its call runs first, then
                        * k (the epilogue) when kern >= 0; NULL for every other step */
    char *host_why;  /* STEP_REF: why the group is not a kernel (kf_run_device says it) */
} step;

#define STEP_REF (-1)   /* runs on the reference evaluator */
#define STEP_CONST (-2) /* a plan-time constant, computed when the spec is built */
#define STEP_LIB (-5)   /* a library anchor's call alone: it writes the group's output */
#define STEP_ALIAS (-3) /* a view whose outputs share its input's arena bytes: nothing to
                         * launch while the input is on the device, else run on ref */
#define STEP_BATCHED (-4) /* generated, but launched inside the batched kernel of an earlier
                           * step of the same plan launch (batch_steps) */

/* What one run needs on the device; kept and reused by later runs. */
typedef struct slot {
    struct slot *next;
    void *stream;
    void *arena;
    void **bufs;    /* per value: device buffer (arena view or own), lazily made */
    bool *own;      /* bufs[v] was allocated, not a view */
    void *graph;    /* a captured CUDA Graph of all launches, or NULL */
    bool graph_failed;
    void **gptrs;   /* device-side runs: the caller's buffers (inputs, then outputs) of the
                     * last run enqueued launch by launch, or the ones graph was captured with */
    void **errb;    /* per step: the kf_err ints of a kernel that checks indices (kf_cg_check), or NULL */
    void *bound;    /* device-side runs: the caller's stream this slot's launches go to (NULL:
                     * kf_exec_run's, with its own stream); kept bound until the plan is freed,
                     * as the caller's work may still read its arena */
    bool busy;      /* bound slot: a kf_exec_run_device is enqueueing with it */
} slot;

typedef struct spec {
    kf_type *in_types; /* the shape set this spec is for (per exec input) */
    kf_id *in_ids;     /* per exec input: its value in m (0: dropped); loading renumbers ids */
    kf_model *m;
    kf_plan *p;
    step *steps;
    uint32_t nsteps;
    ukern *kerns;
    uint32_t nkerns;
    kf_tensor *cvals;  /* per value: plan-time constants computed at build, and constants a
                        * library call reads in another layout (kf_la_const_layout) */
    void **wbufs;      /* per value: device copy of a weight/constant kernels read */
    bool *dev_read;    /* per value: some kernel reads it */
    void *zeros;       /* KF_CG_ERR_INTS zero words on the device, when a kernel checks indices:
                        * clears a bound slot's kf_err on the caller's stream (d->copy) */
    kf_memplan mp;
    bool has_ref;      /* some step runs on the reference evaluator */
    slot *free_slots;
    slot *dev_slots;   /* bound to callers' streams (kf_exec_run_device), never reused by kf_exec_run */
    struct body_plan *bodies; /* compiled If/Loop/Scan bodies of its ref steps (run_body), under e->mu */
    uint32_t nbodies;
    kf_exec_stats stats;
} spec;

/* An If branch or Loop/Scan body of node `node` compiled into a plan of
 * its own for the same backend (NULL x: it would not compile; the
 * evaluator runs it). */
typedef struct body_plan {
    kf_id node;
    const char *attr; /* one of kf_control_bodies' static names */
    kf_exec *x;
    bool evaluator;   /* a run of x was refused (inputs its plan does not take): the evaluator runs it */
} body_plan;

struct kf_exec {
    kf_exec_options o;
    char target[256];  /* o.target, owned: specs are planned after create returns */
    char **patterns;   /* o.pattern_files, owned (o.npattern_files of them) */
    int64_t *fixed;    /* per input, KF_MAX_RANK dims: the size o.dims fixed, else -1 */
    void *base_bytes;  /* the optimized model serialised: each spec loads a copy */
    size_t base_len;
    char *base_dir;
    kf_model *base;    /* the copy as given (each spec specialises and optimizes its own) */
    char **in_names, **out_names;
    uint32_t nin, nout;
    kf_id *in_ids;     /* per input: its value in base */
    kf_dev *dev;       /* NULL for the ref backend */
    kf_cache *cache;
    pthread_mutex_t mu; /* guards specs and every spec's free_slots */
    spec **specs;
    uint32_t nspecs;
    kf_exec_stats last;
    uint64_t device_replays; /* device-side runs replayed from a captured graph (under mu) */
    uint64_t body_runs;      /* control-flow bodies run as compiled plans (under mu) */
};

static const char *env_has(const char *var, const char *word) {
    const char *v = getenv(var);
    return v && strstr(v, word) ? v : NULL;
}

/* Every copy between host and device memory and every wait for a stream
 * goes through these three, so KFUSE_TRACE=host lists them all (a
 * device-side run must show none). */
static kf_status host_upload(kf_dev *d, void *stream, void *buf, const void *src, size_t n, const char *what) {
    if (env_has("KFUSE_TRACE", "host")) fprintf(stderr, "kfuse: host: upload %zu bytes (%s)\n", n, what);
    return d->upload(d, stream, buf, src, n);
}

static kf_status host_download(kf_dev *d, void *stream, void *buf, void *dst, size_t n, const char *what) {
    if (env_has("KFUSE_TRACE", "host")) fprintf(stderr, "kfuse: host: download %zu bytes (%s)\n", n, what);
    return d->download(d, stream, buf, dst, n);
}

static kf_status host_sync(kf_dev *d, void *stream, const char *what) {
    if (env_has("KFUSE_TRACE", "host")) fprintf(stderr, "kfuse: host: sync (%s)\n", what);
    return d->sync(d, stream);
}

static const char *const prec_names[KF_PRECISION_COUNT] = {"fp32", "tf32", "fp16", "bf16", "int8", "int8-fp16", "fp8"};

const char *kf_precision_name(kf_precision p) { return (unsigned)p < KF_PRECISION_COUNT ? prec_names[p] : "?"; }

bool kf_precision_keeps_quantized(kf_precision p) {
    return p == KF_PRECISION_INT8 || p == KF_PRECISION_INT8_FP16 || p == KF_PRECISION_FP8;
}

/* FP8: the weights of float8 products and convolutions (fusion/kf_cost.h,
 * kf_fp8_anchor) stay float8 behind their DequantizeLinear, which the
 * product's library call or the float8 tile reads (or, for a convolution
 * the library runs faster, the planner computes once at plan time:
 * fusion/plan.c); every other DequantizeLinear of constants folds, as at
 * fp16. */
static kf_status keep_fp8_weights(kf_model *m, int64_t fold_cap_bytes, FILE *trace) {
    uint32_t per_column;
    KF_TRY(kf_fuse_fp8(m, &per_column));
    kf_graph *g = m->graph;
    uint32_t nn = g->nnodes, products = 0, convs = 0;
    bool *keep = kf_calloc((size_t)nn + 1, sizeof *keep);
    if (!keep) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (kf_id id = 1; id < nn; id++)
        if (kf_fp8_anchor(m, &g->nodes[id])) {
            keep[g->values[g->nodes[id].in[1]].producer] = true;
            if (g->nodes[id].op == KF_OP_CONV) convs++;
            else products++;
        }
    kf_pass_ctx fc = {.fuel = -1, .fold_cap_bytes = fold_cap_bytes, .keep = keep, .nkeep = nn};
    kf_status st = kf_pass_fold(m, &fc);
    kf_free(keep);
    if (!st && fc.changes) st = kf_graph_dce(m->graph, NULL);
    if (!st && trace)
        fprintf(trace,
                "kfuse: backend: fp8: %u float8 products keep their weights (%u scaled per column after), %u "
                "float8 convolutions theirs, %llu constants folded\n",
                products, per_column, convs, (unsigned long long)fc.changes);
    return st;
}

kf_status kf_precision_passes(kf_model *m, kf_precision p, int64_t fold_cap_bytes, FILE *trace) {
    if (p == KF_PRECISION_FP8) KF_TRY(keep_fp8_weights(m, fold_cap_bytes, trace));
    if (p == KF_PRECISION_INT8 || p == KF_PRECISION_INT8_FP16) {
        kf_int8_stats is;
        KF_TRY(kf_fuse_int8(m, &is));
        /* what no integer anchor took would dequantize on every run */
        kf_pass_ctx fc = {.fuel = -1, .fold_cap_bytes = fold_cap_bytes};
        KF_TRY(kf_pass_fold(m, &fc));
        if (fc.changes) KF_TRY(kf_graph_dce(m->graph, NULL));
        if (trace)
            fprintf(trace, "kfuse: backend: %s: %u integer anchors, %llu constants folded after\n", kf_precision_name(p),
                    is.anchors, (unsigned long long)fc.changes);
    }
    if (p == KF_PRECISION_FP16 || p == KF_PRECISION_BF16 || p == KF_PRECISION_INT8_FP16 || p == KF_PRECISION_FP8) {
        /* after optimizing (rules see the float32 graph they were written
         * for), before planning: the planner and codegen see 16-bit values */
        kf_dtype low = p == KF_PRECISION_BF16 ? KF_DT_BFLOAT16 : KF_DT_FLOAT16;
        kf_precision_stats ps;
        KF_TRY(kf_fuse_precision(m, low, &ps));
        if (trace)
            fprintf(trace, "kfuse: backend: %s: %u nodes on %s, %u kept float32, %u casts, %u weights converted\n",
                    kf_precision_name(p), ps.nodes_low, kf_dtype_name(low), ps.nodes_kept, ps.casts, ps.weights_converted);
    }
    return KF_OK;
}

bool kf_precision_parse(const char *s, kf_precision *p) {
    for (int i = 0; s && i < KF_PRECISION_COUNT; i++)
        if (!strcmp(s, prec_names[i])) {
            *p = (kf_precision)i;
            return true;
        }
    return false;
}

kf_status kf_precision_from_env(kf_precision *p) {
    const char *v = getenv("KFUSE_PRECISION");
    *p = KF_PRECISION_FP32;
    if (!v || !v[0] || kf_precision_parse(v, p)) return KF_OK;
    return kf_fail(KF_ERR_INVALID_ARG, "KFUSE_PRECISION='%s': not a precision (fp32, tf32, fp16, bf16, int8, int8-fp16, fp8)", v);
}

void kf_exec_options_default(kf_exec_options *o) {
    memset(o, 0, sizeof *o);
    o->backend = KF_EXEC_OPENCL;
    o->optimize = true;
    if (kf_precision_from_env(&o->precision)) {
        kf_clear_error();
        o->precision = (kf_precision)-1; /* kf_exec_create says why */
    }
}

static int64_t value_bytes(const kf_graph *g, kf_id v) {
    const kf_type *t = &g->values[v].type;
    size_t esz = kf_dtype_size(t->dtype);
    if (t->rank < 0 || esz == 0 || t->dtype == KF_DT_STRING) return -1;
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) {
        if (t->dims[d] < 0) return -1;
        n *= t->dims[d];
    }
    return n * (int64_t)esz;
}

/* ---- specs: build ------------------------------------------------------- */

static kf_status missing(const kf_graph *g, kf_id v, const char *who) {
    return kf_fail(KF_ERR_BAD_MODEL, "%s: input '%s' has no value", who, g->values[v].name);
}

/* The host tensor of v: computed this run, a plan-time constant, else the
 * initializer; NULL when none. */
static const kf_tensor *host_of(const spec *s, const kf_tensor *vals, kf_id v) {
    if (vals && (vals[v].data || vals[v].dtype)) return &vals[v];
    if (s->cvals[v].data || s->cvals[v].dtype) return &s->cvals[v];
    return s->m->graph->values[v].init;
}

/* ---- control-flow bodies as compiled plans --------------------------------
 * A ref step holding an If, Loop or Scan node runs the node's control flow
 * on the host (ops_control.c: conditions, iterations, scanned slices,
 * stacked outputs) but each body as a plan of its own on this backend:
 * compiled at its first run (the plan specialises per input shape set as
 * any does) and kept in the spec. Bodies compute in float32, as the
 * precision pass leaves them; a body that does not compile runs on the
 * evaluator, as before. */
typedef struct body_ctx {
    kf_exec *e;
    spec *s;
} body_ctx;

/* The kept plan of body attr of node nid in s, or NULL (under e->mu). */
static body_plan *body_of(spec *s, kf_id nid, const char *attr) {
    for (uint32_t i = 0; i < s->nbodies; i++)
        if (s->bodies[i].node == nid && !strcmp(s->bodies[i].attr, attr)) return &s->bodies[i];
    return NULL;
}

static kf_status run_body(void *vctx, const kf_node *n, const char *attr, const kf_body *b, const kf_tensor *const *bound,
                          kf_tensor *outputs, int depth) {
    body_ctx *c = vctx;
    kf_exec *e = c->e;
    spec *s = c->s;
    kf_id nid = (kf_id)(n - s->m->graph->nodes);
    kf_exec *x = NULL;
    pthread_mutex_lock(&e->mu);
    const body_plan *bp = body_of(s, nid, attr);
    bool known = bp != NULL;
    if (bp && !bp->evaluator) x = bp->x;
    pthread_mutex_unlock(&e->mu);
    if (!known) {
        /* inputs the body leaves untyped (the names it reads from around
         * it) take the dtype and rank of what they are bound to now; their
         * sizes stay open, so the plan takes every size */
        for (uint32_t k = 0; k < b->g->ninputs; k++) {
            kf_value *v = &b->g->values[b->g->inputs[k]];
            if ((v->type.dtype && v->type.rank >= 0) || !bound[k]) continue;
            kf_type_unknown(&v->type);
            v->type.dtype = bound[k]->dtype;
            v->type.rank = bound[k]->rank;
            for (int d = 0; d < bound[k]->rank; d++) v->type.dims[d] = -1;
            v->has_type = true;
        }
        kf_model bm = {.graph = b->g, .opsets = s->m->opsets, .nopsets = s->m->nopsets, .ir_version = s->m->ir_version};
        kf_exec_options o = e->o;
        o.precision = KF_PRECISION_FP32;
        o.dims = NULL;
        o.ndims = 0;
        if (kf_exec_create(&bm, &o, &x)) {
            kf_clear_error();
            x = NULL;
        }
        /* kept for later runs, unless another thread kept one meanwhile */
        pthread_mutex_lock(&e->mu);
        const body_plan *other = body_of(s, nid, attr);
        bool raced = other != NULL;
        kf_exec *kept = other ? other->x : NULL;
        body_plan *nb = raced ? NULL : kf_realloc(s->bodies, (s->nbodies + 1) * sizeof *nb);
        if (nb) {
            s->bodies = nb;
            s->bodies[s->nbodies++] = (body_plan){nid, attr, x, false};
        }
        pthread_mutex_unlock(&e->mu);
        if (raced || !nb) {
            kf_exec_free(x);
            if (!raced) return kf_fail(KF_ERR_NOMEM, "out of memory");
            x = kept;
        }
    }
    if (!x) return kf_eval_graph(s->m, b->g, bound, outputs, depth);
    uint32_t nin = kf_exec_num_inputs(x);
    kf_tensor *ins = kf_calloc((size_t)nin + 1, sizeof(kf_tensor));
    if (!ins) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = KF_OK;
    for (uint32_t i = 0; i < nin && !st; i++) {
        const char *name = kf_exec_input_name(x, i);
        uint32_t k = 0;
        while (k < b->g->ninputs && strcmp(b->g->values[b->g->inputs[k]].name, name)) k++;
        if (k == b->g->ninputs || !bound[k])
            st = kf_fail(KF_ERR_INTERNAL, "body '%s' of node '%s': no value for its input '%s'", attr, kf_node_label(n), name);
        else ins[i] = *bound[k]; /* read in place: a shallow copy, never released */
    }
    if (!st) st = kf_exec_run(x, ins, nin, outputs);
    kf_free(ins);
    if (st == KF_ERR_INVALID_ARG || st == KF_ERR_SHAPE || st == KF_ERR_UNSUPPORTED || st == KF_ERR_COMPILE) {
        /* inputs the plan does not take (a shape its declared types rule
         * out, a dtype it was not compiled for): the evaluator, from now on */
        kf_clear_error();
        pthread_mutex_lock(&e->mu);
        body_plan *mine = body_of(s, nid, attr);
        if (mine) mine->evaluator = true;
        pthread_mutex_unlock(&e->mu);
        return kf_eval_graph(s->m, b->g, bound, outputs, depth);
    }
    if (!st) {
        pthread_mutex_lock(&e->mu);
        e->body_runs++;
        pthread_mutex_unlock(&e->mu);
    }
    return st;
}

/* Runs group gr node by node on the reference evaluator, control-flow
 * bodies as compiled plans when e is given; outputs go to vals. */
static kf_status run_ref_group(kf_exec *e, spec *s, const kf_group *gr, kf_tensor *vals) {
    const kf_graph *g = s->m->graph;
    kf_status st = KF_OK;
    for (uint32_t k = 0; k < gr->nnodes && !st; k++) {
        const kf_node *n = &g->nodes[gr->nodes[k]];
        if (kf_model_function(s->m, n->domain, n->op_type))
            return kf_fail(KF_ERR_UNSUPPORTED, "node '%s' calls model-local function %s::%s, which only --backend ref runs",
                           kf_node_label(n), n->domain, n->op_type);
        const kf_tensor **in = kf_calloc((size_t)n->nin + 1, sizeof(kf_tensor *));
        kf_tensor *out = kf_calloc((size_t)n->nout + 1, sizeof(kf_tensor));
        if (!in || !out) st = kf_fail(KF_ERR_NOMEM, "out of memory");
        for (int i = 0; !st && i < n->nin; i++)
            if (n->in[i] && !(in[i] = host_of(s, vals, n->in[i]))) st = missing(g, n->in[i], kf_node_label(n));
        if (!st && e && *kf_control_bodies(n)) {
            body_ctx bc = {e, s};
            kf_body_run_fn pf;
            void *pc;
            kf_set_body_runner(run_body, &bc, &pf, &pc);
            st = kf_eval_node(n, n->nin, in, out);
            kf_set_body_runner(pf, pc, NULL, NULL);
        } else if (!st) {
            st = kf_eval_node(n, n->nin, in, out);
        }
        for (int j = 0; out && j < n->nout; j++) {
            if (!st && n->out[j]) kf_tensor_move(&vals[n->out[j]], &out[j]);
            kf_tensor_release(&out[j]);
        }
        kf_free(in);
        kf_free(out);
    }
    return st;
}

static void slot_free(kf_dev *d, const spec *s, slot *sl) {
    uint32_t nv = s->m->graph->nvalues;
    for (uint32_t v = 0; sl->bufs && v <= nv; v++)
        if (sl->bufs[v]) (sl->own[v] ? d->free : d->view_free)(d, sl->bufs[v]);
    if (sl->graph) d->graph_free(d, sl->graph);
    kf_free(sl->gptrs);
    for (uint32_t i = 0; sl->errb && i < s->nsteps; i++)
        if (sl->errb[i]) d->free(d, sl->errb[i]);
    kf_free(sl->errb);
    if (sl->arena) d->free(d, sl->arena);
    if (sl->stream) d->stream_free(d, sl->stream);
    kf_free(sl->bufs);
    kf_free(sl->own);
    kf_free(sl);
}

static void spec_free(kf_exec *e, spec *s) {
    if (!s) return;
    kf_dev *d = e->dev;
    for (uint32_t i = 0; i < s->nbodies; i++) kf_exec_free(s->bodies[i].x);
    kf_free(s->bodies);
    uint32_t nv = s->m ? s->m->graph->nvalues : 0;
    for (slot **list = &s->free_slots; list; list = list == &s->free_slots ? &s->dev_slots : NULL)
        while (*list) {
            slot *n = (*list)->next;
            slot_free(d, s, *list);
            *list = n;
        }
    for (uint32_t v = 0; s->wbufs && v <= nv; v++)
        if (s->wbufs[v]) d->free(d, s->wbufs[v]);
    if (s->zeros) d->free(d, s->zeros);
    for (uint32_t v = 0; s->cvals && v <= nv; v++) kf_tensor_release(&s->cvals[v]);
    for (uint32_t i = 0; i < s->nkerns; i++) {
        if (s->kerns[i].handle) d->unload(d, s->kerns[i].handle);
        kf_free(s->kerns[i].src);
        kf_free(s->kerns[i].entry);
    }
    for (uint32_t i = 0; i < s->nsteps; i++) { /* also a step whose kernel failed half way (kern still -1) */
        kf_cg_kernel_release(&s->steps[i].k);
        kf_la_anchor_release(s->steps[i].lib);
        kf_free(s->steps[i].lib);
        kf_free(s->steps[i].host_why);
    }
    kf_memplan_release(&s->mp);
    kf_free(s->kerns);
    kf_free(s->steps);
    kf_free(s->cvals);
    kf_free(s->wbufs);
    kf_free(s->dev_read);
    kf_free(s->in_types);
    kf_free(s->in_ids);
    kf_plan_free(s->p);
    kf_model_free(s->m);
    kf_free(s);
}

/* ---- parallel compile through the cache --------------------------------- */

typedef struct compile_job {
    kf_exec *e;
    spec *s;
    pthread_mutex_t mu;
    uint32_t next, done;
    kf_status st;   /* first failure */
    char msg[4096]; /* its message (the last error is per thread) */
    bool progress;
} compile_job;

static void dump(const char *dir, uint32_t i, const ukern *k, const char *ext, const char *text) {
    if (!dir || !text) return;
    mkdir(dir, 0777);
    char path[4096];
    snprintf(path, sizeof path, "%s/%03u_%s.%s", dir, i, k->entry, ext);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Compiles (or fetches) kernel i; loads it unless compile-only. */
static kf_status compile_one(compile_job *j, uint32_t i, bool *hit) {
    kf_exec *e = j->e;
    kf_dev *d = e->dev;
    ukern *k = &j->s->kerns[i];
    kf_cache_key key = {k->src, strlen(k->src), d->arch, d->compiler, d->options};
    void *bin = NULL;
    size_t len = 0;
    char *log = NULL;
    const char *dumpdir = getenv("KFUSE_DUMP_DIR");
    if (dumpdir && dumpdir[0]) dump(dumpdir, i, k, d->target == KF_CG_CUDA ? "cu" : "cl", k->src);
    else dumpdir = NULL;
    KF_TRY(kf_cache_get(e->cache, &key, &bin, &len, hit));
    if (*hit && d->can_run && d->load(d, bin, len, k->entry, &k->handle) != KF_OK) {
        /* a binary the device refuses (driver update): rebuild it */
        free(bin);
        bin = NULL;
        *hit = false;
    }
    if (env_has("KFUSE_TRACE", "cache"))
        fprintf(stderr, "kfuse: cache: %s %s (%s, %zu bytes of source)\n", *hit ? "hit" : "miss", k->entry, d->arch,
                strlen(k->src));
    if (*hit) {
        free(bin);
        return KF_OK;
    }
    kf_status st = d->build(d, k->src, k->entry, &bin, &len, &log);
    dump(dumpdir, i, k, "log", log ? log : "");
    free(log);
    if (st) return st;
    /* loaded before it is stored: a binary this device refuses is never
     * cached (a failed put only costs time later) */
    if (d->can_run) st = d->load(d, bin, len, k->entry, &k->handle);
    if (!st && kf_cache_put(e->cache, &key, bin, len) != KF_OK) kf_clear_error();
    free(bin);
    return st;
}

static void *compile_worker(void *arg) {
    compile_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        uint32_t i = j->st ? j->s->nkerns : j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->s->nkerns) return NULL;
        bool hit = false;
        kf_status st = compile_one(j, i, &hit);
        pthread_mutex_lock(&j->mu);
        if (st && !j->st) {
            j->st = st;
            snprintf(j->msg, sizeof j->msg, "%s", kf_last_error());
        }
        if (!st && hit) j->s->stats.cache_hits++;
        else if (!st) j->s->stats.kernels_compiled++;
        j->done++;
        if (j->progress)
            fprintf(stderr, "\rkfuse: compiling kernels %u/%u (%u cache hits)", j->done, j->s->nkerns, j->s->stats.cache_hits);
        pthread_mutex_unlock(&j->mu);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static kf_status compile_all(kf_exec *e, spec *s) {
    if (!s->nkerns) return KF_OK;
    compile_job j;
    memset(&j, 0, sizeof j);
    j.e = e, j.s = s;
    j.progress = s->nkerns > KF_EXEC_PROGRESS_KERNELS;
    pthread_mutex_init(&j.mu, NULL);
    int nt = e->o.threads;
    if (nt <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nt = c > 0 ? (int)c : 1;
    }
    if (nt > KF_EXEC_MAX_THREADS) nt = KF_EXEC_MAX_THREADS;
    if ((uint32_t)nt > s->nkerns) nt = (int)s->nkerns;
    pthread_t th[KF_EXEC_MAX_THREADS];
    int started = 0;
    double t0 = now_s();
    for (int t = 1; t < nt; t++)
        if (pthread_create(&th[started], NULL, compile_worker, &j) == 0) started++;
    compile_worker(&j); /* this thread works too: one compile needs no thread */
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    s->stats.compile_seconds = now_s() - t0;
    if (j.progress) fprintf(stderr, "\n");
    pthread_mutex_destroy(&j.mu);
    if (j.st) return kf_fail(j.st, "%s", j.msg);
    return KF_OK;
}

/* ---- specs: build ------------------------------------------------------- */

static const char *kind_name(kf_group_kind k) {
    switch (k) {
    case KF_GROUP_ELEMWISE: return "elementwise";
    case KF_GROUP_REDUCTION: return "reduction";
    case KF_GROUP_ANCHOR: return "anchor";
    case KF_GROUP_OPAQUE: return "opaque";
    case KF_GROUP_CONST: return "const";
    }
    return "?";
}

/* The value a view group reshapes: its first node's data input. */
static kf_id view_source(const kf_graph *g, const kf_group *gr) {
    return gr->nnodes ? g->nodes[gr->nodes[0]].in[0] : 0;
}

/* Whether every output of view group gr has the arena bytes of its source
 * (the memory planner gives views their root's offset), so running it
 * moves nothing. A graph output or a graph input source is not in the
 * arena: then the view is an ordinary copy. */
static bool view_aliases(const spec *s, const kf_group *gr) {
    const kf_memplan *mp = &s->mp;
    kf_id src = view_source(s->m->graph, gr);
    if (!mp->offset || !src || src > mp->nvalues || mp->offset[src] < 0 || !gr->noutputs) return false;
    for (uint32_t o = 0; o < gr->noutputs; o++) {
        kf_id v = gr->outputs[o];
        if (v > mp->nvalues || mp->offset[v] != mp->offset[src]) return false;
    }
    return true;
}

/* May step st share a launch with others (cg_batch.c)? Generated, of a
 * plan launch, and a template that runs at any work-group size. */
static bool batchable(const kf_plan *p, const step *st) {
    if (st->kern < 0) return false;
    const kf_group *gr = &p->groups[st->group];
    return gr->launch != UINT32_MAX && (gr->kind == KF_GROUP_ELEMWISE || gr->kind == KF_GROUP_REDUCTION) &&
           !st->k.nchecks; /* its kf_err is its own (kf_cg_check codes are per kernel) */
}

/* Horizontal launches: the generated steps of one plan launch (same level
 * of the group DAG, so no path between them) become one batched kernel,
 * launched at the step of the first member. The memory planner widened
 * every member's values to the whole launch's span of steps (kf_memplan.h),
 * so all of them are live there; producers sit at lower levels (earlier
 * steps) and consumers at higher ones (later steps). Members join in step
 * order while the batch's parameters fit KF_CG_BATCH_MAX_PARAMS; one left
 * out may lead a batch of its own. A batch codegen declines stays as
 * separate launches. Kernels only the members used are dropped before the
 * compile. KFUSE_DISABLE_BATCHING=1 turns it off (bisecting, benchmarks). */
static kf_status batch_steps(kf_exec *e, spec *s) {
    const char *off = getenv("KFUSE_DISABLE_BATCHING");
    bool disabled = e->o.batching == KF_SWITCH_DEFAULT ? off && off[0] && strcmp(off, "0") : e->o.batching == KF_SWITCH_OFF;
    if (!e->dev || disabled) return KF_OK;
    const kf_plan *p = s->p;
    /* room for a new text per batch (at most one per two steps) while the
     * members' own texts are still listed */
    ukern *grown = kf_realloc(s->kerns, ((size_t)s->nkerns + s->nsteps / 2 + 1) * sizeof *grown);
    if (!grown) return kf_fail(KF_ERR_NOMEM, "out of memory");
    s->kerns = grown;
    for (uint32_t i = 0; i < s->nsteps; i++) {
        if (!batchable(p, &s->steps[i])) continue;
        uint32_t launch = p->groups[s->steps[i].group].launch, idx[KF_PLAN_MAX_BATCH], n = 1;
        kf_cg_kernel ks[KF_PLAN_MAX_BATCH]; /* shallow copies of the members' kernels */
        idx[0] = i, ks[0] = s->steps[i].k;
        for (uint32_t j = i + 1; j < s->nsteps && n < KF_PLAN_MAX_BATCH; j++) {
            if (!batchable(p, &s->steps[j]) || p->groups[s->steps[j].group].launch != launch) continue;
            ks[n] = s->steps[j].k;
            if (kf_cg_batch_params(ks, n + 1) <= KF_CG_BATCH_MAX_PARAMS) idx[n++] = j;
        }
        if (n < 2) continue;
        kf_cg_kernel bk;
        kf_status cst = kf_cg_batch_kernels(ks, n, &bk);
        if (cst == KF_ERR_UNSUPPORTED) {
            if (e->o.trace) fprintf(e->o.trace, "kfuse: backend: launch %u not batched: %s\n", launch, kf_last_error());
            kf_clear_error();
            continue;
        }
        KF_TRY(cst);
        char *src = NULL;
        cst = kf_cg_source(&bk, e->dev->target, &src);
        uint32_t u = 0;
        while (!cst && u < s->nkerns && strcmp(s->kerns[u].src, src) != 0) u++;
        if (!cst && u == s->nkerns) {
            if (!(s->kerns[u].entry = kf_strdup(bk.name))) cst = kf_fail(KF_ERR_NOMEM, "out of memory");
            else s->kerns[u].src = src, src = NULL, s->nkerns++;
        }
        kf_free(src);
        if (cst) {
            kf_cg_kernel_release(&bk);
            return cst;
        }
        if (e->o.trace) {
            fprintf(e->o.trace, "kfuse: backend: launch %u: groups", launch);
            for (uint32_t m = 0; m < n; m++) fprintf(e->o.trace, " %u", s->steps[idx[m]].group);
            fprintf(e->o.trace, " in one kernel (%lld work-groups of %u)\n", (long long)(bk.numel / bk.block), bk.block);
        }
        for (uint32_t m = 0; m < n; m++) {
            step *st = &s->steps[idx[m]];
            kf_cg_kernel_release(&st->k);
            st->kern = STEP_BATCHED;
        }
        s->steps[i].k = bk;
        s->steps[i].kern = (int)u;
        s->stats.launches -= n - 1;
    }
    /* drop kernels no step launches any more, keeping the order of the rest */
    int *map = kf_calloc((size_t)s->nkerns + 1, sizeof *map);
    if (!map) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kern >= 0) map[s->steps[i].kern] = 1;
    uint32_t kept = 0;
    for (uint32_t u = 0; u < s->nkerns; u++) {
        if (!map[u]) {
            kf_free(s->kerns[u].src);
            kf_free(s->kerns[u].entry);
            map[u] = -1;
            continue;
        }
        s->kerns[kept] = s->kerns[u];
        map[u] = (int)kept++;
    }
    for (uint32_t u = kept; u < s->nkerns; u++) s->kerns[u] = (ukern){0};
    s->nkerns = kept;
    for (uint32_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kern >= 0) s->steps[i].kern = map[s->steps[i].kern];
    kf_free(map);
    return KF_OK;
}

/* ---- library anchors (kf_libanchor.h) ----------------------------------- */

/* Turns anchor step st into a library call when the device has one and
 * the group maps: *lib_only when the call writes everything (STEP_LIB);
 * else st->k becomes the epilogue kernel, compiled like any other. A
 * declined group keeps its generated kernel (the reason goes to the trace). */
static kf_status lib_step(kf_exec *e, spec *s, step *st, bool *lib_only) {
    *lib_only = false;
    const char *off = getenv("KFUSE_NO_VENDOR_LIB");
    if (!e->dev->lib || e->o.no_vendor_lib || (off && off[0] && strcmp(off, "0"))) return KF_OK;
    kf_la_anchor la;
    char why[512]; /* a reason names one node or value */
    kf_status cst = kf_la_plan_group(s->m, s->p, st->group, &la, why, sizeof why);
    if (cst == KF_ERR_UNSUPPORTED) {
        if (e->o.trace) fprintf(e->o.trace, "kfuse: backend: group %u: library declined: %s\n", st->group, why);
        return KF_OK;
    }
    if (cst) return kf_fail(cst, "out of memory mapping group %u onto the library", st->group);
    if (!e->dev->lib_has(e->dev, la.is_conv)) {
        if (e->o.trace) fprintf(e->o.trace, "kfuse: backend: group %u: the device has no library for it\n", st->group);
        kf_la_anchor_release(&la);
        return KF_OK;
    }
    int sm = 0; /* float8 tensor cores: sm_89 and later (a CUDA device's arch is "sm_XY") */
    if (!la.is_conv && la.gemm.a_dtype && sscanf(e->dev->arch, "sm_%d", &sm) == 1 && sm < 89) {
        if (e->o.trace)
            fprintf(e->o.trace, "kfuse: backend: group %u: library declined: a float8 GEMM on %s (sm_89+)\n", st->group,
                    e->dev->arch);
        kf_la_anchor_release(&la);
        return KF_OK;
    }
    la.gemm.precision = la.conv.precision = e->o.precision;
    if (!la.is_conv && la.gemm.a_const_t) {
        /* the weights' device copy in the layout the call reads; the
         * mapping made sure this call is their only reader */
        kf_status cs = kf_la_const_layout(&la.gemm, s->m->graph->values[la.gemm.a].init, &s->cvals[la.gemm.a]);
        if (cs) {
            kf_la_anchor_release(&la);
            return cs;
        }
    }
    if (!(st->lib = kf_malloc(sizeof *st->lib))) {
        kf_la_anchor_release(&la);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    *st->lib = la;
    kf_cg_kernel_release(&st->k);
    if (la.has_epilogue) {
        st->k = la.epilogue; /* moved: the step owns it now */
        st->lib->epilogue = (kf_cg_kernel){0};
        st->lib->has_epilogue = false;
    }
    kf_id vals[5];
    kf_la_anchor_values(&la, vals);
    for (int i = 0; i < 4; i++)
        if (vals[i]) s->dev_read[vals[i]] = true;
    if (e->o.trace && la.is_conv)
        fprintf(e->o.trace, "kfuse: backend: group %u: library conv %lldx%lld -> %lld channels (%d-D)%s%s\n", st->group,
                (long long)la.conv.n, (long long)la.conv.c, (long long)la.conv.k, la.conv.nspatial,
                la.conv.z ? " adding the residual" : "", la.has_epilogue ? " + epilogue kernel" : "");
    else if (e->o.trace)
        fprintf(e->o.trace, "kfuse: backend: group %u: library GEMM %lldx%lldx%lld (batch %lld)%s%s%s%s\n", st->group,
                (long long)la.gemm.m, (long long)la.gemm.n, (long long)la.gemm.k, (long long)la.gemm.batch,
                la.gemm.a_dtype ? " on " : "", la.gemm.a_dtype ? kf_dtype_name(la.gemm.a_dtype) : "",
                la.gemm.a_dtype ? " weights" : "", la.has_epilogue ? " + epilogue kernel" : "");
    s->stats.launches++; /* the call; an epilogue kernel counts as one more below */
    s->stats.groups_lib++;
    if (!la.has_epilogue) {
        st->kern = STEP_LIB;
        s->stats.groups_dev++;
        *lib_only = true;
    }
    return KF_OK;
}

/* The five buffers of st's call (A, B, C, bias, D; NULL where absent). */
static kf_status run_buf_of(void *r, kf_id v, void **buf);
static kf_status lib_bufs(void *r, const step *st, void *bufs[5]) {
    kf_id v[5];
    kf_la_anchor_values(st->lib, v);
    for (int i = 0; i < 5; i++) {
        bufs[i] = NULL;
        if (v[i]) KF_TRY(run_buf_of(r, v[i], &bufs[i]));
    }
    return KF_OK;
}

/* Generates every group's kernel (or leaves it to ref), finds distinct texts. */
static kf_status make_steps(kf_exec *e, spec *s) {
    const kf_plan *p = s->p;
    const kf_graph *g = s->m->graph;
    if (!(s->steps = kf_calloc((size_t)p->ngroups + 1, sizeof *s->steps)) ||
        !(s->kerns = kf_calloc((size_t)p->ngroups + 1, sizeof *s->kerns)))
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (uint32_t gi = 0; gi < p->ngroups; gi++) {
        const kf_group *gr = &p->groups[gi];
        step *st = &s->steps[s->nsteps++];
        st->group = gi;
        st->kern = -1;
        /* 256 bytes hold codegen's reasons, which name one node or value */
        char why[256];
        const char *reason = gr->kind == KF_GROUP_CONST ? "plan-time constant" : !e->dev ? "backend ref" : NULL;
        if (!reason) {
            /* the kernel itself, not kf_cg_unsupported: that answers an
             * allocation failure with a reason, which would quietly move
             * the group to the reference evaluator; here out of memory
             * fails the compile */
            kf_status cst = kf_cg_group(s->m, p, gi, &st->k);
            if (cst == KF_ERR_UNSUPPORTED) {
                const char *m = kf_last_error(), *c = strncmp(m, "group ", 6) ? NULL : strstr(m, ": ");
                snprintf(why, sizeof why, "%s", c ? c + 2 : m); /* the reason without "group N: " */
                kf_clear_error();
                reason = why;
            } else if (cst) {
                return cst;
            }
        }
        /* an anchor the library takes runs there, also when codegen declined
         * it, unless the plan's estimate puts it on its generated kernel (a
         * small float GEMM, where the call's fixed cost dominates:
         * fusion/cost.c) and that kernel was generated */
        bool lib_only = false, generated = !reason && gr->est_lib_us > 0;
        if (generated && gr->kind == KF_GROUP_ANCHOR && e->dev && e->dev->lib && e->o.trace)
            fprintf(e->o.trace, "kfuse: backend: group %u: generated, not the library: %s estimated %.1f us, the call %.1f us\n",
                    gi, st->k.name ? st->k.name : gr->est_form, gr->est_us, gr->est_lib_us);
        if (gr->kind == KF_GROUP_ANCHOR && e->dev && !generated) {
            KF_TRY(lib_step(e, s, st, &lib_only));
            if (st->lib) reason = NULL;
        }
        if (e->o.trace) /* a generated group names its kernel */
            fprintf(e->o.trace, "kfuse: backend: group %u (%s, %u nodes, first '%s'): %s%s%s%s\n", gi,
                    kind_name(gr->kind), gr->nnodes, gr->nnodes ? kf_node_label(&g->nodes[gr->nodes[0]]) : "-",
                    reason ? "ref: " : e->dev->name, reason ? reason : st->lib ? " (library call)" : " (generated)",
                    !reason && !st->lib && st->k.name ? " " : "", !reason && !st->lib && st->k.name ? st->k.name : "");
        if (reason) {
            if (gr->kind == KF_GROUP_CONST) {
                /* known before anything runs: computed once here; a group
                 * that turns out to need run-time data stays a ref step */
                if (run_ref_group(NULL, s, gr, s->cvals) == KF_OK) {
                    st->kern = STEP_CONST;
                    continue;
                }
                kf_clear_error();
            }
            s->has_ref = true;
            if (!(st->host_why = kf_strdup(reason))) return kf_fail(KF_ERR_NOMEM, "out of memory");
            s->stats.groups_ref++;
            if (e->o.host_steps && e->dev && gr->nnodes) {
                const kf_node *n = &g->nodes[gr->nodes[0]];
                char named[288]; /* "node '<label>': ", which the line already says */
                snprintf(named, sizeof named, "node '%s': ", kf_node_label(n));
                const char *r = strncmp(reason, named, strlen(named)) ? reason : reason + strlen(named);
                fprintf(e->o.host_steps, "kfuse: host step: node '%s' (%s", kf_node_label(n), n->op_type);
                if (gr->nnodes > 1) fprintf(e->o.host_steps, " and %u more", gr->nnodes - 1);
                fprintf(e->o.host_steps, "): %s\n", r);
            }
            continue;
        }
        if (lib_only) continue;
        if (gr->view && view_aliases(s, gr)) {
            kf_cg_kernel_release(&st->k);
            st->kern = STEP_ALIAS;
            s->stats.groups_dev++; /* on the device, with nothing to launch */
            continue;
        }
        char *src;
        KF_TRY(kf_cg_source(&st->k, e->dev->target, &src));
        uint32_t u = 0;
        while (u < s->nkerns && strcmp(s->kerns[u].src, src) != 0) u++;
        if (u == s->nkerns) {
            if (!(s->kerns[u].entry = kf_strdup(st->k.name))) {
                kf_free(src);
                return kf_fail(KF_ERR_NOMEM, "out of memory");
            }
            s->kerns[u].src = src;
            s->nkerns++;
        } else
            kf_free(src);
        st->kern = (int)u;
        s->stats.groups_dev++;
        s->stats.launches++;
        for (uint32_t i = 0; i < st->k.nins; i++) s->dev_read[st->k.ins[i].value] = true;
    }
    for (uint32_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kern == STEP_CONST) s->stats.groups_ref++;
    KF_TRY(batch_steps(e, s));
    s->stats.kernels_unique = s->nkerns;
    return KF_OK;
}

/* Uploads, once, every weight and plan-time constant a kernel reads. */
static kf_status upload_weights(kf_exec *e, spec *s) {
    kf_dev *d = e->dev;
    const kf_graph *g = s->m->graph;
    void *stream = NULL;
    KF_TRY(d->stream_new(d, &stream));
    kf_status st = KF_OK;
    for (kf_id v = 1; v <= g->nvalues && !st; v++) {
        if (!s->dev_read[v]) continue;
        const kf_tensor *t = (s->cvals[v].data || s->cvals[v].dtype) ? &s->cvals[v] : g->values[v].init;
        if (!t) continue;
        size_t n = (size_t)t->numel * kf_dtype_size(t->dtype);
        if (!(st = d->alloc(d, n, &s->wbufs[v]))) st = host_upload(d, stream, s->wbufs[v], t->data, n, "weight");
    }
    bool checks = false;
    for (uint32_t i = 0; i < s->nsteps; i++) checks |= s->steps[i].kern >= 0 && s->steps[i].k.nchecks;
    static const int32_t zero[KF_CG_ERR_INTS];
    if (!st && checks && d->copy && !(st = d->alloc(d, sizeof zero, &s->zeros)))
        st = host_upload(d, stream, s->zeros, zero, sizeof zero, "zero words");
    if (!st) st = host_sync(d, stream, "weights uploaded");
    d->stream_free(d, stream);
    return st;
}

/* A copy of the model specialised to input types t (per exec input; rank
 * -1 = as declared) and optimized; *out is the caller's. Specialised
 * first, then optimized: with static input dims, Shape and the arithmetic
 * on it fold away and every shape is known. */
static kf_status specialise(const kf_exec *e, const kf_type *t, kf_model **out) {
    kf_model *m = NULL;
    KF_TRY(kf_model_load_memory(e->base_bytes, e->base_len, e->base_dir, &m));
    kf_graph *g = m->graph;
    for (uint32_t i = 0; i < e->nin; i++) {
        kf_id v = e->in_ids[i];
        if (v && t[i].rank >= 0) g->values[v].type = t[i];
    }
    kf_status st = KF_OK;
    if (e->o.optimize) {
        kf_opt_options oo;
        kf_opt_options_default(&oo);
        oo.fold_cap_bytes = KF_EXEC_FOLD_CAP_BYTES;
        oo.keep_quantized = kf_precision_keeps_quantized(e->o.precision);
        oo.pattern_files = (const char *const *)e->patterns;
        oo.npattern_files = e->o.npattern_files;
        kf_opt_result res;
        memset(&res, 0, sizeof res);
        st = kf_optimize(m, &oo, &res);
        kf_rules_free(&res.rules);
        if (!st && m->graph->noutputs != e->nout)
            st = kf_fail(KF_ERR_INTERNAL, "the optimizer changed the graph outputs (%u -> %u)", e->nout,
                         m->graph->noutputs);
    }
    if (st) {
        kf_model_free(m);
        return st;
    }
    *out = m;
    return KF_OK;
}

/* Builds the spec for input types t (per exec input; rank -1 = as declared). */
static kf_status spec_build(kf_exec *e, const kf_type *t, spec **out) {
    spec *s = kf_calloc(1, sizeof *s);
    if (!s) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = KF_OK;
    if (!(s->in_types = kf_calloc((size_t)e->nin + 1, sizeof(kf_type)))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st) memcpy(s->in_types, t, e->nin * sizeof(kf_type));
    if (!st) st = specialise(e, t, &s->m);
    if (!st && !(s->in_ids = kf_calloc((size_t)e->nin + 1, sizeof(kf_id)))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st) {
        const kf_graph *g = s->m->graph;
        for (uint32_t i = 0; !st && i < e->nin; i++) {
            /* the optimizer may drop an unused input; ids differ after loading */
            kf_id v = e->in_ids[i] ? kf_graph_find(g, e->in_names[i]) : 0;
            s->in_ids[i] = v && !g->values[v].init ? v : 0;
        }
    }
    if (!st) st = kf_precision_passes(s->m, e->o.precision, KF_EXEC_FOLD_CAP_BYTES, e->o.trace);
    if (!st) {
        kf_plan_options po;
        kf_plan_options_default(&po);
        if (e->o.target) po.target = e->o.target;
        else if (!po.target) po.target = KF_PLAN_DEFAULT_TARGET;
        if (e->o.fusion != KF_SWITCH_DEFAULT) po.disable = e->o.fusion == KF_SWITCH_OFF;
        po.math = e->o.precision == KF_PRECISION_TF32 ? KF_MATH_TF32 : KF_MATH_FP32;
        po.no_library = !e->dev || !e->dev->lib;
        st = kf_plan_build(s->m, &po, &s->p);
    }
    uint32_t nv = s->m ? s->m->graph->nvalues : 0;
    if (!st && (!(s->cvals = kf_calloc((size_t)nv + 1, sizeof(kf_tensor))) ||
                !(s->wbufs = kf_calloc((size_t)nv + 1, sizeof(void *))) ||
                !(s->dev_read = kf_calloc((size_t)nv + 1, sizeof(bool)))))
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
    s->stats.live_lower_bound = -1;
    if (!st && e->dev) {
        /* intermediates whose size is only known at run time (NonZero...)
         * cannot be packed; then every value gets its own buffer */
        int64_t align = e->dev->align > KF_MEMPLAN_ALIGN ? (int64_t)e->dev->align : KF_MEMPLAN_ALIGN;
        if (kf_memplan_build(s->m, s->p, align, &s->mp) == KF_OK) {
            s->stats.arena_bytes = s->mp.arena_bytes;
            s->stats.live_lower_bound = s->mp.live_lower_bound;
        } else
            kf_clear_error();
    }
    if (!st) st = make_steps(e, s);
    if (!st && e->dev) st = compile_all(e, s);
    if (!st && e->dev && e->dev->can_run) st = upload_weights(e, s);
    s->stats.cuda_graph = e->dev && e->dev->capture_begin && !s->has_ref && s->stats.launches > 0;
    if (st) {
        spec_free(e, s);
        return st;
    }
    *out = s;
    return KF_OK;
}

static bool types_equal(const kf_type *a, const kf_type *b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        if (a[i].rank != b[i].rank || a[i].dtype != b[i].dtype) return false;
        for (int d = 0; d < a[i].rank; d++)
            if (a[i].dims[d] != b[i].dims[d]) return false;
    }
    return true;
}

/* The spec for types t, built when new. Holds e->mu while building, so a
 * shape set compiles once even when many threads meet it together. */
static kf_status spec_get(kf_exec *e, const kf_type *t, spec **out) {
    pthread_mutex_lock(&e->mu);
    kf_status st = KF_OK;
    spec *s = NULL;
    for (uint32_t i = 0; i < e->nspecs && !s; i++)
        if (types_equal(e->specs[i]->in_types, t, e->nin)) s = e->specs[i];
    if (!s && e->nspecs >= KF_EXEC_MAX_SPECS)
        st = kf_fail(KF_ERR_INVALID_ARG, "more than %d distinct input shape sets for one compiled model",
                     KF_EXEC_MAX_SPECS);
    if (!s && !st) {
        spec **grown = kf_realloc(e->specs, (e->nspecs + 1) * sizeof *grown);
        if (!grown) st = kf_fail(KF_ERR_NOMEM, "out of memory");
        else {
            e->specs = grown;
            if (!(st = spec_build(e, t, &s))) {
                e->specs[e->nspecs++] = s;
                e->last = s->stats;
            }
        }
    }
    pthread_mutex_unlock(&e->mu);
    *out = s;
    return st;
}

/* ---- create ------------------------------------------------------------- */

static kf_status copy_names(const kf_graph *g, const kf_id *ids, uint32_t n, char ***out) {
    if (!(*out = kf_calloc((size_t)n + 1, sizeof(char *)))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++)
        if (!((*out)[i] = kf_strdup(g->values[ids[i]].name))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    return KF_OK;
}

/* All inputs' declared types, when every one is static; else false. */
static bool declared_static(const kf_exec *e, kf_type *t) {
    const kf_graph *g = e->base->graph;
    for (uint32_t i = 0; i < e->nin; i++) {
        t[i].rank = -1;
        if (!e->in_ids[i]) continue;
        t[i] = g->values[e->in_ids[i]].type;
        if (t[i].rank < 0) return false;
        for (int d = 0; d < t[i].rank; d++)
            if (t[i].dims[d] < 0) return false;
    }
    return true;
}

/* The host model of the library (kf_la_dev_host_lib) takes both kinds. */
static bool host_lib_has(kf_dev *d, bool conv) {
    (void)d, (void)conv;
    return true;
}

/* Owned copies of o's pattern files, each loaded once now so that a bad
 * file fails the compile (specs load them again when they are made). */
static kf_status copy_patterns(const kf_exec_options *o, kf_exec *e) {
    e->o.pattern_files = NULL;
    if (o->npattern_files < 0 || (o->npattern_files && !o->pattern_files))
        return kf_fail(KF_ERR_INVALID_ARG, "%d pattern files at %p", o->npattern_files, (const void *)o->pattern_files);
    if (!o->npattern_files) return KF_OK;
    if (!(e->patterns = kf_calloc((size_t)o->npattern_files, sizeof(char *)))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    e->o.npattern_files = 0; /* counts the copies, for kf_exec_free */
    for (int i = 0; i < o->npattern_files; i++) {
        if (!o->pattern_files[i]) return kf_fail(KF_ERR_INVALID_ARG, "pattern file %d is NULL", i);
        if (!(e->patterns[i] = kf_strdup(o->pattern_files[i]))) return kf_fail(KF_ERR_NOMEM, "out of memory");
        e->o.npattern_files = i + 1;
        kf_ruleset rs;
        memset(&rs, 0, sizeof rs);
        kf_status st = kf_rules_load_file(&rs, e->patterns[i]);
        kf_rules_free(&rs);
        KF_TRY(st);
    }
    return KF_OK;
}

/* o's fixed dims bound in the base copy, and recorded per input so runs
 * are checked against them (e->fixed). Names the model lacks are ignored. */
static kf_status fix_dims(const kf_exec_options *o, kf_exec *e) {
    e->o.dims = NULL;
    if (o->ndims < 0 || (o->ndims && !o->dims))
        return kf_fail(KF_ERR_INVALID_ARG, "%d fixed dims at %p", o->ndims, (const void *)o->dims);
    if (!o->ndims) return KF_OK;
    kf_graph *g = e->base->graph;
    if (!(e->fixed = kf_calloc((size_t)e->nin * KF_MAX_RANK + 1, sizeof(int64_t))))
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < (size_t)e->nin * KF_MAX_RANK; k++) e->fixed[k] = -1;
    for (int b = 0; b < o->ndims; b++) {
        const kf_dim *d = &o->dims[b];
        if (!d->name || d->value < 0)
            return kf_fail(KF_ERR_INVALID_ARG, "fixed dim %d: %s=%lld (a name and a size >= 0)", b,
                           d->name ? d->name : "(NULL)", (long long)d->value);
        uint32_t sym = 0;
        for (uint32_t y = 1; y < g->nsyms && !sym; y++)
            if (!strcmp(g->syms[y], d->name)) sym = y;
        if (!sym) continue;
        for (uint32_t i = 0; i < e->nin; i++) {
            const kf_type *t = e->in_ids[i] ? &g->values[e->in_ids[i]].type : NULL;
            for (int k = 0; t && k < t->rank && k < KF_MAX_RANK; k++)
                if (t->dims[k] < 0 && t->syms[k] == sym) e->fixed[(size_t)i * KF_MAX_RANK + k] = d->value;
        }
        KF_TRY(kf_graph_bind_sym(g, d->name, d->value));
    }
    return KF_OK;
}

static kf_status create(const kf_model *m, const kf_exec_options *o, kf_exec *e) {
    e->o = *o;
    if (o->target) {
        if (strlen(o->target) >= sizeof e->target)
            return kf_fail(KF_ERR_INVALID_ARG, "target name or path longer than %zu bytes", sizeof e->target - 1);
        memcpy(e->target, o->target, strlen(o->target) + 1);
        e->o.target = e->target;
    }
    KF_TRY(copy_patterns(o, e));
    if ((unsigned)o->precision >= KF_PRECISION_COUNT) {
        kf_precision p;
        KF_TRY(kf_precision_from_env(&p)); /* the environment's bad value, named */
        return kf_fail(KF_ERR_INVALID_ARG, "precision %d (fp32, tf32, fp16, bf16, int8, int8-fp16, fp8)", (int)o->precision);
    }
    if (o->backend == KF_EXEC_OPENCL) KF_TRY(kf_cl_dev_open(o->device, &e->dev));
    else if (o->backend == KF_EXEC_CUDA) KF_TRY(kf_cu_dev_open(o->arch, o->compile_only, o->device, &e->dev));
    else if (o->backend != KF_EXEC_REF) return kf_fail(KF_ERR_INVALID_ARG, "unknown backend %d", (int)o->backend);
    if (e->dev && o->compile_only) e->dev->can_run = false; /* nothing is loaded or uploaded */
    if (e->dev) e->dev->lib_workspace = o->lib_workspace;
    /* the host model of the library call (tests, bisecting): it downloads
     * and syncs, so never on a device whose runs are captured */
    if (e->dev && !e->dev->lib && !e->dev->capture_begin && env_has("KFUSE_LIBANCHOR_HOST", "1"))
        e->dev->lib = kf_la_dev_host_lib, e->dev->lib_has = host_lib_has;
    if (e->dev) {
        kf_status cst = kf_cache_open(o->cache_dir, &e->cache);
        if (!e->cache) return cst;
        if (cst) kf_clear_error(); /* no folder: a memory-only cache still works */
    }
    /* the copy: save and load (the loader is the one deep-copy of a model) */
    void *bytes = NULL;
    size_t len = 0;
    KF_TRY(kf_model_save_memory(m, &bytes, &len));
    e->base_bytes = bytes, e->base_len = len;
    KF_TRY(kf_model_load_memory(bytes, len, m->dir, &e->base));
    if (m->dir && !(e->base_dir = kf_strdup(m->dir))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_id *ids = NULL;
    uint32_t n = 0;
    KF_TRY(kf_graph_real_inputs(e->base->graph, &ids, &n));
    e->nin = n;
    kf_status st = copy_names(e->base->graph, ids, n, &e->in_names);
    kf_free(ids);
    KF_TRY(st);
    const kf_graph *g = e->base->graph;
    e->nout = g->noutputs;
    KF_TRY(copy_names(g, g->outputs, g->noutputs, &e->out_names));
    if (!(e->in_ids = kf_calloc((size_t)e->nin + 1, sizeof(kf_id)))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < e->nin; i++) e->in_ids[i] = kf_graph_find(g, e->in_names[i]);
    KF_TRY(fix_dims(o, e));
    kf_type *t = kf_calloc((size_t)e->nin + 1, sizeof(kf_type));
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    spec *s;
    st = declared_static(e, t) ? spec_get(e, t, &s) : KF_OK;
    kf_free(t);
    return st;
}

kf_status kf_exec_create(const kf_model *m, const kf_exec_options *o, kf_exec **out) {
    if (!m || !out) return kf_fail(KF_ERR_INVALID_ARG, "kf_exec_create: NULL argument");
    *out = NULL;
    kf_exec_options def;
    if (!o) kf_exec_options_default(&def), o = &def;
    kf_exec *e = kf_calloc(1, sizeof *e);
    if (!e) return kf_fail(KF_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    kf_status st = create(m, o, e);
    if (st) {
        kf_exec_free(e);
        return st;
    }
    *out = e;
    return KF_OK;
}

void kf_exec_free(kf_exec *e) {
    if (!e) return;
    for (uint32_t i = 0; i < e->nspecs; i++) spec_free(e, e->specs[i]);
    kf_free(e->specs);
    for (uint32_t i = 0; e->in_names && i < e->nin; i++) kf_free(e->in_names[i]);
    for (uint32_t i = 0; e->out_names && i < e->nout; i++) kf_free(e->out_names[i]);
    kf_free(e->in_names);
    kf_free(e->out_names);
    kf_free(e->in_ids);
    for (int i = 0; e->patterns && i < e->o.npattern_files; i++) kf_free(e->patterns[i]);
    kf_free(e->patterns);
    kf_free(e->fixed);
    free(e->base_bytes);
    kf_free(e->base_dir);
    kf_model_free(e->base);
    kf_cache_close(e->cache);
    if (e->dev) e->dev->close(e->dev);
    pthread_mutex_destroy(&e->mu);
    kf_free(e);
}

uint32_t kf_exec_num_inputs(const kf_exec *e) { return e->nin; }
const char *kf_exec_input_name(const kf_exec *e, uint32_t i) { return i < e->nin ? e->in_names[i] : NULL; }
const kf_type *kf_exec_input_type(const kf_exec *e, uint32_t i) {
    return i < e->nin ? &e->base->graph->values[e->in_ids[i]].type : NULL;
}
uint32_t kf_exec_num_outputs(const kf_exec *e) { return e->nout; }
const char *kf_exec_output_name(const kf_exec *e, uint32_t i) { return i < e->nout ? e->out_names[i] : NULL; }
kf_exec_backend kf_exec_get_backend(const kf_exec *e) { return e->o.backend; }

void kf_exec_get_stats(const kf_exec *e, kf_exec_stats *st) {
    pthread_mutex_lock((pthread_mutex_t *)&e->mu);
    *st = e->last;
    st->device_replays = e->device_replays;
    st->body_runs = e->body_runs;
    pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
}

uint32_t kf_exec_num_specs(kf_exec *e) {
    pthread_mutex_lock(&e->mu);
    uint32_t n = e->nspecs;
    pthread_mutex_unlock(&e->mu);
    return n;
}

kf_status kf_exec_prepare(kf_exec *e, const kf_type *types, uint32_t ntypes, kf_exec_stats *st) {
    if (ntypes != e->nin)
        return kf_fail(KF_ERR_INVALID_ARG, "the model has %u inputs, %u shapes were given", e->nin, ntypes);
    spec *s;
    KF_TRY(spec_get(e, types, &s));
    if (st) *st = s->stats;
    return KF_OK;
}

/* ---- run ---------------------------------------------------------------- */

/* Per-run host state. */
typedef struct run {
    kf_exec *e;
    spec *s;
    slot *sl;
    double device_s;  /* launches to completion when every group is a kernel, else -1 */
    kf_tensor *vals;  /* host copies made this run (owned) */
    bool *dvalid;     /* the device buffer holds the value */
    void *stream;     /* where launches go: the slot's own stream, or the caller's */
    void **ext;       /* per value: the caller's device buffer (device-side runs), or NULL */
} run;

static kf_status slot_get(kf_exec *e, spec *s, slot **out) {
    pthread_mutex_lock(&e->mu);
    slot *sl = s->free_slots;
    if (sl) s->free_slots = sl->next;
    pthread_mutex_unlock(&e->mu);
    if (!sl) {
        kf_dev *d = e->dev;
        uint32_t nv = s->m->graph->nvalues;
        if (!(sl = kf_calloc(1, sizeof *sl)) || !(sl->bufs = kf_calloc((size_t)nv + 1, sizeof(void *))) ||
            !(sl->own = kf_calloc((size_t)nv + 1, sizeof(bool)))) {
            if (sl) kf_free(sl->bufs);
            kf_free(sl);
            return kf_fail(KF_ERR_NOMEM, "out of memory");
        }
        kf_status st = d->stream_new(d, &sl->stream);
        if (!st && s->mp.offset) st = d->alloc(d, (size_t)s->mp.arena_bytes, &sl->arena);
        for (uint32_t i = 0; !st && i < s->nsteps; i++) {
            if (s->steps[i].kern < 0 || !s->steps[i].k.nchecks) continue;
            if (!sl->errb && !(sl->errb = kf_calloc(s->nsteps, sizeof(void *)))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
            else st = d->alloc(d, KF_CG_ERR_INTS * sizeof(int32_t), &sl->errb[i]);
        }
        if (st) {
            slot_free(d, s, sl);
            return st;
        }
    }
    sl->next = NULL;
    *out = sl;
    return KF_OK;
}

static void slot_put(kf_exec *e, spec *s, slot *sl) {
    pthread_mutex_lock(&e->mu);
    sl->next = s->free_slots;
    s->free_slots = sl;
    pthread_mutex_unlock(&e->mu);
}

/* The device buffer of v in this run (made on first use). */
static kf_status buf_of(run *r, kf_id v, void **buf) {
    kf_dev *d = r->e->dev;
    if (r->ext && r->ext[v]) return *buf = r->ext[v], KF_OK;
    if (r->s->wbufs[v]) return *buf = r->s->wbufs[v], KF_OK;
    slot *sl = r->sl;
    if (!sl->bufs[v]) {
        int64_t n = value_bytes(r->s->m->graph, v);
        if (n < 0)
            return kf_fail(KF_ERR_SHAPE, "value '%s' has no static size for a device buffer", r->s->m->graph->values[v].name);
        const kf_memplan *mp = &r->s->mp;
        if (mp->offset && v <= mp->nvalues && mp->offset[v] >= 0) {
            KF_TRY(d->view(d, sl->arena, (size_t)mp->offset[v], (size_t)n, &sl->bufs[v]));
        } else {
            KF_TRY(d->alloc(d, (size_t)n, &sl->bufs[v]));
            sl->own[v] = true;
        }
    }
    *buf = sl->bufs[v];
    return KF_OK;
}

/* Makes the device copy of v current (weights always are). */
static kf_status to_dev(run *r, kf_id v) {
    if (r->dvalid[v] || r->s->wbufs[v]) return KF_OK;
    const kf_tensor *t = host_of(r->s, r->vals, v);
    if (!t) return missing(r->s->m->graph, v, "kernel");
    void *b;
    KF_TRY(buf_of(r, v, &b));
    KF_TRY(host_upload(r->e->dev, r->stream, b, t->data, (size_t)t->numel * kf_dtype_size(t->dtype),
                       r->s->m->graph->values[v].name));
    r->dvalid[v] = true;
    return KF_OK;
}

/* Makes the host copy of v current. */
static kf_status to_host(run *r, kf_id v) {
    if (!r->dvalid[v] || r->vals[v].data || r->vals[v].dtype) return KF_OK;
    const kf_type *t = &r->s->m->graph->values[v].type;
    KF_TRY(kf_tensor_alloc(&r->vals[v], t->dtype, t->rank, t->dims));
    void *b;
    KF_TRY(buf_of(r, v, &b));
    return host_download(r->e->dev, r->stream, b, r->vals[v].data, (size_t)r->vals[v].numel * kf_dtype_size(t->dtype),
                         r->s->m->graph->values[v].name);
}

static kf_status run_buf_of(void *r, kf_id v, void **buf) { return buf_of(r, v, buf); }

/* Launches st: its library call first, if any, then its kernel, if any. */
static kf_status launch(run *r, const step *st) {
    kf_dev *d = r->e->dev;
    if (st->lib) {
        void *lb[5];
        KF_TRY(lib_bufs(r, st, lb));
        KF_TRY(d->lib(d, r->stream, st->lib, lb));
        if (st->kern < 0) return KF_OK;
    }
    void *bufs[KF_CG_MAX_PARAMS + 1];
    const kf_cg_kernel *k = &st->k;
    if (k->nins + k->nouts > KF_CG_MAX_PARAMS)
        return kf_fail(KF_ERR_INTERNAL, "kernel %s has %u parameters", k->name, k->nins + k->nouts);
    if (k->min_block && k->block < k->min_block)
        return kf_fail(KF_ERR_INTERNAL, "kernel %s launched with %u work-items, its body needs %u", k->name, k->block,
                       k->min_block);
    for (uint32_t i = 0; i < k->nins; i++) KF_TRY(buf_of(r, k->ins[i].value, &bufs[i]));
    for (uint32_t o = 0; o < k->nouts; o++) KF_TRY(buf_of(r, k->outs[o].value, &bufs[k->nins + o]));
    uint32_t nb = k->nins + k->nouts;
    if (k->nchecks) bufs[nb++] = r->sl->errb[st - r->s->steps];
    return d->launch(d, r->stream, r->s->kerns[st->kern].handle, bufs, nb, k->numel, k->block);
}

/* Before a run: every index-checking kernel's kf_err zeroed (on the run's
 * stream, ahead of its launches). */
static kf_status errs_zero(kf_dev *d, const spec *s, slot *sl, void *stream) {
    static const int32_t zero[KF_CG_ERR_INTS];
    for (uint32_t i = 0; sl->errb && i < s->nsteps; i++)
        if (sl->errb[i]) KF_TRY(host_upload(d, stream, sl->errb[i], zero, sizeof zero, "index checks cleared"));
    return KF_OK;
}

static kf_status errs_clear(run *r) { return errs_zero(r->e->dev, r->s, r->sl, r->stream); }

/* errs_zero on the device, enqueued on stream without waiting: a bound
 * slot's kf_err words (kf_exec_run_device, kf_exec_sync). */
static kf_status errs_zero_async(kf_dev *d, const spec *s, slot *sl, void *stream) {
    for (uint32_t i = 0; sl->errb && i < s->nsteps; i++)
        if (sl->errb[i]) KF_TRY(d->copy(d, stream, sl->errb[i], s->zeros, KF_CG_ERR_INTS * sizeof(int32_t)));
    return KF_OK;
}

/* The first bad index a kernel of slot sl met fails the run as the
 * reference evaluator does, naming the node (kf_cg_check). */
static kf_status errs_read(kf_dev *d, const spec *s, slot *sl, void *stream) {
    for (uint32_t i = 0; sl->errb && i < s->nsteps; i++) {
        if (!sl->errb[i]) continue;
        int32_t e[KF_CG_ERR_INTS];
        KF_TRY(host_download(d, stream, sl->errb[i], e, sizeof e, "index checks"));
        if (!e[0]) continue;
        const kf_cg_kernel *k = &s->steps[i].k;
        if (e[0] < 0 || (uint32_t)e[0] > k->nchecks)
            return kf_fail(KF_ERR_INTERNAL, "kernel %s reported index check %d of %u", k->name, e[0], k->nchecks);
        const kf_cg_check *c = &k->checks[e[0] - 1];
        int64_t v = (int64_t)(((uint64_t)(uint32_t)e[2] << 32) | (uint32_t)e[1]);
        return kf_node_fail(&s->m->graph->nodes[c->node], KF_ERR_RUNTIME,
                            "index %lld is out of range for a dimension of size %lld", (long long)v, (long long)c->dim);
    }
    return KF_OK;
}

static kf_status errs_check(run *r) { return errs_read(r->e->dev, r->s, r->sl, r->stream); }

/* Every step in order, moving data where it is needed. */
static kf_status run_steps(run *r) {
    const kf_plan *p = r->s->p;
    const kf_graph *g = r->s->m->graph;
    /* all-kernel plans: inputs go up first, so the timed part is launches */
    bool timed = r->e->dev && !r->s->has_ref;
    for (uint32_t i = 0; timed && i < r->e->nin; i++)
        if (r->s->in_ids[i] && r->s->dev_read[r->s->in_ids[i]]) KF_TRY(to_dev(r, r->s->in_ids[i]));
    if (timed) KF_TRY(host_sync(r->e->dev, r->stream, "inputs uploaded"));
    double t0 = now_s();
    for (uint32_t i = 0; i < r->s->nsteps; i++) {
        const step *st = &r->s->steps[i];
        if (st->kern == STEP_CONST || st->kern == STEP_BATCHED) continue;
        const kf_group *gr = &p->groups[st->group];
        if (st->kern == STEP_ALIAS && r->dvalid[view_source(g, gr)]) {
            /* same arena bytes under a new shape: the outputs are current */
            for (uint32_t o = 0; o < gr->noutputs; o++) r->dvalid[gr->outputs[o]] = true;
            continue;
        }
        if (st->kern >= 0 || st->kern == STEP_LIB) {
            kf_id lv[5] = {0, 0, 0, 0, 0}; /* the library call's buffers; lv[4] it writes */
            if (st->lib) kf_la_anchor_values(st->lib, lv);
            for (int j = 0; j < 4; j++)
                if (lv[j]) KF_TRY(to_dev(r, lv[j]));
            for (uint32_t j = 0; j < st->k.nins; j++)
                if (!st->lib || st->k.ins[j].value != lv[4]) KF_TRY(to_dev(r, st->k.ins[j].value));
            KF_TRY(launch(r, st));
            if (st->lib) {
                r->dvalid[lv[4]] = true;
                kf_tensor_release(&r->vals[lv[4]]);
            }
            for (uint32_t o = 0; o < st->k.nouts; o++) {
                kf_id v = st->k.outs[o].value;
                r->dvalid[v] = true;
                kf_tensor_release(&r->vals[v]);
            }
            continue;
        }
        for (uint32_t k = 0; k < gr->nnodes; k++) {
            const kf_node *n = &g->nodes[gr->nodes[k]];
            for (int j = 0; j < n->nin; j++)
                if (n->in[j]) KF_TRY(to_host(r, n->in[j]));
        }
        KF_TRY(run_ref_group(r->e, r->s, gr, r->vals));
        for (uint32_t k = 0; k < gr->nnodes; k++) {
            const kf_node *n = &g->nodes[gr->nodes[k]];
            for (int j = 0; j < n->nout; j++)
                if (n->out[j]) r->dvalid[n->out[j]] = false;
        }
    }
    if (timed) {
        KF_TRY(host_sync(r->e->dev, r->stream, "run finished"));
        r->device_s = now_s() - t0;
    }
    return KF_OK;
}

/* All launches replayed from one captured graph: inputs go to their
 * buffers first, the graph runs, outputs come back after. */
static kf_status run_graph(run *r) {
    kf_dev *d = r->e->dev;
    slot *sl = r->sl;
    const kf_graph *g = r->s->m->graph;
    for (uint32_t i = 0; i < r->e->nin; i++)
        if (r->s->in_ids[i] && r->s->dev_read[r->s->in_ids[i]]) KF_TRY(to_dev(r, r->s->in_ids[i]));
    /* buffers are made before capture: allocation is not capturable */
    for (uint32_t i = 0; i < r->s->nsteps; i++) {
        const step *st = &r->s->steps[i];
        void *b;
        for (uint32_t j = 0; st->kern >= 0 && j < st->k.nins + st->k.nouts; j++)
            KF_TRY(buf_of(r, j < st->k.nins ? st->k.ins[j].value : st->k.outs[j - st->k.nins].value, &b));
        void *lb[5];
        if (st->lib) KF_TRY(lib_bufs(r, st, lb));
        if (st->lib) KF_TRY(d->lib(d, sl->stream, NULL, lb)); /* the workspace, before capture */
    }
    if (!sl->graph) {
        KF_TRY(d->capture_begin(d, sl->stream));
        kf_status st = KF_OK;
        for (uint32_t i = 0; i < r->s->nsteps && !st; i++)
            if (r->s->steps[i].kern >= 0 || r->s->steps[i].kern == STEP_LIB) st = launch(r, &r->s->steps[i]);
        void *graph = NULL;
        kf_status st2 = d->capture_end(d, sl->stream, &graph);
        KF_TRY(st ? st : st2);
        sl->graph = graph;
    }
    double t0 = now_s();
    KF_TRY(d->replay(d, sl->stream, sl->graph));
    KF_TRY(host_sync(d, sl->stream, "graph replayed"));
    r->device_s = now_s() - t0;
    for (uint32_t i = 0; i < r->s->nsteps; i++) {
        const step *st = &r->s->steps[i];
        for (uint32_t o = 0; st->kern >= 0 && o < st->k.nouts; o++) r->dvalid[st->k.outs[o].value] = true;
        if (st->lib) r->dvalid[st->lib->is_conv ? st->lib->conv.d : st->lib->gemm.d] = true;
        const kf_group *gr = &r->s->p->groups[st->group];
        for (uint32_t o = 0; st->kern == STEP_ALIAS && o < gr->noutputs; o++) r->dvalid[gr->outputs[o]] = true;
    }
    (void)g;
    return KF_OK;
}

kf_status kf_exec_run(kf_exec *e, const kf_tensor *inputs, uint32_t ninputs, kf_tensor *outputs) {
    return kf_exec_run_timed(e, inputs, ninputs, outputs, NULL);
}

/* The types of inputs (e->nin of them) into t, checked against the
 * declared dtypes and the dims the options fixed; with_data: each needs
 * its data. */
static kf_status input_types(const kf_exec *e, const kf_tensor *inputs, bool with_data, kf_type *t) {
    const kf_graph *bg = e->base->graph;
    for (uint32_t i = 0; i < e->nin; i++) {
        t[i].rank = -1;
        kf_id v = e->in_ids[i];
        if (!v) continue;
        if (with_data && !inputs[i].data && inputs[i].numel)
            return kf_fail(KF_ERR_INVALID_ARG, "input '%s' has no data", e->in_names[i]);
        if (inputs[i].dtype != bg->values[v].type.dtype)
            return kf_fail(KF_ERR_INVALID_ARG, "input '%s' is %s, the model declares %s", e->in_names[i],
                           kf_dtype_name(inputs[i].dtype), kf_dtype_name(bg->values[v].type.dtype));
        kf_type_of_tensor(&t[i], &inputs[i]);
        for (int d = 0; e->fixed && d < inputs[i].rank && d < KF_MAX_RANK; d++) {
            int64_t want = e->fixed[(size_t)i * KF_MAX_RANK + d];
            if (want >= 0 && inputs[i].dims[d] != want)
                return kf_fail(KF_ERR_SHAPE, "input '%s': dim %d is %lld, the compile options fixed it at %lld",
                               e->in_names[i], d, (long long)inputs[i].dims[d], (long long)want);
        }
    }
    return KF_OK;
}

kf_status kf_exec_output_types(kf_exec *e, const kf_tensor *inputs, uint32_t ninputs, kf_type *out) {
    if (!e || (ninputs && !inputs) || !out) return kf_fail(KF_ERR_INVALID_ARG, "kf_exec_output_types: NULL argument");
    if (ninputs != e->nin) return kf_fail(KF_ERR_INVALID_ARG, "the model has %u inputs, %u were given", e->nin, ninputs);
    kf_type *t = kf_calloc((size_t)e->nin + 1, sizeof(kf_type));
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = input_types(e, inputs, false, t);
    /* a specialisation made for these shapes already knows */
    bool found = false;
    pthread_mutex_lock(&e->mu);
    for (uint32_t i = 0; !st && i < e->nspecs && !found; i++) {
        const spec *s = e->specs[i];
        if (!types_equal(s->in_types, t, e->nin)) continue;
        const kf_graph *g = s->m->graph;
        for (uint32_t o = 0; o < e->nout; o++) out[o] = g->values[g->outputs[o]].type;
        found = true;
    }
    pthread_mutex_unlock(&e->mu);
    kf_model *m = NULL;
    /* else the copy a plan would start from (specialised, optimized: its
     * shape arithmetic folded), inferred; no kernel is made */
    if (!st && !found) st = specialise(e, t, &m);
    if (!st && !found) st = kf_infer_shapes(m);
    for (uint32_t o = 0; !st && !found && o < e->nout; o++) out[o] = m->graph->values[m->graph->outputs[o]].type;
    kf_model_free(m);
    kf_free(t);
    return st;
}

kf_status kf_exec_run_timed(kf_exec *e, const kf_tensor *inputs, uint32_t ninputs, kf_tensor *outputs,
                            double *device_s) {
    if (device_s) *device_s = -1;
    if (!e || (ninputs && !inputs) || !outputs) return kf_fail(KF_ERR_INVALID_ARG, "kf_exec_run: NULL argument");
    if (ninputs != e->nin) return kf_fail(KF_ERR_INVALID_ARG, "the model has %u inputs, %u were given", e->nin, ninputs);
    kf_type *t = kf_calloc((size_t)e->nin + 1, sizeof(kf_type));
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = input_types(e, inputs, true, t);
    spec *s = NULL;
    if (!st) st = spec_get(e, t, &s);
    kf_free(t);
    KF_TRY(st);
    const kf_graph *g = s->m->graph;
    run r = {e, s, NULL, -1, NULL, NULL, NULL, NULL};
    if (!(r.vals = kf_calloc((size_t)g->nvalues + 1, sizeof(kf_tensor))) ||
        !(r.dvalid = kf_calloc((size_t)g->nvalues + 1, sizeof(bool))))
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st && e->dev && !e->dev->can_run)
        st = kf_fail(KF_ERR_NO_DEVICE, "this plan was compiled only (no %s device to run on)", e->dev->name);
    if (!st && e->dev) st = slot_get(e, s, &r.sl);
    if (r.sl) r.stream = r.sl->stream;
    /* the caller's inputs are read in place: a shallow copy, never released */
    for (uint32_t i = 0; !st && i < e->nin; i++)
        if (s->in_ids[i]) r.vals[s->in_ids[i]] = inputs[i];
    if (!st && r.sl) st = errs_clear(&r);
    if (!st) {
        if (s->stats.cuda_graph && !r.sl->graph_failed) {
            st = run_graph(&r);
            if (st && !r.sl->graph) {
                /* capture refused (old driver): run launch by launch */
                kf_clear_error();
                r.sl->graph_failed = true;
                memset(r.dvalid, 0, (g->nvalues + 1) * sizeof(bool));
                st = KF_OK;
            } else if (!st)
                goto outputs;
        }
        st = run_steps(&r);
    }
outputs:
    if (!st && r.sl) st = errs_check(&r);
    for (uint32_t o = 0; !st && o < g->noutputs; o++) {
        kf_id v = g->outputs[o];
        if ((st = to_host(&r, v))) break;
        const kf_tensor *h = host_of(s, r.vals, v);
        if (!h) st = kf_fail(KF_ERR_BAD_MODEL, "graph output '%s' has no value", g->values[v].name);
        else st = kf_tensor_copy(&outputs[o], h);
    }
    if (st)
        for (uint32_t o = 0; o < g->noutputs; o++) kf_tensor_release(&outputs[o]);
    for (uint32_t i = 0; r.vals && i < e->nin; i++)
        if (s->in_ids[i]) memset(&r.vals[s->in_ids[i]], 0, sizeof(kf_tensor));
    for (uint32_t v = 0; r.vals && v <= g->nvalues; v++) kf_tensor_release(&r.vals[v]);
    kf_free(r.vals);
    kf_free(r.dvalid);
    if (device_s && !st) *device_s = r.device_s;
    if (r.sl) {
        if (st) {
            /* a slot whose stream saw an error is not reused */
            slot_free(e->dev, s, r.sl);
        } else
            slot_put(e, s, r.sl);
    }
    return st;
}

/* ---- device-side runs ----------------------------------------------------
 * kf_exec_run_device enqueues a plan on the caller's stream with graph
 * inputs and outputs in the caller's buffers. Intermediates live in the
 * arena of a slot bound to that stream: later runs on the same stream
 * reuse it safely, because the stream runs them one after the other. A
 * slot is bound for good (the caller's queued work may still use its
 * arena after the call returns), and a stream meets at most as many
 * slots per shape set as threads ever enqueued on it at once.
 *
 *   caller's stream:  [run 1: k0 k1 k2][run 2: k0 k1 k2] ... kf_exec_sync
 *   slot bound to it:  arena, kf_err words (summed up until kf_exec_sync)
 */

/* The host step that keeps plan s from running on the device alone (a
 * reference group; a kernel reading a value only the host has), as
 * KF_ERR_UNSUPPORTED naming its first node; *made: per value, computed
 * on the device or already there (inputs, weights). */
static kf_status device_only(const kf_exec *e, const spec *s, bool *made) {
    const kf_graph *g = s->m->graph;
    for (uint32_t i = 0; i < e->nin; i++)
        if (s->in_ids[i]) made[s->in_ids[i]] = true;
    for (kf_id v = 1; v <= g->nvalues; v++)
        if (s->wbufs[v]) made[v] = true;
    for (uint32_t i = 0; i < s->nsteps; i++) {
        const step *st = &s->steps[i];
        const kf_group *gr = &s->p->groups[st->group];
        if (st->kern == STEP_CONST || st->kern == STEP_BATCHED) continue;
        bool host = st->kern == STEP_REF || (st->kern == STEP_ALIAS && !made[view_source(g, gr)]);
        kf_id lv[5] = {0, 0, 0, 0, 0};
        if (st->lib) kf_la_anchor_values(st->lib, lv);
        for (int j = 0; j < 4 && !host; j++) host = lv[j] && !made[lv[j]];
        for (uint32_t j = 0; st->kern >= 0 && j < st->k.nins && !host; j++)
            host = st->k.ins[j].value != lv[4] && !made[st->k.ins[j].value];
        if (host) {
            const kf_node *n = gr->nnodes ? &g->nodes[gr->nodes[0]] : NULL;
            return kf_fail(KF_ERR_UNSUPPORTED, "kf_run_device: node '%s' (%s) runs on the host in this plan (%s); "
                           "kf_run runs such plans", n ? kf_node_label(n) : "?", n ? n->op_type : "?",
                           st->host_why ? st->host_why : "it reads a value only the host computes");
        }
        if (st->lib) made[lv[4]] = true;
        for (uint32_t o = 0; st->kern >= 0 && o < st->k.nouts; o++) made[st->k.outs[o].value] = true;
        for (uint32_t o = 0; st->kern == STEP_ALIAS && o < gr->noutputs; o++) made[gr->outputs[o]] = true;
    }
    return KF_OK;
}

/* A slot of spec s bound to the caller's stream and free to enqueue with;
 * a new one (its kf_err words zeroed on that stream, ahead of the run)
 * when every one bound there is busy. */
static kf_status dev_slot_get(kf_exec *e, spec *s, void *stream, slot **out) {
    pthread_mutex_lock(&e->mu);
    slot *sl = s->dev_slots;
    while (sl && (sl->bound != stream || sl->busy)) sl = sl->next;
    if (sl) sl->busy = true;
    pthread_mutex_unlock(&e->mu);
    if (sl) return *out = sl, KF_OK;
    KF_TRY(slot_get(e, s, &sl));
    kf_status st = errs_zero_async(e->dev, s, sl, stream);
    if (st) {
        slot_free(e->dev, s, sl);
        return st;
    }
    sl->bound = stream;
    sl->busy = true;
    pthread_mutex_lock(&e->mu);
    sl->next = s->dev_slots;
    s->dev_slots = sl;
    pthread_mutex_unlock(&e->mu);
    *out = sl;
    return KF_OK;
}

static bool same_type(const kf_type *a, const kf_tensor *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->dims[d] != b->dims[d]) return false;
    return true;
}

static void type_text(char *buf, size_t len, kf_dtype dt, int rank, const int64_t *dims) {
    size_t n = (size_t)snprintf(buf, len, "%s[", kf_dtype_name(dt));
    for (int d = 0; d < rank && n < len; d++) n += (size_t)snprintf(buf + n, len - n, d ? ",%lld" : "%lld", (long long)dims[d]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

/* Where each output goes: written by its kernel straight into the
 * caller's buffer (r->ext), or copied there after the launches (*copy_from
 * per output: an input's or a weight's buffer, or an earlier output with
 * the same value). */
static kf_status bind_outputs(run *r, const bool *made, const kf_tensor *outputs, void *const *out_bufs, void **copy_from) {
    const kf_graph *g = r->s->m->graph;
    kf_exec *e = r->e;
    for (uint32_t o = 0; o < e->nout; o++) {
        kf_id v = g->outputs[o];
        const kf_type *t = &g->values[v].type;
        if (!same_type(t, &outputs[o])) {
            char want[160], got[160]; /* 8 dims of 20 digits */
            type_text(want, sizeof want, t->dtype, t->rank, t->dims);
            type_text(got, sizeof got, outputs[o].dtype, outputs[o].rank, outputs[o].dims);
            return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: output '%s' is %s for these inputs, its buffer is described as %s",
                           e->out_names[o], want, got);
        }
        copy_from[o] = NULL;
        if (r->ext[v] || r->s->wbufs[v]) {
            copy_from[o] = r->ext[v] ? r->ext[v] : r->s->wbufs[v];
        } else if (made[v]) {
            r->ext[v] = out_bufs[o];
        } else {
            return kf_fail(KF_ERR_UNSUPPORTED,
                           "kf_run_device: output '%s' is a constant of the plan that no kernel computes; kf_run returns it",
                           e->out_names[o]);
        }
    }
    return KF_OK;
}

/* Every launch of a device-side run, then the output copies, on r's stream. */
static kf_status enqueue_all(run *r, void *const *out_bufs, void *const *copy_from) {
    const spec *s = r->s;
    const kf_graph *g = s->m->graph;
    for (uint32_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kern >= 0 || s->steps[i].kern == STEP_LIB) KF_TRY(launch(r, &s->steps[i]));
    for (uint32_t o = 0; o < r->e->nout; o++)
        if (copy_from[o])
            KF_TRY(r->e->dev->copy(r->e->dev, r->stream, out_bufs[o], copy_from[o], (size_t)value_bytes(g, g->outputs[o])));
    return KF_OK;
}

/* A device-side run's launches. Where the device captures graphs, a slot
 * keeps one captured with the caller's buffers: a run with the same
 * buffers as the run before it (serving runtimes bind theirs once) is
 * captured, and later runs with those buffers replay it, one call in
 * place of a launch per kernel. Other buffers are launched one by one
 * (a graph holds its pointers), and so is everything on a stream that
 * cannot be captured or that the caller is capturing itself (the
 * launches then join the caller's graph). A capture the driver refuses
 * falls back to launches for good on this slot; nothing captured ran. */
static kf_status device_launches(run *r, void *const *in_bufs, void *const *out_bufs, void *const *copy_from) {
    kf_exec *e = r->e;
    kf_dev *d = e->dev;
    slot *sl = r->sl;
    uint32_t n = e->nin + e->nout;
    if (!d->capture_begin || !d->can_capture || sl->graph_failed || !d->can_capture(d, r->stream))
        return enqueue_all(r, out_bufs, copy_from);
    bool same = sl->gptrs != NULL;
    for (uint32_t i = 0; same && i < n; i++) same = sl->gptrs[i] == (i < e->nin ? in_bufs[i] : out_bufs[i - e->nin]);
    if (same && sl->graph) {
        KF_TRY(d->replay(d, r->stream, sl->graph));
        pthread_mutex_lock(&e->mu);
        e->device_replays++;
        pthread_mutex_unlock(&e->mu);
        return KF_OK;
    }
    if (!same) {
        if (sl->graph) d->graph_free(d, sl->graph);
        sl->graph = NULL;
        if (!sl->gptrs && !(sl->gptrs = kf_calloc((size_t)n + 1, sizeof(void *))))
            return kf_fail(KF_ERR_NOMEM, "out of memory");
        for (uint32_t i = 0; i < n; i++) sl->gptrs[i] = i < e->nin ? in_bufs[i] : out_bufs[i - e->nin];
        return enqueue_all(r, out_bufs, copy_from);
    }
    /* the same buffers twice in a row: every buffer and workspace the
     * launches need was made by the run before, so nothing allocates
     * during the capture */
    void *graph = NULL;
    kf_status st = d->capture_begin(d, r->stream);
    if (!st) {
        st = enqueue_all(r, out_bufs, copy_from);
        kf_status st2 = d->capture_end(d, r->stream, &graph);
        if (!st) st = st2;
    }
    if (st) {
        if (graph) d->graph_free(d, graph);
        kf_clear_error();
        sl->graph_failed = true;
        return enqueue_all(r, out_bufs, copy_from);
    }
    sl->graph = graph;
    KF_TRY(d->replay(d, r->stream, graph));
    pthread_mutex_lock(&e->mu);
    e->device_replays++;
    pthread_mutex_unlock(&e->mu);
    return KF_OK;
}

kf_status kf_exec_run_device(kf_exec *e, void *stream, const kf_tensor *inputs, void *const *in_bufs,
                             uint32_t ninputs, const kf_tensor *outputs, void *const *out_bufs, uint32_t noutputs) {
    if (!e || (ninputs && (!inputs || !in_bufs)) || (noutputs && (!outputs || !out_bufs)))
        return kf_fail(KF_ERR_INVALID_ARG, "kf_run_device: NULL argument");
    if (!e->dev) return kf_fail(KF_ERR_UNSUPPORTED, "kf_run_device: backend ref runs on the host; kf_run runs it");
    if (!e->dev->can_run)
        return kf_fail(KF_ERR_NO_DEVICE, "this plan was compiled only (no %s device to run on)", e->dev->name);
    if (ninputs != e->nin) return kf_fail(KF_ERR_INVALID_ARG, "the model has %u inputs, %u were given", e->nin, ninputs);
    if (noutputs != e->nout)
        return kf_fail(KF_ERR_INVALID_ARG, "the model has %u outputs, %u were given", e->nout, noutputs);
    kf_dev *d = e->dev;
    KF_TRY(d->stream_check(d, stream));
    for (uint32_t i = 0; d->buf_check && i < e->nin + e->nout; i++) {
        bool in = i < e->nin;
        const kf_tensor *bt = in ? &inputs[i] : &outputs[i - e->nin];
        if (d->buf_check(d, in ? in_bufs[i] : out_bufs[i - e->nin], (size_t)bt->numel * kf_dtype_size(bt->dtype)))
            return kf_fail_context(KF_ERR_INVALID_ARG, "kf_run_device: %s '%s'", in ? "input" : "output",
                                   in ? e->in_names[i] : e->out_names[i - e->nin]);
    }
    kf_type *t = kf_calloc((size_t)e->nin + 1, sizeof(kf_type));
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_status st = input_types(e, inputs, false, t);
    spec *s = NULL;
    if (!st) st = spec_get(e, t, &s);
    kf_free(t);
    KF_TRY(st);
    const kf_graph *g = s->m->graph;
    run r = {e, s, NULL, -1, NULL, NULL, stream, NULL};
    bool *made = kf_calloc((size_t)g->nvalues + 1, sizeof(bool));
    void **copy_from = kf_calloc((size_t)e->nout + 1, sizeof(void *));
    if (!made || !copy_from || !(r.ext = kf_calloc((size_t)g->nvalues + 1, sizeof(void *))))
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st) st = device_only(e, s, made);
    for (uint32_t i = 0; !st && i < e->nin; i++)
        if (s->in_ids[i]) r.ext[s->in_ids[i]] = in_bufs[i];
    if (!st) st = bind_outputs(&r, made, outputs, out_bufs, copy_from);
    if (!st) st = dev_slot_get(e, s, stream, &r.sl);
    if (!st) st = device_launches(&r, in_bufs, out_bufs, copy_from);
    if (r.sl) {
        /* also after a failed enqueue: work already on the stream may use the arena */
        pthread_mutex_lock(&e->mu);
        r.sl->busy = false;
        pthread_mutex_unlock(&e->mu);
    }
    kf_free(made);
    kf_free(copy_from);
    kf_free(r.ext);
    return st;
}

kf_status kf_exec_sync(kf_exec *e, void *stream) {
    if (!e) return kf_fail(KF_ERR_INVALID_ARG, "kf_sync: NULL argument");
    if (!e->dev) return kf_fail(KF_ERR_UNSUPPORTED, "kf_sync: backend ref runs on the host");
    if (!e->dev->can_run)
        return kf_fail(KF_ERR_NO_DEVICE, "this plan was compiled only (no %s device to run on)", e->dev->name);
    kf_dev *d = e->dev;
    KF_TRY(d->stream_check(d, stream));
    KF_TRY(host_sync(d, stream, "kf_sync"));
    /* specs and bound slots are only ever added (slots at the head) while
     * the plan lives: a snapshot is safe to walk without the lock */
    spec *specs[KF_EXEC_MAX_SPECS];
    pthread_mutex_lock(&e->mu);
    uint32_t nspecs = e->nspecs;
    memcpy(specs, e->specs, nspecs * sizeof *specs);
    pthread_mutex_unlock(&e->mu);
    kf_status first = KF_OK;
    char msg[1024] = ""; /* the first error's message: later calls overwrite the last error */
    for (uint32_t i = 0; i < nspecs; i++) {
        pthread_mutex_lock(&e->mu);
        slot *head = specs[i]->dev_slots;
        pthread_mutex_unlock(&e->mu);
        for (slot *sl = head; sl; sl = sl->next) {
            if (sl->bound != stream) continue;
            kf_status st = errs_read(d, specs[i], sl, stream);
            if (st && !first) {
                first = st;
                snprintf(msg, sizeof msg, "%s", kf_last_error());
            }
            st = errs_zero_async(d, specs[i], sl, stream);
            if (st && !first) return st;
        }
    }
    return first ? kf_fail(first, "%s", msg) : KF_OK;
}

kf_status kf_exec_device_context(const kf_exec *e, void **ctx) {
    if (!e || !ctx) return kf_fail(KF_ERR_INVALID_ARG, "kf_compiled_device_context: NULL argument");
    *ctx = NULL;
    if (!e->dev) return kf_fail(KF_ERR_UNSUPPORTED, "backend ref has no device context");
    if (!e->dev->can_run)
        return kf_fail(KF_ERR_NO_DEVICE, "this plan was compiled only (no %s device to run on)", e->dev->name);
    *ctx = e->dev->context(e->dev);
    return KF_OK;
}
