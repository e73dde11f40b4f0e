/*
 * fuzz_load.c: libFuzzer target for the ONNX loader, the first thing to
 * touch an untrusted file. Any bytes must give a model or a typed error with
 * a message; a model that loads must save, the saved bytes must load again,
 * and a second save/load round must change nothing. Anything else (crash,
 * sanitizer report, leak, abort below) is a finding. Run through
 * tests/fuzz/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_onnx.h"

static void finding(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_load: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kf_model *m = NULL;
    /* no folder: external data must be refused, never looked up */
    kf_status st = kf_model_load_memory(data, size, NULL, &m);
    if (st) {
        if (m) finding("failed load returned a model", kf_last_error());
        if (!kf_last_error()[0]) finding("failed load without a message", kf_status_name(st));
        return 0;
    }
    /* save -> load must work, and a second round must change nothing: the
     * first save may reorder nodes (export writes topological order). */
    void *b1 = NULL, *b2 = NULL, *b3 = NULL;
    size_t n1 = 0, n2 = 0, n3 = 0;
    kf_model *m2 = NULL, *m3 = NULL;
    st = kf_model_save_memory(m, &b1, &n1);
    if (st == KF_ERR_NOMEM) goto done;
    if (st) finding("a loaded model does not save", kf_last_error());
    if (kf_model_load_memory(b1, n1, NULL, &m2)) finding("a saved model does not load", kf_last_error());
    if (kf_model_save_memory(m2, &b2, &n2)) finding("a re-loaded model does not save", kf_last_error());
    if (kf_model_load_memory(b2, n2, NULL, &m3)) finding("a twice-saved model does not load", kf_last_error());
    char why[512];
    if (!kf_model_equal(m2, m3, why, sizeof why)) finding("the second round trip changed the model", why);
    /* from the second round on, export is a fixed point byte for byte (the
     * first may also reorder value_info, which follows value ids) */
    if (kf_model_save_memory(m3, &b3, &n3)) finding("a twice-loaded model does not save", kf_last_error());
    if (n2 != n3 || memcmp(b2, b3, n2) != 0) finding("the third save wrote different bytes", "");
done:
    free(b3);
    kf_model_free(m3);
    kf_model_free(m2);
    free(b2);
    free(b1);
    kf_model_free(m);
    return 0;
}
