/*
 * ops.c: the op table built from the ops_*.def rows, and lookup by
 * (domain, op_type). Passes, the evaluator and codegen ask this table for
 * everything they need to know about an op.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kf_ops.h"

static const kf_op_info op_table[KF_OP_MAX_] = {
#define KF_OP(sym, id, nm, dom, imin, imax, omin, omax, vlo, vhi, fc, fl, shp, ev, cg)         \
    [id] = {nm, dom, imin, imax, omin, omax, vlo, vhi, fc, fl, shp, ev, cg},
#include "kf_ops_all.def"
#undef KF_OP
};

const kf_op_info *kf_op_get(kf_op op) {
    if (op <= 0 || op >= KF_OP_MAX_ || !op_table[op].name) return NULL;
    return &op_table[op];
}

static int same_domain(const char *a, const char *b) {
    if (!a || !a[0] || strcmp(a, "ai.onnx") == 0) a = "";
    if (!b || !b[0] || strcmp(b, "ai.onnx") == 0) b = "";
    return strcmp(a, b) == 0;
}

/* Lookup by name is a hash table over the names (open addressing, linear
 * probing, filled once in id order so that a probe meets the lowest id of
 * a name first, as a scan of the table would): a scan of the 1024 ids was
 * a tenth of `kfuse opt` on a small model. */
#define OP_SLOTS 2048 /* a power of two, over twice the table's rows */
_Static_assert(OP_SLOTS >= 2 * KF_OP_MAX_ && KF_OP_MAX_ <= UINT16_MAX, "op hash slots");
static uint16_t op_slots[OP_SLOTS];
static pthread_once_t op_slots_once = PTHREAD_ONCE_INIT;

static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void fill_slots(void) {
    for (int i = 1; i < KF_OP_MAX_; i++) {
        if (!op_table[i].name) continue;
        uint32_t k = name_hash(op_table[i].name) & (OP_SLOTS - 1);
        while (op_slots[k]) k = (k + 1) & (OP_SLOTS - 1);
        op_slots[k] = (uint16_t)i;
    }
}

kf_op kf_op_lookup(const char *domain, const char *op_type) {
    if (!op_type) return KF_OP_UNKNOWN;
    pthread_once(&op_slots_once, fill_slots);
    for (uint32_t k = name_hash(op_type) & (OP_SLOTS - 1); op_slots[k]; k = (k + 1) & (OP_SLOTS - 1)) {
        int i = op_slots[k];
        if (strcmp(op_table[i].name, op_type) == 0 && same_domain(op_table[i].domain, domain)) return i;
    }
    return KF_OP_UNKNOWN;
}

const kf_op_info *kf_node_op(const kf_node *n) {
    const kf_op_info *info = kf_op_get(n->op);
    if (!info || (n->opset && (n->opset < info->ver_lo || n->opset > info->ver_hi))) return NULL;
    if (n->nin < info->in_min || (info->in_max >= 0 && n->nin > info->in_max)) return NULL;
    if (n->nout < info->out_min || (info->out_max >= 0 && n->nout > info->out_max)) return NULL;
    for (int i = 0; i < info->in_min; i++)
        if (!n->in[i]) return NULL;
    return info;
}
