/* compile_cache.c — the compile driver's use of the compile cache: what
 * keys a region and a whole step, and reading and storing both.
 *
 * Every key starts with the target the code is compiled for. A region is
 * keyed on its canonical form (region/serial.c), so the same layer of
 * another depth or another model hits. A step is keyed on the options that
 * change the program and on what the graph is built from (the model's
 * structure at a batch and sequence, or a graph's canonical form). An
 * entry that does not decode is a miss: the caller compiles afresh and the
 * store that follows replaces it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"
#include "serial.h"

int regc_compile_uses_cache(const regc_compile_options *o) { return o->cache && !o->dump_dir; }

static const char *target(const regc_compile_options *o) { return o->device ? o->device : "cpu"; }

int regc_compile_cached_region(const regc_graph *g, const regc_region_spec *spec, regc_level level,
                               const regc_compile_options *o, regc_compile_stats *st, int *compiles,
                               regc_compiled_region **out)
{
    regc_bytes canon = {0}, payload = {0};
    int rc = REGC_OK, hit = 0;
    if (regc_compile_uses_cache(o)) {
        double t0 = regc_time_ms();
        regc_bytes_put_str(&canon, target(o));
        if ((rc = regc_region_canon(g, spec, level, &canon)) == REGC_OK)
            hit = regc_cache_get(o->cache, &canon, &payload);
        if (hit < 0)
            rc = hit;
        if (hit > 0) {
            regc_reader rd = regc_reader_of(payload.data, payload.len);
            hit = regc_region_read(&rd, out) == REGC_OK && rd.p == rd.end;
            if (hit) { /* the kind's name in this step, not the one it was stored under */
                free((*out)->name);
                if (!((*out)->name = strdup(spec->name)))
                    rc = regc_error(REGC_ERR_MEMORY, "compile: out of memory");
            } else {
                regc_compiled_region_free(*out);
                *out = NULL;
                fprintf(stderr, "regc: cache: region %s: malformed entry; compiling afresh\n",
                        spec->name);
            }
        }
        st->cache_ms += regc_time_ms() - t0;
    }
    if (rc == REGC_OK && hit) {
        st->cache_hits++;
    } else if (rc == REGC_OK) {
        ++*compiles;
        rc = regc_region_compile(g, spec, level, out);
        if (rc == REGC_OK && regc_compile_uses_cache(o)) {
            char label[160];
            snprintf(label, sizeof label, "region: %d nodes, %d inputs, %d outputs, %s, %s",
                     spec->n_nodes, spec->n_in, spec->n_out, regc_level_name(level), target(o));
            regc_bytes_free(&payload);
            regc_region_write(*out, &payload);
            rc = payload.failed ? regc_error(REGC_ERR_MEMORY, "compile: out of memory")
                                : regc_cache_put(o->cache, &canon, label, &payload);
            st->cache_misses++;
        }
    }
    regc_bytes_free(&canon), regc_bytes_free(&payload);
    return rc;
}

void regc_compile_step_key(const regc_compile_options *o, regc_bytes *b)
{
    regc_bytes_put_str(b, target(o));
    regc_bytes_put_str(b, "step");
    regc_bytes_put_u64(b, (uint64_t)o->level);
    regc_bytes_put_u64(b, (uint64_t)(o->regional != 0));
    regc_bytes_put_u64(b, (uint64_t)(o->inline_back && o->level != REGC_LEVEL_O0));
    regc_bytes_put_u64(b, (uint64_t)(o->forward_only != 0));
    regc_bytes_put_u64(b, (uint64_t)(o->accumulate_grads != 0)); /* seeds every region */
    regc_bytes_put_u64(b, (uint64_t)(o->ranks > 1 ? o->ranks : 1));
    regc_bytes_put_u64(b, (uint64_t)o->zero_stage);
    regc_bytes_put_u64(b, (uint64_t)(o->zero_stage == 3 && o->deepcompile));
    regc_bytes_put_i64(b, o->zero_stage == 3 && o->deepcompile ? o->prefetch_floats : 0);
    regc_bytes_put_i64(b, o->zero_stage == 3 ? o->budget_bytes : 0);
}

int regc_compile_load_step(const regc_compile_options *o, const regc_bytes *canon,
                           regc_program **out, regc_compile_stats *st)
{
    regc_bytes payload = {0};
    int hit = regc_cache_get(o->cache, canon, &payload);
    if (hit > 0 && regc_program_read(payload.data, payload.len, out, st) != REGC_OK) {
        fprintf(stderr, "regc: cache: %s; compiling afresh\n", regc_error_message());
        hit = 0;
    }
    regc_bytes_free(&payload);
    return hit;
}

int regc_compile_store_step(const regc_compile_options *o, const regc_bytes *canon,
                            const char *what, const regc_program *p, regc_compile_stats *st)
{
    char label[320];
    snprintf(label, sizeof label, "step: %s, %s, %s, %s", what, regc_level_name(o->level),
             o->regional ? "regional" : "full", target(o));
    regc_bytes payload = {0};
    regc_program_write(p, st, &payload);
    int rc = payload.failed ? regc_error(REGC_ERR_MEMORY, "compile: out of memory")
                            : regc_cache_put(o->cache, canon, label, &payload);
    regc_bytes_free(&payload);
    st->cache_misses++;
    return rc;
}
