/*
 * rules_compile.c: the build step that parses the built-in rewrite rules
 * (the .kfp files of fusion/patterns, embedded as text) and writes them as C tables for
 * the library, so no run of the optimizer parses them. Usage:
 *   kfuse_rules_compile OUT.c
 * A rule that does not parse fails the build with its file and line.
 */
#include <stdio.h>

#include "rules_emit.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.c\n", argv[0]);
        return 2;
    }
    kf_ruleset rs = {0};
    kf_status st = kf_rules_parse_builtin(&rs);
    FILE *f = st ? NULL : fopen(argv[1], "w");
    if (!st && !f) st = kf_fail(KF_ERR_IO, "cannot write '%s'", argv[1]);
    if (!st) st = kf_rules_emit_c(f, &rs);
    if (f && fclose(f) && !st) st = kf_fail(KF_ERR_IO, "cannot write '%s'", argv[1]);
    kf_rules_free(&rs);
    if (st) {
        fprintf(stderr, "%s: %s\n", argv[0], kf_last_error());
        if (f) remove(argv[1]);
        return 1;
    }
    return 0;
}
