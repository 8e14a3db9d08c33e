/* cuda_module.c — the entry of libregc_cuda.so (see regc_backend.h): the
 * table of what the module offers, and regc_error forwarded to the
 * library that loaded it, so a message set here is the one the library's
 * regc_error_message() reads (the module's regc_error_message() reads its
 * own copy). Built into the module only; it sits in
 * zero3/ because the module holds the NCCL communicator too, and zero3/ is
 * the higher of the two folders it joins. */
#include <stdarg.h>
#include <stdio.h>

#include "regc_backend.h"
#include "regc_common.h"
#include "regc_source_id.h"
#include "regc_zero3.h"

static regc_error_fn host_error;
/* the module's own copy of its last message, for code here that passes it
 * on (a kernel's refusal kept until sync() reports it) */
static _Thread_local char last_message[1024];

int regc_error(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return host_error ? host_error(status, "%s", last_message) : status;
}

const char *regc_error_message(void) { return last_message; }

__attribute__((visibility("default"))) const regc_cuda_module *
regc_cuda_module_entry(regc_error_fn error)
{
    static const regc_cuda_module table = {
        .abi = REGC_CUDA_MODULE_ABI,
        .source_id = REGC_SOURCE_ID,
        .backend_new = regc_cuda_backend_open,
        .device_count = regc_cuda_device_count,
        .fill_table = regc_cuda_fill_table,
#ifdef REGC_HAVE_NCCL
        .nccl_comm_new = regc_cuda_nccl_comm_open,
#endif
    };
    host_error = error;
    return &table;
}
