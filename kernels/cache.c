/*
 * cache.c: the kernel cache (see kf_cache.h). Sits between codegen's kernel
 * text and the compilers of kernels/: before a compile, ask here; after one,
 * store here. A bounded LRU in memory fronts a folder of entry files, one
 * per key, each a checked header plus the opaque compiled bytes. Entries are
 * written to a temp file and renamed into place, so processes sharing the
 * folder never see half an entry; anything that fails a check is a miss.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kf_cache.h"

/* Identifies the kfuse build in every key, so a development build whose
 * compile pipeline changed without a version bump can be told apart: pass
 * -DKF_BUILD_ID="<git hash>" at build time. Kernel text, compiler, options
 * and arch are keyed separately, so "dev" is a safe default. */
#ifndef KF_BUILD_ID
#define KF_BUILD_ID "dev"
#endif

/* A writer's temp file older than this belongs to a process that died
 * mid-write (a write takes milliseconds), so `cache clear` may remove it. */
#define STALE_TEMP_SECONDS 60

/* ---- SHA-256 (FIPS 180-4) ---------------------------------------------
 * Why SHA-256: the key must not collide in practice, since a collision
 * would hand back another kernel's binary; a 64-bit or FNV hash gives no
 * such assurance against adversarial or merely unlucky inputs. It is also
 * the payload checksum: hashing a cubin costs microseconds next to the
 * milliseconds its compile took, and one primitive serves both. */

typedef struct sha256 {
    uint32_t h[8];
    uint64_t len; /* bytes hashed so far */
    uint8_t buf[64];
    uint32_t nbuf;
} sha256;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(sha256 *s, const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
               (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
    uint32_t e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d;
    s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

static void sha_init(sha256 *s) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->len = 0;
    s->nbuf = 0;
}

static void sha_update(sha256 *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->len += n;
    while (n) {
        if (s->nbuf == 0 && n >= 64) {
            sha_block(s, p);
            p += 64, n -= 64;
            continue;
        }
        uint32_t take = 64 - s->nbuf;
        if (take > n) take = (uint32_t)n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take, p += take, n -= take;
        if (s->nbuf == 64) {
            sha_block(s, s->buf);
            s->nbuf = 0;
        }
    }
}

static void sha_final(sha256 *s, uint8_t out[KF_SHA256_BYTES]) {
    uint64_t bits = s->len * 8;
    uint8_t pad[72] = {0x80};
    size_t npad = (s->nbuf < 56 ? 56 : 120) - s->nbuf;
    for (int i = 0; i < 8; i++) pad[npad + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(s->h[i] >> (24 - 8 * j));
}

void kf_kern_sha256(const void *data, size_t len, uint8_t out[KF_SHA256_BYTES]) {
    sha256 s;
    sha_init(&s);
    sha_update(&s, data, len);
    sha_final(&s, out);
}

/* ---- keys ---------------------------------------------------------------
 * key hash = SHA-256("kfuse-kernel-cache" | len,version | len,build id |
 *                    SHA-256(text) | len,arch | len,compiler | len,options)
 * Each string is prefixed by its 64-bit length, so ("ab","c") and ("a","bc")
 * are different keys. The text enters through its own hash, which the entry
 * header also stores and a lookup compares: a hit needs both to agree. */

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static void sha_string(sha256 *s, const char *str) {
    uint8_t n[8];
    size_t len = strlen(str);
    put_u64(n, len);
    sha_update(s, n, 8);
    sha_update(s, str, len);
}

static void hash_key(const kf_cache_key *k, uint8_t key[KF_SHA256_BYTES], uint8_t text[KF_SHA256_BYTES]) {
    kf_kern_sha256(k->text, k->text_len, text);
    sha256 s;
    sha_init(&s);
    sha_string(&s, "kfuse-kernel-cache");
    sha_string(&s, kf_version());
    sha_string(&s, KF_BUILD_ID);
    sha_update(&s, text, KF_SHA256_BYTES);
    sha_string(&s, k->arch);
    sha_string(&s, k->compiler);
    sha_string(&s, k->options);
    sha_final(&s, key);
}

void kf_cache_key_hash(const kf_cache_key *key, uint8_t out[KF_SHA256_BYTES]) {
    uint8_t text[KF_SHA256_BYTES];
    hash_key(key, out, text);
}

static kf_status check_key(const kf_cache_key *k) {
    if (!k || (!k->text && k->text_len) || !k->arch || !k->compiler || !k->options)
        return kf_fail(KF_ERR_INVALID_ARG, "kernel cache: key with a missing field");
    return KF_OK;
}

/* ---- entry files ----------------------------------------------------------
 *   offset  size  field
 *        0     8  magic "KFCACHE\x1a"
 *        8     4  format version (little-endian)
 *       12     4  header size (128)
 *       16    32  key hash
 *       48    32  SHA-256 of the kernel text
 *       80     8  payload length
 *       88    32  SHA-256 of the payload
 *      120     8  first 8 bytes of SHA-256 of bytes 0..119
 *      128     -  payload
 * Every byte is covered by a check, so a flipped bit anywhere is a miss. */

static const uint8_t MAGIC[8] = {'K', 'F', 'C', 'A', 'C', 'H', 'E', 0x1a};
#define NAME_PREFIX "kf-"
#define NAME_SUFFIX ".kfc"
#define TEMP_INFIX ".tmp."
enum {
    HEX_LEN = 2 * KF_SHA256_BYTES,
    ENTRY_NAME_LEN = 3 + HEX_LEN + 4,
    TEMP_NAME_LEN = ENTRY_NAME_LEN + 5 + 6, /* mkstemp's XXXXXX */
    OFF_CHECK = 120,
};

static void encode_header(uint8_t h[KF_CACHE_HEADER_BYTES], const uint8_t key[32], const uint8_t text[32],
                          const void *bytes, size_t len) {
    memcpy(h, MAGIC, 8);
    put_u32(h + 8, KF_CACHE_FORMAT_VERSION);
    put_u32(h + 12, KF_CACHE_HEADER_BYTES);
    memcpy(h + 16, key, 32);
    memcpy(h + 48, text, 32);
    put_u64(h + 80, len);
    kf_kern_sha256(bytes, len, h + 88);
    uint8_t sum[KF_SHA256_BYTES];
    kf_kern_sha256(h, OFF_CHECK, sum);
    memcpy(h + OFF_CHECK, sum, 8);
}

/* Why the header h of a file of file_size bytes is unusable for key/text,
 * or NULL when it is fine. */
static const char *check_header(const uint8_t *h, uint64_t file_size, const uint8_t key[32],
                                const uint8_t text[32]) {
    if (memcmp(h, MAGIC, 8) != 0) return "not a kfuse cache entry (foreign magic)";
    uint8_t sum[KF_SHA256_BYTES];
    kf_kern_sha256(h, OFF_CHECK, sum);
    if (memcmp(sum, h + OFF_CHECK, 8) != 0) return "header checksum mismatch";
    if (get_u32(h + 8) != KF_CACHE_FORMAT_VERSION) return "other format version";
    if (get_u32(h + 12) != KF_CACHE_HEADER_BYTES) return "bad header size";
    if (memcmp(h + 16, key, 32) != 0) return "entry holds another key";
    if (memcmp(h + 48, text, 32) != 0) return "kernel text hash differs (key collision)";
    uint64_t len = get_u64(h + 80);
    if (len == 0 || len > KF_CACHE_MAX_PAYLOAD) return "payload length out of range";
    if (len != file_size - KF_CACHE_HEADER_BYTES) return "truncated or overlong";
    return NULL;
}

static void to_hex(const uint8_t *b, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < KF_SHA256_BYTES; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[HEX_LEN] = 0;
}

static bool is_entry_name(const char *n) {
    if (strlen(n) != ENTRY_NAME_LEN || strncmp(n, NAME_PREFIX, 3) != 0) return false;
    for (int i = 3; i < 3 + HEX_LEN; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return false;
    return strcmp(n + 3 + HEX_LEN, NAME_SUFFIX) == 0;
}

static bool is_temp_name(const char *n) {
    if (strlen(n) != TEMP_NAME_LEN) return false;
    char entry[ENTRY_NAME_LEN + 1];
    memcpy(entry, n, ENTRY_NAME_LEN);
    entry[ENTRY_NAME_LEN] = 0;
    if (!is_entry_name(entry) || strncmp(n + ENTRY_NAME_LEN, TEMP_INFIX, 5) != 0) return false;
    for (const char *p = n + ENTRY_NAME_LEN + 5; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')))
            return false;
    return true;
}

/* ---- the cache handle ----------------------------------------------------- */

typedef struct mem_entry {
    uint8_t key[KF_SHA256_BYTES], text[KF_SHA256_BYTES];
    uint8_t *bytes;
    size_t len;
    uint64_t used; /* tick of the last get or put; smallest is evicted first */
} mem_entry;

struct kf_cache {
    char *dir; /* NULL: memory only */
    bool trace;
    pthread_mutex_t lock; /* guards everything below */
    mem_entry *mem;
    uint32_t nmem, capmem;
    size_t mem_bytes, max_bytes;
    uint32_t max_entries;
    uint64_t tick;
    kf_cache_info counts;
};

#define TRACE(c, ...)                                                                                  \
    do {                                                                                               \
        if ((c)->trace) fprintf(stderr, "kfuse cache: " __VA_ARGS__);                                  \
    } while (0)

static void mem_drop(kf_cache *c, uint32_t i) {
    c->mem_bytes -= c->mem[i].len;
    free(c->mem[i].bytes);
    c->mem[i] = c->mem[--c->nmem];
}

static void mem_fit(kf_cache *c) {
    while (c->nmem && (c->nmem > c->max_entries || c->mem_bytes > c->max_bytes)) {
        uint32_t lru = 0;
        for (uint32_t i = 1; i < c->nmem; i++)
            if (c->mem[i].used < c->mem[lru].used) lru = i;
        mem_drop(c, lru);
        c->counts.evictions++;
    }
}

static int mem_find(kf_cache *c, const uint8_t key[32]) {
    for (uint32_t i = 0; i < c->nmem; i++)
        if (memcmp(c->mem[i].key, key, 32) == 0) return (int)i;
    return -1;
}

/* Stores a copy (lock held). Failure to allocate only loses speed. */
static void mem_insert(kf_cache *c, const uint8_t key[32], const uint8_t text[32], const void *bytes, size_t len) {
    if (len > c->max_bytes) return;
    int i = mem_find(c, key);
    if (i >= 0) mem_drop(c, (uint32_t)i);
    uint8_t *copy = kf_malloc(len);
    if (!copy) return;
    if (c->nmem == c->capmem && kf_grow((void **)&c->mem, &c->capmem, c->nmem + 1, sizeof *c->mem)) {
        free(copy);
        return;
    }
    memcpy(copy, bytes, len);
    mem_entry *e = &c->mem[c->nmem++];
    memcpy(e->key, key, 32);
    memcpy(e->text, text, 32);
    e->bytes = copy;
    e->len = len;
    e->used = ++c->tick;
    c->mem_bytes += len;
    mem_fit(c);
}

/* dir/name, malloc'ed. */
static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = kf_malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static char *entry_path(const char *dir, const uint8_t key[32]) {
    char name[ENTRY_NAME_LEN + 1], hex[HEX_LEN + 1];
    to_hex(key, hex);
    snprintf(name, sizeof name, NAME_PREFIX "%s" NAME_SUFFIX, hex);
    return join(dir, name);
}

char *kf_cache_entry_path(const kf_cache *c, const kf_cache_key *key) {
    if (!c || !c->dir || check_key(key)) return NULL;
    uint8_t k[32];
    kf_cache_key_hash(key, k);
    return entry_path(c->dir, k);
}

/* mkdir -p with mode 0700. */
static kf_status make_dirs(const char *dir) {
    char *p = kf_strdup(dir);
    if (!p) return kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
    for (char *s = p + 1;; s++) {
        bool end = *s == 0;
        if (*s == '/' || end) {
            *s = 0;
            if (mkdir(p, 0700) != 0 && errno != EEXIST) {
                kf_status st = kf_fail(KF_ERR_IO, "kernel cache folder '%s': cannot create '%s': %s", dir, p,
                                       strerror(errno));
                free(p);
                return st;
            }
            if (end) break;
            *s = '/';
        }
    }
    free(p);
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kf_fail(KF_ERR_IO, "kernel cache folder '%s': not a folder", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return kf_fail(KF_ERR_IO, "kernel cache folder '%s': not writable: %s", dir, strerror(errno));
    return KF_OK;
}

char *kf_cache_default_dir(void) {
    const char *v = getenv("KFUSE_CACHE_DIR");
    if (v && *v) {
        char *r = kf_strdup(v);
        if (!r) kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
        return r;
    }
    const char *base = getenv("XDG_CACHE_HOME"), *sub = "kfuse";
    if (!base || base[0] != '/') base = getenv("HOME"), sub = ".cache/kfuse";
    if (!base || !*base) {
        kf_fail(KF_ERR_IO, "kernel cache: no folder (set KFUSE_CACHE_DIR, XDG_CACHE_HOME or HOME)");
        return NULL;
    }
    char *r = join(base, sub);
    if (!r) kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
    return r;
}

kf_status kf_cache_open(const char *dir, kf_cache **out) {
    if (!out) return kf_fail(KF_ERR_INVALID_ARG, "kf_cache_open: out is NULL");
    *out = NULL;
    if (dir && !*dir) return kf_fail(KF_ERR_INVALID_ARG, "kf_cache_open: empty folder name");
    kf_cache *c = kf_calloc(1, sizeof *c);
    if (!c) return kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return kf_fail(KF_ERR_NOMEM, "kernel cache: cannot create a mutex");
    }
    c->max_bytes = KF_CACHE_MEM_BYTES;
    c->max_entries = KF_CACHE_MEM_ENTRIES;
    const char *trace = getenv("KFUSE_TRACE");
    c->trace = trace && strstr(trace, "cache");
    kf_status st = KF_OK;
    char *d = dir ? kf_strdup(dir) : kf_cache_default_dir();
    if (!d) st = dir ? kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory") : KF_ERR_IO;
    if (st == KF_ERR_NOMEM) {
        kf_cache_close(c);
        return st;
    }
    if (d) {
        st = make_dirs(d);
        if (st == KF_OK) c->dir = d;
        else free(d);
        if (st == KF_ERR_NOMEM) {
            kf_cache_close(c);
            return st;
        }
    }
    if (st) TRACE(c, "memory only: %s\n", kf_last_error());
    *out = c;
    return st;
}

const char *kf_cache_dir(const kf_cache *c) { return c ? c->dir : NULL; }

void kf_cache_set_mem_limit(kf_cache *c, size_t max_bytes, uint32_t max_entries) {
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    if (max_bytes) c->max_bytes = max_bytes;
    if (max_entries) c->max_entries = max_entries;
    mem_fit(c);
    pthread_mutex_unlock(&c->lock);
}

void kf_cache_close(kf_cache *c) {
    if (!c) return;
    for (uint32_t i = 0; i < c->nmem; i++) free(c->mem[i].bytes);
    free(c->mem);
    free(c->dir);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---- disk side --------------------------------------------------------- */

static bool read_all(int fd, void *buf, size_t n) {
    uint8_t *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r, n -= (size_t)r;
    }
    return true;
}

static bool write_all(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = ENOSPC;
            return false;
        }
        p += r, n -= (size_t)r;
    }
    return true;
}

/* Reads the entry at path. Returns a malloc'ed payload, or NULL for a miss;
 * a damaged entry is deleted (only if path still names the file we read, so
 * a good entry renamed in meanwhile by another process survives). */
static uint8_t *disk_read(kf_cache *c, const char *path, const uint8_t key[32], const uint8_t text[32],
                          size_t *len, bool *bad) {
    *bad = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL; /* ENOENT is the ordinary miss; others: unreadable is a miss too */
    struct stat sb;
    uint8_t h[KF_CACHE_HEADER_BYTES];
    uint8_t *payload = NULL;
    const char *why = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) why = "not a regular file";
    else if ((uint64_t)sb.st_size < KF_CACHE_HEADER_BYTES) why = "truncated header";
    else if (!read_all(fd, h, sizeof h)) why = "unreadable header";
    else why = check_header(h, (uint64_t)sb.st_size, key, text);
    if (!why) {
        *len = (size_t)get_u64(h + 80);
        payload = kf_malloc(*len);
        uint8_t sum[KF_SHA256_BYTES];
        if (payload && !read_all(fd, payload, *len)) why = "unreadable payload";
        if (payload && !why) {
            kf_kern_sha256(payload, *len, sum);
            if (memcmp(sum, h + 88, 32) != 0) why = "payload checksum mismatch";
        }
        if (why) {
            free(payload);
            payload = NULL;
        }
    }
    if (why) { /* (a failed allocation above is a miss, but not the entry's fault) */
        struct stat now;
        *bad = true;
        if (stat(path, &now) == 0 && now.st_ino == sb.st_ino && now.st_dev == sb.st_dev) unlink(path);
        TRACE(c, "bad entry '%s' deleted: %s\n", path, why);
    }
    close(fd);
    return payload;
}

/* Writes the entry through a temp file renamed over path. No fsync: after a
 * crash a torn entry fails its checksum and is rebuilt, which is cheaper
 * than syncing every compile. */
static kf_status disk_write(const char *path, const uint8_t key[32], const uint8_t text[32], const void *bytes,
                            size_t len) {
    size_t n = strlen(path);
    char *tmp = kf_malloc(n + 5 + 6 + 1);
    if (!tmp) return kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
    memcpy(tmp, path, n);
    memcpy(tmp + n, TEMP_INFIX "XXXXXX", 12);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        kf_status st = kf_fail(KF_ERR_IO, "kernel cache: cannot create '%s': %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    uint8_t h[KF_CACHE_HEADER_BYTES];
    encode_header(h, key, text, bytes, len);
    const char *what = NULL;
    if (!write_all(fd, h, sizeof h) || !write_all(fd, bytes, len)) what = "write";
    int err = errno;
    if (close(fd) != 0 && !what) what = "close", err = errno;
    if (!what && rename(tmp, path) != 0) what = "rename", err = errno;
    kf_status st = KF_OK;
    if (what) {
        st = kf_fail(KF_ERR_IO, "kernel cache: cannot %s '%s': %s", what, what[0] == 'r' ? path : tmp,
                     strerror(err));
        unlink(tmp);
    }
    free(tmp);
    return st;
}

/* ---- get / put ----------------------------------------------------------- */

kf_status kf_cache_get(kf_cache *c, const kf_cache_key *key, void **bytes, size_t *len, bool *hit) {
    if (!c || !bytes || !len || !hit) return kf_fail(KF_ERR_INVALID_ARG, "kf_cache_get: NULL argument");
    *bytes = NULL, *len = 0, *hit = false;
    KF_TRY(check_key(key));
    uint8_t k[32], t[32];
    hash_key(key, k, t);

    pthread_mutex_lock(&c->lock);
    int i = mem_find(c, k);
    if (i >= 0 && memcmp(c->mem[i].text, t, 32) != 0) { /* a key collision: never hand it out */
        mem_drop(c, (uint32_t)i);
        i = -1;
    }
    if (i >= 0) {
        mem_entry *e = &c->mem[i];
        void *copy = kf_malloc(e->len);
        if (!copy) {
            pthread_mutex_unlock(&c->lock);
            return kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
        }
        memcpy(copy, e->bytes, e->len);
        e->used = ++c->tick;
        *bytes = copy, *len = e->len, *hit = true;
        c->counts.mem_hits++;
        pthread_mutex_unlock(&c->lock);
        return KF_OK;
    }
    pthread_mutex_unlock(&c->lock);

    uint8_t *payload = NULL;
    bool bad = false;
    char *path = c->dir ? entry_path(c->dir, k) : NULL;
    if (c->dir && !path) return kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
    if (path) payload = disk_read(c, path, k, t, len, &bad);

    pthread_mutex_lock(&c->lock);
    if (bad) c->counts.bad_entries++;
    if (payload) {
        mem_insert(c, k, t, payload, *len);
        c->counts.disk_hits++;
        *bytes = payload, *hit = true;
    } else {
        c->counts.misses++;
        *len = 0;
    }
    pthread_mutex_unlock(&c->lock);
    TRACE(c, "%s %s\n", payload ? "disk hit" : "miss", path ? path : "(memory only)");
    free(path);
    return KF_OK;
}

kf_status kf_cache_put(kf_cache *c, const kf_cache_key *key, const void *bytes, size_t len) {
    if (!c || !bytes) return kf_fail(KF_ERR_INVALID_ARG, "kf_cache_put: NULL argument");
    KF_TRY(check_key(key));
    if (len == 0 || (uint64_t)len > KF_CACHE_MAX_PAYLOAD)
        return kf_fail(KF_ERR_INVALID_ARG, "kf_cache_put: payload of %zu bytes (allowed 1..%llu)", len,
                       (unsigned long long)KF_CACHE_MAX_PAYLOAD);
    uint8_t k[32], t[32];
    hash_key(key, k, t);
    pthread_mutex_lock(&c->lock);
    mem_insert(c, k, t, bytes, len);
    c->counts.puts++;
    pthread_mutex_unlock(&c->lock);
    if (!c->dir) return KF_OK;
    char *path = entry_path(c->dir, k);
    if (!path) return kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
    kf_status st = disk_write(path, k, t, bytes, len);
    TRACE(c, "put %s (%zu bytes)%s\n", path, len, st ? ": failed" : "");
    free(path);
    if (st) {
        pthread_mutex_lock(&c->lock);
        c->counts.write_errors++;
        pthread_mutex_unlock(&c->lock);
    }
    return st;
}

/* ---- stats / clear ------------------------------------------------------- */

/* Visits the kfuse files of c's folder: entries, and temp files when temps.
 * remove: unlink entries (and stale temps). Counts entries and their bytes. */
static kf_status scan(kf_cache *c, bool remove, uint64_t *count, uint64_t *bytes) {
    *count = 0, *bytes = 0;
    if (!c->dir) return KF_OK;
    DIR *d = opendir(c->dir);
    if (!d) return kf_fail(KF_ERR_IO, "kernel cache folder '%s': cannot list: %s", c->dir, strerror(errno));
    kf_status st = KF_OK;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        bool entry = is_entry_name(e->d_name);
        if (!entry && !(remove && is_temp_name(e->d_name))) continue;
        char *p = join(c->dir, e->d_name);
        if (!p) {
            st = kf_fail(KF_ERR_NOMEM, "kernel cache: out of memory");
            break;
        }
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
            bool stale = !entry && now - sb.st_mtime > STALE_TEMP_SECONDS;
            if (remove && (entry || stale)) {
                if (unlink(p) != 0 && errno != ENOENT) {
                    if (!st) st = kf_fail(KF_ERR_IO, "kernel cache: cannot remove '%s': %s", p, strerror(errno));
                } else if (entry) {
                    (*count)++, *bytes += (uint64_t)sb.st_size;
                }
            } else if (entry) {
                (*count)++, *bytes += (uint64_t)sb.st_size;
            }
        }
        free(p);
    }
    closedir(d);
    return st;
}

kf_status kf_cache_stats(kf_cache *c, kf_cache_info *s) {
    if (!c || !s) return kf_fail(KF_ERR_INVALID_ARG, "kf_cache_stats: NULL argument");
    pthread_mutex_lock(&c->lock);
    *s = c->counts;
    s->mem_entries = c->nmem;
    s->mem_bytes = c->mem_bytes;
    pthread_mutex_unlock(&c->lock);
    return scan(c, false, &s->disk_entries, &s->disk_bytes);
}

kf_status kf_cache_clear(kf_cache *c, uint64_t *removed, uint64_t *bytes) {
    if (!c) return kf_fail(KF_ERR_INVALID_ARG, "kf_cache_clear: NULL cache");
    pthread_mutex_lock(&c->lock);
    while (c->nmem) mem_drop(c, c->nmem - 1);
    pthread_mutex_unlock(&c->lock);
    uint64_t n, b;
    kf_status st = scan(c, true, &n, &b);
    if (removed) *removed = n;
    if (bytes) *bytes = b;
    return st;
}
