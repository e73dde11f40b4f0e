/* test_ir_edit.c: redirecting uses (graph outputs keep their names),
 * node removal, fresh names and dead-code elimination. */
#include <criterion/criterion.h>
#include <string.h>

#include "test_util.h"

static kf_id val(kf_graph *g, const char *name) {
    kf_id v;
    cr_assert_eq(kf_graph_intern_value(g, name, &v), KF_OK);
    return v;
}

static kf_id node1(kf_graph *g, const char *op, kf_id in, kf_id out) {
    kf_id n, i[1] = {in}, o[1] = {out};
    cr_assert_eq(kf_graph_add_node(g, op, "", op, i, 1, o, 1, &n), KF_OK, "%s", kf_last_error());
    return n;
}

/* x -> Identity -> y -> Relu -> z (graph output) */
static kf_graph *chain(kf_id *x, kf_id *y, kf_id *z, kf_id *id, kf_id *relu) {
    kf_graph *g = kf_graph_new();
    *x = val(g, "x");
    *y = val(g, "y");
    *z = val(g, "z");
    cr_assert_eq(kf_graph_mark_input(g, *x), KF_OK);
    *id = node1(g, "Identity", *x, *y);
    *relu = node1(g, "Relu", *y, *z);
    cr_assert_eq(kf_graph_mark_output(g, *z), KF_OK);
    return g;
}

Test(ir_edit, replace_uses_then_dce_removes_the_bypassed_node) {
    kf_id x, y, z, id, relu;
    kf_graph *g = chain(&x, &y, &z, &id, &relu);
    cr_assert_eq(kf_graph_replace_uses(g, y, x), KF_OK);
    cr_assert_eq(g->nodes[relu].in[0], x);
    cr_assert_eq(g->values[y].nusers, 0);
    cr_assert_eq(g->values[x].nusers, 2, "Identity and Relu both read x now");
    uint32_t removed;
    cr_assert_eq(kf_graph_dce(g, &removed), KF_OK);
    cr_assert_eq(removed, 1);
    cr_assert(g->nodes[id].dead);
    cr_assert_eq(g->values[x].nusers, 1);
    cr_assert_eq(kf_graph_live_nodes(g), 1);
    kf_graph_free(g);
}

Test(ir_edit, replacing_a_graph_output_keeps_its_name) {
    kf_id x, y, z, id, relu;
    kf_graph *g = chain(&x, &y, &z, &id, &relu);
    kf_id w = val(g, "w");
    kf_id neg = node1(g, "Neg", y, w);
    cr_assert_eq(kf_graph_replace_uses(g, z, w), KF_OK);
    cr_assert_str_eq(g->values[g->outputs[0]].name, "z", "the output is still called z");
    cr_assert_eq(g->outputs[0], w);
    cr_assert_eq(kf_graph_find(g, "z"), w, "lookup by name follows the rename");
    cr_assert_eq(kf_graph_find(g, "w"), z);
    cr_assert_eq(g->values[w].producer, neg);
    /* redirecting an output to a graph input is refused and changes nothing */
    cr_assert_eq(kf_graph_replace_uses(g, w, x), KF_ERR_UNSUPPORTED);
    cr_assert_eq(g->outputs[0], w);
    kf_graph_free(g);
}

Test(ir_edit, dce_keeps_outputs_and_cascades) {
    kf_graph *g = kf_graph_new();
    kf_id a = val(g, "a"), b = val(g, "b"), c = val(g, "c"), d = val(g, "d");
    cr_assert_eq(kf_graph_mark_input(g, a), KF_OK);
    kf_id n1 = node1(g, "Neg", a, b);
    kf_id n2 = node1(g, "Abs", b, c); /* c unused: n2 dead, then n1 */
    kf_id n3 = node1(g, "Relu", a, d);
    cr_assert_eq(kf_graph_mark_output(g, d), KF_OK);
    uint32_t removed;
    cr_assert_eq(kf_graph_dce(g, &removed), KF_OK);
    cr_assert_eq(removed, 2);
    cr_assert(g->nodes[n1].dead && g->nodes[n2].dead);
    cr_assert(!g->nodes[n3].dead);
    kf_graph_free(g);
}

Test(ir_edit, fresh_names_never_collide) {
    kf_graph *g = kf_graph_new();
    kf_id a = val(g, "w"), b, c;
    cr_assert_eq(kf_graph_fresh_value(g, "w", &b), KF_OK);
    cr_assert_eq(kf_graph_fresh_value(g, "w", &c), KF_OK);
    cr_assert(a != b && b != c);
    cr_assert_str_neq(g->values[b].name, g->values[c].name);
    kf_graph_free(g);
}
