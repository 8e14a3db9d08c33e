/* serial.h — private to region/: what the compile cache stores and keys
 * on (region/serial.c). */
#ifndef REGC_SERIAL_H
#define REGC_SERIAL_H

#include "program.h"

/* The canonical form of compiling spec at level: formals, nodes and
 * wiring, without tensor names. */
int regc_region_canon(const regc_graph *g, const regc_region_spec *s, regc_level level,
                      regc_bytes *b);
void regc_region_write(const regc_compiled_region *r, regc_bytes *b);
int regc_region_read(regc_reader *rd, regc_compiled_region **out);
/* The step program whole (regions, lazy steps, the inline-back result and
 * its memory plan), with the stats that describe it. A program read back
 * holds its inputs but not the flat graph. */
void regc_program_write(const regc_program *p, const regc_compile_stats *st, regc_bytes *b);
int regc_program_read(const void *data, size_t len, regc_program **out, regc_compile_stats *st);

#endif
