/* test_train_reference.c — end to end against PyTorch, for every
 * architecture: for each case of tests/data/<arch>_reference.json (written by
 * tools/reference/<arch>_reference.py) build the same model from its
 * config.json, fill it with the same counter-based random weights, save it
 * as a Hugging Face directory, write the same token file, train the case's
 * steps with the real `regc` binary and compare every step's loss (and,
 * with clipping, gradient norm) with the one PyTorch recorded. Rebuilding
 * and running a case is tests/support/test_train_case.c, which
 * tests/test_train_bf16.c shares.
 *
 * The reference's own float32-vs-float64 gap is ~1e-7 relative (it is in the
 * JSON as fp32_vs_fp64_max_rel), so 1e-5 leaves room for a different but
 * correct summation order while still catching any real semantic slip (a
 * wrong epsilon, activation variant, attention scale, batch order or AdamW).
 * The first case of each architecture runs again with every layer
 * recomputed and the logits in chunks of three rows, which change memory,
 * not the model. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_reference.h"
#include "test_train_case.h"

#define LOSS_RTOL 1e-5

/* One run of the built case with `flags` (NULL-terminated, or NULL)
 * against PyTorch's losses and norms. */
static void check_run(regc_test_train_case *c, const char *const *flags, const char *what)
{
    const char *name = c->name;
    int64_t steps = regc_test_json_int(c->spec, "steps");
    const cJSON *losses = regc_test_json_get(c->spec, "losses");
    assert_true(cJSON_IsArray(losses));
    assert_int_equal(cJSON_GetArraySize(losses), steps);
    regc_test_train_result r;
    regc_test_train_case_run(c, steps, flags, &r);

    int bad = 0;
    for (int k = 0; k < r.steps; k++) {
        const cJSON *ref_loss = cJSON_GetArrayItem(losses, k);
        assert_true(cJSON_IsNumber(ref_loss));
        double ref = ref_loss->valuedouble;
        double rel = fabs(r.loss[k] - ref) / fabs(ref);
        int ok = isfinite(r.loss[k]) && rel <= LOSS_RTOL;
        print_message("case %s%s step %d: regc %.9f  pytorch %.9f  rel %.1e%s\n", name, what, k,
                      r.loss[k], ref, rel, ok ? "" : "  <-- MISMATCH");
        bad += !ok;
    }
    if (bad) {
        print_error("case %s%s: %d of %d losses differ from PyTorch by more than %g relative\n",
                    name, what, bad, r.steps, LOSS_RTOL);
        fail();
    }
    /* With clipping, the norm clip_grad_norm_ returned, every step. */
    const cJSON *norms = cJSON_GetObjectItemCaseSensitive(c->spec, "grad_norms");
    for (int k = 0; norms && k < r.steps; k++) {
        const cJSON *ref_norm = cJSON_GetArrayItem(norms, k);
        assert_true(cJSON_IsNumber(ref_norm));
        double rel = fabs(r.grad_norm[k] - ref_norm->valuedouble) / fabs(ref_norm->valuedouble);
        if (!(rel <= LOSS_RTOL)) {
            print_error("case %s%s step %d: grad_norm %.9g, PyTorch's %.9g (rel %.1e)\n", name,
                        what, k, r.grad_norm[k], ref_norm->valuedouble, rel);
            fail();
        }
    }
}

/* a case of the current file (architecture) has run lean already */
static int lean_done;

static void test_case(void **state)
{
    regc_test_train_case *c = *state;
    /* Rebuild the model, its weights and tokens; train with the real command line. */
    regc_test_train_case_build(c);
    check_run(c, NULL, "");
    /* the first case of each architecture again with every layer's
     * activations recomputed and the logits in chunks of three rows: the
     * same model, in less memory */
    static const char *const lean[] = {"--recompute", "full", "--logits-chunk-rows", "3", NULL};
    if (!lean_done) {
        lean_done = 1;
        check_run(c, lean, " (recompute full, logits in chunks)");
    }
}

/* One CMocka group per reference file, one test per case, named after it. */
int main(void)
{
    int failed = 0;
    for (size_t i = 0; regc_test_reference_files[i]; i++) {
        lean_done = 0; /* a file is an architecture */
        failed += regc_test_train_cases_run(regc_test_reference_files[i], NULL, test_case);
    }
    return failed;
}
