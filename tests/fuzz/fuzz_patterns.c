/*
 * fuzz_patterns.c: libFuzzer target for the .kfp rule language (the text a
 * user hands `kfuse opt --patterns`). Any text must parse into rules or give
 * a typed error with a "file:line" message, never a crash or a leak
 * (rules before the bad one may stay in the set: kf_rules_free takes them).
 * Short inputs that parse are also run through the
 * numerical rule checker (kf_rules_check), which builds a model from each
 * rule's source pattern and applies the rule, so the matcher and the
 * replacement builder see every rule the parser accepts. Run through
 * tests/fuzz/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_opt.h"

/* The checker runs 8 shapes x 5 value regimes per rule: keep it to small
 * texts with few rules so each input stays in the milliseconds. */
#define CHECK_MAX_BYTES 2048
#define CHECK_MAX_RULES 4

static void finding(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_patterns: %s: %s\n", what, detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kf_ruleset rs = {0};
    kf_clear_error();
    kf_status st = kf_rules_parse(&rs, (const char *)data, size, "fuzz.kfp");
    if (st) {
        if (!kf_last_error()[0]) finding("a failed parse without a message", kf_status_name(st));
        if (st != KF_ERR_NOMEM && !strstr(kf_last_error(), "fuzz.kfp"))
            finding("a parse error does not name the file", kf_last_error());
    } else if (size <= CHECK_MAX_BYTES && rs.n <= CHECK_MAX_RULES) {
        FILE *out = fopen("/dev/null", "w");
        if (!out) finding("cannot open /dev/null", "");
        kf_check_result res;
        /* a fixed seed: the same input must behave the same on replay */
        st = kf_rules_check(&rs, 1, out, &res);
        fclose(out);
        if (st && !kf_last_error()[0]) finding("a failed check without a message", kf_status_name(st));
    }
    kf_rules_free(&rs);
    return 0;
}
