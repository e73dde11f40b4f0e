/*
 * cg_batch.c: horizontal launches (DESIGN.md "codegen/"). Independent small
 * groups that the planner gave one launch index run as ONE kernel whose
 * work-groups are split by range, one range per member. Built from the
 * members' own generated bodies (codegen.c), so a batch computes exactly
 * what its members compute alone; kernels/exec.c asks for it per launch.
 * The picture and the block-count rule are in kf_codegen.h.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "kf_codegen.h"

/* One member's text cut at its seams:
 *   comment   KF_KERNEL name(params)\n{\n   body   }\n   */
typedef struct part {
    const char *comment, *params, *body;
    size_t comment_len, params_len, body_len;
} part;

/* Member templates whose body is correct for any work-group size up to
 * KF_MAX_BLOCK (kf_cg_kernel.block), so they may share one launch's. */
static bool shareable(const kf_cg_kernel *k) {
    return k->name && (!strcmp(k->name, "kf_ew") || !strcmp(k->name, "kf_reduce"));
}

static bool cut(const char *text, part *pt) {
    const char *kw = strstr(text, "KF_KERNEL ");
    if (!kw || strstr(kw + 1, "KF_KERNEL")) return false; /* exactly one kernel, no helpers */
    const char *open = strchr(kw, '(');
    const char *close = open ? strstr(open, ")\n{\n") : NULL;
    const char *end = strrchr(text, '}');
    if (!close || !end || end < close + 4) return false;
    for (const char *c = end + 1; *c; c++)
        if (!isspace((unsigned char)*c)) return false;
    pt->comment = text, pt->comment_len = (size_t)(kw - text);
    pt->params = open + 1, pt->params_len = (size_t)(close - open - 1);
    pt->body = close + 4, pt->body_len = (size_t)(end - close - 4);
    return true;
}

/* "in12" -> 12 for prefix "in"; -1 when ident is not prefix + digits. */
static long param_index(const char *id, size_t len, const char *prefix) {
    size_t pl = strlen(prefix);
    if (len <= pl || len > pl + 6 || memcmp(id, prefix, pl)) return -1; /* 6 digits: far past any parameter count */
    long v = 0;
    for (size_t i = pl; i < len; i++) {
        if (!isdigit((unsigned char)id[i])) return -1;
        v = v * 10 + (id[i] - '0');
    }
    return v;
}

/* How one member's names become the batch's. */
typedef struct renamer {
    const uint32_t *in_map; /* member input i -> batch input in_map[i] */
    uint32_t nin, out_base, nout;
    bool used[4];           /* kf_gid, kf_gsz, kf_grp, kf_ngrp were written */
    bool bad;               /* the text names a parameter the member does not have */
} renamer;

/* The id macros a member reads, and the branch-local names that replace them. */
static const char *const k_ids[4][2] = {
    {"KF_GLOBAL_ID", "kf_gid"}, {"KF_GLOBAL_SIZE", "kf_gsz"}, {"KF_GROUP_ID", "kf_grp"}, {"KF_NUM_GROUPS", "kf_ngrp"}};

/* Appends text[0..len) to s with identifiers renamed and every non-empty
 * line indented by ind. Numbers (1.5e3f) are copied whole, so their
 * letters are never read as identifiers. */
static void put_renamed(kf_cg_str *s, const char *text, size_t len, const char *ind, renamer *r) {
    bool bol = true;
    for (size_t i = 0; i < len;) {
        char c = text[i];
        if (bol && c != '\n') kf_cg_puts(s, ind);
        bol = false;
        if (isalpha((unsigned char)c) || c == '_' || isdigit((unsigned char)c)) {
            size_t b = i;
            while (i < len && (isalnum((unsigned char)text[i]) || text[i] == '_' || (isdigit((unsigned char)c) && text[i] == '.')))
                i++;
            const char *id = text + b;
            size_t n = i - b;
            long k;
            bool done = false;
            if (!isdigit((unsigned char)c)) {
                if ((k = param_index(id, n, "in")) >= 0) {
                    if ((uint32_t)k < r->nin) kf_cg_printf(s, "in%u", r->in_map[k]);
                    else r->bad = true;
                    done = true;
                } else if ((k = param_index(id, n, "out")) >= 0) {
                    if ((uint32_t)k < r->nout) kf_cg_printf(s, "out%u", r->out_base + (uint32_t)k);
                    else r->bad = true;
                    done = true;
                }
                for (int m = 0; !done && m < 4; m++)
                    if (strlen(k_ids[m][0]) == n && !memcmp(id, k_ids[m][0], n)) {
                        kf_cg_puts(s, k_ids[m][1]);
                        r->used[m] = done = true;
                    }
            }
            if (!done) kf_cg_printf(s, "%.*s", (int)n, id);
            continue;
        }
        char one[2] = {c, 0};
        kf_cg_puts(s, one);
        bol = c == '\n';
        i++;
    }
}

/* The name a shared-memory declaration declares: the last identifier
 * before its first '[', '=' or ';'. */
static void declared_name(const char *line, char *name, size_t cap) {
    name[0] = 0;
    for (const char *c = line; *c && *c != '[' && *c != '=' && *c != ';';) {
        if (isalpha((unsigned char)*c) || *c == '_') {
            const char *b = c;
            while (isalnum((unsigned char)*c) || *c == '_') c++;
            snprintf(name, cap, "%.*s", (int)(c - b), b);
        } else
            c++;
    }
}

/* Shared-memory declarations (KF_SHARED lines) of all members, hoisted to
 * kernel scope: OpenCL C allows __local variables only there, and on CUDA
 * one array serves every member instead of one each. */
#define MAX_SHARED 16 /* distinct declarations; templates declare one (kf_red) */
typedef struct hoist {
    char *lines[MAX_SHARED];
    uint32_t n;
} hoist;

static void hoist_release(hoist *h) {
    for (uint32_t i = 0; i < h->n; i++) kf_free(h->lines[i]);
    h->n = 0;
}

/* Adds one trimmed declaration; false with a reason when it conflicts. */
static kf_status hoist_add(hoist *h, const char *line, size_t len, uint32_t member) {
    char *t = kf_malloc(len + 1);
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory batching kernels");
    memcpy(t, line, len);
    t[len] = 0;
    char name[64], other[64]; /* an identifier of the generator's */
    declared_name(t, name, sizeof name);
    for (uint32_t i = 0; i < h->n; i++) {
        if (!strcmp(h->lines[i], t)) {
            kf_free(t);
            return KF_OK;
        }
        declared_name(h->lines[i], other, sizeof other);
        if (!strcmp(name, other)) {
            kf_free(t);
            return kf_fail(KF_ERR_UNSUPPORTED, "batch member %u declares shared '%s' differently from an earlier member",
                           member, name);
        }
    }
    if (h->n == MAX_SHARED) {
        kf_free(t);
        return kf_fail(KF_ERR_UNSUPPORTED, "batch members declare more than %d shared arrays", MAX_SHARED);
    }
    h->lines[h->n++] = t;
    return KF_OK;
}

/* The parameter declaration of `name` in a member's list, without the
 * name ("const KF_GLOBAL float *KF_RESTRICT "): *len 0 when absent. */
static const char *param_decl(const part *pt, const char *name, size_t *len) {
    size_t nl = strlen(name);
    const char *p = pt->params, *end = pt->params + pt->params_len;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *q = comma ? comma : end;
        while (p < q && *p == ' ') p++;
        const char *at = q - nl; /* where the name would start; the character before must end the type */
        if ((size_t)(q - p) > nl && !memcmp(at, name, nl) && !(isalnum((unsigned char)at[-1]) || at[-1] == '_')) {
            *len = (size_t)(at - p);
            return p;
        }
        p = comma ? comma + 1 : end;
    }
    *len = 0;
    return NULL;
}

uint32_t kf_cg_batch_params(const kf_cg_kernel *members, uint32_t n) {
    uint32_t count = 0;
    for (uint32_t m = 0; m < n; m++) {
        count += members[m].nouts;
        for (uint32_t i = 0; i < members[m].nins; i++) {
            bool seen = false;
            for (uint32_t a = 0; a <= m && !seen; a++)
                for (uint32_t j = 0; j < (a < m ? members[a].nins : i) && !seen; j++)
                    seen = members[a].ins[j].value == members[m].ins[i].value;
            count += !seen;
        }
    }
    return count;
}

/* Work-groups per member (kf_codegen.h states the rule); *total their sum. */
static void split_blocks(const kf_cg_kernel *members, uint32_t n, uint32_t block, int64_t *blocks, int64_t *total) {
    int64_t cap = KF_CG_BATCH_MAX_ITEMS / block, want = 0;
    for (uint32_t m = 0; m < n; m++) {
        const kf_cg_kernel *k = &members[m];
        int64_t b = k->block ? k->numel / k->block : (k->numel + block - 1) / block;
        blocks[m] = b < 1 ? 1 : b;
        want += blocks[m];
    }
    if (want > cap) {
        /* everyone keeps 1; the rest of the cap goes by the excess over 1,
         * rounded down, and what the floors leave to the member that
         * wanted most (the first such) */
        double share = (double)(cap - n) / (double)(want - n);
        uint32_t most = 0;
        for (uint32_t m = 1; m < n; m++)
            if (blocks[m] > blocks[most]) most = m;
        want = 0;
        for (uint32_t m = 0; m < n; m++) {
            blocks[m] = 1 + (int64_t)((double)(blocks[m] - 1) * share);
            want += blocks[m];
        }
        for (uint32_t m = 0; want > cap; m = (m + 1) % n) /* a double rounded up: take back */
            if (blocks[m] > 1) blocks[m]--, want--;
        blocks[most] += cap - want;
        want = cap;
    }
    *total = want;
}

kf_status kf_cg_batch_kernels(const kf_cg_kernel *members, uint32_t n, kf_cg_kernel *k) {
    *k = (kf_cg_kernel){0};
    if (n < 2 || n > KF_PLAN_MAX_BATCH)
        return kf_fail(KF_ERR_UNSUPPORTED, "a batch has 2 to %d members, not %u", KF_PLAN_MAX_BATCH, n);
    part parts[KF_PLAN_MAX_BATCH];
    uint32_t block = 0;
    for (uint32_t m = 0; m < n; m++) {
        const kf_cg_kernel *mk = &members[m];
        if (!shareable(mk))
            return kf_fail(KF_ERR_UNSUPPORTED, "batch member %u (%s) needs a launch of its own work-group size", m,
                           mk->name ? mk->name : "?");
        if (mk->nchecks) /* its kf_err codes are its own (kf_cg_check) */
            return kf_fail(KF_ERR_UNSUPPORTED, "batch member %u (%s) checks indices read from data: launched alone", m,
                           mk->name ? mk->name : "?");
        if (!mk->body || !cut(mk->body, &parts[m]))
            return kf_fail(KF_ERR_UNSUPPORTED, "batch member %u: kernel text is not one kernel function", m);
        if (mk->block > block) block = mk->block;
        if (mk->min_block > k->min_block) k->min_block = mk->min_block; /* <= its block <= the launch's */
        k->parts |= mk->parts; /* the prelude parts any member uses */
    }
    if (!block) block = KF_CG_BATCH_BLOCK;
    uint32_t nparams = kf_cg_batch_params(members, n);
    if (nparams > KF_CG_BATCH_MAX_PARAMS)
        return kf_fail(KF_ERR_UNSUPPORTED, "a batch of these %u kernels needs %u parameters, launchers take %d", n, nparams,
                       KF_CG_BATCH_MAX_PARAMS);

    uint32_t nouts = 0;
    for (uint32_t m = 0; m < n; m++) nouts += members[m].nouts;
    uint32_t nins = nparams - nouts;
    k->name = kf_strdup("kf_batch");
    k->ins = kf_calloc((size_t)nins + 1, sizeof *k->ins);
    k->outs = kf_calloc((size_t)nouts + 1, sizeof *k->outs);
    uint32_t *maps = kf_calloc((size_t)KF_PLAN_MAX_BATCH * KF_CG_BATCH_MAX_PARAMS, sizeof *maps);
    if (!k->name || !k->ins || !k->outs || !maps) {
        kf_free(maps);
        kf_cg_kernel_release(k);
        return kf_fail(KF_ERR_NOMEM, "out of memory batching kernels");
    }
    /* the union: inputs in first-use order, then every member's outputs */
    kf_status st = KF_OK;
    for (uint32_t m = 0; m < n; m++) {
        for (uint32_t i = 0; i < members[m].nins; i++) {
            uint32_t u = 0;
            while (u < k->nins && k->ins[u].value != members[m].ins[i].value) u++;
            if (u == k->nins) k->ins[k->nins++] = members[m].ins[i];
            maps[m * KF_CG_BATCH_MAX_PARAMS + i] = u;
        }
        for (uint32_t o = 0; o < members[m].nouts; o++) k->outs[k->nouts++] = members[m].outs[o];
    }
    for (uint32_t i = 0; !st && i < k->nins; i++)
        for (uint32_t o = 0; !st && o < k->nouts; o++)
            if (k->ins[i].value == k->outs[o].value)
                st = kf_fail(KF_ERR_UNSUPPORTED, "batch members are not independent: value %u is written by one and read by another",
                             k->ins[i].value);

    int64_t blocks[KF_PLAN_MAX_BATCH], total = 0;
    split_blocks(members, n, block, blocks, &total);
    k->block = block;
    k->numel = total * block;

    kf_cg_str s = {0}, branches = {0}, one = {0};
    hoist h = {0};
    kf_cg_printf(&s, "/* kfuse batched kernel: %u sub-kernels, %lld work-groups of %u (a horizontal launch)\n", n,
                 (long long)total, block);
    int64_t start = 0;
    for (uint32_t m = 0; m < n; m++) {
        kf_cg_printf(&s, " *   sub-kernel %u: work-groups [%lld, %lld), %s\n", m, (long long)start,
                     (long long)(start + blocks[m]), members[m].name);
        start += blocks[m];
    }
    kf_cg_puts(&s, " */\nKF_KERNEL kf_batch(");
    /* declarations as the members wrote them (their storage types), renamed */
    for (uint32_t u = 0; !st && u < k->nins + k->nouts; u++) {
        bool in = u < k->nins;
        kf_id v = in ? k->ins[u].value : k->outs[u - k->nins].value;
        const char *decl = NULL;
        size_t len = 0;
        char name[16]; /* "out" + a parameter number */
        for (uint32_t m = 0; m < n && !decl; m++) {
            const kf_cg_param *ps = in ? members[m].ins : members[m].outs;
            for (uint32_t i = 0; i < (in ? members[m].nins : members[m].nouts) && !decl; i++)
                if (ps[i].value == v) {
                    snprintf(name, sizeof name, "%s%u", in ? "in" : "out", i);
                    decl = param_decl(&parts[m], name, &len);
                }
        }
        if (!decl) st = kf_fail(KF_ERR_UNSUPPORTED, "batch: parameter of value %u not found in its member's text", v);
        else kf_cg_printf(&s, "%s%.*s%s%u", u ? ", " : "", (int)len, decl, in ? "in" : "out", in ? u : u - k->nins);
    }
    kf_cg_puts(&s, ")\n{\n");

    start = 0;
    uint32_t out_base = 0;
    for (uint32_t m = 0; !st && m < n; m++) {
        const part *pt = &parts[m];
        renamer r = {.in_map = &maps[m * KF_CG_BATCH_MAX_PARAMS], .nin = members[m].nins, .out_base = out_base,
                    .nout = members[m].nouts};
        put_renamed(&one, pt->comment, pt->comment_len, "        ", &r);
        /* the body line by line: shared declarations go to kernel scope */
        for (const char *l = pt->body, *end = pt->body + pt->body_len; !st && l < end;) {
            const char *nl = memchr(l, '\n', (size_t)(end - l));
            const char *le = nl ? nl + 1 : end, *t = l;
            while (t < le && *t == ' ') t++;
            if (!strncmp(t, "KF_SHARED ", 10) && (size_t)(le - t) > 10) {
                size_t tl = (size_t)(le - t);
                while (tl && isspace((unsigned char)t[tl - 1])) tl--;
                st = hoist_add(&h, t, tl, m);
            } else
                put_renamed(&one, l, (size_t)(le - l), "    ", &r);
            l = le;
        }
        if (r.bad) st = kf_fail(KF_ERR_UNSUPPORTED, "batch member %u names a parameter it does not have", m);
        if (st) break;
        if (m + 1 < n) kf_cg_printf(&branches, "    %sif (kf_b < %lld) {\n", m ? "} else " : "", (long long)(start + blocks[m]));
        else kf_cg_puts(&branches, "    } else {\n");
        /* the ids this member reads, as if it had been launched alone */
        bool gid = r.used[0], gsz = r.used[1], grp = r.used[2] || gid, ngrp = r.used[3] || gsz;
        if (grp) kf_cg_printf(&branches, "        const int kf_grp = kf_b - %lld;\n", (long long)start);
        if (ngrp) kf_cg_printf(&branches, "        const int kf_ngrp = %lld;\n", (long long)blocks[m]);
        if (gid) kf_cg_puts(&branches, "        const int kf_gid = kf_grp * KF_LOCAL_SIZE + KF_LOCAL_ID;\n");
        if (gsz) kf_cg_puts(&branches, "        const int kf_gsz = kf_ngrp * KF_LOCAL_SIZE;\n");
        kf_cg_puts(&branches, one.p ? one.p : "");
        if (one.oom) branches.oom = true;
        kf_cg_str_release(&one);
        start += blocks[m];
        out_base += members[m].nouts;
    }
    for (uint32_t i = 0; i < h.n; i++) kf_cg_printf(&s, "    %s\n", h.lines[i]);
    kf_cg_puts(&s, "    const int kf_b = (int)KF_GROUP_ID;\n");
    kf_cg_puts(&s, branches.p ? branches.p : "");
    kf_cg_puts(&s, "    }\n}\n");
    if (branches.oom) s.oom = true;
    kf_cg_str_release(&branches);
    kf_cg_str_release(&one);
    hoist_release(&h);
    kf_free(maps);
    if (!st && !(k->body = kf_cg_take(&s))) st = kf_fail(KF_ERR_NOMEM, "out of memory batching kernels");
    kf_cg_str_release(&s);
    if (st) kf_cg_kernel_release(k);
    return st;
}

kf_status kf_cg_batch(const kf_model *m, const kf_plan *p, const uint32_t *groups, uint32_t n, kf_cg_kernel *k) {
    *k = (kf_cg_kernel){0};
    if (n < 2 || n > KF_PLAN_MAX_BATCH)
        return kf_fail(KF_ERR_UNSUPPORTED, "a batch has 2 to %d members, not %u", KF_PLAN_MAX_BATCH, n);
    for (uint32_t i = 0; i < n; i++) {
        if (groups[i] >= p->ngroups) return kf_fail(KF_ERR_INVALID_ARG, "no group %u", groups[i]);
        const kf_group *g = &p->groups[groups[i]];
        if (g->kind != KF_GROUP_ELEMWISE && g->kind != KF_GROUP_REDUCTION)
            return kf_fail(KF_ERR_UNSUPPORTED, "group %u: only elementwise and reduction groups share a launch", groups[i]);
        /* same level of the group DAG: a path between two groups would
         * make the later one's level strictly larger */
        if (g->level != p->groups[groups[0]].level)
            return kf_fail(KF_ERR_UNSUPPORTED, "groups %u and %u are at different levels: one may depend on the other",
                           groups[0], groups[i]);
    }
    kf_cg_kernel ks[KF_PLAN_MAX_BATCH];
    kf_status st = KF_OK;
    uint32_t made = 0;
    for (; made < n && !st; made++)
        if ((st = kf_cg_group(m, p, groups[made], &ks[made]))) break;
    if (!st) st = kf_cg_batch_kernels(ks, n, k);
    for (uint32_t i = 0; i < made; i++) kf_cg_kernel_release(&ks[i]);
    return st;
}
