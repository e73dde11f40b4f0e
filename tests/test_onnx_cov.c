/*
 * test_onnx_cov.c: the loader's and saver's rarer paths (graph/onnx.c) that
 * the hostile-input tests (test_onnx_bad.c) do not reach: malformed
 * model-local functions, tensors of every stored field and of kinds kfuse
 * refuses, unnamed or repeated graph inputs/outputs/value_info, saving into
 * folders and files that refuse the write (the temporary file, the rename,
 * the external data file, a full disk), and allocation failure through a
 * model that sets every optional string field. Each case checks the error
 * code and that the message names the function, tensor, value or file, or
 * that what loads saves and loads back equal.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "onnx.pb-c.h"
#include "test_util.h"

/* Under ASan, the allocation-failure walks end with a leak check of their
 * own: LeakSanitizer's report at a Criterion worker's exit does not fail
 * the test. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define LEAK_CHECK() cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "LeakSanitizer found leaks (above)")
#else
#define LEAK_CHECK() ((void)0)
#endif

/* ---- building and corrupting protos ------------------------------------------ */

/* X float[2, 3] + W (random, 24 bytes) -> Relu -> Y. */
static const char *base_text = "opset 13\n"
                               "input X float[2, 3]\n"
                               "const W float[2, 3] = random\n"
                               "S = Add(X, W)\n"
                               "Y = Relu(S)\n"
                               "output Y\n";

static Onnx__ModelProto *proto_of(const char *text) {
    kf_model *m = gt_parse(text);
    void *b;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &b, &len), KF_OK, "%s", kf_last_error());
    kf_model_free(m);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, b);
    free(b);
    cr_assert(mp && mp->graph);
    return mp;
}

/* protobuf-c frees unpacked messages field by field with free(): whatever
 * a test adds is malloc'ed. */
static char *sdup(const char *s) {
    char *d = strdup(s);
    cr_assert(d);
    return d;
}

static void *grow(void *arr, size_t n, size_t size) {
    void *p = realloc(arr, (n + 1) * size);
    cr_assert(p);
    return p;
}

static char **strs(int n, const char *const *v) {
    char **a = calloc((size_t)n + 1, sizeof(char *));
    cr_assert(a);
    for (int i = 0; i < n; i++) a[i] = sdup(v[i]);
    return a;
}

static Onnx__OperatorSetIdProto *opset(const char *domain, int64_t version) {
    Onnx__OperatorSetIdProto *o = malloc(sizeof *o);
    cr_assert(o);
    onnx__operator_set_id_proto__init(o);
    o->domain = domain ? sdup(domain) : NULL;
    o->has_version = 1;
    o->version = version;
    return o;
}

static Onnx__NodeProto *node1(const char *op, const char *name, const char *in, const char *out) {
    Onnx__NodeProto *n = malloc(sizeof *n);
    cr_assert(n);
    onnx__node_proto__init(n);
    n->op_type = sdup(op);
    n->name = sdup(name);
    n->n_input = 1;
    n->input = strs(1, &in);
    n->n_output = 1;
    n->output = strs(1, &out);
    return n;
}

/* custom::<name>(a) -> b, b = Relu(a): a valid model-local function. */
static Onnx__FunctionProto *function(const char *name) {
    Onnx__FunctionProto *f = malloc(sizeof *f);
    cr_assert(f);
    onnx__function_proto__init(f);
    f->name = name ? sdup(name) : NULL;
    f->domain = sdup("custom");
    const char *a = "a", *b = "b";
    f->n_input = 1;
    f->input = strs(1, &a);
    f->n_output = 1;
    f->output = strs(1, &b);
    f->n_node = 1;
    f->node = calloc(2, sizeof(void *));
    cr_assert(f->node);
    f->node[0] = node1("Relu", "f_relu", "a", "b");
    f->n_opset_import = 1;
    f->opset_import = calloc(2, sizeof(void *));
    cr_assert(f->opset_import);
    f->opset_import[0] = opset("", 13);
    return f;
}

static void add_function(Onnx__ModelProto *mp, Onnx__FunctionProto *f) {
    mp->functions = grow(mp->functions, mp->n_functions, sizeof(void *));
    mp->functions[mp->n_functions++] = f;
}

static Onnx__ValueInfoProto *info(const char *name) {
    Onnx__ValueInfoProto *v = malloc(sizeof *v);
    cr_assert(v);
    onnx__value_info_proto__init(v);
    v->name = name ? sdup(name) : NULL;
    return v;
}

static void add_info(Onnx__ValueInfoProto ***arr, size_t *n, Onnx__ValueInfoProto *v) {
    *arr = grow(*arr, *n, sizeof(void *));
    (*arr)[(*n)++] = v;
}

/* A float tensor type of the given rank, every dim 1. */
static Onnx__TypeProto *tensor_type(int elem, int rank) {
    Onnx__TypeProto *t = malloc(sizeof *t);
    Onnx__TypeProto__Tensor *tt = malloc(sizeof *tt);
    Onnx__TensorShapeProto *sh = malloc(sizeof *sh);
    cr_assert(t && tt && sh);
    onnx__type_proto__init(t);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    t->tensor_type = tt;
    tt->has_elem_type = 1;
    tt->elem_type = elem;
    tt->shape = sh;
    sh->n_dim = (size_t)rank;
    sh->dim = calloc((size_t)rank + 1, sizeof(void *));
    cr_assert(sh->dim);
    for (int i = 0; i < rank; i++) {
        Onnx__TensorShapeProto__Dimension *d = malloc(sizeof *d);
        cr_assert(d);
        onnx__tensor_shape_proto__dimension__init(d);
        d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        d->dim_value = 1;
        sh->dim[i] = d;
    }
    return t;
}

static Onnx__TensorProto *tensor(const char *name, int dtype, int rank, const int64_t *dims) {
    Onnx__TensorProto *t = malloc(sizeof *t);
    cr_assert(t);
    onnx__tensor_proto__init(t);
    t->name = sdup(name);
    t->has_data_type = 1;
    t->data_type = dtype;
    t->n_dims = (size_t)rank;
    t->dims = calloc((size_t)rank + 1, sizeof(int64_t));
    cr_assert(t->dims);
    for (int i = 0; i < rank; i++) t->dims[i] = dims[i];
    return t;
}

static void add_init(Onnx__ModelProto *mp, Onnx__TensorProto *t) {
    Onnx__GraphProto *g = mp->graph;
    g->initializer = grow(g->initializer, g->n_initializer, sizeof(void *));
    g->initializer[g->n_initializer++] = t;
}

static uint8_t *pack(const Onnx__ModelProto *mp, size_t *len) {
    *len = onnx__model_proto__get_packed_size(mp);
    uint8_t *b = malloc(*len + 1);
    cr_assert(b);
    cr_assert_eq(onnx__model_proto__pack(mp, b), *len);
    return b;
}

/* ---- loading and checking -------------------------------------------------- */

static char msg[4096];

/* Loads mp; a failure's message goes into msg; a success's model is kept
 * in *keep when given, else freed. */
static kf_status load_proto(const Onnx__ModelProto *mp, kf_model **keep) {
    size_t len;
    uint8_t *b = pack(mp, &len);
    kf_model *m = NULL;
    kf_clear_error();
    kf_status st = kf_model_load_memory(b, len, NULL, &m);
    free(b);
    snprintf(msg, sizeof msg, "%s", st ? kf_last_error() : "");
    if (st) cr_assert_null(m, "a failed load returned a model");
    if (keep) *keep = m;
    else kf_model_free(m);
    return st;
}

#define EXPECT(st, code, ...)                                                                                          \
    do {                                                                                                               \
        kf_status st_ = (st);                                                                                          \
        cr_assert_eq(st_, (code), "status '%s' (%s), expected '%s'", kf_status_name(st_), msg,                        \
                     kf_status_name(code));                                                                            \
        const char *subs_[] = {__VA_ARGS__, NULL};                                                                     \
        cr_assert(msg[0], "empty error message");                                                                      \
        for (int i_ = 0; subs_[i_]; i_++)                                                                              \
            cr_assert(strstr(msg, subs_[i_]), "message \"%s\" does not mention \"%s\"", msg, subs_[i_]);             \
    } while (0)

/* m saves, loads back and compares equal. */
static void round_trips(const kf_model *m) {
    void *b;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &b, &len), KF_OK, "%s", kf_last_error());
    kf_model *back = NULL;
    cr_assert_eq(kf_model_load_memory(b, len, NULL, &back), KF_OK, "%s", kf_last_error());
    free(b);
    char why[512];
    cr_assert(kf_model_equal(m, back, why, sizeof why), "round trip differs: %s", why);
    kf_model_free(back);
}

/* ---- model-local functions --------------------------------------------------- */

Test(onnx_cov, function_loads_and_round_trips) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__FunctionProto *f = function("F");
    f->doc_string = sdup("a documented function");
    f->n_attribute = 2;
    const char *attrs[2] = {"alpha", "beta"};
    f->attribute = strs(2, attrs);
    f->opset_import = grow(f->opset_import, f->n_opset_import, sizeof(void *));
    f->opset_import[f->n_opset_import++] = opset(NULL, 1); /* no domain: the default one */
    add_function(mp, f);
    kf_model *m;
    cr_assert_eq(load_proto(mp, &m), KF_OK, "%s", msg);
    cr_assert_eq(m->nfuncs, 1);
    const kf_function *lf = kf_model_function(m, "custom", "F");
    cr_assert(lf, "function custom::F not found");
    cr_assert_str_eq(lf->doc, "a documented function");
    cr_assert_eq(lf->nattrs, 2);
    cr_assert_str_eq(lf->attrs[1], "beta");
    cr_assert_eq(lf->nopsets, 2);
    cr_assert_str_eq(lf->opsets[1].domain, "");
    round_trips(m);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, function_without_a_name) {
    Onnx__ModelProto *mp = proto_of(base_text);
    add_function(mp, function(NULL));
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "model-local function has no name");
    mp->functions[0]->name = sdup("");
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "model-local function has no name");
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, function_defined_twice) {
    Onnx__ModelProto *mp = proto_of(base_text);
    add_function(mp, function("Twice"));
    add_function(mp, function("Twice"));
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "custom::Twice", "defined twice");
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, function_with_too_many_opsets_or_attributes) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__FunctionProto *f = function("Wide");
    add_function(mp, f);
    /* 1025 opset imports, all one (shared) message: packed 1025 times */
    Onnx__OperatorSetIdProto **keep = f->opset_import;
    size_t nkeep = f->n_opset_import;
    Onnx__OperatorSetIdProto **many = calloc(1026, sizeof(void *));
    cr_assert(many);
    for (int i = 0; i < 1025; i++) many[i] = keep[0];
    f->opset_import = many;
    f->n_opset_import = 1025;
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "function 'Wide'", "too many opset imports");
    f->opset_import = keep;
    f->n_opset_import = nkeep;
    free(many);
    char **names = calloc(1026, sizeof(char *));
    cr_assert(names);
    char *one = sdup("x");
    for (int i = 0; i < 1025; i++) names[i] = one;
    f->attribute = names;
    f->n_attribute = 1025;
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "function 'Wide'", "attributes");
    f->attribute = NULL;
    f->n_attribute = 0;
    free(names);
    free(one);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, function_inputs_empty_or_repeated) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__FunctionProto *f = function("Rep");
    add_function(mp, f);
    f->input = grow(f->input, f->n_input, sizeof(char *));
    f->input[f->n_input++] = sdup("a");
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "function 'Rep'", "input 1 ('a') is empty or repeated");
    free(f->input[1]);
    f->input[1] = sdup("");
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "function 'Rep'", "input 1 ('') is empty or repeated");
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, function_output_not_computed) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__FunctionProto *f = function("Out");
    add_function(mp, f);
    free(f->output[0]);
    f->output[0] = sdup("nowhere");
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "function 'Out'", "output 'nowhere' is not computed");
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, function_body_errors_name_the_function) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__FunctionProto *f = function("Body");
    add_function(mp, f);
    /* a node reading a value nothing defines */
    free(f->node[0]->input[0]);
    f->node[0]->input[0] = sdup("undefined_in_body");
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "function 'Body'", "undefined_in_body");
    /* a cycle: b = Relu(c), c = Relu(b) */
    free(f->node[0]->input[0]);
    f->node[0]->input[0] = sdup("c");
    f->node = grow(f->node, f->n_node, sizeof(void *));
    f->node[f->n_node++] = node1("Relu", "f_back", "b", "c");
    kf_status st = load_proto(mp, NULL);
    cr_assert_neq(st, KF_OK, "a cycle in a function body loads");
    cr_assert(strstr(msg, "function 'Body'"), "message \"%s\" does not name the function", msg);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, too_many_functions) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__FunctionProto *f = function("Many");
    Onnx__FunctionProto **many = calloc(4098, sizeof(void *));
    cr_assert(many);
    for (int i = 0; i < 4097; i++) many[i] = f;
    mp->functions = many;
    mp->n_functions = 4097;
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "more than 4096 model-local functions");
    mp->n_functions = 1; /* f is freed once */
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* ---- the model and graph level ------------------------------------------------- */

Test(onnx_cov, model_level_errors) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__GraphProto *g = mp->graph;
    mp->graph = NULL;
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "model has no graph");
    mp->graph = g;
    Onnx__OperatorSetIdProto **keep = mp->opset_import;
    size_t nkeep = mp->n_opset_import;
    Onnx__OperatorSetIdProto **many = calloc(1026, sizeof(void *));
    cr_assert(many);
    for (int i = 0; i < 1025; i++) many[i] = keep[0];
    mp->opset_import = many;
    mp->n_opset_import = 1025;
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "too many opset imports");
    mp->opset_import = keep;
    mp->n_opset_import = nkeep;
    free(many);
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, unnamed_and_repeated_graph_values) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__GraphProto *g = mp->graph;
    add_info(&g->input, &g->n_input, info(NULL));
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "graph input 1 has no name");
    free(g->input[1]->name);
    g->input[1]->name = sdup("X");
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "graph input 'X' is listed twice");
    onnx__value_info_proto__free_unpacked(g->input[--g->n_input], NULL);

    add_info(&g->output, &g->n_output, info(""));
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "graph output 1 has no name");
    free(g->output[1]->name);
    g->output[1]->name = sdup("never_made");
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "graph output 'never_made' is not produced");
    onnx__value_info_proto__free_unpacked(g->output[--g->n_output], NULL);

    add_info(&g->value_info, &g->n_value_info, info(NULL));
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "value_info without a name");
    /* value_info for a value nothing has: skipped, the model loads */
    free(g->value_info[g->n_value_info - 1]->name);
    g->value_info[g->n_value_info - 1]->name = sdup("unused_name");
    cr_assert_eq(load_proto(mp, NULL), KF_OK, "%s", msg);

    Onnx__TensorProto *w = g->initializer[0];
    free(w->name);
    w->name = sdup("");
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "initializer 0 has no name");
    onnx__model_proto__free_unpacked(mp, NULL);
}

Test(onnx_cov, declared_types_out_of_range) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__GraphProto *g = mp->graph;
    Onnx__ValueInfoProto *vi = info("S");
    add_info(&g->value_info, &g->n_value_info, vi);
    vi->type = tensor_type(1, 17);
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "value 'S'", "rank 17 exceeds");
    onnx__type_proto__free_unpacked(vi->type, NULL);
    vi->type = tensor_type(1000, 2);
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "value 'S'", "unknown element type 1000");
    onnx__type_proto__free_unpacked(vi->type, NULL);
    vi->type = tensor_type(1, 2);
    vi->type->tensor_type->shape->dim[1]->dim_value = -4; /* an unnamed symbolic dim, with a warning */
    kf_model *m = NULL;
    cr_assert_eq(load_proto(mp, &m), KF_OK, "%s", msg);
    const kf_type *ts = &m->graph->values[kf_graph_find(m->graph, "S")].type;
    cr_assert(ts->rank == 2 && ts->dims[1] < 0 && ts->syms[1] == 0);
    cr_assert(m->load_warnings == 1 && strstr(m->load_warning, "value 'S'") && strstr(m->load_warning, "-4"), "%s",
              m->load_warning);
    kf_model_free(m);
    vi->type->tensor_type->shape->dim[0]->dim_value = INT64_MAX / 2;
    vi->type->tensor_type->shape->dim[1]->dim_value = 3;
    EXPECT(load_proto(mp, NULL), KF_ERR_BAD_MODEL, "value 'S'", "dimension product overflows");
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* doc strings on every value kind, a graph name and doc: kept through a
 * round trip. */
Test(onnx_cov, doc_strings_round_trip) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__GraphProto *g = mp->graph;
    free(g->name);
    g->name = sdup("documented_graph");
    g->doc_string = sdup("graph doc");
    g->initializer[0]->doc_string = sdup("weight doc");
    g->input[0]->doc_string = sdup("input doc");
    g->output[0]->doc_string = sdup("output doc");
    Onnx__ValueInfoProto *vi = info("S");
    vi->doc_string = sdup("inner doc");
    add_info(&g->value_info, &g->n_value_info, vi);
    kf_model *m;
    cr_assert_eq(load_proto(mp, &m), KF_OK, "%s", msg);
    cr_assert_str_eq(m->graph->doc, "graph doc");
    cr_assert_str_eq(m->graph->name, "documented_graph");
    const char *names[4] = {"W", "X", "Y", "S"}, *docs[4] = {"weight doc", "input doc", "output doc", "inner doc"};
    for (int i = 0; i < 4; i++) {
        kf_id v = kf_graph_find(m->graph, names[i]);
        cr_assert(v, "no value %s", names[i]);
        const char *d = kf_value_at(m->graph, v)->doc;
        cr_assert(d && !strcmp(d, docs[i]), "%s: doc '%s', want '%s'", names[i], d ? d : "(none)", docs[i]);
    }
    round_trips(m);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* ---- tensors ---------------------------------------------------------------- */

static const int64_t d23[2] = {2, 3};

/* Adds initializer T of the given proto, used by nothing: loaded (and
 * checked) all the same. */
static kf_status load_with_init(Onnx__ModelProto *mp, Onnx__TensorProto *t, kf_model **keep) {
    add_init(mp, t);
    kf_status st = load_proto(mp, keep);
    onnx__tensor_proto__free_unpacked(mp->graph->initializer[--mp->graph->n_initializer], NULL);
    return st;
}

Test(onnx_cov, refused_tensor_kinds) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__TensorProto *t = tensor("cplx", 14 /* COMPLEX64 */, 2, d23);
    EXPECT(load_with_init(mp, t, NULL), KF_ERR_UNSUPPORTED, "tensor 'cplx'", "complex");
    int64_t d17[17];
    for (int i = 0; i < 17; i++) d17[i] = 1;
    t = tensor("deep", 1, 17, d17);
    EXPECT(load_with_init(mp, t, NULL), KF_ERR_BAD_MODEL, "tensor 'deep'", "rank 17 exceeds");
    t = tensor("seg", 1, 2, d23);
    t->segment = malloc(sizeof *t->segment);
    cr_assert(t->segment);
    onnx__tensor_proto__segment__init(t->segment);
    EXPECT(load_with_init(mp, t, NULL), KF_ERR_UNSUPPORTED, "tensor 'seg'", "segmented");
    t = tensor("sext", 8 /* STRING */, 2, d23);
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    EXPECT(load_with_init(mp, t, NULL), KF_ERR_BAD_MODEL, "tensor 'sext'", "string tensors cannot use external data");
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* Initializers stored in each typed field (not raw_data) load with their
 * values and survive a round trip. */
Test(onnx_cov, typed_fields_of_every_dtype) {
    Onnx__ModelProto *mp = proto_of(base_text);
    const int dts[] = {KF_DT_DOUBLE, KF_DT_UINT32, KF_DT_UINT64, KF_DT_FLOAT16, KF_DT_BFLOAT16,
                       KF_DT_INT8,   KF_DT_INT16,  KF_DT_STRING, KF_DT_INT64,   KF_DT_FLOAT};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        int dt = dts[k];
        char name[32];
        snprintf(name, sizeof name, "t%d", dt);
        Onnx__TensorProto *t = tensor(name, dt, 2, d23);
        int64_t v[6];
        for (int i = 0; i < 6; i++) v[i] = (int64_t)(tu_uniform(0, 100));
        switch (dt) {
        case KF_DT_DOUBLE:
            t->n_double_data = 6;
            t->double_data = malloc(6 * sizeof(double));
            for (int i = 0; i < 6; i++) t->double_data[i] = (double)v[i] + 0.5;
            break;
        case KF_DT_UINT32:
        case KF_DT_UINT64:
            t->n_uint64_data = 6;
            t->uint64_data = malloc(6 * sizeof(uint64_t));
            for (int i = 0; i < 6; i++) t->uint64_data[i] = (uint64_t)v[i];
            break;
        case KF_DT_INT64:
            t->n_int64_data = 6;
            t->int64_data = malloc(6 * sizeof(int64_t));
            for (int i = 0; i < 6; i++) t->int64_data[i] = v[i];
            break;
        case KF_DT_FLOAT:
            t->n_float_data = 6;
            t->float_data = malloc(6 * sizeof(float));
            for (int i = 0; i < 6; i++) t->float_data[i] = (float)v[i];
            break;
        case KF_DT_STRING:
            t->n_string_data = 6;
            t->string_data = calloc(6, sizeof(ProtobufCBinaryData));
            for (int i = 0; i < 6; i++) {
                char s[32];
                int n = i == 2 ? 0 : snprintf(s, sizeof s, "s%lld", (long long)v[i]); /* one empty string */
                t->string_data[i].len = (size_t)n;
                t->string_data[i].data = n ? (uint8_t *)sdup(s) : NULL;
            }
            break;
        default:
            t->n_int32_data = 6;
            t->int32_data = malloc(6 * sizeof(int32_t));
            for (int i = 0; i < 6; i++) t->int32_data[i] = (int32_t)v[i];
            break;
        }
        kf_model *m;
        cr_assert_eq(load_with_init(mp, t, &m), KF_OK, "dtype %d: %s", dt, msg);
        const kf_tensor *lt = kf_value_at(m->graph, kf_graph_find(m->graph, name))->init;
        cr_assert(lt && lt->dtype == (kf_dtype)dt && lt->numel == 6, "dtype %d: wrong tensor", dt);
        for (int i = 0; i < 6; i++) {
            bool ok;
            switch (dt) {
            case KF_DT_DOUBLE: ok = ((double *)lt->data)[i] == (double)v[i] + 0.5; break;
            case KF_DT_FLOAT: ok = ((float *)lt->data)[i] == (float)v[i]; break;
            case KF_DT_FLOAT16:
            case KF_DT_BFLOAT16: ok = ((uint16_t *)lt->data)[i] == (uint16_t)v[i]; break;
            case KF_DT_STRING: {
                const kf_bytes *s = &((kf_bytes *)lt->data)[i];
                char want[32];
                int n = i == 2 ? 0 : snprintf(want, sizeof want, "s%lld", (long long)v[i]);
                ok = s->len == (size_t)n && (!n || !memcmp(s->ptr, want, (size_t)n));
                break;
            }
            default: ok = kf_get_i64(lt, i) == v[i]; break;
            }
            cr_assert(ok, "dtype %d: element %d differs from %lld", dt, i, (long long)v[i]);
        }
        round_trips(m);
        kf_model_free(m);
    }
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* ---- saving into places that refuse the write ----------------------------------- */

static char *temp_dir(void) {
    static char d[64];
    snprintf(d, sizeof d, "/tmp/kf_onnx_cov_XXXXXX");
    cr_assert(mkdtemp(d), "mkdtemp");
    return d;
}

static void rm_rf(const char *d) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* A model with one weight of at least 1 KiB (external data takes tensors
 * from 1024 bytes). */
static const char *big_text = "opset 13\n"
                              "input X float[16, 32]\n"
                              "const Wbig float[16, 32] = random\n"
                              "Y = Add(X, Wbig)\n"
                              "output Y\n";

static const char *huge_text = "opset 13\n"
                               "input X float[32, 64]\n"
                               "const Wbig float[32, 64] = random\n"
                               "Y = Add(X, Wbig)\n"
                               "output Y\n";

static kf_status save_msg(const kf_model *m, const char *path) {
    kf_clear_error();
    kf_status st = kf_model_save(m, path);
    snprintf(msg, sizeof msg, "%s", st ? kf_last_error() : "");
    return st;
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

Test(onnx_cov, save_into_missing_folder_or_onto_a_folder) {
    char *d = temp_dir();
    kf_model *m = gt_parse(base_text);
    char path[256];
    snprintf(path, sizeof path, "%s/no/such/folder/m.onnx", d);
    EXPECT(save_msg(m, path), KF_ERR_IO, path);
    /* the path is a non-empty folder: the temporary file is written, the
     * rename fails, the temporary is removed */
    snprintf(path, sizeof path, "%s/taken", d);
    cr_assert_eq(mkdir(path, 0755), 0);
    char inner[300];
    snprintf(inner, sizeof inner, "%s/keep", path);
    FILE *f = fopen(inner, "w");
    cr_assert(f);
    fclose(f);
    EXPECT(save_msg(m, path), KF_ERR_IO, "cannot move the new model", path);
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    cr_assert(!exists(tmp), "the temporary %s was left behind", tmp);
    kf_model_free(m);
    rm_rf(d);
}

Test(onnx_cov, external_data_save_failures_and_round_trip) {
    char *d = temp_dir();
    kf_model *m = gt_parse(big_text);
    setenv("KFUSE_EXTERNAL_DATA", "1", 1);
    char path[256], data[300], tmp[320];
    /* the data file's temporary name is taken by a folder */
    snprintf(path, sizeof path, "%s/a.onnx", d);
    snprintf(tmp, sizeof tmp, "%s.data.tmp%ld", path, (long)getpid());
    cr_assert_eq(mkdir(tmp, 0755), 0);
    EXPECT(save_msg(m, path), KF_ERR_IO, "a.onnx.data");
    cr_assert(!exists(path), "a model was written without its data");
    rm_rf(tmp);
    /* the data file's final name is a non-empty folder: the rename fails */
    snprintf(data, sizeof data, "%s.data", path);
    cr_assert_eq(mkdir(data, 0755), 0);
    snprintf(tmp, sizeof tmp, "%s/keep", data);
    FILE *f = fopen(tmp, "w");
    cr_assert(f);
    fclose(f);
    EXPECT(save_msg(m, path), KF_ERR_IO, "cannot move external data", data);
    cr_assert(!exists(path), "a model was written without its data");
    rm_rf(data);
    /* and when nothing is in the way, the model and its data load back equal */
    cr_assert_eq(save_msg(m, path), KF_OK, "%s", msg);
    cr_assert(exists(data), "no external data file %s", data);
    kf_model *back = NULL;
    cr_assert_eq(kf_model_load(path, &back), KF_OK, "%s", kf_last_error());
    char why[512];
    cr_assert(kf_model_equal(m, back, why, sizeof why), "external-data round trip differs: %s", why);
    kf_model_free(back);
    unsetenv("KFUSE_EXTERNAL_DATA");
    kf_model_free(m);
    rm_rf(d);
}

/* A full disk (RLIMIT_FSIZE in a child): the model, then the external data,
 * cannot be written; the error is KF_ERR_IO naming the file or tensor, and
 * no half-written model is left at the path. */
Test(onnx_cov, full_disk_save_is_clean_error) {
    /* in this process (Criterion runs each test in its own): a forked
     * child's _exit would drop its coverage counts */
    char *d = temp_dir();
    char path[256], data[300];
    snprintf(path, sizeof path, "%s/full.onnx", d);
    snprintf(data, sizeof data, "%s.data", path);
    /* 2 KiB of weight fits stdio's buffer, so the write fails at fclose;
     * 8 KiB is written through at once, so the tensor's write fails */
    kf_model *small = gt_parse(big_text), *large = gt_parse(huge_text);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    for (int ext = 0; ext < 4; ext++) {
        const kf_model *m = ext >= 2 ? large : small;
        if (ext % 2) setenv("KFUSE_EXTERNAL_DATA", "1", 1);
        else unsetenv("KFUSE_EXTERNAL_DATA");
        struct rlimit rl = {512, old.rlim_max}; /* the weight alone is 2 KiB */
        cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
        kf_clear_error();
        kf_status st = kf_model_save(m, path);
        cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
        cr_assert_eq(st, KF_ERR_IO, "case %d: %s: %s", ext, kf_status_name(st), kf_last_error());
        const char *want = ext == 3 ? "tensor 'Wbig'" : ext == 1 ? data : path;
        cr_assert(strstr(kf_last_error(), want), "case %d: message '%s' does not name %s", ext, kf_last_error(), want);
        cr_assert(!exists(path), "case %d: a half-written model was left at the path", ext);
    }
    unsetenv("KFUSE_EXTERNAL_DATA");
    kf_model_free(small);
    kf_model_free(large);
    rm_rf(d);
}

/* ---- allocation failure through every optional field ----------------------------- */

/* A model that sets what test models rarely do: doc strings everywhere, a
 * function with attributes and a node attribute referring to one
 * (ref_attr_name), a string initializer, string and strings attributes, a
 * symbolic dim. Loading and saving it fails cleanly at every allocation. */
Test(onnx_cov, every_optional_field_under_allocation_failure) {
    Onnx__ModelProto *mp = proto_of("opset 13\n"
                                    "input X float[N, 3]\n"
                                    "const W float[2, 3] = random\n"
                                    "S = Add(X, W)\n"
                                    "Y = Relu(S)\n"
                                    "output Y\n");
    Onnx__GraphProto *g = mp->graph;
    g->doc_string = sdup("graph doc");
    g->initializer[0]->doc_string = sdup("weight doc");
    g->input[0]->doc_string = sdup("input doc");
    g->output[0]->doc_string = sdup("output doc");
    Onnx__ValueInfoProto *vi = info("S");
    vi->doc_string = sdup("inner doc");
    add_info(&g->value_info, &g->n_value_info, vi);
    Onnx__TensorProto *st = tensor("names", KF_DT_STRING, 1, (const int64_t[]){2});
    st->n_string_data = 2;
    st->string_data = calloc(2, sizeof(ProtobufCBinaryData));
    st->string_data[0].data = (uint8_t *)sdup("ab");
    st->string_data[0].len = 2;
    add_init(mp, st);
    Onnx__FunctionProto *f = function("F");
    f->doc_string = sdup("function doc");
    const char *fa = "alpha";
    f->n_attribute = 1;
    f->attribute = strs(1, &fa);
    /* the body node: LeakyRelu with alpha referring to the function's */
    Onnx__NodeProto *n = f->node[0];
    free(n->op_type);
    n->op_type = sdup("LeakyRelu");
    n->doc_string = sdup("node doc");
    n->attribute = calloc(3, sizeof(void *));
    Onnx__AttributeProto *ap = malloc(sizeof *ap);
    onnx__attribute_proto__init(ap);
    ap->name = sdup("alpha");
    ap->ref_attr_name = sdup("alpha");
    ap->doc_string = sdup("attribute doc");
    ap->has_type = 1;
    ap->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    n->attribute[0] = ap;
    /* a kind the IR keeps packed (unpacked again when saved) */
    Onnx__AttributeProto *tl = malloc(sizeof *tl);
    onnx__attribute_proto__init(tl);
    tl->name = sdup("tensor_list");
    tl->has_type = 1;
    tl->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSORS;
    n->attribute[1] = tl;
    n->n_attribute = 2;
    add_function(mp, f);
    size_t len;
    uint8_t *bytes = pack(mp, &len);
    onnx__model_proto__free_unpacked(mp, NULL);

    kf_model *m = NULL;
    void *want = NULL;
    size_t wlen = 0;
    cr_assert_eq(kf_model_load_memory(bytes, len, NULL, &m), KF_OK, "%s", kf_last_error());
    cr_assert_eq(m->nfuncs, 1);
    cr_assert_eq(kf_model_save_memory(m, &want, &wlen), KF_OK, "%s", kf_last_error());
    kf_model_free(m);
    uint64_t nth = 1;
    for (;; nth++) {
        void *got = NULL;
        size_t glen = 0;
        m = NULL;
        kf_clear_error();
        kf_alloc_fault_set(nth, false);
        kf_status s = kf_model_load_memory(bytes, len, NULL, &m);
        if (!s) s = kf_model_save_memory(m, &got, &glen);
        bool fired = kf_alloc_fault_fired();
        kf_alloc_fault_set(0, false);
        kf_model_free(m);
        if (!fired) {
            cr_assert_eq(s, KF_OK, "N=%llu: %s", (unsigned long long)nth, kf_last_error());
            cr_assert(glen == wlen && !memcmp(got, want, wlen), "N=%llu: output differs", (unsigned long long)nth);
            free(got);
            break;
        }
        cr_assert_eq(s, KF_ERR_NOMEM, "allocation %llu failed, got %s: %s", (unsigned long long)nth,
                     kf_status_name(s), kf_last_error());
        cr_assert(kf_last_error()[0], "N=%llu: no message", (unsigned long long)nth);
        cr_assert_null(got);
    }
    cr_log_info("every optional field: %llu allocations to load and save\n", (unsigned long long)(nth - 1));
    free(want);
    free(bytes);
    LEAK_CHECK();
}

/* ---- arguments, files and tensor files ---------------------------------------- */

Test(onnx_cov, null_arguments_are_invalid_arg) {
    kf_model *m = gt_parse(base_text), *out = NULL;
    void *b = NULL;
    size_t len = 0;
    cr_assert_eq(kf_model_load(NULL, &out), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "kf_model_load"), "%s", kf_last_error());
    cr_assert_eq(kf_model_load("x.onnx", NULL), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_model_load_memory(NULL, 4, NULL, &out), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_model_load_memory("abcd", 4, NULL, NULL), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "kf_model_load_memory"), "%s", kf_last_error());
    cr_assert_eq(kf_model_save_memory(NULL, &b, &len), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_model_save_memory(m, NULL, &len), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_model_save_memory(m, &b, NULL), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "kf_model_save_memory"), "%s", kf_last_error());
    cr_assert_eq(kf_model_save(NULL, "x.onnx"), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_model_save(m, NULL), KF_ERR_INVALID_ARG);
    cr_assert(strstr(kf_last_error(), "kf_model_save"), "%s", kf_last_error());
    cr_assert_null(out);
    kf_model_free(m);
}

/* Loading a folder, a missing file, and a model named without a folder
 * (relative to the working directory). */
Test(onnx_cov, load_from_odd_paths) {
    char *d = temp_dir();
    kf_model *out = NULL;
    kf_status st = kf_model_load(d, &out);
    cr_assert_eq(st, KF_ERR_IO, "a folder: %s", kf_status_name(st));
    cr_assert(strstr(kf_last_error(), d), "message '%s' does not name %s", kf_last_error(), d);
    char path[256];
    snprintf(path, sizeof path, "%s/missing.onnx", d);
    st = kf_model_load(path, &out);
    cr_assert_eq(st, KF_ERR_IO, "a missing file: %s", kf_status_name(st));
    cr_assert(strstr(kf_last_error(), "missing.onnx"), "%s", kf_last_error());
    kf_model *m = gt_parse(base_text);
    snprintf(path, sizeof path, "%s/here.onnx", d);
    cr_assert_eq(kf_model_save(m, path), KF_OK, "%s", kf_last_error());
    char cwd[1024];
    cr_assert(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(d), 0);
    st = kf_model_load("here.onnx", &out);
    cr_assert_eq(chdir(cwd), 0);
    cr_assert_eq(st, KF_OK, "%s", kf_last_error());
    char why[256];
    cr_assert(kf_model_equal(m, out, why, sizeof why), "%s", why);
    kf_model_free(out);
    /* an empty file is read (not mapped) and is not a model */
    snprintf(path, sizeof path, "%s/empty.onnx", d);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fclose(f);
    out = NULL;
    st = kf_model_load(path, &out);
    cr_assert_neq(st, KF_OK, "an empty file loads");
    cr_assert(strstr(kf_last_error(), "empty.onnx") || strstr(kf_last_error(), "graph"), "%s", kf_last_error());
    kf_model_free(out);
    kf_model_free(m);
    rm_rf(d);
}

Test(onnx_cov, tensor_files_round_trip_and_fail_cleanly) {
    char *d = temp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/t.pb", d);
    const int64_t dims[2] = {3, 4};
    kf_tensor t = tu_rand(KF_DT_FLOAT, 2, dims, -1, 1);
    cr_assert_eq(kf_onnx_write_tensor_file(path, &t, "weights"), KF_OK, "%s", kf_last_error());
    kf_tensor back = {0};
    char *name = NULL;
    cr_assert_eq(kf_onnx_read_tensor_file(path, &back, &name), KF_OK, "%s", kf_last_error());
    cr_assert_str_eq(name, "weights");
    cr_assert(kf_tensor_equal(&t, &back), "tensor file round trip differs");
    kf_free(name);
    kf_tensor_release(&back);
    cr_assert_eq(kf_onnx_read_tensor_file(path, &back, NULL), KF_OK, "%s", kf_last_error());
    kf_tensor_release(&back);
    /* a string tensor, one element empty */
    kf_tensor s = {0};
    const int64_t sd[1] = {3};
    cr_assert_eq(kf_tensor_alloc(&s, KF_DT_STRING, 1, sd), KF_OK);
    const char *words[3] = {"alpha", "", "gamma"};
    for (int i = 0; i < 3; i++) {
        kf_bytes *b = &((kf_bytes *)s.data)[i];
        b->ptr = kf_strdup(words[i]);
        b->len = strlen(words[i]);
    }
    cr_assert_eq(kf_onnx_write_tensor_file(path, &s, "words"), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_onnx_read_tensor_file(path, &back, NULL), KF_OK, "%s", kf_last_error());
    cr_assert(kf_tensor_equal(&s, &back), "string tensor file round trip differs");
    kf_tensor_release(&back);
    kf_tensor_release(&s);
    /* write into a missing folder; onto a full device */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/none/t.pb", d);
    cr_assert_eq(kf_onnx_write_tensor_file(bad, &t, "w"), KF_ERR_IO);
    cr_assert(strstr(kf_last_error(), bad), "%s", kf_last_error());
    if (access("/dev/full", W_OK) == 0) {
        cr_assert_eq(kf_onnx_write_tensor_file("/dev/full", &t, "w"), KF_ERR_IO);
        cr_assert(strstr(kf_last_error(), "/dev/full"), "%s", kf_last_error());
    }
    /* read a missing file, and one that is not a TensorProto */
    cr_assert_eq(kf_onnx_read_tensor_file(bad, &back, &name), KF_ERR_IO);
    cr_assert_null(name);
    snprintf(path, sizeof path, "%s/junk.pb", d);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    /* continuation bits set on every byte: the first varint never ends */
    for (int i = 0; i < 64; i++) fputc((int)tu_uniform(0, 256) | 0x80, f);
    fclose(f);
    kf_status st = kf_onnx_read_tensor_file(path, &back, NULL);
    cr_assert_eq(st, KF_ERR_BAD_MODEL, "junk: %s: %s", kf_status_name(st), kf_last_error());
    cr_assert(strstr(kf_last_error(), "junk.pb"), "%s", kf_last_error());
    kf_tensor_release(&t);
    rm_rf(d);
}

/* ---- nodes and attributes the usual writers do not produce ---------------------- */

static Onnx__AttributeProto *attr(const char *name) {
    Onnx__AttributeProto *a = malloc(sizeof *a);
    cr_assert(a);
    onnx__attribute_proto__init(a);
    a->name = sdup(name);
    return a;
}

static void add_attr(Onnx__NodeProto *n, Onnx__AttributeProto *a) {
    n->attribute = grow(n->attribute, n->n_attribute, sizeof(void *));
    n->attribute[n->n_attribute++] = a;
}

/* Untyped (IR v1) float and graph-list attributes, empty lists, a strings
 * list with an empty string, an unnamed node with an unnamed extra output:
 * all load and round-trip. */
Test(onnx_cov, unusual_attributes_and_nodes_round_trip) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__NodeProto *n = NULL;
    for (size_t i = 0; i < mp->graph->n_node; i++)
        if (!strcmp(mp->graph->node[i]->op_type, "Relu")) n = mp->graph->node[i];
    cr_assert(n);
    Onnx__AttributeProto *a = attr("untyped_f");
    a->has_f = 1;
    const float fval = (float)tu_uniform(-4, 4);
    a->f = fval;
    add_attr(n, a);
    a = attr("untyped_graphs");
    a->n_graphs = 1;
    a->graphs = calloc(2, sizeof(void *));
    a->graphs[0] = malloc(sizeof(Onnx__GraphProto));
    onnx__graph_proto__init(a->graphs[0]);
    a->graphs[0]->name = sdup("inner");
    add_attr(n, a);
    const int kinds[3] = {ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS,
                          ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS};
    const char *names[3] = {"no_floats", "no_ints", "no_strings"};
    for (int k = 0; k < 3; k++) {
        a = attr(names[k]);
        a->has_type = 1;
        a->type = kinds[k];
        add_attr(n, a);
    }
    a = attr("words");
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRINGS;
    a->n_strings = 2;
    a->strings = calloc(2, sizeof(ProtobufCBinaryData));
    a->strings[1].data = (uint8_t *)sdup("xy");
    a->strings[1].len = 2;
    add_attr(n, a);
    a = attr("empty_s");
    a->has_type = 1;
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    a->has_s = 1;
    add_attr(n, a);
    free(n->name);
    n->name = NULL;
    kf_model *m;
    cr_assert_eq(load_proto(mp, &m), KF_OK, "%s", msg);
    const kf_node *ln = NULL;
    for (uint32_t i = 1; i < m->graph->nnodes; i++)
        if (!strcmp(m->graph->nodes[i].op_type, "Relu")) ln = &m->graph->nodes[i];
    cr_assert(ln);
    const kf_attr *f = kf_attr_find(ln, "untyped_f");
    cr_assert(f && f->type == KF_ATTR_FLOAT && f->f == fval, "untyped float attribute lost");
    const kf_attr *ws = kf_attr_find(ln, "words");
    cr_assert(ws && ws->n == 2 && ws->strings[0].len == 0 && ws->strings[1].len == 2, "strings attribute lost");
    for (int k = 0; k < 3; k++) {
        const kf_attr *e = kf_attr_find(ln, names[k]);
        cr_assert(e && e->n == 0, "%s: empty list lost", names[k]);
    }
    round_trips(m);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* A function in the default domain (written back without a domain) and
 * one in "ai.onnx" spelled out: the lookup treats both as the default. */
Test(onnx_cov, default_domain_functions) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__FunctionProto *f = function("Plain");
    free(f->domain);
    f->domain = sdup("");
    add_function(mp, f);
    f = function("Spelled");
    free(f->domain);
    f->domain = sdup("ai.onnx");
    add_function(mp, f);
    kf_model *m;
    cr_assert_eq(load_proto(mp, &m), KF_OK, "%s", msg);
    cr_assert(kf_model_function(m, "ai.onnx", "Plain"), "'ai.onnx' does not find the default-domain function");
    cr_assert(kf_model_function(m, "", "Spelled"), "'' does not find the 'ai.onnx' function");
    cr_assert(kf_model_function(m, NULL, "Spelled"), "NULL does not find the 'ai.onnx' function");
    cr_assert_null(kf_model_function(m, "custom", "Plain"));
    cr_assert_null(kf_model_function(m, "", NULL));
    cr_assert_null(kf_model_function(NULL, "", "Plain"));
    round_trips(m);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* ---- kf_model_equal: each kind of difference the other suite does not make -------- */

static const char *eq_text = "opset 13\n"
                             "input X float[N, 3]\n"
                             "const W float[2, 3] = random\n"
                             "S = Add(X, W)\n"
                             "T = Relu(S)\n"
                             "Y = LeakyRelu(T) {alpha=0.25}\n"
                             "output Y\n";

static kf_node *op_node(kf_model *m, const char *op) {
    for (uint32_t i = 1; i < m->graph->nnodes; i++)
        if (!m->graph->nodes[i].dead && !strcmp(m->graph->nodes[i].op_type, op)) return &m->graph->nodes[i];
    cr_assert_fail("no %s node", op);
    return NULL;
}

static void rename_str(char **s, const char *to) {
    kf_free(*s);
    *s = kf_strdup(to);
}

static void add_words(kf_model *m, const char *second) {
    kf_bytes w[2] = {{(char *)"one", 3}, {(char *)second, strlen(second)}};
    kf_attr a = {.name = (char *)"words", .type = KF_ATTR_STRINGS, .n = 2, .strings = w};
    cr_assert_eq(kf_node_add_attr(op_node(m, "Relu"), &a), KF_OK, "%s", kf_last_error());
}

static void add_list(kf_model *m, kf_attr_type type, int n, float first) {
    float fl[2] = {first, 2.0f};
    int64_t in[2] = {(int64_t)first, 2};
    kf_attr a = {.name = (char *)"list", .type = type, .n = n, .floats = fl, .ints = in};
    if (type == KF_ATTR_FLOATS) a.ints = NULL;
    else a.floats = NULL;
    cr_assert_eq(kf_node_add_attr(op_node(m, "Relu"), &a), KF_OK, "%s", kf_last_error());
}

typedef void (*mutate_fn)(kf_model *a, kf_model *b);

static void m_opset_domain(kf_model *a, kf_model *b) { (void)a, rename_str(&b->opsets[0].domain, "com.example"); }
static void m_input_name(kf_model *a, kf_model *b) {
    (void)a;
    rename_str(&b->graph->values[b->graph->inputs[0]].name, "X2");
}
static void m_input_rank(kf_model *a, kf_model *b) { (void)a, b->graph->values[b->graph->inputs[0]].type.rank = 3; }
static void m_input_sym(kf_model *a, kf_model *b) {
    (void)a;
    kf_type *t = &b->graph->values[b->graph->inputs[0]].type;
    t->syms[0] = kf_graph_sym(b->graph, "batch");
    cr_assert(t->syms[0]);
}
static void m_output_name(kf_model *a, kf_model *b) {
    (void)a;
    rename_str(&b->graph->values[b->graph->outputs[0]].name, "Y2");
}
static void m_op_type(kf_model *a, kf_model *b) { (void)a, rename_str(&op_node(b, "Relu")->op_type, "Sigmoid"); }
static void m_domain(kf_model *a, kf_model *b) { (void)a, rename_str(&op_node(b, "Relu")->domain, "com.example"); }
static void m_nattrs(kf_model *a, kf_model *b) { (void)a, add_words(b, "two"); }
static void m_out_name(kf_model *a, kf_model *b) {
    (void)a;
    rename_str(&b->graph->values[op_node(b, "Relu")->out[0]].name, "T2");
}
static void m_init_gone(kf_model *a, kf_model *b) { /* b reads W as a plain value */
    (void)a;
    kf_value *w = &b->graph->values[kf_graph_find(b->graph, "W")];
    kf_tensor_free(w->init);
    w->init = NULL;
}
static void m_strings(kf_model *a, kf_model *b) {
    add_words(a, "two");
    add_words(b, "tw0");
}
static void m_strings_len(kf_model *a, kf_model *b) {
    add_words(a, "two");
    add_words(b, "three");
}
static void m_floats(kf_model *a, kf_model *b) {
    add_list(a, KF_ATTR_FLOATS, 2, 1.0f);
    add_list(b, KF_ATTR_FLOATS, 2, 1.5f);
}
static void m_ints(kf_model *a, kf_model *b) {
    add_list(a, KF_ATTR_INTS, 2, 1.0f);
    add_list(b, KF_ATTR_INTS, 2, 3.0f);
}
static void m_list_len(kf_model *a, kf_model *b) {
    add_list(a, KF_ATTR_INTS, 1, 1.0f);
    add_list(b, KF_ATTR_INTS, 2, 1.0f);
}

static void expect_diff(const char *what, mutate_fn fn, const char *sub) {
    kf_model *a = gt_parse(eq_text), *b = gt_copy(a); /* random W: one draw for both */
    char why[256] = "";
    cr_assert(kf_model_equal(a, b, why, sizeof why), "%s: the two copies differ before: %s", what, why);
    fn(a, b);
    cr_assert_not(kf_model_equal(a, b, why, sizeof why), "%s: difference not seen", what);
    cr_assert(strstr(why, sub), "%s: reason '%s' does not mention '%s'", what, why, sub);
    cr_assert_not(kf_model_equal(a, b, NULL, 0), "%s: difference not seen without a reason buffer", what);
    kf_model_free(a);
    kf_model_free(b);
}

Test(onnx_cov, model_equal_sees_each_difference) {
    expect_diff("opset domain", m_opset_domain, "opset import 0");
    expect_diff("input name", m_input_name, "input 0 ('X')");
    expect_diff("input rank", m_input_rank, "input 0 ('X')");
    expect_diff("input symbol", m_input_sym, "input 0 ('X')");
    expect_diff("output name", m_output_name, "output 0 ('Y')");
    expect_diff("op type", m_op_type, "(Relu) differs");
    expect_diff("domain", m_domain, "(Relu) differs");
    expect_diff("attribute count", m_nattrs, "(Relu) differs");
    expect_diff("output value name", m_out_name, "output 0 differs");
    expect_diff("initializer gone", m_init_gone, "initializer 'W'");
    expect_diff("strings", m_strings, "attribute 'words'");
    expect_diff("strings length", m_strings_len, "attribute 'words'");
    expect_diff("floats", m_floats, "attribute 'list'");
    expect_diff("ints", m_ints, "attribute 'list'");
    expect_diff("list length", m_list_len, "attribute 'list'");
}

/* Dead nodes on either side are skipped: the live graphs compare equal. */
Test(onnx_cov, model_equal_skips_dead_nodes) {
    kf_model *a = gt_parse(eq_text), *b = gt_copy(a); /* random W: one draw for both */
    /* a: a dead extra node at the end; b: a dead copy first */
    kf_id in[1] = {kf_graph_find(a->graph, "S")}, out, n;
    cr_assert_eq(kf_graph_add_value(a->graph, "dead_out", &out), KF_OK);
    cr_assert_eq(kf_graph_add_node(a->graph, "Relu", "", "dead_a", in, 1, &out, 1, &n), KF_OK, "%s", kf_last_error());
    kf_node_at(a->graph, n)->dead = true;
    char why[256] = "";
    cr_assert(kf_model_equal(a, b, why, sizeof why), "a dead node counted: %s", why);
    cr_assert(kf_model_equal(b, a, why, sizeof why), "a dead node counted (b, a): %s", why);
    kf_model_free(a);
    kf_model_free(b);
}

/* ---- optional inputs/outputs and external data's rarer keys ----------------------- */

/* Empty optional inputs and outputs (Clip without bounds, Dropout without
 * its mask) on nodes without a name load, keep their empty slots, and
 * round-trip. */
Test(onnx_cov, empty_optional_slots_and_unnamed_nodes) {
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__GraphProto *g = mp->graph;
    Onnx__NodeProto *relu = NULL;
    for (size_t i = 0; i < g->n_node; i++)
        if (!strcmp(g->node[i]->op_type, "Relu")) relu = g->node[i];
    cr_assert(relu);
    free(relu->output[0]);
    relu->output[0] = sdup("R");
    Onnx__NodeProto *clip = node1("Clip", "", "R", "C");
    free(clip->name);
    clip->name = NULL;
    clip->input = grow(clip->input, 1, sizeof(char *));
    clip->input[1] = sdup("");
    clip->input = grow(clip->input, 2, sizeof(char *));
    clip->input[2] = sdup("");
    clip->n_input = 3;
    Onnx__NodeProto *drop = node1("Dropout", "", "C", "Y");
    drop->output = grow(drop->output, 1, sizeof(char *));
    drop->output[1] = sdup("");
    drop->n_output = 2;
    g->node = grow(g->node, g->n_node, sizeof(void *));
    g->node[g->n_node++] = clip;
    g->node = grow(g->node, g->n_node, sizeof(void *));
    g->node[g->n_node++] = drop;
    kf_model *m;
    cr_assert_eq(load_proto(mp, &m), KF_OK, "%s", msg);
    kf_node *c = op_node(m, "Clip");
    cr_assert(c->nin == 3 && c->in[0] && !c->in[1] && !c->in[2], "Clip's empty inputs not kept");
    kf_node *d = op_node(m, "Dropout");
    cr_assert(d->nout == 2 && d->out[0] && !d->out[1], "Dropout's empty output not kept");
    round_trips(m);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

static void add_kv(Onnx__TensorProto *t, const char *k, const char *v) {
    Onnx__StringStringEntryProto *e = malloc(sizeof *e);
    cr_assert(e);
    onnx__string_string_entry_proto__init(e);
    e->key = k ? sdup(k) : NULL;
    e->value = v ? sdup(v) : NULL;
    t->external_data = grow(t->external_data, t->n_external_data, sizeof(void *));
    t->external_data[t->n_external_data++] = e;
}

/* External data at an offset, with keys kfuse ignores (a checksum, an
 * entry without a value) loads the right bytes; a location that is a
 * folder, a missing file, or a model folder that does not exist are
 * errors naming the tensor. */
Test(onnx_cov, external_data_keys_and_places) {
    char *d = temp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/w.bin", d);
    float w[6 + 4];
    for (int i = 0; i < 10; i++) w[i] = (float)tu_uniform(-3, 3);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(w, sizeof w, 1, f), 1);
    fclose(f);
    snprintf(path, sizeof path, "%s/sub", d);
    cr_assert_eq(mkdir(path, 0755), 0);

    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__TensorProto *t = tensor("ext", KF_DT_FLOAT, 2, d23);
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    add_kv(t, "checksum", "ignored");
    add_kv(t, "location", "w.bin");
    add_kv(t, "offset", "16");
    add_kv(t, "length", "24");
    add_kv(t, "length", NULL); /* no value: skipped */
    add_init(mp, t);
    size_t len;
    uint8_t *b = pack(mp, &len);
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load_memory(b, len, d, &m), KF_OK, "%s", kf_last_error());
    const kf_tensor *lt = kf_value_at(m->graph, kf_graph_find(m->graph, "ext"))->init;
    cr_assert(lt && lt->numel == 6 && !memcmp(lt->data, w + 4, 6 * sizeof(float)), "wrong external bytes");
    kf_model_free(m);
    free(b);

    char *locs[2] = {"sub", "nothing_here.bin"};
    kf_status want[2] = {KF_ERR_BAD_MODEL, KF_ERR_IO};
    for (int k = 0; k < 2; k++) {
        free(t->external_data[1]->value);
        t->external_data[1]->value = sdup(locs[k]);
        b = pack(mp, &len);
        m = NULL;
        kf_status st = kf_model_load_memory(b, len, d, &m);
        free(b);
        cr_assert_eq(st, want[k], "%s: %s: %s", locs[k], kf_status_name(st), kf_last_error());
        cr_assert(strstr(kf_last_error(), "tensor 'ext'") && strstr(kf_last_error(), locs[k]), "%s",
                  kf_last_error());
        cr_assert_null(m);
    }
    b = pack(mp, &len);
    snprintf(path, sizeof path, "%s/no_such_folder", d);
    kf_status st = kf_model_load_memory(b, len, path, &m);
    free(b);
    cr_assert_eq(st, KF_ERR_IO, "%s: %s", kf_status_name(st), kf_last_error());
    cr_assert(strstr(kf_last_error(), "no_such_folder"), "%s", kf_last_error());
    onnx__model_proto__free_unpacked(mp, NULL);
    rm_rf(d);
}

/* Writing and reading a tensor file with the Nth allocation failing, for
 * every N: KF_ERR_NOMEM with a message, nothing returned; past the last
 * allocation the tensor and its name come back equal. */
Test(onnx_cov, tensor_files_under_allocation_failure) {
    char *d = temp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/t.pb", d);
    const int64_t dims[2] = {2, 5};
    kf_tensor t = tu_rand(KF_DT_FLOAT, 2, dims, -1, 1);
    uint64_t n = 1;
    for (;; n++) {
        kf_tensor back = {0};
        char *name = NULL;
        kf_clear_error();
        kf_alloc_fault_set(n, false);
        kf_status st = kf_onnx_write_tensor_file(path, &t, "named");
        if (!st) st = kf_onnx_read_tensor_file(path, &back, &name);
        bool fired = kf_alloc_fault_fired();
        kf_alloc_fault_set(0, false);
        if (!fired) {
            cr_assert_eq(st, KF_OK, "N=%llu: %s", (unsigned long long)n, kf_last_error());
            cr_assert(kf_tensor_equal(&t, &back) && name && !strcmp(name, "named"), "N=%llu: differs",
                      (unsigned long long)n);
            kf_tensor_release(&back);
            kf_free(name);
            break;
        }
        cr_assert_eq(st, KF_ERR_NOMEM, "N=%llu: %s: %s", (unsigned long long)n, kf_status_name(st), kf_last_error());
        cr_assert(kf_last_error()[0], "N=%llu: no message", (unsigned long long)n);
        cr_assert_null(name);
        cr_assert_null(back.data);
    }
    cr_assert_gt(n, 3, "too few allocations to be walking anything");
    kf_tensor_release(&t);
    rm_rf(d);
    LEAK_CHECK();
}

/* No IR version in the file (written back as 8), a node of a custom
 * domain with its opset import: loads, saves and loads back equal. */
Test(onnx_cov, custom_domain_node_and_no_ir_version) {
    Onnx__ModelProto *mp = proto_of(base_text);
    mp->has_ir_version = 0;
    mp->ir_version = 0;
    mp->opset_import = grow(mp->opset_import, mp->n_opset_import, sizeof(void *));
    mp->opset_import[mp->n_opset_import++] = opset("com.example", 1);
    Onnx__GraphProto *g = mp->graph;
    Onnx__NodeProto *c = node1("MyOp", "custom_node", "Y", "Z");
    c->domain = sdup("com.example");
    g->node = grow(g->node, g->n_node, sizeof(void *));
    g->node[g->n_node++] = c;
    free(g->output[0]->name);
    g->output[0]->name = sdup("Z");
    kf_model *m;
    cr_assert_eq(load_proto(mp, &m), KF_OK, "%s", msg);
    cr_assert_eq(m->ir_version, 0);
    kf_node *n = op_node(m, "MyOp");
    cr_assert_str_eq(n->domain, "com.example");
    void *b;
    size_t len;
    cr_assert_eq(kf_model_save_memory(m, &b, &len), KF_OK, "%s", kf_last_error());
    Onnx__ModelProto *back = onnx__model_proto__unpack(NULL, len, b);
    free(b);
    cr_assert(back && back->ir_version == 8, "no IR version written as 8");
    onnx__model_proto__free_unpacked(back, NULL);
    round_trips(m);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
}

/* kf_model_save to a bare file name (the working folder), of a model with
 * a string initializer, KFUSE_EXTERNAL_DATA set to something other than 1
 * (no external data): loads back equal, and no data file is written. */
Test(onnx_cov, save_relative_with_strings) {
    char *d = temp_dir();
    Onnx__ModelProto *mp = proto_of(base_text);
    Onnx__TensorProto *t = tensor("label", KF_DT_STRING, 1, (const int64_t[]){1});
    t->n_string_data = 1;
    t->string_data = calloc(1, sizeof(ProtobufCBinaryData));
    t->string_data[0].data = (uint8_t *)sdup("tag");
    t->string_data[0].len = 3;
    add_init(mp, t);
    /* an input: kept by save although nothing reads it */
    add_info(&mp->graph->input, &mp->graph->n_input, info("label"));
    kf_model *m;
    cr_assert_eq(load_proto(mp, &m), KF_OK, "%s", msg);
    char cwd[1024];
    cr_assert(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(d), 0);
    setenv("KFUSE_EXTERNAL_DATA", "0", 1);
    kf_status st = kf_model_save(m, "rel.onnx");
    unsetenv("KFUSE_EXTERNAL_DATA");
    kf_model *back = NULL;
    if (!st) st = kf_model_load("rel.onnx", &back);
    bool data_file = exists("rel.onnx.data");
    cr_assert_eq(chdir(cwd), 0);
    cr_assert_eq(st, KF_OK, "%s", kf_last_error());
    cr_assert_not(data_file, "external data written though not asked for");
    char why[256];
    cr_assert(kf_model_equal(m, back, why, sizeof why), "%s", why);
    kf_model_free(back);
    kf_model_free(m);
    onnx__model_proto__free_unpacked(mp, NULL);
    rm_rf(d);
}

static void m_input_count(kf_model *a, kf_model *b) {
    (void)a;
    cr_assert_eq(kf_graph_mark_input(b->graph, kf_graph_find(b->graph, "W")), KF_OK);
}
static void m_attr_name(kf_model *a, kf_model *b) {
    (void)a;
    kf_node *n = op_node(b, "LeakyRelu");
    rename_str(&n->attrs[0].name, "beta");
}

Test(onnx_cov, model_equal_counts_and_names) {
    expect_diff("input count", m_input_count, "input/output counts");
    expect_diff("attribute name", m_attr_name, "attribute 'alpha'");
}
