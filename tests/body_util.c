/*
 * body_util.c: models with control-flow bodies for tests (see body_util.h).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "body_util.h"

Onnx__ModelProto *bu_proto(const char *text) {
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

Onnx__GraphProto *bu_body(const char *text, const char *const *outer, int nouter) {
    Onnx__ModelProto *mp = bu_proto(text);
    Onnx__GraphProto *g = mp->graph;
    mp->graph = NULL;
    onnx__model_proto__free_unpacked(mp, NULL);
    size_t keep = 0;
    for (size_t i = 0; i < g->n_input; i++) {
        bool drop = false;
        for (int k = 0; k < nouter; k++) drop = drop || !strcmp(g->input[i]->name, outer[k]);
        if (drop) onnx__value_info_proto__free_unpacked(g->input[i], NULL);
        else g->input[keep++] = g->input[i];
    }
    g->n_input = keep;
    return g;
}

Onnx__NodeProto *bu_node(Onnx__GraphProto *g, const char *op_type) {
    for (size_t i = 0; i < g->n_node; i++)
        if (!strcmp(g->node[i]->op_type, op_type)) return g->node[i];
    cr_assert_fail("no %s node", op_type);
    return NULL;
}

static Onnx__AttributeProto *add_attr(Onnx__NodeProto *n, const char *name, Onnx__AttributeProto__AttributeType type) {
    Onnx__AttributeProto *a = malloc(sizeof *a);
    cr_assert(a);
    onnx__attribute_proto__init(a);
    a->name = strdup(name);
    a->has_type = 1;
    a->type = type;
    n->attribute = realloc(n->attribute, (n->n_attribute + 1) * sizeof(void *));
    cr_assert(n->attribute);
    n->attribute[n->n_attribute++] = a;
    return a;
}

void bu_attach(Onnx__NodeProto *n, const char *name, Onnx__GraphProto *g) {
    add_attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH)->g = g;
}

void bu_attach_int(Onnx__NodeProto *n, const char *name, int64_t v) {
    Onnx__AttributeProto *a = add_attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    a->has_i = 1;
    a->i = v;
}

void bu_attach_ints(Onnx__NodeProto *n, const char *name, int count, const int64_t *v) {
    Onnx__AttributeProto *a = add_attr(n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    a->ints = malloc(((size_t)count + 1) * sizeof(int64_t));
    cr_assert(a->ints);
    memcpy(a->ints, v, (size_t)count * sizeof(int64_t));
    a->n_ints = (size_t)count;
}

void bu_drop_node(Onnx__GraphProto *g, const char *op_type) {
    size_t keep = 0;
    for (size_t i = 0; i < g->n_node; i++) {
        if (!strcmp(g->node[i]->op_type, op_type)) onnx__node_proto__free_unpacked(g->node[i], NULL);
        else g->node[keep++] = g->node[i];
    }
    g->n_node = keep;
}

void *bu_pack(const Onnx__ModelProto *mp, size_t *len) {
    *len = onnx__model_proto__get_packed_size(mp);
    void *b = malloc(*len + 1);
    cr_assert(b);
    onnx__model_proto__pack(mp, b);
    return b;
}

kf_model *bu_load(const Onnx__ModelProto *mp) {
    size_t len;
    void *b = bu_pack(mp, &len);
    kf_model *m = NULL;
    kf_status st = kf_model_load_memory(b, len, NULL, &m);
    free(b);
    cr_assert_eq(st, KF_OK, "load: %s", kf_last_error());
    return m;
}

kf_status bu_try_load(const Onnx__ModelProto *mp) {
    size_t len;
    void *b = bu_pack(mp, &len);
    kf_model *m = NULL;
    kf_status st = kf_model_load_memory(b, len, NULL, &m);
    free(b);
    kf_model_free(m);
    return st;
}
