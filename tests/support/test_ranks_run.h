/* test_ranks_run.h — `regc train` under mpirun for the multi-process
 * tests: the token files they read, the launch, and what each run prints. */
#ifndef REGC_TEST_RANKS_RUN_H
#define REGC_TEST_RANKS_RUN_H

#define REGC_RANKS_MPIRUN "/usr/bin/mpirun"
#define REGC_RANKS_STEPS 5 /* the step losses a run's loss[] receives */

/* A directory and two token files in it for a group of tests. */
typedef struct {
    char *dir;
    char *periodic; /* tokens whose period is one batch of 2 x 16 (T5's rows: 2 x 16) */
    char *plain;    /* tokens without a period */
} regc_ranks_data;

/* The group's, made and removed by the group setup and teardown below
 * (cmocka_run_group_tests' arguments). */
extern regc_ranks_data regc_ranks;
int regc_ranks_group_setup(void **state);
int regc_ranks_group_teardown(void **state);
/* mpirun and the options every job here takes (root allowed, more ranks
 * than cores, no binding, one thread per rank, no leak check of Open MPI's
 * own memory) into argv from n; returns the new count. */
int regc_ranks_add_mpirun(const char **argv, int n);
/* regc train on `np` ranks (0: one process, no mpirun) with args after
 * "train" (NULL-terminated): the step losses into loss[REGC_RANKS_STEPS]
 * (NAN where none, loss may be NULL), the last device_peak printed into
 * *peak (NAN when none; peak may be NULL), stderr into *err (malloc'd;
 * NULL: printed when the run fails). Returns the exit status. */
int regc_ranks_run(int np, const char *const *args, double *loss, double *peak, char **err);
/* Fail unless files a and b hold the same bytes. */
void regc_test_same_bytes(const char *a, const char *b);

#endif
