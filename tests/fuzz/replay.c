/*
 * replay.c: a main() for a fuzz target without libFuzzer, so the committed
 * regression corpus (tests/fuzz/corpus/<target>/) runs in every build,
 * gcc and ASan included: each file (or each file in each folder) named on
 * the command line goes through LLVMFuzzerTestOneInput once. A finding
 * aborts, as under the fuzzer; otherwise prints how many inputs ran.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kf_onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    uint8_t *data;
    size_t len;
    if (kf_read_file(path, &data, &len)) {
        fprintf(stderr, "replay: %s\n", kf_last_error());
        return 1;
    }
    /* an exact-size copy, as libFuzzer passes it: ASan then sees any read
     * past the end (kf_read_file's buffer may be larger) */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        kf_free(data);
        fprintf(stderr, "replay: out of memory for %s\n", path);
        return 1;
    }
    memcpy(exact, data, len);
    kf_free(data);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    int ran = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb)) {
            fprintf(stderr, "replay: cannot read %s\n", argv[i]);
            bad++;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad += run_file(argv[i]);
            ran++;
            continue;
        }
        struct dirent **ents;
        int n = scandir(argv[i], &ents, NULL, NULL);
        if (n < 0) {
            fprintf(stderr, "replay: cannot list %s\n", argv[i]);
            bad++;
            continue;
        }
        char **names = calloc((size_t)n + 1, sizeof *names);
        int k = 0;
        for (int j = 0; j < n; j++) {
            if (ents[j]->d_name[0] != '.' && names) {
                size_t len = strlen(argv[i]) + strlen(ents[j]->d_name) + 2;
                if ((names[k] = malloc(len))) snprintf(names[k++], len, "%s/%s", argv[i], ents[j]->d_name);
            }
            free(ents[j]);
        }
        free(ents);
        if (!names) return 2;
        qsort(names, (size_t)k, sizeof *names, by_name); /* a stable order for reports */
        for (int j = 0; j < k; j++) {
            bad += run_file(names[j]);
            ran++;
            free(names[j]);
        }
        free(names);
    }
    printf("replay: %d inputs, %d unreadable\n", ran, bad);
    return bad ? 1 : 0;
}
