/*
 * test_precision_cli.c: `--precision` of kfuse run, compile and bench, and
 * KFUSE_PRECISION as its default: each name is taken, anything else is a
 * usage error (exit 2) naming the value, before any model is loaded.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

static char bin[PATH_MAX], out[8192];

static void find_cli(void) { tu_cli_find("precision_cli", bin, sizeof bin); }

/* `env kfuse args` (on the bundled tiny CNN): exit code, output in out */
static int kfuse(const char *env, const char *args) { return tu_cli_run(bin, env, args, out, sizeof out); }

#define MODEL KF_SOURCE_DIR "/bench/models/tiny_cnn.onnx"

Test(precision_cli, bad_value_is_a_usage_error) {
    find_cli();
    static const char *const verbs[] = {"run " MODEL " --backend ref", "compile " MODEL " --backend opencl",
                                        "bench " MODEL " --backend ref --iters 1"};
    for (int v = 0; v < 3; v++) {
        char args[1024];
        snprintf(args, sizeof args, "%s --precision fp4", verbs[v]);
        cr_assert_eq(kfuse("", args), 2, "kfuse %s: %s", args, out);
        cr_assert(strstr(out, "unknown precision 'fp4'") && strstr(out, "fp32, tf32, fp16, bf16"), "%s", out);
        cr_assert_eq(kfuse("KFUSE_PRECISION=half", verbs[v]), 2, "kfuse %s: %s", verbs[v], out);
        cr_assert(strstr(out, "KFUSE_PRECISION='half'"), "%s", out);
        /* the flag wins over the environment */
        snprintf(args, sizeof args, "%s --precision fp32", verbs[v]);
        cr_assert_eq(kfuse("KFUSE_PRECISION=half", args), 0, "kfuse %s: %s", args, out);
    }
    snprintf(out, sizeof out, "-");
    cr_assert_eq(kfuse("", "run " MODEL " --precision"), 2, "a flag without its value: %s", out);
}

Test(precision_cli, names_are_taken) {
    find_cli();
    /* (fp8 on a model without float8 QDQ: fp16) */
    static const char *const names[] = {"fp32", "tf32", "fp16", "bf16", "fp8"};
    for (int i = 0; i < 5; i++) {
        char args[1024];
        snprintf(args, sizeof args, "run %s --backend ref --check --precision %s", MODEL, names[i]);
        cr_assert_eq(kfuse("", args), 0, "kfuse %s: %s", args, out);
        cr_assert(strstr(out, names[i]) || i == 0, "the run names its precision: %s", out);
        snprintf(args, sizeof args, "bench %s --backend ref --iters 1 --warmup 0", MODEL);
        char env[64];
        snprintf(env, sizeof env, "KFUSE_PRECISION=%s", names[i]);
        cr_assert_eq(kfuse(env, args), 0, "%s kfuse %s: %s", env, args, out);
        cr_assert(strstr(out, names[i]), "bench names the precision KFUSE_PRECISION gave: %s", out);
    }
}
