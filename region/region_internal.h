/* region_internal.h — what the files of the region compiler share. */
#ifndef REGC_REGION_INTERNAL_H
#define REGC_REGION_INTERNAL_H

#include "program.h"

/* Lower the region graph's nodes to the forward and backward instruction
 * lists (region/lower.c): at O1 and O2 views become aliases, matmuls take
 * their bias and GELU as GEMM epilogues, a norm's backward takes the
 * gradient sum after it, and elementwise chains fuse. slot_of[t] is the
 * slot of region tensor t. */
int regc_region_lower(regc_compiled_region *r, const int *slot_of, regc_level level);

/* The residual add fused with the norm that reads its sum right after it,
 * over an instruction list, in place; returns the number of pairs fused. */
int regc_fuse_add_norm(regc_instr *ins, int *n);

/* An embedding backward whose fresh table only feeds an add into the
 * gradient it sums with (out = out + table) accumulates into out at the
 * add's place instead, and the add goes; bufs are the program buffers the
 * instructions name. Returns the number fused. */
int regc_fuse_embed_bwd_add(regc_instr *ins, int *n, const regc_buf *bufs);

#endif
