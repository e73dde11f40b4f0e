/*
 * test_threads.c: the library used from several threads at once, as a
 * server embedding it would: one loaded model evaluated by several threads
 * together, each thread running the whole pipeline on its own copy, the
 * last-error message and fault injection being per thread, and one kernel
 * cache shared by all. Every result must equal a single-threaded run, byte
 * for byte. Run under ThreadSanitizer (-DKF_TSAN=ON) these also prove the
 * CPU paths free of data races; see tests/RELIABILITY.md for the command.
 * Worker threads never call Criterion assertions: they record what they
 * saw and the main thread checks it after joining.
 *
 * Criterion cannot start under ThreadSanitizer (its fork arena collides with
 * TSan's memory layout: Snaipe/Criterion#274), so the same file also builds
 * without it (-DKF_THREADS_MAIN: kfuse_threads, a plain main() running every
 * test below); that is the binary the TSan stage runs.
 */
#ifndef KF_THREADS_MAIN
#include <criterion/criterion.h>
#endif
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kf_cache.h"
#include "kf_codegen.h"
#include "kf_fuse.h"
#include "kf_onnx.h"
#include "kf_opt.h"
#include "kf_ref.h"

#ifdef KF_THREADS_MAIN
static int failures;
#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            failures++;                                                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                             \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)
#define REQUIRE(cond, ...)                                                                                   \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            CHECK(cond, __VA_ARGS__);                                                                        \
            return;                                                                                          \
        }                                                                                                    \
    } while (0)
#define THREAD_TEST(name) static void name(void)
#else
#define CHECK(cond, ...) cr_expect(cond, __VA_ARGS__)
#define REQUIRE(cond, ...) cr_assert(cond, __VA_ARGS__)
#define THREAD_TEST(name) Test(threads, name)
#endif

/* Threads per test: more than the CI machine's 2 cores, so threads really
 * interleave; few enough that the TSan build stays fast. */
#define NTHREADS 4
/* Rounds each thread runs: repeats give the scheduler more chances to
 * interleave differently. */
#define ROUNDS 3

/* MatMul, Add, Relu, Mul, Sub, Softmax on one branch and Exp, Mul, Tanh on
 * another, x float[4, 16]: planner, codegen and evaluator all do real work
 * and it stays quick under TSan. Also a seed of the pipeline fuzzer. */
#define MODEL_FILE KF_SOURCE_DIR "/tests/fuzz/corpus/fuzz_pipeline/threads_model.onnx"

typedef struct pipe_out {
    kf_status st;
    char err[256];
    void *bytes; /* fused model, saved */
    size_t len;
    char *kernels; /* all kernel sources, concatenated */
} pipe_out;

static void pipe_out_free(pipe_out *o) {
    free(o->bytes);
    free(o->kernels);
    memset(o, 0, sizeof *o);
}

static kf_status append(char **all, const char *text) {
    size_t a = *all ? strlen(*all) : 0, b = strlen(text);
    char *p = realloc(*all, a + b + 1);
    if (!p) return kf_fail(KF_ERR_NOMEM, "out of memory");
    memcpy(p + a, text, b + 1);
    *all = p;
    return KF_OK;
}

/* load -> optimize -> plan -> kernel text -> fuse export -> save. */
static void run_pipeline(const void *bytes, size_t len, pipe_out *o) {
    memset(o, 0, sizeof *o);
    kf_model *m = NULL;
    kf_plan *built = NULL, *p = NULL;
    kf_status st = kf_model_load_memory(bytes, len, NULL, &m);
    if (!st) {
        kf_opt_options oo;
        kf_opt_options_default(&oo);
        kf_opt_result res;
        st = kf_optimize(m, &oo, &res);
        kf_rules_free(&res.rules);
    }
    if (!st) {
        kf_plan_options po;
        kf_plan_options_default(&po);
        st = kf_plan_build(m, &po, &built);
    }
    for (uint32_t gi = 0; !st && gi < built->ngroups; gi++) {
        char why[256];
        if (kf_cg_unsupported(m, built, gi, why, sizeof why)) continue;
        kf_cg_kernel k;
        if ((st = kf_cg_group(m, built, gi, &k))) break;
        char *src = NULL;
        st = kf_cg_source(&k, KF_CG_OPENCL, &src);
        if (!st) st = append(&o->kernels, src);
        kf_free(src);
        kf_cg_kernel_release(&k);
    }
    if (!st) st = kf_fuse_plan_copy(m, built, &p);
    kf_plan_free(built);
    kf_fuse_stats fs;
    if (!st) st = kf_fuse_apply(m, p, &fs);
    if (!st) st = kf_model_save_memory(m, &o->bytes, &o->len);
    kf_fuse_simple_plan_free(p);
    kf_model_free(m);
    o->st = st;
    if (st) snprintf(o->err, sizeof o->err, "%s", kf_last_error());
}

static bool model_bytes(void **bytes, size_t *len) {
    uint8_t *b;
    if (kf_read_file(MODEL_FILE, &b, len)) return false;
    *bytes = b;
    return true;
}

/* ---- the whole pipeline, one model copy per thread ------------------------ */

typedef struct pipe_job {
    const void *bytes;
    size_t len;
    pipe_out out[ROUNDS];
} pipe_job;

static void *pipe_worker(void *arg) {
    pipe_job *j = arg;
    for (int r = 0; r < ROUNDS; r++) run_pipeline(j->bytes, j->len, &j->out[r]);
    return NULL;
}

THREAD_TEST(pipeline_in_every_thread_matches_one_thread) {
    void *bytes;
    size_t len;
    REQUIRE(model_bytes(&bytes, &len), "%s", kf_last_error());
    pipe_out want;
    run_pipeline(bytes, len, &want);
    REQUIRE(want.st == KF_OK, "%s", want.err);
    REQUIRE(want.kernels, "no kernel generated: codegen is not exercised");
    pipe_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (pipe_job){.bytes = bytes, .len = len};
        REQUIRE(pthread_create(&th[i], NULL, pipe_worker, &jobs[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++)
        for (int r = 0; r < ROUNDS; r++) {
            pipe_out *o = &jobs[i].out[r];
            CHECK(o->st == KF_OK, "thread %d round %d: %s", i, r, o->err);
            CHECK(o->len == want.len && !memcmp(o->bytes, want.bytes, want.len),
                      "thread %d round %d: the fused model differs from the single-threaded one", i, r);
            CHECK(o->kernels && !strcmp(o->kernels, want.kernels),
                      "thread %d round %d: kernel text differs from the single-threaded one", i, r);
            pipe_out_free(o);
        }
    pipe_out_free(&want);
    free(bytes);
}

/* ---- one model evaluated by several threads at once ----------------------- */

typedef struct eval_job {
    const kf_model *m;
    const kf_tensor *ins;
    uint32_t nins;
    kf_tensor *outs[ROUNDS]; /* noutputs each */
    kf_status st[ROUNDS];
    char err[256];
} eval_job;

static void *eval_worker(void *arg) {
    eval_job *j = arg;
    uint32_t no = j->m->graph->noutputs;
    for (int r = 0; r < ROUNDS; r++) {
        j->outs[r] = calloc(no, sizeof(kf_tensor));
        j->st[r] = j->outs[r] ? kf_eval_model(j->m, j->ins, (int)j->nins, j->outs[r], NULL) : KF_ERR_NOMEM;
        if (j->st[r]) snprintf(j->err, sizeof j->err, "%s", kf_last_error());
    }
    return NULL;
}

static bool same_bits(const kf_tensor *a, const kf_tensor *b) {
    if (a->dtype != b->dtype || a->numel != b->numel || a->rank != b->rank) return false;
    return !memcmp(a->data, b->data, (size_t)a->numel * kf_dtype_size(a->dtype));
}

/* Random inputs for the model's real inputs, from a printed seed. */
static bool random_inputs(const kf_model *m, kf_tensor **ins, uint32_t *nins) {
    const char *env = getenv("KF_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("test_threads: KF_SEED=%llu\n", (unsigned long long)seed);
    kf_id *ids;
    if (kf_graph_real_inputs(m->graph, &ids, nins)) return false;
    *ins = calloc(*nins + 1, sizeof **ins);
    bool ok = *ins != NULL;
    uint64_t x = seed * 2654435761u + 1;
    for (uint32_t i = 0; ok && i < *nins; i++) {
        const kf_type *ty = &m->graph->values[ids[i]].type;
        ok = kf_tensor_alloc(&(*ins)[i], ty->dtype, ty->rank, ty->dims) == KF_OK;
        for (int64_t k = 0; ok && k < (*ins)[i].numel; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            kf_set_f64(&(*ins)[i], k, (double)(x >> 11) / 9007199254740992.0 * 4 - 2);
        }
    }
    kf_free(ids);
    return ok;
}

THREAD_TEST(one_model_evaluated_by_all_threads) {
    void *bytes;
    size_t len;
    REQUIRE(model_bytes(&bytes, &len), "%s", kf_last_error());
    kf_model *m;
    kf_status st = kf_model_load_memory(bytes, len, NULL, &m);
    free(bytes);
    REQUIRE(st == KF_OK, "%s", kf_last_error());
    kf_tensor *ins = NULL;
    uint32_t nins = 0;
    REQUIRE(random_inputs(m, &ins, &nins), "inputs: %s", kf_last_error());
    uint32_t no = m->graph->noutputs;
    kf_tensor *want = calloc(no, sizeof *want);
    REQUIRE(kf_eval_model(m, ins, (int)nins, want, NULL) == KF_OK, "%s", kf_last_error());
    eval_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (eval_job){.m = m, .ins = ins, .nins = nins};
        REQUIRE(pthread_create(&th[i], NULL, eval_worker, &jobs[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++)
        for (int r = 0; r < ROUNDS; r++) {
            CHECK(jobs[i].st[r] == KF_OK, "thread %d round %d: %s", i, r, jobs[i].err);
            for (uint32_t k = 0; !jobs[i].st[r] && k < no; k++)
                CHECK(same_bits(&jobs[i].outs[r][k], &want[k]), "thread %d round %d: output %u differs", i, r, k);
            for (uint32_t k = 0; k < no; k++) kf_tensor_release(&jobs[i].outs[r][k]);
            free(jobs[i].outs[r]);
        }
    for (uint32_t k = 0; k < no; k++) kf_tensor_release(&want[k]);
    free(want);
    for (uint32_t k = 0; k < nins; k++) kf_tensor_release(&ins[k]);
    free(ins);
    kf_model_free(m);
}

/* ---- the last-error message is per thread --------------------------------- */

static pthread_barrier_t err_barrier;

typedef struct err_job {
    int id;
    kf_status st;
    char before[512], after[512];
} err_job;

static void *err_worker(void *arg) {
    err_job *j = arg;
    char path[128];
    snprintf(path, sizeof path, "/nonexistent-kfuse-dir/thread-%d.onnx", j->id);
    kf_model *m = NULL;
    j->st = kf_model_load(path, &m);
    snprintf(j->before, sizeof j->before, "%s", kf_last_error());
    /* every thread has failed before any looks again */
    pthread_barrier_wait(&err_barrier);
    if (j->id % 2) kf_clear_error(); /* clearing one thread's message leaves the others' */
    pthread_barrier_wait(&err_barrier);
    snprintf(j->after, sizeof j->after, "%s", kf_last_error());
    kf_model_free(m);
    return NULL;
}

THREAD_TEST(last_error_is_per_thread) {
    err_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    REQUIRE(pthread_barrier_init(&err_barrier, NULL, NTHREADS) == 0, "pthread_barrier_init");
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (err_job){.id = i};
        REQUIRE(pthread_create(&th[i], NULL, err_worker, &jobs[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&err_barrier);
    for (int i = 0; i < NTHREADS; i++) {
        char mine[64];
        snprintf(mine, sizeof mine, "thread-%d.onnx", i);
        CHECK(jobs[i].st != KF_OK, "thread %d: loading a missing file succeeded", i);
        CHECK(strstr(jobs[i].before, mine), "thread %d: message '%s' does not name its own file", i, jobs[i].before);
        if (i % 2) CHECK(!jobs[i].after[0], "thread %d: cleared, yet '%s'", i, jobs[i].after);
        else CHECK(!strcmp(jobs[i].after, jobs[i].before), "thread %d: another thread changed its message", i);
    }
}

/* ---- fault injection stays in the thread that armed it -------------------- */

typedef struct fault_job {
    const void *bytes;
    size_t len;
    bool arm;
    pipe_out out;
} fault_job;

static void *fault_worker(void *arg) {
    fault_job *j = arg;
    if (j->arm) kf_alloc_fault_set(1, true); /* every allocation of this thread fails */
    run_pipeline(j->bytes, j->len, &j->out);
    kf_alloc_fault_set(0, false);
    return NULL;
}

THREAD_TEST(fault_injection_is_per_thread) {
    void *bytes;
    size_t len;
    REQUIRE(model_bytes(&bytes, &len), "%s", kf_last_error());
    fault_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (fault_job){.bytes = bytes, .len = len, .arm = i == 0};
        REQUIRE(pthread_create(&th[i], NULL, fault_worker, &jobs[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    CHECK(jobs[0].out.st == KF_ERR_NOMEM, "the armed thread: %s", jobs[0].out.err);
    for (int i = 1; i < NTHREADS; i++) CHECK(jobs[i].out.st == KF_OK, "thread %d: %s", i, jobs[i].out.err);
    for (int i = 0; i < NTHREADS; i++) pipe_out_free(&jobs[i].out);
    free(bytes);
}

/* ---- one kernel cache shared by all threads ------------------------------- */

/* Keys per thread; half of them shared by all threads (the same kernel
 * compiled by several at once), half the thread's own. */
#define CACHE_KEYS 24

typedef struct cache_job {
    kf_cache *c;
    int id;
    int bad; /* gets that returned other bytes than were put */
    int misses_after_put;
    kf_status st;
    char err[256];
} cache_job;

static void cache_payload(int key, uint8_t *buf, size_t *len) {
    *len = 64 + (size_t)key * 37; /* different lengths: a torn entry shows */
    for (size_t i = 0; i < *len; i++) buf[i] = (uint8_t)(key * 131 + i * 7);
}

static void *cache_worker(void *arg) {
    cache_job *j = arg;
    uint8_t buf[2048];
    for (int r = 0; r < ROUNDS && !j->st; r++)
        for (int k = 0; k < CACHE_KEYS && !j->st; k++) {
            int key = k < CACHE_KEYS / 2 ? k : 1000 * (j->id + 1) + k; /* shared, then own */
            char text[64];
            snprintf(text, sizeof text, "__kernel void k%d() {}", key);
            kf_cache_key ck = {text, strlen(text), "opencl:test", "threads-test 1", "-cl-std=CL1.2"};
            size_t len;
            cache_payload(key % 40, buf, &len);
            if ((j->st = kf_cache_put(j->c, &ck, buf, len))) break;
            void *got = NULL;
            size_t glen = 0;
            bool hit = false;
            if ((j->st = kf_cache_get(j->c, &ck, &got, &glen, &hit))) break;
            if (!hit) j->misses_after_put++;
            else if (glen != len || memcmp(got, buf, len)) j->bad++;
            free(got);
        }
    if (j->st) snprintf(j->err, sizeof j->err, "%s", kf_last_error());
    return NULL;
}

THREAD_TEST(one_cache_shared_by_all_threads) {
    char dir[] = "/tmp/kfuse-threads-XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");
    kf_cache *c = NULL;
    REQUIRE(kf_cache_open(dir, &c) == KF_OK, "%s", kf_last_error());
    /* a small memory side, so evictions and disk reads happen under load */
    kf_cache_set_mem_limit(c, 8192, 8);
    cache_job jobs[NTHREADS];
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        jobs[i] = (cache_job){.c = c, .id = i};
        REQUIRE(pthread_create(&th[i], NULL, cache_worker, &jobs[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++) {
        CHECK(jobs[i].st == KF_OK, "thread %d: %s", i, jobs[i].err);
        CHECK(jobs[i].bad == 0, "thread %d: %d gets returned other bytes than were put", i, jobs[i].bad);
        CHECK(jobs[i].misses_after_put == 0, "thread %d: %d gets missed right after a put", i,
              jobs[i].misses_after_put);
    }
    kf_cache_info info;
    CHECK(kf_cache_stats(c, &info) == KF_OK, "%s", kf_last_error());
    /* every distinct key has exactly one whole entry on disk */
    CHECK(info.disk_entries == CACHE_KEYS / 2 + NTHREADS * (CACHE_KEYS / 2), "%llu entries on disk",
                 (unsigned long long)info.disk_entries);
    uint64_t removed = 0, rbytes = 0;
    kf_cache_clear(c, &removed, &rbytes);
    kf_cache_close(c);
    rmdir(dir);
}

#ifdef KF_THREADS_MAIN
int main(void) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"pipeline_in_every_thread_matches_one_thread", pipeline_in_every_thread_matches_one_thread},
        {"one_model_evaluated_by_all_threads", one_model_evaluated_by_all_threads},
        {"last_error_is_per_thread", last_error_is_per_thread},
        {"fault_injection_is_per_thread", fault_injection_is_per_thread},
        {"one_cache_shared_by_all_threads", one_cache_shared_by_all_threads},
    };
    int n = (int)(sizeof tests / sizeof *tests);
    for (int i = 0; i < n; i++) {
        int before = failures;
        tests[i].fn();
        printf("%s threads::%s\n", failures == before ? "PASS" : "FAIL", tests[i].name);
    }
    printf("kfuse_threads: %d tests, %d failed checks\n", n, failures);
    return failures ? 1 : 0;
}
#endif
