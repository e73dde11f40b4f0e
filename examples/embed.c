/*
 * embed.c: the smallest program that embeds kfuse. Loads an ONNX model,
 * optimizes it, compiles it on the best backend here, prints each output's
 * dtype and shape as known before running (kf_compiled_output_info), runs
 * it once on random float inputs and prints each output's shape and first
 * values.
 *   embed MODEL.onnx [SHAPE...]   SHAPE per input, e.g. 2,3,8,8; without
 *                                 them each input takes its declared shape,
 *                                 symbolic dims set to 1
 */
#include <kfuse/kfuse.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_INPUTS 16 /* plenty for an example; kfuse itself has no such limit */

static int die(const char *what, kf_status st) {
    fprintf(stderr, "embed: %s: %s: %s\n", what, kf_status_name(st), kf_last_error());
    return 1;
}

int main(int argc, char **argv) {
    kf_model *m;
    kf_compiled *c;
    kf_status st;
    if (argc < 2) return fprintf(stderr, "usage: embed MODEL.onnx [SHAPE...]\n"), 2;
    if ((st = kf_model_load(argv[1], &m))) return die("load", st);
    if ((st = kf_model_optimize(m)) || (st = kf_compile(m, KF_BACKEND_BEST, &c))) return die("compile", st);
    kf_model_free(m); /* kf_compile keeps what it needs */
    int nin = kf_compiled_num_inputs(c), nout = kf_compiled_num_outputs(c);
    if (nin > MAX_INPUTS || (argc > 2 && argc - 2 != nin)) return fprintf(stderr, "embed: the model has %d inputs\n", nin), 2;
    kf_host_tensor in[MAX_INPUTS];
    int64_t dims[MAX_INPUTS][8];
    srand(42);
    for (int i = 0; i < nin; i++) {
        int64_t n = 1;
        in[i] = (kf_host_tensor){.dtype = 1 /* float */, .rank = 0, .dims = dims[i]};
        if (argc == 2) { /* the declared shape; symbolic dims 1 */
            int dtype, rank;
            if ((st = kf_compiled_input_info(c, i, &dtype, &rank, dims[i]))) return die("input info", st);
            if (dtype != 1 || rank < 0) return fprintf(stderr, "embed: input %d is not a float tensor of known rank\n", i), 2;
            in[i].rank = rank;
            for (int d = 0; d < rank; d++) n *= dims[i][d] = dims[i][d] < 0 ? 1 : dims[i][d];
        }
        for (char *s = argc > 2 ? argv[2 + i] : "", *end; *s && in[i].rank < 8; s = end + (*end == ',')) {
            int r = in[i].rank;
            dims[i][r] = strtoll(s, &end, 10);
            if (end == s || dims[i][r] < 0) return fprintf(stderr, "embed: bad shape %s\n", argv[2 + i]), 2;
            n *= dims[i][r];
            in[i].rank = r + 1;
        }
        float *x = malloc((size_t)n * sizeof *x);
        for (int64_t k = 0; x && k < n; k++) x[k] = (float)rand() / RAND_MAX * 2 - 1;
        in[i].data = x;
    }
    for (int i = 0; i < nout; i++) { /* what the run will return, known from the input shapes alone */
        int dtype, rank;
        int64_t d[8];
        if ((st = kf_compiled_output_info(c, in, nin, i, &dtype, &rank, d))) return die("output info", st);
        printf("%s: expected dtype %d [", kf_compiled_output_name(c, i), dtype);
        for (int k = 0; k < rank; k++) printf(k ? ",%lld" : "%lld", (long long)d[k]); /* -1: KF_DIM_UNKNOWN */
        printf("]\n");
    }
    kf_output *out = calloc((size_t)nout, sizeof *out);
    if ((st = kf_run(c, in, nin, out, nout))) return die("run", st);
    printf("backend %s\n", kf_backend_name(kf_compiled_backend(c)));
    for (int i = 0; i < nout; i++) {
        printf("%s: dtype %d [", kf_compiled_output_name(c, i), out[i].dtype);
        for (int d = 0; d < out[i].rank; d++) printf("%s%lld", d ? "," : "", (long long)out[i].dims[d]);
        printf("]");
        for (size_t k = 0; out[i].dtype == 1 && k < 4 && k < out[i].nbytes / 4; k++)
            printf(" %.5f", ((const float *)out[i].data)[k]);
        printf("\n");
        kf_output_release(&out[i]);
    }
    for (int i = 0; i < nin; i++) free((void *)in[i].data);
    free(out);
    kf_compiled_free(c);
    return 0;
}
