/*
 * test_onnx_equal.c: kf_model_equal, the comparison the loader fuzzer's
 * round-trip check and the save/load tests rest on, must notice every kind
 * of difference it claims to: opset imports, graph inputs and outputs,
 * node counts, names, wiring, each attribute kind, and initializer values.
 * Each case changes one thing in a copy and expects "different" with the
 * reason naming it; the copy untouched must compare equal. Also: attributes
 * of old files that carry no type take the kind of the field they use.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "onnx.pb-c.h"

/* Every attribute kind graph text can write, on nodes the evaluator knows. */
static const char *text = "opset 17\n"
                          "input x float[2, 3]\n"
                          "const w float[3, 3] = random\n"
                          "m = MatMul(x, w)\n"
                          "c = Clip(m) {note=\"keep\"}\n"
                          "t = Transpose(c) {perm=[1,0]}\n"
                          "l = LeakyRelu(t) {alpha=0.25}\n"
                          "s = Softmax(l) {axis=1, scales=[0.5, 2.0]}\n"
                          "output s\n";

static kf_node *node_named(kf_model *m, const char *op) {
    kf_graph *g = m->graph;
    for (kf_id i = 1; i < g->nnodes; i++)
        if (!g->nodes[i].dead && !strcmp(g->nodes[i].op_type, op)) return &g->nodes[i];
    cr_assert_fail("no %s node", op);
    return NULL;
}

static kf_attr *attr_named(kf_node *n, const char *name) {
    for (int k = 0; k < n->nattrs; k++)
        if (!strcmp(n->attrs[k].name, name)) return &n->attrs[k];
    cr_assert_fail("node %s has no attribute %s", n->op_type, name);
    return NULL;
}

/* a and b must differ, with a reason containing want. */
static void expect_differs(const kf_model *a, const kf_model *b, const char *want) {
    char why[256] = "";
    cr_expect_not(kf_model_equal(a, b, why, sizeof why), "no difference found (wanted '%s')", want);
    cr_expect(strstr(why, want), "reason '%s' does not mention '%s'", why, want);
    cr_expect_not(kf_model_equal(a, b, NULL, 0), "without a reason buffer: no difference found");
}

typedef void (*mutation)(kf_model *m);

static void check(mutation f, const char *want) {
    kf_model *a = gt_parse(text);
    kf_model *b = gt_copy(a);
    char why[256];
    cr_assert(kf_model_equal(a, b, why, sizeof why), "an untouched copy differs: %s", why);
    f(b);
    expect_differs(a, b, want);
    kf_model_free(b);
    kf_model_free(a);
}

static void add_opset(kf_model *m) { cr_assert_eq(kf_model_set_opset(m, "com.example", 1), KF_OK); }
static void bump_opset(kf_model *m) { m->opsets[0].version++; }
static void input_type(kf_model *m) { m->graph->values[m->graph->inputs[0]].type.dims[1] = 4; }
static void output_type(kf_model *m) {
    kf_type *t = &m->graph->values[m->graph->outputs[0]].type;
    t->dtype = KF_DT_DOUBLE;
    t->rank = 1;
    t->dims[0] = 7;
}
static void extra_output(kf_model *m) {
    kf_value *v = &m->graph->values[node_named(m, "MatMul")->out[0]];
    cr_assert_eq(kf_graph_mark_output(m->graph, (kf_id)(v - m->graph->values)), KF_OK);
}
static void drop_node(kf_model *m) {
    /* LeakyRelu's users read its input instead; the node goes */
    kf_node *n = node_named(m, "LeakyRelu");
    kf_node *s = node_named(m, "Softmax");
    s->in[0] = n->in[0];
    n->dead = true;
}
static void rename_node(kf_model *m) {
    kf_node *n = node_named(m, "Transpose");
    kf_free(n->name);
    n->name = kf_strdup("renamed_transpose");
}
static void rewire_input(kf_model *m) {
    kf_node *n = node_named(m, "Softmax");
    n->in[0] = node_named(m, "Transpose")->out[0];
}
static void int_attr(kf_model *m) { attr_named(node_named(m, "Softmax"), "axis")->i = 0; }
static void float_attr(kf_model *m) { attr_named(node_named(m, "LeakyRelu"), "alpha")->f = 0.5f; }
static void string_attr(kf_model *m) { attr_named(node_named(m, "Clip"), "note")->s.ptr[0] = 'K'; }
static void ints_attr(kf_model *m) { attr_named(node_named(m, "Transpose"), "perm")->ints[0] = 0; }
static void floats_attr(kf_model *m) { attr_named(node_named(m, "Softmax"), "scales")->floats[1] = 3.0f; }
static void attr_kind(kf_model *m) {
    kf_attr *a = attr_named(node_named(m, "Softmax"), "axis");
    a->type = KF_ATTR_FLOAT;
    a->f = 1.0f;
}
static void init_value(kf_model *m) {
    kf_id w = kf_graph_find(m->graph, "w");
    kf_tensor *t = m->graph->values[w].init;
    kf_set_f64(t, 4, kf_get_f64(t, 4) + 1.0);
}

Test(onnx_equal, opset_import_count) { check(add_opset, "opset import count"); }
Test(onnx_equal, opset_version) { check(bump_opset, "opset import 0"); }
Test(onnx_equal, input_type) { check(input_type, "input 0 ('x')"); }
Test(onnx_equal, output_type) { check(output_type, "output 0 ('s')"); }
Test(onnx_equal, output_count) { check(extra_output, "input/output counts"); }
Test(onnx_equal, node_count) { check(drop_node, "node counts differ"); }
Test(onnx_equal, node_name) { check(rename_node, "differs"); }
Test(onnx_equal, node_input) { check(rewire_input, "input 0 differs"); }
Test(onnx_equal, int_attribute) { check(int_attr, "attribute 'axis'"); }
Test(onnx_equal, float_attribute) { check(float_attr, "attribute 'alpha'"); }
Test(onnx_equal, string_attribute) { check(string_attr, "attribute 'note'"); }
Test(onnx_equal, ints_attribute) { check(ints_attr, "attribute 'perm'"); }
Test(onnx_equal, floats_attribute) { check(floats_attr, "attribute 'scales'"); }
Test(onnx_equal, attribute_kind) { check(attr_kind, "attribute 'axis'"); }
Test(onnx_equal, initializer_value) { check(init_value, "initializer 'w'"); }

/* After a save/load round trip a model is equal to itself: the positive
 * case on random weights, through every kind above. */
Test(onnx_equal, round_trip_is_equal) {
    kf_model *a = gt_parse(text);
    for (int i = 0; i < 3; i++) {
        kf_model *b = gt_copy(a);
        char why[256];
        cr_expect(kf_model_equal(a, b, why, sizeof why), "round trip %d differs: %s", i, why);
        kf_model_free(b);
    }
    kf_model_free(a);
}

/* ---- attributes written without a type (IR version 1 files) -------------- */

/* An attribute `name` with no type field; the caller sets one value field. */
static Onnx__AttributeProto *untyped(const char *name) {
    Onnx__AttributeProto *a = calloc(1, sizeof *a);
    onnx__attribute_proto__init(a);
    a->name = (char *)name;
    return a;
}

Test(onnx_equal, untyped_attributes_take_the_kind_of_their_field) {
    kf_model *m = gt_parse("opset 17\ninput x float[2]\ny = Identity(x)\noutput y\n");
    void *bytes;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &bytes, &len), KF_OK, "%s", kf_last_error());
    kf_model_free(m);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, bytes);
    free(bytes);
    cr_assert(mp && mp->graph && mp->graph->n_node == 1);

    float fl[2] = {(float)tu_uniform(-1, 1), 2.5f};
    int64_t in[2] = {(int64_t)tu_uniform(0, 100), -3};
    ProtobufCBinaryData strs[2] = {{1, (uint8_t *)"a"}, {2, (uint8_t *)"bc"}};
    float tv[2] = {(float)tu_uniform(-1, 1), 1.0f};
    Onnx__TensorProto tp = ONNX__TENSOR_PROTO__INIT;
    int64_t tdims[1] = {2};
    tp.n_dims = 1;
    tp.dims = tdims;
    tp.has_data_type = true;
    tp.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    tp.n_float_data = 2;
    tp.float_data = tv;
    Onnx__TensorProto *tps[1] = {&tp};
    Onnx__GraphProto gp = ONNX__GRAPH_PROTO__INIT;
    gp.name = (char *)"body";
    Onnx__GraphProto *gps[1] = {&gp};

    Onnx__AttributeProto *as[8];
    as[0] = untyped("s1");
    as[0]->has_s = true;
    as[0]->s = strs[1];
    as[1] = untyped("t1");
    as[1]->t = &tp;
    as[2] = untyped("g1");
    as[2]->g = &gp;
    as[3] = untyped("fs");
    as[3]->n_floats = 2;
    as[3]->floats = fl;
    as[4] = untyped("is");
    as[4]->n_ints = 2;
    as[4]->ints = in;
    as[5] = untyped("ss");
    as[5]->n_strings = 2;
    as[5]->strings = strs;
    as[6] = untyped("ts");
    as[6]->n_tensors = 1;
    as[6]->tensors = tps;
    as[7] = untyped("gs");
    as[7]->n_graphs = 1;
    as[7]->graphs = gps;
    static const kf_attr_type want[8] = {KF_ATTR_STRING, KF_ATTR_TENSOR, KF_ATTR_GRAPH,   KF_ATTR_FLOATS,
                                         KF_ATTR_INTS,   KF_ATTR_STRINGS, KF_ATTR_TENSORS, KF_ATTR_GRAPHS};
    Onnx__NodeProto *node = mp->graph->node[0];
    Onnx__AttributeProto **old = node->attribute;
    size_t nold = node->n_attribute;
    node->attribute = as;
    node->n_attribute = 8;
    len = onnx__model_proto__get_packed_size(mp);
    bytes = malloc(len);
    onnx__model_proto__pack(mp, bytes);
    node->attribute = old;
    node->n_attribute = nold;
    for (int i = 0; i < 8; i++) free(as[i]);
    onnx__model_proto__free_unpacked(mp, NULL);

    cr_assert_eq(kf_model_load_memory(bytes, len, NULL, &m), KF_OK, "%s", kf_last_error());
    free(bytes);
    kf_node *n = node_named(m, "Identity");
    cr_assert_eq(n->nattrs, 8);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(n->attrs[i].type, want[i], "attribute %s: kind %d, want %d", n->attrs[i].name, n->attrs[i].type,
                     want[i]);
    cr_expect_eq(n->attrs[3].floats[0], fl[0]);
    cr_expect_eq(n->attrs[4].ints[0], in[0]);
    cr_expect_eq(n->attrs[5].n, 2);
    cr_expect(n->attrs[1].t && kf_get_f64(n->attrs[1].t, 0) == (double)tv[0]);
    /* the kinds survive a save and load */
    kf_model *back = gt_copy(m);
    char why[256];
    cr_expect(kf_model_equal(m, back, why, sizeof why), "%s", why);
    kf_model_free(back);
    kf_model_free(m);
}
