/*
 * kf_extdata.h: external data files of a loaded model (graph/extdata.c).
 * Initializers stored as ONNX external data point into a read-only mapping
 * of their file; kf_value.ext_file/ext_offset remember the region, so a
 * save can refer to it or copy it file to file instead of writing the
 * bytes from memory. Tensor data that points into a mapping lives as long
 * as its model: kf_model_free unmaps it, so a tensor moved out of the
 * model (rather than copied) must not outlive it.
 */
#ifndef KF_EXTDATA_H
#define KF_EXTDATA_H

#include "kf_ir.h"

/* One mapped external data file of a model (kf_model.ext). */
struct kf_extfile {
    char *location;      /* as the model names it, relative to the model's folder */
    char *path;          /* resolved path */
    const uint8_t *base; /* read-only private mapping of the whole file */
    size_t len;
    uint64_t dev, ino;   /* identity of the mapped file */
};

/* The mapping of external data file `real` (resolved path; `location` is
 * the name the model uses; fd an open descriptor of it), mapping it on
 * first use; *file gets its 1-based index in m->ext. NULL (and *file 0)
 * when it cannot be mapped (no mmap, KFUSE_NO_MMAP set, an empty file, too
 * many files): the caller reads the tensor instead. Speed only. */
const uint8_t *kf_extdata_map(kf_model *m, const char *real, const char *location, int fd, uint32_t *file);
/* Unmaps m's files (after its graph is freed). */
void kf_extdata_release(kf_model *m);
/* True when p points into a live mapping: such data belongs to its
 * model, and kf_tensor_release must not free it. */
bool kf_extdata_mapped(const void *p);
/* The file whose region [*offset, + byte size) initializer v still holds
 * byte for byte (its tensor data is the pointer the loader set), or NULL
 * when v's bytes are new or changed. */
const kf_extfile *kf_extdata_kept(const kf_model *m, kf_id v, int64_t *offset);
/* Copies len bytes at off of src into dst_fd at dst_off: copy_file_range
 * where the system has it (no user-space copy; a reflink on filesystems
 * that share blocks), else one streamed pass. KF_ERR_IO naming the file
 * when it cannot be read or was replaced since the model was loaded. */
kf_status kf_extdata_copy(const kf_extfile *src, int64_t off, size_t len, int dst_fd, int64_t dst_off);

#endif
