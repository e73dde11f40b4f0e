/*
 * cmd_bench.c: `kfuse bench M.onnx`: latency of whole runs of a compiled
 * plan (kernels/exec.c) on random inputs: warm-up runs first, then p50/p99
 * of --iters timed runs, each from host inputs to host outputs; plus
 * kernels launched per run and the arena against its live lower bound.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kf_onnx.h"
#include "kfuse_tool.h"

enum { EXIT_OK = 0, EXIT_USAGE = 2 };

int kfuse_cmd_bench(int argc, char **argv);

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of sorted v[0..n), nearest rank. */
static double quantile(const double *v, int n, double q) {
    int i = (int)(q * n + 0.999999) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: kfuse bench M.onnx [--backend opencl|cuda|ref] [--warmup N] [--iters N] [--dim NAME=N]...\n"
               "                  [--seed N] [--threads N] [--precision fp32|tf32|fp16|bf16|int8|int8-fp16|fp8]\n"
               "                  [--target NAME|FILE] [--device N] [--patterns F.kfp]...\n"
               "  p50/p99 latency of host-to-host runs after warm-up (defaults 10 and 100),\n"
               "  kernels launched per run, arena bytes against the live lower bound\n");
}

int kfuse_cmd_bench(int argc, char **argv) {
    kfuse_tool_args a;
    kf_exec_backend b;
    kf_precision prec;
    if (!kfuse_tool_parse(&a, argc, argv) || !kfuse_tool_backend(a.backend, &b)) {
        bench_usage(stderr);
        return EXIT_USAGE;
    }
    if (!kfuse_tool_precision(a.precision, &prec)) return EXIT_USAGE;
    kf_model *m = NULL;
    kf_exec *x = NULL;
    kf_type *types = NULL;
    kf_tensor *ins = NULL, *outs = NULL;
    double *ms = calloc((size_t)a.iters * 2, sizeof(double)), *dev_ms = ms ? ms + a.iters : NULL;
    bool dev_timed = true;
    uint32_t n = 0, nout = 0;
    kf_status st = ms ? kfuse_tool_load(a.model, &m) : kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st) st = kfuse_tool_apply_dims(m, &a.dims, false);
    if (!st) st = kfuse_tool_types(m, &a.dims, &types, &n);
    if (!st && !(ins = calloc(n + 1, sizeof(kf_tensor)))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    if (!st) st = kfuse_tool_inputs(m, types, n, a.seed, ins);
    double t0 = now_ms();
    kf_exec_options o;
    if (!st) st = kfuse_tool_exec_options(&a, b, prec, &o);
    if (!st) {
        o.arch = a.arch;
        o.threads = a.threads;
        o.host_steps = stderr;
        st = kf_exec_create(m, &o, &x);
    }
    if (!st) {
        nout = kf_exec_num_outputs(x);
        if (!(outs = calloc(nout + 1, sizeof(kf_tensor)))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    /* the first run compiles when input dims are symbolic: part of setup */
    if (!st) st = kf_exec_run(x, ins, n, outs);
    double setup = now_ms() - t0;
    for (int i = 0; !st && i < a.warmup; i++) st = kf_exec_run(x, ins, n, outs);
    for (int i = 0; !st && i < a.iters; i++) {
        double s = now_ms(), d = -1;
        st = kf_exec_run_timed(x, ins, n, outs, &d);
        ms[i] = now_ms() - s;
        dev_ms[i] = d * 1e3;
        if (d < 0) dev_timed = false;
    }
    int rc = EXIT_OK;
    if (st) rc = kfuse_tool_fail(st);
    else {
        kf_exec_stats s;
        kf_exec_get_stats(x, &s);
        qsort(ms, (size_t)a.iters, sizeof *ms, cmp_double);
        qsort(dev_ms, (size_t)a.iters, sizeof *dev_ms, cmp_double);
        printf("kfuse: bench: %s on %s (%s): p50 %.3f ms, p99 %.3f ms (%d runs after %d warm-up; setup %.1f ms)\n",
               a.model, a.backend, kf_precision_name(prec), quantile(ms, a.iters, 0.5), quantile(ms, a.iters, 0.99), a.iters, a.warmup, setup);
        if (dev_timed)
            printf("kfuse: bench: device p50 %.4f ms, p99 %.4f ms (launches to completion, inputs already on the device)\n",
                   quantile(dev_ms, a.iters, 0.5), quantile(dev_ms, a.iters, 0.99));
        printf("kfuse: bench: %u kernel launches per run (%u distinct kernels), %u groups on ref%s\n", s.launches,
               s.kernels_unique, s.groups_ref, s.cuda_graph ? "; launches replayed from a CUDA Graph" : "");
        if (s.live_lower_bound >= 0)
            printf("kfuse: bench: arena %lld bytes, live lower bound %lld bytes (%.2fx)\n", (long long)s.arena_bytes,
                   (long long)s.live_lower_bound,
                   s.live_lower_bound ? (double)s.arena_bytes / (double)s.live_lower_bound : 1.0);
        else
            printf("kfuse: bench: no arena (%s)\n", b == KF_EXEC_REF ? "ref backend" : "sizes known only at run time");
    }
    for (uint32_t i = 0; ins && i < n; i++) kf_tensor_release(&ins[i]);
    for (uint32_t o = 0; outs && o < nout; o++) kf_tensor_release(&outs[o]);
    free(ins);
    free(outs);
    free(ms);
    free(types);
    kf_exec_free(x);
    kf_model_free(m);
    return rc;
}
