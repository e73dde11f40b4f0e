/*
 * clc.c: kfuse_clc FILE.cl...: builds each OpenCL C file on its own with
 * the first OpenCL device (no options beyond -cl-std=CL1.2, no defines),
 * the check that `kfuse fuse --emit` writes sources that stand alone.
 * Prints one line per file and the build log of any that fails; exits 1
 * when a file does not build, 2 when no OpenCL device answers.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
            *len = fread(buf, 1, (size_t)n, f);
            buf[*len] = 0;
        }
    }
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    cl_platform_id plat;
    cl_device_id dev;
    cl_int e;
    if (clGetPlatformIDs(1, &plat, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) {
        fprintf(stderr, "kfuse_clc: no OpenCL device\n");
        return 2;
    }
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
    if (e != CL_SUCCESS) {
        fprintf(stderr, "kfuse_clc: no OpenCL context (error %d)\n", e);
        return 2;
    }
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        size_t len = 0;
        char *src = slurp(argv[i], &len);
        if (!src) {
            fprintf(stderr, "kfuse_clc: %s: cannot read\n", argv[i]);
            failed++;
            continue;
        }
        const char *text = src;
        cl_program prog = clCreateProgramWithSource(ctx, 1, &text, &len, &e);
        if (e == CL_SUCCESS) e = clBuildProgram(prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL);
        if (e != CL_SUCCESS) {
            size_t n = 0;
            char *log = NULL;
            if (prog && clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) == CL_SUCCESS &&
                (log = malloc(n + 1)) &&
                clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS)
                log[n] = 0;
            fprintf(stderr, "kfuse_clc: %s: build failed (error %d)\n%s\n", argv[i], e, log ? log : "");
            free(log);
            failed++;
        }
        if (prog) clReleaseProgram(prog);
        free(src);
    }
    clReleaseContext(ctx);
    printf("kfuse_clc: %d of %d OpenCL files built\n", argc - 1 - failed, argc - 1);
    return failed ? 1 : 0;
}
