/*
 * nvrtc.c: the compile half of the CUDA backend: CUDA kernel text (codegen/
 * body + CUDA prelude) through NVRTC to CUBIN for one arch, with ptxas'
 * verbose figures (registers, spill bytes) read back from the log. Needs
 * the NVRTC library only, never a GPU or driver; compiled out (with a
 * reason) when CMake found no CUDA toolkit. NVRTC is loaded with dlopen the
 * first time a kernel is compiled, as the driver and cuBLASLt are: linked,
 * its 200,000 relocations cost every kfuse process about 4 ms at start,
 * a fifth of `kfuse opt` on a small model.
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

#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>

static struct {
    pthread_once_t once;
    void *lib;
    const char *why;
    char whybuf[512];
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                 const char *const *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    const char *(*GetErrorString)(nvrtcResult);
} rtc = {.once = PTHREAD_ONCE_INIT};

/* The soname of the toolkit kfuse was built with, the one before it (the
 * calls used are the same), then the library CMake found, by path. */
static void load_nvrtc(void) {
    const char *names[] = {KF_NVRTC_SONAME, "libnvrtc.so.13", "libnvrtc.so.12", KF_NVRTC_PATH};
    const char *err = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !rtc.lib; i++)
        if (!(rtc.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL))) err = dlerror();
    if (!rtc.lib) {
        snprintf(rtc.whybuf, sizeof rtc.whybuf, "NVRTC could not be loaded (%s)", err ? err : "?");
        rtc.why = rtc.whybuf;
        return;
    }
    const kf_dl_sym syms[] = {
#define SYM(field) {(void **)&rtc.field, "nvrtc" #field}
        SYM(Version),      SYM(CreateProgram), SYM(CompileProgram), SYM(GetProgramLogSize), SYM(GetProgramLog),
        SYM(GetCUBINSize), SYM(GetCUBIN),      SYM(DestroyProgram), SYM(GetErrorString),
#undef SYM
    };
    const char *missing = kf_dl_resolve(rtc.lib, syms, sizeof syms / sizeof syms[0]);
    int major = 0, minor = 0;
    if (missing)
        snprintf(rtc.whybuf, sizeof rtc.whybuf, "the NVRTC library lacks %s", missing);
    else if (rtc.Version(&major, &minor) != NVRTC_SUCCESS)
        snprintf(rtc.whybuf, sizeof rtc.whybuf, "NVRTC is loaded but does not answer");
    else
        return;
    rtc.why = rtc.whybuf;
    dlclose(rtc.lib);
    rtc.lib = NULL;
}

const char *kf_nvrtc_unavailable(void) {
    pthread_once(&rtc.once, load_nvrtc);
    return rtc.why;
}

void kf_nvrtc_version(char *buf, size_t len) {
    int major = 0, minor = 0;
    if (kf_nvrtc_unavailable()) snprintf(buf, len, "nvrtc none");
    else {
        rtc.Version(&major, &minor);
        snprintf(buf, len, "nvrtc %d.%d", major, minor);
    }
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
    const char *why = kf_nvrtc_unavailable();
    if (why) return kf_fail(KF_ERR_NO_DEVICE, "%s", why);
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    const char *opts[] = {archopt, "--ptxas-options=-v", "--std=c++17"};
    nvrtcProgram prog;
    nvrtcResult e = rtc.CreateProgram(&prog, src, "kfuse_kernel.cu", 0, NULL, NULL);
    if (e != NVRTC_SUCCESS) return kf_fail(KF_ERR_NOMEM, "nvrtcCreateProgram: %s", rtc.GetErrorString(e));
    nvrtcResult ce = rtc.CompileProgram(prog, 3, opts);
    size_t loglen = 0;
    char *log = NULL;
    if (rtc.GetProgramLogSize(prog, &loglen) == NVRTC_SUCCESS && (log = kf_malloc(loglen + 1)) != NULL) {
        if (rtc.GetProgramLog(prog, log) != NVRTC_SUCCESS) loglen = 0;
        log[loglen] = 0;
        snprintf(r->log, sizeof r->log, "%s", log);
        parse_ptxas(log, r);
    }
    kf_status st = KF_OK;
    if (ce != NVRTC_SUCCESS)
        st = kf_fail(KF_ERR_COMPILE, "NVRTC (%s) failed: %s\n%s", arch, rtc.GetErrorString(ce), log ? log : "");
    else if ((e = rtc.GetCUBINSize(prog, &r->binary_bytes)) != NVRTC_SUCCESS)
        st = kf_fail(KF_ERR_COMPILE, "NVRTC (%s): no CUBIN: %s", arch, rtc.GetErrorString(e));
    else if (cubin) {
        if (!(*cubin = malloc(r->binary_bytes ? r->binary_bytes : 1)))
            st = kf_fail(KF_ERR_NOMEM, "out of memory for a %zu-byte CUBIN", r->binary_bytes);
        else if ((e = rtc.GetCUBIN(prog, *cubin)) != NVRTC_SUCCESS) {
            free(*cubin);
            *cubin = NULL;
            st = kf_fail(KF_ERR_COMPILE, "NVRTC (%s): nvrtcGetCUBIN: %s", arch, rtc.GetErrorString(e));
        }
    }
    kf_free(log);
    rtc.DestroyProgram(&prog);
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
