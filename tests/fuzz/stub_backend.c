/* stub_backend.c — the CPU backend's entry points for the fuzz build, which
 * leaves kernels/cpu out (it needs OpenMP, and no parser runs a kernel).
 * The option table links the training loop, which can name the backend;
 * a harness that asked for it would get an error, never a kernel. */
#include <stddef.h>

#include "regc_backend.h"
#include "regc_common.h"

regc_backend *regc_backend_cpu_new(int threads)
{
    (void)threads;
    regc_error(REGC_ERR_UNSUPPORTED, "cpu backend: not in the fuzz build");
    return NULL;
}

const char *regc_backend_cpu_gemm_name(void) { return "none (fuzz build)"; }
