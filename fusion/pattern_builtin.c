/*
 * pattern_builtin.c: the built-in rewrite rules as the optimizer takes them:
 * already parsed, from the C tables the build writes (builtin_rules.c, by
 * tools/rules_compile.c from the .kfp files of fusion/patterns). Adding them copies one
 * small record per rule; the lists stay in the tables.
 */
#include <string.h>

#include "kf_pattern.h"

extern const kf_rule kf_builtin_rules[];
extern const uint32_t kf_builtin_rules_n;

kf_status kf_rules_add_builtin(kf_ruleset *rs) {
    KF_TRY(kf_grow((void **)&rs->rules, &rs->cap, rs->n + kf_builtin_rules_n, sizeof(kf_rule *)));
    for (uint32_t i = 0; i < kf_builtin_rules_n; i++) {
        kf_rule *r = kf_malloc(sizeof *r);
        if (!r) return kf_fail(KF_ERR_NOMEM, "out of memory");
        memcpy(r, &kf_builtin_rules[i], sizeof *r);
        rs->rules[rs->n++] = r;
    }
    return KF_OK;
}
