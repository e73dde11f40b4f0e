/*
 * test_dims_cli.c: symbolic dimensions at the command line. `--dim NAME=N`
 * on every verb that takes it (opt, fuse, run, bench), a name the model
 * lacks being a warning rather than an error, malformed values being usage
 * errors; on the committed small BERT (symbolic batch and seq).
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

static char bin[PATH_MAX], out[16384], dir[PATH_MAX];

static void find_cli(void) { tu_cli_setup("dims_cli", bin, sizeof bin, dir, sizeof dir); }

static void cleanup(void) { tu_cli_dir_remove(dir); }

/* `kfuse ARGS` (ARGS built printf-style): exit code, output in out */
#define kfuse(...) tu_cli_runf(bin, out, sizeof out, __VA_ARGS__)

#define BERT KF_SOURCE_DIR "/bench/models/small/bert/model.onnx"

/* The warning for a --dim name the model lacks names it. */
static void expect_ignored(const char *name) {
    char want[128];
    snprintf(want, sizeof want, "no symbolic dimension named '%s'", name);
    cr_assert(strstr(out, "warning") && strstr(out, want), "no warning naming '%s':\n%s", name, out);
}

Test(dims_cli, opt_fixes_a_dim_and_warns_on_one_the_model_lacks, .timeout = 240) {
    find_cli();
    int batch = 2 + (int)tu_uniform(0, 6);
    cr_assert_eq(kfuse("opt %s -o %s/o.onnx --dim batch=%d --dim height=7", BERT, dir, batch), 0, "%s", out);
    expect_ignored("height");
    cr_assert_eq(kfuse("info %s/o.onnx", dir), 0, "%s", out);
    char want[64];
    snprintf(want, sizeof want, "input_ids: int64[%d,seq]", batch);
    cr_assert(strstr(out, want), "opt --dim batch=%d: the written model's inputs:\n%s", batch, out);
    snprintf(want, sizeof want, "last_hidden_state: float[%d,seq,64]", batch);
    cr_assert(strstr(out, want), "opt --dim batch=%d: the written model's outputs:\n%s", batch, out);
    /* control: a model without --dim keeps both names */
    cr_assert_eq(kfuse("opt %s -o %s/p.onnx", BERT, dir), 0, "%s", out);
    cr_assert(!strstr(out, "warning"), "%s", out);
    cr_assert_eq(kfuse("info %s/p.onnx", dir), 0, "%s", out);
    cr_assert(strstr(out, "input_ids: int64[batch,seq]"), "%s", out);
    cleanup();
}

Test(dims_cli, a_dim_the_model_lacks_is_a_warning_on_every_verb, .timeout = 300) {
    find_cli();
    int batch = 1 + (int)tu_uniform(0, 3), seq = 2 + (int)tu_uniform(0, 10);
    cr_assert_eq(kfuse("fuse %s -o %s/f.onnx --dim batch=%d --dim width=3", BERT, dir, batch), 0, "%s", out);
    expect_ignored("width");
    cr_assert_eq(kfuse("run %s --backend ref --dim width=3 --dim batch=%d --dim seq=%d", BERT, batch, seq), 0, "%s",
                 out);
    expect_ignored("width");
    char want[64];
    snprintf(want, sizeof want, "last_hidden_state: float[%d,%d,64]", batch, seq);
    cr_assert(strstr(out, want), "run --dim batch=%d --dim seq=%d:\n%s", batch, seq, out);
    cr_assert_eq(kfuse("bench %s --backend ref --iters 1 --warmup 0 --dim width=3 --dim seq=%d", BERT, seq), 0, "%s",
                 out);
    expect_ignored("width");
    /* the names it has are not warned about */
    cr_assert(!strstr(out, "named 'seq'"), "%s", out);
    cleanup();
}

Test(dims_cli, malformed_dims_are_usage_errors) {
    find_cli();
    static const char *const bad[] = {"batch", "batch=", "=3", "batch=-1", "batch=2x", "batch=x"};
    static const char *const verbs[] = {"opt " BERT " -o /dev/null", "fuse " BERT " -o /dev/null",
                                        "run " BERT " --backend ref", "bench " BERT " --backend ref"};
    for (size_t v = 0; v < sizeof verbs / sizeof *verbs; v++)
        for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
            cr_assert_eq(kfuse("%s --dim %s", verbs[v], bad[k]), 2, "kfuse %s --dim %s: %s", verbs[v], bad[k], out);
            cr_assert(strstr(out, "--dim") && strstr(out, "non-negative integer"), "kfuse %s --dim %s: %s", verbs[v],
                      bad[k], out);
        }
    cleanup();
}
