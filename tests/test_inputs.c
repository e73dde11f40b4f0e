/*
 * test_inputs.c: the data `kfuse run` and `bench` feed a model. Random
 * integer inputs that reach Gather indices stay inside the dim they index
 * (kf_index_bound, graph/ops_index.c); `--inputs DIR` reads NAME.npy files
 * (graph/npy.c) as well as input_N.pb, and a malformed .npy is a typed
 * error naming the file. The .npy files here are written by a small writer
 * of the format (version 1.0) independent of the reader.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_onnx.h"

/* ---- kf_index_bound ------------------------------------------------------------ */

/* A text graph built printf-style. */
static kf_model *parse(const char *fmt, ...) {
    char text[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return gt_parse(text);
}

static int64_t bound_of(const kf_model *m, const char *name) {
    kf_id v = kf_graph_find(m->graph, name);
    cr_assert(v, "no value '%s'", name);
    return kf_index_bound(m->graph, v);
}

static int64_t rand_dim(int64_t lo, int64_t hi) { return lo + (int64_t)tu_uniform(0, (double)(hi - lo)); }

/* The BERT embedding spellings: token types through Cast and Unsqueeze
 * into a 2-row table, ids into the vocabulary and (through Concat and
 * Reshape) into a smaller table, which bounds them; position ids through
 * an Add are not followed (Add computes new values). */
Test(inputs, index_bound_follows_copies_to_the_smallest_indexed_dim) {
    int64_t types = rand_dim(2, 4), vocab = rand_dim(20, 40), small = rand_dim(5, 19), pos = rand_dim(6, 30);
    kf_model *m = parse("opset 17\n"
                        "input tt int64[N, S]\ninput ids int64[N, S]\ninput pid int64[S]\ninput other int64[N, S]\n"
                        "const ttab float[%lld, 4] = random\nconst vtab float[%lld, 4] = random\n"
                        "const stab float[%lld, 4] = random\nconst ptab float[%lld, 4] = random\n"
                        "const ax int64[1] = 0\nconst one int64[] = 1\nconst flat int64[1] = -1\n"
                        "c = Cast(tt) {to=6}\nu = Unsqueeze(c, ax)\nt = Gather(ttab, u)\n"
                        "v = Gather(vtab, ids)\ncat = Concat(ids, other) {axis=0}\nr = Reshape(cat, flat)\n"
                        "s = Gather(stab, r)\n"
                        "p1 = Add(pid, one)\np = Gather(ptab, p1)\n"
                        "output t\noutput v\noutput s\noutput p\n",
                        (long long)types, (long long)vocab, (long long)small, (long long)pos);
    cr_assert_eq(bound_of(m, "tt"), types);
    cr_assert_eq(bound_of(m, "ids"), small, "ids index [%lld] and (through Concat) [%lld]", (long long)vocab,
                 (long long)small);
    cr_assert_eq(bound_of(m, "other"), small, "Concat copies each of its inputs");
    cr_assert_eq(bound_of(m, "pid"), 0, "an Add makes new values: nothing bounds pid");
    cr_assert_eq(bound_of(m, "p1"), pos);
    kf_model_free(m);
}

/* The dim an index selects: Gather's axis (negative too), GatherElements'
 * axis, GatherND's tuple dims after batch_dims; an input that is the data
 * of a Gather (not its indices) is copied on, and a data dim not known
 * bounds nothing. */
Test(inputs, index_bound_reads_the_dim_each_gather_selects) {
    int64_t a = rand_dim(3, 9), b = rand_dim(10, 20), c = rand_dim(2, 9), d = rand_dim(2, 9);
    kf_model *m = parse("opset 17\n"
                        "input i int64[2]\ninput j int64[2]\ninput e int64[%lld, 2]\ninput nd int64[1, 2]\n"
                        "input k int64[3]\ninput sym float[Q, 3]\ninput q int64[2]\n"
                        "const x float[%lld, %lld] = random\nconst y float[%lld, %lld, 3] = random\n"
                        "g1 = Gather(x, i) {axis=1}\ng2 = Gather(x, j) {axis=-2}\n"
                        "g3 = GatherElements(x, e) {axis=0}\n"
                        "g4 = GatherND(y, nd)\n"
                        "g5 = Gather(k, q)\ng6 = Gather(x, g5) {axis=1}\n"
                        "g7 = Gather(sym, i)\n"
                        "output g1\noutput g2\noutput g3\noutput g4\noutput g6\noutput g7\n",
                        (long long)a, (long long)a, (long long)b, (long long)c, (long long)d);
    cr_assert_eq(bound_of(m, "i"), b, "axis 1 of [%lld, %lld]; sym's unknown dim bounds nothing", (long long)a,
                 (long long)b);
    cr_assert_eq(bound_of(m, "j"), a);
    cr_assert_eq(bound_of(m, "e"), a);
    cr_assert_eq(bound_of(m, "nd"), c < d ? c : d, "GatherND's tuples index [%lld, %lld]", (long long)c, (long long)d);
    cr_assert_eq(bound_of(m, "k"), b, "k's elements reach Gather(x, axis 1) as indices, copied by Gather(k, q)");
    cr_assert_eq(bound_of(m, "q"), 3, "q indexes k[3]");
    kf_model_free(m);
}

/* ---- .npy ------------------------------------------------------------------------- */

/* A version-1.0 .npy image of t's data under the given descr and shape
 * text (so tests can lie in either); the header padded so data starts at a
 * multiple of 64, as numpy writes it. malloc'ed; *len its size. */
static uint8_t *npy_image(const char *descr, const char *fortran, const char *shape, const void *data, size_t nbytes,
                          size_t *len) {
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr, fortran, shape);
    size_t hlen = (size_t)n + 1, total = 10 + hlen;
    hlen += (64 - total % 64) % 64;
    uint8_t *b = malloc(10 + hlen + nbytes + 1);
    cr_assert(b);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (uint8_t)(hlen & 0xff);
    b[9] = (uint8_t)(hlen >> 8);
    memset(b + 10, ' ', hlen);
    memcpy(b + 10, dict, (size_t)n);
    b[10 + hlen - 1] = '\n';
    if (nbytes) memcpy(b + 10 + hlen, data, nbytes);
    *len = 10 + hlen + nbytes;
    return b;
}

/* descr and shape text of t, in numpy's spelling */
static void npy_spelling(const kf_tensor *t, char *descr, char *shape, size_t n) {
    const char *code = t->dtype == KF_DT_FLOAT ? "<f4" : t->dtype == KF_DT_INT64 ? "<i8" : t->dtype == KF_DT_INT32 ? "<i4"
                     : t->dtype == KF_DT_DOUBLE ? "<f8" : t->dtype == KF_DT_BOOL ? "|b1" : t->dtype == KF_DT_UINT8 ? "|u1"
                                                                                                              : NULL;
    cr_assert(code, "no npy spelling for %s in this test", kf_dtype_name(t->dtype));
    snprintf(descr, n, "%s", code);
    size_t k = (size_t)snprintf(shape, n, "(");
    for (int d = 0; d < t->rank; d++) k += (size_t)snprintf(shape + k, n - k, "%lld,%s", (long long)t->dims[d], d + 1 < t->rank ? " " : "");
    snprintf(shape + k, n - k, ")");
}

static void write_file(const char *path, const void *b, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(b, 1, len, f), len);
    fclose(f);
}

static void write_npy(const char *path, const kf_tensor *t) {
    char descr[16], shape[256];
    npy_spelling(t, descr, shape, sizeof shape);
    size_t len;
    uint8_t *b = npy_image(descr, "False", shape, t->data, (size_t)t->numel * kf_dtype_size(t->dtype), &len);
    write_file(path, b, len);
    free(b);
}

Test(inputs, npy_round_trips_every_dtype_and_rank) {
    const kf_dtype dts[] = {KF_DT_FLOAT, KF_DT_DOUBLE, KF_DT_INT64, KF_DT_INT32, KF_DT_UINT8, KF_DT_BOOL};
    for (size_t k = 0; k < sizeof dts / sizeof *dts; k++)
        for (int rank = 0; rank <= 4; rank++) {
            int64_t dims[4];
            for (int d = 0; d < rank; d++) dims[d] = rand_dim(1, 5);
            kf_tensor t = tu_rand(dts[k], rank, dims, dts[k] == KF_DT_BOOL ? 0 : -50, dts[k] == KF_DT_BOOL ? 2 : 50);
            char descr[16], shape[256];
            npy_spelling(&t, descr, shape, sizeof shape);
            size_t len;
            uint8_t *b = npy_image(descr, "False", shape, t.data, (size_t)t.numel * kf_dtype_size(t.dtype), &len);
            kf_tensor back = {0};
            cr_assert_eq(kf_npy_parse(b, len, "t.npy", &back), KF_OK, "%s %s: %s", descr, shape, kf_last_error());
            cr_assert(kf_tensor_equal(&t, &back), "%s %s: the data read back differs", descr, shape);
            kf_tensor_release(&back);
            kf_tensor_release(&t);
            free(b);
        }
}

/* Big-endian files are byte-swapped on read. */
Test(inputs, npy_big_endian_is_swapped) {
    const int64_t dims[1] = {5};
    kf_tensor t = tu_rand(KF_DT_INT32, 1, dims, -1000, 1000);
    uint8_t be[20];
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 4; k++) be[i * 4 + k] = (uint8_t)((uint32_t)((int32_t *)t.data)[i] >> (8 * (3 - k)));
    size_t len;
    uint8_t *b = npy_image(">i4", "False", "(5,)", be, sizeof be, &len);
    kf_tensor back = {0};
    cr_assert_eq(kf_npy_parse(b, len, "be.npy", &back), KF_OK, "%s", kf_last_error());
    cr_assert(kf_tensor_equal(&t, &back));
    kf_tensor_release(&back);
    kf_tensor_release(&t);
    free(b);
}

/* Every corruption is a typed error naming the file (and what is wrong),
 * never a crash; the uncorrupted image is the control. */
Test(inputs, bad_npy_headers_are_typed_errors_naming_the_file) {
    const int64_t dims[2] = {2, 3};
    kf_tensor t = tu_rand(KF_DT_FLOAT, 2, dims, -1, 1);
    const size_t nb = 24;
    static const struct {
        const char *descr, *fortran, *shape;
        int extra; /* bytes of data more (or fewer) than the shape needs */
        kf_status want;
        const char *says;
    } cases[] = {
        {"<f4", "False", "(2, 3)", 0, KF_OK, NULL},
        {"<f4", "False", "(2, 3)", -4, KF_ERR_BAD_MODEL, "need 24"},
        {"<f4", "False", "(2, 3)", 4, KF_ERR_BAD_MODEL, "need 24"},
        {"<f4", "False", "(3, 3)", 0, KF_ERR_BAD_MODEL, "need 36"},
        {"<f4", "False", "(2, -3)", 0, KF_ERR_BAD_MODEL, "non-negative"},
        {"<f4", "False", "(2, 3", 0, KF_ERR_BAD_MODEL, "shape"},
        {"<f4", "False", "[2, 3]", 0, KF_ERR_BAD_MODEL, "tuple"},
        {"<f4", "False", "(99999999999999999999, 1)", 0, KF_ERR_BAD_MODEL, "shape"},
        {"<f4", "False", "(4294967296, 4294967296)", 0, KF_ERR_BAD_MODEL, NULL},
        {"<f4", "False", "(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6)", 0, KF_ERR_UNSUPPORTED, "more than"},
        {"<f4", "True", "(2, 3)", 0, KF_ERR_UNSUPPORTED, "Fortran"},
        {"<f4", "Maybe", "(2, 3)", 0, KF_ERR_BAD_MODEL, "fortran_order"},
        {"<c8", "False", "(2, 3)", 0, KF_ERR_UNSUPPORTED, "'<c8'"},
        {"O", "False", "(2, 3)", 0, KF_ERR_UNSUPPORTED, "'O'"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        size_t len;
        uint8_t *b = npy_image(cases[k].descr, cases[k].fortran, cases[k].shape, t.data, nb, &len);
        len = (size_t)((long)len + cases[k].extra);
        if (cases[k].extra > 0) b = realloc(b, len), memset(b + len - (size_t)cases[k].extra, 0x3f, (size_t)cases[k].extra);
        kf_tensor back = {0};
        kf_status st = kf_npy_parse(b, len, "dir/case.npy", &back);
        cr_assert_eq(st, cases[k].want, "case %zu (%s %s %s): %s, expected %s (%s)", k, cases[k].descr,
                     cases[k].fortran, cases[k].shape, kf_status_name(st), kf_status_name(cases[k].want),
                     st ? kf_last_error() : "");
        if (st) {
            cr_assert(strstr(kf_last_error(), "dir/case.npy"), "case %zu: '%s' does not name the file", k, kf_last_error());
            if (cases[k].says)
                cr_assert(strstr(kf_last_error(), cases[k].says), "case %zu: '%s' does not say '%s'", k, kf_last_error(),
                          cases[k].says);
            cr_assert_null(back.data, "case %zu: a failed read returns no data", k);
        } else {
            cr_assert(kf_tensor_equal(&t, &back));
        }
        kf_tensor_release(&back);
        free(b);
    }
    /* byte-level damage: magic, version, header length, the header itself */
    size_t len;
    uint8_t *good = npy_image("<f4", "False", "(2, 3)", t.data, nb, &len);
    uint8_t *b = malloc(len);
    for (int k = 0; k < 6; k++) {
        memcpy(b, good, len);
        size_t use = len;
        if (k == 0) b[1] = 'X';                              /* magic */
        if (k == 1) b[6] = 4;                                /* version 4.0 */
        if (k == 2) b[8] = 0xff, b[9] = 0xff;                /* header past the end */
        if (k == 3) b[10] = '[';                             /* not a dict */
        if (k == 4) memcpy(b + 12, "kind", 4);               /* unknown key */
        if (k == 5) use = 9;                                 /* ends inside the prefix */
        kf_tensor back = {0};
        kf_status st = kf_npy_parse(b, use, "dir/case.npy", &back);
        cr_assert(st == KF_ERR_BAD_MODEL || st == KF_ERR_UNSUPPORTED, "damage %d: %s", k, kf_status_name(st));
        cr_assert(strstr(kf_last_error(), "dir/case.npy"), "damage %d: '%s'", k, kf_last_error());
        cr_assert_null(back.data);
    }
    /* truncated at every length, and every byte of the header flipped: never a crash */
    for (size_t cut = 0; cut < len; cut++) {
        kf_tensor back = {0};
        cr_assert_neq(kf_npy_parse(good, cut, "cut.npy", &back), KF_OK, "truncated to %zu bytes", cut);
    }
    for (size_t at = 0; at < 64; at++) {
        memcpy(b, good, len);
        b[at] ^= (uint8_t)(1 + tu_uniform(0, 254));
        kf_tensor back = {0};
        if (kf_npy_parse(b, len, "flip.npy", &back) == KF_OK) kf_tensor_release(&back);
    }
    free(b);
    free(good);
    kf_tensor_release(&t);
}

/* ---- the CLI ------------------------------------------------------------------------- */

static char bin[PATH_MAX], out[16384], dir[PATH_MAX];

static void find_cli(void) { tu_cli_setup("inputs", bin, sizeof bin, dir, sizeof dir); }

static void cleanup(void) { tu_cli_dir_remove(dir); }

#define kfuse(...) tu_cli_runf(bin, out, sizeof out, __VA_ARGS__)

/* BERT's embeddings in small: ids into a vocabulary, token types (through
 * Cast and Unsqueeze) into a table of `types` rows, a float mask. */
static kf_model *embedding_model(int64_t types, int64_t vocab) {
    return parse("opset 17\n"
                 "input input_ids int64[batch, seq]\ninput token_type_ids int64[batch, seq]\n"
                 "input mask float[batch, seq]\n"
                 "const wtab float[%lld, 8] = random\nconst ttab float[%lld, 8] = random\n"
                 "const ax int64[1] = 2\n"
                 "w = Gather(wtab, input_ids)\nc = Cast(token_type_ids) {to=7}\nt = Gather(ttab, c)\n"
                 "s = Add(w, t)\nm = Unsqueeze(mask, ax)\ny = Mul(s, m)\noutput y\n",
                 (long long)vocab, (long long)types);
}

/* Random inputs (no --inputs) run: before, token types were drawn in
 * [0, 8) and a 2-row table failed with "index ... out of range". */
Test(inputs, cli_random_inputs_stay_inside_the_tables_they_index, .timeout = 120) {
    find_cli();
    int64_t types = rand_dim(2, 4), vocab = rand_dim(9, 100);
    kf_model *m = embedding_model(types, vocab);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/emb.onnx", dir);
    cr_assert_eq(kf_model_save(m, path), KF_OK, "%s", kf_last_error());
    kf_model_free(m);
    for (int seed = 1; seed <= 3; seed++) {
        cr_assert_eq(kfuse("run %s --seed %d --dim batch=3 --dim seq=16", path, seed), 0, "seed %d: %s", seed, out);
        cr_assert(strstr(out, "y: float[3,16,8]"), "%s", out);
    }
    cr_assert_eq(kfuse("bench %s --backend ref --iters 2 --warmup 0 --dim batch=2 --dim seq=32", path), 0, "%s", out);
    cleanup();
}

/* --inputs DIR with NAME.npy files gives what the evaluator gives on the
 * same arrays; .npy and .pb mix (one input each); two files for one input,
 * a missing one and a bad .npy are errors naming them. */
Test(inputs, cli_reads_npy_inputs, .timeout = 120) {
    find_cli();
    int64_t types = rand_dim(2, 4), vocab = rand_dim(9, 100);
    kf_model *m = embedding_model(types, vocab);
    char path[PATH_MAX + 32], data[PATH_MAX + 32], f[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/emb.onnx", dir);
    cr_assert_eq(kf_model_save(m, path), KF_OK, "%s", kf_last_error());
    snprintf(data, sizeof data, "%s/data", dir);
    cr_assert_eq(mkdir(data, 0777), 0);
    int64_t dims[2] = {rand_dim(1, 4), rand_dim(2, 9)};
    kf_tensor ins[3];
    ins[0] = tu_rand(KF_DT_INT64, 2, dims, 0, (double)vocab);
    ins[1] = tu_rand(KF_DT_INT64, 2, dims, 0, (double)types);
    ins[2] = tu_rand(KF_DT_FLOAT, 2, dims, -1, 1);
    snprintf(f, sizeof f, "%s/input_ids.npy", data);
    write_npy(f, &ins[0]);
    snprintf(f, sizeof f, "%s/token_type_ids.npy", data);
    write_npy(f, &ins[1]);
    snprintf(f, sizeof f, "%s/input_2.pb", data); /* the mask as TensorProto, named */
    cr_assert_eq(kf_onnx_write_tensor_file(f, &ins[2], "mask"), KF_OK, "%s", kf_last_error());
    cr_assert_eq(kfuse("run %s --inputs %s --outputs %s/out", path, data, dir), 0, "%s", out);
    kf_tensor want = {0}, got = {0};
    cr_assert_eq(kf_eval_model(m, ins, 3, &want, NULL), KF_OK, "%s", kf_last_error());
    snprintf(f, sizeof f, "%s/out/output_0.pb", dir);
    cr_assert_eq(kf_onnx_read_tensor_file(f, &got, NULL), KF_OK, "%s", kf_last_error());
    char why[256];
    cr_assert(tu_close(&got, &want, 0, 0, why, sizeof why), "kfuse run --inputs (.npy): %s", why);
    kf_tensor_release(&got);
    kf_tensor_release(&want);

    /* the mask twice: as mask.npy and as input_2.pb */
    snprintf(f, sizeof f, "%s/mask.npy", data);
    write_npy(f, &ins[2]);
    cr_assert_eq(kfuse("run %s --inputs %s", path, data), 3, "%s", out);
    cr_assert(strstr(out, "input_2.pb") && strstr(out, "mask.npy") && strstr(out, "'mask'"), "%s", out);
    snprintf(f, sizeof f, "%s/input_2.pb", data);
    cr_assert_eq(unlink(f), 0);
    cr_assert_eq(kfuse("run %s --inputs %s", path, data), 0, "all three as .npy: %s", out);
    /* a missing input names it and the spellings it was looked for in */
    snprintf(f, sizeof f, "%s/token_type_ids.npy", data);
    cr_assert_eq(unlink(f), 0);
    cr_assert_eq(kfuse("run %s --inputs %s", path, data), 3, "%s", out);
    cr_assert(strstr(out, "'token_type_ids'") && strstr(out, "token_type_ids.npy"), "%s", out);
    /* a bad header names the file */
    size_t len;
    uint8_t *b = npy_image("<i8", "False", "(2, 3", ins[1].data, (size_t)ins[1].numel * 8, &len);
    write_file(f, b, len);
    free(b);
    cr_assert_eq(kfuse("run %s --inputs %s", path, data), 3, "%s", out);
    cr_assert(strstr(out, "token_type_ids.npy") && strstr(out, "shape"), "%s", out);
    for (int i = 0; i < 3; i++) kf_tensor_release(&ins[i]);
    kf_model_free(m);
    cleanup();
}
