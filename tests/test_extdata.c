/* test_extdata.c: models whose weights are ONNX external data. The loader
 * maps them instead of reading them; a save refers to the input's data file
 * (same folder) or copies the untouched regions file to file (another
 * folder), and writes changed weights anew. Every output is loaded back and
 * compared with the input bit for bit. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_extdata.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "onnx.pb-c.h"
#include "test_util.h"

/* w1, w2: 16 KiB each, external; b and one stay inline (under 1 KiB). */
static const char *model_text = "opset 13\n"
                                "input x float[2, 64]\n"
                                "const w1 float[64, 64] = random\n"
                                "const w2 float[64, 64] = random\n"
                                "const b float[64] = random\n"
                                "const one float[] = 1\n"
                                "h = MatMul(x, w1)\n"
                                "k = Mul(h, one)\n"
                                "y = MatMul(k, w2)\n"
                                "z = Add(y, b)\n"
                                "output z\n";

static char dir_a[64], dir_b[64], in_path[128];
static kf_model *orig; /* the model as written, weights in memory */

static void path_in(char *buf, size_t n, const char *dir, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

/* dir_a/in.onnx with its weights in dir_a/in.onnx.data; dir_b empty. */
static void setup(void) {
    snprintf(dir_a, sizeof dir_a, "/tmp/kfuse_extA_XXXXXX");
    snprintf(dir_b, sizeof dir_b, "/tmp/kfuse_extB_XXXXXX");
    cr_assert_not_null(mkdtemp(dir_a));
    cr_assert_not_null(mkdtemp(dir_b));
    path_in(in_path, sizeof in_path, dir_a, "in.onnx");
    orig = gt_parse(model_text);
    setenv("KFUSE_EXTERNAL_DATA", "1", 1);
    cr_assert_eq(kf_model_save(orig, in_path), KF_OK, "%s", kf_last_error());
    unsetenv("KFUSE_EXTERNAL_DATA");
}

static void remove_all(const char *dir) {
    static const char *names[] = {"in.onnx", "in.onnx.data", "in.onnx.data1", "out.onnx", "out.onnx.data", "moved"};
    char p[160];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        path_in(p, sizeof p, dir, names[i]);
        remove(p);
    }
    rmdir(dir);
}

static void teardown(void) {
    kf_model_free(orig);
    remove_all(dir_a);
    remove_all(dir_b);
}

static bool exists(const char *dir, const char *name) {
    char p[160];
    struct stat sb;
    path_in(p, sizeof p, dir, name);
    return stat(p, &sb) == 0;
}

/* The external location initializer `name` of the file at path names, or
 * "" when its data is inline (static buffer). */
static const char *location_of(const char *path, const char *name) {
    static char loc[128];
    uint8_t *data;
    size_t len;
    cr_assert_eq(kf_read_file(path, &data, &len), KF_OK);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, data);
    cr_assert_not_null(mp);
    loc[0] = 0;
    bool found = false;
    for (size_t i = 0; i < mp->graph->n_initializer; i++) {
        const Onnx__TensorProto *tp = mp->graph->initializer[i];
        if (strcmp(tp->name, name)) continue;
        found = true;
        for (size_t k = 0; k < tp->n_external_data; k++)
            if (!strcmp(tp->external_data[k]->key, "location")) snprintf(loc, sizeof loc, "%s", tp->external_data[k]->value);
    }
    cr_assert(found, "no initializer %s in %s", name, path);
    onnx__model_proto__free_unpacked(mp, NULL);
    kf_free(data);
    return loc;
}

static const kf_value *value(const kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v, "no value %s", name);
    return &m->graph->values[v];
}

/* Loads path and asserts it is model `want`, weights bit for bit. */
static void expect_model(const char *path, const kf_model *want) {
    kf_model *back;
    cr_assert_eq(kf_model_load(path, &back), KF_OK, "%s", kf_last_error());
    char why[256];
    cr_assert(kf_model_equal(want, back, why, sizeof why), "%s: %s", path, why);
    const char *names[] = {"w1", "w2", "b"};
    for (int i = 0; i < 3; i++) {
        const kf_tensor *a = value(want, names[i])->init, *b = value(back, names[i])->init;
        cr_assert_eq(memcmp(a->data, b->data, (size_t)a->numel * sizeof(float)), 0, "%s differs", names[i]);
    }
    kf_model_free(back);
}

static kf_model *load_in(void) {
    kf_model *m;
    cr_assert_eq(kf_model_load(in_path, &m), KF_OK, "%s", kf_last_error());
    return m;
}

TestSuite(extdata, .init = setup, .fini = teardown);

Test(extdata, weights_are_mapped_not_read) {
    cr_assert_eq(strcmp(location_of(in_path, "w1"), "in.onnx.data"), 0, "the fixture has external weights");
    kf_model *m = load_in();
    cr_assert_eq(m->next, 1, "one data file, mapped once");
    const kf_value *w1 = value(m, "w1"), *w2 = value(m, "w2"), *b = value(m, "b");
    cr_assert(w1->ext_file == 1 && w2->ext_file == 1 && b->ext_file == 0);
    cr_assert(kf_extdata_mapped(w1->init->data) && !kf_extdata_mapped(b->init->data));
    cr_assert_eq(memcmp(w1->init->data, value(orig, "w1")->init->data, 64 * 64 * sizeof(float)), 0);
    kf_model_free(m);
}

Test(extdata, same_folder_output_refers_to_the_input_data_file) {
    kf_model *m = load_in();
    char out[160];
    path_in(out, sizeof out, dir_a, "out.onnx");
    cr_assert_eq(kf_model_save(m, out), KF_OK, "%s", kf_last_error());
    cr_assert(!exists(dir_a, "out.onnx.data"), "nothing was copied");
    cr_assert_eq(strcmp(location_of(out, "w1"), "in.onnx.data"), 0);
    cr_assert_eq(strcmp(location_of(out, "w2"), "in.onnx.data"), 0);
    struct stat sb;
    cr_assert_eq(stat(out, &sb), 0);
    cr_assert_lt(sb.st_size, 4096, "the output holds the graph, not the weights");
    expect_model(out, orig);
    kf_model_free(m);
}

Test(extdata, other_folder_output_gets_a_copy_of_the_data) {
    kf_model *m = load_in();
    char out[160];
    path_in(out, sizeof out, dir_b, "out.onnx");
    cr_assert_eq(kf_model_save(m, out), KF_OK, "%s", kf_last_error());
    cr_assert(exists(dir_b, "out.onnx.data"));
    cr_assert_eq(strcmp(location_of(out, "w1"), "out.onnx.data"), 0);
    kf_model_free(m);
    /* the copy does not depend on the input any more */
    remove_all(dir_a);
    expect_model(out, orig);
}

Test(extdata, sharing_can_be_turned_off) {
    kf_model *m = load_in();
    char out[160];
    path_in(out, sizeof out, dir_a, "out.onnx");
    setenv("KFUSE_EXTERNAL_SHARE", "0", 1);
    cr_assert_eq(kf_model_save(m, out), KF_OK, "%s", kf_last_error());
    unsetenv("KFUSE_EXTERNAL_SHARE");
    cr_assert_eq(strcmp(location_of(out, "w1"), "out.onnx.data"), 0);
    expect_model(out, orig);
    kf_model_free(m);
}

/* w2 replaced by a changed copy: its new bytes are written, w1 still
 * refers to (or is copied from) the input. */
static void change_w2(kf_model *m, kf_model *want) {
    kf_id v = kf_graph_find(m->graph, "w2");
    kf_tensor *t = kf_tensor_new();
    cr_assert_eq(kf_tensor_copy(t, m->graph->values[v].init), KF_OK);
    ((float *)t->data)[17] += 1.5f;
    kf_tensor_free(m->graph->values[v].init); /* mapped data: not freed, still the model's */
    m->graph->values[v].init = t;
    float *w = value(want, "w2")->init->data;
    w[17] += 1.5f;
}

Test(extdata, a_changed_initializer_is_written_anew) {
    kf_model *want = gt_copy(orig);
    kf_model *m = load_in();
    change_w2(m, want);
    char out_a[160], out_b[160];
    path_in(out_a, sizeof out_a, dir_a, "out.onnx");
    path_in(out_b, sizeof out_b, dir_b, "out.onnx");
    cr_assert_eq(kf_model_save(m, out_a), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_model_save(m, out_b), KF_OK, "%s", kf_last_error());
    cr_assert_eq(strcmp(location_of(out_a, "w1"), "in.onnx.data"), 0);
    cr_assert_eq(strcmp(location_of(out_a, "w2"), ""), 0, "changed and small: inline");
    cr_assert_eq(strcmp(location_of(out_b, "w1"), "out.onnx.data"), 0);
    expect_model(out_a, want);
    expect_model(out_b, want);
    kf_model_free(m);
    kf_model_free(want);
}

/* Saving over the input whose data file is in.onnx.data, with new data
 * forced external: the new data file must not overwrite the one the model
 * still names. */
Test(extdata, saving_over_the_input_never_overwrites_its_data) {
    kf_model *want = gt_copy(orig);
    kf_model *m = load_in();
    change_w2(m, want);
    setenv("KFUSE_EXTERNAL_DATA", "1", 1);
    cr_assert_eq(kf_model_save(m, in_path), KF_OK, "%s", kf_last_error());
    unsetenv("KFUSE_EXTERNAL_DATA");
    cr_assert_eq(strcmp(location_of(in_path, "w1"), "in.onnx.data"), 0);
    cr_assert_eq(strcmp(location_of(in_path, "w2"), "in.onnx.data1"), 0);
    kf_model_free(m);
    expect_model(in_path, want);
    kf_model_free(want);
}

Test(extdata, optimized_model_round_trips_both_ways) {
    kf_model *m = load_in();
    kf_opt_options o;
    kf_opt_options_default(&o);
    kf_opt_result r;
    cr_assert_eq(kf_optimize(m, &o, &r), KF_OK, "%s", kf_last_error());
    kf_rules_free(&r.rules);
    cr_assert_eq(gt_count(m, "Mul"), 0, "x * 1 was removed");
    char out_a[160], out_b[160];
    path_in(out_a, sizeof out_a, dir_a, "out.onnx");
    path_in(out_b, sizeof out_b, dir_b, "out.onnx");
    cr_assert_eq(kf_model_save(m, out_a), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kf_model_save(m, out_b), KF_OK, "%s", kf_last_error());
    for (int i = 0; i < 2; i++) {
        kf_model *back;
        cr_assert_eq(kf_model_load(i ? out_b : out_a, &back), KF_OK, "%s", kf_last_error());
        char why[256];
        cr_assert(kf_model_equal(m, back, why, sizeof why), "%s", why);
        gt_expect_same_outputs(orig, back, 1e-5, 1e-4);
        kf_model_free(back);
    }
    kf_model_free(m);
}

Test(extdata, without_mmap_weights_are_read_and_written_inline) {
    setenv("KFUSE_NO_MMAP", "1", 1);
    kf_model *m = load_in();
    unsetenv("KFUSE_NO_MMAP");
    cr_assert_eq(m->next, 0);
    cr_assert_eq(value(m, "w1")->ext_file, 0);
    char out[160];
    path_in(out, sizeof out, dir_b, "out.onnx");
    cr_assert_eq(kf_model_save(m, out), KF_OK, "%s", kf_last_error());
    cr_assert(!exists(dir_b, "out.onnx.data"));
    cr_assert_eq(strcmp(location_of(out, "w1"), ""), 0);
    expect_model(out, orig);
    kf_model_free(m);
}

/* The data file replaced (a new file renamed over it) after the load: the
 * copy would read other bytes than the model holds, so the save refuses,
 * naming the file. */
Test(extdata, data_file_replaced_after_load_is_an_io_error) {
    kf_model *m = load_in();
    char data[160], moved[160], out[160];
    path_in(data, sizeof data, dir_a, "in.onnx.data");
    path_in(moved, sizeof moved, dir_a, "moved");
    FILE *f = fopen(moved, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < 40000; i++) fputc(i & 0xff, f);
    fclose(f);
    cr_assert_eq(rename(moved, data), 0);
    path_in(out, sizeof out, dir_b, "out.onnx");
    cr_assert_eq(kf_model_save(m, out), KF_ERR_IO);
    cr_assert(strstr(kf_last_error(), "in.onnx.data") && strstr(kf_last_error(), "replaced"), "%s", kf_last_error());
    cr_assert(!exists(dir_b, "out.onnx") && !exists(dir_b, "out.onnx.data"), "no half-written output");
    /* the model still holds the bytes it loaded */
    cr_assert_eq(memcmp(value(m, "w1")->init->data, value(orig, "w1")->init->data, 64 * 64 * sizeof(float)), 0);
    kf_model_free(m);
}

/* A short data file is still refused at load, naming tensor and file. */
Test(extdata, short_data_file_is_refused_at_load) {
    char data[160];
    path_in(data, sizeof data, dir_a, "in.onnx.data");
    cr_assert_eq(truncate(data, 20000), 0);
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load(in_path, &m), KF_ERR_BAD_MODEL);
    cr_assert(strstr(kf_last_error(), "in.onnx.data") && strstr(kf_last_error(), "past the end"), "%s", kf_last_error());
}
