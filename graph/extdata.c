/*
 * extdata.c: ONNX external data without moving it. The loader maps each
 * external data file once, read-only, and points initializers into the
 * mapping, so weights nothing reads are never paged in; the saver asks which
 * initializers still hold exactly the bytes of their file region and refers
 * to that region (same folder) or copies it file to file in the kernel
 * (another folder). Sits under graph/onnx.c, which decides what to map.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* copy_file_range */
#endif
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#define KF_HAVE_MMAP 1
#endif

#include "kf_extdata.h"

/* Mapped files one model may hold; beyond this, tensors are read into
 * memory (a file per tensor is legal ONNX, and every mapping costs a
 * kernel map entry of a limited supply). */
#define KF_MAX_EXT_MAPS 4096
/* Bytes streamed per read/write when the kernel cannot copy for us. */
#define KF_COPY_CHUNK ((size_t)1 << 20)

/* ---- which memory is mapped (for kf_tensor_release) ----------------------------- */

/* Every live mapping of every model, so that freeing a tensor whose data
 * lies in one does not hand it to free(). Few entries (one per data file),
 * changed only at load and free; a spin lock is enough. */
typedef struct span {
    const uint8_t *base;
    size_t len;
} span;
static span *spans;
static uint32_t nspans, capspans;
static atomic_uint live_spans;
static atomic_flag spans_lock = ATOMIC_FLAG_INIT;

static void lock(void) {
    while (atomic_flag_test_and_set_explicit(&spans_lock, memory_order_acquire)) {}
}
static void unlock(void) { atomic_flag_clear_explicit(&spans_lock, memory_order_release); }

bool kf_extdata_mapped(const void *p) {
    if (!p || !atomic_load_explicit(&live_spans, memory_order_acquire)) return false;
    const uint8_t *q = p;
    bool found = false;
    lock();
    for (uint32_t i = 0; i < nspans && !found; i++) found = q >= spans[i].base && q < spans[i].base + spans[i].len;
    unlock();
    return found;
}

static bool add_span(const uint8_t *base, size_t len) {
    lock();
    bool ok = kf_grow((void **)&spans, &capspans, nspans + 1, sizeof(span)) == KF_OK;
    if (ok) {
        spans[nspans++] = (span){base, len};
        atomic_store_explicit(&live_spans, nspans, memory_order_release);
    }
    unlock();
    return ok;
}

static void drop_span(const uint8_t *base) {
    lock();
    for (uint32_t i = 0; i < nspans; i++)
        if (spans[i].base == base) {
            spans[i] = spans[--nspans];
            break;
        }
    atomic_store_explicit(&live_spans, nspans, memory_order_release);
    if (!nspans) {
        kf_free(spans);
        spans = NULL;
        capspans = 0;
    }
    unlock();
}

/* ---- loading --------------------------------------------------------------------- */

const uint8_t *kf_extdata_map(kf_model *m, const char *real, const char *location, int fd, uint32_t *file) {
    *file = 0;
#ifdef KF_HAVE_MMAP
    if (getenv("KFUSE_NO_MMAP")) return NULL;
    for (int i = 0; i < m->next; i++)
        if (!strcmp(m->ext[i].path, real)) {
            *file = (uint32_t)i + 1;
            return m->ext[i].base;
        }
    if (m->next >= KF_MAX_EXT_MAPS) return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size <= 0 || (uint64_t)sb.st_size > SIZE_MAX) return NULL;
    kf_extfile *ext = kf_realloc(m->ext, sizeof(kf_extfile) * (size_t)(m->next + 1));
    if (!ext) return NULL; /* reading instead still works */
    m->ext = ext;
    kf_extfile *e = &m->ext[m->next];
    memset(e, 0, sizeof *e);
    e->len = (size_t)sb.st_size;
    e->dev = (uint64_t)sb.st_dev;
    e->ino = (uint64_t)sb.st_ino;
    e->path = kf_strdup(real);
    e->location = kf_strdup(location);
    void *p = e->path && e->location ? mmap(NULL, e->len, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    if (p == MAP_FAILED || !add_span(p, e->len)) {
        if (p != MAP_FAILED) munmap(p, e->len);
        kf_free(e->path);
        kf_free(e->location);
        return NULL;
    }
    e->base = p;
    *file = (uint32_t)++m->next;
    return e->base;
#else
    (void)m, (void)real, (void)location, (void)fd;
    return NULL;
#endif
}

void kf_extdata_release(kf_model *m) {
    for (int i = 0; i < m->next; i++) {
        kf_extfile *e = &m->ext[i];
#ifdef KF_HAVE_MMAP
        if (e->base) {
            drop_span(e->base);
            munmap((void *)e->base, e->len);
        }
#endif
        kf_free(e->path);
        kf_free(e->location);
    }
    kf_free(m->ext);
    m->ext = NULL;
    m->next = 0;
}

/* ---- saving ---------------------------------------------------------------------- */

const kf_extfile *kf_extdata_kept(const kf_model *m, kf_id v, int64_t *offset) {
    const kf_value *val = &m->graph->values[v];
    const kf_tensor *t = val->init;
    if (!t || !val->ext_file || val->ext_file > (uint32_t)m->next || t->dtype == KF_DT_STRING) return NULL;
    const kf_extfile *e = &m->ext[val->ext_file - 1];
    size_t nbytes = (size_t)t->numel * kf_dtype_size(t->dtype);
    /* same bytes: still the pointer the loader set, over the same length
     * (the mapping is read-only, so nobody wrote through it) */
    if (!e->base || t->data != e->base + val->ext_offset || kf_dtype_packed_bytes(t->dtype, t->numel) != nbytes ||
        val->ext_offset < 0 || (uint64_t)val->ext_offset + nbytes > e->len)
        return NULL;
    *offset = val->ext_offset;
    return e;
}

kf_status kf_extdata_copy(const kf_extfile *src, int64_t off, size_t len, int dst_fd, int64_t dst_off) {
    int in = open(src->path, O_RDONLY | O_CLOEXEC);
    if (in < 0) return kf_fail(KF_ERR_IO, "cannot reopen external data '%s': %s", src->location, strerror(errno));
    struct stat sb; /* the file the model mapped, not one put in its place since */
    if (fstat(in, &sb) != 0 || (uint64_t)sb.st_dev != src->dev || (uint64_t)sb.st_ino != src->ino) {
        close(in);
        return kf_fail(KF_ERR_IO, "external data '%s' was replaced after the model was loaded", src->location);
    }
    kf_status st = KF_OK;
    size_t done = 0;
#if defined(__linux__)
    /* in the kernel: no user-space copy, and a reflink where the filesystem
     * shares blocks (btrfs, XFS) */
    while (done < len) {
        off_t o_in = (off_t)(off + (int64_t)done), o_out = (off_t)(dst_off + (int64_t)done);
        ssize_t w = copy_file_range(in, &o_in, dst_fd, &o_out, len - done, 0);
        if (w <= 0) break; /* not supported here, or a short file: stream the rest */
        done += (size_t)w;
    }
#endif
    uint8_t *buf = done < len ? kf_malloc(KF_COPY_CHUNK) : NULL;
    if (done < len && !buf) st = kf_fail(KF_ERR_NOMEM, "out of memory");
    while (!st && done < len) {
        size_t want = len - done < KF_COPY_CHUNK ? len - done : KF_COPY_CHUNK;
        ssize_t r = pread(in, buf, want, (off_t)(off + (int64_t)done));
        if (r <= 0) {
            st = kf_fail(KF_ERR_IO, "cannot read external data '%s' at offset %lld", src->location,
                         (long long)(off + (int64_t)done));
            break;
        }
        for (ssize_t put = 0; put < r;) {
            ssize_t w = pwrite(dst_fd, buf + put, (size_t)(r - put), (off_t)(dst_off + (int64_t)done + put));
            if (w <= 0) {
                st = kf_fail(KF_ERR_IO, "cannot write external data: %s", strerror(errno));
                break;
            }
            put += w;
        }
        done += (size_t)r;
    }
    kf_free(buf);
    close(in);
    return st;
}
