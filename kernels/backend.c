/* backend.c — choosing a backend by name, and freeing one. */
#include <stdlib.h>
#include <string.h>

#include "regc_backend.h"
#include "regc_common.h"

#ifndef REGC_HAVE_CUDA
regc_backend *regc_backend_cuda_new(int device)
{
    (void)device;
    regc_error(REGC_ERR_UNSUPPORTED,
               "regc was built without the CUDA backend (configure with -DREGC_CUDA=ON)");
    return NULL;
}

int regc_backend_cuda_device_count(void) { return 0; }
#endif

/* "cuda" is device 0; "cuda:N" picks device N. */
static int backend_parse_cuda_device(const char *name, int *device)
{
    if (strcmp(name, "cuda") == 0) {
        *device = 0;
        return 1;
    }
    if (strncmp(name, "cuda:", 5) != 0 || name[5] < '0' || name[5] > '9')
        return 0;
    char *end = NULL;
    long d = strtol(name + 5, &end, 10);
    if (*end != '\0' || d > 1024)
        return 0;
    *device = (int)d;
    return 1;
}

regc_backend *regc_backend_new(const char *name, int threads)
{
    if (!name) {
        regc_error(REGC_ERR_ARG, "backend: no name given (expected \"cpu\" or \"cuda\")");
        return NULL;
    }
    if (strcmp(name, "cpu") == 0)
        return regc_backend_cpu_new(threads);
    int device;
    if (backend_parse_cuda_device(name, &device))
        return regc_backend_cuda_new(device);
    regc_error(REGC_ERR_ARG, "backend: unknown backend \"%s\" (expected \"cpu\" or \"cuda\")",
               name);
    return NULL;
}

void regc_backend_free(regc_backend *be)
{
    if (be && be->destroy)
        be->destroy(be);
}
