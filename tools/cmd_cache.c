/*
 * cmd_cache.c: the `kfuse cache stats|clear` verb, over the kernel cache's
 * folder (kernels/cache.c): stats prints the folder, its entry count and
 * bytes; clear deletes the kfuse entry files and nothing else. The folder is
 * --dir D, else the default (KFUSE_CACHE_DIR, XDG_CACHE_HOME, HOME).
 */
#include <stdio.h>
#include <string.h>

#include "kf_cache.h"

int kfuse_cmd_cache(int argc, char **argv);

enum { EXIT_OK = 0, EXIT_USAGE = 2, EXIT_INPUT = 3 };

static void cache_usage(FILE *f) {
    fprintf(f, "usage: kfuse cache stats|clear [--dir D]\n"
               "  stats     the cache folder, its entries and their bytes\n"
               "  clear     delete the kfuse entry files (nothing else in the folder)\n"
               "  --dir D   the folder (default: $KFUSE_CACHE_DIR, $XDG_CACHE_HOME/kfuse, ~/.cache/kfuse)\n");
}

static int fail(kf_status st) {
    fprintf(stderr, "kfuse: %s: %s\n", kf_status_name(st), kf_last_error());
    return EXIT_INPUT;
}

int kfuse_cmd_cache(int argc, char **argv) {
    if (argc < 1 || (strcmp(argv[0], "stats") && strcmp(argv[0], "clear"))) {
        cache_usage(stderr);
        return EXIT_USAGE;
    }
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else {
            cache_usage(stderr);
            return EXIT_USAGE;
        }
    }
    kf_cache *c;
    kf_status st = kf_cache_open(dir, &c);
    if (st) {
        kf_cache_close(c); /* memory-only is no use to this verb */
        return fail(st);
    }
    if (!strcmp(argv[0], "stats")) {
        kf_cache_info s;
        st = kf_cache_stats(c, &s);
        if (!st) {
            printf("dir: %s\n", kf_cache_dir(c));
            printf("entries: %llu\n", (unsigned long long)s.disk_entries);
            printf("bytes: %llu\n", (unsigned long long)s.disk_bytes);
        }
    } else {
        uint64_t n = 0, b = 0;
        st = kf_cache_clear(c, &n, &b);
        printf("removed %llu entries (%llu bytes) from %s\n", (unsigned long long)n, (unsigned long long)b,
               kf_cache_dir(c));
    }
    kf_cache_close(c);
    return st ? fail(st) : EXIT_OK;
}
