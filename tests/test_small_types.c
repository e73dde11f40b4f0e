/*
 * test_small_types.c: the element types ONNX added for quantized and
 * microscaled models (float8 E4M3FN/E4M3FNUZ/E5M2/E5M2FNUZ/E8M0, float6,
 * float4, int4/uint4, int2/uint2; graph/dtype_small.c). Every TensorProto
 * type loads and saves byte for byte, packed ones included, from raw_data
 * and from int32_data; conversions into the small float types are the
 * nearest value with ties to even and the spec's overflow rules, checked
 * against a search over every code; Cast matches ONNX's reference
 * implementation on random inputs (tests/cast_ref.py writes the folders);
 * ops that would read the new types as numbers refuse them by name.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "graph_text.h"
#include "kf_onnx.h"
#include "onnx.pb-c.h"
#include "test_util.h"

/* ---- load and save ------------------------------------------------------------ */

static int bits_of(int dt) {
    switch (dt) {
    case KF_DT_UINT4: case KF_DT_INT4: case KF_DT_FLOAT4E2M1: return 4;
    case KF_DT_UINT2: case KF_DT_INT2: return 2;
    case KF_DT_FLOAT6E2M3: case KF_DT_FLOAT6E3M2: return 6;
    default: return 8 * (int)kf_dtype_size((kf_dtype)dt);
    }
}

/* Element k of an LSB-first packed stream of `bits`-bit codes. */
static unsigned code_at(const uint8_t *p, size_t len, int64_t k, int bits) {
    uint64_t bit = (uint64_t)k * (uint64_t)bits;
    unsigned w = p[bit / 8] | (bit / 8 + 1 < len ? (unsigned)p[bit / 8 + 1] << 8 : 0u);
    return (w >> (bit % 8)) & ((1u << bits) - 1);
}

static Onnx__TensorProto *new_tensor(const char *name, int dt, int64_t d0, int64_t d1) {
    Onnx__TensorProto *t = malloc(sizeof *t);
    cr_assert(t);
    onnx__tensor_proto__init(t);
    t->name = strdup(name);
    t->has_data_type = 1;
    t->data_type = dt;
    t->n_dims = 2;
    t->dims = malloc(2 * sizeof(int64_t));
    t->dims[0] = d0;
    t->dims[1] = d1;
    return t;
}

/* A model whose graph outputs Identity copies of the given initializers. */
static void *model_of(Onnx__TensorProto **inits, int n, size_t *len) {
    Onnx__ModelProto mp;
    onnx__model_proto__init(&mp);
    Onnx__GraphProto g;
    onnx__graph_proto__init(&g);
    Onnx__OperatorSetIdProto op;
    onnx__operator_set_id_proto__init(&op);
    op.domain = "";
    op.has_version = 1;
    op.version = 25;
    Onnx__OperatorSetIdProto *ops[1] = {&op};
    mp.has_ir_version = 1;
    mp.ir_version = 11;
    mp.n_opset_import = 1;
    mp.opset_import = ops;
    mp.graph = &g;
    g.name = "small_types";
    g.n_initializer = (size_t)n;
    g.initializer = inits;
    Onnx__NodeProto nodes[32], *np[32];
    Onnx__ValueInfoProto outs[32], *op_[32];
    char onames[32][32];
    char *ins[32], *outn[32];
    cr_assert(n <= 32);
    for (int i = 0; i < n; i++) {
        snprintf(onames[i], sizeof onames[i], "o_%s", inits[i]->name);
        onnx__node_proto__init(&nodes[i]);
        nodes[i].op_type = "Identity";
        nodes[i].n_input = nodes[i].n_output = 1;
        ins[i] = inits[i]->name;
        outn[i] = onames[i];
        nodes[i].input = &ins[i];
        nodes[i].output = &outn[i];
        np[i] = &nodes[i];
        onnx__value_info_proto__init(&outs[i]);
        outs[i].name = onames[i];
        op_[i] = &outs[i];
    }
    g.n_node = g.n_output = (size_t)n;
    g.node = np;
    g.output = op_;
    *len = onnx__model_proto__get_packed_size(&mp);
    void *b = malloc(*len + 1);
    cr_assert(b);
    onnx__model_proto__pack(&mp, b);
    return b;
}

Test(small_types, every_dtype_round_trips_byte_for_byte) {
    /* 3 x 5 elements: an odd count leaves a half-used last byte for 4-, 2-
     * and 6-bit types (whose unused bits are zero, as onnx.proto asks) */
    Onnx__TensorProto *raw[32], *typed[32];
    int n = 0;
    for (int dt = 1; dt < KF_DT_COUNT_; dt++) {
        if (dt == KF_DT_STRING || dt == KF_DT_COMPLEX64 || dt == KF_DT_COMPLEX128) continue;
        char name[32];
        snprintf(name, sizeof name, "t%d", dt);
        int bits = bits_of(dt);
        cr_assert_eq(kf_dtype_bits((kf_dtype)dt), bits, "%s", kf_dtype_name((kf_dtype)dt));
        size_t len = (size_t)(15 * bits + 7) / 8;
        raw[n] = new_tensor(name, dt, 3, 5);
        raw[n]->has_raw_data = 1;
        raw[n]->raw_data.len = len;
        raw[n]->raw_data.data = malloc(len);
        uint8_t *p = raw[n]->raw_data.data;
        for (size_t i = 0; i < len; i++) p[i] = (uint8_t)tu_uniform(0, 256);
        if (dt == KF_DT_BOOL)
            for (size_t i = 0; i < len; i++) p[i] &= 1;
        if ((15 * bits) % 8) p[len - 1] &= (uint8_t)((1u << ((15 * bits) % 8)) - 1);
        /* the same values through int32_data, where onnx.proto allows it */
        if (bits < 16 || dt == KF_DT_FLOAT16 || dt == KF_DT_BFLOAT16) {
            snprintf(name, sizeof name, "i%d", dt);
            typed[n] = new_tensor(name, dt, 3, 5);
            size_t cnt = bits == 4 || bits == 2 ? len : 15;
            typed[n]->n_int32_data = cnt;
            typed[n]->int32_data = malloc(cnt * sizeof(int32_t));
            for (size_t i = 0; i < cnt; i++)
                typed[n]->int32_data[i] = bits == 4 || bits == 2 ? p[i]
                                          : bits == 6            ? (int32_t)code_at(p, len, (int64_t)i, 6)
                                          : bits == 16           ? (int32_t)(p[2 * i] | p[2 * i + 1] << 8)
                                                                 : p[i];
        } else {
            typed[n] = NULL;
        }
        n++;
    }
    size_t len;
    void *b = model_of(raw, n, &len);
    kf_model *m = NULL;
    cr_assert_eq(kf_model_load_memory(b, len, NULL, &m), KF_OK, "%s", kf_last_error());
    free(b);
    /* small integers read back as the spec's values */
    for (int i = 0; i < n; i++) {
        kf_id v = kf_graph_find(m->graph, raw[i]->name);
        const kf_tensor *t = m->graph->values[v].init;
        int bits = bits_of(raw[i]->data_type);
        bool sgn = raw[i]->data_type == KF_DT_INT4 || raw[i]->data_type == KF_DT_INT2;
        if (bits >= 8 || raw[i]->data_type == KF_DT_FLOAT4E2M1) continue;
        if (bits == 6) continue;
        for (int64_t k = 0; k < 15; k++) {
            int c = (int)code_at(raw[i]->raw_data.data, raw[i]->raw_data.len, k, bits);
            int want = sgn && c >= 1 << (bits - 1) ? c - (1 << bits) : c;
            cr_assert_eq(kf_get_i64(t, k), want, "%s element %lld", kf_dtype_name(t->dtype), (long long)k);
        }
    }
    void *saved;
    size_t slen;
    cr_assert_eq(kf_model_save_memory(m, &saved, &slen), KF_OK, "%s", kf_last_error());
    Onnx__ModelProto *back = onnx__model_proto__unpack(NULL, slen, saved);
    free(saved);
    cr_assert(back);
    for (int i = 0; i < n; i++) {
        const Onnx__TensorProto *s = NULL;
        for (size_t k = 0; k < back->graph->n_initializer; k++)
            if (!strcmp(back->graph->initializer[k]->name, raw[i]->name)) s = back->graph->initializer[k];
        cr_assert(s, "initializer %s was not saved", raw[i]->name);
        cr_assert_eq(s->data_type, raw[i]->data_type);
        cr_assert(s->has_raw_data && s->raw_data.len == raw[i]->raw_data.len &&
                      !memcmp(s->raw_data.data, raw[i]->raw_data.data, s->raw_data.len),
                  "%s: saved bytes differ", kf_dtype_name((kf_dtype)raw[i]->data_type));
    }
    onnx__model_proto__free_unpacked(back, NULL);
    /* int32_data loads to the same tensors */
    int nt = 0;
    Onnx__TensorProto *tl[32];
    for (int i = 0; i < n; i++)
        if (typed[i]) tl[nt++] = typed[i];
    b = model_of(tl, nt, &len);
    kf_model *mt = NULL;
    cr_assert_eq(kf_model_load_memory(b, len, NULL, &mt), KF_OK, "%s", kf_last_error());
    free(b);
    for (int i = 0; i < nt; i++) {
        char rname[32];
        snprintf(rname, sizeof rname, "t%s", tl[i]->name + 1);
        const kf_tensor *a = m->graph->values[kf_graph_find(m->graph, rname)].init;
        const kf_tensor *c = mt->graph->values[kf_graph_find(mt->graph, tl[i]->name)].init;
        cr_assert(kf_tensor_equal(a, c), "%s: int32_data and raw_data load differently",
                  kf_dtype_name((kf_dtype)tl[i]->data_type));
    }
    kf_model_free(m);
    kf_model_free(mt);
    for (int i = 0; i < n; i++) {
        onnx__tensor_proto__free_unpacked(raw[i], NULL);
        if (typed[i]) onnx__tensor_proto__free_unpacked(typed[i], NULL);
    }
}

/* ---- rounding into the small float types ------------------------------------------- */

/* Facts of the spec's format tables: largest finite value, smallest
 * subnormal, whether -0 and Inf exist. */
static const struct {
    kf_dtype dt;
    double max, min_sub;
    bool negzero, inf, nan;
} formats[] = {
    {KF_DT_FLOAT8E4M3FN, 448, 0x1p-9, true, false, true},   {KF_DT_FLOAT8E4M3FNUZ, 240, 0x1p-10, false, false, true},
    {KF_DT_FLOAT8E5M2, 57344, 0x1p-16, true, true, true},   {KF_DT_FLOAT8E5M2FNUZ, 57344, 0x1p-17, false, false, true},
    {KF_DT_FLOAT4E2M1, 6, 0.5, true, false, false},         {KF_DT_FLOAT6E2M3, 7.5, 0.125, true, false, false},
    {KF_DT_FLOAT6E3M2, 28, 0.0625, true, false, false},
};

Test(small_types, float_conversion_is_nearest_even_with_the_spec_overflow_rules) {
    for (size_t f = 0; f < sizeof formats / sizeof *formats; f++) {
        kf_dtype dt = formats[f].dt;
        int bits = kf_dtype_bits(dt);
        unsigned ncodes = 1u << bits, sbit = ncodes / 2;
        /* decoding: the table's extremes, symmetric signs */
        double mx = 0, mn = INFINITY;
        for (unsigned c = 0; c < ncodes; c++) {
            double v = kf_small_to_f64(dt, (uint8_t)c);
            if (isfinite(v)) mx = fmax(mx, fabs(v));
            if (isfinite(v) && v > 0) mn = fmin(mn, v);
            if (c & sbit && isfinite(v) && v != 0) cr_assert_eq(v, -kf_small_to_f64(dt, (uint8_t)(c ^ sbit)));
        }
        cr_assert_eq(mx, formats[f].max, "%s: max %g", kf_dtype_name(dt), mx);
        cr_assert_eq(mn, formats[f].min_sub, "%s: smallest subnormal %g", kf_dtype_name(dt), mn);
        cr_assert_eq(kf_f64_to_small(dt, -0.0, true) == sbit, formats[f].negzero, "%s: -0", kf_dtype_name(dt));
        for (int sat = 0; sat < 2; sat++) {
            for (int k = 0; k < 20000; k++) {
                /* magnitudes from below the smallest subnormal to past the max */
                double x = ldexp(tu_uniform(1, 2), (int)tu_uniform(log2(formats[f].min_sub) - 3, log2(formats[f].max) + 3));
                if (k % 3 == 0) x = (double)(float)x; /* float32 inputs too */
                if (k & 1) x = -x;
                uint8_t got = kf_f64_to_small(dt, x, sat);
                /* the nearest finite code, ties to the even code; past the max
                 * the "next" value max + ulp competes and means overflow */
                double best = INFINITY;
                int want = -1;
                for (unsigned c = 0; c < ncodes; c++) {
                    double v = kf_small_to_f64(dt, (uint8_t)c);
                    if (!isfinite(v) || (v == 0 && signbit(v) != signbit(x) && formats[f].negzero)) continue;
                    double d = fabs(v - x);
                    if (d < best || (d == best && !(c & 1))) best = d, want = (int)c;
                }
                double ulp = formats[f].max - fabs(kf_small_to_f64(dt, (uint8_t)(
                                                                       kf_f64_to_small(dt, formats[f].max, true) - 1)));
                double beyond = fabs(fabs(x) - (formats[f].max + ulp));
                bool max_odd = kf_f64_to_small(dt, formats[f].max, true) & 1;
                bool overflow = fabs(x) > formats[f].max && (beyond < best || (beyond == best && max_odd));
                if (overflow) {
                    uint8_t maxc = kf_f64_to_small(dt, x > 0 ? formats[f].max : -formats[f].max, true);
                    if (sat || !formats[f].nan) want = maxc;
                    else {
                        double v = kf_small_to_f64(dt, got);
                        cr_assert(formats[f].inf ? isinf(v) && (v > 0) == (x > 0) : isnan(v),
                                  "%s: %.17g without saturation gives %g", kf_dtype_name(dt), x, v);
                        continue;
                    }
                }
                cr_assert_eq(got, want, "%s saturate=%d: %.17g gives code 0x%02x, nearest even is 0x%02x",
                             kf_dtype_name(dt), sat, x, got, want);
            }
            /* infinities and NaN */
            double v = kf_small_to_f64(dt, kf_f64_to_small(dt, INFINITY, sat));
            if (sat || !formats[f].nan) cr_assert_eq(v, formats[f].max, "%s: +Inf", kf_dtype_name(dt));
            else cr_assert(formats[f].inf ? isinf(v) : isnan(v), "%s: +Inf without saturation", kf_dtype_name(dt));
            if (formats[f].nan) cr_assert(isnan(kf_small_to_f64(dt, kf_f64_to_small(dt, NAN, sat))));
        }
    }
}

Test(small_types, small_integers_truncate_and_wrap) {
    static const struct {
        kf_dtype dt;
        int lo, hi;
    } ints[] = {{KF_DT_INT4, -8, 7}, {KF_DT_UINT4, 0, 15}, {KF_DT_INT2, -2, 1}, {KF_DT_UINT2, 0, 3}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        int span = ints[i].hi - ints[i].lo + 1;
        for (int k = 0; k < 2000; k++) {
            double x = tu_uniform(ints[i].lo - 4, ints[i].hi + 5);
            double t = trunc(x);
            int want = t >= ints[i].lo && t <= ints[i].hi ? (int)t : 0; /* out of range: undefined, 0 as ONNX's reference */
            cr_assert_eq((int8_t)kf_f64_to_small(ints[i].dt, x, true), want, "%s from %g", kf_dtype_name(ints[i].dt), x);
            int64_t n = (int64_t)tu_uniform(-1000, 1000);
            int64_t w = ((n - ints[i].lo) % span + span) % span + ints[i].lo; /* integers wrap */
            cr_assert_eq((int8_t)kf_i64_to_small(ints[i].dt, n), w, "%s from %lld", kf_dtype_name(ints[i].dt), (long long)n);
        }
    }
}

/* ---- Cast against ONNX's reference implementation ---------------------------------- */

static const char *python_with_onnx(void) {
    static char venv[PATH_MAX];
    snprintf(venv, sizeof venv, "%s/bench/.venv/bin/python", KF_SOURCE_DIR);
    const char *cands[2] = {venv, "python3"};
    for (int i = 0; i < 2; i++) {
        if (i == 0 && access(venv, X_OK) != 0) continue;
        char cmd[PATH_MAX + 160];
        snprintf(cmd, sizeof cmd,
                 "%s -c 'import onnx, numpy, ml_dtypes; from onnx import TensorProto as T; T.INT2' >/dev/null 2>&1",
                 cands[i]);
        if (system(cmd) == 0) return cands[i];
    }
    return NULL;
}

static bool same_bits(const kf_tensor *a, const kf_tensor *b, char *why, size_t n) {
    if (a->dtype != b->dtype || a->numel != b->numel) {
        snprintf(why, n, "dtype or size differ (%s/%lld vs %s/%lld)", kf_dtype_name(a->dtype), (long long)a->numel,
                 kf_dtype_name(b->dtype), (long long)b->numel);
        return false;
    }
    size_t esz = kf_dtype_size(a->dtype);
    for (int64_t i = 0; i < a->numel; i++) {
        const uint8_t *x = (const uint8_t *)a->data + (size_t)i * esz, *y = (const uint8_t *)b->data + (size_t)i * esz;
        bool nan = kf_dtype_is_float(a->dtype) && isnan(kf_get_f64(a, i)) && isnan(kf_get_f64(b, i));
        if (!nan && memcmp(x, y, esz)) {
            snprintf(why, n, "element %lld: got %.9g, want %.9g", (long long)i, kf_get_f64(a, i), kf_get_f64(b, i));
            return false;
        }
    }
    return true;
}

Test(small_types, cast_matches_onnx_reference_implementation, .timeout = 600) {
    const char *py = python_with_onnx();
    if (!py) cr_skip_test("no python with onnx >= 1.20 and ml_dtypes (bench/.venv after bench/setup_venv.sh)");
    char dir[] = "/tmp/kfuse_castref_XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "%s %s/tests/cast_ref.py %s --seed %llu 2>/dev/null", py, KF_SOURCE_DIR, dir,
             (unsigned long long)(tu_seed() & 0xffffffff));
    cr_assert_eq(system(cmd), 0, "cast_ref.py failed: %s", cmd);
    DIR *d = opendir(dir);
    cr_assert(d);
    struct dirent *e;
    int checked = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s/model.onnx", dir, e->d_name);
        kf_model *m;
        cr_assert_eq(kf_model_load(path, &m), KF_OK, "%s: %s", e->d_name, kf_last_error());
        kf_tensor in = {0}, want = {0}, got = {0};
        snprintf(path, sizeof path, "%s/%s/test_data_set_0/input_0.pb", dir, e->d_name);
        cr_assert_eq(kf_onnx_read_tensor_file(path, &in, NULL), KF_OK, "%s", kf_last_error());
        snprintf(path, sizeof path, "%s/%s/test_data_set_0/output_0.pb", dir, e->d_name);
        cr_assert_eq(kf_onnx_read_tensor_file(path, &want, NULL), KF_OK, "%s", kf_last_error());
        cr_assert_eq(kf_eval_model(m, &in, 1, &got, NULL), KF_OK, "%s: %s", e->d_name, kf_last_error());
        char why[256];
        cr_assert(same_bits(&got, &want, why, sizeof why), "%s: %s", e->d_name, why);
        kf_tensor_release(&in);
        kf_tensor_release(&want);
        kf_tensor_release(&got);
        kf_model_free(m);
        snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", dir, e->d_name);
        cr_assert_eq(system(cmd), 0);
        checked++;
    }
    closedir(d);
    rmdir(dir);
    cr_assert_gt(checked, 50, "only %d Cast folders written", checked);
}

/* ---- ops that do not read the new types ---------------------------------------------- */

Test(small_types, arithmetic_refuses_them_by_name_data_movement_keeps_codes) {
    int64_t dims[2] = {2, 3};
    kf_tensor x = {0};
    cr_assert_eq(kf_tensor_alloc(&x, KF_DT_FLOAT8E4M3FN, 2, dims), KF_OK);
    for (int64_t i = 0; i < x.numel; i++) ((uint8_t *)x.data)[i] = (uint8_t)tu_uniform(0, 256);
    kf_node *add = tu_node("Add", 2, 1, 14);
    const kf_tensor *ins[2] = {&x, &x};
    kf_tensor out[1] = {{0}};
    cr_assert_eq(kf_eval_node(add, 2, ins, out), KF_ERR_UNSUPPORTED);
    cr_assert(strstr(kf_last_error(), "float8e4m3fn") && strstr(kf_last_error(), kf_node_label(add)), "%s",
              kf_last_error());
    tu_node_free(add);
    kf_node *tr = tu_node("Transpose", 1, 1, 13);
    tu_eval(tr, 1, ins, out);
    cr_assert_eq(out[0].dtype, KF_DT_FLOAT8E4M3FN);
    for (int64_t r = 0; r < 2; r++)
        for (int64_t c = 0; c < 3; c++)
            cr_assert_eq(((uint8_t *)out[0].data)[c * 2 + r], ((uint8_t *)x.data)[r * 3 + c]);
    tu_node_free(tr);
    kf_tensor_release(&out[0]);
    kf_tensor_release(&x);
}

/* Opsets 24 and 25 add float8e8m0 and int2/uint2 to the shape ops: Shape
 * and Size read only the shape, Reshape moves the codes, and an op
 * that would read them as numbers is still refused naming node and type. */
Test(small_types, opset_25_shape_ops_take_int2_and_e8m0) {
    int64_t dims[2] = {3, 4};
    const kf_dtype dts[2] = {KF_DT_INT2, KF_DT_FLOAT8E8M0};
    for (int k = 0; k < 2; k++) {
        kf_tensor x = {0};
        cr_assert_eq(kf_tensor_alloc(&x, dts[k], 2, dims), KF_OK);
        for (int64_t i = 0; i < x.numel; i++)
            ((uint8_t *)x.data)[i] = k ? (uint8_t)tu_uniform(0, 255) : (uint8_t)(int8_t)tu_uniform(-2, 2);
        const kf_tensor *ins[1] = {&x};
        kf_tensor out[1] = {{0}};
        kf_node *sh = tu_node("Shape", 1, 1, 25);
        tu_eval(sh, 1, ins, out);
        cr_assert(out[0].numel == 2 && ((int64_t *)out[0].data)[0] == 3 && ((int64_t *)out[0].data)[1] == 4);
        kf_tensor_release(&out[0]);
        tu_node_free(sh);
        kf_node *sz = tu_node("Size", 1, 1, 25);
        tu_eval(sz, 1, ins, out);
        cr_assert_eq(((int64_t *)out[0].data)[0], 12);
        kf_tensor_release(&out[0]);
        tu_node_free(sz);
        int64_t one = 2, nd[2] = {4, 3};
        kf_tensor shape = tu_i64(1, &one, nd);
        const kf_tensor *rin[2] = {&x, &shape};
        kf_node *rs = tu_node("Reshape", 2, 1, 25);
        tu_eval(rs, 2, rin, out);
        cr_assert_eq(out[0].dtype, dts[k]);
        cr_assert(!memcmp(out[0].data, x.data, 12), "Reshape moved the codes");
        kf_tensor_release(&out[0]);
        tu_node_free(rs);
        kf_node *neg = tu_node("Neg", 1, 1, 25);
        cr_assert_eq(kf_eval_node(neg, 1, ins, out), KF_ERR_UNSUPPORTED);
        cr_assert(strstr(kf_last_error(), kf_dtype_name(dts[k])) && strstr(kf_last_error(), kf_node_label(neg)), "%s",
                  kf_last_error());
        tu_node_free(neg);
        kf_tensor_release(&shape);
        kf_tensor_release(&x);
    }
}
