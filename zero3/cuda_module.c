/* cuda_module.c — the entry of libregc_cuda.so (see regc_backend.h): the
 * table of what the module offers, and regc_error forwarded to the
 * library that loaded it, so a message set here is the one the library's
 * regc_error_message() reads. Built into the module only; it sits in
 * zero3/ because the module holds the NCCL communicator too, and zero3/ is
 * the higher of the two folders it joins. */
#include <stdarg.h>
#include <stdio.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "regc_zero3.h"

static regc_error_fn host_error;

int regc_error(int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return host_error ? host_error(status, "%s", msg) : status;
}

__attribute__((visibility("default"))) const regc_cuda_module *
regc_cuda_module_entry(regc_error_fn error)
{
    static const regc_cuda_module table = {
        .abi = REGC_CUDA_MODULE_ABI,
        .backend_new = regc_cuda_backend_open,
        .device_count = regc_cuda_device_count,
#ifdef REGC_HAVE_NCCL
        .nccl_comm_new = regc_cuda_nccl_comm_open,
#endif
    };
    host_error = error;
    return &table;
}
