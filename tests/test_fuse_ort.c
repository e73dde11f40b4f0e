/*
 * test_fuse_ort.c: ONNX Runtime runs `kfuse fuse` output unchanged. Runs
 * bench/fusion_check.py (kfuse fuse, then ORT on the original and the fused
 * file with each folder's inputs, outputs compared per DESIGN.md) on the
 * bundled real-architecture models. Needs a python with onnxruntime: the
 * bench venv (bench/setup_venv.sh) or the system python; without one the
 * test skips and says why.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The python that can import onnxruntime, or NULL. */
static const char *python_with_ort(void) {
    static char venv[PATH_MAX];
    snprintf(venv, sizeof venv, "%s/bench/.venv/bin/python", KF_SOURCE_DIR);
    const char *cands[2] = {venv, "python3"};
    for (int i = 0; i < 2; i++) {
        if (i == 0 && access(venv, X_OK) != 0) continue;
        char cmd[PATH_MAX + 96];
        snprintf(cmd, sizeof cmd, "%s -c 'import onnxruntime, onnx, numpy' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0) return cands[i];
    }
    return NULL;
}

static bool kfuse_binary(char *out, size_t n) {
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return false;
    self[len] = 0;
    char *slash = strrchr(self, '/');
    if (!slash) return false;
    *slash = 0;
    snprintf(out, n, "%s/../tools/kfuse", self);
    return access(out, X_OK) == 0;
}

Test(fuse_ort, onnxruntime_runs_fused_real_models_unchanged, .timeout = 600) {
    const char *py = python_with_ort();
    if (!py) cr_skip_test("no python with onnxruntime (bench/.venv after bench/setup_venv.sh, or python3 -m pip install onnxruntime)");
    char kfuse[PATH_MAX];
    if (!kfuse_binary(kfuse, sizeof kfuse)) cr_skip_test("the kfuse binary is not built beside the tests");
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "%s %s/bench/fusion_check.py --kfuse %s %s/bench/models/small 2>&1", py, KF_SOURCE_DIR,
             kfuse, KF_SOURCE_DIR);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char line[1024], last[1024] = "";
    while (fgets(line, sizeof line, p)) {
        fputs(line, stderr);
        if (line[0] && line[0] != '\n') snprintf(last, sizeof last, "%s", line);
    }
    int rc = pclose(p);
    cr_assert_eq(rc, 0, "fusion_check failed: %s", last);
    cr_assert(strstr(last, "0 failed") != NULL, "expected a summary with 0 failed, got: %s", last);
}
