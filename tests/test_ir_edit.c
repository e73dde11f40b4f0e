/* test_ir_edit.c: redirecting uses (graph outputs keep their names),
 * node removal, fresh names and dead-code elimination. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph_text.h"
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

/* Every use list holds each live node once per input slot that reads the
 * value, and nothing else. */
static void check_use_lists(const kf_graph *g) {
    uint32_t *want = calloc(g->nvalues, sizeof *want);
    for (kf_id n = 1; n < g->nnodes; n++)
        for (int i = 0; !g->nodes[n].dead && i < g->nodes[n].nin; i++) want[g->nodes[n].in[i]]++;
    for (kf_id v = 1; v < g->nvalues; v++) {
        cr_assert_eq(g->values[v].nusers, want[v], "value %s: %u users, %u slots read it", g->values[v].name,
                     g->values[v].nusers, want[v]);
        for (uint32_t u = 0; u < g->values[v].nusers; u++) {
            const kf_node *n = &g->nodes[g->values[v].users[u]];
            cr_assert(!n->dead);
            uint32_t slots = 0, entries = 0;
            for (int i = 0; i < n->nin; i++) slots += n->in[i] == v;
            for (uint32_t k = 0; k < g->values[v].nusers; k++) entries += g->values[v].users[k] == g->values[v].users[u];
            cr_assert_eq(slots, entries);
        }
    }
    free(want);
}

/* n nodes y_k = Add(c, c) or Mul(x, c) (every third reads c twice);
 * c is one shared constant. */
static kf_graph *shared_constant(uint32_t n, kf_id *c) {
    kf_graph *g = kf_graph_new();
    kf_id x = val(g, "x");
    *c = val(g, "c");
    cr_assert_eq(kf_graph_mark_input(g, x), KF_OK);
    char name[32];
    for (uint32_t k = 0; k < n; k++) {
        snprintf(name, sizeof name, "y%u", k);
        kf_id y = val(g, name), in[2] = {k % 3 ? x : *c, *c}, out[1] = {y};
        cr_assert_eq(kf_graph_add_node(g, k % 3 ? "Mul" : "Add", "", name, in, 2, out, 1, NULL), KF_OK);
        cr_assert_eq(kf_graph_mark_output(g, y), KF_OK);
    }
    return g;
}

Test(ir_edit, use_lists_stay_exact_under_random_removals_and_redirects) {
    uint64_t seed = tu_seed();
    kf_id c;
    kf_graph *g = shared_constant(600, &c);
    kf_id d = val(g, "d");
    for (int step = 0; step < 900; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        kf_id n = 1 + (kf_id)((seed >> 33) % (g->nnodes - 1));
        if (g->nodes[n].dead) continue;
        int slot = (int)((seed >> 20) & 1);
        switch ((seed >> 40) % 3) {
        case 0: kf_graph_remove_node(g, n); break;
        case 1: cr_assert_eq(kf_graph_set_input(g, n, slot, g->nodes[n].in[slot] == c ? d : c), KF_OK); break;
        default: cr_assert_eq(kf_graph_set_input(g, n, slot, 0), KF_OK); break;
        }
        if (step % 100 == 0) check_use_lists(g);
    }
    check_use_lists(g);
    cr_assert_eq(kf_graph_replace_uses(g, c, d), KF_OK);
    cr_assert_eq(g->values[c].nusers, 0);
    check_use_lists(g);
    kf_graph_free(g);
}

/* Seconds to remove every user of the shared constant, oldest first (the
 * order that made each removal scan the whole list before). */
static double remove_all_users(uint32_t n) {
    kf_id c;
    kf_graph *g = shared_constant(n, &c);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (kf_id k = 1; k < g->nnodes; k++) kf_graph_remove_node(g, k);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_eq(g->values[c].nusers, 0);
    kf_graph_free(g);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

Test(ir_edit, removing_the_users_of_a_shared_constant_is_linear) {
    double small = 1e9, large = 1e9; /* best of three: a busy machine only adds time */
    for (int i = 0; i < 3; i++) {
        double s = remove_all_users(20000), l = remove_all_users(200000);
        small = s < small ? s : small;
        large = l < large ? l : large;
    }
    /* linear: about 10x; one scan per removal was about 100x (and seconds) */
    cr_assert_lt(large, 40 * small + 0.05, "20k users: %.4f s, 200k users: %.4f s", small, large);
}

/* While edits are tracked, shape inference looks again only downstream of
 * what they touched (kf_graph.inferq), and must end where a whole inference
 * would: here a new weight narrows a MatMul, and the Shape -> Gather ->
 * Concat -> Reshape chain below it has to follow. infer_check compares each
 * incremental inference with a whole one (KF_ERR_INTERNAL on a difference). */
Test(ir_edit, incremental_inference_follows_an_edit_downstream) {
    kf_model *m = gt_parse("input x float[N, 6]\n"
                           "const w float[6, 8] = random\n"
                           "const w2 float[6, 4] = random\n"
                           "const one int64[] = 1\n"
                           "const zero int64[1] = 0\n"
                           "const m1 int64[1] = -1\n"
                           "y = MatMul(x, w)\n"
                           "s = Shape(y)\n"
                           "d = Gather(s, one)\n"
                           "u = Unsqueeze(d, zero)\n"
                           "shp = Concat(m1, u) {axis=0}\n"
                           "r = Reshape(y, shp)\n"
                           "t = Relu(x)\n"
                           "output r\n"
                           "output t\n");
    kf_graph *g = m->graph;
    kf_graph_track(g, true);
    g->infer_check = true;
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    kf_id r = kf_graph_find(g, "r"), t = kf_graph_find(g, "t"), mm = g->values[kf_graph_find(g, "y")].producer;
    cr_assert_eq(g->values[r].type.rank, 2);
    cr_assert_eq(g->values[r].type.dims[1], 8);
    cr_assert_eq(g->ninferq, 0, "inference empties its list");
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "nothing touched: %s", kf_last_error());
    cr_assert_eq(g->values[r].type.dims[1], 8);
    cr_assert_eq(kf_graph_set_input(g, mm, 1, kf_graph_find(g, "w2")), KF_OK);
    cr_assert_gt(g->ninferq, 0, "the edit is listed for inference");
    cr_assert_eq(kf_infer_shapes(m), KF_OK, "%s", kf_last_error());
    cr_assert_eq(g->values[r].type.rank, 2);
    cr_assert_eq(g->values[r].type.dims[1], 4, "the Reshape three nodes below the edit follows it");
    cr_assert_eq(g->values[t].type.dims[1], 6, "a branch the edit does not reach keeps its type");
    cr_assert_eq(g->ninferq, 0);
    kf_graph_track(g, false);
    cr_assert_null(g->inferq, "tracking off frees the list");
    kf_model_free(m);
}
