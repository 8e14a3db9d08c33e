/* test_kernels_cpu_team.c — the CPU backend fits when its loops go
 * parallel to the cores other processes leave free (cpu_team.c): the rule
 * on the counts, the thresholds raised beside as many busy processes as
 * there are cores, and a training run giving the same bits either way. */
#define _GNU_SOURCE
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cpu/cpu_kernels.h"
#include "regc_models.h"
#include "regc_train.h"

#define MAX_BUSY 256

static pid_t busy[MAX_BUSY];
static int n_busy;

static int usable_cores(void)
{
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

static void start_busy(void)
{
    n_busy = usable_cores() < MAX_BUSY ? usable_cores() : MAX_BUSY;
    for (int i = 0; i < n_busy; i++) {
        busy[i] = fork();
        assert_true(busy[i] >= 0);
        if (busy[i] == 0)
            for (volatile unsigned long x = 0;; x++)
                ;
    }
    struct timespec ts = {0, 200 * 1000000L}; /* let them be scheduled */
    nanosleep(&ts, NULL);
}

static void stop_busy(void)
{
    for (int i = 0; i < n_busy; i++) {
        kill(busy[i], SIGKILL);
        waitpid(busy[i], NULL, 0);
    }
    n_busy = 0;
}

/* begin_run as a program run calls it, after the check interval. */
static int64_t scale_after_check(regc_backend *be)
{
    struct timespec ts = {0, 30 * 1000000L};
    nanosleep(&ts, NULL);
    be->begin_run(be);
    return regc_cpu_par_scale(be);
}

/* The rule on counts: the cores less the other processes' running tasks
 * must hold the whole team. */
static void test_contended_rule(void **state)
{
    (void)state;
    assert_false(regc_cpu_cores_contended(2, 1, 1, 2)); /* only this thread runs */
    assert_false(regc_cpu_cores_contended(2, 3, 3, 2)); /* its workers spinning too */
    assert_true(regc_cpu_cores_contended(2, 2, 1, 2));  /* one other process */
    assert_true(regc_cpu_cores_contended(2, 4, 2, 2));  /* two others */
    assert_false(regc_cpu_cores_contended(8, 4, 1, 2)); /* others, but cores to spare */
    assert_true(regc_cpu_cores_contended(8, 8, 1, 2));  /* seven others of eight cores */
    assert_false(regc_cpu_cores_contended(2, 0, 1, 2)); /* a sample racing a thread's exit */
}

/* Beside as many spinning processes as cores, whatever else runs. (That
 * the thresholds come back down needs an idle machine, which a test run
 * beside other tests is not: the rule above covers it.) */
static void test_thresholds_rise_under_load(void **state)
{
    (void)state;
    regc_backend *be = regc_backend_new("cpu", 2);
    assert_non_null(be);
    assert_non_null(be->begin_run);
    start_busy();
    int64_t loaded = scale_after_check(be);
    stop_busy();
    assert_int_equal(loaded, REGC_CPU_CONTENDED_SCALE);
    assert_int_equal(regc_cpu_threads(be), 2); /* the team keeps its size */
    regc_backend_free(be);

    /* one thread has no barrier to wait at: nothing to fit */
    be = regc_backend_new("cpu", 1);
    start_busy();
    int64_t one = scale_after_check(be);
    stop_busy();
    assert_int_equal(one, 1);
    regc_backend_free(be);
}

typedef struct {
    float loss[8];
    int n;
} losses;

static void on_step(const regc_step_report *r, void *user)
{
    losses *l = user;
    if (l->n < 8)
        l->loss[l->n++] = r->loss;
}

static void train_llama(losses *l)
{
    regc_model *m = NULL;
    assert_int_equal(regc_model_load("llama-tiny", &m), REGC_OK);
    regc_train_options o;
    regc_train_options_default(&o);
    o.batch = 2, o.seq = 32, o.steps = 6, o.threads = 2, o.cache_dir = NULL;
    memset(l, 0, sizeof *l);
    assert_int_equal(regc_train(m, &o, on_step, l, NULL), REGC_OK);
    assert_int_equal(l->n, 6);
    regc_model_free(m);
}

static void test_same_bits_under_load(void **state)
{
    (void)state;
    losses idle, loaded;
    train_llama(&idle);
    start_busy();
    train_llama(&loaded);
    stop_busy();
    assert_memory_equal(idle.loss, loaded.loss, sizeof idle.loss);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contended_rule),
        cmocka_unit_test(test_thresholds_rise_under_load),
        cmocka_unit_test(test_same_bits_under_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
