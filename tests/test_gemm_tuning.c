/* test_gemm_tuning.c — a program's GEMMs are prepared when it is bound, and
 * what the backend chose is kept in the compile cache beside the step,
 * under the backend's device, so a warm start chooses nothing.
 *
 * The backend here is the CPU's with three entries of a tuning backend
 * (the CUDA backend's cuBLASLt algorithms, which need a GPU): preparing a
 * GEMM "searches" (counts a query) unless the shape's choice was loaded,
 * and the choices save and load as bytes. Checked: binding prepares every
 * distinct GEMM of the flat step once and stores the choices; a second
 * start from the cache loads them and makes no query; another device's
 * start finds none; bytes the backend refuses are a miss (choose afresh,
 * the run unharmed); the program runs the same either way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "regc_cache.h"
#include "regc_models.h"
#include "regc_region.h"
#include "test_util.h"

#define TUNING_MAGIC 0x74756e65u /* "tune" */
#define MAX_CHOICES 64

typedef struct {
    int64_t m, n, k, epilogue;
} choice;

/* The CPU backend's table, copied, with the tuning entries; the first
 * member, so a regc_backend * is a tuned * too. */
typedef struct {
    regc_backend be;
    regc_backend *cpu; /* owns the context the copied entries use */
    choice chosen[MAX_CHOICES];
    int n_chosen;
    choice loaded[MAX_CHOICES];
    int n_loaded, recalled, refuse_load;
} tuned;

static int same(const choice *a, const choice *b) { return !memcmp(a, b, sizeof *a); }

static int tuned_prepare(regc_backend *be, const regc_gemm *g)
{
    tuned *t = (tuned *)be;
    const choice c = {g->m, g->n, g->k, g->epilogue};
    for (int i = 0; i < t->n_chosen; i++)
        if (same(&t->chosen[i], &c))
            return REGC_OK;
    int found = 0;
    for (int i = 0; i < t->n_loaded && !found; i++)
        found = same(&t->loaded[i], &c);
    if (found)
        t->recalled++;
    else
        be->tuning_queries++;
    assert_true(t->n_chosen < MAX_CHOICES);
    t->chosen[t->n_chosen++] = c;
    return REGC_OK;
}

static size_t tuned_save(regc_backend *be, void *buf, size_t cap)
{
    tuned *t = (tuned *)be;
    const uint32_t magic = TUNING_MAGIC;
    const size_t need = sizeof magic + (size_t)t->n_chosen * sizeof(choice);
    if (buf && cap >= need) {
        memcpy(buf, &magic, sizeof magic);
        memcpy((char *)buf + sizeof magic, t->chosen, (size_t)t->n_chosen * sizeof(choice));
    }
    return need;
}

static int tuned_load(regc_backend *be, const void *data, size_t len)
{
    tuned *t = (tuned *)be;
    uint32_t magic = 0;
    if (len >= sizeof magic)
        memcpy(&magic, data, sizeof magic);
    if (t->refuse_load || magic != TUNING_MAGIC || (len - sizeof magic) % sizeof(choice) ||
        (len - sizeof magic) / sizeof(choice) > MAX_CHOICES)
        return regc_error(REGC_ERR_FORMAT, "tuning: not this backend's choices");
    t->n_loaded = (int)((len - sizeof magic) / sizeof(choice));
    memcpy(t->loaded, (const char *)data + sizeof magic, len - sizeof magic);
    return REGC_OK;
}

static tuned *tuned_new(const char *device)
{
    tuned *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->cpu = regc_backend_new("cpu", 1);
    assert_non_null(t->cpu);
    t->be = *t->cpu;
    t->be.device = device;
    t->be.destroy = NULL;
    t->be.gemm_prepare = tuned_prepare;
    t->be.tuning_save = tuned_save;
    t->be.tuning_load = tuned_load;
    return t;
}

static void tuned_free(tuned *t)
{
    regc_backend_free(t->cpu);
    free(t);
}

/* A step of gpt2-tiny compiled through the cache in dir for t's device,
 * bound, run once; its loss into *loss. */
static void bind_and_run(const char *dir, tuned *t, float *loss)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load_shapes("gpt2-tiny", &m), REGC_OK);
    regc_cache *cache = NULL;
    assert_int_equal(regc_cache_open(dir, 0, NULL, &cache), REGC_OK);
    regc_compile_options o;
    regc_compile_options_default(&o);
    o.cache = cache;
    o.device = t->be.device;
    regc_program *p = NULL;
    assert_int_equal(regc_program_compile(m, 2, 8, &o, &p, NULL), REGC_OK);
    regc_backend *be = &t->be;
    const size_t bytes = (size_t)regc_model_total_numel(m) * sizeof(float);
    float *params = be->alloc(be, bytes), *grads = be->alloc(be, bytes);
    be->fill(be, params, bytes / sizeof(float), 0.02f);
    void *inputs[8] = {0};
    assert_true(regc_program_n_inputs(p) <= 8);
    for (int i = 0; i < regc_program_n_inputs(p); i++) {
        size_t b = (size_t)regc_tensor_bytes(regc_program_input(p, i));
        inputs[i] = be->alloc(be, b);
        be->fill(be, inputs[i], b / sizeof(float), 0.0f); /* token 0 everywhere */
    }
    regc_program_memory mem = {
        .params = params, .grads = grads, .inputs = inputs, .tuning_cache = cache};
    assert_int_equal(regc_program_bind(p, be, &mem), REGC_OK);
    assert_int_equal(regc_program_run(p), REGC_OK);
    be->copy_d2h(be, loss, regc_program_loss(p), sizeof *loss);
    regc_program_free(p);
    for (int i = 0; i < 8; i++)
        if (inputs[i])
            be->free(be, inputs[i]);
    be->free(be, params), be->free(be, grads);
    regc_cache_close(cache);
    regc_model_free(m);
}

static void test_warm_start_chooses_nothing(void **state)
{
    regc_test_dir *d = *state;
    float cold_loss, warm_loss, other_loss;

    tuned *cold = tuned_new("cpu tuned");
    bind_and_run(d->dir, cold, &cold_loss);
    /* every distinct GEMM of the step prepared at bind, each searched once */
    assert_true(cold->n_chosen >= 4);
    assert_int_equal(cold->be.tuning_queries, cold->n_chosen);
    assert_int_equal(cold->recalled, 0);

    tuned *warm = tuned_new("cpu tuned");
    bind_and_run(d->dir, warm, &warm_loss);
    assert_int_equal(warm->n_loaded, cold->n_chosen);
    assert_int_equal(warm->be.tuning_queries, 0);
    assert_int_equal(warm->recalled, cold->n_chosen);
    assert_memory_equal(&warm_loss, &cold_loss, sizeof cold_loss);

    /* the choices are the device's: another device searches afresh */
    tuned *other = tuned_new("cpu another");
    bind_and_run(d->dir, other, &other_loss);
    assert_int_equal(other->n_loaded, 0);
    assert_int_equal(other->be.tuning_queries, other->n_chosen);
    assert_memory_equal(&other_loss, &cold_loss, sizeof cold_loss);
    tuned_free(cold), tuned_free(warm), tuned_free(other);
}

static void test_refused_tuning_is_a_miss(void **state)
{
    regc_test_dir *d = *state;
    float first, second;
    tuned *a = tuned_new("cpu tuned");
    bind_and_run(d->dir, a, &first);
    tuned *b = tuned_new("cpu tuned");
    b->refuse_load = 1; /* as bytes of another build would be */
    bind_and_run(d->dir, b, &second);
    assert_int_equal(b->n_loaded, 0);
    assert_int_equal(b->be.tuning_queries, b->n_chosen);
    assert_memory_equal(&first, &second, sizeof first);
    /* and what it chose afresh replaced the entry: a third start loads it */
    tuned *c = tuned_new("cpu tuned");
    bind_and_run(d->dir, c, &second);
    assert_int_equal(c->be.tuning_queries, 0);
    tuned_free(a), tuned_free(b), tuned_free(c);
}

static int dir_setup(void **state) { return regc_test_dir_setup(state, "tuning", NULL); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_warm_start_chooses_nothing, dir_setup,
                                        regc_test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_refused_tuning_is_a_miss, dir_setup,
                                        regc_test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
