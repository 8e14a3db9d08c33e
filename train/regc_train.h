/* regc_train.h — the training loop and its config file. */
#ifndef REGC_TRAIN_H
#define REGC_TRAIN_H

#include <stdint.h>

#include "regc_common.h"
#include "regc_models.h"
#include "regc_region.h"

/* ======================================================================
 * Training
 * ====================================================================== */
typedef struct {
    const char *data_path;   /* NULL: the built-in corpus */
    int64_t batch, seq;
    int steps;
    float lr, weight_decay;
    float beta1, beta2, eps; /* AdamW; 0.9, 0.999, 1e-8 by default */
    uint64_t seed;           /* random init of presets */
    const char *save_dir;    /* NULL: do not save */
    const char *backend;     /* "cpu" */
    int threads;             /* <= 0: OMP_NUM_THREADS or all cores */
    regc_compile_options compile;
    const char *cache_dir;   /* the compile cache's directory; NULL: none */
    int64_t cache_max_bytes; /* its size limit; <= 0: none */
    /* when set, every step after the first (the only one, if just one) is
     * timed per instruction, the optimizer and input copies included */
    regc_profile *profile;
    /* called once the step is compiled, with regc_train's user pointer */
    void (*on_compiled)(const regc_compile_stats *st, void *user);
} regc_train_options;

void regc_train_options_default(regc_train_options *o);

typedef struct {
    int step;          /* from 0 */
    float loss;        /* of this step's forward pass, before its update */
    double ms;         /* wall time of the whole step */
    double tokens_per_s;
} regc_step_report;

typedef void (*regc_step_fn)(const regc_step_report *r, void *user);

/* Train m in place for o->steps steps, calling on_step after each. Presets
 * without weights are initialised from o->seed first. */
int regc_train(regc_model *m, const regc_train_options *o, regc_step_fn on_step, void *user);

/* ======================================================================
 * Config file (JSON): {"compile": {...}, "train": {...}}. The train keys
 * mirror the `regc train` flags (model, weights, data, steps, batch, seq,
 * lr, weight_decay, seed, threads, save, json); the compile keys are
 * use_regional_compilation, level, backend, dump_graphs, inline_back.
 * Unknown keys and bad values are errors naming the file and the key.
 * ====================================================================== */
typedef struct regc_config regc_config;
int regc_config_load(const char *path, regc_config **out);
void regc_config_free(regc_config *c);
/* Set the fields of o that the file sets; strings stay owned by c. */
void regc_config_apply(const regc_config *c, regc_train_options *o);
const char *regc_config_model(const regc_config *c);   /* train.model or NULL */
const char *regc_config_weights(const regc_config *c); /* train.weights or NULL */
int regc_config_json(const regc_config *c);            /* train.json: 1, 0, or -1 when unset */

#endif
