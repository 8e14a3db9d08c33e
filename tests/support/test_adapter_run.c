/* test_adapter_run.c — see test_adapter_run.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <math.h>

#include "test_adapter_run.h"
#include "test_util.h"

int regc_test_tiny_train(const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s train --model llama-tiny --batch 2 --seq 16 --threads 2 %s %s",
             REGC_BIN, args, strstr(args, "--json") ? "2>/dev/null" : "2>&1");
    return regc_test_run_capture(cmd, out);
}

void regc_test_assert_adapter_resume(const char *tag, const char *lora_args)
{
    char *tmp = regc_test_make_temp_dir(tag), args[3000], *out = NULL;
    assert_non_null(tmp);
    char lora[1000];
    snprintf(lora, sizeof lora, "%s --steps 6 --json", lora_args);
    snprintf(args, sizeof args, "%s --save %s/whole", lora, tmp);
    if (regc_test_tiny_train(args, &out) != 0)
        fail_msg("%s", out);
    double whole[8], resumed[8];
    assert_int_equal(regc_test_json_losses(out, whole, 8), 6);
    free(out);
    snprintf(args, sizeof args, "%s --output-dir %s/ck --save-steps 3", lora, tmp);
    if (regc_test_tiny_train(args, &out) != 0)
        fail_msg("%s", out);
    free(out);
    snprintf(args, sizeof args, "%s --resume-from-checkpoint %s/ck/checkpoint-3 --save %s/resumed",
             lora, tmp, tmp);
    if (regc_test_tiny_train(args, &out) != 0)
        fail_msg("%s", out);
    assert_int_equal(regc_test_json_losses(out, resumed, 8), 3);
    free(out);
    for (int k = 0; k < 3; k++)
        assert_memory_equal(&whole[3 + k], &resumed[k], sizeof *whole);
    char a[3100], b[3100];
    snprintf(a, sizeof a, "%s/whole/adapter_model.safetensors", tmp);
    snprintf(b, sizeof b, "%s/resumed/adapter_model.safetensors", tmp);
    size_t na = 0, nb = 0;
    char *x = regc_test_read_file(a, &na), *y = regc_test_read_file(b, &nb);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x), free(y);
    regc_test_remove_tree(tmp);
    free(tmp);
}

void regc_test_check_losses(const char *name, const double *got, const cJSON *want, int n,
                            double rtol, const char *ref)
{
    int bad = 0;
    for (int k = 0; k < n; k++) {
        double w = cJSON_GetArrayItem(want, k)->valuedouble, rel = fabs(got[k] - w) / fabs(w);
        print_message("case %s step %d: regc %.9f  %s %.9f  rel %.1e%s\n", name, k, got[k], ref, w,
                      rel, rel <= rtol ? "" : "  <-- MISMATCH");
        bad += !(rel <= rtol);
    }
    if (bad)
        fail_msg("case %s: %d of %d losses differ from %s's by more than %g", name, bad, n, ref,
                 rtol);
}
