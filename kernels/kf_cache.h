/*
 * kf_cache.h: the kernel cache. Compiled kernels (cubin, OpenCL program
 * binary: opaque bytes here) keyed by everything that decides their
 * content, kept in a bounded in-memory LRU in front of a directory of entry
 * files that many processes may share. A cache only ever saves time: every
 * failure in it degrades to a miss or a reported error, never a wrong kernel.
 */
#ifndef KF_CACHE_H
#define KF_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kf_base.h"

/* ---- limits (each says why it has its value) ------------------------- */

/* Memory side, bytes of payload: a fused elementwise cubin is 5-50 KiB and
 * a large model has a few hundred kernels, so 64 MiB holds the kernels of
 * several models at once while staying small next to their weights. */
#define KF_CACHE_MEM_BYTES ((size_t)64 << 20)
/* Memory side, entries: lookup is a linear scan of 32-byte keys, which at
 * 1024 entries costs microseconds against a compile of milliseconds. */
#define KF_CACHE_MEM_ENTRIES 1024
/* One payload may not exceed 256 MiB: the largest cubins seen are a few
 * MiB, and a corrupt length field must not become a huge allocation. */
#define KF_CACHE_MAX_PAYLOAD ((uint64_t)256 << 20)
/* Bumped whenever the entry layout changes; an entry of another version is
 * a miss, deleted and rebuilt. */
#define KF_CACHE_FORMAT_VERSION 1u

#define KF_SHA256_BYTES 32

/* Everything that decides the compiled bytes. All strings are required
 * (use "" for none); text need not be NUL-terminated. */
typedef struct kf_cache_key {
    const char *text;     /* the kernel source */
    size_t text_len;
    const char *arch;     /* "sm_90", "opencl:<device name>" */
    const char *compiler; /* compiler name and version, "nvrtc 12.4" */
    const char *options;  /* compiler options, in the order passed */
} kf_cache_key;

typedef struct kf_cache_info {
    /* counters since kf_cache_open (this process, this handle) */
    uint64_t mem_hits, disk_hits, misses;
    uint64_t puts, write_errors;
    uint64_t evictions;   /* memory entries dropped by the LRU bound */
    uint64_t bad_entries; /* disk entries found damaged and deleted */
    /* memory side now */
    uint64_t mem_entries, mem_bytes;
    /* disk side now, from a scan of the directory (kfuse entry files only;
     * 0 for a memory-only cache) */
    uint64_t disk_entries, disk_bytes;
} kf_cache_info;

typedef struct kf_cache kf_cache;

/* The default cache directory: $KFUSE_CACHE_DIR, else $XDG_CACHE_HOME/kfuse
 * (when absolute, as XDG requires), else $HOME/.cache/kfuse. Returns a
 * malloc'ed string the caller frees, or NULL with KF_ERR_IO in the last
 * error when none of these variables is set. */
char *kf_cache_default_dir(void);

/* Opens a cache on dir (NULL: kf_cache_default_dir()), creating the folder
 * and its parents (mode 0700) when missing. Returns KF_OK with *out owned
 * by the caller (kf_cache_close). When the folder cannot be made or used,
 * returns KF_ERR_IO naming it, and *out is still a usable memory-only cache
 * the caller must close. On KF_ERR_NOMEM or KF_ERR_INVALID_ARG *out is NULL. */
kf_status kf_cache_open(const char *dir, kf_cache **out);

/* Directory of the cache, or NULL for a memory-only cache. Owned by c. */
const char *kf_cache_dir(const kf_cache *c);

/* Sets the memory bound (bytes of payload and entry count; 0 keeps a
 * bound as it is), evicting least recently used entries to fit. */
void kf_cache_set_mem_limit(kf_cache *c, size_t max_bytes, uint32_t max_entries);

/* Looks the key up in memory, then on disk. On a hit *hit is true and
 * *bytes (*len bytes, caller frees with free()) holds the payload; on a miss
 * *hit is false and *bytes NULL. A damaged, foreign or other-version disk
 * entry is a miss and is deleted. A disk hit is promoted into memory.
 * Returns KF_OK for hit and miss; KF_ERR_INVALID_ARG / KF_ERR_NOMEM only.
 * Thread-safe. */
kf_status kf_cache_get(kf_cache *c, const kf_cache_key *key, void **bytes, size_t *len,
                       bool *hit);

/* Stores len bytes (1..KF_CACHE_MAX_PAYLOAD; copied) under key: into
 * memory, then into a temp file in the cache folder renamed over the entry,
 * so concurrent readers see the old entry, the new one or none, never part
 * of one. Returns KF_ERR_IO naming the file when the disk write fails; the
 * memory entry is kept, so later gets in this process still hit.
 * Thread-safe. */
kf_status kf_cache_put(kf_cache *c, const kf_cache_key *key, const void *bytes, size_t len);

/* Fills *s (counters, memory figures, and a scan of the folder). Returns
 * KF_ERR_IO naming the folder when it cannot be listed (*s still holds the
 * counters and memory figures). */
kf_status kf_cache_stats(kf_cache *c, kf_cache_info *s);

/* Empties the memory side and deletes the kfuse entry files of the folder
 * (names kf-<64 hex>.kfc, and temp files of writers that died more than a
 * minute ago); nothing else in the folder is touched. *removed / *bytes
 * (either may be NULL) receive the count and size of deleted entries.
 * Returns KF_ERR_IO naming the first file or folder that could not be
 * removed or listed. */
kf_status kf_cache_clear(kf_cache *c, uint64_t *removed, uint64_t *bytes);

/* Frees the cache handle; entries on disk stay. NULL is a no-op. */
void kf_cache_close(kf_cache *c);

/* ---- exposed for tests and tools ------------------------------------- */

/* SHA-256 (FIPS 180-4) of len bytes. */
void kf_kern_sha256(const void *data, size_t len, uint8_t out[KF_SHA256_BYTES]);

/* The 32-byte key hash of key (what the entry file is named after), and the
 * entry file path of it in c's folder (malloc'ed; NULL for a memory-only
 * cache or on allocation failure). */
void kf_cache_key_hash(const kf_cache_key *key, uint8_t out[KF_SHA256_BYTES]);
char *kf_cache_entry_path(const kf_cache *c, const kf_cache_key *key);

/* Size of the fixed header that precedes the payload in an entry file. */
#define KF_CACHE_HEADER_BYTES 128

#endif
