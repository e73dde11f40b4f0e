/*
 * kfuse public C API.
 *
 * Conventions: every function returns kf_status (KF_OK == 0) unless noted;
 * on failure a human-readable message naming the offending node, tensor or
 * file is available from kf_last_error() on the same thread. Handles are
 * opaque; each function says who owns memory afterwards. Nothing here
 * aborts or exits on bad input.
 */
#ifndef KFUSE_H
#define KFUSE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KF_BUILDING_LIBRARY) && defined(__GNUC__)
#define KF_API __attribute__((visibility("default")))
#else
#define KF_API
#endif

#define KFUSE_VERSION_MAJOR 0
#define KFUSE_VERSION_MINOR 1
#define KFUSE_VERSION_PATCH 0

/* Status codes. Numbers never shift. */
typedef enum kf_status {
    KF_OK = 0,
    KF_ERR_INVALID_ARG = 1, /* caller passed something impossible */
    KF_ERR_BAD_MODEL = 2,   /* the ONNX file is malformed or inconsistent */
    KF_ERR_UNSUPPORTED = 3, /* valid ONNX that kfuse does not handle */
    KF_ERR_SHAPE = 4,       /* shapes or dtypes disagree */
    KF_ERR_NOMEM = 5,       /* allocation failed */
    KF_ERR_IO = 6,          /* a file could not be read or written */
    KF_ERR_RUNTIME = 7,     /* data-dependent failure while running (index out of range) */
    KF_ERR_NO_DEVICE = 8,   /* the requested backend has no usable device */
    KF_ERR_COMPILE = 9,     /* a kernel failed to compile */
    KF_ERR_INTERNAL = 10    /* a kfuse bug that was survivable */
} kf_status;

/* Short name of a status ("bad model"). Static storage. */
KF_API const char *kf_status_name(kf_status s);
/* Last error message of this thread; never NULL; valid until the next kfuse
 * call on the same thread. */
KF_API const char *kf_last_error(void);
/* Library version string ("0.1.0"). Static storage. */
KF_API const char *kf_version(void);

/* Hook called on an internal assertion failure (a kfuse bug). The default
 * prints file:line and aborts; a host may install its own. */
typedef void (*kf_assert_hook)(const char *file, int line, const char *msg);
KF_API void kf_set_assert_hook(kf_assert_hook hook);

/* ---- models ---------------------------------------------------------- */

typedef struct kf_model kf_model;

/* Loads an ONNX model file. External data is resolved relative to the
 * file's folder and must stay inside it. On success *out is owned by the
 * caller (kf_model_free). */
KF_API kf_status kf_model_load(const char *path, kf_model **out);
/* Loads from memory; external data, if any, is resolved against base_dir
 * (NULL: external data is an error). The buffer is not retained. */
KF_API kf_status kf_model_load_memory(const void *data, size_t len, const char *base_dir,
                                      kf_model **out);
/* Writes the model as standard ONNX. */
KF_API kf_status kf_model_save(const kf_model *m, const char *path);
/* Serialises into a malloc'ed buffer the caller frees with free(). */
KF_API kf_status kf_model_save_memory(const kf_model *m, void **data, size_t *len);
KF_API void kf_model_free(kf_model *m);

/* ---- running on the reference evaluator ------------------------------ */

/* A host tensor view: dtype numbers are ONNX TensorProto.DataType. */
typedef struct kf_host_tensor {
    int dtype;
    int rank;
    const int64_t *dims;
    const void *data; /* row-major */
} kf_host_tensor;

#ifdef __cplusplus
}
#endif
#endif
