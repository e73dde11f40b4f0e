/*
 * rules_emit.c: parsed rewrite rules written out as C tables. Each rule's
 * lists become static const arrays and the rule itself one entry of
 * kf_builtin_rules[], so the library adds its built-in rules without parsing
 * text (kf_rules_add_builtin_compiled). Numbers are written exactly (hex
 * floats), enums as their values: the file is built with the library whose
 * headers define them.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "rules_emit.h"

static void put_str(FILE *f, const char *s) {
    if (!s) {
        fputs("NULL", f);
        return;
    }
    fputs("(char *)\"", f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f) fprintf(f, "\\%03o", *p); /* three digits: never runs into the next */
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void put_double(FILE *f, double x) {
    if (isnan(x)) fputs("NAN", f);
    else if (isinf(x)) fputs(x < 0 ? "-INFINITY" : "INFINITY", f);
    else fprintf(f, "%a", x);
}

static void put_i64(FILE *f, int64_t v) {
    if (v == INT64_MIN) fputs("INT64_MIN", f); /* its digits alone do not fit a literal */
    else fprintf(f, "INT64_C(%" PRId64 ")", v);
}

/* The arrays an attribute points at, named after prefix. */
static kf_status attr_leaves(FILE *f, const char *prefix, const kf_attr *a, const char *rule) {
    if (a->strings || a->t || a->ref_attr_name || a->doc || a->packed)
        return kf_fail(KF_ERR_UNSUPPORTED, "rule '%s': attribute '%s' has a kind the rule tables cannot hold", rule,
                       a->name ? a->name : "?");
    if (a->ints) {
        fprintf(f, "static const int64_t %s_ints[] = {", prefix);
        for (int i = 0; i < a->n; i++) put_i64(f, a->ints[i]), fputs(i + 1 < a->n ? ", " : "", f);
        fputs(a->n ? "};\n" : "0};\n", f);
    }
    if (a->floats) {
        fprintf(f, "static const float %s_floats[] = {", prefix);
        for (int i = 0; i < a->n; i++) put_double(f, a->floats[i]), fputs(i + 1 < a->n ? ", " : "", f);
        fputs(a->n ? "};\n" : "0};\n", f);
    }
    return KF_OK;
}

/* An attribute with nothing set (a guard's unused ones): left out. */
static bool attr_empty(const kf_attr *a) {
    return !a->name && !a->type && !a->i && !a->f && !signbit(a->f) && !a->s.ptr && !a->ints && !a->floats && !a->n;
}

static void attr_init(FILE *f, const char *prefix, const kf_attr *a) {
    fputs("{.name = ", f);
    put_str(f, a->name);
    fprintf(f, ", .type = (kf_attr_type)%d, .i = ", (int)a->type);
    put_i64(f, a->i);
    fputs(", .f = ", f);
    put_double(f, a->f);
    if (a->s.ptr) {
        fputs(", .s = {", f);
        put_str(f, a->s.ptr);
        fprintf(f, ", %zu}", a->s.len);
    }
    if (a->ints) fprintf(f, ", .ints = (int64_t *)%s_ints", prefix);
    if (a->floats) fprintf(f, ", .floats = (float *)%s_floats", prefix);
    fprintf(f, ", .n = %d}", a->n);
}

static kf_status node_leaves(FILE *f, const char *prefix, const kf_pat_node *pn, const char *rule) {
    char name[96];
    for (int k = 0; k < pn->nattrs; k++) {
        snprintf(name, sizeof name, "%s_a%d", prefix, k);
        KF_TRY(attr_leaves(f, name, &pn->attrs[k].value, rule));
    }
    fprintf(f, "static const kf_pat_attr %s_attrs[] = {", prefix);
    for (int k = 0; k < pn->nattrs; k++) {
        const kf_pat_attr *pa = &pn->attrs[k];
        snprintf(name, sizeof name, "%s_a%d", prefix, k);
        fputs("\n    {.value = ", f);
        attr_init(f, name, &pa->value);
        fprintf(f, ", .ref_var = %d, .ref_attr = ", pa->ref_var);
        put_str(f, pa->ref_attr);
        fprintf(f, ", .has_default = %d, .ref_value = %d, .ref_var2 = %d, .ref_recip = %d},", pa->has_default,
                pa->ref_value, pa->ref_var2, pa->ref_recip);
    }
    fputs(pn->nattrs ? "};\n" : "{.ref_var = -1}};\n", f);
    return KF_OK;
}

static void node_init(FILE *f, const char *prefix, const kf_pat_node *pn) {
    fputs("\n    {.op = ", f);
    put_str(f, pn->op);
    fputs(", .domain = ", f);
    put_str(f, pn->domain);
    fprintf(f, ", .opid = %d, .nargs = %d", (int)pn->opid, pn->nargs);
    for (int a = 0; a < pn->nargs; a++) {
        fprintf(f, "%s{(kf_pat_arg_kind)%d, %d, ", a ? ", " : ", .args = {", (int)pn->args[a].kind, pn->args[a].var);
        put_double(f, pn->args[a].lit);
        fputs(a + 1 < pn->nargs ? "}" : "}}", f);
    }
    fprintf(f, ", .nouts = %d", pn->nouts);
    for (int o = 0; o < pn->nouts; o++) fprintf(f, "%s%d%s", o ? ", " : ", .outs = {", pn->outs[o], o + 1 < pn->nouts ? "" : "}");
    fprintf(f, ", .nattrs = %d, .attrs = (kf_pat_attr *)%s_attrs, .copy_from = %d, .line = %d},", pn->nattrs, prefix,
            pn->copy_from, pn->line);
}

static kf_status node_list(FILE *f, int ri, const char *list, const kf_pat_node *nodes, int n, const char *rule) {
    char name[96];
    for (int k = 0; k < n; k++) {
        snprintf(name, sizeof name, "r%d_%s%d", ri, list, k);
        KF_TRY(node_leaves(f, name, &nodes[k], rule));
    }
    fprintf(f, "static const kf_pat_node r%d_%s[] = {", ri, list);
    for (int k = 0; k < n; k++) {
        snprintf(name, sizeof name, "r%d_%s%d", ri, list, k);
        node_init(f, name, &nodes[k]);
    }
    fputs(n ? "};\n" : "{.line = 0}};\n", f);
    return KF_OK;
}

static kf_status guard_list(FILE *f, int ri, const kf_rule *r) {
    char name[96];
    for (int k = 0; k < r->nguards; k++) {
        const kf_pat_guard *g = &r->guards[k];
        const kf_attr *as[3] = {&g->attr_value, &g->attr_default, &g->attr_default2};
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "r%d_g%d_%d", ri, k, j);
            KF_TRY(attr_leaves(f, name, as[j], r->name));
        }
    }
    fprintf(f, "static const kf_pat_guard r%d_guards[] = {", ri);
    for (int k = 0; k < r->nguards; k++) {
        const kf_pat_guard *g = &r->guards[k];
        fprintf(f, "\n    {.kind = (kf_guard_kind)%d, .var = %d, .var2 = %d, .cmp = (kf_cmp)%d, .value = ", (int)g->kind,
                g->var, g->var2, (int)g->cmp);
        put_double(f, g->value);
        fputs(", .tol = ", f);
        put_double(f, g->tol);
        if (g->ndtypes) {
            fputs(", .dtypes = {", f);
            for (int d = 0; d < g->ndtypes; d++) fprintf(f, d + 1 < g->ndtypes ? "(kf_dtype)%d, " : "(kf_dtype)%d}", (int)g->dtypes[d]);
        }
        fprintf(f, ", .ndtypes = %d, .attr = ", g->ndtypes);
        put_str(f, g->attr);
        const kf_attr *as[3] = {&g->attr_value, &g->attr_default, &g->attr_default2};
        const char *fields[3] = {"attr_value", "attr_default", "attr_default2"};
        for (int j = 0; j < 3; j++) {
            if (attr_empty(as[j])) continue;
            snprintf(name, sizeof name, "r%d_g%d_%d", ri, k, j);
            fprintf(f, ",\n     .%s = ", fields[j]);
            attr_init(f, name, as[j]);
        }
        fprintf(f, ",\n     .has_default = %d, .axis = %d, .axis2 = %d, .attr2 = ", g->has_default, g->axis, g->axis2);
        put_str(f, g->attr2);
        fprintf(f, ", .has_default2 = %d, .line = %d},", g->has_default2, g->line);
    }
    fputs(r->nguards ? "};\n" : "{.line = 0}};\n", f);
    return KF_OK;
}

static kf_status example_list(FILE *f, int ri, const kf_rule *r) {
    char name[96];
    for (int k = 0; k < r->nexamples; k++) {
        const kf_pat_example *e = &r->examples[k];
        if (e->values) {
            fprintf(f, "static const double r%d_e%d_values[] = {", ri, k);
            for (int i = 0; i < e->nvalues; i++) put_double(f, e->values[i]), fputs(i + 1 < e->nvalues ? ", " : "", f);
            fputs(e->nvalues ? "};\n" : "0};\n", f);
        }
        if (e->attrs) {
            for (int j = 0; j < e->nattrs; j++) {
                snprintf(name, sizeof name, "r%d_e%d_a%d", ri, k, j);
                KF_TRY(attr_leaves(f, name, &e->attrs[j], r->name));
            }
            fprintf(f, "static const kf_attr r%d_e%d_attrs[] = {", ri, k);
            for (int j = 0; j < e->nattrs; j++) {
                snprintf(name, sizeof name, "r%d_e%d_a%d", ri, k, j);
                fputs("\n    ", f);
                attr_init(f, name, &e->attrs[j]);
                fputc(',', f);
            }
            fputs(e->nattrs ? "};\n" : "{.n = 0}};\n", f);
        }
    }
    fprintf(f, "static const kf_pat_example r%d_examples[] = {", ri);
    for (int k = 0; k < r->nexamples; k++) {
        const kf_pat_example *e = &r->examples[k];
        fprintf(f, "\n    {.var = %d, .dtype = (kf_dtype)%d, .rank = %d, .dims = {", e->var, (int)e->dtype, e->rank);
        for (int d = 0; d < e->rank; d++) put_i64(f, e->dims[d]), fputs(d + 1 < e->rank ? ", " : "", f);
        fputs(e->rank ? "}, .values = " : "0}, .values = ", f);
        if (e->values) fprintf(f, "(double *)r%d_e%d_values", ri, k);
        else fputs("NULL", f);
        fprintf(f, ", .nvalues = %d, .attrs = ", e->nvalues);
        if (e->attrs) fprintf(f, "(kf_attr *)r%d_e%d_attrs", ri, k);
        else fputs("NULL", f);
        fprintf(f, ", .nattrs = %d},", e->nattrs);
    }
    fputs(r->nexamples ? "};\n" : "{.var = 0}};\n", f);
    return KF_OK;
}

kf_status kf_rules_emit_c(FILE *f, const kf_ruleset *rs) {
    fputs("/* generated by kfuse_rules_compile from the .kfp files of fusion/patterns; do not edit */\n"
          "#include <math.h>\n#include <stdint.h>\n#include \"kf_pattern.h\"\n",
          f);
    for (uint32_t i = 0; i < rs->n; i++) {
        const kf_rule *r = rs->rules[i];
        int ri = (int)i;
        if (r->fn) return kf_fail(KF_ERR_UNSUPPORTED, "rule '%s' is a C callback, not a table", r->name);
        fprintf(f, "\n/* rule %s (%s:%d) */\n", r->name, r->file, r->line);
        fprintf(f, "static const kf_pat_var r%d_vars[] = {", ri);
        for (int k = 0; k < r->nvars; k++) {
            fputs("\n    {", f);
            put_str(f, r->vars[k].name);
            fprintf(f, ", %d, %d},", r->vars[k].src_node, r->vars[k].dst_node);
        }
        fputs(r->nvars ? "};\n" : "{.name = NULL}};\n", f);
        KF_TRY(node_list(f, ri, "src", r->src, r->nsrc, r->name));
        KF_TRY(node_list(f, ri, "dst", r->dst, r->ndst, r->name));
        KF_TRY(guard_list(f, ri, r));
        KF_TRY(example_list(f, ri, r));
    }
    fputs("\nconst kf_rule kf_builtin_rules[] = {", f);
    for (uint32_t i = 0; i < rs->n; i++) {
        const kf_rule *r = rs->rules[i];
        int ri = (int)i;
        fputs("\n    {.name = ", f);
        put_str(f, r->name);
        fputs(", .file = ", f);
        put_str(f, r->file);
        fprintf(f, ", .line = %d,\n     .vars = (kf_pat_var *)r%d_vars, .nvars = %d, .src = (kf_pat_node *)r%d_src, "
                   ".nsrc = %d,\n     .guards = (kf_pat_guard *)r%d_guards, .nguards = %d, .dst = (kf_pat_node *)r%d_dst, "
                   ".ndst = %d,\n     .result_var = %d, .min_opset = ",
                r->line, ri, r->nvars, ri, r->nsrc, ri, r->nguards, ri, r->ndst, r->result_var);
        put_i64(f, r->min_opset);
        fprintf(f, ", .opt_in = %d, .nan_refined = %d,\n     .examples = (kf_pat_example *)r%d_examples, "
                   ".nexamples = %d, .root_op = ",
                r->opt_in, r->nan_refined, ri, r->nexamples);
        put_str(f, r->root_op);
        fprintf(f, ", .reach = %d, .root_opid = %d, .compiled = true},", r->reach, (int)r->root_opid);
    }
    fprintf(f, "\n    {0}};\nconst uint32_t kf_builtin_rules_n = %u;\n", rs->n);
    return ferror(f) ? kf_fail(KF_ERR_IO, "could not write the rule tables") : KF_OK;
}
