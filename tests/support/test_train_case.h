/* test_train_case.h — the end-to-end training cases of tests/data/<arch>_reference.json
 * (written by tools/reference/<arch>_reference.py), rebuilt for the real `regc`
 * binary: the case's config.json, a model filled with the same counter-based
 * random weights as the script's and saved as a Hugging Face directory, and the
 * same token file; then `regc train` on it, its per-step losses read back.
 *
 * A case records every parameter as [name, shape, center, halfwidth] in its
 * checkpoint order, the position in that list being the parameter's substream
 * index; regc's own listing must hold exactly those names and shapes, in any
 * order, so the build checks names and layouts against Hugging Face's without
 * knowing the architecture. Every helper fails the current CMocka test, with a
 * message that names the case, on a mismatch. */
#ifndef REGC_TEST_TRAIN_CASE_H
#define REGC_TEST_TRAIN_CASE_H

#include <stdint.h>

#include <cjson/cJSON.h>

typedef struct regc_model regc_model;

#define REGC_TEST_TRAIN_MAX_STEPS 64

/* The reference files, one per architecture, each written by
 * tools/reference/<arch>_reference.py (NULL-terminated). */
extern const char *const regc_test_reference_files[];

/* One case and what it owns; the teardown releases all of it, whatever the
 * test did. */
typedef struct {
    const cJSON *spec;      /* the case's record in the reference file */
    const char *name;       /* spec's "name" */
    char *tmp;              /* a fresh directory, removed with everything in it */
    char model_dir[1100];   /* tmp/model: the Hugging Face directory */
    char tokens_path[1100]; /* tmp/tokens.bin */
    regc_model *m, *reloaded;
    uint16_t *tokens;
    char *output; /* the last run's stdout */
} regc_test_train_case;

/* What one `regc train --json` run reported, step by step. */
typedef struct {
    int steps;
    double loss[REGC_TEST_TRAIN_MAX_STEPS];
    double grad_norm[REGC_TEST_TRAIN_MAX_STEPS]; /* NaN where a step reports none */
} regc_test_train_result;

/* A CMocka fixture: *state is the case's cJSON record on entry, a
 * regc_test_train_case (with its tmp directory made) after. */
int regc_test_train_case_setup(void **state);
int regc_test_train_case_teardown(void **state);

/* Write the case's config.json into model_dir, build the model from it, fill
 * every parameter from the recorded list (checking names, shapes and the
 * weights' sum against "param_sum"), save it as a Hugging Face directory that
 * must load back bit for bit, and write the token stream to tokens_path. */
void regc_test_train_case_build(regc_test_train_case *c);

/* Train the built case with the real command line for `steps` steps:
 * `regc train --json` with the case's batch, seq, lr, weight decay and
 * "extra_args", then `flags` (NULL-terminated; NULL for none). Fails unless
 * regc exits with 0 and reports exactly `steps` steps, in order. */
void regc_test_train_case_run(regc_test_train_case *c, int64_t steps, const char *const *flags,
                              regc_test_train_result *out);

/* Run `test` on every case of the reference file at `path` that has `key`
 * (NULL: every case), one CMocka test per case named after it, in a group
 * named after the file, each between the fixture above. Returns the number
 * of failures (1 when the file cannot be read or holds no such case). */
int regc_test_train_cases_run(const char *path, const char *key, void (*test)(void **state));

#endif
