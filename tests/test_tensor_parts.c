/*
 * test_tensor_parts.c: deferred concatenation (kf_tensor.h). A tensor made
 * of parts reads, copies, compares, settles and saves exactly like the
 * concatenation assembled by hand; a merge of sibling weights deferred to
 * the save writes, into every kind of file, the bytes of merging at once.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kf_onnx.h"
#include "kf_opt.h"
#include "graph_text.h"
#include "test_util.h"

/* Random parts of shape dims with dims[axis] = widths[i], and their
 * concatenation along axis assembled element by element. */
static void make_parts(int rank, const int64_t *dims, int axis, const int64_t *widths, int n, kf_tensor **parts,
                       kf_tensor *whole) {
    int64_t wd[KF_MAX_RANK], total = 0;
    for (int i = 0; i < n; i++) {
        memcpy(wd, dims, sizeof(int64_t) * (size_t)rank);
        wd[axis] = widths[i];
        parts[i] = kf_tensor_new();
        *parts[i] = tu_rand(KF_DT_FLOAT, rank, wd, -4, 4);
        total += widths[i];
    }
    memcpy(wd, dims, sizeof(int64_t) * (size_t)rank);
    wd[axis] = total;
    cr_assert_eq(kf_tensor_alloc(whole, KF_DT_FLOAT, rank, wd), KF_OK);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= dims[d];
    for (int d = axis + 1; d < rank; d++) inner *= dims[d];
    float *w = whole->data;
    for (int64_t o = 0, at = 0; o < outer; o++)
        for (int i = 0; i < n; i++) {
            int64_t run = widths[i] * inner;
            memcpy(w + at, (const float *)parts[i]->data + o * run, sizeof(float) * (size_t)run);
            at += run;
        }
}

static void free_parts(kf_tensor **parts, int n) {
    for (int i = 0; i < n; i++) kf_tensor_free(parts[i]);
}

static bool count_run(void *ctx, const void *p, size_t n) {
    (void)p;
    (void)n;
    ++*(int *)ctx;
    return true;
}

/* Reads, copies, compares and settles a deferred tensor against whole. */
static void check_deferred(int rank, const int64_t *dims, int axis, const int64_t *widths, int n, int want_runs) {
    kf_tensor *parts[4], whole = {0}, d = {0};
    make_parts(rank, dims, axis, widths, n, parts, &whole);
    cr_assert_eq(kf_tensor_concat_deferred(&d, parts, n, axis), KF_OK, "%s", kf_last_error());
    cr_assert_null(d.data);
    cr_assert_eq(d.rank, whole.rank);
    for (int k = 0; k < rank; k++) cr_assert_eq(d.dims[k], whole.dims[k], "dim %d", k);
    cr_assert_eq(d.numel, whole.numel);
    for (int64_t i = 0; i < whole.numel; i++)
        cr_assert_eq(kf_get_f64(&d, i), kf_get_f64(&whole, i), "element %lld", (long long)i);
    int runs = 0;
    cr_assert(kf_tensor_visit_bytes(&d, count_run, &runs));
    cr_expect_eq(runs, want_runs, "runs: %d, want %d", runs, want_runs);
    cr_assert(kf_tensor_equal(&d, &whole));
    float last = ((float *)whole.data)[whole.numel - 1];
    ((float *)whole.data)[whole.numel - 1] = last + 1.0f; /* one element off: no longer equal */
    cr_assert_not(kf_tensor_equal(&d, &whole));
    ((float *)whole.data)[whole.numel - 1] = last;
    kf_tensor c = {0};
    cr_assert_eq(kf_tensor_copy(&c, &d), KF_OK);
    cr_assert_null(c.parts);
    cr_assert_eq(memcmp(c.data, whole.data, sizeof(float) * (size_t)whole.numel), 0);
    kf_tensor_release(&c);
    /* still borrowed: the parts keep their data, released or not */
    kf_tensor_adopt_parts(&d, parts);
    for (int i = 0; i < n; i++) cr_assert_null(parts[i]->data, "part %d was not taken over", i);
    cr_assert_eq(kf_tensor_settle(&d), KF_OK);
    cr_assert_null(d.parts);
    cr_assert_eq(memcmp(d.data, whole.data, sizeof(float) * (size_t)whole.numel), 0);
    kf_tensor_release(&d);
    kf_tensor_release(&whole);
    free_parts(parts, n);
}

Test(tensor_parts, columns_side_by_side_read_as_the_concatenation) {
    /* Q/K/V-like: [K, n_i] along the columns, one run per part per row */
    check_deferred(2, (int64_t[]){5, 0}, 1, (int64_t[]){3, 2, 4}, 3, 5 * 3);
}

Test(tensor_parts, rows_one_after_another_are_one_run_per_part) {
    /* Gemm transB: [n_i, K] along the rows */
    check_deferred(2, (int64_t[]){0, 6}, 0, (int64_t[]){2, 5, 1}, 3, 3);
}

Test(tensor_parts, a_middle_axis_of_rank_three) {
    check_deferred(3, (int64_t[]){2, 0, 3}, 1, (int64_t[]){2, 1, 3, 1}, 4, 2 * 4);
}

Test(tensor_parts, a_borrowed_concatenation_released_leaves_the_parts_whole) {
    kf_tensor *parts[2], whole = {0}, d = {0};
    make_parts(2, (int64_t[]){3, 0}, 1, (int64_t[]){2, 2}, 2, parts, &whole);
    cr_assert_eq(kf_tensor_concat_deferred(&d, parts, 2, 1), KF_OK);
    kf_tensor_release(&d); /* a failed merge drops it before adopting */
    cr_assert_not_null(parts[0]->data);
    cr_assert_eq(kf_get_f64(parts[1], 3), kf_get_f64(&whole, 7));
    kf_tensor_release(&whole);
    free_parts(parts, 2);
}

Test(tensor_parts, parts_that_do_not_concatenate_are_refused) {
    kf_tensor *parts[2], whole = {0}, d = {0};
    make_parts(2, (int64_t[]){3, 0}, 1, (int64_t[]){2, 3}, 2, parts, &whole);
    cr_assert_eq(kf_tensor_concat_deferred(&d, parts, 2, 0), KF_ERR_SHAPE, "dim 1 differs along axis 0");
    cr_assert_eq(kf_tensor_concat_deferred(&d, parts, 2, 2), KF_ERR_SHAPE, "axis past the rank");
    cr_assert_null(d.parts);
    cr_assert_not_null(parts[0]->data);
    kf_tensor *s = kf_tensor_new(), *q = kf_tensor_new();
    cr_assert_eq(kf_tensor_alloc(s, KF_DT_STRING, 1, (int64_t[]){2}), KF_OK);
    cr_assert_eq(kf_tensor_alloc(q, KF_DT_INT4, 1, (int64_t[]){2}), KF_OK);
    cr_assert_eq(kf_tensor_concat_deferred(&d, &s, 1, 0), KF_ERR_UNSUPPORTED);
    cr_assert_eq(kf_tensor_concat_deferred(&d, &q, 1, 0), KF_ERR_UNSUPPORTED);
    kf_tensor_free(s);
    kf_tensor_free(q);
    kf_tensor_release(&whole);
    free_parts(parts, 2);
}

/* ---- saving ---------------------------------------------------------------------------- */

static char dir[64];

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/kfuse_parts_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    static const char *names[] = {"a.onnx", "a.onnx.data", "b.onnx", "b.onnx.data", "in.onnx", "in.onnx.data"};
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        remove(p);
    }
    rmdir(dir);
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*len + 1);
    cr_assert(b && fread(b, 1, *len, f) == *len);
    fclose(f);
    return b;
}

/* Files a and b hold the same bytes, but where a names its own data file
 * (a.onnx.data) b may name its own (b.onnx.data). */
static void expect_same_files(const char *a, const char *b) {
    size_t la = 0, lb = 0;
    char *x = read_all(a, &la), *y = read_all(b, &lb);
    cr_assert(x && y, "%s or %s is missing", a, b);
    for (size_t i = 0; i + 11 <= la; i++)
        if (!memcmp(x + i, "a.onnx.data", 11)) x[i] = 'b';
    cr_expect(la == lb && !memcmp(x, y, la), "%s and %s differ", a, b);
    free(x);
    free(y);
}

/* w of the model replaced by a deferred concatenation of three parts
 * along axis 1 (the parts taken over); *whole gets it assembled. */
static kf_model *model_with_deferred(kf_tensor *whole) {
    kf_model *m = gt_parse("input x float[2, 16]\n"
                           "const w float[16, 24] = random\n"
                           "y = MatMul(x, w)\n"
                           "output y\n");
    kf_tensor *parts[3];
    make_parts(2, (int64_t[]){16, 0}, 1, (int64_t[]){8, 8, 8}, 3, parts, whole);
    kf_tensor *d = kf_tensor_new();
    cr_assert_eq(kf_tensor_concat_deferred(d, parts, 3, 1), KF_OK);
    kf_tensor_adopt_parts(d, parts);
    free_parts(parts, 3);
    kf_value *w = &m->graph->values[kf_graph_find(m->graph, "w")];
    kf_tensor_free(w->init);
    w->init = d;
    return m;
}

static void expect_w(const char *path, const kf_tensor *whole) {
    kf_model *r;
    cr_assert_eq(kf_model_load(path, &r), KF_OK, "%s: %s", path, kf_last_error());
    const kf_tensor *t = r->graph->values[kf_graph_find(r->graph, "w")].init;
    cr_assert(t && kf_tensor_equal(t, whole), "%s: w is not the concatenation", path);
    kf_model_free(r);
}

Test(tensor_parts, saved_inline_external_and_in_memory_as_assembled, .init = setup, .fini = teardown) {
    kf_tensor whole = {0};
    kf_model *m = model_with_deferred(&whole);
    char a[96], b[96];
    snprintf(a, sizeof a, "%s/a.onnx", dir);
    snprintf(b, sizeof b, "%s/b.onnx", dir);
    cr_assert_eq(kf_model_save(m, a), KF_OK, "%s", kf_last_error()); /* inline, part by part */
    expect_w(a, &whole);
    setenv("KFUSE_EXTERNAL_DATA", "1", 1);
    kf_status st = kf_model_save(m, b); /* into the data file, part by part */
    unsetenv("KFUSE_EXTERNAL_DATA");
    cr_assert_eq(st, KF_OK, "%s", kf_last_error());
    expect_w(b, &whole);
    cr_assert_not_null(m->graph->values[kf_graph_find(m->graph, "w")].init->parts, "a file save assembled w");
    void *buf;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &buf, &len), KF_OK); /* assembles it */
    size_t lf;
    void *file = read_all(a, &lf);
    cr_expect(lf == len && !memcmp(file, buf, len), "the file and the memory save differ");
    free(file);
    free(buf);
    kf_tensor_release(&whole);
    kf_model_free(m);
}

/* Sibling MatMuls over weights held in an external data file (mapped):
 * deferred and immediate merges write the same files, beside the input
 * (the output names the input's data) and with a data file of its own. */
Test(tensor_parts, a_merge_over_mapped_weights_saves_as_merging_at_once, .init = setup, .fini = teardown) {
    kf_model *src = gt_parse("input x float[2, 32]\n"
                             "const wq float[32, 16] = random\n"
                             "const wk float[32, 16] = random\n"
                             "const wv float[32, 16] = random\n"
                             "q = MatMul(x, wq)\n"
                             "k = MatMul(x, wk)\n"
                             "v = MatMul(x, wv)\n"
                             "output q\noutput k\noutput v\n");
    char in[96], a[96], b[96];
    snprintf(in, sizeof in, "%s/in.onnx", dir);
    snprintf(a, sizeof a, "%s/a.onnx", dir);
    snprintf(b, sizeof b, "%s/b.onnx", dir);
    setenv("KFUSE_EXTERNAL_DATA", "1", 1);
    cr_assert_eq(kf_model_save(src, in), KF_OK, "%s", kf_last_error());
    unsetenv("KFUSE_EXTERNAL_DATA");
    kf_model_free(src);
    for (int ext = 0; ext < 2; ext++) {
        const char *out[2] = {a, b};
        for (int defer = 0; defer < 2; defer++) {
            kf_model *m;
            cr_assert_eq(kf_model_load(in, &m), KF_OK, "%s", kf_last_error());
            kf_opt_options o;
            kf_opt_options_default(&o);
            o.defer_concat_bytes = defer ? 1 : 0;
            kf_opt_result res;
            cr_assert_eq(kf_optimize(m, &o, &res), KF_OK, "%s", kf_last_error());
            cr_assert_eq(gt_hits(&res.rules, "merge_sibling_matmuls"), 1);
            kf_rules_free(&res.rules);
            bool deferred = false;
            for (kf_id v = 1; v < m->graph->nvalues; v++)
                deferred |= m->graph->values[v].init && m->graph->values[v].init->parts;
            cr_assert_eq(deferred, defer != 0, "defer %d: deferred tensors %d", defer, deferred);
            if (ext) setenv("KFUSE_EXTERNAL_DATA", "1", 1);
            kf_status st = kf_model_save(m, out[defer]);
            unsetenv("KFUSE_EXTERNAL_DATA");
            cr_assert_eq(st, KF_OK, "%s", kf_last_error());
            kf_model_free(m);
        }
        expect_same_files(a, b);
        if (ext) {
            char da[112], db[112];
            snprintf(da, sizeof da, "%s.data", a);
            snprintf(db, sizeof db, "%s.data", b);
            expect_same_files(da, db);
        }
        kf_model *r;
        cr_assert_eq(kf_model_load(b, &r), KF_OK, "%s", kf_last_error());
        kf_model *orig;
        cr_assert_eq(kf_model_load(in, &orig), KF_OK);
        gt_expect_same_outputs(orig, r, 1e-5, 1e-5);
        kf_model_free(orig);
        kf_model_free(r);
    }
}
