/* compile_cache.c — the compile driver's use of the compile cache: what
 * keys a region and a whole step, and reading and storing both.
 *
 * Every key starts with the target the code is compiled for. A region is
 * keyed on its canonical form (region/serial.c), so the same layer of
 * another depth or another model hits. A step is keyed on the options that
 * change the program and on what the graph is built from (the model's
 * structure at a batch and sequence, or a graph's canonical form). An
 * entry is input, whoever wrote it: one that does not decode, or whose
 * decoded region or program fails validation (region/validate.c; a region
 * also against the formals it is compiled for), is a miss that names the
 * entry's file: the caller compiles afresh and the store that follows
 * replaces it. Debug builds validate what they store too: the compiler
 * must never write an entry its own decoder refuses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "region_internal.h"
#include "serial.h"
#include "validate.h"

int regc_compile_uses_cache(const regc_compile_options *o)
{
    return o->cache && !o->dump_dir && !o->fit_check; /* fit_check's answer is no step */
}

static const char *target(const regc_compile_options *o) { return o->device ? o->device : "cpu"; }

/* One line for an entry that checked out but did not decode or validate:
 * its file, what it held and why (regc_error_message). */
static void refused(const regc_compile_options *o, const regc_bytes *canon, const char *what)
{
    char path[4200];
    regc_cache_entry_path(o->cache, canon, path, sizeof path);
    fprintf(stderr, "regc: cache: %s: %s: %s; compiling afresh\n", path, what,
            regc_error_message());
}

/* The compiler's output passes its own decoder's checks; a debug build
 * stops at one that does not, before it is stored. */
static void check_own(int rc, const char *what)
{
#ifndef NDEBUG
    if (rc != REGC_OK) {
        fprintf(stderr, "regc: internal error: the compiler made an unsound %s: %s\n", what,
                regc_error_message());
        abort();
    }
#else
    (void)rc, (void)what;
#endif
}

int regc_compile_cached_region(const regc_graph *g, const regc_region_spec *spec, regc_level level,
                               const regc_compile_options *o, regc_compile_stats *st, int *compiles,
                               regc_compiled_region **out)
{
    regc_bytes canon = {0}, payload = {0};
    int rc = REGC_OK, hit = 0;
    if (regc_compile_uses_cache(o)) {
        double t0 = regc_time_ms();
        regc_bytes_put_str(&canon, target(o));
        rc = regc_region_canon(g, spec, level, &canon);
        /* at the end: `regc cache verify` reads the device and the kind
         * first; fp32 storage matters only under bf16 */
        regc_bytes_put_u64(&canon, (uint64_t)o->precision);
        regc_bytes_put_u64(&canon,
                           (uint64_t)(o->precision == REGC_PRECISION_BF16 && o->fp32_storage != 0));
        if (rc == REGC_OK)
            hit = regc_cache_get(o->cache, &canon, &payload);
        if (hit < 0)
            rc = hit;
        if (hit > 0) {
            regc_reader rd = regc_reader_of(payload.data, payload.len);
            hit = regc_region_read(&rd, out) == REGC_OK;
            if (hit && rd.p != rd.end)
                hit = 0,
                regc_error(REGC_ERR_FORMAT, "compile cache: trailing bytes after a region");
            if (hit && regc_region_validate_spec(*out, g, spec) != REGC_OK)
                hit = 0;
            if (hit) { /* the kind's name in this step, not the one it was stored under */
                free((*out)->name);
                if (!((*out)->name = strdup(spec->name)))
                    rc = regc_error(REGC_ERR_MEMORY, "compile: out of memory");
            } else {
                regc_compiled_region_free(*out);
                *out = NULL;
                refused(o, &canon, spec->name);
            }
        }
        st->cache_ms += regc_time_ms() - t0;
    }
    if (rc == REGC_OK && hit) {
        st->cache_hits++;
    } else if (rc == REGC_OK) {
        ++*compiles;
        rc = regc_region_compile(g, spec, level, o->precision, !o->fp32_storage, out);
        if (rc == REGC_OK && regc_compile_uses_cache(o)) {
            check_own(regc_region_validate(*out), "region");
            check_own(regc_region_validate_spec(*out, g, spec), "region");
            char label[160];
            snprintf(label, sizeof label, "region: %d nodes, %d inputs, %d outputs, %s, %s, %s",
                     spec->n_nodes, spec->n_in, spec->n_out, regc_level_name(level),
                     regc_precision_name(o->precision), target(o));
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
    regc_bytes_put_u64(b, (uint64_t)o->precision);
    regc_bytes_put_u64(b, (uint64_t)(o->precision == REGC_PRECISION_BF16 && o->fp32_storage != 0));
    regc_bytes_put_u64(b, (uint64_t)(o->regional != 0));
    regc_bytes_put_u64(b, (uint64_t)(o->inline_back && o->level != REGC_LEVEL_O0));
    regc_bytes_put_u64(b, (uint64_t)(o->forward_only != 0));
    regc_bytes_put_u64(b, (uint64_t)(o->accumulate_grads != 0)); /* seeds every region */
    regc_bytes_put_u64(b, (uint64_t)(o->ranks > 1 ? o->ranks : 1));
    regc_bytes_put_u64(b, (uint64_t)o->zero_stage);
    /* what the schedule passes read, whatever the stage: a pass a program
     * registers may read any of them */
    regc_bytes_put_u64(b, (uint64_t)(o->deepcompile != 0));
    regc_bytes_put_i64(b, o->reduce_bucket_floats);
    regc_bytes_put_i64(b, o->prefetch_floats);
    regc_bytes_put_i64(b, o->max_live_floats);
    regc_bytes_put_i64(b, o->budget_bytes);
    regc_bytes_put_i64(b, o->host_budget_bytes);
    regc_bytes_put_i64(b, o->persistence_floats);
    /* the schedule passes, and which re-plan this is (its profile is not
     * keyed: a restart reuses what the first run decided) */
    regc_bytes_put_u64(b, (uint64_t)o->passes.n);
    for (int i = 0; i < o->passes.n; i++) {
        regc_bytes_put_str(b, o->passes.pass[i].name);
        regc_bytes_put_i64(b, o->passes.pass[i].budget_bytes);
    }
    regc_bytes_put_i64(b, o->replan_step);
    regc_bytes_put_u64(b, (uint64_t)(o->offload_optimizer && !o->forward_only));
    regc_bytes_put_i64(b, o->logits_chunk_rows);
    regc_bytes_put_u64(b, (uint64_t)(o->offload_activation && !o->forward_only));
    regc_bytes_put_i64(b, o->offload_activation ? o->offload_limit : -1);
    /* what is recomputed: auto's choice follows from the budget keyed above */
    regc_bytes_put_u64(b, (uint64_t)o->recompute);
    int64_t ratio_bits;
    const double ratio = o->recompute == REGC_RECOMPUTE_AUTO ? o->recompute_ratio : 0.0;
    memcpy(&ratio_bits, &ratio, sizeof ratio_bits);
    regc_bytes_put_i64(b, ratio_bits);
}

int regc_compile_load_step(const regc_compile_options *o, const regc_bytes *canon,
                           regc_program **out, regc_compile_stats *st)
{
    regc_bytes payload = {0};
    int hit = regc_cache_get(o->cache, canon, &payload);
    if (hit > 0 && regc_program_read(payload.data, payload.len, out, st) != REGC_OK) {
        refused(o, canon, "step");
        hit = 0;
    }
    regc_bytes_free(&payload);
    return hit;
}

int regc_compile_store_step(const regc_compile_options *o, const regc_bytes *canon,
                            const char *what, const regc_program *p, regc_compile_stats *st)
{
    char label[320];
    snprintf(label, sizeof label, "step: %s, %s, %s, %s, %s", what, regc_level_name(o->level),
             regc_precision_name(o->precision), o->regional ? "regional" : "full", target(o));
    check_own(regc_program_validate(p), "step program");
    regc_bytes payload = {0};
    regc_program_write(p, st, &payload);
    int rc = payload.failed ? regc_error(REGC_ERR_MEMORY, "compile: out of memory")
                            : regc_cache_put(o->cache, canon, label, &payload);
    regc_bytes_free(&payload);
    st->cache_misses++;
    return rc;
}

int regc_compile_check_entry(const void *canon, size_t canon_len, const void *payload, size_t len)
{
    regc_reader rd = regc_reader_of(canon, canon_len);
    char *device = regc_reader_str(&rd), *kind = regc_reader_str(&rd);
    int rc = REGC_OK;
    if (!kind || (strcmp(kind, "region") && strcmp(kind, "step"))) {
        /* not a compile's key: no compile ever decodes it */
    } else if (!strcmp(kind, "step")) {
        regc_program *p = NULL;
        regc_compile_stats st = {0};
        rc = regc_program_read(payload, len, &p, &st);
        regc_program_free(p);
    } else {
        regc_compiled_region *r = NULL;
        regc_reader body = regc_reader_of(payload, len);
        rc = regc_region_read(&body, &r);
        if (rc == REGC_OK && body.p != body.end)
            rc = regc_error(REGC_ERR_FORMAT, "compile cache: trailing bytes after a region");
        regc_compiled_region_free(r);
    }
    free(device), free(kind);
    return rc;
}

/* ---- the backend's tuning beside a step: key "tuning", the device, the
 * step's own key */

static void tuning_key(const regc_program *p, const regc_backend *be, regc_bytes *canon)
{
    regc_bytes_put_str(canon, be->device ? be->device : be->name);
    regc_bytes_put_str(canon, "tuning");
    regc_bytes_put_u64(canon, (uint64_t)(be->tf32 != 0)); /* TF32 plans are other plans */
    regc_bytes_put(canon, p->step_key.data, p->step_key.len);
}

void regc_compile_tuning_load(regc_cache *c, const regc_program *p, regc_backend *be)
{
    if (!c || !p->step_key.len || !be->tuning_load)
        return;
    regc_bytes canon = {0}, payload = {0};
    tuning_key(p, be, &canon);
    int hit = regc_cache_get(c, &canon, &payload);
    if (hit > 0 && be->tuning_load(be, payload.data, payload.len) != REGC_OK) {
        char path[4200];
        regc_cache_entry_path(c, &canon, path, sizeof path);
        fprintf(stderr, "regc: cache: %s: %s; choosing afresh\n", path, regc_error_message());
    }
    if (hit <= 0)
        regc_error_clear(); /* a miss, or an entry the cache refused: choose afresh */
    regc_bytes_free(&canon), regc_bytes_free(&payload);
}

int regc_compile_tuning_store(regc_cache *c, const regc_program *p, regc_backend *be)
{
    if (!c || !p->step_key.len || !be->tuning_save)
        return REGC_OK;
    const size_t n = be->tuning_save(be, NULL, 0);
    uint8_t *bytes = malloc(n ? n : 1);
    if (!bytes)
        return regc_error(REGC_ERR_MEMORY, "compile cache: out of memory");
    regc_bytes canon = {0}, payload = {0};
    regc_bytes_put(&payload, bytes, be->tuning_save(be, bytes, n));
    free(bytes);
    tuning_key(p, be, &canon);
    char label[160];
    snprintf(label, sizeof label, "tuning: %s, %zu bytes", be->device ? be->device : be->name, n);
    int rc = canon.failed || payload.failed
                 ? regc_error(REGC_ERR_MEMORY, "compile cache: out of memory")
                 : regc_cache_put(c, &canon, label, &payload);
    regc_bytes_free(&canon), regc_bytes_free(&payload);
    return rc;
}
