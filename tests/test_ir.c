/* test_ir.c: graph construction, use lists, attribute lookup, topological
 * order (stable for sorted graphs, cycles reported by node) and the
 * declared-vs-inferred type merge of shape inference. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "test_util.h"

static kf_id val(kf_graph *g, const char *name) {
    kf_id v;
    cr_assert_eq(kf_graph_intern_value(g, name, &v), KF_OK);
    return v;
}

Test(ir, use_lists_and_producers) {
    kf_graph *g = kf_graph_new();
    kf_id x = val(g, "x"), y = val(g, "y"), z = val(g, "z");
    kf_id in[2] = {x, x}, out[1] = {y};
    kf_id n1, n2;
    cr_assert_eq(kf_graph_add_node(g, "Add", "", "add", in, 2, out, 1, &n1), KF_OK);
    kf_id in2[1] = {y}, out2[1] = {z};
    cr_assert_eq(kf_graph_add_node(g, "Relu", "", "relu", in2, 1, out2, 1, &n2), KF_OK);
    cr_assert_eq(g->values[x].nusers, 2, "x is used twice by one node, once per slot");
    cr_assert_eq(g->values[y].producer, n1);
    cr_assert_eq(g->values[y].users[0], n2);
    /* a second producer for y is rejected and named */
    kf_id n3;
    cr_assert_eq(kf_graph_add_node(g, "Neg", "", "neg", in2, 1, out, 1, &n3), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "'y'"), "%s", kf_last_error());
    kf_graph_free(g);
}

Test(ir, topo_keeps_sorted_order_and_finds_cycles) {
    kf_graph *g = kf_graph_new();
    kf_id a = val(g, "a"), b = val(g, "b"), c = val(g, "c"), d = val(g, "d");
    kf_id n[3];
    kf_id i0[1] = {a}, o0[1] = {b};
    kf_id i1[1] = {a}, o1[1] = {c}; /* independent of node 0 */
    kf_id i2[2] = {b, c}, o2[1] = {d};
    cr_assert_eq(kf_graph_add_node(g, "Neg", "", "n0", i0, 1, o0, 1, &n[0]), KF_OK);
    cr_assert_eq(kf_graph_add_node(g, "Abs", "", "n1", i1, 1, o1, 1, &n[1]), KF_OK);
    cr_assert_eq(kf_graph_add_node(g, "Add", "", "n2", i2, 2, o2, 1, &n[2]), KF_OK);
    kf_id *order;
    uint32_t cnt;
    cr_assert_eq(kf_graph_topo(g, &order, &cnt), KF_OK);
    cr_assert_eq(cnt, 3);
    for (int i = 0; i < 3; i++) cr_assert_eq(order[i], n[i], "file order kept at %d", i);
    free(order);
    /* rewire n0 to read d: n0 -> n2 -> n0 is a cycle */
    g->nodes[n[0]].in[0] = d;
    cr_assert_eq(kf_graph_topo(g, &order, &cnt), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "cycle"), "%s", kf_last_error());
    kf_graph_free(g);
}

Test(ir, attribute_lookup_defaults_by_kind) {
    kf_node *n = tu_node("Transpose", 1, 1, 13);
    int64_t perm[3] = {2, 0, 1};
    tu_attr_ints(n, "perm", 3, perm);
    tu_attr_i(n, "axis", -1);
    tu_attr_f(n, "alpha", 0.25f);
    tu_attr_s(n, "mode", "linear");
    int cnt;
    const int64_t *p = kf_attr_ints(n, "perm", &cnt);
    cr_assert_eq(cnt, 3);
    cr_assert_eq(p[0], 2);
    cr_assert_eq(kf_attr_i(n, "axis", 5), -1);
    cr_assert_eq(kf_attr_i(n, "alpha", 7), 7, "an attribute of another kind yields the default");
    cr_assert_float_eq(kf_attr_f(n, "alpha", 0), 0.25f, 0);
    cr_assert_str_eq(kf_attr_s(n, "mode", "x"), "linear");
    cr_assert_null(kf_attr_ints(n, "missing", &cnt));
    cr_assert_eq(cnt, 0);
    tu_node_free(n);
}

Test(ir, model_save_load_keeps_symbolic_dims_and_types) {
    kf_model *m;
    cr_assert_eq(kf_model_load(KF_SOURCE_DIR "/bench/models/tiny_cnn.onnx", &m), KF_OK, "%s", kf_last_error());
    const kf_graph *g = m->graph;
    kf_id x = kf_graph_find(g, "x");
    cr_assert_neq(x, 0);
    const kf_type *t = &g->values[x].type;
    cr_assert_eq(t->rank, 4);
    cr_assert_eq(t->dims[0], -1);
    cr_assert_str_eq(g->syms[t->syms[0]], "N");
    cr_assert_eq(t->dims[1], 3);
    void *buf;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &buf, &len), KF_OK);
    kf_model *m2;
    cr_assert_eq(kf_model_load_memory(buf, len, NULL, &m2), KF_OK, "%s", kf_last_error());
    free(buf);
    char why[256];
    cr_assert(kf_model_equal(m, m2, why, sizeof why), "%s", why);
    kf_model_free(m);
    kf_model_free(m2);
}

Test(ir, save_goes_through_a_temporary_file_and_reports_io_errors) {
    kf_model *m;
    cr_assert_eq(kf_model_load(KF_SOURCE_DIR "/bench/models/tiny_cnn.onnx", &m), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_model_save(m, "/nonexistent-kfuse-dir/x.onnx"), KF_ERR_IO);
    cr_assert(strstr(kf_last_error(), "/nonexistent-kfuse-dir/x.onnx"), "%s", kf_last_error());
    char path[] = "/tmp/kfuse_save_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(kf_model_save(m, path), KF_OK, "%s", kf_last_error());
    kf_model *back;
    cr_assert_eq(kf_model_load(path, &back), KF_OK, "%s", kf_last_error());
    char why[256];
    cr_assert(kf_model_equal(m, back, why, sizeof why), "%s", why);
    /* the streamed file equals the in-memory serialisation byte for byte */
    void *buf;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &buf, &len), KF_OK);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    char *disk = malloc(len + 1);
    cr_assert_eq(fread(disk, 1, len + 1, f), len);
    fclose(f);
    cr_assert_eq(memcmp(disk, buf, len), 0);
    free(disk);
    free(buf);
    remove(path);
    kf_model_free(back);
    kf_model_free(m);
}

Test(ir, large_weights_go_to_external_data_that_loads_back) {
    setenv("KFUSE_EXTERNAL_DATA", "1", 1); /* as if the weights passed the 2 GiB message limit */
    kf_model *m;
    cr_assert_eq(kf_model_load(KF_SOURCE_DIR "/bench/models/tiny_cnn.onnx", &m), KF_OK, "%s", kf_last_error());
    char dir[] = "/tmp/kfuse_ext_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256], data[300];
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    snprintf(data, sizeof data, "%s.data", path);
    cr_assert_eq(kf_model_save(m, path), KF_OK, "%s", kf_last_error());
    struct stat sm, sd;
    cr_assert_eq(stat(path, &sm), 0);
    cr_assert_eq(stat(data, &sd), 0, "the weights file exists");
    cr_assert_gt(sd.st_size, 16000, "the conv and fc weights (about 19 KB) are outside the model");
    cr_assert_lt(sm.st_size, 4096, "the model keeps only the graph and small constants");
    kf_model *back;
    cr_assert_eq(kf_model_load(path, &back), KF_OK, "%s", kf_last_error());
    char why[256];
    cr_assert(kf_model_equal(m, back, why, sizeof why), "%s", why);
    remove(path);
    remove(data);
    rmdir(dir);
    kf_model_free(back);
    kf_model_free(m);
}

/* An empty tensor's strides are products of its other dims, so a shape
 * like [0, 2^33, 2^34] (0 elements) is refused wherever shapes enter:
 * allocation and inference (fuzz finding, session 4: the evaluator's
 * broadcast strides overflowed). Shapes in range with a zero are fine. */
Test(ir, empty_shape_whose_other_dims_overflow_is_refused) {
    int64_t bad[3] = {0, 8589934592LL, 17179869184LL}, good[3] = {0, 65536, 65536};
    kf_tensor t = {0};
    cr_assert_eq(kf_tensor_alloc(&t, KF_DT_FLOAT, 3, bad), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "overflows"), "%s", kf_last_error());
    cr_assert_eq(kf_tensor_alloc(&t, KF_DT_FLOAT, 3, good), KF_OK, "%s", kf_last_error());
    cr_assert_eq(t.numel, 0);
    kf_tensor_release(&t);
    kf_model *m = gt_parse("opset 13\ninput x float[0, 8589934592, 17179869184]\ny = Relu(x)\noutput y\n");
    cr_assert_eq(kf_infer_shapes(m), KF_ERR_SHAPE);
    cr_assert(strstr(kf_last_error(), "output 'y' would have dims whose product"), "%s", kf_last_error());
    kf_model_free(m);
    m = gt_parse("opset 13\ninput x float[0, 65536, 65536]\ny = Relu(x)\noutput y\n");
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    kf_model_free(m);
}

/* Shape inference merges what it infers with what the file declares; a
 * declared dim that fills a dim the graph left open must not make a type
 * whose element count overflows (the loader refuses such a type, so a
 * rewritten model would not load back; fuzz finding, session 3). */
Test(ir, merged_declared_and_inferred_shape_never_overflows) {
    const char *text = "opset 13\n"
                       "input x float[2, 3, N, 5]\n"
                       "const sh int64[4] = 1 134217729 0 8589934604\n"
                       "z = Reshape(x, sh)\n"
                       "output z\n";
    kf_model *m = gt_parse(text);
    kf_id z = kf_graph_find(m->graph, "z");
    cr_assert(z);
    /* no declaration: the open dim stays symbolic and the product fits */
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    cr_assert_eq(m->graph->values[z].type.dims[2], -1);
    cr_assert_eq(m->graph->values[z].type.dims[3], 8589934604LL);
    /* a declared 12 for the open dim would overflow 64 bits: refused,
     * naming the node's output, and the declared type is left as it was */
    kf_type *t = &m->graph->values[z].type;
    int64_t declared[4] = {1, 1, 12, 12};
    t->rank = 4;
    for (int d = 0; d < 4; d++) t->dims[d] = declared[d], t->syms[d] = 0;
    cr_assert_eq(kf_infer_shapes(m), KF_ERR_SHAPE);
    cr_assert(strstr(kf_last_error(), "output 'z' would have dims whose product"), "%s",
              kf_last_error());
    for (int d = 0; d < 4; d++) cr_assert_eq(t->dims[d], declared[d]);
    kf_model_free(m);
    /* a declared dim that keeps the product in range is taken */
    m = gt_parse("opset 13\ninput x float[2, 3, N, 5]\nconst sh int64[4] = 1 6 0 5\nz = Reshape(x, sh)\noutput z\n");
    z = kf_graph_find(m->graph, "z");
    t = &m->graph->values[z].type;
    t->rank = 4;
    t->dims[0] = 1, t->dims[1] = 6, t->dims[2] = 7, t->dims[3] = 5;
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    cr_assert_eq(t->dims[2], 7);
    kf_model_free(m);
}
