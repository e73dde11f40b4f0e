/*
 * onnx.c: ONNX files in and out. Import turns a protobuf-c ModelProto into
 * the IR, checking every length, dim and offset it reads (files are
 * untrusted); export builds a fresh ModelProto from the IR and carries the
 * fields the IR does not model from the original. This is the first and last
 * stage of the pipeline: graph/ -> fusion/ -> ... -> back out through here.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kf_extdata.h"
#include "kf_onnx.h"
#include "kf_ops.h"
#include "onnx.pb-c.h"
#include "kf_ref.h"
#include "onnx_scope.h"

/* protobuf-c allocates through kf_malloc too, so allocation-failure tests
 * reach the decoder (a model's own message through its arena, below). */
static _Thread_local bool pb_nomem; /* an allocation failed while decoding */
static void *pb_alloc(void *data, size_t n) {
    (void)data;
    void *p = kf_malloc(n);
    if (!p) pb_nomem = true;
    else kf_advise_huge(p, n); /* weights' raw_data: the decoder writes them whole, and the model keeps them */
    return p;
}
static void pb_free(void *data, void *p) {
    (void)data;
    kf_free(p);
}
static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

/* ---- the model's decoding arena --------------------------------------------
 * A model's ModelProto is thousands of small pieces (names, attributes,
 * dims), most freed again right after import (drop_imported_bulk). Taken
 * one by one from the heap and given back, they left its free lists long
 * enough that the next code to allocate (the optimizer) paid for sorting
 * them. Pieces under PB_ARENA_SMALL bytes are cut from blocks instead, and
 * a block is given back whole once nothing in it is live; larger pieces
 * (weights' raw_data, which the IR takes over) still come from the heap. */
#define PB_ARENA_SMALL 4096
#define PB_BLOCK_MIN ((size_t)64 << 10)
#define PB_BLOCK_MAX ((size_t)16 << 20)

typedef struct pb_block {
    char *base;
    size_t size, used;
    size_t live; /* pieces cut and not freed */
} pb_block;

typedef struct pb_arena {
    ProtobufCAllocator alloc; /* allocator_data points here */
    pb_block *blocks;         /* by address */
    uint32_t n, cap;
    char *cur;                /* the block pieces are cut from (its base), NULL: none */
    size_t total;             /* bytes in blocks so far: the next block is as large, within limits */
} pb_arena;

/* The block holding p, or -1. */
static int64_t pb_block_of(const pb_arena *a, const void *p) {
    uint32_t lo = 0, hi = a->n;
    const char *c = p;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c < a->blocks[mid].base) hi = mid;
        else if (c >= a->blocks[mid].base + a->blocks[mid].size) lo = mid + 1;
        else return mid;
    }
    return -1;
}

/* Gives block i back to the heap. */
static void pb_drop_block(pb_arena *a, int64_t i) {
    kf_free(a->blocks[i].base);
    memmove(&a->blocks[i], &a->blocks[i + 1], (size_t)(a->n - (uint32_t)i - 1) * sizeof *a->blocks);
    a->n--;
}

static pb_block *pb_current(pb_arena *a) {
    int64_t b = a->cur ? pb_block_of(a, a->cur) : -1;
    return b < 0 ? NULL : &a->blocks[b];
}

static void *arena_alloc(void *data, size_t n) {
    pb_arena *a = data;
    if (n >= PB_ARENA_SMALL) return pb_alloc(NULL, n);
    n = n ? (n + 15) & ~(size_t)15 : 16; /* a zero-byte piece too lies inside its block */
    pb_block *b = pb_current(a);
    if (!b || b->size - b->used < n) {
        if (b && !b->live) { /* everything cut from the full block was freed already */
            pb_drop_block(a, b - a->blocks);
            a->cur = NULL;
        }
        size_t size = a->total < PB_BLOCK_MIN ? PB_BLOCK_MIN : a->total > PB_BLOCK_MAX ? PB_BLOCK_MAX : a->total;
        if (a->n == a->cap) {
            uint32_t cap = a->cap ? 2 * a->cap : 16;
            pb_block *t = kf_realloc(a->blocks, (size_t)cap * sizeof *t);
            if (!t) {
                pb_nomem = true;
                return NULL;
            }
            a->blocks = t;
            a->cap = cap;
        }
        char *base = kf_malloc(size);
        if (!base) {
            pb_nomem = true;
            return NULL;
        }
        uint32_t at = a->n;
        while (at > 0 && a->blocks[at - 1].base > base) at--;
        memmove(&a->blocks[at + 1], &a->blocks[at], (size_t)(a->n - at) * sizeof *a->blocks);
        a->blocks[at] = (pb_block){base, size, 0, 0};
        a->n++;
        a->total += size;
        a->cur = base;
        b = &a->blocks[at];
    }
    void *p = b->base + b->used;
    b->used += n;
    b->live++;
    return p;
}

static void arena_free(void *data, void *p) {
    pb_arena *a = data;
    if (!p) return;
    int64_t i = pb_block_of(a, p);
    if (i < 0) {
        kf_free(p); /* a large piece, from the heap */
        return;
    }
    pb_block *b = &a->blocks[i];
    if (--b->live || b->base == a->cur) return;
    pb_drop_block(a, i);
}

static pb_arena *arena_new(void) {
    pb_arena *a = kf_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->alloc = (ProtobufCAllocator){arena_alloc, arena_free, a};
    return a;
}

/* Frees the arena's blocks, live pieces or not (after the message is freed). */
static void arena_delete(pb_arena *a) {
    if (!a) return;
    for (uint32_t i = 0; i < a->n; i++) kf_free(a->blocks[i].base);
    kf_free(a->blocks);
    kf_free(a);
}

/* Whether p was cut from arena a (the IR may not take such a piece over). */
static bool in_arena(const void *a, const void *p) { return a && pb_block_of(a, p) >= 0; }

/* Largest model file read into memory; bigger weights belong in external
 * data, which is read tensor by tensor. */
#define KF_MAX_FILE_BYTES ((int64_t)8 << 30)
/* Distinct symbolic dim names per graph: real models use a handful
 * ("batch", "seq"); interning is a linear search, so a cap keeps a hostile
 * file from making it quadratic. */
#define MAX_DIM_PARAMS 4096
/* Attributes per node: no ONNX op has more than a few dozen, and the
 * duplicate-name check is quadratic in the count. */
#define MAX_NODE_ATTRS 1024

/* ---- files -------------------------------------------------------------- */

kf_status kf_read_file(const char *path, uint8_t **data, size_t *len) {
    *data = NULL;
    *len = 0;
    struct stat pre; /* fopen would block on a FIFO */
    if (stat(path, &pre) == 0 && !S_ISREG(pre.st_mode)) return kf_fail(KF_ERR_IO, "'%s' is not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return kf_fail(KF_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return kf_fail(KF_ERR_IO, "'%s' is not a regular file", path);
    }
    if (sb.st_size > KF_MAX_FILE_BYTES) {
        fclose(f);
        return kf_fail(KF_ERR_IO, "'%s' is larger than %lld bytes", path, (long long)KF_MAX_FILE_BYTES);
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = kf_malloc(n);
    if (!buf) {
        fclose(f);
        return kf_fail(KF_ERR_NOMEM, "out of memory reading '%s'", path);
    }
    if (n && fread(buf, 1, n, f) != n) {
        kf_free(buf);
        fclose(f);
        return kf_fail(KF_ERR_IO, "cannot read '%s'", path);
    }
    fclose(f);
    *data = buf;
    *len = n;
    return KF_OK;
}

/* ---- nesting guard ------------------------------------------------------- */

static bool read_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= len) return false;
        uint8_t b = p[(*pos)++];
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

/* Walks serialized message p with its descriptor before protobuf-c sees
 * it: every key names a field number > 0 (protobuf-c keeps field 0 as an
 * unknown field it cannot write back), known message fields are checked
 * recursively, unknown fields are skipped, groups are refused, and nesting
 * stops at KF_MAX_PROTO_DEPTH (protobuf-c's unpacker recurses without a
 * limit). Returns 0, or 1 for malformed input, 2 for too deep. Linear in
 * len: every byte is looked at once per nesting level it sits in. */
static int check_msg(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, int depth) {
    if (depth > KF_MAX_PROTO_DEPTH) return 2;
    size_t pos = 0;
    while (pos < len) {
        uint64_t key, v;
        if (!read_varint(p, len, &pos, &key)) return 1;
        uint64_t num = key >> 3;
        if (num == 0 || num > 536870911u) return 1;
        switch (key & 7) {
        case 0:
            if (!read_varint(p, len, &pos, &v)) return 1;
            break;
        case 1:
            if (len - pos < 8) return 1;
            pos += 8;
            break;
        case 5:
            if (len - pos < 4) return 1;
            pos += 4;
            break;
        case 2: {
            if (!read_varint(p, len, &pos, &v) || v > len - pos) return 1;
            const ProtobufCFieldDescriptor *f = d ? protobuf_c_message_descriptor_get_field(d, (unsigned)num) : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                int r = check_msg(f->descriptor, p + pos, (size_t)v, depth + 1);
                if (r) return r;
            }
            pos += (size_t)v;
            break;
        }
        default: return 1; /* groups (3, 4) and reserved wire types */
        }
    }
    return 0;
}

static kf_status check_proto(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len,
                             const char *what) {
    int r = check_msg(d, data, len, 1);
    if (r == 1) return kf_fail(KF_ERR_BAD_MODEL, "%s: not a valid protobuf message (truncated or garbage bytes)", what);
    if (r == 2) return kf_fail(KF_ERR_BAD_MODEL, "%s: messages nested deeper than %d levels", what, KF_MAX_PROTO_DEPTH);
    return KF_OK;
}

kf_status kf_proto_check_depth(const uint8_t *data, size_t len, const char *what) {
    return check_proto(&onnx__model_proto__descriptor, data, len, what);
}

/* ---- import: tensors ------------------------------------------------------ */

/* Opens dir/location for external data, refusing anything that resolves
 * outside dir (absolute paths, "..", links pointing out). *real (may be
 * NULL) gets the resolved path, malloc'ed. */
static kf_status open_external(const char *dir, const char *location, const char *tname, FILE **out, char **real_out) {
    *out = NULL;
    if (!dir) return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': external data without a model folder", tname);
    if (!location || !location[0] || location[0] == '/' || strstr(location, ".."))
        return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': external data location '%s' must be a relative path inside the model folder",
                       tname, location ? location : "");
    char *root = realpath(dir, NULL);
    if (!root) return kf_fail(KF_ERR_IO, "tensor '%s': cannot resolve model folder '%s'", tname, dir);
    size_t plen = strlen(dir) + strlen(location) + 2;
    char *joined = kf_malloc(plen);
    if (!joined) {
        free(root);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    snprintf(joined, plen, "%s/%s", dir, location);
    char *real = realpath(joined, NULL);
    kf_free(joined);
    if (!real) {
        free(root);
        return kf_fail(KF_ERR_IO, "tensor '%s': external data file '%s' not found", tname, location);
    }
    size_t rl = strlen(root);
    bool inside = strncmp(real, root, rl) == 0 && real[rl] == '/';
    free(root);
    if (!inside) {
        free(real);
        return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': external data '%s' resolves outside the model folder", tname, location);
    }
    struct stat sb; /* fopen would block on a FIFO */
    if (stat(real, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        free(real);
        return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': external data '%s' is not a regular file", tname, location);
    }
    FILE *f = fopen(real, "rb");
    if (!f) {
        free(real);
        return kf_fail(KF_ERR_IO, "tensor '%s': cannot open external data '%s'", tname, location);
    }
    if (real_out) *real_out = real;
    else free(real);
    *out = f;
    return KF_OK;
}

/* Where an external tensor's bytes lie: the resolved file, the name the
 * model gives it and the offset (filled by open_external_data). */
typedef struct ext_where {
    char *real; /* malloc'ed (free()) */
    const char *location;
    int64_t offset;
} ext_where;

/* Opens the external data of tp and positions it at its offset, after
 * checking that offset + nbytes lies inside the file. *out: caller closes. */
static kf_status open_external_data(const Onnx__TensorProto *tp, const char *dir, const char *tname, size_t nbytes,
                                    FILE **out, ext_where *where) {
    const char *location = NULL;
    int64_t offset = 0, length = -1;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const char *k = tp->external_data[i]->key, *v = tp->external_data[i]->value;
        if (!k || !v) continue;
        char *end;
        if (strcmp(k, "location") == 0) location = v;
        else if (strcmp(k, "offset") == 0 || strcmp(k, "length") == 0) {
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (errno || *end || x < 0)
                return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': bad external data %s '%s'", tname, k, v);
            if (k[0] == 'o') offset = x;
            else length = x;
        }
    }
    if (length >= 0 && (uint64_t)length != nbytes)
        return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': external data length %lld, shape needs %zu bytes", tname,
                       (long long)length, nbytes);
    FILE *f;
    char *real = NULL;
    KF_TRY(open_external(dir, location, tname, &f, &real));
    struct stat sb;
    int64_t end;
    if (fstat(fileno(f), &sb) != 0 || !kf_add_ok(offset, (int64_t)nbytes, &end) || end > sb.st_size) {
        fclose(f);
        free(real);
        return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': external data offset %lld + %zu bytes is past the end of '%s'",
                       tname, (long long)offset, nbytes, location);
    }
    if (fseeko(f, (off_t)offset, SEEK_SET) != 0) {
        fclose(f);
        free(real);
        return kf_fail(KF_ERR_IO, "tensor '%s': cannot seek in external data '%s'", tname, location);
    }
    *out = f;
    if (where) *where = (ext_where){real, location, offset};
    else free(real);
    return KF_OK;
}

/* Reads nbytes from f into dst and closes f. */
static kf_status read_external(FILE *f, const char *tname, void *dst, size_t nbytes) {
    bool ok = !nbytes || fread(dst, 1, nbytes, f) == nbytes;
    fclose(f);
    if (!ok) return kf_fail(KF_ERR_IO, "tensor '%s': cannot read external data", tname);
    return KF_OK;
}

/* Converts tp into t. With steal, raw tensor bytes are taken over from tp
 * (protobuf-c allocated them with malloc, as kfuse's allocator does) and
 * tp is left without them: loading a model then copies its weights once
 * (file -> protobuf-c) instead of twice. With into (an initializer of model
 * into), external bytes are mapped rather than read where they can be
 * (kf_extdata.h), and *ext_file / *ext_offset say which region t holds
 * (ext_file 0 when they were read). */
static kf_status tensor_from_proto(Onnx__TensorProto *tp, const char *dir, kf_tensor *t, bool steal, kf_model *into,
                                   uint32_t *ext_file, int64_t *ext_offset) {
    if (ext_file) *ext_file = 0;
    const char *tname = tp->name ? tp->name : "";
    int dt = tp->data_type;
    if (!kf_dtype_valid(dt)) return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': unknown data type %d", tname, dt);
    if (dt == KF_DT_COMPLEX64 || dt == KF_DT_COMPLEX128)
        return kf_fail(KF_ERR_UNSUPPORTED, "tensor '%s': complex tensors are not supported", tname);
    if (tp->n_dims > KF_MAX_RANK)
        return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': rank %zu exceeds %d", tname, tp->n_dims, KF_MAX_RANK);
    if (tp->segment) return kf_fail(KF_ERR_UNSUPPORTED, "tensor '%s': segmented tensors are not supported", tname);
    int64_t dims[KF_MAX_RANK];
    for (size_t i = 0; i < tp->n_dims; i++) {
        dims[i] = tp->dims[i];
        if (dims[i] < 0) return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': negative dimension %lld", tname, (long long)dims[i]);
    }
    /* Every length is checked against the shape before anything is
     * allocated: a few bytes of file must not buy a 16 GiB buffer. */
    size_t esz = kf_dtype_size((kf_dtype)dt);
    int64_t n;
    kf_status st = kf_shape_numel((int)tp->n_dims, dims, esz, &n);
    if (st) return kf_fail_context(st, "tensor '%s'", tname);
    size_t nbytes = (size_t)n * esz;
    /* bytes in the file: types below 8 bits are packed there (one byte per
     * element in memory) */
    size_t fbytes = kf_dtype_packed_bytes((kf_dtype)dt, n);
    bool packed = fbytes != nbytes;
    bool external = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    bool raw = !external && tp->has_raw_data && dt != KF_DT_STRING;
    size_t have = 0;
    const char *field = NULL;
    if (external && dt == KF_DT_STRING)
        return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': string tensors cannot use external data", tname);
    if (raw && tp->raw_data.len != fbytes)
        return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': raw_data has %zu bytes, shape and dtype need %zu", tname,
                       tp->raw_data.len, fbytes);
    if (!external && !raw) {
        switch (dt) {
        case KF_DT_FLOAT: have = tp->n_float_data; field = "float_data"; break;
        case KF_DT_DOUBLE: have = tp->n_double_data; field = "double_data"; break;
        case KF_DT_INT64: have = tp->n_int64_data; field = "int64_data"; break;
        case KF_DT_UINT32:
        case KF_DT_UINT64: have = tp->n_uint64_data; field = "uint64_data"; break;
        case KF_DT_STRING: have = tp->n_string_data; field = "string_data"; break;
        default: have = tp->n_int32_data; field = "int32_data"; break;
        }
        /* int32_data holds one packed byte per entry for 4- and 2-bit types,
         * one element per entry otherwise (6-bit types included) */
        int bits = kf_dtype_bits((kf_dtype)dt);
        size_t need = bits == 4 || bits == 2 ? fbytes : (size_t)n;
        if (have != need)
            return kf_fail(KF_ERR_BAD_MODEL, "tensor '%s': %s has %zu elements, shape needs %zu", tname, field, have,
                           need);
    }
    if (raw && steal && !packed && nbytes && tp->raw_data.data &&
        !in_arena(into ? into->proto_arena : NULL, tp->raw_data.data)) { /* little-endian host assumed, as ONNX stores */
        kf_tensor_release(t);
        t->dtype = (kf_dtype)dt;
        t->rank = (int)tp->n_dims;
        for (int i = 0; i < t->rank; i++) t->dims[i] = dims[i];
        t->numel = n;
        t->data = tp->raw_data.data;
        tp->raw_data.data = NULL;
        tp->raw_data.len = 0;
        return KF_OK;
    }
    FILE *f = NULL;
    ext_where where = {0};
    if (external) KF_TRY(open_external_data(tp, dir, tname, fbytes, &f, &where));
    if (external && into && !packed && nbytes && where.offset % (int64_t)esz == 0) {
        uint32_t file;
        const uint8_t *base = kf_extdata_map(into, where.real, where.location, fileno(f), &file);
        if (base) { /* the bounds were checked against the file above */
            free(where.real);
            fclose(f);
            kf_tensor_release(t);
            t->dtype = (kf_dtype)dt;
            t->rank = (int)tp->n_dims;
            for (int i = 0; i < t->rank; i++) t->dims[i] = dims[i];
            t->numel = n;
            t->data = (void *)(base + where.offset); /* read-only: a pass that changes it makes a new tensor */
            *ext_file = file;
            *ext_offset = where.offset;
            return KF_OK;
        }
    }
    free(where.real);
    st = kf_tensor_alloc(t, (kf_dtype)dt, (int)tp->n_dims, dims);
    if (st) {
        if (f) fclose(f);
        return kf_fail_context(st, "tensor '%s'", tname);
    }
    if (packed) { /* read the packed bytes, then one byte per element */
        uint8_t *buf = kf_malloc(fbytes + 1);
        if (!buf) {
            if (f) fclose(f);
            kf_tensor_release(t);
            return kf_fail(KF_ERR_NOMEM, "out of memory");
        }
        if (external) st = read_external(f, tname, buf, fbytes);
        else if (raw) memcpy(buf, tp->raw_data.data, fbytes);
        else if (kf_dtype_bits((kf_dtype)dt) != 6)
            for (size_t i = 0; i < fbytes; i++) buf[i] = (uint8_t)tp->int32_data[i];
        if (!st && !raw && !external && kf_dtype_bits((kf_dtype)dt) == 6) /* int32_data: one code per entry */
            for (int64_t i = 0; i < n; i++) ((uint8_t *)t->data)[i] = (uint8_t)(tp->int32_data[i] & 0x3F);
        else if (!st) kf_unpack_small((kf_dtype)dt, buf, n, t->data);
        kf_free(buf);
        if (st) kf_tensor_release(t);
        return st;
    }
    if (external) {
        st = read_external(f, tname, t->data, nbytes);
        if (st) kf_tensor_release(t);
        return st;
    }
    if (raw) {
        if (nbytes) memcpy(t->data, tp->raw_data.data, nbytes); /* little-endian host assumed, as ONNX stores */
        return KF_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case KF_DT_FLOAT: ((float *)t->data)[i] = tp->float_data[i]; break;
        case KF_DT_DOUBLE: ((double *)t->data)[i] = tp->double_data[i]; break;
        case KF_DT_INT64: ((int64_t *)t->data)[i] = tp->int64_data[i]; break;
        case KF_DT_UINT32: ((uint32_t *)t->data)[i] = (uint32_t)tp->uint64_data[i]; break;
        case KF_DT_UINT64: ((uint64_t *)t->data)[i] = tp->uint64_data[i]; break;
        case KF_DT_FLOAT16:
        case KF_DT_BFLOAT16: ((uint16_t *)t->data)[i] = (uint16_t)tp->int32_data[i]; break;
        case KF_DT_STRING: {
            kf_bytes *s = &((kf_bytes *)t->data)[i];
            const ProtobufCBinaryData *b = &tp->string_data[i]; /* data is NULL when empty */
            s->ptr = kf_strndup(b->data ? (const char *)b->data : "", b->len);
            if (!s->ptr) {
                kf_tensor_release(t);
                return kf_fail(KF_ERR_NOMEM, "out of memory");
            }
            s->len = tp->string_data[i].len;
            break;
        }
        default:
            if (kf_dtype_is_small((kf_dtype)dt)) ((uint8_t *)t->data)[i] = (uint8_t)tp->int32_data[i]; /* float8 bit codes */
            else kf_set_i64(t, i, tp->int32_data[i]);
            break;
        }
    }
    return KF_OK;
}

/* ---- import: types ------------------------------------------------------------ */

/* A negative dim_value in a declared type (graph input, output or
 * value_info) is read as an unnamed symbolic dim: exporters write -1 for a
 * dynamic axis they did not name, and ONNX Runtime runs such files. The
 * first one is described in m->load_warning. Tensors (initializers,
 * attributes) have data, so a negative dim there stays an error. */
/* The word for a declared type kfuse has no type for, or NULL. */
static const char *other_kind(const Onnx__TypeProto *tp) {
    if (!tp) return NULL;
    switch (tp->value_case) {
    case ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE: return "sequence";
    case ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE: return "optional";
    case ONNX__TYPE_PROTO__VALUE_MAP_TYPE: return "map";
    case ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE: return "sparse tensor";
    default: return NULL;
    }
}

static kf_status type_from_proto(kf_model *m, const Onnx__TypeProto *tp, const char *vname, kf_type *ty,
                                 bool *is_tensor) {
    kf_graph *g = m->graph;
    kf_type_unknown(ty);
    *is_tensor = false;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type) return KF_OK;
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    *is_tensor = true;
    if (tt->has_elem_type) {
        if (tt->elem_type != 0 && !kf_dtype_valid(tt->elem_type))
            return kf_fail(KF_ERR_BAD_MODEL, "value '%s': unknown element type %d", vname, tt->elem_type);
        ty->dtype = (kf_dtype)tt->elem_type;
    }
    if (!tt->shape) return KF_OK;
    if (tt->shape->n_dim > KF_MAX_RANK)
        return kf_fail(KF_ERR_BAD_MODEL, "value '%s': rank %zu exceeds %d", vname, tt->shape->n_dim, KF_MAX_RANK);
    ty->rank = (int)tt->shape->n_dim;
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
        const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
        ty->dims[i] = -1;
        ty->syms[i] = 0;
        if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
            if (d->dim_value < 0) {
                if (!m->load_warnings++)
                    snprintf(m->load_warning, sizeof m->load_warning,
                             "value '%s': dimension %zu is %lld, read as an unnamed symbolic dimension", vname, i,
                             (long long)d->dim_value);
                continue;
            }
            ty->dims[i] = d->dim_value;
        } else if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && d->dim_param &&
                   d->dim_param[0]) {
            if (g->nsyms > MAX_DIM_PARAMS)
                return kf_fail(KF_ERR_BAD_MODEL, "value '%s': more than %d distinct symbolic dimension names", vname,
                               MAX_DIM_PARAMS);
            ty->syms[i] = kf_graph_sym(g, d->dim_param);
            if (!ty->syms[i]) return kf_fail(KF_ERR_NOMEM, "out of memory");
        }
    }
    if (!kf_dims_fit(ty->rank, ty->dims)) /* no tensor has a shape whose known dims overflow */
        return kf_fail(KF_ERR_BAD_MODEL, "value '%s': dimension product overflows", vname);
    return KF_OK;
}

/* Two declarations of one value agree when every fact both state is equal. */
static bool types_agree(const kf_type *a, const kf_type *b) {
    if (a->dtype && b->dtype && a->dtype != b->dtype) return false;
    if (a->rank < 0 || b->rank < 0) return true;
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] >= 0 && b->dims[i] >= 0 && a->dims[i] != b->dims[i]) return false;
    return true;
}

/* Reads the declared type of vi into its value, which is created when
 * `create` and otherwise skipped (*id = 0) when absent. The initializer, or
 * else the first declaration (graph input, then output, then value_info:
 * the order export looks them up in), fixes the type; a later declaration
 * that contradicts it is an error naming `what` ("graph input", ...). */
static kf_status value_info_in(kf_model *m, const Onnx__ValueInfoProto *vi, const char *what, kf_id *id,
                               bool create) {
    kf_graph *g = m->graph;
    if (!vi->name || !vi->name[0]) return kf_fail(KF_ERR_BAD_MODEL, "%s without a name", what);
    kf_id v = kf_graph_find(g, vi->name);
    if (!v) {
        if (!create) {
            *id = 0;
            return KF_OK;
        }
        KF_TRY(kf_graph_add_value(g, vi->name, &v));
    }
    kf_type ty;
    bool is_tensor;
    KF_TRY(type_from_proto(m, vi->type, vi->name, &ty, &is_tensor));
    kf_value *val = kf_value_at(g, v);
    if (!val->other_kind) val->other_kind = other_kind(vi->type);
    if (val->init) {
        if (!types_agree(&ty, &val->type))
            return kf_fail(KF_ERR_BAD_MODEL, "%s '%s' declares a type its initializer does not have", what, vi->name);
    } else if (val->has_type) {
        /* Two declarations that disagree (ORT's own test models list an
         * output twice with different shapes) are hints that cancel out:
         * the shape is left to inference, which checks what the graph
         * computes. Different dtypes stay an error. */
        if (!types_agree(&ty, &val->type)) {
            if (ty.dtype && val->type.dtype && ty.dtype != val->type.dtype)
                return kf_fail(KF_ERR_BAD_MODEL, "%s '%s' declares dtype %s after an earlier declaration of %s", what,
                               vi->name, kf_dtype_name(ty.dtype), kf_dtype_name(val->type.dtype));
            kf_dtype keep = val->type.dtype ? val->type.dtype : ty.dtype;
            kf_type_unknown(&val->type);
            val->type.dtype = keep;
        }
    } else {
        val->type = ty;
        val->has_type = vi->type != NULL;
    }
    if (vi->type) val->has_type = true;
    if (vi->doc_string && !val->doc && !(val->doc = kf_strdup(vi->doc_string))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    *id = v;
    return KF_OK;
}

/* ---- import: attributes --------------------------------------------------------- */

static kf_status attr_from_proto(const Onnx__AttributeProto *ap, size_t index, const char *dir, const char *nname,
                                 kf_attr *a) {
    memset(a, 0, sizeof *a);
    kf_status st = KF_OK;
    const char *aname = ap->name ? ap->name : "";
    if (!aname[0]) return kf_fail(KF_ERR_BAD_MODEL, "node '%s': attribute %zu has no name", nname, index);
    if (!(a->name = kf_strdup(aname))) goto nomem;
    if (ap->ref_attr_name && !(a->ref_attr_name = kf_strdup(ap->ref_attr_name))) goto nomem;
    if (ap->doc_string && !(a->doc = kf_strdup(ap->doc_string))) goto nomem;
    int type = ap->has_type ? (int)ap->type : 0;
    if (!type) { /* IR v1 files: infer the kind from the field in use */
        if (ap->has_f) type = KF_ATTR_FLOAT;
        else if (ap->has_i) type = KF_ATTR_INT;
        else if (ap->has_s) type = KF_ATTR_STRING;
        else if (ap->t) type = KF_ATTR_TENSOR;
        else if (ap->g) type = KF_ATTR_GRAPH;
        else if (ap->n_floats) type = KF_ATTR_FLOATS;
        else if (ap->n_ints) type = KF_ATTR_INTS;
        else if (ap->n_strings) type = KF_ATTR_STRINGS;
        else if (ap->n_tensors) type = KF_ATTR_TENSORS;
        else if (ap->n_graphs) type = KF_ATTR_GRAPHS;
    }
    a->type = (kf_attr_type)type;
    switch (type) {
    case KF_ATTR_FLOAT: a->f = ap->f; break;
    case KF_ATTR_INT: a->i = ap->i; break;
    case KF_ATTR_STRING:
        if (!(a->s.ptr = kf_strndup(ap->s.data ? (const char *)ap->s.data : "", ap->s.len))) goto nomem;
        a->s.len = ap->s.len;
        break;
    case KF_ATTR_FLOATS:
        if (ap->n_floats > INT_MAX) goto toolong;
        a->n = (int)ap->n_floats;
        if (!(a->floats = kf_calloc(ap->n_floats, sizeof(float)))) goto nomem;
        if (ap->n_floats) memcpy(a->floats, ap->floats, ap->n_floats * sizeof(float));
        break;
    case KF_ATTR_INTS:
        if (ap->n_ints > INT_MAX) goto toolong;
        a->n = (int)ap->n_ints;
        if (!(a->ints = kf_calloc(ap->n_ints, sizeof(int64_t)))) goto nomem;
        if (ap->n_ints) memcpy(a->ints, ap->ints, ap->n_ints * sizeof(int64_t));
        break;
    case KF_ATTR_STRINGS:
        if (ap->n_strings > INT_MAX) goto toolong;
        if (!(a->strings = kf_calloc(ap->n_strings, sizeof(kf_bytes)))) goto nomem;
        a->n = (int)ap->n_strings;
        for (size_t i = 0; i < ap->n_strings; i++) {
            a->strings[i].ptr = kf_strndup(ap->strings[i].data ? (const char *)ap->strings[i].data : "", ap->strings[i].len);
            if (!a->strings[i].ptr) goto nomem;
            a->strings[i].len = ap->strings[i].len;
        }
        break;
    case KF_ATTR_TENSOR:
        if (!ap->t) {
            st = kf_fail(KF_ERR_BAD_MODEL, "node '%s': tensor attribute '%s' has no tensor", nname, aname);
            goto fail;
        }
        if (!(a->t = kf_tensor_new())) goto nomem;
        if ((st = tensor_from_proto(ap->t, dir, a->t, false, NULL, NULL, NULL))) {
            kf_fail_context(st, "node '%s' attribute '%s'", nname, aname);
            goto fail;
        }
        break;
    case KF_ATTR_GRAPH:
    case KF_ATTR_GRAPHS:
    case KF_ATTR_TENSORS:
    case KF_ATTR_SPARSE_TENSOR:
    case KF_ATTR_SPARSE_TENSORS:
    case KF_ATTR_TYPE_PROTO:
    case KF_ATTR_TYPE_PROTOS:
        break;
    default:
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s': attribute '%s' has unknown type %d", nname, aname, type);
        goto fail;
    }
    /* kinds the IR does not interpret travel packed, byte for byte */
    if (type >= KF_ATTR_GRAPH && type != KF_ATTR_FLOATS && type != KF_ATTR_INTS && type != KF_ATTR_STRINGS) {
        size_t n = protobuf_c_message_get_packed_size(&ap->base);
        if (!(a->packed = kf_malloc(n))) goto nomem;
        a->packed_len = protobuf_c_message_pack(&ap->base, a->packed);
    }
    return KF_OK;
toolong:
    st = kf_fail(KF_ERR_BAD_MODEL, "node '%s': attribute '%s' is too long", nname, aname);
    goto fail;
nomem:
    st = kf_fail(KF_ERR_NOMEM, "out of memory reading attributes of node '%s'", nname);
fail:
    kf_attr_release(a);
    return st;
}

/* ---- import: model ------------------------------------------------------------- */

/* A known op at a version kfuse implements must have an input and output
 * count the op allows (the evaluator checks the same); other versions and
 * unknown ops are carried without judgement. */
static kf_status check_arity(const kf_node *n) {
    const kf_op_info *info = kf_op_get(n->op);
    if (!info || (n->opset && (n->opset < info->ver_lo || n->opset > info->ver_hi))) return KF_OK;
    if (n->nin < info->in_min || (info->in_max >= 0 && n->nin > info->in_max))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %d inputs, expected %d..%d", kf_node_label(n), n->op_type,
                       n->nin, info->in_min, info->in_max);
    if (n->nout < info->out_min || (info->out_max >= 0 && n->nout > info->out_max))
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): %d outputs, expected %d..%d", kf_node_label(n), n->op_type,
                       n->nout, info->out_min, info->out_max);
    for (int i = 0; i < info->in_min; i++)
        if (!n->in[i])
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): required input %d is missing", kf_node_label(n),
                           n->op_type, i);
    return KF_OK;
}

/* Version of domain in an opset import list ("" and "ai.onnx" alike), 0 if
 * absent. */
static int64_t opset_in(const kf_opset *ops, int nops, const char *domain) {
    int def = !domain || !domain[0] || strcmp(domain, "ai.onnx") == 0;
    for (int i = 0; i < nops; i++) {
        const char *d = ops[i].domain ? ops[i].domain : "";
        int ddef = !d[0] || strcmp(d, "ai.onnx") == 0;
        if (def ? ddef : strcmp(d, domain) == 0) return ops[i].version;
    }
    return 0;
}

static kf_status check_bodies(const kf_node *n, const Onnx__NodeProto *np, const kf_opset *opsets, int nopsets,
                              const char *dir);

/* Adds the nodes of a graph or function body to g, whose inputs and
 * initializers already exist. opsets: the imports node versions come from. */
static kf_status nodes_from_proto(kf_graph *g, Onnx__NodeProto *const *nodes, size_t nnode, const kf_opset *opsets,
                                  int nopsets, const char *dir) {
    /* Pass 1 names every node output, so nodes may come in any order (the
     * spec asks for topological order; real files, ORT's own test models
     * among them, do not always keep it). A cycle is found by the
     * topological sort after import. */
    for (size_t i = 0; i < nnode; i++) {
        const Onnx__NodeProto *np = nodes[i];
        const char *nname = np->name && np->name[0] ? np->name : (np->op_type ? np->op_type : "?");
        for (size_t k = 0; k < np->n_output; k++) {
            const char *o = np->output[k];
            if (!o || !o[0]) continue;
            if (kf_graph_find(g, o))
                return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): output '%s' is already defined", nname,
                               np->op_type ? np->op_type : "?", o);
            kf_id v;
            KF_TRY(kf_graph_add_value(g, o, &v));
        }
    }
    for (size_t i = 0; i < nnode; i++) {
        const Onnx__NodeProto *np = nodes[i];
        const char *nname = np->name && np->name[0] ? np->name : (np->op_type ? np->op_type : "?");
        if (!np->op_type || !np->op_type[0]) return kf_fail(KF_ERR_BAD_MODEL, "node %zu ('%s') has no op_type", i, nname);
        if (np->n_input > INT_MAX / 2 || np->n_output > INT_MAX / 2)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' has too many inputs or outputs", nname);
        kf_id *ids = kf_calloc(np->n_input + np->n_output + 1, sizeof(kf_id));
        if (!ids) return kf_fail(KF_ERR_NOMEM, "out of memory");
        kf_status st = KF_OK;
        for (size_t k = 0; k < np->n_input && !st; k++) {
            const char *in = np->input[k];
            if (!in || !in[0]) continue;
            ids[k] = kf_graph_find(g, in);
            if (!ids[k])
                st = kf_fail(KF_ERR_BAD_MODEL,
                             "node '%s' (%s): input '%s' is not defined (no graph input, initializer or node output has that name)",
                             nname, np->op_type, in);
        }
        for (size_t k = 0; k < np->n_output && !st; k++) {
            const char *o = np->output[k];
            if (o && o[0]) ids[np->n_input + k] = kf_graph_find(g, o); /* named in pass 1 */
        }
        kf_id nid = 0;
        if (!st)
            st = kf_graph_add_node(g, np->op_type, np->domain, np->name, ids, (int)np->n_input, ids + np->n_input,
                                   (int)np->n_output, &nid);
        kf_free(ids);
        if (st) return st;
        kf_node *n = kf_node_at(g, nid);
        n->op = kf_op_lookup(n->domain, n->op_type);
        n->opset = opset_in(opsets, nopsets, n->domain);
        if (np->doc_string && !(n->doc = kf_strdup(np->doc_string))) return kf_fail(KF_ERR_NOMEM, "out of memory");
        KF_TRY(check_arity(n));
        if (np->n_attribute) {
            if (np->n_attribute > MAX_NODE_ATTRS)
                return kf_fail(KF_ERR_BAD_MODEL, "node '%s' has %zu attributes, more than %d", nname, np->n_attribute,
                               MAX_NODE_ATTRS);
            n->attrs = kf_calloc(np->n_attribute, sizeof(kf_attr));
            if (!n->attrs) return kf_fail(KF_ERR_NOMEM, "out of memory");
            for (size_t k = 0; k < np->n_attribute; k++) {
                KF_TRY(attr_from_proto(np->attribute[k], k, dir, nname, &n->attrs[k]));
                n->nattrs++;
                for (int j = 0; j < n->nattrs - 1; j++)
                    if (strcmp(n->attrs[j].name, n->attrs[k].name) == 0)
                        return kf_fail(KF_ERR_BAD_MODEL, "node '%s': attribute '%s' appears twice", nname, n->attrs[k].name);
            }
        }
        /* values of this graph that its subgraphs read count as its inputs */
        KF_TRY(kf_onnx_node_captures(g, nid, np));
        KF_TRY(check_bodies(kf_node_at(g, nid), np, opsets, nopsets, dir));
    }
    return KF_OK;
}

/* Reads graph gp into m->graph. steal: take initializer bytes over from gp
 * (the main graph, whose nodes and initializers are dropped after import).
 * outer[0..nouter): names gp reads from enclosing graphs (a control-flow
 * body); each becomes an extra graph input after gp's own inputs. */
static kf_status graph_from_proto(kf_model *m, const Onnx__GraphProto *gp, const char *dir, bool steal,
                                  const char *const *outer, uint32_t nouter) {
    kf_graph *g = m->graph;
    if ((gp->name && !(g->name = kf_strdup(gp->name))) || (gp->doc_string && !(g->doc = kf_strdup(gp->doc_string))))
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < gp->n_initializer; i++) {
        /* the IR takes the weight bytes over; drop_imported_bulk frees the rest */
        Onnx__TensorProto *tp = gp->initializer[i];
        if (!tp->name || !tp->name[0]) return kf_fail(KF_ERR_BAD_MODEL, "initializer %zu has no name", i);
        kf_id v;
        KF_TRY(kf_graph_add_value(g, tp->name, &v));
        kf_tensor *t = kf_tensor_new();
        if (!t) return kf_fail(KF_ERR_NOMEM, "out of memory");
        uint32_t file = 0;
        int64_t offset = 0;
        kf_status st = tensor_from_proto(tp, dir, t, steal, m, &file, &offset);
        if (st) {
            kf_tensor_free(t);
            return st;
        }
        kf_value *val = kf_value_at(g, v);
        val->init = t;
        val->ext_file = file;
        val->ext_offset = offset;
        kf_type_of_tensor(&val->type, t);
        if (tp->doc_string && !(val->doc = kf_strdup(tp->doc_string))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (!vi->name || !vi->name[0]) return kf_fail(KF_ERR_BAD_MODEL, "graph input %zu has no name", i);
        kf_id v = kf_graph_find(g, vi->name);
        if (v && kf_value_at(g, v)->is_input)
            return kf_fail(KF_ERR_BAD_MODEL, "graph input '%s' is listed twice", vi->name);
        KF_TRY(value_info_in(m, vi, "graph input", &v, true));
        KF_TRY(kf_graph_mark_input(g, v));
    }
    for (uint32_t i = 0; i < nouter; i++) {
        kf_id v;
        KF_TRY(kf_graph_add_value(g, outer[i], &v));
        KF_TRY(kf_graph_mark_input(g, v));
    }
    KF_TRY(nodes_from_proto(g, gp->node, gp->n_node, m->opsets, m->nopsets, dir));
    for (size_t i = 0; i < gp->n_output; i++) {
        const Onnx__ValueInfoProto *vi = gp->output[i];
        if (!vi->name || !vi->name[0]) return kf_fail(KF_ERR_BAD_MODEL, "graph output %zu has no name", i);
        kf_id v = kf_graph_find(g, vi->name);
        if (!v) return kf_fail(KF_ERR_BAD_MODEL, "graph output '%s' is not produced by any node", vi->name);
        /* an output listed twice stays listed twice (ORT accepts such files) */
        KF_TRY(value_info_in(m, vi, "graph output", &v, false));
        KF_TRY(kf_graph_mark_output(g, v));
    }
    for (size_t i = 0; i < gp->n_value_info; i++) {
        kf_id v;
        KF_TRY(value_info_in(m, gp->value_info[i], "value_info", &v, false));
        if (v) kf_value_at(g, v)->has_info = true;
    }
    return KF_OK;
}

/* ---- control-flow bodies -------------------------------------------------------- */

/* Reads body gp of an If, Loop or Scan node into b (see kf_body). */
static kf_status body_from_proto(const Onnx__GraphProto *gp, const kf_opset *opsets, int nopsets, const char *dir,
                                 kf_body *b) {
    memset(b, 0, sizeof *b);
    if (gp->n_input > INT_MAX / 2 || gp->n_output > INT_MAX / 2)
        return kf_fail(KF_ERR_BAD_MODEL, "body '%s' has too many inputs or outputs", gp->name ? gp->name : "");
    kf_model tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.opsets = (kf_opset *)opsets; /* read only; not freed */
    tmp.nopsets = nopsets;
    if (!(tmp.graph = kf_graph_new())) return kf_fail(KF_ERR_NOMEM, "out of memory");
    const char **outer = NULL;
    uint32_t nouter = 0;
    kf_status st = kf_onnx_outer_names(gp, &outer, &nouter);
    if (!st) st = graph_from_proto(&tmp, gp, dir, false, outer, nouter);
    kf_free(outer);
    if (!st) {
        kf_id *order;
        uint32_t n;
        if (!(st = kf_graph_topo(tmp.graph, &order, &n))) kf_free(order);
    }
    if (st) {
        kf_graph_free(tmp.graph);
        return st;
    }
    /* symbol ids index the body's own table; outside it they would name
     * other dims, so the body keeps the sizes and forgets the names */
    for (kf_id v = 1; v < tmp.graph->nvalues; v++)
        memset(tmp.graph->values[v].type.syms, 0, sizeof tmp.graph->values[v].type.syms);
    b->g = tmp.graph;
    b->nin = (int)gp->n_input;
    return KF_OK;
}

/* Load-time check of the bodies of an If, Loop or Scan node kfuse runs:
 * each is present, its input and output counts fit the node, and it loads
 * (nested bodies included). A body using something kfuse does not read
 * (complex initializers, say) still loads; running it reports why. */
static kf_status check_bodies(const kf_node *n, const Onnx__NodeProto *np, const kf_opset *opsets, int nopsets,
                              const char *dir) {
    const kf_op_info *info = kf_op_get(n->op);
    if (!info || !(info->flags & KF_F_SUBGRAPHS) || (n->opset && (n->opset < info->ver_lo || n->opset > info->ver_hi)))
        return KF_OK;
    const char *const *names = kf_control_bodies(n);
    for (int k = 0; names[k]; k++) {
        const Onnx__GraphProto *gp = NULL;
        int declared = 0;
        for (size_t i = 0; i < np->n_attribute; i++) {
            const Onnx__AttributeProto *ap = np->attribute[i];
            if (!ap->name || strcmp(ap->name, names[k])) continue;
            /* the declared type says which field is in use (attr_from_proto
             * reads that one): a graph under another type is not the body */
            declared = ap->has_type ? (int)ap->type : 0;
            gp = !declared || declared == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH ? ap->g : NULL;
        }
        if (!gp && declared && declared != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH) {
            static const char *const tn[] = {"UNDEFINED", "FLOAT", "INT", "STRING", "TENSOR", "GRAPH", "FLOATS", "INTS",
                                             "STRINGS", "TENSORS", "GRAPHS", "SPARSE_TENSOR", "SPARSE_TENSORS",
                                             "TYPE_PROTO", "TYPE_PROTOS"};
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' is declared %s, not GRAPH", kf_node_label(n),
                           n->op_type, names[k], declared > 0 && declared < 15 ? tn[declared] : "of an unknown type");
        }
        if (!gp)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): graph attribute '%s' is missing", kf_node_label(n),
                           n->op_type, names[k]);
        if (gp->n_input > INT_MAX / 2 || gp->n_output > INT_MAX / 2)
            return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): body '%s' has too many inputs or outputs",
                           kf_node_label(n), n->op_type, names[k]);
        KF_TRY(kf_control_check_body(n, names[k], (int)gp->n_input, (int)gp->n_output));
        kf_body b;
        kf_status st = body_from_proto(gp, opsets, nopsets, dir, &b);
        if (st == KF_ERR_UNSUPPORTED) {
            kf_clear_error();
            continue;
        }
        if (st) return kf_fail_context(st, "node '%s' (%s) attribute '%s'", kf_node_label(n), n->op_type, names[k]);
        kf_body_release(&b);
    }
    return KF_OK;
}

kf_status kf_onnx_node_body(const kf_node *n, const char *attr, const kf_opset *opsets, int nopsets, const char *dir,
                            kf_body *b) {
    memset(b, 0, sizeof *b);
    const kf_attr *a = kf_attr_find(n, attr);
    if (!a || a->type != KF_ATTR_GRAPH || !a->packed)
        return kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): graph attribute '%s' is missing", kf_node_label(n),
                       n->op_type, attr);
    pb_nomem = false;
    Onnx__AttributeProto *ap = onnx__attribute_proto__unpack(&pb_allocator, a->packed_len, a->packed);
    if (!ap)
        return pb_nomem ? kf_fail(KF_ERR_NOMEM, "out of memory")
                        : kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' cannot be decoded",
                                  kf_node_label(n), n->op_type, attr);
    kf_status st = KF_OK;
    if (!ap->g)
        st = kf_fail(KF_ERR_BAD_MODEL, "node '%s' (%s): attribute '%s' holds no graph", kf_node_label(n), n->op_type,
                     attr);
    else if ((st = body_from_proto(ap->g, opsets, nopsets, dir, b)))
        kf_fail_context(st, "node '%s' (%s) attribute '%s'", kf_node_label(n), n->op_type, attr);
    onnx__attribute_proto__free_unpacked(ap, &pb_allocator);
    return st;
}

kf_status kf_onnx_body_pack(const kf_model *bm, int nin, const char *attr, uint8_t **packed, size_t *len) {
    *packed = NULL;
    *len = 0;
    void *buf = NULL;
    size_t n = 0;
    KF_TRY(kf_model_save_memory(bm, &buf, &n));
    pb_nomem = false;
    Onnx__ModelProto *mp = onnx__model_proto__unpack(&pb_allocator, n, buf);
    kf_free(buf);
    if (!mp || !mp->graph) {
        if (mp) onnx__model_proto__free_unpacked(mp, &pb_allocator);
        return pb_nomem || mp ? kf_fail(KF_ERR_NOMEM, "out of memory") : kf_fail(KF_ERR_INTERNAL, "a body did not re-read");
    }
    Onnx__GraphProto *gp = mp->graph;
    /* the inputs past the formal ones are the names read from around the body */
    size_t all = gp->n_input;
    if (gp->n_input > (size_t)nin) gp->n_input = (size_t)nin;
    Onnx__AttributeProto ap;
    onnx__attribute_proto__init(&ap);
    ap.name = (char *)attr;
    ap.has_type = 1;
    ap.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH;
    ap.g = gp;
    *len = onnx__attribute_proto__get_packed_size(&ap);
    kf_status st = KF_OK;
    if (!(*packed = kf_malloc(*len + 1))) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    else onnx__attribute_proto__pack(&ap, *packed);
    gp->n_input = all; /* every input is freed */
    onnx__model_proto__free_unpacked(mp, &pb_allocator);
    return st;
}

void kf_body_release(kf_body *b) {
    kf_graph_free(b->g);
    memset(b, 0, sizeof *b);
}

/* ---- model-local functions --------------------------------------------------- */

/* Functions per model: real exporters write a handful (one per custom
 * layer); the (domain, name) lookup is linear, so a cap keeps a hostile file
 * from making import quadratic. */
#define MAX_FUNCTIONS 4096

kf_function *kf_function_new(const char *domain, const char *name) {
    kf_function *f = kf_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->name = kf_strdup(name ? name : "");
    f->domain = kf_strdup(domain ? domain : "");
    f->body = kf_graph_new();
    if (!f->name || !f->domain || !f->body) {
        kf_function_free(f);
        return NULL;
    }
    return f;
}

void kf_function_free(kf_function *f) {
    if (!f) return;
    kf_free(f->name);
    kf_free(f->domain);
    for (int i = 0; i < f->nattrs; i++) kf_free(f->attrs[i]);
    kf_free(f->attrs);
    for (int i = 0; i < f->nopsets; i++) kf_free(f->opsets[i].domain);
    kf_free(f->opsets);
    kf_graph_free(f->body);
    kf_free(f->doc);
    kf_free(f);
}

static bool same_domain(const char *a, const char *b) {
    a = a ? a : "";
    b = b ? b : "";
    if (!strcmp(a, "ai.onnx")) a = "";
    if (!strcmp(b, "ai.onnx")) b = "";
    return strcmp(a, b) == 0;
}

const kf_function *kf_model_function(const kf_model *m, const char *domain, const char *name) {
    if (!m || !name) return NULL;
    for (int i = 0; i < m->nfuncs; i++)
        if (!strcmp(m->funcs[i]->name, name) && same_domain(m->funcs[i]->domain, domain)) return m->funcs[i];
    return NULL;
}

kf_status kf_model_add_function(kf_model *m, kf_function *f) {
    if (kf_model_function(m, f->domain, f->name)) {
        kf_status st = kf_fail(KF_ERR_BAD_MODEL, "function '%s%s%s' is defined twice", f->domain,
                               f->domain[0] ? "::" : "", f->name);
        kf_function_free(f);
        return st;
    }
    if (m->nfuncs >= MAX_FUNCTIONS) {
        kf_function_free(f);
        return kf_fail(KF_ERR_BAD_MODEL, "more than %d model-local functions", MAX_FUNCTIONS);
    }
    kf_function **nf = kf_realloc(m->funcs, sizeof(kf_function *) * (size_t)(m->nfuncs + 1));
    if (!nf) {
        kf_function_free(f);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    m->funcs = nf;
    m->funcs[m->nfuncs++] = f;
    return KF_OK;
}

int64_t kf_function_opset(const kf_function *f, const char *domain) {
    return opset_in(f->opsets, f->nopsets, domain);
}

kf_status kf_model_set_opset(kf_model *m, const char *domain, int64_t version) {
    for (int i = 0; i < m->nopsets; i++)
        if (same_domain(m->opsets[i].domain, domain)) {
            m->opsets[i].version = version;
            return KF_OK;
        }
    kf_opset *no = kf_realloc(m->opsets, sizeof(kf_opset) * (size_t)(m->nopsets + 1));
    if (!no) return kf_fail(KF_ERR_NOMEM, "out of memory");
    m->opsets = no;
    if (!(no[m->nopsets].domain = kf_strdup(domain ? domain : ""))) return kf_fail(KF_ERR_NOMEM, "out of memory");
    no[m->nopsets++].version = version;
    return KF_OK;
}

/* Reads one FunctionProto into a kf_function added to m. */
static kf_status function_from_proto(kf_model *m, const Onnx__FunctionProto *fp, const char *dir) {
    if (!fp->name || !fp->name[0]) return kf_fail(KF_ERR_BAD_MODEL, "a model-local function has no name");
    const char *fname = fp->name;
    kf_function *f = kf_function_new(fp->domain, fp->name);
    if (!f) return kf_fail(KF_ERR_NOMEM, "out of memory");
    f->proto = fp;
    kf_status st = KF_OK;
    kf_graph *g = f->body;
    if (fp->doc_string && !(f->doc = kf_strdup(fp->doc_string))) goto nomem;
    if (fp->n_opset_import > 1024 || fp->n_attribute > MAX_NODE_ATTRS) {
        st = kf_fail(KF_ERR_BAD_MODEL, "function '%s': too many opset imports or attributes", fname);
        goto fail;
    }
    if (fp->n_opset_import && !(f->opsets = kf_calloc(fp->n_opset_import, sizeof(kf_opset)))) goto nomem;
    for (size_t i = 0; i < fp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *op = fp->opset_import[i];
        if (!(f->opsets[i].domain = kf_strdup(op->domain ? op->domain : ""))) goto nomem;
        f->opsets[i].version = op->version;
        f->nopsets++;
    }
    if (fp->n_attribute && !(f->attrs = kf_calloc(fp->n_attribute, sizeof(char *)))) goto nomem;
    for (size_t i = 0; i < fp->n_attribute; i++) {
        if (!(f->attrs[i] = kf_strdup(fp->attribute[i] ? fp->attribute[i] : ""))) goto nomem;
        f->nattrs++;
    }
    for (size_t i = 0; i < fp->n_input; i++) {
        const char *in = fp->input[i];
        kf_id v;
        if (!in || !in[0] || kf_graph_find(g, in)) {
            st = kf_fail(KF_ERR_BAD_MODEL, "function '%s': input %zu ('%s') is empty or repeated", fname, i,
                         in ? in : "");
            goto fail;
        }
        if ((st = kf_graph_add_value(g, in, &v)) || (st = kf_graph_mark_input(g, v))) goto fail;
    }
    if ((st = nodes_from_proto(g, fp->node, fp->n_node, f->opsets, f->nopsets, dir))) goto fail;
    for (size_t i = 0; i < fp->n_output; i++) {
        const char *o = fp->output[i];
        kf_id v = o ? kf_graph_find(g, o) : 0;
        if (!v) {
            st = kf_fail(KF_ERR_BAD_MODEL, "function '%s': output '%s' is not computed by its body", fname,
                         o ? o : "");
            goto fail;
        }
        if ((st = kf_graph_mark_output(g, v))) goto fail;
    }
    {
        kf_id *order;
        uint32_t n;
        if ((st = kf_graph_topo(g, &order, &n))) goto fail;
        kf_free(order);
    }
    return kf_model_add_function(m, f);
nomem:
    st = kf_fail(KF_ERR_NOMEM, "out of memory");
fail:
    kf_fail_context(st, "function '%s'", fname);
    kf_function_free(f);
    return st;
}

void kf_model_free(kf_model *m) {
    if (!m) return;
    for (int i = 0; i < m->nfuncs; i++) kf_function_free(m->funcs[i]);
    kf_free(m->funcs);
    kf_graph_free(m->graph);
    kf_extdata_release(m); /* after the graph: its tensors point into the mappings */
    for (int i = 0; i < m->nopsets; i++) kf_free(m->opsets[i].domain);
    kf_free(m->opsets);
    kf_free(m->dir);
    pb_arena *a = m->proto_arena;
    if (m->proto) onnx__model_proto__free_unpacked(m->proto, a ? &a->alloc : &pb_allocator);
    arena_delete(a);
    kf_free(m);
}

/* The IR now owns nodes and initializers; export rebuilds them from the IR.
 * Freeing them from the kept ModelProto stops a model costing twice its
 * weights in memory (the arena gives a block back once nothing in it is
 * live). */
static void drop_imported_bulk(Onnx__ModelProto *mp, pb_arena *a) {
    Onnx__GraphProto *gp = mp->graph;
    for (size_t i = 0; i < gp->n_initializer; i++) onnx__tensor_proto__free_unpacked(gp->initializer[i], &a->alloc);
    for (size_t i = 0; i < gp->n_node; i++) onnx__node_proto__free_unpacked(gp->node[i], &a->alloc);
    arena_free(a, gp->initializer);
    arena_free(a, gp->node);
    gp->initializer = NULL;
    gp->node = NULL;
    gp->n_initializer = gp->n_node = 0;
}

kf_status kf_onnx_parse(const void *data, size_t len, const char *dir, const char *what, kf_model **out) {
    *out = NULL;
    if (!what) what = "model";
    KF_TRY(kf_proto_check_depth(data, len, what));
    pb_arena *a = arena_new();
    if (!a) return kf_fail(KF_ERR_NOMEM, "out of memory");
    pb_nomem = false;
    Onnx__ModelProto *mp = onnx__model_proto__unpack(&a->alloc, len, data);
    if (!mp) {
        arena_delete(a);
        if (pb_nomem) return kf_fail(KF_ERR_NOMEM, "%s: out of memory decoding the model", what);
        return kf_fail(KF_ERR_BAD_MODEL, "%s: not a valid ONNX model (protobuf decoding failed)", what);
    }
    kf_model *m = kf_calloc(1, sizeof *m);
    if (!m) {
        onnx__model_proto__free_unpacked(mp, &a->alloc);
        arena_delete(a);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    m->proto = mp;
    m->proto_arena = a;
    m->ir_version = mp->ir_version;
    kf_status st = KF_OK;
    if (!mp->graph) {
        st = kf_fail(KF_ERR_BAD_MODEL, "%s: model has no graph", what);
        goto fail;
    }
    if (!(m->graph = kf_graph_new()) || (dir && !(m->dir = kf_strdup(dir)))) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (mp->n_opset_import > 1024) {
        st = kf_fail(KF_ERR_BAD_MODEL, "%s: too many opset imports", what);
        goto fail;
    }
    m->opsets = kf_calloc(mp->n_opset_import, sizeof(kf_opset));
    if (!m->opsets) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *op = mp->opset_import[i];
        if (!(m->opsets[i].domain = kf_strdup(op->domain ? op->domain : ""))) {
            st = kf_fail(KF_ERR_NOMEM, "out of memory");
            goto fail;
        }
        m->opsets[i].version = op->version;
        m->nopsets++;
        if (op->version < 1) {
            st = kf_fail(KF_ERR_BAD_MODEL, "%s: opset import '%s' has version %lld", what, m->opsets[i].domain,
                         (long long)op->version);
            goto fail;
        }
    }
    if (mp->n_functions > MAX_FUNCTIONS) {
        st = kf_fail(KF_ERR_BAD_MODEL, "%s: more than %d model-local functions", what, MAX_FUNCTIONS);
        goto fail;
    }
    for (size_t i = 0; i < mp->n_functions; i++)
        if ((st = function_from_proto(m, mp->functions[i], dir))) {
            kf_fail_context(st, "%s", what);
            goto fail;
        }
    if ((st = graph_from_proto(m, mp->graph, dir, true, NULL, 0))) {
        kf_fail_context(st, "%s", what);
        goto fail;
    }
    {
        kf_id *order;
        uint32_t n;
        if ((st = kf_graph_topo(m->graph, &order, &n))) {
            kf_fail_context(st, "%s", what);
            goto fail;
        }
        kf_free(order);
    }
    drop_imported_bulk(mp, a);
    *out = m;
    return KF_OK;
fail:
    kf_model_free(m);
    return st;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return kf_strdup(".");
    if (slash == path) return kf_strdup("/");
    return kf_strndup(path, (size_t)(slash - path));
}

/* Maps a model file read-only, so protobuf-c copies each field (weights
 * included) once, out of the page cache, instead of out of a private copy of
 * the whole file: on BERT-base this takes load from about 2.0 s to 1.3 s
 * (bench/RESULTS.md, rewrite speed). NULL when the file cannot be mapped
 * (not a regular file, empty, too large, mmap refused); the caller then
 * reads it, and kf_read_file reports what is wrong. Like every mmap reader,
 * a file truncated by another process while it loads raises SIGBUS. */
static void *map_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* O_NONBLOCK: opening a FIFO must not block */
    if (fd < 0) return NULL;
    struct stat sb;
    void *p = NULL;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 && sb.st_size <= KF_MAX_FILE_BYTES) {
        p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            p = NULL;
        } else {
            *len = (size_t)sb.st_size;
            posix_madvise(p, *len, POSIX_MADV_SEQUENTIAL); /* only a hint: its result does not matter */
        }
    }
    close(fd);
    return p;
}

kf_status kf_model_load(const char *path, kf_model **out) {
    if (!path || !out) return kf_fail(KF_ERR_INVALID_ARG, "kf_model_load: NULL argument");
    *out = NULL;
    size_t len = 0;
    uint8_t *data = map_file(path, &len);
    if (data) {
        char *dir = dir_of(path);
        kf_status st = dir ? kf_onnx_parse(data, len, dir, path, out) : kf_fail(KF_ERR_NOMEM, "out of memory");
        kf_free(dir);
        munmap(data, len);
        return st;
    }
    KF_TRY(kf_read_file(path, &data, &len));
    char *dir = dir_of(path);
    if (!dir) {
        kf_free(data);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    kf_status st = kf_onnx_parse(data, len, dir, path, out);
    kf_free(dir);
    kf_free(data);
    return st;
}

kf_status kf_model_load_memory(const void *data, size_t len, const char *base_dir, kf_model **out) {
    if (!data || !out) return kf_fail(KF_ERR_INVALID_ARG, "kf_model_load_memory: NULL argument");
    return kf_onnx_parse(data, len, base_dir, "model", out);
}

kf_status kf_onnx_read_tensor_file(const char *path, kf_tensor *t, char **name) {
    uint8_t *data;
    size_t len;
    if (name) *name = NULL;
    KF_TRY(kf_read_file(path, &data, &len));
    kf_status st = check_proto(&onnx__tensor_proto__descriptor, data, len, path);
    if (st) {
        kf_free(data);
        return st;
    }
    pb_nomem = false;
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(&pb_allocator, len, data);
    kf_free(data);
    if (!tp && pb_nomem) return kf_fail(KF_ERR_NOMEM, "%s: out of memory decoding the tensor", path);
    if (!tp) return kf_fail(KF_ERR_BAD_MODEL, "%s: not a valid TensorProto", path);
    char *dir = dir_of(path); /* failing, external data would be "without a model folder" */
    st = dir ? tensor_from_proto(tp, dir, t, true, NULL, NULL, NULL) : kf_fail(KF_ERR_NOMEM, "out of memory");
    kf_free(dir);
    if (!st && name && tp->name && !(*name = kf_strdup(tp->name))) {
        kf_tensor_release(t); /* a failed read returns nothing */
        st = kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    onnx__tensor_proto__free_unpacked(tp, &pb_allocator);
    if (st) kf_fail_context(st, "%s", path);
    return st;
}

/* ---- export ------------------------------------------------------------------------- */

/* Every allocation of one export lives in this arena and is freed at once. */
typedef struct arena {
    void **ptrs;
    uint32_t n, cap;
    bool failed;
    kf_status err; /* why, when it is not out of memory (message already set) */
} arena;

static void *aalloc(arena *a, size_t size) {
    if (a->failed) return NULL;
    void *p = kf_calloc(1, size);
    if (!p || kf_grow((void **)&a->ptrs, &a->cap, a->n + 1, sizeof(void *))) {
        kf_free(p);
        a->failed = true;
        return NULL;
    }
    a->ptrs[a->n++] = p;
    return p;
}

static void afree(arena *a) {
    for (uint32_t i = 0; i < a->n; i++) kf_free(a->ptrs[i]);
    kf_free(a->ptrs);
}

static char *astr(arena *a, const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *r = aalloc(a, n + 1);
    if (r) memcpy(r, s, n + 1);
    return r;
}

static Onnx__TensorProto *tensor_to_proto(arena *a, const kf_tensor *t, const char *name) {
    Onnx__TensorProto *tp = aalloc(a, sizeof *tp);
    if (!tp) return NULL;
    onnx__tensor_proto__init(tp);
    tp->name = astr(a, name);
    tp->has_data_type = 1;
    tp->data_type = t->dtype;
    tp->n_dims = (size_t)t->rank;
    tp->dims = aalloc(a, sizeof(int64_t) * (size_t)(t->rank + 1));
    if (!tp->dims) return NULL;
    for (int i = 0; i < t->rank; i++) tp->dims[i] = t->dims[i];
    if (t->dtype == KF_DT_STRING) {
        tp->n_string_data = (size_t)t->numel;
        tp->string_data = aalloc(a, sizeof(ProtobufCBinaryData) * (size_t)(t->numel + 1));
        if (!tp->string_data) return NULL;
        for (int64_t i = 0; i < t->numel; i++) {
            const kf_bytes *s = &((const kf_bytes *)t->data)[i];
            tp->string_data[i].data = (uint8_t *)s->ptr;
            tp->string_data[i].len = s->len;
        }
    } else {
        tp->has_raw_data = 1;
        /* a deferred tensor (kf_tensor.h) stands for its bytes by its parts
         * pointer, which the file sink recognises and writes part by part */
        tp->raw_data.data = t->parts ? (uint8_t *)t->parts : t->data;
        tp->raw_data.len = (size_t)t->numel * kf_dtype_size(t->dtype);
        size_t fbytes = kf_dtype_packed_bytes(t->dtype, t->numel);
        if (fbytes != tp->raw_data.len) { /* sub-byte types are packed in files */
            uint8_t *buf = aalloc(a, fbytes + 1);
            if (!buf) return NULL;
            kf_pack_small(t->dtype, t->data, t->numel, buf);
            tp->raw_data.data = buf;
            tp->raw_data.len = fbytes;
        }
    }
    return tp;
}

static Onnx__TypeProto *type_to_proto(arena *a, const kf_graph *g, const kf_type *ty) {
    Onnx__TypeProto *tp = aalloc(a, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = aalloc(a, sizeof *tt);
    if (!tp || !tt) return NULL;
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    tt->has_elem_type = 1;
    tt->elem_type = ty->dtype;
    if (ty->rank >= 0) {
        Onnx__TensorShapeProto *sp = aalloc(a, sizeof *sp);
        if (!sp) return NULL;
        onnx__tensor_shape_proto__init(sp);
        sp->n_dim = (size_t)ty->rank;
        sp->dim = aalloc(a, sizeof(void *) * (size_t)(ty->rank + 1));
        if (!sp->dim) return NULL;
        for (int i = 0; i < ty->rank; i++) {
            Onnx__TensorShapeProto__Dimension *d = aalloc(a, sizeof *d);
            if (!d) return NULL;
            onnx__tensor_shape_proto__dimension__init(d);
            if (ty->dims[i] >= 0) {
                d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
                d->dim_value = ty->dims[i];
            } else if (ty->syms[i] && ty->syms[i] < g->nsyms) {
                d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
                d->dim_param = g->syms[ty->syms[i]];
            }
            sp->dim[i] = d;
        }
        tt->shape = sp;
    }
    return tp;
}

/* The file's own ValueInfoProto for a name, when the IR type is not a tensor
 * type kfuse understands (sequences, maps, optionals): written back as read. */
static const Onnx__ValueInfoProto *orig_info(const kf_model *m, const char *name) {
    const Onnx__ModelProto *mp = m->proto;
    if (!mp || !mp->graph) return NULL;
    const Onnx__GraphProto *gp = mp->graph;
    const size_t counts[3] = {gp->n_input, gp->n_output, gp->n_value_info};
    Onnx__ValueInfoProto **lists[3] = {gp->input, gp->output, gp->value_info};
    for (int l = 0; l < 3; l++)
        for (size_t i = 0; i < counts[l]; i++)
            if (lists[l][i]->name && strcmp(lists[l][i]->name, name) == 0) return lists[l][i];
    return NULL;
}

static Onnx__ValueInfoProto *info_to_proto(arena *a, const kf_model *m, kf_id v) {
    const kf_value *val = kf_value_at(m->graph, v);
    Onnx__ValueInfoProto *vi = aalloc(a, sizeof *vi);
    if (!vi) return NULL;
    onnx__value_info_proto__init(vi);
    vi->name = val->name;
    vi->doc_string = val->doc;
    const Onnx__ValueInfoProto *o = orig_info(m, val->name);
    if (val->type.dtype) vi->type = type_to_proto(a, m->graph, &val->type);
    else if (o) vi->type = o->type;
    return vi;
}

static Onnx__AttributeProto *attr_to_proto(arena *a, const kf_attr *at, Onnx__AttributeProto ***unpacked,
                                           uint32_t *nunpacked, uint32_t *capunpacked) {
    if (at->packed) {
        Onnx__AttributeProto *ap = onnx__attribute_proto__unpack(&pb_allocator, at->packed_len, at->packed);
        if (!ap || kf_grow((void **)unpacked, capunpacked, *nunpacked + 1, sizeof(void *))) {
            if (ap) onnx__attribute_proto__free_unpacked(ap, &pb_allocator);
            a->failed = true;
            return NULL;
        }
        (*unpacked)[(*nunpacked)++] = ap;
        return ap;
    }
    Onnx__AttributeProto *ap = aalloc(a, sizeof *ap);
    if (!ap) return NULL;
    onnx__attribute_proto__init(ap);
    ap->name = at->name;
    ap->ref_attr_name = at->ref_attr_name;
    ap->doc_string = at->doc;
    ap->has_type = 1;
    ap->type = (Onnx__AttributeProto__AttributeType)at->type;
    switch (at->type) {
    case KF_ATTR_FLOAT: ap->has_f = 1; ap->f = at->f; break;
    case KF_ATTR_INT: ap->has_i = 1; ap->i = at->i; break;
    case KF_ATTR_STRING:
        ap->has_s = 1;
        ap->s.data = (uint8_t *)at->s.ptr;
        ap->s.len = at->s.len;
        break;
    case KF_ATTR_TENSOR: ap->t = tensor_to_proto(a, at->t, NULL); break;
    case KF_ATTR_FLOATS: ap->n_floats = (size_t)at->n; ap->floats = at->floats; break;
    case KF_ATTR_INTS: ap->n_ints = (size_t)at->n; ap->ints = at->ints; break;
    case KF_ATTR_STRINGS:
        ap->n_strings = (size_t)at->n;
        ap->strings = aalloc(a, sizeof(ProtobufCBinaryData) * (size_t)(at->n + 1));
        if (!ap->strings) return NULL;
        for (int i = 0; i < at->n; i++) {
            ap->strings[i].data = (uint8_t *)at->strings[i].ptr;
            ap->strings[i].len = at->strings[i].len;
        }
        break;
    default: break;
    }
    return ap;
}

/* A rewrite may have redirected a captured slot of n (CSE, folding, no-op
 * removal: kf_graph_replace_uses) to a value with another name; the bodies
 * in np's unpacked attributes then name the new value. */
static void rename_captures(arena *a, const kf_graph *g, const kf_node *n, Onnx__NodeProto *np) {
    const char **from = aalloc(a, sizeof(char *) * (size_t)(n->ncap + 1));
    const char **to = aalloc(a, sizeof(char *) * (size_t)(n->ncap + 1));
    if (!from || !to) return;
    int nr = 0;
    for (int k = 0; k < n->ncap; k++) {
        kf_id v = n->in[n->nin - n->ncap + k];
        const char *now = v ? g->values[v].name : "";
        if (strcmp(now, n->capname[k])) {
            from[nr] = n->capname[k];
            to[nr++] = now;
        }
    }
    for (int i = 0; nr && i < n->nattrs; i++) {
        if (n->attrs[i].type != KF_ATTR_GRAPH && n->attrs[i].type != KF_ATTR_GRAPHS) continue;
        kf_status st = kf_onnx_rename_captures(np->attribute[i], from, to, nr, kf_node_label(n));
        if (st) {
            a->err = st;
            a->failed = true;
            return;
        }
    }
}

/* Node names must be unique for ONNX Runtime; rewrites may repeat one.
 * Returns name, or "name__k" (arena) when an earlier node took it.
 * `seen` is an open-addressing set of names (cap a power of two). */
static const char *unique_node_name(arena *a, const char **seen, uint32_t cap, const char *name) {
    char buf[600];
    const char *cand = name;
    for (uint32_t k = 1;; k++) {
        uint32_t h = 2166136261u;
        for (const char *p = cand; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
        uint32_t i = h & (cap - 1);
        bool taken = false;
        while (seen[i]) {
            if (!strcmp(seen[i], cand)) {
                taken = true;
                break;
            }
            i = (i + 1) & (cap - 1);
        }
        if (!taken) {
            seen[i] = cand;
            return cand;
        }
        snprintf(buf, sizeof buf, "%.560s__%u", name, k);
        cand = astr(a, buf);
        if (!cand) return name;
    }
}

/* The NodeProto of node n of graph g (names point into g); seen/seencap:
 * the names given so far in this graph (see unique_node_name). */
static Onnx__NodeProto *node_to_proto(arena *a, const kf_graph *g, const kf_node *n, const char **seen,
                                      uint32_t seencap, Onnx__AttributeProto ***unpacked, uint32_t *nunpacked,
                                      uint32_t *capunpacked) {
    Onnx__NodeProto *np = aalloc(a, sizeof *np);
    if (!np) return NULL;
    onnx__node_proto__init(np);
    np->name = n->name && n->name[0] && seen ? (char *)unique_node_name(a, seen, seencap, n->name) : NULL;
    np->op_type = n->op_type;
    np->domain = n->domain && n->domain[0] ? n->domain : NULL;
    np->doc_string = n->doc;
    int nin = kf_node_onnx_nin(n); /* captured values stay named inside the bodies */
    np->n_input = (size_t)nin;
    np->input = aalloc(a, sizeof(char *) * (size_t)(nin + 1));
    np->n_output = (size_t)n->nout;
    np->output = aalloc(a, sizeof(char *) * (size_t)(n->nout + 1));
    if (!np->input || !np->output) return NULL;
    for (int i = 0; i < nin; i++) np->input[i] = n->in[i] ? g->values[n->in[i]].name : "";
    for (int j = 0; j < n->nout; j++) np->output[j] = n->out[j] ? g->values[n->out[j]].name : "";
    np->n_attribute = (size_t)n->nattrs;
    np->attribute = aalloc(a, sizeof(void *) * (size_t)(n->nattrs + 1));
    for (int i = 0; np->attribute && i < n->nattrs; i++)
        np->attribute[i] = attr_to_proto(a, &n->attrs[i], unpacked, nunpacked, capunpacked);
    if (np->attribute && n->ncap && !a->failed) rename_captures(a, g, n, np);
    return np;
}

static Onnx__OperatorSetIdProto **opsets_to_proto(arena *a, const kf_opset *ops, int n) {
    Onnx__OperatorSetIdProto **r = aalloc(a, sizeof(void *) * (size_t)(n + 1));
    for (int i = 0; r && i < n; i++) {
        Onnx__OperatorSetIdProto *op = aalloc(a, sizeof *op);
        if (!op) return NULL;
        onnx__operator_set_id_proto__init(op);
        op->domain = ops[i].domain;
        op->has_version = 1;
        op->version = ops[i].version;
        r[i] = op;
    }
    return r;
}

/* The FunctionProto of f: the IR's name, parameters, imports and body (in
 * topological order), over a copy of the proto it was read from so fields
 * the IR does not model travel unchanged. */
static Onnx__FunctionProto *function_to_proto(arena *a, const kf_function *f, Onnx__AttributeProto ***unpacked,
                                              uint32_t *nunpacked, uint32_t *capunpacked, kf_status *st) {
    Onnx__FunctionProto *fp = aalloc(a, sizeof *fp);
    if (!fp) return NULL;
    onnx__function_proto__init(fp);
    if (f->proto) *fp = *(const Onnx__FunctionProto *)f->proto;
    const kf_graph *g = f->body;
    fp->name = f->name;
    fp->domain = f->domain[0] ? f->domain : NULL;
    fp->doc_string = f->doc;
    fp->n_input = g->ninputs;
    fp->input = aalloc(a, sizeof(char *) * (g->ninputs + 1));
    for (uint32_t i = 0; fp->input && i < g->ninputs; i++) fp->input[i] = g->values[g->inputs[i]].name;
    fp->n_output = g->noutputs;
    fp->output = aalloc(a, sizeof(char *) * (g->noutputs + 1));
    for (uint32_t i = 0; fp->output && i < g->noutputs; i++) fp->output[i] = g->values[g->outputs[i]].name;
    fp->n_attribute = (size_t)f->nattrs;
    fp->attribute = f->attrs;
    fp->n_opset_import = (size_t)f->nopsets;
    fp->opset_import = opsets_to_proto(a, f->opsets, f->nopsets);
    kf_id *order = NULL;
    uint32_t norder = 0;
    if ((*st = kf_graph_topo(g, &order, &norder))) {
        kf_fail_context(*st, "function '%s'", f->name);
        return NULL;
    }
    fp->n_node = norder;
    fp->node = aalloc(a, sizeof(void *) * (norder + 1));
    uint32_t seencap = 16;
    while (seencap < 2 * norder + 2) seencap *= 2;
    const char **seen = aalloc(a, sizeof(char *) * seencap);
    for (uint32_t k = 0; fp->node && k < norder; k++)
        fp->node[k] = node_to_proto(a, g, kf_node_at(g, order[k]), seen, seencap, unpacked, nunpacked, capunpacked);
    kf_free(order);
    return fp;
}

/* Streams packed bytes into a FILE (stdio buffers them), so saving a model
 * never holds a second copy of its weights in memory. */
typedef struct file_sink {
    ProtobufCBuffer base;
    FILE *f;
    bool failed;
    /* external data: tensors of at least KF_EXTERNAL_MIN_TENSOR bytes go to
     * ext (file name ext_location beside the model) instead of the model */
    FILE *ext;
    const char *ext_location;
    int64_t ext_off;
    /* initializers that still hold their input file's bytes refer to that
     * file (share: the output sits in the input's folder) or have the
     * bytes copied file to file into ext (kf_extdata.h) */
    bool share;
    /* deferred tensors written inline: raw_data.data is their parts
     * pointer; none is shorter than deferred_min bytes */
    const kf_tensor **deferred;
    uint32_t ndeferred;
    size_t deferred_min;
} file_sink;

/* ---- writing deferred tensors: their runs go to the file through writev,
 * so the assembled bytes never exist in memory. */
#define KF_WRITE_IOVS 256

typedef struct run_writer {
    int fd;
    struct iovec iov[KF_WRITE_IOVS];
    int n;
    bool ok;
} run_writer;

static bool flush_runs(run_writer *w) {
    struct iovec *v = w->iov;
    int n = w->n;
    while (n > 0 && w->ok) {
        ssize_t done = writev(w->fd, v, n);
        if (done < 0 && errno == EINTR) continue;
        if (done <= 0) {
            w->ok = false;
            break;
        }
        while (n > 0 && (size_t)done >= v->iov_len) {
            done -= (ssize_t)v->iov_len;
            v++;
            n--;
        }
        if (n > 0) {
            v->iov_base = (char *)v->iov_base + done;
            v->iov_len -= (size_t)done;
        }
    }
    w->n = 0;
    return w->ok;
}

static bool add_run(void *ctx, const void *p, size_t len) {
    run_writer *w = ctx;
    w->iov[w->n].iov_base = (void *)p;
    w->iov[w->n].iov_len = len;
    return ++w->n < KF_WRITE_IOVS || flush_runs(w);
}

/* Writes deferred tensor t's bytes at f's position and leaves f after them. */
static bool write_deferred(FILE *f, const kf_tensor *t) {
    off_t at;
    if (fflush(f) != 0 || (at = ftello(f)) < 0) return false;
    run_writer w = {.fd = fileno(f), .ok = true};
    if (!kf_tensor_visit_bytes(t, add_run, &w) || !flush_runs(&w)) return false;
    return fseeko(f, at + (off_t)((size_t)t->numel * kf_dtype_size(t->dtype)), SEEK_SET) == 0;
}

/* Protobuf messages cannot exceed 2 GiB; a model whose initializers pass
 * this total keeps its weights in a separate file (ONNX external data),
 * leaving room for the graph itself. KFUSE_EXTERNAL_DATA=1 forces it. */
#define KF_EXTERNAL_TOTAL ((int64_t)7 << 28) /* 1.75 GiB */
/* Smaller tensors stay inline: scalars and shapes are read with the graph. */
#define KF_EXTERNAL_MIN_TENSOR 1024
/* Offsets in the data file are aligned so a reader may map tensors. */
#define KF_EXTERNAL_ALIGN 64

/* Makes tp name bytes [off, off + len) of file location as its data. */
static bool set_external(arena *a, Onnx__TensorProto *tp, const char *location, int64_t off, size_t len) {
    Onnx__StringStringEntryProto **kv = aalloc(a, 3 * sizeof *kv);
    char num[2][32];
    snprintf(num[0], sizeof num[0], "%lld", (long long)off);
    snprintf(num[1], sizeof num[1], "%zu", len);
    const char *keys[3] = {"location", "offset", "length"};
    const char *vals[3] = {location, num[0], num[1]};
    for (int i = 0; kv && i < 3; i++) {
        if (!(kv[i] = aalloc(a, sizeof *kv[i]))) return false;
        onnx__string_string_entry_proto__init(kv[i]);
        kv[i]->key = astr(a, keys[i]);
        kv[i]->value = astr(a, vals[i]);
    }
    if (!kv) return false;
    tp->has_raw_data = 0;
    tp->raw_data.data = NULL;
    tp->raw_data.len = 0;
    tp->n_external_data = 3;
    tp->external_data = kv;
    tp->has_data_location = 1;
    tp->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    return true;
}

/* Pads the sink's data file with zeros up to offset to. */
static bool pad_external(file_sink *sink, int64_t to) {
    for (; sink->ext_off < to; sink->ext_off++)
        if (fputc(0, sink->ext) == EOF) return false;
    return true;
}

/* Moves initializer tp's raw bytes (those of t) to the sink's external file. */
static bool to_external(arena *a, file_sink *sink, Onnx__TensorProto *tp, const kf_tensor *t) {
    size_t len = tp->raw_data.len;
    if (!pad_external(sink, (sink->ext_off + KF_EXTERNAL_ALIGN - 1) / KF_EXTERNAL_ALIGN * KF_EXTERNAL_ALIGN))
        return false;
    if (t->parts ? !write_deferred(sink->ext, t) : fwrite(tp->raw_data.data, 1, len, sink->ext) != len) return false;
    if (!set_external(a, tp, sink->ext_location, sink->ext_off, len)) return false;
    sink->ext_off += (int64_t)len;
    return true;
}

/* Tensors from this size on keep their offset within a page when copied, so
 * a filesystem that shares blocks can clone them instead of copying. */
#define KF_EXTERNAL_CLONE_MIN ((size_t)64 << 10)
#define KF_EXTERNAL_PAGE 4096

/* Initializer tp holds, unchanged, bytes [off, + len) of input file e: it
 * names them where they are (share) or has them copied, file to file, to
 * the sink's data file. */
static kf_status to_kept(arena *a, file_sink *sink, Onnx__TensorProto *tp, const kf_extfile *e, int64_t off,
                         const char *tname) {
    size_t len = tp->raw_data.len;
    if (sink->share) {
        if (!set_external(a, tp, e->location, off, len)) return kf_fail(KF_ERR_NOMEM, "out of memory");
        return KF_OK;
    }
    int64_t at = (sink->ext_off + KF_EXTERNAL_ALIGN - 1) / KF_EXTERNAL_ALIGN * KF_EXTERNAL_ALIGN;
    if (len >= KF_EXTERNAL_CLONE_MIN)
        at = sink->ext_off + ((off - sink->ext_off) % KF_EXTERNAL_PAGE + KF_EXTERNAL_PAGE) % KF_EXTERNAL_PAGE;
    if (!pad_external(sink, at) || fflush(sink->ext) != 0)
        return kf_fail(KF_ERR_IO, "cannot write external data for tensor '%s'", tname);
    KF_TRY(kf_extdata_copy(e, off, len, fileno(sink->ext), at));
    sink->ext_off = at + (int64_t)len;
    if (fseeko(sink->ext, (off_t)sink->ext_off, SEEK_SET) != 0)
        return kf_fail(KF_ERR_IO, "cannot write external data for tensor '%s'", tname);
    if (!set_external(a, tp, sink->ext_location, at, len)) return kf_fail(KF_ERR_NOMEM, "out of memory");
    return KF_OK;
}

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data) {
    file_sink *s = (file_sink *)b;
    if (s->failed || !len) return;
    for (uint32_t i = 0; len >= s->deferred_min && i < s->ndeferred; i++)
        if (data == (const uint8_t *)s->deferred[i]->parts) {
            if (!write_deferred(s->f, s->deferred[i])) s->failed = true;
            return;
        }
    if (fwrite(data, 1, len, s->f) != len) s->failed = true;
}

/* Builds the ModelProto of m and packs it either into a malloc'ed buffer
 * (*data, *len) or, when sink is given, into that file. */
static kf_status save_impl(const kf_model *m, file_sink *sink, void **data, size_t *len);

kf_status kf_model_save_memory(const kf_model *m, void **data, size_t *len) {
    if (!m || !data || !len) return kf_fail(KF_ERR_INVALID_ARG, "kf_model_save_memory: NULL argument");
    return save_impl(m, NULL, data, len);
}

static kf_status save_impl(const kf_model *m, file_sink *sink, void **data, size_t *len) {
    const kf_graph *g = m->graph;
    const Onnx__ModelProto *orig = m->proto;
    arena a = {0};
    Onnx__AttributeProto **unpacked = NULL;
    uint32_t nunpacked = 0, capunpacked = 0;
    kf_status st = KF_OK;

    Onnx__ModelProto mp;
    onnx__model_proto__init(&mp);
    Onnx__GraphProto gp;
    onnx__graph_proto__init(&gp);
    if (orig) mp = *orig; /* carry producer, metadata, functions, training info */
    mp.has_ir_version = 1;
    mp.ir_version = m->ir_version ? m->ir_version : 8;
    mp.graph = &gp;
    mp.n_opset_import = (size_t)m->nopsets;
    mp.opset_import = opsets_to_proto(&a, m->opsets, m->nopsets);
    if (orig && orig->graph) gp = *orig->graph; /* sparse initializers, annotations */
    /* functions come from the IR (import read every one of them) */
    mp.n_functions = (size_t)m->nfuncs;
    mp.functions = aalloc(&a, sizeof(void *) * (size_t)(m->nfuncs + 1));
    for (int i = 0; mp.functions && i < m->nfuncs && !st; i++)
        mp.functions[i] = function_to_proto(&a, m->funcs[i], &unpacked, &nunpacked, &capunpacked, &st);
    if (st) goto done;
    gp.name = g->name;
    gp.doc_string = g->doc;

    uint32_t ninit = 0;
    for (kf_id v = 1; v < g->nvalues; v++)
        if (g->values[v].init && (g->values[v].nusers || g->values[v].is_input || g->values[v].is_output)) ninit++;
    gp.initializer = aalloc(&a, sizeof(void *) * (ninit + 1));
    gp.n_initializer = 0;
    if (sink) {
        sink->deferred = aalloc(&a, sizeof(kf_tensor *) * (ninit + 1));
        sink->ndeferred = 0;
        sink->deferred_min = SIZE_MAX;
    }
    for (kf_id v = 1; gp.initializer && v < g->nvalues; v++) {
        const kf_value *val = &g->values[v];
        if (!val->init || !(val->nusers || val->is_input || val->is_output)) continue;
        /* a deferred tensor: the file sink writes its parts; in memory it
         * is assembled (the caller asked for the bytes anyway) */
        if (val->init->parts && !sink && (st = kf_tensor_settle(val->init))) goto done;
        Onnx__TensorProto *tp = tensor_to_proto(&a, val->init, val->name);
        if (!tp) break;
        tp->doc_string = val->doc;
        int64_t off;
        const kf_extfile *e = sink && (sink->share || sink->ext) ? kf_extdata_kept(m, v, &off) : NULL;
        if (e) {
            if ((st = to_kept(&a, sink, tp, e, off, val->name))) goto done;
        } else if (sink && sink->ext && tp->has_raw_data && tp->raw_data.len >= KF_EXTERNAL_MIN_TENSOR) {
            if (!to_external(&a, sink, tp, val->init)) {
                st = kf_fail(KF_ERR_IO, "cannot write external data for tensor '%s'", val->name);
                goto done;
            }
        } else if (sink && val->init->parts && sink->deferred) {
            sink->deferred[sink->ndeferred++] = val->init;
            if (tp->raw_data.len < sink->deferred_min) sink->deferred_min = tp->raw_data.len;
        }
        gp.initializer[gp.n_initializer++] = tp;
    }
    gp.n_input = g->ninputs;
    gp.input = aalloc(&a, sizeof(void *) * (g->ninputs + 1));
    for (uint32_t i = 0; gp.input && i < g->ninputs; i++) gp.input[i] = info_to_proto(&a, m, g->inputs[i]);
    gp.n_output = g->noutputs;
    gp.output = aalloc(&a, sizeof(void *) * (g->noutputs + 1));
    for (uint32_t i = 0; gp.output && i < g->noutputs; i++) gp.output[i] = info_to_proto(&a, m, g->outputs[i]);
    uint32_t ninfo = 0;
    for (kf_id v = 1; v < g->nvalues; v++)
        if (g->values[v].has_info && !g->values[v].is_input && !g->values[v].is_output && g->values[v].producer &&
            !g->nodes[g->values[v].producer].dead)
            ninfo++;
    gp.value_info = aalloc(&a, sizeof(void *) * (ninfo + 1));
    gp.n_value_info = 0;
    for (kf_id v = 1; gp.value_info && v < g->nvalues; v++) {
        const kf_value *val = &g->values[v];
        if (val->has_info && !val->is_input && !val->is_output && val->producer && !g->nodes[val->producer].dead)
            gp.value_info[gp.n_value_info++] = info_to_proto(&a, m, v);
    }

    kf_id *order = NULL;
    uint32_t norder = 0;
    if ((st = kf_graph_topo(g, &order, &norder))) goto done;
    gp.n_node = norder;
    gp.node = aalloc(&a, sizeof(void *) * (norder + 1));
    uint32_t seencap = 16;
    while (seencap < 2 * norder + 2) seencap *= 2;
    const char **seen = aalloc(&a, sizeof(char *) * seencap);
    for (uint32_t k = 0; gp.node && k < norder; k++)
        gp.node[k] = node_to_proto(&a, g, kf_node_at(g, order[k]), seen, seencap, &unpacked, &nunpacked, &capunpacked);
    kf_free(order);
    if (a.failed) {
        st = a.err ? a.err : kf_fail(KF_ERR_NOMEM, "out of memory while writing the model");
        goto done;
    }
    if (sink) {
        onnx__model_proto__pack_to_buffer(&mp, &sink->base);
        goto done;
    }
    size_t n = onnx__model_proto__get_packed_size(&mp);
    uint8_t *buf = kf_malloc(n);
    if (!buf) {
        st = kf_fail(KF_ERR_NOMEM, "out of memory: model of %zu bytes", n);
        goto done;
    }
    *len = onnx__model_proto__pack(&mp, buf);
    *data = buf;
done:
    for (uint32_t i = 0; i < nunpacked; i++) onnx__attribute_proto__free_unpacked(unpacked[i], &pb_allocator);
    kf_free(unpacked);
    afree(&a);
    return st;
}

static kf_status write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return kf_fail(KF_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok) return kf_fail(KF_ERR_IO, "cannot write '%s'", path);
    return KF_OK;
}

/* True when files a and b are one file (b may not exist). */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Writes to a temporary file beside path and renames it into place, so a
 * failed save (disk full, interrupted) never leaves a truncated model where
 * a good one was, even when path is the file the model came from.
 *
 * External data the model was loaded with: initializers whose bytes no
 * rewrite changed are not written from memory. When path is in the folder
 * the model came from, the new model names the input's data file itself
 * (nothing is copied): the two models then share it, so deleting or
 * rewriting the input's data file breaks the output too (the saver never
 * writes to it: its own data file gets another name if the names clash).
 * KFUSE_EXTERNAL_SHARE=0 asks for a copy instead. In another folder the
 * bytes are copied file to file into path + ".data" (kf_extdata_copy).
 * New and changed initializers go inline, or to that data file when the
 * inline total would pass KF_EXTERNAL_TOTAL (or KFUSE_EXTERNAL_DATA=1). */
kf_status kf_model_save(const kf_model *m, const char *path) {
    if (!m || !path) return kf_fail(KF_ERR_INVALID_ARG, "kf_model_save: NULL argument");
    size_t plen = strlen(path) + 48;
    char *tmp = kf_malloc(plen), *ext_path = kf_malloc(plen), *ext_tmp = kf_malloc(plen), *out_dir = dir_of(path);
    if (!tmp || !ext_path || !ext_tmp || !out_dir) {
        kf_free(tmp);
        kf_free(ext_path);
        kf_free(ext_tmp);
        kf_free(out_dir);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    const char *share_env = getenv("KFUSE_EXTERNAL_SHARE");
    bool share = m->next && m->dir && same_file(out_dir, m->dir) && !(share_env && share_env[0] == '0');
    kf_free(out_dir);
    snprintf(tmp, plen, "%s.tmp%ld", path, (long)getpid());
    /* the data file's name must not be one of the input's data files,
     * which the new model may name or the copy may read */
    for (int k = 0;; k++) {
        if (k) snprintf(ext_path, plen, "%s.data%d", path, k);
        else snprintf(ext_path, plen, "%s.data", path);
        bool clash = false;
        for (int i = 0; i < m->next && !clash; i++) clash = same_file(m->ext[i].path, ext_path);
        if (!clash) break;
    }
    snprintf(ext_tmp, plen, "%s.tmp%ld", ext_path, (long)getpid());
    const char *base = strrchr(ext_path, '/') ? strrchr(ext_path, '/') + 1 : ext_path;
    int64_t total = 0;
    bool kept = false;
    for (kf_id v = 1; v < m->graph->nvalues; v++) {
        const kf_tensor *t = m->graph->values[v].init;
        int64_t off;
        if (t && m->next && kf_extdata_kept(m, v, &off)) kept = true;
        else if (t && t->dtype != KF_DT_STRING) total += t->numel * (int64_t)kf_dtype_size(t->dtype);
    }
    const char *force = getenv("KFUSE_EXTERNAL_DATA");
    bool external = total > KF_EXTERNAL_TOTAL || (force && force[0] == '1') || (kept && !share);
    kf_status st = KF_OK;
    file_sink sink = {{sink_append}, NULL, false, NULL, base, 0, share, NULL, 0, 0};
    if (!(sink.f = fopen(tmp, "wb"))) st = kf_fail(KF_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    if (!st && external && !(sink.ext = fopen(ext_tmp, "wb")))
        st = kf_fail(KF_ERR_IO, "cannot write '%s': %s", ext_path, strerror(errno));
    if (!st) st = save_impl(m, &sink, NULL, NULL);
    bool closed = !sink.f || fclose(sink.f) == 0;
    bool ext_closed = !sink.ext || fclose(sink.ext) == 0;
    if (!st && (sink.failed || !closed || !ext_closed)) /* name the file that failed */
        st = kf_fail(KF_ERR_IO, "cannot write '%s': %s", sink.failed || !closed ? path : ext_path, strerror(errno));
    /* the data file goes into place first: a model never names missing data */
    if (!st && sink.ext && rename(ext_tmp, ext_path) != 0)
        st = kf_fail(KF_ERR_IO, "cannot move external data into '%s': %s", ext_path, strerror(errno));
    if (!st && rename(tmp, path) != 0) st = kf_fail(KF_ERR_IO, "cannot move the new model into '%s': %s", path, strerror(errno));
    if (st) {
        remove(tmp);
        remove(ext_tmp);
    }
    kf_free(tmp);
    kf_free(ext_path);
    kf_free(ext_tmp);
    return st;
}

kf_status kf_onnx_write_tensor_file(const char *path, const kf_tensor *t, const char *name) {
    if (t->parts) { /* a deferred tensor: assembled in a copy */
        kf_tensor whole = {0};
        KF_TRY(kf_tensor_copy(&whole, t));
        kf_status st = kf_onnx_write_tensor_file(path, &whole, name);
        kf_tensor_release(&whole);
        return st;
    }
    arena a = {0};
    Onnx__TensorProto *tp = tensor_to_proto(&a, t, name);
    if (!tp) {
        afree(&a);
        return kf_fail(KF_ERR_NOMEM, "out of memory");
    }
    size_t n = onnx__tensor_proto__get_packed_size(tp);
    uint8_t *buf = kf_malloc(n);
    kf_status st;
    if (!buf) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    else st = write_file(path, buf, onnx__tensor_proto__pack(tp, buf));
    kf_free(buf);
    afree(&a);
    return st;
}

/* ---- structural equality (round-trip tests) --------------------------------------- */

static bool type_eq(const kf_graph *ga, const kf_type *a, const kf_graph *gb, const kf_type *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++) {
        if (a->dims[i] != b->dims[i]) return false;
        const char *sa = a->syms[i] ? ga->syms[a->syms[i]] : "", *sb = b->syms[i] ? gb->syms[b->syms[i]] : "";
        if (strcmp(sa, sb)) return false;
    }
    return true;
}

static bool bytes_eq(const kf_bytes *a, const kf_bytes *b) {
    return a->len == b->len && (!a->len || memcmp(a->ptr, b->ptr, a->len) == 0);
}

static bool attr_eq(const kf_attr *a, const kf_attr *b) {
    if (strcmp(a->name, b->name) || a->type != b->type || a->n != b->n) return false;
    switch (a->type) {
    case KF_ATTR_FLOAT: return memcmp(&a->f, &b->f, sizeof a->f) == 0;
    case KF_ATTR_INT: return a->i == b->i;
    case KF_ATTR_STRING: return bytes_eq(&a->s, &b->s);
    case KF_ATTR_FLOATS: return !a->n || memcmp(a->floats, b->floats, sizeof(float) * (size_t)a->n) == 0;
    case KF_ATTR_INTS: return !a->n || memcmp(a->ints, b->ints, sizeof(int64_t) * (size_t)a->n) == 0;
    case KF_ATTR_STRINGS:
        for (int i = 0; i < a->n; i++)
            if (!bytes_eq(&a->strings[i], &b->strings[i])) return false;
        return true;
    case KF_ATTR_TENSOR: return kf_tensor_equal(a->t, b->t);
    default: return a->packed_len == b->packed_len && memcmp(a->packed, b->packed, a->packed_len) == 0;
    }
}

static const char *vname(const kf_graph *g, kf_id v) { return v ? g->values[v].name : ""; }

bool kf_model_equal(const kf_model *ma, const kf_model *mb, char *why, size_t whylen) {
    const kf_graph *a = ma->graph, *b = mb->graph;
    char dummy[8];
    if (!why) {
        why = dummy;
        whylen = sizeof dummy;
    }
#define DIFF(...)                                                                                                      \
    do {                                                                                                               \
        snprintf(why, whylen, __VA_ARGS__);                                                                            \
        return false;                                                                                                  \
    } while (0)
    if (ma->nopsets != mb->nopsets) DIFF("opset import count differs");
    for (int i = 0; i < ma->nopsets; i++)
        if (strcmp(ma->opsets[i].domain, mb->opsets[i].domain) || ma->opsets[i].version != mb->opsets[i].version)
            DIFF("opset import %d differs", i);
    if (a->ninputs != b->ninputs || a->noutputs != b->noutputs) DIFF("input/output counts differ");
    for (uint32_t i = 0; i < a->ninputs; i++) {
        const kf_value *x = &a->values[a->inputs[i]], *y = &b->values[b->inputs[i]];
        if (strcmp(x->name, y->name) || !type_eq(a, &x->type, b, &y->type)) DIFF("input %u ('%s') differs", i, x->name);
    }
    for (uint32_t i = 0; i < a->noutputs; i++) {
        const kf_value *x = &a->values[a->outputs[i]], *y = &b->values[b->outputs[i]];
        if (strcmp(x->name, y->name) || !type_eq(a, &x->type, b, &y->type)) DIFF("output %u ('%s') differs", i, x->name);
    }
    uint32_t live_a = 0, live_b = 0;
    for (kf_id i = 1; i < a->nnodes; i++) live_a += !a->nodes[i].dead;
    for (kf_id i = 1; i < b->nnodes; i++) live_b += !b->nodes[i].dead;
    if (live_a != live_b) DIFF("node counts differ (%u vs %u)", live_a, live_b);
    kf_id j = 1;
    for (kf_id i = 1; i < a->nnodes; i++) {
        const kf_node *x = &a->nodes[i];
        if (x->dead) continue;
        while (j < b->nnodes && b->nodes[j].dead) j++;
        const kf_node *y = &b->nodes[j++];
        if (strcmp(x->op_type, y->op_type) || strcmp(x->domain, y->domain) || strcmp(x->name, y->name) ||
            x->nin != y->nin || x->nout != y->nout || x->nattrs != y->nattrs)
            DIFF("node '%s' (%s) differs", x->name, x->op_type);
        for (int k = 0; k < x->nin; k++)
            if (strcmp(vname(a, x->in[k]), vname(b, y->in[k]))) DIFF("node '%s' input %d differs", x->name, k);
        for (int k = 0; k < x->nout; k++)
            if (strcmp(vname(a, x->out[k]), vname(b, y->out[k]))) DIFF("node '%s' output %d differs", x->name, k);
        for (int k = 0; k < x->nattrs; k++)
            if (!attr_eq(&x->attrs[k], &y->attrs[k])) DIFF("node '%s' attribute '%s' differs", x->name, x->attrs[k].name);
    }
    for (kf_id v = 1; v < a->nvalues; v++) {
        const kf_value *x = &a->values[v];
        if (!x->init || !(x->nusers || x->is_input || x->is_output)) continue;
        kf_id w = kf_graph_find(b, x->name);
        if (!w || !b->values[w].init || !kf_tensor_equal(x->init, b->values[w].init)) DIFF("initializer '%s' differs", x->name);
    }
#undef DIFF
    return true;
}
