/* validate.h — private to region/: the checks that make a compiled region
 * or step program safe to run, whoever wrote it (region/validate.c).
 *
 * A compile-cache entry is input: another program may have written it with
 * valid checksums. Decoding (region/serial.c) runs these checks, and so can
 * the compiler on what it made itself: every instruction's operands, with
 * the bytes its kernel will read and write, lie inside the slots or
 * buffers they name; counts, enums, fused chains, the step list, the
 * shard layout and the memory plan agree with the program's own tables. */
#ifndef REGC_VALIDATE_H
#define REGC_VALIDATE_H

#include "program.h"

/* No size in a program reaches 2^48 bytes; anything larger is damage. */
#define REGC_VALIDATE_SIZE_LIMIT ((int64_t)1 << 48)

/* What an instruction's kernel touches, from its fields alone: bytes[k]
 * from operand k's reference (0: nothing), which operands must be present,
 * and which hold int32 token ids read as indices (they must be graph
 * inputs, whose values the trainer has checked). */
typedef struct {
    int64_t bytes[REGC_INSTR_MAX_REFS];
    unsigned required; /* bit k: operand k must name memory */
    unsigned ids;      /* bit k: int32 ids or targets */
} regc_instr_extent;

/* The per-kernel rule (instr_extent.c): the one place that says what each
 * kernel touches.
 * ranks: the program's (a collective's extents depend on it). Returns
 * REGC_OK, or REGC_ERR_FORMAT with a message naming what is inconsistent
 * (an operand count, an enum, a negative or overflowing size). */
int regc_instr_extent_of(const regc_instr *in, int ranks, regc_instr_extent *e);

/* A compiled region on its own: slots, slot maps, aliases, fused chains,
 * and every instruction's extents inside the slots it names (forward
 * instructions only naming slots a forward call binds). */
int regc_region_validate(const regc_compiled_region *r);

/* A region against what it is compiled for: its formals' counts, their
 * slots' bytes (the memory the compiler will bind them to) and ids read
 * only from int32 formal inputs. */
int regc_region_validate_spec(const regc_compiled_region *r, const regc_graph *g,
                              const regc_region_spec *s);

/* A whole step program (its regions already validated): buffers against
 * the blocks, the arena plan, inputs, every instruction of the flat list,
 * the lazy steps (through each call's binding; at O0 only buffers live at
 * that step), the update, asynchronous collectives' pairing, the shard
 * layout and the loss. */
int regc_program_validate(const regc_program *p);

#endif
