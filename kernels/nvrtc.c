/*
 * nvrtc.c: the compile half of the CUDA backend: CUDA kernel text (codegen/
 * body + CUDA prelude) through NVRTC to CUBIN for one arch, with ptxas'
 * verbose figures (registers, spill bytes) read back from the log. Needs
 * the NVRTC library only, never a GPU or driver; compiled out (with a
 * reason) when CMake found no CUDA toolkit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kf_exec.h"

#ifndef KF_HAVE_NVRTC

const char *kf_nvrtc_unavailable(void) { return "kfuse was built without NVRTC (no CUDA toolkit at configure time)"; }

kf_status kf_nvrtc_compile(const char *src, const char *arch, kf_nvrtc_report *r) {
    (void)src, (void)arch, (void)r;
    return kf_fail(KF_ERR_NO_DEVICE, "%s", kf_nvrtc_unavailable());
}

void kf_nvrtc_version(char *buf, size_t len) { snprintf(buf, len, "nvrtc none"); }

kf_status kf_nvrtc_cubin(const char *src, const char *arch, void **cubin, size_t *len, kf_nvrtc_report *r) {
    (void)src, (void)arch, (void)r;
    *cubin = NULL, *len = 0;
    return kf_fail(KF_ERR_NO_DEVICE, "%s", kf_nvrtc_unavailable());
}

#else

#include <nvrtc.h>

const char *kf_nvrtc_unavailable(void) {
    int major = 0, minor = 0;
    return nvrtcVersion(&major, &minor) == NVRTC_SUCCESS ? NULL : "NVRTC is linked but does not answer";
}

void kf_nvrtc_version(char *buf, size_t len) {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    snprintf(buf, len, "nvrtc %d.%d", major, minor);
}

/* Sums every "N bytes spill stores/loads" and takes the largest "Used N
 * registers" of the ptxas -v lines (one block per kernel). */
static void parse_ptxas(const char *log, kf_nvrtc_report *r) {
    for (const char *c = log; (c = strstr(c, "Used ")) != NULL; c += 5) {
        int regs = atoi(c + 5);
        if (strncmp(strchr(c + 5, ' ') ? strchr(c + 5, ' ') : "", " registers", 10) == 0 && regs > r->registers)
            r->registers = regs;
    }
    const char *keys[2] = {" bytes spill stores", " bytes spill loads"};
    int64_t *dst[2] = {&r->spill_stores, &r->spill_loads};
    for (int k = 0; k < 2; k++)
        for (const char *c = log; (c = strstr(c, keys[k])) != NULL; c++) {
            const char *b = c;
            while (b > log && b[-1] >= '0' && b[-1] <= '9') b--;
            if (*dst[k] < 0) *dst[k] = 0;
            *dst[k] += strtoll(b, NULL, 10);
        }
}

/* The compile both entry points share; cubin NULL: size only. */
static kf_status compile(const char *src, const char *arch, void **cubin, kf_nvrtc_report *r) {
    *r = (kf_nvrtc_report){0, -1, -1, -1, ""};
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    const char *opts[] = {archopt, "--ptxas-options=-v", "--std=c++17"};
    nvrtcProgram prog;
    nvrtcResult e = nvrtcCreateProgram(&prog, src, "kfuse_kernel.cu", 0, NULL, NULL);
    if (e != NVRTC_SUCCESS) return kf_fail(KF_ERR_NOMEM, "nvrtcCreateProgram: %s", nvrtcGetErrorString(e));
    nvrtcResult ce = nvrtcCompileProgram(prog, 3, opts);
    size_t loglen = 0;
    char *log = NULL;
    if (nvrtcGetProgramLogSize(prog, &loglen) == NVRTC_SUCCESS && (log = kf_malloc(loglen + 1)) != NULL) {
        if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) loglen = 0;
        log[loglen] = 0;
        snprintf(r->log, sizeof r->log, "%s", log);
        parse_ptxas(log, r);
    }
    kf_status st = KF_OK;
    if (ce != NVRTC_SUCCESS)
        st = kf_fail(KF_ERR_COMPILE, "NVRTC (%s) failed: %s\n%s", arch, nvrtcGetErrorString(ce), log ? log : "");
    else if ((e = nvrtcGetCUBINSize(prog, &r->binary_bytes)) != NVRTC_SUCCESS)
        st = kf_fail(KF_ERR_COMPILE, "NVRTC (%s): no CUBIN: %s", arch, nvrtcGetErrorString(e));
    else if (cubin) {
        if (!(*cubin = malloc(r->binary_bytes ? r->binary_bytes : 1)))
            st = kf_fail(KF_ERR_NOMEM, "out of memory for a %zu-byte CUBIN", r->binary_bytes);
        else if ((e = nvrtcGetCUBIN(prog, *cubin)) != NVRTC_SUCCESS) {
            free(*cubin);
            *cubin = NULL;
            st = kf_fail(KF_ERR_COMPILE, "NVRTC (%s): nvrtcGetCUBIN: %s", arch, nvrtcGetErrorString(e));
        }
    }
    kf_free(log);
    nvrtcDestroyProgram(&prog);
    return st;
}

kf_status kf_nvrtc_compile(const char *src, const char *arch, kf_nvrtc_report *r) {
    return compile(src, arch, NULL, r);
}

kf_status kf_nvrtc_cubin(const char *src, const char *arch, void **cubin, size_t *len, kf_nvrtc_report *r) {
    *cubin = NULL;
    kf_status st = compile(src, arch, cubin, r);
    *len = st ? 0 : r->binary_bytes;
    return st;
}

#endif
