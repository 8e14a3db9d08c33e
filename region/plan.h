/* plan.h — static memory planning over a straight-line program (private to
 * region/): offsets in one arena for buffers whose lifetimes are known, the
 * lower bound any plan must reach, and a memory-aware execution order.
 *
 * Program points are instruction indices 0 .. n_points-1. A buffer is live
 * from the instruction that first writes it to the last one that reads it,
 * both included, so an instruction's inputs and outputs never share memory
 * unless the caller declares the output in place of an input. */
#ifndef REGC_PLAN_H
#define REGC_PLAN_H

#include <stdint.h>

typedef struct {
    int64_t bytes;
    int first, last; /* first <= last */
    /* -1, or a buffer whose last read is this buffer's first write by an
     * elementwise instruction: this buffer may take over its memory (in
     * place) instead of getting its own */
    int inplace_of;
} regc_plan_buffer;

typedef struct {
    int64_t peak_bytes;        /* arena size of the plan */
    int64_t lower_bound_bytes; /* max over points of the bytes live there (in-place pairs counted
                                  once) */
    int n_inplace;             /* buffers that took over their input's memory */
} regc_plan_result;

/* Where planned buffers start: every activation buffer and region slot on
 * a 256-byte boundary, cuBLASLt's largest alignment preference. A GEMM's
 * operands then have the same alignment wherever a plan puts them, so the
 * GPU chooses the same algorithm for a layer in a regional program and in
 * a full one, and the two give the same bits there too. */
#define REGC_PLAN_ALIGN 256

/* Assign offset[i] (a multiple of align, a power of two) to each of the n
 * buffers so that no two buffers live at the same point overlap, except an
 * in-place pair, which may share one offset. Best fit by decreasing size
 * (the "greedy by size" offset planner). An in-place pair is honoured only
 * when the input dies exactly where the output is born, the output is no
 * larger, and no other buffer claimed that input first. Fails (negative
 * status) on bad input (negative size, last < first, alignment not a power
 * of two) or when out of memory. */
int regc_plan_offsets(int n, const regc_plan_buffer *bufs, int64_t align, int64_t *offset,
                      regc_plan_result *res);

/* The lower bound alone, as in regc_plan_result, over points
 * 0 .. n_points-1; a negative status on bad input. */
int64_t regc_plan_lower_bound(int n, const regc_plan_buffer *bufs, int n_points);

/* A memory-aware execution order. Instruction i reads buffers
 * reads[read_start[i] .. read_start[i+1]-1] and writes buffers
 * writes[write_start[i] .. write_start[i+1]-1]; the program order is a valid
 * order. Dependencies are the buffer hazards (read after write, write after
 * read, write after write). Writes order[0..n_instr-1], a permutation that
 * respects every dependency, chosen by list scheduling: among the ready
 * instructions, the one that frees the most bytes net of what it allocates
 * goes first; ties keep program order. Buffers never written by any
 * instruction (inputs) are live throughout and never freed. The caller
 * plans both orders and keeps the one with the lower peak. */
int regc_plan_order(int n_instr, const int *read_start, const int *reads, const int *write_start,
                    const int *writes, int n_buffers, const int64_t *bytes, int *order);

#endif
