/*
 * target.c: device profiles for the cost model (kf_cost.h). A profile is
 * a text file of `key = value` lines (fusion/targets/NAME.target, embedded at
 * build time; any other file by path). Every field is required, so a
 * profile cannot silently model a device with a zero bandwidth; unknown
 * keys are errors, so a typo cannot go unnoticed.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kf_cost.h"
#include "kf_onnx.h"

/* A profile file larger than this is not a profile. */
#define TARGET_MAX_BYTES (64 * 1024)

typedef enum { F_INT, F_DOUBLE, F_STRING } field_type;

typedef struct field {
    const char *key;
    field_type type;
    size_t off;
    double lo, hi; /* accepted range (numbers) */
} field;

#define FI(k, lo, hi) {#k, F_INT, offsetof(kf_target, k), lo, hi}
#define FD(k, lo, hi) {#k, F_DOUBLE, offsetof(kf_target, k), lo, hi}

/* Ranges are wide sanity bounds, not a list of real devices: a value
 * outside them is a typo (a bandwidth in TB/s where GB/s is asked). */
static const field fields[] = {
    {"name", F_STRING, offsetof(kf_target, name), 0, 0},
    {"desc", F_STRING, offsetof(kf_target, desc), 0, 0},
    FI(sms, 1, 4096),
    FD(clock_ghz, 0.1, 10),
    FI(max_threads_sm, 32, 65536),
    FI(max_blocks_sm, 1, 1024),
    FI(regs_sm, 1024, 1 << 24),
    FI(smem_sm_kib, 1, 1 << 20),
    FD(dram_gbs, 1, 1e6),
    FD(l2_mib, 0, 1e5),
    FD(l2_gbs, 1, 1e7),
    FD(fma_tflops_fp32, 1e-3, 1e5),
    FD(fma_tflops_fp16, 1e-3, 1e5),
    FD(tc_tflops_tf32, 0, 1e6),
    FD(tc_tflops_fp16, 0, 1e6),
    FD(tc_tops_int8, 0, 1e6),
    FD(tc_tflops_fp8, 0, 1e6),
    FD(launch_us, 0, 1e4),
    FD(kernel_min_us, 0, 1e4),
    FI(vendor_lib, 0, 1),
    FD(ew_frac, 1e-3, 1),
    FD(red_pass_clk, 1e-3, 1e4),
    FD(red_pass_us, 0, 1e4),
    FD(gemm_blk_base, 0, 1),
    FD(gemm_blk_per_out, 0, 1),
    FD(conv_blk_frac, 1e-5, 1),
    FD(gen_blk_cap, 1e-3, 1),
    FD(lib_gemm_frac, 1e-3, 1),
    FD(lib_conv_frac, 1e-3, 1),
    FD(lib_fixed_us, 0, 1e4),
    FD(lib_conv_fixed_us, 0, 1e4),
    FD(attn_tc_frac, 1e-3, 1),
    FD(attn_fma_frac, 1e-3, 1),
    FD(igemm_dp4a_gain, 1e-3, 16),
    FD(imma_blk_frac, 1e-4, 1),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

static kf_status perr(const char *where, int line, const char *msg, const char *arg) {
    return kf_fail(KF_ERR_BAD_MODEL, "%s:%d: %s%s%s%s", where, line, msg, arg ? " '" : "", arg ? arg : "",
                   arg ? "'" : "");
}

static const char *skip_space(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    return p;
}

kf_status kf_target_parse(const char *text, size_t len, const char *where, kf_target **out) {
    *out = NULL;
    if (!where) where = "<target>";
    kf_target *t = kf_calloc(1, sizeof *t);
    if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
    bool seen[NFIELDS] = {false};
    const char *p = text, *end = text + len;
    int line = 0;
    kf_status st = KF_OK;
    while (p < end && !st) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        line++;
        const char *hash = memchr(p, '#', (size_t)(eol - p));
        const char *stop = hash ? hash : eol, *k = skip_space(p, stop);
        p = eol < end ? eol + 1 : end;
        if (k == stop) continue; /* blank or comment */
        const char *eq = memchr(k, '=', (size_t)(stop - k));
        if (!eq) {
            st = perr(where, line, "expected 'key = value'", NULL);
            break;
        }
        const char *ke = eq;
        while (ke > k && (ke[-1] == ' ' || ke[-1] == '\t')) ke--;
        const char *v = skip_space(eq + 1, stop), *ve = stop;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t' || ve[-1] == '\r')) ve--;
        char key[48], val[128];
        if ((size_t)(ke - k) >= sizeof key || (size_t)(ve - v) >= sizeof val) {
            st = perr(where, line, "key or value too long", NULL);
            break;
        }
        memcpy(key, k, (size_t)(ke - k));
        key[ke - k] = 0;
        memcpy(val, v, (size_t)(ve - v));
        val[ve - v] = 0;
        size_t f = 0;
        while (f < NFIELDS && strcmp(fields[f].key, key)) f++;
        if (f == NFIELDS) {
            st = perr(where, line, "unknown key", key);
            break;
        }
        if (seen[f]) {
            st = perr(where, line, "key given twice:", key);
            break;
        }
        seen[f] = true;
        char *dst = (char *)t + fields[f].off;
        if (fields[f].type == F_STRING) {
            size_t cap = fields[f].off == offsetof(kf_target, name) ? sizeof t->name : sizeof t->desc;
            if (!*val || strlen(val) >= cap) {
                st = perr(where, line, "empty or too long value for", key);
                break;
            }
            memcpy(dst, val, strlen(val) + 1);
            continue;
        }
        char *e = NULL;
        errno = 0;
        double d = strtod(val, &e);
        if (!*val || *e || errno || !isfinite(d) || d < fields[f].lo || d > fields[f].hi ||
            (fields[f].type == F_INT && d != floor(d))) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s must be a %s in [%g, %g], got", key,
                     fields[f].type == F_INT ? "whole number" : "number", fields[f].lo, fields[f].hi);
            st = perr(where, line, msg, val);
            break;
        }
        if (fields[f].type == F_INT) *(int *)(void *)dst = (int)d;
        else *(double *)(void *)dst = d;
    }
    for (size_t f = 0; f < NFIELDS && !st; f++)
        if (!seen[f]) st = kf_fail(KF_ERR_BAD_MODEL, "%s: missing key '%s'", where, fields[f].key);
    if (st) {
        kf_free(t);
        return st;
    }
    *out = t;
    return KF_OK;
}

struct kf_builtin_targets_entry {
    const char *name;
    const char *text;
    size_t len;
};
extern const struct kf_builtin_targets_entry kf_builtin_targets[];

const char *kf_target_builtin_name(size_t i) {
    for (size_t k = 0; kf_builtin_targets[k].name; k++)
        if (k == i) return kf_builtin_targets[k].name;
    return NULL;
}

kf_status kf_target_get(const char *name, kf_target **out) {
    *out = NULL;
    if (!name || !*name) return kf_fail(KF_ERR_INVALID_ARG, "no target name");
    size_t nl = strlen(name);
    if (strchr(name, '/') || (nl > 7 && !strcmp(name + nl - 7, ".target"))) {
        uint8_t *data = NULL;
        size_t len = 0;
        KF_TRY(kf_read_file(name, &data, &len));
        kf_status st = len > TARGET_MAX_BYTES
                           ? kf_fail(KF_ERR_BAD_MODEL, "target file '%s' is larger than %d bytes", name, TARGET_MAX_BYTES)
                           : kf_target_parse((const char *)data, len, name, out);
        kf_free(data);
        return st;
    }
    for (const struct kf_builtin_targets_entry *b = kf_builtin_targets; b->name; b++) {
        if (strcmp(b->name, name)) continue;
        char where[64];
        snprintf(where, sizeof where, "builtin:%s.target", b->name);
        return kf_target_parse(b->text, b->len, where, out);
    }
    char list[256] = "";
    for (const struct kf_builtin_targets_entry *b = kf_builtin_targets; b->name; b++) {
        if (*list) strncat(list, ", ", sizeof list - strlen(list) - 1);
        strncat(list, b->name, sizeof list - strlen(list) - 1);
    }
    return kf_fail(KF_ERR_INVALID_ARG, "unknown target '%s' (built in: %s; or a path to a .target file)", name, list);
}

void kf_target_free(kf_target *t) { kf_free(t); }
