/* backend.c — choosing a backend by name, freeing one, and loading the
 * CUDA module (libregc_cuda.so) on first use. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "regc_source_id.h"

/* ---------------------------------------------------------------- the CUDA module */

static const regc_cuda_module *cuda_module;
static char cuda_module_why[1024];
static pthread_once_t cuda_module_once = PTHREAD_ONCE_INIT;

#ifdef REGC_HAVE_CUDA
/* dlopen one candidate: 1 loaded, 0 no file there, -1 there but refused
 * (why says so). */
static int cuda_module_try(const char *path, int named)
{
    if (access(path, F_OK) != 0 && strchr(path, '/')) {
        if (named)
            snprintf(cuda_module_why, sizeof cuda_module_why, "%s (REGC_CUDA_MODULE): %s", path,
                     strerror(errno));
        return named ? -1 : 0;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(cuda_module_why, sizeof cuda_module_why, "%s", dlerror());
        return strchr(path, '/') ? -1 : 0;
    }
    regc_cuda_module_entry_fn entry = (regc_cuda_module_entry_fn)dlsym(h, REGC_CUDA_MODULE_ENTRY);
    const regc_cuda_module *m = entry ? entry(regc_error) : NULL;
    if (!m || m->abi != REGC_CUDA_MODULE_ABI || strcmp(m->source_id, REGC_SOURCE_ID) != 0) {
        snprintf(cuda_module_why, sizeof cuda_module_why,
                 "%s: not a CUDA module of this build of regc (ABI %d, sources %s; expected %d, "
                 "%s)",
                 path, m ? m->abi : -1, m && m->abi == REGC_CUDA_MODULE_ABI ? m->source_id : "?",
                 REGC_CUDA_MODULE_ABI, REGC_SOURCE_ID);
        dlclose(h);
        return -1;
    }
    cuda_module = m; /* kept loaded for the life of the process */
    return 1;
}

static void cuda_module_load(void)
{
    char beside[4096] = "";
    ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - 32);
    if (n > 0) {
        beside[n] = '\0';
        char *slash = strrchr(beside, '/');
        if (slash)
            snprintf(slash + 1, sizeof beside - (size_t)(slash + 1 - beside), "libregc_cuda.so");
    }
    const char *candidates[] = {getenv("REGC_CUDA_MODULE"), n > 0 ? beside : NULL,
                                REGC_CUDA_MODULE_DIR "/libregc_cuda.so", "libregc_cuda.so"};
    snprintf(cuda_module_why, sizeof cuda_module_why,
             "libregc_cuda.so not found (beside the executable, in " REGC_CUDA_MODULE_DIR
             ", on the loader's path; REGC_CUDA_MODULE names it)");
    for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++) {
        int r = candidates[i] && candidates[i][0] ? cuda_module_try(candidates[i], i == 0) : 0;
        if (r != 0)
            return; /* loaded, or refused: no other (REGC_CUDA_MODULE names the one) */
    }
}
#else
static void cuda_module_load(void)
{
    snprintf(cuda_module_why, sizeof cuda_module_why,
             "regc was built without the CUDA backend (configure with -DREGC_CUDA=ON)");
}
#endif

const regc_cuda_module *regc_cuda_module_get(void)
{
    pthread_once(&cuda_module_once, cuda_module_load);
    if (!cuda_module)
        regc_error(REGC_ERR_UNSUPPORTED, "cuda: %s", cuda_module_why);
    return cuda_module;
}

regc_backend *regc_backend_cuda_new(int device)
{
    const regc_cuda_module *m = regc_cuda_module_get();
    return m ? m->backend_new(device) : NULL;
}

int regc_backend_cuda_device_count(void)
{
    const regc_cuda_module *m = regc_cuda_module_get();
    if (!m)
        regc_error_clear(); /* no module: no device, which is no error */
    return m ? m->device_count() : 0;
}

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
