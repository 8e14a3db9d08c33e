/* test_model.h — what the model tests share: writing a small config.json
 * from an architecture's defaults, comparing two models' weights, finding a
 * parameter, the config error every frontend checks the same way, and
 * training a preset while collecting its losses. Each helper fails the
 * current CMocka test on a mismatch. */
#ifndef REGC_TEST_MODEL_H
#define REGC_TEST_MODEL_H

#include <stddef.h>

#include "regc_backend.h"
#include "regc_train.h"
#include "test_util.h"

/* Write dir/config.json (making dir): "{" head, then each default key
 * (keys[i] = {name, JSON value}) that `extra` does not name and that is not
 * `omit`, then `extra`. head carries model_type and any fixed keys; extra
 * and omit may be NULL. A key named in extra replaces its default (cJSON
 * would read the first of two). */
void regc_test_write_config(const char *dir, const char *head, const char *const (*keys)[2],
                            size_t n_keys, const char *extra, const char *omit);
/* A decoder family's dir/config.json (models/decoder.c) at one small
 * shape: C 24, 6 heads of 4 over 2 kv heads, 3 layers, a vocabulary of 64,
 * 16 positions, no pad token; extra and omit as above. */
void regc_test_write_decoder_config(const char *dir, const char *model_type, const char *extra,
                                    const char *omit);
/* The nodes of g whose op is `op`. */
int regc_test_count_ops(const regc_graph *g, regc_op op);
/* The same parameter names, in order, and bit-identical weights. */
void regc_test_assert_same_weights(regc_model *a, regc_model *b);
/* Index of the parameter called `name`, or -1. */
int regc_test_param_index(const regc_model *m, const char *name);
/* m has a parameter `name` of ndim (1 or 2) dimensions, [d0] or [d0, d1]. */
void regc_test_assert_param_shape(const regc_model *m, const char *name, int ndim, int64_t d0,
                                  int64_t d1);
/* The model of dir/config.json, shapes only (the test fails with regc's
 * message if it does not load), its weights drawn from `seed` unless
 * seed is 0. */
regc_model *regc_test_load_config(const char *dir, uint64_t seed);
/* regc_model_load_config(dir) fails with `status`, returns no model, and
 * leaves one line naming dir/config.json and saying `what`. */
void regc_test_expect_config_error(const char *dir, int status, const char *what);
/* gpt2-tiny's flat graph at [2, 16] as regc graph JSON (malloc'd), made
 * through the library, with position_ids a data input (which a graph model
 * fills with 0..T-1) rather than a constant: it trains from a random init
 * with no weights file. */
char *regc_test_tiny_graph_json(void);
/* The step of `preset` (shapes only) at [batch, seq] compiled as co says:
 * the program; with status NULL the test fails on an error, else the
 * status goes there (and NULL comes back). */
regc_program *regc_test_compile(const char *preset, int64_t batch, int64_t seq,
                                const regc_compile_options *co, int *status);
/* What a test binds a program to on a CPU backend: the four blocks of the
 * model's floats (parameters, gradients, AdamW's m and v) and room for the
 * step's inputs, NULL until the test makes them. */
typedef struct {
    float *block[4]; /* [numel] each */
    void *inputs[8];
} regc_test_state;
/* The blocks of m's floats on be, the parameters filled with `param`, the
 * rest with 0; no inputs yet. */
void regc_test_state_alloc(regc_backend *be, const regc_model *m, float param, regc_test_state *s);
/* Frees the blocks and the inputs made. */
void regc_test_state_free(regc_backend *be, regc_test_state *s);
/* regc_program_dump's text of p (malloc'd). */
char *regc_test_program_dump(const regc_program *p);
/* g with every RMSNorm, LayerNorm and tanh GELU written out op by op, as
 * an exporter that knows no patterns would write them (a new graph). */
regc_graph *regc_test_decompose(const regc_graph *g);

/* What one training run reports: a loss per step, the compile's cache
 * hits and misses, the step a re-plan ranked recomputation by measured
 * kernels at, and the device memory it held. */
#define REGC_TEST_MAX_STEPS 8
typedef struct {
    float loss[REGC_TEST_MAX_STEPS];
    float grad_norm[REGC_TEST_MAX_STEPS]; /* with max_grad_norm set */
    int n;
    int hits, misses;
    int64_t measured_at; /* a compile's replan_step with measured_kernels > 0; else 0 */
    int64_t device_peak; /* the backend's high-water mark after the last step */
} regc_test_losses;
/* The options of a short run on a tiny preset: batch x seq tokens, `steps`
 * AdamW steps at lr 3e-3, 2 threads, no compile cache. */
regc_train_options regc_test_train_options(int64_t batch, int64_t seq, int steps);
/* Load `preset` and train it with o (o->steps <= REGC_TEST_MAX_STEPS; its
 * on_compiled is replaced), reporting into l; the test fails, with regc's
 * message, on an error or a step short. Returns the trained model. */
regc_model *regc_test_train(const char *preset, const regc_train_options *o, regc_test_losses *l);
/* The same for a model loaded already (a shape-only one draws its init). */
void regc_test_train_model(regc_model *m, const regc_train_options *o, regc_test_losses *l);
/* A family's loader: its config.json in f with `extra` keys, shapes only. */
typedef regc_model *(*regc_test_loader)(regc_test_dir *f, const char *extra);
/* load(f, extra)'s model compiled as one region, and trained regional and
 * whole at O1 and O0 to the same losses and weights; `what` names it in a
 * failure. */
void regc_test_expect_regional_equals_full(regc_test_dir *f, regc_test_loader load,
                                           const char *extra, const char *what);
/* The padding_idx of the first node of m's graph, its (word) embedding, or
 * -1 for none; frees m. */
int64_t regc_test_embedding_padding(regc_model *m);

#endif
