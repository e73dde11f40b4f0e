/*
 * ops_nn_einsum.c: Einsum, in full: explicit and implicit output, ellipsis
 * with broadcasting, repeated labels (diagonals) and any number of
 * operands. Operands are contracted left to right, each step summing the
 * labels no later operand or the output needs, so a chain costs the sum of
 * its pairwise products rather than the product of every label size.
 */
#include <string.h>

#include "ops_nn_util.h"

/* Labels: 0-51 letters, 52.. ellipsis dims (right-aligned across operands). */
#define NLETTERS 52
#define MAX_LABELS (NLETTERS + KF_MAX_RANK)
#define MAX_OPERANDS 64 /* more operands than any equation we have seen */

typedef struct ein {
    int nops;
    int ell; /* broadcast rank of the ellipsis */
    int rank[MAX_OPERANDS];
    int8_t lab[MAX_OPERANDS][KF_MAX_RANK]; /* label of each operand dim */
    int nout;
    int8_t out[MAX_LABELS];   /* output labels in order */
    int64_t size[MAX_LABELS]; /* -1 unknown */
    uint32_t sym[MAX_LABELS];
    int count[MAX_LABELS]; /* operands using each label */
} ein;

static int letter_id(char c) {
    if (c >= 'a' && c <= 'z') return c - 'a';
    if (c >= 'A' && c <= 'Z') return 26 + c - 'A';
    return -1;
}

/* ASCII order of labels (upper case first, as numpy's implicit output). */
static int ascii_of(int l) { return l < 26 ? 'a' + l : 'A' + l - 26; }

/* One subscript term [s, e) into labels; ell_at receives the position of
 * "..." among the letters (-1 none). */
static kf_status parse_term(const kf_node *n, const char *s, const char *e, int8_t *labs, int *nl,
                            int *ell_at) {
    *nl = 0;
    *ell_at = -1;
    for (const char *p = s; p < e;) {
        if (*p == ' ') {
            p++;
        } else if (*p == '.') {
            if (e - p < 3 || p[1] != '.' || p[2] != '.' || *ell_at >= 0)
                return kf_nn_fail(n, KF_ERR_BAD_MODEL, "bad ellipsis in equation");
            *ell_at = *nl;
            p += 3;
        } else {
            int l = letter_id(*p);
            if (l < 0) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "bad character '%c' in equation", *p);
            if (*nl >= KF_MAX_RANK)
                return kf_nn_fail(n, KF_ERR_BAD_MODEL, "too many subscripts in a term");
            labs[(*nl)++] = (int8_t)l;
            p++;
        }
    }
    return KF_OK;
}

/* Parses the equation against the operand types (ranks may be unknown:
 * then *known is false and only validation happens). */
static kf_status ein_parse(const kf_node *n, int nin, const kf_type *const *in, ein *q,
                           bool *known) {
    memset(q, 0, sizeof *q);
    *known = true;
    const char *eq = kf_attr_s(n, "equation", NULL);
    if (!eq) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "attribute 'equation' is required");
    if (nin < 1 || nin > MAX_OPERANDS) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "%d operands", nin);
    q->nops = nin;
    const char *arrow = strstr(eq, "->");
    const char *lhs_end = arrow ? arrow : eq + strlen(eq);
    int8_t letters[MAX_OPERANDS][KF_MAX_RANK];
    int nl[MAX_OPERANDS], ellat[MAX_OPERANDS];
    const char *s = eq;
    for (int i = 0; i < nin; i++) {
        const char *e = memchr(s, ',', (size_t)(lhs_end - s));
        if (!e) e = lhs_end;
        if ((i < nin - 1) != (e != lhs_end))
            return kf_nn_fail(n, KF_ERR_BAD_MODEL,
                              "equation has a different number of terms than %d inputs", nin);
        KF_TRY(parse_term(n, s, e, letters[i], &nl[i], &ellat[i]));
        s = e + 1;
    }
    for (int i = 0; i < nin; i++) {
        if (!in[i]) return kf_nn_fail(n, KF_ERR_BAD_MODEL, "input %d is missing", i);
        if (in[i]->rank < 0) {
            *known = false;
            continue;
        }
        int extra = in[i]->rank - nl[i];
        if (extra < 0 || (extra > 0 && ellat[i] < 0))
            return kf_nn_fail(n, KF_ERR_SHAPE,
                              "input %d has rank %d but its term has %d subscripts", i, in[i]->rank,
                              nl[i]);
        if (extra > q->ell) q->ell = extra;
    }
    if (!*known) return KF_OK;
    for (int l = 0; l < MAX_LABELS; l++)
        q->size[l] = l < NLETTERS + q->ell ? -2 : -1; /* -2: unseen */
    for (int i = 0; i < nin; i++) {
        int r = in[i]->rank, extra = r - nl[i], d = 0;
        q->rank[i] = r;
        bool used[MAX_LABELS] = {false};
        for (int j = 0; j <= nl[i]; j++) {
            if (j == ellat[i])
                for (int e = 0; e < extra; e++)
                    q->lab[i][d++] = (int8_t)(NLETTERS + q->ell - extra + e);
            if (j < nl[i]) q->lab[i][d++] = letters[i][j];
        }
        for (d = 0; d < r; d++) {
            int l = q->lab[i][d];
            int64_t x = in[i]->dims[d];
            if (!used[l]) q->count[l]++;
            used[l] = true;
            int64_t *sz = &q->size[l];
            bool ellipsis = l >= NLETTERS;
            if (x < 0) {
                if (*sz == -2) {
                    *sz = -1;
                    q->sym[l] = in[i]->syms[d];
                }
            } else if (*sz < 0 || (ellipsis && *sz == 1)) {
                *sz = x;
            } else if (x != *sz && !(ellipsis && x == 1)) {
                return kf_nn_fail(n, KF_ERR_SHAPE, "label '%c' has sizes %lld and %lld",
                                  ellipsis ? '.' : ascii_of(l), (long long)*sz, (long long)x);
            }
        }
    }
    if (arrow) {
        int8_t ol[KF_MAX_RANK];
        int no, oell;
        KF_TRY(parse_term(n, arrow + 2, arrow + strlen(arrow), ol, &no, &oell));
        bool seen[MAX_LABELS] = {false};
        for (int j = 0; j <= no; j++) {
            if (j == oell)
                for (int e = 0; e < q->ell; e++) q->out[q->nout++] = (int8_t)(NLETTERS + e);
            if (j == no) break;
            int l = ol[j];
            if (seen[l] || q->count[l] == 0)
                return kf_nn_fail(n, KF_ERR_BAD_MODEL, "output label '%c' is repeated or unknown",
                                  ascii_of(l));
            seen[l] = true;
            q->out[q->nout++] = (int8_t)l;
        }
    } else {
        for (int e = 0; e < q->ell; e++) q->out[q->nout++] = (int8_t)(NLETTERS + e);
        for (int c = 'A'; c <= 'z'; c++) {
            int l = letter_id((char)c);
            if (l >= 0 && q->count[l] == 1) {
                /* count is per operand; a label repeated inside one term is a diagonal, not output
                 */
                int uses = 0;
                for (int i = 0; i < nin; i++)
                    for (int d = 0; d < q->rank[i]; d++) uses += q->lab[i][d] == l;
                if (uses == 1) q->out[q->nout++] = (int8_t)l;
            }
        }
    }
    if (q->nout > KF_MAX_RANK) return kf_nn_fail(n, KF_ERR_SHAPE, "output rank too large");
    return KF_OK;
}

static const kf_dtype ein_types[] = {KF_DT_UINT8,    KF_DT_UINT16,   KF_DT_UINT32, KF_DT_UINT64,
                                     KF_DT_INT8,     KF_DT_INT16,    KF_DT_INT32,  KF_DT_INT64,
                                     KF_DT_FLOAT16,  KF_DT_BFLOAT16, KF_DT_FLOAT,  KF_DT_DOUBLE,
                                     KF_DT_UNDEFINED};

kf_status kf_nn_einsum_shape(const kf_node *n, int nin, const kf_type *const *in,
                             const kf_tensor *const *val, int nout, kf_type *out) {
    (void)val;
    (void)nout;
    for (int i = 0; i < nin; i++) {
        if (!in[i]) continue;
        KF_TRY(kf_nn_check_dtype(n, in[i]->dtype, "Inputs", ein_types));
        if (in[i]->dtype && in[0] && in[0]->dtype && in[i]->dtype != in[0]->dtype)
            return kf_nn_fail(n, KF_ERR_SHAPE, "inputs have different dtypes");
    }
    ein *q = kf_malloc(sizeof *q);
    if (!q) return kf_fail(KF_ERR_NOMEM, "out of memory");
    bool known;
    kf_status st = ein_parse(n, nin, in, q, &known);
    out[0].dtype = nin > 0 && in[0] ? in[0]->dtype : KF_DT_UNDEFINED;
    if (!st && known) {
        out[0].rank = q->nout;
        for (int j = 0; j < q->nout; j++) {
            int64_t s = q->size[q->out[j]];
            out[0].dims[j] = s >= 0 ? s : -1;
            out[0].syms[j] = s >= 0 ? 0 : q->sym[q->out[j]];
        }
    }
    kf_free(q);
    return st;
}

/* One operand of a contraction step: data and a stride per label. */
typedef struct ein_arg {
    const void *data;
    int64_t str[MAX_LABELS];
} ein_arg;

/* res[kept...] = sum over the other labels of prod args, over the union
 * of the args' labels (lab/nlab); res is dense over kept (in order). */
static kf_status ein_step(const kf_node *n, const ein *q, bool isf, const ein_arg *args, int nargs,
                          const int8_t *lab, int nlab, const int8_t *kept, int nkept, void **res) {
    int64_t dims[MAX_LABELS], rstr[MAX_LABELS] = {0}, total = 1, rsize = 1;
    for (int k = nkept - 1; k >= 0; k--) {
        for (int j = 0; j < nlab; j++)
            if (lab[j] == kept[k]) rstr[j] = rsize;
        if (!kf_mul_ok(rsize, q->size[kept[k]], &rsize))
            return kf_nn_fail(n, KF_ERR_SHAPE, "intermediate result too large");
    }
    for (int j = 0; j < nlab; j++) {
        dims[j] = q->size[lab[j]];
        if (!kf_mul_ok(total, dims[j], &total))
            return kf_nn_fail(n, KF_ERR_SHAPE, "contraction too large");
    }
    KF_TRY(kf_shape_numel(1, &rsize, 8, &rsize));
    void *r = kf_calloc((size_t)rsize + 1, 8);
    if (!r) return kf_fail(KF_ERR_NOMEM, "out of memory");
    int64_t idx[MAX_LABELS] = {0};
    for (int64_t it = 0; it < total; it++) {
        int64_t ro = 0, off[2] = {0, 0};
        for (int j = 0; j < nlab; j++) {
            ro += idx[j] * rstr[j];
            for (int a = 0; a < nargs; a++) off[a] += idx[j] * args[a].str[lab[j]];
        }
        if (isf) {
            double v = ((const double *)args[0].data)[off[0]];
            if (nargs > 1) v *= ((const double *)args[1].data)[off[1]];
            ((double *)r)[ro] += v;
        } else {
            uint64_t v = ((const uint64_t *)args[0].data)[off[0]];
            if (nargs > 1) v *= ((const uint64_t *)args[1].data)[off[1]];
            ((uint64_t *)r)[ro] += v;
        }
        for (int j = nlab - 1; j >= 0; j--) {
            if (++idx[j] < dims[j]) break;
            idx[j] = 0;
        }
    }
    *res = r;
    return KF_OK;
}

/* Label strides of input i (repeated labels add up: the diagonal). */
static void input_arg(const ein *q, int i, const kf_tensor *t, const void *data, ein_arg *a) {
    memset(a, 0, sizeof *a);
    a->data = data;
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        int l = q->lab[i][d];
        if (!(t->dims[d] == 1 && q->size[l] != 1)) a->str[l] += s; /* size-1 broadcast: stride 0 */
        s *= t->dims[d];
    }
}

kf_status kf_nn_einsum_eval(const kf_node *n, int nin, const kf_tensor *const *in, int nout,
                            kf_tensor *out) {
    (void)nout;
    kf_type types[MAX_OPERANDS];
    const kf_type *tp[MAX_OPERANDS];
    if (nin > MAX_OPERANDS)
        return kf_nn_fail(n, KF_ERR_UNSUPPORTED, "more than %d operands", MAX_OPERANDS);
    for (int i = 0; i < nin; i++) {
        kf_type_of_tensor(&types[i], in[i]);
        tp[i] = &types[i];
    }
    kf_type ot;
    kf_type_unknown(&ot);
    KF_TRY(kf_nn_einsum_shape(n, nin, tp, in, 1, &ot));
    if (!out[0].data) KF_TRY(kf_tensor_alloc(&out[0], ot.dtype, ot.rank, ot.dims));
    ein *q = kf_malloc(sizeof *q);
    if (!q) return kf_fail(KF_ERR_NOMEM, "out of memory");
    bool known;
    kf_status st = ein_parse(n, nin, tp, q, &known);
    bool isf = kf_dtype_is_float(in[0]->dtype);
    void *cur = NULL, *data[2] = {NULL, NULL};
    int8_t curlab[MAX_LABELS];
    int ncur = 0;
    ein_arg args[2];
    for (int i = 0; i < nin && !st; i++) {
        /* args: the running result (after step 0) and operand i */
        int nargs = 0;
        int8_t lab[MAX_LABELS];
        int nlab = 0;
        bool have[MAX_LABELS] = {false};
        if (i > 0) {
            memset(&args[0], 0, sizeof args[0]);
            args[0].data = cur;
            int64_t s = 1;
            for (int j = ncur - 1; j >= 0; j--) {
                args[0].str[curlab[j]] = s;
                s *= q->size[curlab[j]];
            }
            for (int j = 0; j < ncur; j++) {
                lab[nlab++] = curlab[j];
                have[curlab[j]] = true;
            }
            nargs = 1;
        }
        data[1] = isf ? (void *)kf_nn_to_f64(in[i]) : (void *)kf_nn_to_i64(in[i]);
        if (!data[1]) {
            st = KF_ERR_NOMEM;
            break;
        }
        input_arg(q, i, in[i], data[1], &args[nargs++]);
        for (int d = 0; d < in[i]->rank; d++) {
            int l = q->lab[i][d];
            if (!have[l]) lab[nlab++] = (int8_t)l;
            have[l] = true;
        }
        /* kept: the output's labels at the end, else those used later */
        int8_t kept[MAX_LABELS];
        int nkept = 0;
        if (i == nin - 1) {
            memcpy(kept, q->out, (size_t)q->nout);
            nkept = q->nout;
        } else {
            bool later[MAX_LABELS] = {false};
            for (int k = 0; k < q->nout; k++) later[q->out[k]] = true;
            for (int o = i + 1; o < nin; o++)
                for (int d = 0; d < q->rank[o]; d++) later[q->lab[o][d]] = true;
            for (int j = 0; j < nlab; j++)
                if (later[lab[j]]) kept[nkept++] = lab[j];
        }
        void *res = NULL;
        st = ein_step(n, q, isf, args, nargs, lab, nlab, kept, nkept, &res);
        kf_free(data[1]);
        data[1] = NULL;
        kf_free(cur);
        cur = res;
        memcpy(curlab, kept, (size_t)nkept);
        ncur = nkept;
    }
    if (!st)
        for (int64_t i = 0; i < out[0].numel; i++) {
            if (isf) kf_set_f64(&out[0], i, ((double *)cur)[i]);
            else kf_set_u64(&out[0], i, ((uint64_t *)cur)[i]);
        }
    kf_free(cur);
    kf_free(q);
    return st;
}
