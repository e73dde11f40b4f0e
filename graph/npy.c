/*
 * npy.c: NumPy .npy files (format versions 1.0, 2.0 and 3.0) read into
 * tensors, so `kfuse run --inputs DIR` takes the arrays a Python script
 * saved with numpy.save beside ONNX TensorProto files. The file is
 * untrusted: the header is parsed strictly (the one dict numpy writes), its
 * length, the shape and the data length are all checked, and anything else
 * is a typed error naming the file.
 *
 *   \x93NUMPY  major minor  header_len (2 bytes LE; 4 from 2.0)  header  data
 *   header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + spaces + "\n"
 */
#include <stdio.h>
#include <string.h>

#include "kf_onnx.h"

/* numpy itself refuses headers over 10000 bytes unless told otherwise
 * (numpy.lib.format's max_header_size); no shape of rank <= 8 needs more */
#define NPY_MAX_HEADER 10000

typedef struct npy_parse {
    const char *p, *end;
} npy_parse;

static void skip_space(npy_parse *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static bool eat(npy_parse *s, char c) {
    skip_space(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

/* A quoted string ('...' or "...") into out (n bytes); false when absent or too long. */
static bool quoted(npy_parse *s, char *out, size_t n) {
    skip_space(s);
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"')) return false;
    char q = *s->p++;
    size_t k = 0;
    while (s->p < s->end && *s->p != q) {
        if (k + 1 >= n) return false;
        out[k++] = *s->p++;
    }
    if (s->p >= s->end) return false;
    s->p++;
    out[k] = 0;
    return true;
}

static bool word(npy_parse *s, const char *w) {
    skip_space(s);
    size_t n = strlen(w);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, w, n) != 0) return false;
    s->p += n;
    return true;
}

/* A non-negative decimal integer that fits in int64. */
static bool integer(npy_parse *s, int64_t *v) {
    skip_space(s);
    if (s->p >= s->end || *s->p < '0' || *s->p > '9') return false;
    int64_t x = 0;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        if (!kf_mul_ok(x, 10, &x) || !kf_add_ok(x, *s->p - '0', &x)) return false;
        s->p++;
    }
    if (s->p < s->end && *s->p == 'L') s->p++; /* Python 2 longs, in files numpy wrote long ago */
    *v = x;
    return true;
}

/* The dtype of a descr such as '<f4', '|b1', '>i8'; *swap when its byte
 * order is not the host's. */
static bool descr_dtype(const char *d, kf_dtype *dt, bool *swap) {
    if (strlen(d) != 3 || !strchr("<>|=", d[0])) return false;
    static const struct {
        const char *code;
        kf_dtype dt;
    } map[] = {{"f2", KF_DT_FLOAT16}, {"f4", KF_DT_FLOAT},  {"f8", KF_DT_DOUBLE}, {"i1", KF_DT_INT8},
               {"i2", KF_DT_INT16},   {"i4", KF_DT_INT32},  {"i8", KF_DT_INT64},  {"u1", KF_DT_UINT8},
               {"u2", KF_DT_UINT16},  {"u4", KF_DT_UINT32}, {"u8", KF_DT_UINT64}, {"b1", KF_DT_BOOL}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(d + 1, map[i].code)) {
            *dt = map[i].dt;
            const uint16_t one = 1;
            bool host_little = *(const uint8_t *)&one == 1;
            *swap = kf_dtype_size(map[i].dt) > 1 && ((d[0] == '>' && host_little) || (d[0] == '<' && !host_little));
            return true;
        }
    return false;
}

/* Parses the header dict; errors name the file and what is wrong. */
static kf_status parse_header(const char *path, const char *h, size_t len, kf_dtype *dt, bool *swap, int *rank,
                              int64_t *dims) {
    npy_parse s = {h, h + len};
    bool have_descr = false, have_order = false, have_shape = false;
    if (!eat(&s, '{')) return kf_fail(KF_ERR_BAD_MODEL, "%s: the .npy header is not a dict", path);
    while (!eat(&s, '}')) {
        char key[32], descr[32];
        if (!quoted(&s, key, sizeof key) || !eat(&s, ':'))
            return kf_fail(KF_ERR_BAD_MODEL, "%s: malformed .npy header (expected a quoted key and ':')", path);
        if (!strcmp(key, "descr") && !have_descr) {
            if (!quoted(&s, descr, sizeof descr))
                return kf_fail(KF_ERR_UNSUPPORTED, "%s: .npy 'descr' is not a plain dtype string (structured arrays "
                                                   "are not tensors)", path);
            if (!descr_dtype(descr, dt, swap))
                return kf_fail(KF_ERR_UNSUPPORTED, "%s: .npy dtype '%s' is not one kfuse reads (f2/f4/f8, i1-i8, "
                                                   "u1-u8, b1)", path, descr);
            have_descr = true;
        } else if (!strcmp(key, "fortran_order") && !have_order) {
            if (word(&s, "True"))
                return kf_fail(KF_ERR_UNSUPPORTED, "%s: .npy in Fortran order; save a C-ordered array "
                                                   "(numpy.ascontiguousarray)", path);
            if (!word(&s, "False")) return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy 'fortran_order' is not True or False", path);
            have_order = true;
        } else if (!strcmp(key, "shape") && !have_shape) {
            if (!eat(&s, '(')) return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy 'shape' is not a tuple", path);
            *rank = 0;
            while (!eat(&s, ')')) {
                int64_t d;
                if (*rank == KF_MAX_RANK)
                    return kf_fail(KF_ERR_UNSUPPORTED, "%s: .npy shape has more than %d dims", path, KF_MAX_RANK);
                if (!integer(&s, &d))
                    return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy shape holds something other than a non-negative "
                                                     "integer", path);
                dims[(*rank)++] = d;
                if (!eat(&s, ',') && !(skip_space(&s), s.p < s.end && *s.p == ')'))
                    return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy shape tuple is malformed", path);
            }
            have_shape = true;
        } else {
            return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy header has an unexpected or repeated key '%s'", path, key);
        }
        if (!eat(&s, ',')) {
            if (!eat(&s, '}')) return kf_fail(KF_ERR_BAD_MODEL, "%s: malformed .npy header (expected ',' or '}')", path);
            break;
        }
    }
    if (!have_descr || !have_order || !have_shape)
        return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy header lacks '%s'", path,
                       !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    skip_space(&s);
    if (s.p != s.end) return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy header has text after the dict", path);
    return KF_OK;
}

kf_status kf_npy_parse(const uint8_t *b, size_t len, const char *path, kf_tensor *t) {
    static const char magic[6] = {(char)0x93, 'N', 'U', 'M', 'P', 'Y'};
    if (len < 10 || memcmp(b, magic, 6) != 0) return kf_fail(KF_ERR_BAD_MODEL, "%s: not a .npy file (no \\x93NUMPY magic)", path);
    int major = b[6];
    if (major < 1 || major > 3)
        return kf_fail(KF_ERR_UNSUPPORTED, "%s: .npy format version %d.%d (1.0 to 3.0 are read)", path, major, b[7]);
    size_t at = major == 1 ? 10 : 12, hlen;
    if (len < at) return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy file ends inside its header length", path);
    hlen = major == 1 ? (size_t)b[8] | (size_t)b[9] << 8
                      : (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    if (hlen > NPY_MAX_HEADER)
        return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy header of %zu bytes (more than %d)", path, hlen, NPY_MAX_HEADER);
    if (hlen > len - at) return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy header runs past the end of the file", path);
    for (size_t i = 0; i < hlen; i++)
        if (b[at + i] == 0) return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy header holds a NUL byte", path);
    kf_dtype dt = KF_DT_UNDEFINED;
    bool swap = false;
    int rank = 0;
    int64_t dims[KF_MAX_RANK] = {0};
    KF_TRY(parse_header(path, (const char *)b + at, hlen, &dt, &swap, &rank, dims));
    at += hlen;
    size_t esz = kf_dtype_size(dt);
    int64_t numel = 0, nbytes;
    kf_status st = kf_shape_numel(rank, dims, esz, &numel);
    if (st) return kf_fail_context(st, "%s", path);
    if (!kf_mul_ok(numel, (int64_t)esz, &nbytes) || (uint64_t)nbytes != (uint64_t)(len - at))
        return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy data is %zu bytes, its shape and dtype need %lld", path, len - at,
                       (long long)numel * (long long)esz);
    if ((st = kf_tensor_alloc(t, dt, rank, dims))) return kf_fail_context(st, "%s", path);
    memcpy(t->data, b + at, (size_t)nbytes);
    if (swap) {
        uint8_t *p = t->data;
        for (int64_t i = 0; i < numel; i++, p += esz)
            for (size_t k = 0; k < esz / 2; k++) {
                uint8_t c = p[k];
                p[k] = p[esz - 1 - k];
                p[esz - 1 - k] = c;
            }
    }
    if (dt == KF_DT_BOOL) /* numpy writes 0 or 1; anything else is not a bool */
        for (int64_t i = 0; i < numel; i++)
            if (((uint8_t *)t->data)[i] > 1) {
                unsigned v = ((uint8_t *)t->data)[i];
                kf_tensor_release(t);
                return kf_fail(KF_ERR_BAD_MODEL, "%s: .npy bool element %lld is %u", path, (long long)i, v);
            }
    return KF_OK;
}

kf_status kf_npy_read_file(const char *path, kf_tensor *t) {
    uint8_t *data;
    size_t len;
    KF_TRY(kf_read_file(path, &data, &len));
    kf_status st = kf_npy_parse(data, len, path, t);
    kf_free(data);
    return st;
}
