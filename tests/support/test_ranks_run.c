/* test_ranks_run.c — `regc train` under mpirun for the multi-process tests
 * (test_ranks_run.h). Under AddressSanitizer the ranks run without leak
 * detection: Open MPI's components keep memory until exit from libraries
 * it has unloaded by then, which no suppression can name; address errors
 * are still caught, and the one-process runs check regc's own leaks. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "regc_data.h"
#include "test_ranks_run.h"
#include "test_util.h"

regc_ranks_data regc_ranks;

int regc_ranks_group_setup(void **state)
{
    (void)state;
    regc_ranks_data *d = &regc_ranks;
    memset(d, 0, sizeof *d);
    if (!(d->dir = regc_test_make_temp_dir("ranks")))
        return -1;
    d->periodic = regc_test_join(d->dir, "periodic.bin");
    d->plain = regc_test_join(d->dir, "plain.bin");
    enum { N = 6000 };
    uint16_t *t = malloc(N * sizeof *t), *u = malloc(N * sizeof *u);
    if (!t || !u) {
        free(t), free(u);
        return -1;
    }
    for (int i = 0; i < N; i++) {
        t[i] = (uint16_t)(((i % (2 * 16)) * 37 + 11) % 251); /* T5 reads 2T per row: 2 x 16 */
        u[i] = (uint16_t)(regc_rng_at(77, (uint64_t)i) % 251);
    }
    int rc = regc_tokens_write(d->periodic, t, N) || regc_tokens_write(d->plain, u, N);
    free(t), free(u);
    return rc;
}

int regc_ranks_group_teardown(void **state)
{
    (void)state;
    regc_ranks_data *d = &regc_ranks;
    if (d->dir)
        regc_test_remove_tree(d->dir);
    free(d->dir), free(d->periodic), free(d->plain);
    memset(d, 0, sizeof *d);
    return 0;
}

int regc_ranks_add_mpirun(const char **argv, int n)
{
    static const char *const mpi[] = {REGC_RANKS_MPIRUN,
                                      "--allow-run-as-root",
                                      "--oversubscribe",
                                      "--bind-to",
                                      "none",
                                      "-x",
                                      "OMP_NUM_THREADS=1",
                                      "-x",
                                      "ASAN_OPTIONS=detect_leaks=0"};
    for (size_t i = 0; i < sizeof mpi / sizeof *mpi; i++)
        argv[n++] = mpi[i];
    return n;
}

int regc_ranks_run(int np, const char *const *args, double *loss, double *peak, char **err)
{
    const char *argv[64];
    int n = 0;
    char npbuf[16];
    if (np > 0) {
        snprintf(npbuf, sizeof npbuf, "%d", np);
        n = regc_ranks_add_mpirun(argv, n);
        argv[n++] = "-np";
        argv[n++] = npbuf;
    }
    argv[n++] = REGC_BIN;
    argv[n++] = "train";
    for (int i = 0; args[i]; i++) {
        assert_true(n < 63);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    regc_test_proc p;
    int rc = regc_test_run_argv(argv, &p);
    for (int k = 0; loss && k < REGC_RANKS_STEPS; k++)
        loss[k] = NAN;
    if (peak)
        *peak = NAN;
    for (char *line = strtok(p.out, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "loss");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "device_peak");
        if (loss && cJSON_IsNumber(s) && cJSON_IsNumber(l) && s->valueint >= 0 &&
            s->valueint < REGC_RANKS_STEPS)
            loss[s->valueint] = l->valuedouble;
        if (peak && cJSON_IsNumber(d))
            *peak = d->valuedouble;
        cJSON_Delete(o);
    }
    if (err)
        *err = strdup(p.err);
    else if (rc != 0)
        fprintf(stderr, "%s", p.err);
    regc_test_proc_free(&p);
    return rc;
}

void regc_test_same_bytes(const char *a, const char *b)
{
    size_t na, nb;
    char *x = regc_test_read_file(a, &na), *y = regc_test_read_file(b, &nb);
    if (!x || !y || na != nb || memcmp(x, y, na) != 0)
        fail_msg("%s and %s differ", a, b);
    free(x), free(y);
}
