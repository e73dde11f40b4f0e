/* test_util.c: see test_util.h. */
#include "test_util.h"
#include "kf_cache.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

kf_node *tu_node(const char *op_type, int nin, int nout, int64_t opset) {
    kf_node *n = calloc(1, sizeof *n);
    n->name = strdup(op_type);
    n->op_type = strdup(op_type);
    n->domain = strdup("");
    n->doc = NULL;
    n->op = kf_op_lookup("", op_type);
    n->opset = opset;
    n->nin = nin;
    n->nout = nout;
    n->in = calloc((size_t)nin + 1, sizeof(kf_id));
    n->out = calloc((size_t)nout + 1, sizeof(kf_id));
    for (int i = 0; i < nin; i++) n->in[i] = (kf_id)(i + 1);
    for (int j = 0; j < nout; j++) n->out[j] = (kf_id)(nin + j + 1);
    return n;
}

void tu_node_free(kf_node *n) {
    for (int i = 0; i < n->nattrs; i++) kf_attr_release(&n->attrs[i]);
    free(n->attrs);
    free(n->name);
    free(n->op_type);
    free(n->domain);
    free(n->in);
    free(n->out);
    free(n);
}

static void add(kf_node *n, kf_attr *a) {
    kf_status st = kf_node_add_attr(n, a);
    cr_assert_eq(st, KF_OK, "adding attribute: %s", kf_last_error());
}

void tu_attr_i(kf_node *n, const char *name, int64_t v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_INT, .i = v};
    add(n, &a);
}

void tu_attr_f(kf_node *n, const char *name, float v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_FLOAT, .f = v};
    add(n, &a);
}

void tu_attr_s(kf_node *n, const char *name, const char *v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_STRING, .s = {(char *)v, strlen(v)}};
    add(n, &a);
}

void tu_attr_ints(kf_node *n, const char *name, int count, const int64_t *v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_INTS, .ints = (int64_t *)v, .n = count};
    add(n, &a);
}

void tu_attr_floats(kf_node *n, const char *name, int count, const float *v) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_FLOATS, .floats = (float *)v, .n = count};
    add(n, &a);
}

void tu_attr_t(kf_node *n, const char *name, const kf_tensor *t) {
    kf_attr a = {.name = (char *)name, .type = KF_ATTR_TENSOR, .t = (kf_tensor *)t};
    add(n, &a);
}

kf_tensor tu_tensor(kf_dtype dt, int rank, const int64_t *dims, const double *vals) {
    kf_tensor t = {0};
    kf_status st = kf_tensor_alloc(&t, dt, rank, dims);
    cr_assert_eq(st, KF_OK, "alloc: %s", kf_last_error());
    for (int64_t i = 0; i < t.numel; i++) kf_set_f64(&t, i, vals[i]);
    return t;
}

kf_tensor tu_f32(int rank, const int64_t *dims, const float *vals) {
    kf_tensor t = {0};
    kf_status st = kf_tensor_alloc(&t, KF_DT_FLOAT, rank, dims);
    cr_assert_eq(st, KF_OK, "alloc: %s", kf_last_error());
    memcpy(t.data, vals, (size_t)t.numel * sizeof(float));
    return t;
}

kf_tensor tu_i64(int rank, const int64_t *dims, const int64_t *vals) {
    kf_tensor t = {0};
    kf_status st = kf_tensor_alloc(&t, KF_DT_INT64, rank, dims);
    cr_assert_eq(st, KF_OK, "alloc: %s", kf_last_error());
    memcpy(t.data, vals, (size_t)t.numel * sizeof(int64_t));
    return t;
}

static uint64_t rng_state;
static int seeded;

uint64_t tu_seed(void) {
    if (!seeded) {
        const char *e = getenv("KF_SEED");
        rng_state = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
        if (!rng_state) rng_state = 1;
        fprintf(stderr, "test seed: KF_SEED=%llu\n", (unsigned long long)rng_state);
        seeded = 1;
    }
    return rng_state;
}

double tu_uniform(double lo, double hi) {
    tu_seed();
    rng_state ^= rng_state << 13; /* xorshift64 */
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * ((double)(rng_state >> 11) / 9007199254740992.0);
}

kf_tensor tu_rand(kf_dtype dt, int rank, const int64_t *dims, double lo, double hi) {
    kf_tensor t = {0};
    kf_status st = kf_tensor_alloc(&t, dt, rank, dims);
    cr_assert_eq(st, KF_OK, "alloc: %s", kf_last_error());
    for (int64_t i = 0; i < t.numel; i++) {
        double v = tu_uniform(lo, hi);
        if (!kf_dtype_is_float(dt)) v = floor(v);
        kf_set_f64(&t, i, v);
    }
    return t;
}

bool tu_close(const kf_tensor *got, const kf_tensor *want, double atol, double rtol, char *why,
              size_t whylen) {
    char dummy[8];
    if (!why) {
        why = dummy;
        whylen = sizeof dummy;
    }
    if (got->dtype != want->dtype) {
        snprintf(why, whylen, "dtype %s, expected %s", kf_dtype_name(got->dtype), kf_dtype_name(want->dtype));
        return false;
    }
    if (got->rank != want->rank) {
        snprintf(why, whylen, "rank %d, expected %d", got->rank, want->rank);
        return false;
    }
    for (int d = 0; d < got->rank; d++)
        if (got->dims[d] != want->dims[d]) {
            snprintf(why, whylen, "dim %d is %lld, expected %lld", d, (long long)got->dims[d],
                     (long long)want->dims[d]);
            return false;
        }
    if (got->dtype == KF_DT_STRING) {
        if (!kf_tensor_equal(got, want)) {
            snprintf(why, whylen, "strings differ");
            return false;
        }
        return true;
    }
    for (int64_t i = 0; i < got->numel; i++) {
        if (kf_dtype_is_small_float(got->dtype)) { /* float8/6/4 codes: the same value, NaN as NaN */
            double g = kf_get_f64(got, i), w = kf_get_f64(want, i);
            if (!(g == w || (isnan(g) && isnan(w)))) {
                snprintf(why, whylen, "element %lld is %.9g, expected %.9g (%s)", (long long)i, g, w,
                         kf_dtype_name(got->dtype));
                return false;
            }
            continue;
        }
        if (!kf_dtype_is_float(got->dtype)) {
            if (kf_get_i64(got, i) != kf_get_i64(want, i) || kf_get_u64(got, i) != kf_get_u64(want, i)) {
                snprintf(why, whylen, "element %lld is %lld, expected %lld", (long long)i,
                         (long long)kf_get_i64(got, i), (long long)kf_get_i64(want, i));
                return false;
            }
            continue;
        }
        double g = kf_get_f64(got, i), w = kf_get_f64(want, i);
        bool ok;
        if (isnan(w)) ok = isnan(g);
        else if (isinf(w)) ok = g == w;
        else ok = !isnan(g) && fabs(g - w) <= atol + rtol * fabs(w);
        if (!ok) {
            snprintf(why, whylen, "element %lld is %.9g, expected %.9g", (long long)i, g, w);
            return false;
        }
    }
    return true;
}

void tu_eval(const kf_node *n, int nin, const kf_tensor *const *in, kf_tensor *out) {
    kf_status st = kf_eval_node(n, nin, in, out);
    cr_assert_eq(st, KF_OK, "eval %s failed: %s", n->op_type, kf_last_error());
}

const char *tu_source_dir(void) {
    const char *d = getenv("KF_SOURCE_DIR");
    return d && *d ? d : KF_SOURCE_DIR;
}

void tu_cli_find(const char *suite, char *bin, size_t len) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        printf("%s: skipped, no /proc/self/exe\n", suite);
        cr_skip_test("no /proc/self/exe");
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(bin, len, "%s/../tools/kfuse", self);
    if (access(bin, X_OK)) {
        printf("%s: skipped, no kfuse binary next to the test binary (%s)\n", suite, bin);
        cr_skip_test("no kfuse binary next to the test binary (%s)", bin);
    }
}

int tu_cli_run(const char *bin, const char *env, const char *args, char *out, size_t len) {
    size_t clen = strlen(env) + strlen(bin) + strlen(args) + 64;
    char *cmd = malloc(clen);
    cr_assert_not_null(cmd);
    snprintf(cmd, clen, "%s timeout 120 '%s' %s 2>&1", env, bin, args);
    FILE *p = popen(cmd, "r");
    free(cmd);
    cr_assert(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    while (fgetc(p) != EOF) {
    }
    int status = pclose(p);
    cr_assert(WIFEXITED(status), "kfuse %s did not exit normally", args);
    return WEXITSTATUS(status);
}

int tu_cli_runf(const char *bin, char *out, size_t len, const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return tu_cli_run(bin, "", args, out, len);
}

void tu_cli_setup(const char *suite, char *bin, size_t blen, char *dir, size_t dlen) {
    tu_cli_find(suite, bin, blen);
    snprintf(dir, dlen, "/tmp/kf_%s_XXXXXX", suite);
    cr_assert(mkdtemp(dir), "mkdtemp");
}

void tu_cli_dir_remove(const char *dir) {
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static char cache_dir[64];

void tu_cache_dir_begin(const char *prefix) {
    snprintf(cache_dir, sizeof cache_dir, "/tmp/%s-XXXXXX", prefix);
    if (mkdtemp(cache_dir)) setenv("KFUSE_CACHE_DIR", cache_dir, 1);
    else cache_dir[0] = 0;
}

void tu_cache_dir_end(void) {
    if (!cache_dir[0]) return;
    kf_cache *c = NULL;
    if (kf_cache_open(cache_dir, &c) == KF_OK) kf_cache_clear(c, NULL, NULL);
    kf_cache_close(c);
    rmdir(cache_dir);
}
