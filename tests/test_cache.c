/*
 * test_cache.c: the kernel cache (kernels/cache.c): SHA-256 vectors, round
 * trips through memory and disk, LRU eviction order, damaged entries being
 * misses that get deleted, unwritable and full folders, processes writing
 * one folder at once, stats, and clear touching only kfuse files.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kf_cache.h"
#include "test_util.h"

/* ---- helpers ------------------------------------------------------------ */

/* A fresh folder under /tmp; removed (with everything in it) by rm_tree. */
static char *temp_dir(void) {
    char *d = strdup("/tmp/kf_cache_test_XXXXXX");
    cr_assert(mkdtemp(d), "mkdtemp: %s", strerror(errno));
    return d;
}

static void rm_tree(char *d) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    cr_assert_eq(system(cmd), 0);
    free(d);
}

/* Key i: distinct text, fixed arch/compiler/options. text must live on. */
static kf_cache_key key_of(char *text, size_t n, int i) {
    snprintf(text, n, "__global__ void k%d(float *x) { x[0] = %d.0f; }", i, i);
    return (kf_cache_key){text, strlen(text), "sm_90", "nvrtc 12.4", "-arch=sm_90 -default-device"};
}

/* Payload i: random-looking bytes of a size that varies with i (up to
 * ~70 KiB, so writes span many pages), reproducible from i alone. */
static uint8_t *payload_of(int i, size_t *len) {
    *len = 1000 + (size_t)i * 1400;
    uint8_t *p = malloc(*len);
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    for (size_t j = 0; j < *len; j++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[j] = (uint8_t)s;
    }
    return p;
}

static void put_i(kf_cache *c, int i) {
    char text[128];
    size_t len;
    kf_cache_key k = key_of(text, sizeof text, i);
    uint8_t *p = payload_of(i, &len);
    kf_status st = kf_cache_put(c, &k, p, len);
    cr_assert_eq(st, KF_OK, "put %d: %s", i, kf_last_error());
    free(p);
}

/* Gets key i; returns whether it hit, and asserts the bytes are payload i. */
static bool get_i(kf_cache *c, int i) {
    char text[128];
    size_t want_len, len;
    kf_cache_key k = key_of(text, sizeof text, i);
    void *got;
    bool hit;
    cr_assert_eq(kf_cache_get(c, &k, &got, &len, &hit), KF_OK, "%s", kf_last_error());
    if (!hit) {
        cr_assert_null(got);
        return false;
    }
    uint8_t *want = payload_of(i, &want_len);
    cr_assert_eq(len, want_len, "key %d: %zu bytes, want %zu", i, len, want_len);
    cr_assert(memcmp(got, want, len) == 0, "key %d: wrong bytes", i);
    free(want);
    free(got);
    return true;
}

static char *entry_of(kf_cache *c, int i) {
    char text[128];
    kf_cache_key k = key_of(text, sizeof text, i);
    char *p = kf_cache_entry_path(c, &k);
    cr_assert_not_null(p);
    return p;
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static long file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 ? (long)sb.st_size : -1;
}

/* ---- SHA-256 ------------------------------------------------------------- */

static void hex(const uint8_t *b, char *out) {
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

Test(cache, sha256_vectors) {
    /* FIPS 180-4 examples, plus lengths around the padding boundary */
    static const struct {
        const char *in;
        const char *want;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    uint8_t h[32];
    char s[65];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        kf_kern_sha256(v[i].in, strlen(v[i].in), h);
        hex(h, s);
        cr_assert_str_eq(s, v[i].want, "sha256(\"%s\")", v[i].in);
    }
    size_t n = 1000000;
    char *a = malloc(n);
    memset(a, 'a', n);
    kf_kern_sha256(a, n, h);
    hex(h, s);
    cr_assert_str_eq(s, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

Test(cache, key_fields_all_matter) {
    char text[128];
    kf_cache_key base = key_of(text, sizeof text, 1), k;
    uint8_t h0[32], h1[32];
    kf_cache_key_hash(&base, h0);
    k = base, k.arch = "sm_80";
    kf_cache_key_hash(&k, h1);
    cr_assert(memcmp(h0, h1, 32) != 0, "arch");
    k = base, k.compiler = "nvrtc 12.5";
    kf_cache_key_hash(&k, h1);
    cr_assert(memcmp(h0, h1, 32) != 0, "compiler");
    k = base, k.options = "-arch=sm_90";
    kf_cache_key_hash(&k, h1);
    cr_assert(memcmp(h0, h1, 32) != 0, "options");
    k = base, k.text_len--;
    kf_cache_key_hash(&k, h1);
    cr_assert(memcmp(h0, h1, 32) != 0, "text");
    /* moving a byte between fields changes the key */
    kf_cache_key a = {"x", 1, "ab", "c", ""}, b = {"x", 1, "a", "bc", ""};
    kf_cache_key_hash(&a, h0);
    kf_cache_key_hash(&b, h1);
    cr_assert(memcmp(h0, h1, 32) != 0, "field boundaries");
}

/* ---- round trips --------------------------------------------------------- */

Test(cache, put_get_round_trip_memory_and_disk) {
    char *d = temp_dir();
    kf_cache *a, *b;
    cr_assert_eq(kf_cache_open(d, &a), KF_OK, "%s", kf_last_error());
    cr_assert_str_eq(kf_cache_dir(a), d);
    cr_assert_not(get_i(a, 3));
    put_i(a, 3);
    cr_assert(get_i(a, 3));
    cr_assert_not(get_i(a, 4));
    char *p = entry_of(a, 3);
    cr_assert_eq(file_size(p), KF_CACHE_HEADER_BYTES + 1000 + 3 * 1400);
    free(p);

    /* a second handle (another process, in effect) finds it on disk */
    cr_assert_eq(kf_cache_open(d, &b), KF_OK);
    cr_assert(get_i(b, 3));
    cr_assert(get_i(b, 3)); /* promoted into memory */
    kf_cache_info s;
    cr_assert_eq(kf_cache_stats(b, &s), KF_OK);
    cr_assert_eq(s.disk_hits, 1);
    cr_assert_eq(s.mem_hits, 1);
    cr_assert_eq(s.misses, 0);
    cr_assert_eq(s.disk_entries, 1);
    kf_cache_close(a);
    kf_cache_close(b);
    rm_tree(d);
}

Test(cache, stats_count_hits_misses_bytes) {
    char *d = temp_dir();
    kf_cache *c;
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    for (int i = 0; i < 5; i++) put_i(c, i);
    for (int i = 0; i < 8; i++) get_i(c, i);
    kf_cache_info s;
    cr_assert_eq(kf_cache_stats(c, &s), KF_OK);
    uint64_t payload = 0;
    for (int i = 0; i < 5; i++) payload += 1000 + (uint64_t)i * 1400;
    cr_assert_eq(s.puts, 5);
    cr_assert_eq(s.mem_hits, 5);
    cr_assert_eq(s.misses, 3);
    cr_assert_eq(s.disk_hits, 0);
    cr_assert_eq(s.mem_entries, 5);
    cr_assert_eq(s.mem_bytes, payload);
    cr_assert_eq(s.disk_entries, 5);
    cr_assert_eq(s.disk_bytes, payload + 5 * KF_CACHE_HEADER_BYTES);
    kf_cache_close(c);
    rm_tree(d);
}

Test(cache, bad_arguments_are_errors) {
    kf_cache *c;
    char *d = temp_dir();
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    char text[128];
    kf_cache_key k = key_of(text, sizeof text, 0), nok = k;
    nok.arch = NULL;
    uint8_t b = 1;
    void *got;
    size_t len;
    bool hit;
    cr_assert_eq(kf_cache_put(c, &k, &b, 0), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_cache_put(c, &nok, &b, 1), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_cache_get(c, &nok, &got, &len, &hit), KF_ERR_INVALID_ARG);
    cr_assert_eq(kf_cache_get(c, &k, NULL, &len, &hit), KF_ERR_INVALID_ARG);
    kf_cache *c2 = (kf_cache *)&b; /* overwritten: a failed open leaves NULL */
    cr_assert_eq(kf_cache_open("", &c2), KF_ERR_INVALID_ARG);
    cr_assert_null(c2);
    kf_cache_close(c);
    kf_cache_close(NULL);
    rm_tree(d);
}

/* ---- memory LRU --------------------------------------------------------- */

Test(cache, memory_lru_evicts_least_recently_used) {
    kf_cache *c;
    /* entries also go to disk, so an evicted key comes back as a disk hit */
    char *d = temp_dir();
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    kf_cache_set_mem_limit(c, 0, 3);
    put_i(c, 0);
    put_i(c, 1);
    put_i(c, 2);
    cr_assert(get_i(c, 0)); /* 0 is now more recent than 1 and 2 */
    put_i(c, 3);            /* evicts 1 */
    kf_cache_info s;
    kf_cache_stats(c, &s);
    cr_assert_eq(s.evictions, 1);
    cr_assert_eq(s.mem_entries, 3);
    uint64_t before = s.mem_hits;
    /* hits from memory for 0, 2, 3; 1 comes back from disk */
    cr_assert(get_i(c, 0));
    cr_assert(get_i(c, 2));
    cr_assert(get_i(c, 3));
    kf_cache_stats(c, &s);
    cr_assert_eq(s.mem_hits, before + 3);
    cr_assert_eq(s.disk_hits, 0);
    cr_assert(get_i(c, 1));
    kf_cache_stats(c, &s);
    cr_assert_eq(s.disk_hits, 1, "key 1 should have been evicted from memory");
    /* promoting 1 evicted the least recent of {0, 2, 3}: 0 */
    cr_assert_eq(s.evictions, 2);
    cr_assert(get_i(c, 0));
    kf_cache_stats(c, &s);
    cr_assert_eq(s.disk_hits, 2, "key 0 should have been evicted second");

    /* the byte bound: payload 4 alone (6600 bytes) exceeds 5000 */
    kf_cache_clear(c, NULL, NULL);
    kf_cache_set_mem_limit(c, 5000, 100);
    put_i(c, 0); /* 1000 */
    put_i(c, 1); /* 2400 */
    put_i(c, 2); /* 3800: evicts 0, then 1 */
    kf_cache_stats(c, &s);
    cr_assert_eq(s.mem_entries, 1);
    cr_assert_eq(s.mem_bytes, 3800);
    put_i(c, 4);
    kf_cache_stats(c, &s);
    cr_assert_eq(s.mem_entries, 1, "an entry over the bound is not kept in memory");
    kf_cache_close(c);
    rm_tree(d);
}

/* ---- damaged entries ----------------------------------------------------- */

/* Puts key 5, damages its file with f, and checks a fresh handle misses,
 * deletes the file, and that a put rebuilds a good entry. */
static void damaged_is_miss(void (*f)(const char *path)) {
    char *d = temp_dir();
    kf_cache *c, *r;
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    put_i(c, 5);
    char *p = entry_of(c, 5);
    f(p);
    cr_assert_eq(kf_cache_open(d, &r), KF_OK);
    cr_assert_not(get_i(r, 5), "damaged entry must be a miss");
    cr_assert_not(exists(p), "damaged entry '%s' must be deleted", p);
    kf_cache_info s;
    kf_cache_stats(r, &s);
    cr_assert_eq(s.bad_entries, 1);
    cr_assert_eq(s.misses, 1);
    put_i(r, 5);
    kf_cache_close(r);
    cr_assert_eq(kf_cache_open(d, &r), KF_OK);
    cr_assert(get_i(r, 5), "rebuilt entry");
    free(p);
    kf_cache_close(r);
    kf_cache_close(c);
    rm_tree(d);
}

static void flip_at(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, off, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(ch ^ 0x10, f);
    fclose(f);
}

static void truncate_payload(const char *p) { cr_assert_eq(truncate(p, file_size(p) - 1), 0); }
static void truncate_header(const char *p) { cr_assert_eq(truncate(p, 40), 0); }
static void truncate_empty(const char *p) { cr_assert_eq(truncate(p, 0), 0); }
static void flip_payload(const char *p) { flip_at(p, KF_CACHE_HEADER_BYTES + 777); }
static void flip_length(const char *p) { flip_at(p, 80); }
static void flip_key(const char *p) { flip_at(p, 20); }
static void flip_checksum_field(const char *p) { flip_at(p, 100); }
static void foreign_magic(const char *p) {
    FILE *f = fopen(p, "r+b");
    fwrite("\x7f" "ELF", 1, 4, f);
    fclose(f);
}
/* A well-formed entry of another format version (header checksum fixed up,
 * so it is the version check that rejects it). */
static void other_version(const char *p) {
    FILE *f = fopen(p, "r+b");
    uint8_t h[KF_CACHE_HEADER_BYTES], sum[32];
    cr_assert_eq(fread(h, 1, sizeof h, f), sizeof h);
    h[8] = KF_CACHE_FORMAT_VERSION + 1;
    kf_kern_sha256(h, 120, sum);
    memcpy(h + 120, sum, 8);
    fseek(f, 0, SEEK_SET);
    fwrite(h, 1, sizeof h, f);
    fclose(f);
}
/* The key hash matches but the stored text hash does not: what a key
 * collision would look like. It must never be handed out. */
static void other_text(const char *p) {
    FILE *f = fopen(p, "r+b");
    uint8_t h[KF_CACHE_HEADER_BYTES], sum[32];
    cr_assert_eq(fread(h, 1, sizeof h, f), sizeof h);
    h[48] ^= 1;
    kf_kern_sha256(h, 120, sum);
    memcpy(h + 120, sum, 8);
    fseek(f, 0, SEEK_SET);
    fwrite(h, 1, sizeof h, f);
    fclose(f);
}
static void appended(const char *p) {
    FILE *f = fopen(p, "ab");
    fputc(0, f);
    fclose(f);
}

Test(cache, truncated_payload_is_miss) { damaged_is_miss(truncate_payload); }
Test(cache, truncated_header_is_miss) { damaged_is_miss(truncate_header); }
Test(cache, empty_file_is_miss) { damaged_is_miss(truncate_empty); }
Test(cache, flipped_payload_bit_is_miss) { damaged_is_miss(flip_payload); }
Test(cache, flipped_length_bit_is_miss) { damaged_is_miss(flip_length); }
Test(cache, flipped_key_bit_is_miss) { damaged_is_miss(flip_key); }
Test(cache, flipped_checksum_bit_is_miss) { damaged_is_miss(flip_checksum_field); }
Test(cache, foreign_magic_is_miss) { damaged_is_miss(foreign_magic); }
Test(cache, other_version_is_miss) { damaged_is_miss(other_version); }
Test(cache, overlong_is_miss) { damaged_is_miss(appended); }
Test(cache, other_text_hash_is_miss) { damaged_is_miss(other_text); }

Test(cache, every_header_bit_is_checked) {
    char *d = temp_dir();
    kf_cache *c;
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    char *p = entry_of(c, 2);
    for (long off = 0; off < KF_CACHE_HEADER_BYTES; off++) {
        put_i(c, 2);
        flip_at(p, off);
        kf_cache *r;
        cr_assert_eq(kf_cache_open(d, &r), KF_OK);
        cr_assert_not(get_i(r, 2), "flipped header byte %ld must be a miss", off);
        cr_assert_not(exists(p), "byte %ld", off);
        kf_cache_close(r);
    }
    free(p);
    kf_cache_close(c);
    rm_tree(d);
}

/* ---- unwritable and full folders ----------------------------------------- */

Test(cache, folder_under_a_file_is_clean_error) {
    char *d = temp_dir();
    char file[256], sub[300];
    snprintf(file, sizeof file, "%s/plain", d);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(sub, sizeof sub, "%s/cache", file);
    kf_cache *c;
    cr_assert_eq(kf_cache_open(sub, &c), KF_ERR_IO);
    cr_assert(strstr(kf_last_error(), sub), "message names the folder: %s", kf_last_error());
    cr_assert_not_null(c, "a memory-only cache is still returned");
    cr_assert_null(kf_cache_dir(c));
    put_i(c, 1);
    cr_assert(get_i(c, 1), "the memory cache still works");
    kf_cache_info s;
    cr_assert_eq(kf_cache_stats(c, &s), KF_OK);
    cr_assert_eq(s.disk_entries, 0);
    kf_cache_close(c);
    rm_tree(d);
}

Test(cache, folder_removed_after_open_put_is_clean_error) {
    char *d = temp_dir();
    kf_cache *c;
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    cr_assert_eq(rmdir(d), 0);
    char text[128];
    size_t len;
    kf_cache_key k = key_of(text, sizeof text, 7);
    uint8_t *p = payload_of(7, &len);
    cr_assert_eq(kf_cache_put(c, &k, p, len), KF_ERR_IO);
    cr_assert(strstr(kf_last_error(), d), "message names the file: %s", kf_last_error());
    free(p);
    cr_assert(get_i(c, 7), "the memory cache still works");
    kf_cache_info s;
    cr_assert_eq(kf_cache_stats(c, &s), KF_ERR_IO);
    cr_assert_eq(s.write_errors, 1);
    kf_cache_close(c);
    free(d);
}

Test(cache, read_only_folder_is_clean_error) {
    if (geteuid() == 0) cr_skip_test("running as root: permissions do not stop writes");
    char *d = temp_dir();
    cr_assert_eq(chmod(d, 0500), 0);
    kf_cache *c;
    cr_assert_eq(kf_cache_open(d, &c), KF_ERR_IO);
    cr_assert(strstr(kf_last_error(), d));
    put_i(c, 1);
    cr_assert(get_i(c, 1));
    kf_cache_close(c);
    chmod(d, 0700);
    rm_tree(d);
}

/* A full disk, simulated with a file size limit in a child process: the
 * write fails (EFBIG), put reports it, no temp file is left behind, and
 * memory still serves the entry. */
Test(cache, full_disk_is_clean_error) {
    char *d = temp_dir();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &rl);
        kf_cache *c;
        int code = 0;
        if (kf_cache_open(d, &c) != KF_OK) _exit(10);
        char text[128];
        size_t len;
        kf_cache_key k = key_of(text, sizeof text, 20); /* 29 KB payload */
        uint8_t *p = payload_of(20, &len);
        if (kf_cache_put(c, &k, p, len) != KF_ERR_IO) code = 11;
        else if (!strstr(kf_last_error(), d)) code = 12;
        void *got;
        size_t glen;
        bool hit;
        if (!code && (kf_cache_get(c, &k, &got, &glen, &hit) || !hit || glen != len || memcmp(got, p, len)))
            code = 13;
        if (!code) free(got);
        free(p);
        kf_cache_close(c);
        _exit(code);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", d);
    cr_assert_eq(system(cmd), 0, "nothing (no temp file) may be left in %s", d);
    rm_tree(d);
}

/* ---- many processes ------------------------------------------------------- */

enum { WRITERS = 4, KEYS = 50 };

Test(cache, concurrent_writers_leave_whole_entries) {
    char *d = temp_dir();
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        cr_assert_geq(pids[w], 0);
        if (pids[w] == 0) {
            kf_cache *c, *r;
            if (kf_cache_open(d, &c) != KF_OK) _exit(20);
            /* each writer starts at a different key so writes overlap */
            for (int j = 0; j < KEYS; j++) {
                int i = (j + w * 13) % KEYS;
                char text[128];
                size_t len;
                kf_cache_key k = key_of(text, sizeof text, i);
                uint8_t *p = payload_of(i, &len);
                if (kf_cache_put(c, &k, p, len) != KF_OK) _exit(21);
                free(p);
                /* a reader with empty memory sees whole entries or none:
                 * it reads the keys the other writers are writing now */
                if (kf_cache_open(d, &r) != KF_OK) _exit(22);
                for (int o = 1; o < WRITERS; o++) {
                    int back = (j + ((w + o) % WRITERS) * 13) % KEYS;
                    kf_cache_key kb = key_of(text, sizeof text, back);
                    void *got;
                    size_t glen;
                    bool hit;
                    if (kf_cache_get(r, &kb, &got, &glen, &hit)) _exit(23);
                    if (hit) {
                        size_t wl;
                        uint8_t *want = payload_of(back, &wl);
                        if (glen != wl || memcmp(got, want, wl)) _exit(24);
                        free(want);
                        free(got);
                    }
                }
                kf_cache_info s;
                kf_cache_stats(r, &s);
                if (s.bad_entries) _exit(25);
                kf_cache_close(r);
            }
            kf_cache_close(c);
            _exit(0);
        }
    }
    for (int w = 0; w < WRITERS; w++) {
        int status;
        cr_assert_eq(waitpid(pids[w], &status, 0), pids[w]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d status %d", w, status);
    }
    kf_cache *c;
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    kf_cache_info s;
    cr_assert_eq(kf_cache_stats(c, &s), KF_OK);
    cr_assert_eq(s.disk_entries, KEYS, "entries on disk: %llu", (unsigned long long)s.disk_entries);
    for (int i = 0; i < KEYS; i++) cr_assert(get_i(c, i), "key %d", i);
    kf_cache_stats(c, &s);
    cr_assert_eq(s.disk_hits, KEYS);
    cr_assert_eq(s.bad_entries, 0);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq %d", d, KEYS);
    cr_assert_eq(system(cmd), 0, "only the %d entries (no temp files) in %s", KEYS, d);
    kf_cache_close(c);
    rm_tree(d);
}

/* ---- clear and the default folder ---------------------------------------- */

Test(cache, clear_removes_only_kfuse_entries) {
    char *d = temp_dir();
    kf_cache *c;
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    for (int i = 0; i < 4; i++) put_i(c, i);
    static const char *others[] = {
        "notes.txt",
        "kf-0123.kfc",                                                                /* too short */
        "kf-0123456789abcdef0123456789abcdef0123456789abcdef0123456789ABCDEF.kfc",    /* upper hex */
        "kf-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.kfc.bak", /* suffix */
    };
    char path[512];
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", d, others[i]);
        FILE *f = fopen(path, "w");
        fputs("keep me", f);
        fclose(f);
    }
    /* a directory with an entry's name is not a file to remove either */
    snprintf(path, sizeof path, "%s/kf-%064d.kfc", d, 0);
    cr_assert_eq(mkdir(path, 0700), 0);
    /* a fresh temp file may belong to a live writer: kept */
    snprintf(path, sizeof path, "%s/kf-%064d.kfc.tmp.abc123", d, 1);
    fclose(fopen(path, "w"));

    uint64_t removed, bytes;
    cr_assert_eq(kf_cache_clear(c, &removed, &bytes), KF_OK, "%s", kf_last_error());
    cr_assert_eq(removed, 4);
    cr_assert_eq(bytes, 4 * KF_CACHE_HEADER_BYTES + 1000 + 2400 + 3800 + 5200);
    kf_cache_info s;
    kf_cache_stats(c, &s);
    cr_assert_eq(s.disk_entries, 0);
    cr_assert_eq(s.mem_entries, 0);
    cr_assert_not(get_i(c, 0));
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", d, others[i]);
        cr_assert(exists(path), "'%s' must survive clear", others[i]);
    }
    snprintf(path, sizeof path, "%s/kf-%064d.kfc", d, 0);
    cr_assert(exists(path));
    snprintf(path, sizeof path, "%s/kf-%064d.kfc.tmp.abc123", d, 1);
    cr_assert(exists(path));
    kf_cache_close(c);
    rm_tree(d);
}

Test(cache, default_dir_from_environment) {
    setenv("KFUSE_CACHE_DIR", "/x/kc", 1);
    char *s = kf_cache_default_dir();
    cr_assert_str_eq(s, "/x/kc");
    free(s);
    unsetenv("KFUSE_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/x/xdg", 1);
    s = kf_cache_default_dir();
    cr_assert_str_eq(s, "/x/xdg/kfuse");
    free(s);
    setenv("XDG_CACHE_HOME", "relative", 1); /* XDG: relative paths are ignored */
    setenv("HOME", "/x/home", 1);
    s = kf_cache_default_dir();
    cr_assert_str_eq(s, "/x/home/.cache/kfuse");
    free(s);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    cr_assert_null(kf_cache_default_dir());
    kf_cache *c;
    cr_assert_eq(kf_cache_open(NULL, &c), KF_ERR_IO);
    cr_assert_not_null(c);
    put_i(c, 2);
    cr_assert(get_i(c, 2));
    kf_cache_close(c);
}

Test(cache, open_creates_nested_folders) {
    char *d = temp_dir();
    char sub[300];
    snprintf(sub, sizeof sub, "%s/a/b/c", d);
    kf_cache *c;
    cr_assert_eq(kf_cache_open(sub, &c), KF_OK, "%s", kf_last_error());
    put_i(c, 0);
    kf_cache_close(c);
    struct stat sb;
    cr_assert_eq(stat(sub, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0700);
    rm_tree(d);
}

/* ---- the command-line verb ------------------------------------------------ */

/* Runs `kfuse cache ARGS` (the binary next to this test binary's folder);
 * returns the exit code, output in out. Skips when there is no binary. */
static int cache_cli(const char *args, char *out, size_t n) {
    char self[PATH_MAX], bin[PATH_MAX + 32], cmd[2 * PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(len, 0);
    self[len] = 0;
    *strrchr(self, '/') = 0;
    snprintf(bin, sizeof bin, "%s/../tools/kfuse", self);
    if (access(bin, X_OK) != 0) cr_skip_test("no kfuse binary at %s", bin);
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' cache %s 2>&1", bin, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    while (fgetc(p) != EOF) {
    }
    int status = pclose(p);
    cr_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

Test(cache, cli_stats_and_clear, .timeout = 120) {
    char *d = temp_dir();
    kf_cache *c;
    cr_assert_eq(kf_cache_open(d, &c), KF_OK);
    put_i(c, 0);
    put_i(c, 1);
    char path[512], args[600], out[2048], want[256];
    snprintf(path, sizeof path, "%s/keep.txt", d);
    fclose(fopen(path, "w"));
    snprintf(args, sizeof args, "stats --dir '%s'", d);
    cr_assert_eq(cache_cli(args, out, sizeof out), 0, "%s", out);
    snprintf(want, sizeof want, "entries: 2\nbytes: %d\n", 2 * KF_CACHE_HEADER_BYTES + 1000 + 2400);
    cr_assert(strstr(out, want), "stats output:\n%s", out);
    snprintf(args, sizeof args, "clear --dir '%s'", d);
    cr_assert_eq(cache_cli(args, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "removed 2 entries"), "clear output:\n%s", out);
    cr_assert(exists(path), "clear must leave other files alone");
    kf_cache_info s;
    kf_cache_stats(c, &s);
    cr_assert_eq(s.disk_entries, 0);
    snprintf(args, sizeof args, "stats --dir '%s/keep.txt/sub'", d);
    cr_assert_eq(cache_cli(args, out, sizeof out), 3);
    cr_assert(strstr(out, "keep.txt/sub"), "the message names the folder:\n%s", out);
    cr_assert_eq(cache_cli("frobnicate", out, sizeof out), 2);
    kf_cache_close(c);
    rm_tree(d);
}
