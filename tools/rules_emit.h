/*
 * rules_emit.h: writes parsed rewrite rules as C tables, so the built-in
 * rules reach the library already parsed (the build's kfuse_rules_compile
 * writes fusion's builtin_rules.c with it). The tests emit both the parse
 * and the compiled tables and compare the texts.
 */
#ifndef KF_RULES_EMIT_H
#define KF_RULES_EMIT_H

#include <stdio.h>

#include "kf_pattern.h"

/* Writes rs as a C file defining kf_builtin_rules[] and kf_builtin_rules_n
 * (kf_rules_add_builtin_compiled reads them). Everything a rule holds is
 * written, in one canonical form, so two rule sets that emit the same text
 * are the same rules. Fails (KF_ERR_UNSUPPORTED, naming the rule) on a
 * field the tables cannot hold (callbacks, tensor or string-list
 * attributes), and with KF_ERR_IO when writing fails. */
kf_status kf_rules_emit_c(FILE *f, const kf_ruleset *rs);

#endif
